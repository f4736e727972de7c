/* The MTP (multi-token prediction) head: mtp.* weights, one draft step per sequence (model.h:
 * model_mtp_forward says what it computes). Checkpoints with a head: qwen3_next / qwen3_5
 * (arch_qwen3_hybrid.c lists it) and dense llama-family ones that carry mtp.* (arch_llama.c:
 * the demo model's, trained by scripts/demo-model/train.py in the same layout).
 *
 * The definition followed is vLLM's vllm/model_executor/models/qwen3_next_mtp.py
 * (Qwen3NextMultiTokenPredictor.forward; qwen3_5_mtp.py is the same computation) with the chaining
 * of vllm/v1/spec_decode/eagle.py (method "mtp"):
 * - inputs: the embedding of the token after position p (shared embed_tokens) and the target's
 *   hidden state at p AFTER the final norm (what Qwen3NextModel.forward returns and eagle.py
 *   passes as target_hidden_states); each through its own RMSNorm (pre_fc_norm_embedding,
 *   pre_fc_norm_hidden), concatenated embedding first, then mtp.fc [hidden, 2 * hidden]. The
 *   norms are the family's: zero-centred (y = norm(x) * (1 + w)) in the hybrids, plain
 *   (y = norm(x) * w) in the llama family (m->norm_offset);
 * - one decoder layer of the model's own kind with full attention (mtp.layers.0: gated q_proj,
 *   q/k norm, partial RoPE at position p; MoE with shared expert for qwen3_next, dense SwiGLU for
 *   qwen3_5; the family's plain attention and a SwiGLU MLP of its own width for the llama
 *   family), whose KV is its own: a KV layer of the pool after the target's, in the sequence's
 *   blocks, so it is allocated, shared, cached and rolled back with the sequence's KV;
 * - mtp.norm, then the shared lm_head.
 * - Chaining (k > 1): the next step runs at position p + 1 with the drafted token and the head's
 *   own normed output as its hidden.
 *
 * DESIGN: the head is layer cfg.n_layers of m->layers (model_int.h: struct model_mtp), so the
 * forward reuses forward.c's staging (model_stage) and layer (model_layer_forward) and the
 * family's FFN hook; only the fc input (ws.mtp_cat [T, 2 * hidden]) is its own buffer. */
#include <string.h>

#include "base/mem.h"
#include "model/model_int.h"

int model_mtp_specs(struct model *m, struct model_specs *s, float norm_synth)
{
    int64_t hid = m->cfg.hidden_size;
    m->mtp.il = m->cfg.n_layers;
    int ok = model_specs_linear(s, &m->mtp.fc, hid, 2 * hid, MODEL_BIAS_NONE, "mtp.fc") != NULL;
    ok &= model_specs_vector(s, &m->mtp.norm_emb, hid, norm_synth,
                             "mtp.pre_fc_norm_embedding.weight") != NULL;
    ok &= model_specs_vector(s, &m->mtp.norm_hid, hid, norm_synth,
                             "mtp.pre_fc_norm_hidden.weight") != NULL;
    ok &= model_specs_vector(s, &m->mtp.norm, hid, norm_synth, "mtp.norm.weight") != NULL;
    return ok ? CAIRN_OK : CAIRN_ERR_NOMEM;
}

