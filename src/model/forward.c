/* The batched forward pass, written once against the backend op table (tensor/backend.h).
 *
 * One step = several sequences, each with n_tokens new tokens (a prefill chunk or one decode
 * token) at positions pos0.. in its own block table. All tokens of the step are stacked as rows
 * of x: [T, hidden] (sequence s owns rows [seq_off[s], seq_off[s+1])), so every matmul reads
 * each weight once per step; attention runs over all sequences' paged KV in one op.
 *
 * Per step: the host staging (token ids, positions, global KV slots, sequence offsets, logit row
 * ids, block tables; model_int.h's model_ws layout) is filled and uploaded in one buf_upload,
 * then only ops run, between the backend's step_begin and step_end:
 *   per layer:  h = rmsnorm(x); x += mixer(h)   (mixer by layer kind: attention / linear attn)
 *               h = rmsnorm(x); x += ffn(h)     (dense SwiGLU, or the family's MoE)
 *   where the backend has the optional fused ops (tensor/backend.h), o_proj and down_proj add
 *   into x themselves (matmul_add) and an attention layer's q/k norms, RoPE and KV write are one
 *   op (qk_rope_store), and the input norms of an attention layer and a dense MLP (and the
 *   final norm) go with the matmuls that read them, SwiGLU with gate/up (matmul_fused: the GPU
 *   folds them into its decode GEMV); otherwise the plain ops run, as on the CPU. A tensor-parallel rank
 *   (model/shard.h) all-reduces each sub-layer's partial output before the add, so it never
 *   takes matmul_add;
 * then the rows whose hidden states are asked for (model_seq.n_hidden, for an MTP head) are
 * gathered, normed and downloaded, and the rows whose logits are asked for are gathered, normed
 * and multiplied by lm_head in chunks of ws.logit_rows, each chunk's rows downloaded into
 * seqs[s].logits, or, for a sequence with model_seq.sample, sampled by the backend's sample op
 * (only the ids and logprobs come back: model.h). Nothing is
 * allocated here except the block-table staging growing (grow-only) for a longer context. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/mem.h"
#include "model/model_int.h"

/* Linears that read the same x (q/k/v, gate/up) in one matmul round. */
static void model_linears_apply(struct model *m, const struct model_linear *const *l, float *const *y, int count,
                                const float *x, int n_tokens)
{
    const struct tensor *w[4];
    CAIRN_ASSERT(count <= (int)CAIRN_ARRAY_LEN(w));
    for (int i = 0; i < count; i++) w[i] = &l[i]->w;
    MODEL_OP(m, matmul_multi, w, y, count, x, n_tokens);
    for (int i = 0; i < count; i++)
        if (l[i]->bias) MODEL_OP(m, add_bias, y[i], l[i]->bias, n_tokens, (int)l[i]->w.shape[0]);
}

void model_linear_apply(struct model *m, const struct model_linear *l, const float *x, float *y, int n_tokens)
{
    model_linears_apply(m, &l, &y, 1, x, n_tokens);
}

/* Linears on x normed with norm first (NULL: x as it is) and, with silu (gate, up: no biases),
 * y[0] = silu(y[0]) * y[1] after: the backend's matmul_fused when it has one (the GPU's decode
 * GEMV folds both in), else rmsnorm into h, the linears on h, and silu_mul. */
