/* The Qwen3 hybrid family: qwen3_next, qwen3_5 and qwen3_5_moe text models.
 *
 * layer_types interleaves Gated DeltaNet layers (linear attention with a recurrent state, see
 * gdn.h) with gated full attention (q_proj also yields a per-head sigmoid output gate; q/k norm;
 * partial rotary). All RMSNorms except the DeltaNet's gated one are zero-centred: y = norm(x) *
 * (1 + w). FFN: MoE with a shared expert (qwen3_next, qwen3_5_moe) or dense SwiGLU (qwen3_5).
 *
 * Input projections: qwen3_next packs in_proj_qkvz per key head as [q, k, v-group, z-group] and
 * in_proj_ba as [b-group, a-group] (unpacked into the qwen3_5 layout with the backend's
 * copy_rows: per part, one strided copy per token or per key head, whichever is fewer); qwen3_5
 * has separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a. The DeltaNet core is the
 * backend's gdn op, per sequence.
 *
 * Recurrent state of a sequence: for each DeltaNet layer in order, gdn_state_floats() floats
 * (conv window, then the delta-rule memory).
 *
 * MTP head (mtp.*, when config.json has mtp_num_hidden_layers and the weights are there): listed
 * here as layer n_layers (hybrid_specs_mtp), run by mtp.c. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "model/arch_moe.h"
#include "model/gdn.h"

struct hybrid_layer {
    struct model_linear qkvz, ba;       /* qwen3_next */
    struct model_linear qkv, z, b, a;   /* qwen3_5 */
    struct model_linear out;
    float *conv_w, *a_log, *dt_bias, *norm_w;
    size_t state_off;                   /* floats into the sequence state */
    int sparse;                         /* MoE FFN */
    struct moe_layer_w moe;
};

struct hybrid_ext {
    struct hybrid_layer *layers;        /* [n_layers] */
    struct gdn_dims dims;
    int packed;                         /* qwen3_next's interleaved projections */
};

static int hybrid_is_sparse(const struct model_config *c, int il)
{
    if (c->arch == MODEL_ARCH_QWEN3_5) return 0;
    return moe_layer_is_sparse(c, il);
}

static int hybrid_specs_gdn(struct model *m, struct model_specs *s, struct hybrid_ext *x, int i)
{
    const struct gdn_dims *d = &x->dims;
    struct hybrid_layer *H = &x->layers[i];
    int64_t hid = m->cfg.hidden_size, kd = gdn_key_dim(d), vd = gdn_value_dim(d), cd = gdn_conv_dim(d);
    int ok = 1;
    if (x->packed) {
        ok &= model_specs_linear(s, &H->qkvz, 2 * kd + 2 * vd, hid, MODEL_BIAS_NONE,
                                 "model.layers.%d.linear_attn.in_proj_qkvz", i) != NULL;
        ok &= model_specs_linear(s, &H->ba, 2 * d->n_v_heads, hid, MODEL_BIAS_NONE,
                                 "model.layers.%d.linear_attn.in_proj_ba", i) != NULL;
    } else {
        ok &= model_specs_linear(s, &H->qkv, cd, hid, MODEL_BIAS_NONE, "model.layers.%d.linear_attn.in_proj_qkv", i) != NULL;
        ok &= model_specs_linear(s, &H->z, vd, hid, MODEL_BIAS_NONE, "model.layers.%d.linear_attn.in_proj_z", i) != NULL;
        ok &= model_specs_linear(s, &H->b, d->n_v_heads, hid, MODEL_BIAS_NONE, "model.layers.%d.linear_attn.in_proj_b", i) != NULL;
        ok &= model_specs_linear(s, &H->a, d->n_v_heads, hid, MODEL_BIAS_NONE, "model.layers.%d.linear_attn.in_proj_a", i) != NULL;
    }
    ok &= model_specs_linear(s, &H->out, hid, vd, MODEL_BIAS_NONE, "model.layers.%d.linear_attn.out_proj", i) != NULL;
    struct model_wspec *w = model_specs_vector(s, &H->conv_w, cd * d->conv_kernel, 0.0f,
                                               "model.layers.%d.linear_attn.conv1d.weight", i);
    if (w) {
        w->flat = 1;
        w->synth_random = 1;
    }
    ok &= w != NULL;
    ok &= model_specs_vector(s, &H->a_log, d->n_v_heads, 0.0f, "model.layers.%d.linear_attn.A_log", i) != NULL;
    ok &= model_specs_vector(s, &H->dt_bias, d->n_v_heads, 1.0f, "model.layers.%d.linear_attn.dt_bias", i) != NULL;
    ok &= model_specs_vector(s, &H->norm_w, d->head_v_dim, 1.0f, "model.layers.%d.linear_attn.norm.weight", i) != NULL;
    return ok ? CAIRN_OK : CAIRN_ERR_NOMEM;
}