static int model_mtp_check(struct model *m, const struct backend_kv_view *kv,
                           const struct model_mtp_seq *seqs, int n_seqs, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    if (m->n_mtp == 0)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                             "model_mtp_forward: %s has no MTP head (no mtp.* weights)",
                             c->model_type);
    if (!m->ws_ok)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model_mtp_forward: call model_reserve first");
    if (n_seqs <= 0 || !seqs || n_seqs > m->ws.max_tokens)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model_mtp_forward: %d sequences", n_seqs);
    if (!kv || kv->n_layers != m->info.n_kv_layers || kv->n_kv_heads != c->n_kv_heads ||
        kv->head_dim != c->head_dim)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "model_mtp_forward: kv pool geometry does not match the model");
    long total = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct model_mtp_seq *q = &seqs[s];
        if (q->n_tokens < 0 || q->pos0 < 0 || q->n_out < 0 || q->n_out > q->n_tokens ||
            (q->n_tokens > 0 && (!q->tokens || !q->hidden || !q->block_table)) ||
            (long)q->pos0 + q->n_tokens > (long)INT32_MAX / 2)
            return cairn_err_set(err, CAIRN_ERR_INVALID,
                                 "model_mtp_forward: sequence %d: bad counts", s);
        for (int i = 0; i < q->n_tokens; i++)
            if (q->tokens[i] < 0 || q->tokens[i] >= c->vocab_size)
                return cairn_err_set(
                    err, CAIRN_ERR_INVALID,
                    "model_mtp_forward: sequence %d: token %d out of range (vocab %d)", s,
                    q->tokens[i], c->vocab_size);
        int nb = (q->pos0 + q->n_tokens + kv->block_size - 1) / kv->block_size;
        for (int b = 0; b < nb && q->n_tokens > 0; b++)
            if (q->block_table[b] < 0 || q->block_table[b] >= kv->n_blocks)
                return cairn_err_set(err, CAIRN_ERR_INVALID,
                                     "model_mtp_forward: sequence %d: block %d is %d", s, b,
                                     q->block_table[b]);
        total += q->n_tokens;
    }
    if (total > m->ws.max_tokens)
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "model_mtp_forward: %ld tokens, reserved %d",
                             total, m->ws.max_tokens);
    return CAIRN_OK;
}

/* The ops of the head's step (inside step_begin/step_end); ms: the staging view of seqs. */
static int model_mtp_ops(struct model *m, const struct backend_kv_view *kv,
                         const struct model_mtp_seq *seqs, const struct model_seq *ms, int n_seqs,
                         int n_ints, int n_sel, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    struct model_ws *w = &m->ws;
    int hid = c->hidden_size, T = w->h_seq_off[n_seqs];
    size_t H = (size_t)hid, V = (size_t)c->vocab_size;
    int rc = m->be->ops->buf_upload(m->be, w->i32, w->h_i32, sizeof(int32_t) * (size_t)n_ints, err);
    for (int s = 0; s < n_seqs && rc == CAIRN_OK; s++)
        if (seqs[s].n_tokens)
            rc = m->be->ops->buf_upload(m->be, w->out + (size_t)w->h_seq_off[s] * H, seqs[s].hidden,
                                        sizeof(float) * H * (size_t)seqs[s].n_tokens, err);
    if (rc != CAIRN_OK || T == 0) return rc;
    MODEL_OP(m, embed, &m->embed.w, w->tok, T, w->x);
    MODEL_OP(m, rmsnorm, w->h, w->x, m->mtp.norm_emb, T, hid, c->rms_eps, m->norm_offset);
    MODEL_OP(m, rmsnorm, w->out, w->out, m->mtp.norm_hid, T, hid, c->rms_eps, m->norm_offset);
    MODEL_OP(m, copy_rows, w->mtp_cat, 2 * (int64_t)hid, w->h, hid, T, hid);
    MODEL_OP(m, copy_rows, w->mtp_cat + hid, 2 * (int64_t)hid, w->out, hid, T, hid);
    model_linear_apply(m, &m->mtp.fc, w->mtp_cat, w->x, T);
    rc = model_layer_forward(m, m->mtp.il, kv, ms, n_seqs, err);
    if (rc != CAIRN_OK || n_sel == 0) return rc;
    MODEL_OP(m, gather_rows, w->sel, w->x, w->rows, n_sel, hid);
    MODEL_OP(m, rmsnorm, w->sel, w->sel, m->mtp.norm, n_sel, hid, c->rms_eps, m->norm_offset);
    /* row r of sel belongs to sequence s_of, its row r_in of n_out */
    int s_of = 0, r_in = 0;
    for (int r0 = 0; r0 < n_sel && rc == CAIRN_OK; r0 += w->logit_rows) {
        int n = CAIRN_MIN(w->logit_rows, n_sel - r0);
        model_linear_apply(m, &m->lm_head, w->sel + (size_t)r0 * H, w->logits, n);
        for (int r = 0; r < n && rc == CAIRN_OK; r++) {
            while (r_in >= seqs[s_of].n_out) {
                s_of++;
                r_in = 0;
            }
            const struct model_mtp_seq *q = &seqs[s_of];
            if (q->hidden_out)
                rc =
                    m->be->ops->buf_download(m->be, q->hidden_out + (size_t)r_in * H,
                                             w->sel + (size_t)(r0 + r) * H, sizeof(float) * H, err);
            if (rc == CAIRN_OK && q->logits)
                rc = m->be->ops->buf_download(m->be, q->logits + (size_t)r_in * V,
                                              w->logits + (size_t)r * V, sizeof(float) * V, err);
            r_in++;
        }
    }
    return rc;
}

