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
    const struct model_config *c = &m->cfg;
    int64_t hid = c->hidden_size, inter = c->moe_intermediate_size, E = c->n_experts;
    if (E <= 0 || inter <= 0 || c->n_experts_per_tok <= 0 || c->n_experts_per_tok > E)
        return cairn_err_set(err, CAIRN_ERR_FORMAT,
                             "config.json: MoE sizes (num_experts %d, moe_intermediate_size %d, "
                             "num_experts_per_tok %d) are invalid",
                             c->n_experts, c->moe_intermediate_size, c->n_experts_per_tok);
    w->experts = calloc((size_t)E * 3, sizeof(*w->experts));
    w->views = calloc((size_t)E, sizeof(*w->views));
    if (!w->experts || !w->views) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    int ok = model_specs_linear(s, &w->router, E, hid, MODEL_BIAS_NONE, "model.layers.%d.mlp.gate", il) != NULL;
    static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
    char probe[200];
    snprintf(probe, sizeof(probe), "model.layers.%d.mlp.switch_mlp.gate_proj.weight", il);
    w->stacked = model_has_tensor(m, probe);
    for (int j = 0; j < 3 && ok && w->stacked; j++) {
        struct model_wspec *sp = model_specs_linear(s, &w->stack[j], E * (j == 2 ? hid : inter), j == 2 ? inter : hid,
                                                    MODEL_BIAS_NONE, "model.layers.%d.mlp.switch_mlp.%s", il, names[j]);
        if (sp) sp->stack = (int)E;
        ok &= sp != NULL;
    }
    for (int e = 0; e < E && ok && !w->stacked; e++)
        for (int j = 0; j < 3; j++)
            ok &= model_specs_linear(s, &w->experts[e * 3 + j], j == 2 ? hid : inter, j == 2 ? inter : hid,
                                     MODEL_BIAS_NONE, "model.layers.%d.mlp.experts.%d.%s", il, e, names[j]) != NULL;
    int64_t sh = c->shared_expert_intermediate_size;
    if (sh > 0) {
        for (int j = 0; j < 3 && ok; j++)
            ok &= model_specs_linear(s, &w->shared[j], j == 2 ? hid : sh, j == 2 ? sh : hid, MODEL_BIAS_NONE,
                                     "model.layers.%d.mlp.shared_expert.%s", il, names[j]) != NULL;
        ok &= model_specs_linear(s, &w->shared_gate, 1, hid, MODEL_BIAS_NONE, "model.layers.%d.mlp.shared_expert_gate",
                                 il) != NULL;
    }
    return ok ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
}

int moe_layer_bind(struct model *m, struct moe_layer_w *w, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    struct moe_params *p = &w->p;
    p->hidden = c->hidden_size;
    p->n_experts = c->n_experts;
    p->top_k = c->n_experts_per_tok;
    p->norm_topk_prob = c->norm_topk_prob;
    p->inter = c->moe_intermediate_size;
    p->router = w->router.w;
    for (int e = 0; e < c->n_experts; e++) {
        if (w->stacked) {
            int64_t inter = c->moe_intermediate_size, hid = c->hidden_size;
            moe_row_slice(&w->stack[0].w, e * inter, inter, &w->views[e].gate);
            moe_row_slice(&w->stack[1].w, e * inter, inter, &w->views[e].up);
            moe_row_slice(&w->stack[2].w, e * hid, hid, &w->views[e].down);
        } else {
            w->views[e].gate = w->experts[e * 3].w;
            w->views[e].up = w->experts[e * 3 + 1].w;
            w->views[e].down = w->experts[e * 3 + 2].w;
        }
    }
    p->experts = w->views;
    p->has_shared = c->shared_expert_intermediate_size > 0;
    p->shared_inter = p->has_shared ? c->shared_expert_intermediate_size : 0;
    if (p->has_shared) {
        p->shared.gate = w->shared[0].w;
        p->shared.up = w->shared[1].w;
        p->shared.down = w->shared[2].w;
        p->shared_gate = w->shared_gate.w;
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

size_t moe_layer_ws_floats(const struct model *m, int max_tokens)
{
    const struct model_config *c = &m->cfg;
    struct moe_params p = {.hidden = c->hidden_size, .n_experts = c->n_experts, .top_k = c->n_experts_per_tok,
                           .inter = c->moe_intermediate_size,
                           .shared_inter = c->shared_expert_intermediate_size};
    return moe_scratch_floats(&p, max_tokens) + moe_scratch_ints(&p, max_tokens) + 16;
}

void moe_layer_forward(struct model *m, const struct moe_layer_w *w, const float *h, float *out, int n)
{
    size_t nf = moe_scratch_floats(&w->p, m->ws.max_tokens);
    /* ints share the float scratch: same size and alignment */
    moe_forward(&w->p, h, n, out, m->ws.extra, (int *)(m->ws.extra + nf));
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
    int ok = llama_specs_ends(m, s, 1.0f) == CAIRN_OK;
    for (int i = 0; i < c->n_layers && ok; i++) {
        ok &= llama_specs_layer_norms(m, s, i, 1.0f) == CAIRN_OK;
        ok &= llama_specs_attn(m, s, i) == CAIRN_OK;
        if (moe_layer_is_sparse(c, i)) {
            int rc = moe_layer_specs(m, s, i, &x->layers[i], err);
            if (rc != CAIRN_OK) return rc;
        } else {
            ok &= llama_specs_mlp(m, s, i, MODEL_BIAS_NONE) == CAIRN_OK;
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