/* The MTP head (mtp.c): fc, its norms and mtp.layers.0, a full-attention layer of the model's
 * own kind (MoE as the target's layer 0 would be, i.e. vLLM's layer index 0 of the head). Absent
 * weights (conversions that strip the head) mean no head; more than one head layer is not
 * supported (vLLM cycles them per draft step): the model then loads without one. */
static int hybrid_specs_mtp(struct model *m, struct model_specs *s, struct hybrid_ext *x, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    if (!model_has_tensor(m, "mtp.fc.weight")) return CAIRN_OK;
    if (c->n_mtp_layers != 1) {
        LOG_WARN("model", "%s: %d MTP layers: only one is supported, loading without the MTP head", c->model_type,
                 c->n_mtp_layers);
        return CAIRN_OK;
    }
    int il = c->n_layers;
    struct hybrid_layer *H = &x->layers[il];
    int ok = model_mtp_specs(m, s, 0.0f) == CAIRN_OK;
    ok &= model_llama_specs_layer_norms(m, s, il, 0.0f) == CAIRN_OK;
    ok &= model_llama_specs_attn(m, s, il) == CAIRN_OK;
    H->sparse = hybrid_is_sparse(c, 0);
    if (H->sparse) {
        int rc = moe_layer_specs(m, s, il, &H->moe, err);
        if (rc != CAIRN_OK) return rc;
    } else {
        ok &= model_llama_specs_mlp(m, s, il, c->intermediate_size, MODEL_BIAS_NONE) == CAIRN_OK;
    }
    if (!ok) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    m->n_mtp = 1;
    return CAIRN_OK;
}

static int hybrid_specs(struct model *m, struct model_specs *s, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    struct hybrid_ext *x = calloc(1, sizeof(*x));
    if (!x) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    m->ext = x;
    x->layers = calloc((size_t)(c->n_layers + c->n_mtp_layers), sizeof(*x->layers));
    if (!x->layers) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    x->packed = c->arch == MODEL_ARCH_QWEN3_NEXT;
    x->dims = (struct gdn_dims){
        .n_k_heads = c->linear_num_key_heads,
        .n_v_heads = c->linear_num_value_heads,
        .head_k_dim = c->linear_key_head_dim,
        .head_v_dim = c->linear_value_head_dim,
        .conv_kernel = c->linear_conv_kernel_dim,
    };
    const struct gdn_dims *d = &x->dims;
    int n_gdn = 0;
    for (int i = 0; i < c->n_layers; i++) n_gdn += m->layers[i].kind == MODEL_LAYER_LINEAR_ATTN;
    if (n_gdn > 0 && (d->n_k_heads <= 0 || d->n_v_heads <= 0 || d->n_v_heads % d->n_k_heads != 0 ||
                      d->head_k_dim <= 0 || d->head_v_dim <= 0 || d->conv_kernel < 1))
        return cairn_err_set(err, CAIRN_ERR_FORMAT,
                             "config.json: linear attention sizes (key heads %d, value heads %d, key dim %d, value "
                             "dim %d, conv kernel %d) are invalid",
                             d->n_k_heads, d->n_v_heads, d->head_k_dim, d->head_v_dim, d->conv_kernel);
    m->norm_offset = 1.0f;
    m->attn_gated = 1;
    size_t state_off = 0;
    /* Zero-centred norms: synth fills them with 0 (weight 1 after the offset). */
    int ok = model_llama_specs_ends(m, s, 0.0f) == CAIRN_OK;
    for (int i = 0; i < c->n_layers && ok; i++) {
        struct model_layer *L = &m->layers[i];
        struct hybrid_layer *H = &x->layers[i];
        ok &= model_llama_specs_layer_norms(m, s, i, 0.0f) == CAIRN_OK;
        if (L->kind == MODEL_LAYER_LINEAR_ATTN) {
            ok &= hybrid_specs_gdn(m, s, x, i) == CAIRN_OK;
            H->state_off = state_off;
            state_off += gdn_state_floats(d);
        } else {
            ok &= model_llama_specs_attn(m, s, i) == CAIRN_OK;
        }
        H->sparse = hybrid_is_sparse(c, i);
        if (H->sparse) {
            int rc = moe_layer_specs(m, s, i, &H->moe, err);
            if (rc != CAIRN_OK) return rc;
        } else {
            if (c->intermediate_size <= 0)
                return cairn_err_set(err, CAIRN_ERR_FORMAT, "config.json: intermediate_size missing");
            ok &= model_llama_specs_mlp(m, s, i, c->intermediate_size, MODEL_BIAS_NONE) == CAIRN_OK;
        }
    }
    m->info.state_bytes = state_off * sizeof(float);
    if (ok && c->n_mtp_layers > 0) {
        int rc = hybrid_specs_mtp(m, s, x, err);
        if (rc != CAIRN_OK) return rc;
    }
    return ok ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
}