static void model_linears_fused(struct model *m, const struct model_linear *const *l, float *const *y, int count,
                                const float *x, const float *norm, float *h, int n_tokens, int silu)
{
    const struct model_config *c = &m->cfg;
    CAIRN_ASSERT(count <= 4 && (!silu || (count == 2 && !l[0]->bias && !l[1]->bias)));
    if (m->be->ops->matmul_fused && (norm || silu)) {
        const struct tensor *w[4];
        for (int i = 0; i < count; i++) w[i] = &l[i]->w;
        struct backend_matmul_fused f = {
            .w = w,
            .y = y,
            .count = count,
            .x = x,
            .n = n_tokens,
            .norm = norm,
            .eps = c->rms_eps,
            .w_offset = m->norm_offset,
            .h = h,
            .silu_mul = silu,
        };
        MODEL_OP(m, matmul_fused, &f);
        for (int i = 0; i < count; i++)
            if (l[i]->bias) MODEL_OP(m, add_bias, y[i], l[i]->bias, n_tokens, (int)l[i]->w.shape[0]);
        return;
    }
    if (norm) {
        MODEL_OP(m, rmsnorm, h, x, norm, n_tokens, (int)l[0]->w.shape[1], c->rms_eps, m->norm_offset);
        x = h;
    }
    model_linears_apply(m, l, y, count, x, n_tokens);
    if (silu) MODEL_OP(m, silu_mul, y[0], y[0], y[1], (int64_t)n_tokens * l[0]->w.shape[0]);
}

/* resid[T, out] += l(x): the backend's fused matmul_add when it has one (and l has no bias,
 * and this is no tensor-parallel rank, whose partial product must be summed over the ranks
 * before the add), else l(x) into tmp, the ranks' all-reduce, and an add. */
static void model_linear_residual(struct model *m, const struct model_linear *l, const float *x, float *tmp,
                                  float *resid, int n_tokens)
{
    if (m->be->ops->matmul_add && !l->bias && m->tp_world < 1) {
        MODEL_OP(m, matmul_add, &l->w, x, resid, n_tokens);
        return;
    }
    model_linear_apply(m, l, x, tmp, n_tokens);
    model_tp_allreduce(m, tmp, (int64_t)n_tokens * l->w.shape[0]);
    MODEL_OP(m, add, resid, tmp, (int64_t)n_tokens * l->w.shape[0]);
}

/* q/k norms, rope on q and k, and the KV write: one op when the backend fuses them. */
static void model_qk_rope_store(struct model *m, const struct model_layer *L, const struct backend_kv_view *kv,
                                int T)
{
    const struct model_config *c = &m->cfg;
    struct model_ws *w = &m->ws;
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    if (m->be->ops->qk_rope_store) {
        struct backend_qk_rope_store r = {
            .q = w->q,
            .k = w->k,
            .v = w->v,
            .q_norm = L->attn.q_norm,
            .k_norm = L->attn.k_norm,
            .pos = w->pos,
            .inv_freq = m->inv_freq,
            .slots = w->slots,
            .kv = kv,
            .n_tokens = T,
            .n_heads = nh,
            .rot_dim = c->rot_dim,
            .layer = L->kv_index,
            .eps = c->rms_eps,
            .w_offset = m->norm_offset,
        };
        MODEL_OP(m, qk_rope_store, &r);
        return;
    }
    if (L->attn.q_norm) MODEL_OP(m, rmsnorm, w->q, w->q, L->attn.q_norm, T * nh, hd, c->rms_eps, m->norm_offset);
    if (L->attn.k_norm) MODEL_OP(m, rmsnorm, w->k, w->k, L->attn.k_norm, T * nkv, hd, c->rms_eps, m->norm_offset);
    MODEL_OP(m, rope, w->q, T, nh, hd, c->rot_dim, w->pos, m->inv_freq);
    MODEL_OP(m, rope, w->k, T, nkv, hd, c->rot_dim, w->pos, m->inv_freq);
    MODEL_OP(m, kv_store, kv, L->kv_index, w->slots, T, w->k, w->v);
}

/* Attention of layer il on h, or (norm != NULL) on x normed with norm into h; its output
 * projection added to resid. */
