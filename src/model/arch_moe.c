/* MoE FFN layers (qwen3_moe, qwen3_next, qwen3_5_moe) and the qwen3_moe family: qwen3
 * attention (q/k norm) with a routed-experts FFN on sparse layers, dense SwiGLU elsewhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch_moe.h"

int moe_layer_is_sparse(const struct model_config *c, int il)
{
    if (c->n_experts <= 0) return 0;
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == il) return 0;
    int step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
    return (il + 1) % step == 0;
}

int moe_layer_specs(struct model *m, struct model_specs *s, int il, struct moe_layer_w *w,
                    struct cairn_err *err)
{
    char pfx[64];
    model_layer_name(m, il, pfx, sizeof(pfx));
    const struct model_config *c = &m->cfg;
    int64_t hid = c->hidden_size, inter = c->moe_intermediate_size, E = c->n_experts;
    if (E <= 0 || inter <= 0 || c->n_experts_per_tok <= 0 || c->n_experts_per_tok > E)
        return cairn_err_set(err, CAIRN_ERR_FORMAT,
                             "config.json: MoE sizes (num_experts %d, moe_intermediate_size %d, "
                             "num_experts_per_tok %d) are invalid",
                             c->n_experts, c->moe_intermediate_size, c->n_experts_per_tok);
    w->experts = calloc((size_t)E * 3, sizeof(*w->experts));
    if (!w->experts) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    int ok = model_specs_linear(s, &w->router, E, hid, MODEL_BIAS_NONE, "%s.mlp.gate", pfx) != NULL;
    static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
    char probe[200];
    snprintf(probe, sizeof(probe), "%s.mlp.switch_mlp.gate_proj.weight", pfx);
    w->stacked = model_has_tensor(m, probe);
    for (int j = 0; j < 3 && ok && w->stacked; j++) {
        struct model_wspec *sp = model_specs_linear(s, &w->stack[j], E * (j == 2 ? hid : inter), j == 2 ? inter : hid,
                                                    MODEL_BIAS_NONE, "%s.mlp.switch_mlp.%s", pfx, names[j]);
        if (sp) sp->stack = (int)E;
        ok &= sp != NULL;
    }
    for (int e = 0; e < E && ok && !w->stacked; e++)
        for (int j = 0; j < 3; j++)
            ok &= model_specs_linear(s, &w->experts[e * 3 + j], j == 2 ? hid : inter, j == 2 ? inter : hid,
                                     MODEL_BIAS_NONE, "%s.mlp.experts.%d.%s", pfx, e, names[j]) != NULL;
    int64_t sh = c->shared_expert_intermediate_size;
    if (sh > 0) {
        for (int j = 0; j < 3 && ok; j++)
            ok &= model_specs_linear(s, &w->shared[j], j == 2 ? hid : sh, j == 2 ? sh : hid, MODEL_BIAS_NONE,
                                     "%s.mlp.shared_expert.%s", pfx, names[j]) != NULL;
        ok &= model_specs_linear(s, &w->shared_gate, 1, hid, MODEL_BIAS_NONE, "%s.mlp.shared_expert_gate",
                                 pfx) != NULL;
    }
    return ok ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
}

int moe_layer_bind(struct model *m, struct moe_layer_w *w, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    int E = c->n_experts;
    w->views = calloc((size_t)E * 3, sizeof(*w->views));
    if (!w->views) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    struct tensor *gate = w->views, *up = gate + E, *down = up + E;
    for (int e = 0; e < E; e++) {
        if (w->stacked) {
            int64_t inter = c->moe_intermediate_size, hid = c->hidden_size;
            m->be->ops->weight_slice_rows(m->be, &w->stack[0].w, e * inter, inter, &gate[e]);
            m->be->ops->weight_slice_rows(m->be, &w->stack[1].w, e * inter, inter, &up[e]);
            m->be->ops->weight_slice_rows(m->be, &w->stack[2].w, e * hid, hid, &down[e]);
        } else {
            gate[e] = w->experts[e * 3].w;
            up[e] = w->experts[e * 3 + 1].w;
            down[e] = w->experts[e * 3 + 2].w;
        }
    }
    return CAIRN_OK;
}

void moe_layer_free(struct moe_layer_w *w)
{
    free(w->experts);
    free(w->views);
    w->experts = NULL;
    w->views = NULL;
}

/* Family scratch of a MoE layer for n tokens, each part 64 floats aligned:
 *   router logits [n, E] | ids [n, K] (int32) | weights [n, K] | moe_experts scratch |
 *   shared expert: gate, up [n, shared_inter], output [n, hidden], gate logit [n] */
struct moe_ws {
    float *logits, *w, *scratch, *sg, *su, *sy, *sgl;
    int32_t *ids;
};