static int hybrid_post_bind(struct model *m, struct cairn_err *err)
{
    struct hybrid_ext *x = m->ext;
    /* A tensor-parallel rank (model_load_shard) binds with the whole model's sizes and runs
     * with its own heads: take the DeltaNet sizes and the state layout from cfg again. */
    x->dims.n_k_heads = m->cfg.linear_num_key_heads;
    x->dims.n_v_heads = m->cfg.linear_num_value_heads;
    size_t state_off = 0;
    for (int i = 0; i < m->cfg.n_layers; i++)
        if (m->layers[i].kind == MODEL_LAYER_LINEAR_ATTN) {
            x->layers[i].state_off = state_off;
            state_off += gdn_state_floats(&x->dims);
        }
    m->info.state_bytes = state_off * sizeof(float);
    for (int i = 0; i < m->cfg.n_layers + m->n_mtp; i++)
        if (x->layers[i].sparse) {
            int rc = moe_layer_bind(m, &x->layers[i].moe, err);
            if (rc != CAIRN_OK) return rc;
        }
    return CAIRN_OK;
}

/* DeltaNet scratch: projections of all T tokens. */
static size_t hybrid_gdn_floats(const struct hybrid_ext *x, int T)
{
    const struct gdn_dims *d = &x->dims;
    size_t kd = (size_t)gdn_key_dim(d), vd = (size_t)gdn_value_dim(d), nv = (size_t)d->n_v_heads;
    size_t raw = x->packed ? (2 * kd + 2 * vd) + 2 * nv : 0;
    return (size_t)T * (raw + (size_t)gdn_conv_dim(d) + vd + 2 * nv + vd) + 64;
}

/* dst[t][h] = src[t][h] (width floats each) for T tokens and nh heads, with the given row and
 * head strides: one strided copy per token when there are fewer tokens than heads (a decode
 * step: 6 copies a layer instead of 6 per key head; a graph's copy node costs ~0.8 us on the
 * H200), else one per head. */
static void hybrid_copy_heads(struct model *m, int T, int nh, int width, float *dst, int64_t dst_row,
                              int64_t dst_head, const float *src, int64_t src_row, int64_t src_head)
{
    if (T < nh)
        for (int t = 0; t < T; t++)
            MODEL_OP(m, copy_rows, dst + t * dst_row, dst_head, src + t * src_row, src_head, nh, width);
    else
        for (int h = 0; h < nh; h++)
            MODEL_OP(m, copy_rows, dst + h * dst_head, dst_row, src + h * src_head, src_row, T, width);
}

/* qwen3_next: per key head h, [q | k | v-group | z-group] of qkvz and [b-group | a-group] of ba
 * go to their places in qkv [T, conv_dim], z [T, value_dim], b, a [T, n_v_heads]. */
static void hybrid_unpack_qwen3_next(struct model *m, const struct gdn_dims *d, int T, const float *qkvz,
                                     const float *ba, float *qkv, float *z, float *b, float *a)
{
    int dk = d->head_k_dim, dv = d->head_v_dim, r = d->n_v_heads / d->n_k_heads, nk = d->n_k_heads;
    int64_t kd = gdn_key_dim(d), vd = gdn_value_dim(d), cd = gdn_conv_dim(d), nv = d->n_v_heads;
    int64_t per_head = 2 * dk + 2 * r * dv, row = 2 * kd + 2 * vd;
    hybrid_copy_heads(m, T, nk, dk, qkv, cd, dk, qkvz, row, per_head);
    hybrid_copy_heads(m, T, nk, dk, qkv + kd, cd, dk, qkvz + dk, row, per_head);
    hybrid_copy_heads(m, T, nk, r * dv, qkv + 2 * kd, cd, r * dv, qkvz + 2 * dk, row, per_head);
    hybrid_copy_heads(m, T, nk, r * dv, z, vd, r * dv, qkvz + 2 * dk + r * dv, row, per_head);
    hybrid_copy_heads(m, T, nk, r, b, nv, r, ba, 2 * nv, 2 * r);
    hybrid_copy_heads(m, T, nk, r, a, nv, r, ba + r, 2 * nv, 2 * r);
}