static void model_attn_forward(struct model *m, int il, const struct backend_kv_view *kv, int n_seqs,
                               const float *x, const float *norm, float *h, float *resid)
{
    const struct model_config *c = &m->cfg;
    struct model_ws *w = &m->ws;
    const struct model_layer *L = &m->layers[il];
    int T = w->h_seq_off[n_seqs], nh = c->n_heads, hd = c->head_dim;
    int qd = nh * hd;
    const struct model_linear *qkv[3] = {&L->attn.q, &L->attn.k, &L->attn.v};
    float *qkv_out[3] = {m->attn_gated ? w->q_raw : w->q, w->k, w->v};
    if (norm) model_linears_fused(m, qkv, qkv_out, 3, x, norm, h, T, 0);
    else model_linears_apply(m, qkv, qkv_out, 3, h, T);
    /* q_proj rows of gated attention are [head][query hd | gate hd]: split off the gates. */
    if (m->attn_gated) MODEL_OP(m, split_halves, w->q, w->qgate, w->q_raw, T * nh, hd);
    model_qk_rope_store(m, L, kv, T);
    struct backend_attn a = {
        .q = w->q,
        .out = w->att,
        .n_tokens = T,
        .n_seqs = n_seqs,
        .n_heads = nh,
        .pos = w->pos,
        .seq_off = w->seq_off,
        .block_tables = w->bt,
        .bt_stride = w->bt_stride,
        .seq_off_host = w->h_seq_off,
        .ctx_len_host = w->h_ctx_len,
        .kv = kv,
        .layer = L->kv_index,
        /* yarn scales cos/sin by attn_factor: scores by its square */
        .scale = (float)(c->rope_attn_factor * c->rope_attn_factor) / sqrtf((float)hd),
    };
    MODEL_OP(m, attention, &a);
    if (m->attn_gated) MODEL_OP(m, mul_sigmoid, w->att, w->qgate, (int64_t)T * qd);
    model_linear_residual(m, &L->attn.o, w->att, w->out, resid, T);
}

/* The dense MLP on x (normed with norm into h first when norm != NULL): into out, or (resid !=
 * NULL) added to resid, with out as scratch. */
static void model_mlp_apply(struct model *m, int il, const float *x, const float *norm, float *h, float *out,
                            float *resid, int T)
{
    struct model_ws *w = &m->ws;
    const struct model_layer *L = &m->layers[il];
    int64_t inter = L->mlp.gate.w.shape[0];
    const struct model_linear *gate_up[2] = {&L->mlp.gate, &L->mlp.up};
    float *gate_up_out[2] = {w->gate, w->up};
    int biased = L->mlp.gate.bias || L->mlp.up.bias; /* SwiGLU after the biases: not folded */
    model_linears_fused(m, gate_up, gate_up_out, 2, x, norm, h, T, !biased);
    if (biased) MODEL_OP(m, silu_mul, w->gate, w->gate, w->up, (int64_t)T * inter);
    if (resid) model_linear_residual(m, &L->mlp.down, w->gate, out, resid, T);
    else model_linear_apply(m, &L->mlp.down, w->gate, out, T);
}

void model_mlp_forward(struct model *m, int il, const float *h, float *out, int T)
{
    model_mlp_apply(m, il, h, NULL, NULL, out, NULL, T);
}