static size_t moe_ws_layout(const struct model_config *c, int n, float *base, struct moe_ws *o)
{
    size_t N = (size_t)n, E = (size_t)c->n_experts, K = (size_t)c->n_experts_per_tok, H = (size_t)c->hidden_size;
    size_t sh = (size_t)CAIRN_MAX(c->shared_expert_intermediate_size, 0);
    size_t sizes[] = {N * E, N * K, N * K, backend_moe_scratch_floats(n, c->hidden_size, c->moe_intermediate_size,
                                                                      c->n_experts_per_tok),
                      N * sh, N * sh, sh ? N * H : 0, sh ? N : 0};
    size_t off = 0;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(sizes); i++) {
        if (base) {
            float **dst[] = {&o->logits, NULL, &o->w, &o->scratch, &o->sg, &o->su, &o->sy, &o->sgl};
            if (dst[i]) *dst[i] = base + off;
            else o->ids = (int32_t *)(base + off); /* int32 and float: same size */
        }
        off += (sizes[i] + 63) & ~(size_t)63;
    }
    return off;
}

size_t moe_layer_ws_floats(const struct model *m, int max_tokens)
{
    return moe_ws_layout(&m->cfg, max_tokens, NULL, NULL) + 16;
}

void moe_layer_forward(struct model *m, const struct moe_layer_w *w, const float *h, float *out, int n)
{
    const struct model_config *c = &m->cfg;
    struct moe_ws s;
    moe_ws_layout(c, m->ws.max_tokens, m->ws.extra, &s);
    int E = c->n_experts, K = c->n_experts_per_tok, H = c->hidden_size;
    MODEL_OP(m, matmul, &w->router.w, h, s.logits, n);
    MODEL_OP(m, moe_route, s.logits, n, E, K, c->norm_topk_prob, s.ids, s.w);
    struct backend_moe bm = {
        .x = h,
        .out = out,
        .n = n,
        .hidden = H,
        .inter = c->moe_intermediate_size,
        .n_experts = E,
        .top_k = K,
        .ids = s.ids,
        .w = s.w,
        .gate = w->views,
        .up = w->views + E,
        .down = w->views + 2 * E,
        .scratch = s.scratch,
    };
    MODEL_OP(m, moe_experts, &bm);
    int sh = c->shared_expert_intermediate_size;
    if (sh > 0) {
        /* out += sigmoid(shared_gate(x)) * down(silu(gate(x)) * up(x)) */
        MODEL_OP(m, matmul, &w->shared[0].w, h, s.sg, n);
        MODEL_OP(m, matmul, &w->shared[1].w, h, s.su, n);
        MODEL_OP(m, silu_mul, s.sg, s.sg, s.su, (int64_t)n * sh);
        MODEL_OP(m, matmul, &w->shared[2].w, s.sg, s.sy, n);
        MODEL_OP(m, matmul, &w->shared_gate.w, h, s.sgl, n); /* [n, 1] */
        MODEL_OP(m, add_sigmoid_scaled, out, s.sy, s.sgl, n, H);
    }
}

/* ---- qwen3_moe family ---- */

struct qwen3_moe_ext {
    struct moe_layer_w *layers; /* [n_layers]; unused for dense layers */
};

static int qwen3_moe_specs(struct model *m, struct model_specs *s, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    struct qwen3_moe_ext *x = calloc(1, sizeof(*x));
    if (!x) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    m->ext = x;
    x->layers = calloc((size_t)c->n_layers, sizeof(*x->layers));
    if (!x->layers) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    int ok = model_llama_specs_ends(m, s, 1.0f) == CAIRN_OK;
    for (int i = 0; i < c->n_layers && ok; i++) {
        ok &= model_llama_specs_layer_norms(m, s, i, 1.0f) == CAIRN_OK;
        ok &= model_llama_specs_attn(m, s, i) == CAIRN_OK;
        if (moe_layer_is_sparse(c, i)) {
            int rc = moe_layer_specs(m, s, i, &x->layers[i], err);
            if (rc != CAIRN_OK) return rc;
        } else {
            ok &= model_llama_specs_mlp(m, s, i, c->intermediate_size, MODEL_BIAS_NONE) == CAIRN_OK;
        }
    }
    return ok ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
}

static int qwen3_moe_post_bind(struct model *m, struct cairn_err *err)
{
    struct qwen3_moe_ext *x = m->ext;
    for (int i = 0; i < m->cfg.n_layers; i++)
        if (moe_layer_is_sparse(&m->cfg, i)) {
            int rc = moe_layer_bind(m, &x->layers[i], err);
            if (rc != CAIRN_OK) return rc;
        }
    return CAIRN_OK;
}

static void qwen3_moe_ffn(struct model *m, int il, const float *h, float *out, int n)
{
    struct qwen3_moe_ext *x = m->ext;
    if (moe_layer_is_sparse(&m->cfg, il)) moe_layer_forward(m, &x->layers[il], h, out, n);
    else model_mlp_forward(m, il, h, out, n);
}

static void qwen3_moe_free(struct model *m)
{
    struct qwen3_moe_ext *x = m->ext;
    if (!x) return;
    if (x->layers)
        for (int i = 0; i < m->cfg.n_layers; i++) moe_layer_free(&x->layers[i]);
    free(x->layers);
    free(x);
    m->ext = NULL;
}

const struct model_family model_family_qwen3_moe = {
    .name = "qwen3_moe",
    .specs = qwen3_moe_specs,
    .post_bind = qwen3_moe_post_bind,
    .ws_extra_floats = moe_layer_ws_floats,
    .ffn = qwen3_moe_ffn,
    .free_ext = qwen3_moe_free,
};