static size_t hybrid_ws_floats(const struct model *m, int max_tokens)
{
    const struct hybrid_ext *x = m->ext;
    size_t g = hybrid_gdn_floats(x, max_tokens);
    size_t f = m->cfg.n_experts > 0 ? moe_layer_ws_floats(m, max_tokens) : 0;
    return g > f ? g : f; /* the mixer and the FFN never run at the same time */
}

static int hybrid_linear_attn(struct model *m, int il, const struct model_seq *seqs, int n_seqs,
                              const float *h, float *out, struct cairn_err *err)
{
    struct hybrid_ext *x = m->ext;
    const struct hybrid_layer *H = &x->layers[il];
    const struct gdn_dims *d = &x->dims;
    struct model_ws *w = &m->ws;
    int T = w->h_seq_off[n_seqs];
    size_t kd = (size_t)gdn_key_dim(d), vd = (size_t)gdn_value_dim(d), nv = (size_t)d->n_v_heads;
    size_t cd = (size_t)gdn_conv_dim(d), Tz = (size_t)T;
    float *qkv = w->extra, *z = qkv + Tz * cd, *b = z + Tz * vd, *a = b + Tz * nv, *core = a + Tz * nv;
    float *raw = core + Tz * vd; /* packed projections (qwen3_next) */
    if (x->packed) {
        float *qkvz = raw, *ba = raw + Tz * (2 * kd + 2 * vd);
        model_linear_apply(m, &H->qkvz, h, qkvz, T);
        model_linear_apply(m, &H->ba, h, ba, T);
        hybrid_unpack_qwen3_next(m, d, T, qkvz, ba, qkv, z, b, a);
    } else {
        model_linear_apply(m, &H->qkv, h, qkv, T);
        model_linear_apply(m, &H->z, h, z, T);
        model_linear_apply(m, &H->b, h, b, T);
        model_linear_apply(m, &H->a, h, a, T);
    }
    for (int s = 0; s < n_seqs; s++) {
        int off = w->h_seq_off[s], n = seqs[s].n_tokens;
        if (n == 0) continue;
        struct backend_gdn g = {
            .n_k_heads = d->n_k_heads,
            .n_v_heads = d->n_v_heads,
            .head_k_dim = d->head_k_dim,
            .head_v_dim = d->head_v_dim,
            .conv_kernel = d->conv_kernel,
            .eps = m->cfg.rms_eps,
            .conv_w = H->conv_w,
            .a_log = H->a_log,
            .dt_bias = H->dt_bias,
            .norm_w = H->norm_w,
            .state = (float *)seqs[s].state + H->state_off,
            .qkv = qkv + (size_t)off * cd,
            .z = z + (size_t)off * vd,
            .b = b + (size_t)off * nv,
            .a = a + (size_t)off * nv,
            .n = n,
            .out = core + (size_t)off * vd,
        };
        MODEL_OP(m, gdn, &g);
    }
    model_linear_apply(m, &H->out, core, out, T);
    (void)err;
    return CAIRN_OK;
}

static void hybrid_ffn(struct model *m, int il, const float *h, float *out, int n)
{
    struct hybrid_ext *x = m->ext;
    if (x->layers[il].sparse) moe_layer_forward(m, &x->layers[il].moe, h, out, n);
    else model_mlp_forward(m, il, h, out, n);
}

static void hybrid_free(struct model *m)
{
    struct hybrid_ext *x = m->ext;
    if (!x) return;
    if (x->layers)
        for (int i = 0; i < m->cfg.n_layers + m->cfg.n_mtp_layers; i++) moe_layer_free(&x->layers[i].moe);
    free(x->layers);
    free(x);
    m->ext = NULL;
}

const struct model_family model_family_qwen3_hybrid = {
    .name = "qwen3_hybrid",
    .specs = hybrid_specs,
    .post_bind = hybrid_post_bind,
    .ws_extra_floats = hybrid_ws_floats,
    .linear_attn = hybrid_linear_attn,
    .ffn = hybrid_ffn,
    .free_ext = hybrid_free,
};