static int model_forward_check(struct model *m, const struct backend_kv_view *kv, const struct model_seq *seqs,
                               int n_seqs, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    if (!m->ws_ok) return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: call model_reserve first");
    if (n_seqs <= 0 || !seqs) return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: no sequences");
    if (m->info.n_kv_layers > 0 &&
        (!kv || kv->n_layers != m->info.n_kv_layers || kv->n_kv_heads != c->n_kv_heads || kv->head_dim != c->head_dim))
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "model_forward: kv pool geometry (%d layers, %d heads, dim %d) does not match the "
                             "model (%d, %d, %d)",
                             kv ? kv->n_layers : 0, kv ? kv->n_kv_heads : 0, kv ? kv->head_dim : 0,
                             m->info.n_kv_layers, c->n_kv_heads, c->head_dim);
    long total = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct model_seq *q = &seqs[s];
        if (q->n_tokens < 0 || q->pos0 < 0 || q->n_logits < 0 || q->n_logits > q->n_tokens ||
            (q->n_tokens > 0 && !q->tokens) || (q->n_logits > 0 && !q->logits && !q->sample) || q->n_hidden < 0 ||
            q->n_hidden > q->n_tokens || (q->n_hidden > 0 && !q->hidden))
            return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: sequence %d: bad counts", s);
        if (q->sample && (q->n_logits != 1 || !q->sample_out || !m->be->ops->sample))
            return cairn_err_set(err, CAIRN_ERR_INVALID,
                                 "model_forward: sequence %d: device sampling needs one logit row and the "
                                 "backend's sample op", s);
        if ((long)q->pos0 + q->n_tokens > (long)INT32_MAX / 2)
            return cairn_err_set(err, CAIRN_ERR_LIMIT, "model_forward: sequence %d: position overflow", s);
        total += q->n_tokens;
        for (int i = 0; i < q->n_tokens; i++)
            if (q->tokens[i] < 0 || q->tokens[i] >= c->vocab_size)
                return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: sequence %d: token %d out of range (vocab %d)",
                                     s, q->tokens[i], c->vocab_size);
        if (m->info.n_kv_layers > 0 && q->n_tokens > 0) {
            if (!q->block_table) return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: sequence %d: no block table", s);
            int nb = (q->pos0 + q->n_tokens + kv->block_size - 1) / kv->block_size;
            for (int b = 0; b < nb; b++)
                if (q->block_table[b] < 0 || q->block_table[b] >= kv->n_blocks)
                    return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: sequence %d: block %d of the table is %d",
                                         s, b, q->block_table[b]);
        }
        if (m->info.state_bytes && !q->state)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: sequence %d: no recurrent state", s);
    }
    if (total > m->ws.max_tokens || n_seqs > m->ws.max_tokens)
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "model_forward: %ld tokens in %d sequences, reserved %d", total,
                             n_seqs, m->ws.max_tokens);
    return CAIRN_OK;
}

int model_i32_reserve(struct model *m, size_t need, struct cairn_err *err)
{
    struct model_ws *w = &m->ws;
    if (need <= w->i32_cap) return CAIRN_OK;
    size_t cap = need + need / 2 + 256;
    int32_t *h = cairn_mem_alloc(cap * sizeof(int32_t), CAIRN_MEM_SCRATCH);
    void *d = NULL;
    if (!h) return cairn_err_set(err, CAIRN_ERR_NOMEM, "model_forward: cannot allocate %zu ints of staging", cap);
    int rc = m->be->ops->buf_alloc(m->be, cap * sizeof(int32_t), CAIRN_MEM_SCRATCH, &d, err);
    if (rc != CAIRN_OK) {
        cairn_mem_free(h, cap * sizeof(int32_t), CAIRN_MEM_SCRATCH);
        return rc;
    }
    if (w->h_i32) cairn_mem_free(w->h_i32, w->i32_cap * sizeof(int32_t), CAIRN_MEM_SCRATCH);
    if (w->i32) m->be->ops->buf_free(m->be, w->i32, w->i32_cap * sizeof(int32_t), CAIRN_MEM_SCRATCH);
    w->h_i32 = h;
    w->i32 = d;
    w->i32_cap = cap;
    return CAIRN_OK;
}

int model_bt_stride(int blocks, int n_seqs, int block_size)
{
    if (n_seqs <= 1 || blocks <= 0 || block_size <= 0) return blocks;
    int q = MODEL_BT_STRIDE_TOKENS / block_size;
    if (q <= 1) return blocks;
    return (blocks + q - 1) / q * q;
}

size_t model_stage_ints(int T, int n_seqs, int bt_stride, int n_sel)
{
    return 3 * (size_t)T + (size_t)n_seqs + 1 + (size_t)n_sel + (size_t)n_seqs * (size_t)bt_stride;
}