int model_mtp_forward(struct model *m, const struct backend_kv_view *kv,
                      const struct model_mtp_seq *seqs, int n_seqs, struct cairn_err *err)
{
    int rc = model_mtp_check(m, kv, seqs, n_seqs, err);
    if (rc != CAIRN_OK) return rc;
    struct model_mtp *h = &m->mtp;
    if (h->cap_stage < n_seqs) { /* grow-only, like the block-table staging */
        struct model_seq *v = cairn_mem_alloc(sizeof(*v) * (size_t)n_seqs, CAIRN_MEM_SCRATCH);
        if (!v) return cairn_err_set(err, CAIRN_ERR_NOMEM, "model_mtp_forward: out of memory");
        cairn_mem_free(h->stage, sizeof(*v) * (size_t)h->cap_stage, CAIRN_MEM_SCRATCH);
        h->stage = v;
        h->cap_stage = n_seqs;
    }
    int T = 0, n_sel = 0, bt_stride = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct model_mtp_seq *q = &seqs[s];
        h->stage[s] = (struct model_seq){.tokens = q->tokens,
                                         .n_tokens = q->n_tokens,
                                         .pos0 = q->pos0,
                                         .block_table = q->block_table,
                                         .n_logits = q->n_out};
        T += q->n_tokens;
        n_sel += q->n_out;
        if (q->n_tokens > 0)
            bt_stride =
                CAIRN_MAX(bt_stride, (q->pos0 + q->n_tokens + kv->block_size - 1) / kv->block_size);
    }
    bt_stride = model_bt_stride(bt_stride, n_seqs, kv->block_size);
    rc = model_i32_reserve(m, model_stage_ints(T, n_seqs, bt_stride, n_sel), err);
    if (rc != CAIRN_OK) return rc;
    int n_ints = model_stage(m, kv, h->stage, n_seqs, bt_stride, T, n_sel);
    rc = m->be->ops->step_begin(m->be, err);
    if (rc != CAIRN_OK) return rc;
    rc = model_mtp_ops(m, kv, seqs, h->stage, n_seqs, n_ints, n_sel, err);
    struct cairn_err end_err = {0};
    int rc_end = m->be->ops->step_end(m->be, &end_err);
    if (rc == CAIRN_OK && rc_end != CAIRN_OK) {
        rc = rc_end;
        if (err) *err = end_err;
    }
    return rc;
}

void model_mtp_free(struct model *m)
{
    cairn_mem_free(m->mtp.stage, sizeof(*m->mtp.stage) * (size_t)m->mtp.cap_stage,
                   CAIRN_MEM_SCRATCH);
    m->mtp.stage = NULL;
    m->mtp.cap_stage = 0;
}