int model_stage(struct model *m, const struct backend_kv_view *kv, const struct model_seq *seqs, int n_seqs,
                int bt_stride, int T, int n_sel)
{
    struct model_ws *w = &m->ws;
    int32_t *h = w->h_i32, *tok = h, *pos = h + T, *slots = h + 2 * T, *seq_off = h + 3 * T;
    int32_t *rows = seq_off + n_seqs + 1, *bt = rows + n_sel;
    int bs = kv ? kv->block_size : 1, t = 0, r = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct model_seq *q = &seqs[s];
        seq_off[s] = t;
        w->h_ctx_len[s] = q->pos0 + q->n_tokens;
        for (int i = 0; i < q->n_tokens; i++) {
            int p = q->pos0 + i;
            tok[t + i] = q->tokens[i];
            pos[t + i] = p;
            slots[t + i] = m->info.n_kv_layers > 0 ? q->block_table[p / bs] * bs + p % bs : 0;
        }
        int nb = m->info.n_kv_layers > 0 && q->n_tokens > 0 ? (q->pos0 + q->n_tokens + bs - 1) / bs : 0;
        for (int b = 0; b < bt_stride; b++) bt[(size_t)s * bt_stride + b] = b < nb ? q->block_table[b] : 0;
        for (int i = q->n_tokens - q->n_logits; i < q->n_tokens; i++) rows[r++] = t + i;
        t += q->n_tokens;
    }
    seq_off[n_seqs] = t;
    for (int s = 0; s < n_seqs; s++) /* hidden-state rows after the logit rows */
        for (int i = seqs[s].n_tokens - seqs[s].n_hidden; i < seqs[s].n_tokens; i++) rows[r++] = seq_off[s] + i;
    CAIRN_ASSERT(r == n_sel);
    const int32_t *d = w->i32;
    w->tok = d;
    w->pos = d + T;
    w->slots = d + 2 * T;
    w->seq_off = d + 3 * T;
    w->rows = w->seq_off + n_seqs + 1;
    w->bt = w->rows + n_sel;
    w->bt_stride = bt_stride;
    w->h_seq_off = seq_off;
    return (int)(bt + (size_t)n_seqs * bt_stride - h);
}

/* Delivers the n logit rows now in ws.logits: a sampled sequence's row goes to the backend's
 * sample op (all of the chunk's in one call), the others' rows are downloaded to their
 * sequences (a sequence's consecutive rows in one copy); *s, *r_in_s: the sequence and row the
 * chunk starts at, advanced past it. */
static int model_logits_out(struct model *m, const struct model_seq *seqs, int n, int *s, int *r_in_s,
                            struct cairn_err *err)
{
    size_t V = (size_t)m->cfg.vocab_size;
    struct model_ws *w = &m->ws;
    const struct model_seq *to[MODEL_LOGIT_ROWS_MAX];
    int r = 0, n_sample = 0, rc = CAIRN_OK;
    if (m->ws.t_wait_s < 0) m->ws.t_wait_s = cairn_now(); /* the first result asked for (see below) */
    while (r < n) {
        while (*r_in_s >= seqs[*s].n_logits) {
            (*s)++;
            *r_in_s = 0;
        }
        const struct model_seq *q = &seqs[*s];
        if (q->sample) {
            CAIRN_ASSERT(n_sample < w->logit_rows);
            w->h_sample_rows[n_sample] = *q->sample;
            w->h_sample_rows[n_sample].row = r;
            to[n_sample++] = q;
            r++;
            (*r_in_s)++;
            continue;
        }
        int k = CAIRN_MIN(n - r, q->n_logits - *r_in_s);
        rc = m->be->ops->buf_download(m->be, q->logits + (size_t)*r_in_s * V, w->logits + (size_t)r * V,
                                      sizeof(float) * V * (size_t)k, err);
        if (rc != CAIRN_OK) return rc;
        r += k;
        *r_in_s += k;
    }
    if (n_sample) {
        rc = m->be->ops->sample(m->be, w->logits, (int)V, w->h_sample_rows, n_sample, w->h_sample_out, err);
        for (int i = 0; i < n_sample && rc == CAIRN_OK; i++) *to[i]->sample_out = w->h_sample_out[i];
    }
    return rc;
}

int model_layer_forward(struct model *m, int il, const struct backend_kv_view *kv, const struct model_seq *seqs,
                        int n_seqs, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    struct model_ws *w = &m->ws;
    const struct model_layer *L = &m->layers[il];
    int hid = c->hidden_size, T = w->h_seq_off[n_seqs], rc = CAIRN_OK;
    /* An attention layer's input norm goes with its q/k/v matmuls (folded in where the backend
     * fuses them); the other mixers take h. */
    int norm_in = L->kind == MODEL_LAYER_ATTN && L->attn_norm;
    if (!norm_in) MODEL_OP(m, rmsnorm, w->h, w->x, L->attn_norm, T, hid, c->rms_eps, m->norm_offset);
    switch (L->kind) {
    case MODEL_LAYER_ATTN: /* adds into x itself */
        model_attn_forward(m, il, kv, n_seqs, w->x, norm_in ? L->attn_norm : NULL, w->h, w->x);
        break;
    case MODEL_LAYER_LINEAR_ATTN:
        rc = m->fam->linear_attn ? m->fam->linear_attn(m, il, seqs, n_seqs, w->h, w->out, err)
                                 : cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "linear attention not implemented");
        if (rc != CAIRN_OK) break;
        model_tp_allreduce(m, w->out, (int64_t)T * hid); /* tensor parallel: sum the ranks' partials */
        MODEL_OP(m, add, w->x, w->out, (int64_t)T * hid);
        break;
    }
    if (rc != CAIRN_OK) return rc;
    if (m->fam->ffn || !L->ffn_norm) {
        MODEL_OP(m, rmsnorm, w->h, w->x, L->ffn_norm, T, hid, c->rms_eps, m->norm_offset);
        if (m->fam->ffn) {
            m->fam->ffn(m, il, w->h, w->out, T);
            model_tp_allreduce(m, w->out, (int64_t)T * hid);
            MODEL_OP(m, add, w->x, w->out, (int64_t)T * hid);
        } else {
            model_mlp_apply(m, il, w->h, NULL, NULL, w->out, w->x, T);
        }
    } else { /* the dense MLP: its norm goes with gate/up */
        model_mlp_apply(m, il, w->x, L->ffn_norm, w->h, w->out, w->x, T);
    }
    return CAIRN_OK;
}

/* The ops of one step (inside step_begin/step_end). */
static int model_forward_ops(struct model *m, const struct backend_kv_view *kv, const struct model_seq *seqs,
                             int n_seqs, int n_ints, int n_sel, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    struct model_ws *w = &m->ws;
    int hid = c->hidden_size, T = w->h_seq_off[n_seqs];
    int rc = m->be->ops->buf_upload(m->be, w->i32, w->h_i32, sizeof(int32_t) * (size_t)n_ints, err);
    if (rc != CAIRN_OK) return rc;
    if (T > 0) {
        MODEL_OP(m, embed, &m->embed.w, w->tok, T, w->x);
        for (int il = 0; il < c->n_layers; il++) {
            rc = model_layer_forward(m, il, kv, seqs, n_seqs, err);
            if (rc != CAIRN_OK) return rc;
        }
    }
    int n_hid = 0;
    for (int s = 0; s < n_seqs; s++) n_hid += seqs[s].n_hidden;
    n_sel -= n_hid;
    if (n_hid > 0) {
        /* hidden states after the final norm (for an MTP head), rows after the logit rows */
        MODEL_OP(m, gather_rows, w->sel, w->x, w->rows + n_sel, n_hid, hid);
        MODEL_OP(m, rmsnorm, w->sel, w->sel, m->final_norm, n_hid, hid, c->rms_eps, m->norm_offset);
        const float *src = w->sel;
        for (int s = 0; s < n_seqs && rc == CAIRN_OK; s++) {
            size_t bytes = sizeof(float) * (size_t)hid * (size_t)seqs[s].n_hidden;
            if (bytes) rc = m->be->ops->buf_download(m->be, seqs[s].hidden, src, bytes, err);
            src += (size_t)hid * (size_t)seqs[s].n_hidden;
        }
        if (rc != CAIRN_OK) return rc;
    }
    if (n_sel == 0) return CAIRN_OK;
    /* The rows asked for (the last n_logits of each sequence), normed, through lm_head. */
    MODEL_OP(m, gather_rows, w->sel, w->x, w->rows, n_sel, hid);
    /* the final norm goes with lm_head where the backend folds it into the matmul */
    int norm_out = m->be->ops->matmul_fused && m->final_norm;
    if (!norm_out) MODEL_OP(m, rmsnorm, w->sel, w->sel, m->final_norm, n_sel, hid, c->rms_eps, m->norm_offset);
    int s = 0, r_in_s = 0;
    for (int r0 = 0; r0 < n_sel; r0 += w->logit_rows) {
        int n = CAIRN_MIN(w->logit_rows, n_sel - r0);
        float *sel = w->sel + (size_t)r0 * hid;
        const struct model_linear *lm = &m->lm_head;
        if (norm_out) model_linears_fused(m, &lm, &w->logits, 1, sel, m->final_norm, sel, n, 0);
        else model_linear_apply(m, &m->lm_head, sel, w->logits, n);
        rc = model_logits_out(m, seqs, n, &s, &r_in_s, err);
        if (rc != CAIRN_OK) return rc;
    }
    return CAIRN_OK;
}

int model_forward(struct model *m, const struct backend_kv_view *kv, const struct model_seq *seqs, int n_seqs,
                  struct cairn_err *err)
{
    double t0 = cairn_now();
    m->ws.t_issue_s = 0;
    m->ws.t_wait_s = -1; /* set to the time of the first result asked for (model_logits_out) */
    int rc = model_forward_check(m, kv, seqs, n_seqs, err);
    if (rc != CAIRN_OK) return rc;
    int T = 0, n_sel = 0, bt_stride = 0;
    for (int s = 0; s < n_seqs; s++) {
        T += seqs[s].n_tokens;
        n_sel += seqs[s].n_logits + seqs[s].n_hidden;
        if (kv && m->info.n_kv_layers > 0 && seqs[s].n_tokens > 0)
            bt_stride = CAIRN_MAX(bt_stride, (seqs[s].pos0 + seqs[s].n_tokens + kv->block_size - 1) / kv->block_size);
    }
    if (kv) bt_stride = model_bt_stride(bt_stride, n_seqs, kv->block_size);
    rc = model_i32_reserve(m, model_stage_ints(T, n_seqs, bt_stride, n_sel), err);
    if (rc != CAIRN_OK) return rc;
    int n_ints = model_stage(m, kv, seqs, n_seqs, bt_stride, T, n_sel);
    rc = m->be->ops->step_begin(m->be, err);
    if (rc != CAIRN_OK) return rc;
    rc = model_forward_ops(m, kv, seqs, n_seqs, n_ints, n_sel, err);
    struct cairn_err end_err = {0};
    int rc_end = m->be->ops->step_end(m->be, &end_err);
    if (rc_end == CAIRN_OK) rc_end = backend_test_stall(m->be, m->info.model_type, &end_err);
    if (rc == CAIRN_OK && rc_end != CAIRN_OK) {
        rc = rc_end;
        if (err) *err = end_err;
    }
    double t1 = cairn_now(), t_ask = m->ws.t_wait_s >= 0 ? m->ws.t_wait_s : t1;
    m->ws.t_issue_s = t_ask - t0;
    m->ws.t_wait_s = t1 - t_ask;
    return rc;
}

int model_can_sample(const struct model *m) { return m->be->ops->sample != NULL; }

void model_last_step_times(const struct model *m, double *issue_s, double *wait_s)
{
    *issue_s = m->ws.t_issue_s;
    *wait_s = m->ws.t_wait_s;
}
