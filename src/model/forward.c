/* The batched forward pass.
 *
 * One step = several sequences, each with n_tokens new tokens (a prefill chunk or one decode
 * token) at positions pos0.. in its own block table. All tokens of the step are stacked as rows
 * of x: [T, hidden] (sequence s owns rows [seq_off[s], seq_off[s+1])), so every matmul reads
 * each weight once per step; attention runs per sequence over its paged KV.
 *
 * Per layer:  h = rmsnorm(x); x += mixer(h)   (mixer by layer kind: attention / linear attn)
 *             h = rmsnorm(x); x += ffn(h)     (dense SwiGLU, or the family's MoE)
 * Then the rows whose logits are asked for are gathered, normed and multiplied by lm_head in
 * chunks of ws.logit_rows. Nothing is allocated here: workspaces come from model_reserve. */
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "model/model_int.h"

/* Linears that read the same x (q/k/v, gate/up) in one matmul round. */
static void model_linears_apply(const struct model_linear *const *l, float *const *y, int count,
                                const float *x, int n_tokens)
{
    const struct tensor *w[4];
    CAIRN_ASSERT(count <= (int)CAIRN_ARRAY_LEN(w));
    for (int i = 0; i < count; i++) w[i] = &l[i]->w;
    cpu_matmul_multi(w, y, count, x, n_tokens);
    for (int i = 0; i < count; i++)
        if (l[i]->bias) cpu_add_bias(y[i], l[i]->bias, n_tokens, (int)l[i]->w.shape[0]);
}

void model_linear_apply(const struct model_linear *l, const float *x, float *y, int n_tokens)
{
    model_linears_apply(&l, &y, 1, x, n_tokens);
}

static int model_attn_forward(struct model *m, int il, struct kv_pool *kv, const struct model_seq *seqs,
                              int n_seqs, const float *h, float *out)
{
    const struct model_config *c = &m->cfg;
    struct model_ws *w = &m->ws;
    const struct model_layer *L = &m->layers[il];
    int T = w->seq_off[n_seqs], nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    int qd = nh * hd, kvd = nkv * hd;
    const struct model_linear *qkv[3] = {&L->attn.q, &L->attn.k, &L->attn.v};
    float *qkv_out[3] = {w->q, w->k, w->v};
    model_linears_apply(qkv, qkv_out, 3, h, T);
    if (m->attn_gated) {
        /* q_proj rows are [head][query hd | gate hd]: split off the gates, compact the queries
         * in place (the destination never passes the source). */
        for (int r = 0; r < T * nh; r++) {
            memcpy(w->qgate + (size_t)r * hd, w->q + (size_t)r * 2 * hd + hd, sizeof(float) * hd);
            memmove(w->q + (size_t)r * hd, w->q + (size_t)r * 2 * hd, sizeof(float) * hd);
        }
    }
    if (L->attn.q_norm) cpu_rmsnorm(w->q, w->q, L->attn.q_norm, T * nh, hd, c->rms_eps, m->norm_offset);
    if (L->attn.k_norm) cpu_rmsnorm(w->k, w->k, L->attn.k_norm, T * nkv, hd, c->rms_eps, m->norm_offset);
    cpu_rope(w->q, T, nh, hd, c->rot_dim, w->pos, m->inv_freq);
    cpu_rope(w->k, T, nkv, hd, c->rot_dim, w->pos, m->inv_freq);
    for (int s = 0; s < n_seqs; s++) {
        int off = w->seq_off[s], n = seqs[s].n_tokens;
        if (n == 0) continue;
        cpu_kv_store(kv, L->kv_index, seqs[s].block_table, w->pos + off, n, w->k + (size_t)off * kvd,
                     w->v + (size_t)off * kvd);
        struct cpu_attn a = {
            .q = w->q + (size_t)off * qd,
            .out = w->att + (size_t)off * qd,
            .n_tokens = n,
            .n_heads = nh,
            .pos = w->pos + off,
            .kv = kv,
            .layer = L->kv_index,
            .block_table = seqs[s].block_table,
            /* yarn scales cos/sin by attn_factor: scores by its square */
            .scale = (float)(c->rope_attn_factor * c->rope_attn_factor) / sqrtf((float)hd),
        };
        cpu_attention(&a);
    }
    if (m->attn_gated)
        for (size_t i = 0; i < (size_t)T * qd; i++) w->att[i] *= 1.0f / (1.0f + expf(-w->qgate[i]));
    model_linear_apply(&L->attn.o, w->att, out, T);
    return CAIRN_OK;
}

void model_mlp_forward(struct model *m, int il, const float *h, float *out, int T)
{
    struct model_ws *w = &m->ws;
    const struct model_layer *L = &m->layers[il];
    int64_t inter = L->mlp.gate.w.shape[0];
    const struct model_linear *gate_up[2] = {&L->mlp.gate, &L->mlp.up};
    float *gate_up_out[2] = {w->gate, w->up};
    model_linears_apply(gate_up, gate_up_out, 2, h, T);
    cpu_silu_mul(w->gate, w->gate, w->up, (int64_t)T * inter);
    model_linear_apply(&L->mlp.down, w->gate, out, T);
}

static int model_forward_check(struct model *m, const struct kv_pool *kv, const struct model_seq *seqs,
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
            (q->n_tokens > 0 && !q->tokens) || (q->n_logits > 0 && !q->logits))
            return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: sequence %d: bad counts", s);
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

static int model_forward_locked(struct model *m, struct kv_pool *kv, const struct model_seq *seqs, int n_seqs,
                                struct cairn_err *err)
{
    int rc = model_forward_check(m, kv, seqs, n_seqs, err);
    if (rc != CAIRN_OK) return rc;
    const struct model_config *c = &m->cfg;
    struct model_ws *w = &m->ws;
    int hid = c->hidden_size, T = 0;
    for (int s = 0; s < n_seqs; s++) {
        w->seq_off[s] = T;
        for (int i = 0; i < seqs[s].n_tokens; i++) {
            w->tok[T + i] = seqs[s].tokens[i];
            w->pos[T + i] = seqs[s].pos0 + i;
        }
        T += seqs[s].n_tokens;
    }
    w->seq_off[n_seqs] = T;
    if (T > 0) {
        cpu_embed(&m->embed.w, w->tok, T, w->x);
        for (int il = 0; il < c->n_layers; il++) {
            const struct model_layer *L = &m->layers[il];
            cpu_rmsnorm(w->h, w->x, L->attn_norm, T, hid, c->rms_eps, m->norm_offset);
            switch (L->kind) {
            case MODEL_LAYER_ATTN:
                rc = model_attn_forward(m, il, kv, seqs, n_seqs, w->h, w->out);
                break;
            case MODEL_LAYER_LINEAR_ATTN:
                rc = m->fam->linear_attn ? m->fam->linear_attn(m, il, seqs, n_seqs, w->h, w->out, err)
                                         : cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "linear attention not implemented");
                break;
            }
            if (rc != CAIRN_OK) return rc;
            cpu_add(w->x, w->out, (int64_t)T * hid);
            cpu_rmsnorm(w->h, w->x, L->ffn_norm, T, hid, c->rms_eps, m->norm_offset);
            if (m->fam->ffn) m->fam->ffn(m, il, w->h, w->out, T);
            else model_mlp_forward(m, il, w->h, w->out, T);
            cpu_add(w->x, w->out, (int64_t)T * hid);
        }
    }
    /* Gather the rows asked for: the last n_logits of each sequence. */
    int n_sel = 0;
    for (int s = 0; s < n_seqs; s++) {
        int first = w->seq_off[s] + seqs[s].n_tokens - seqs[s].n_logits;
        memcpy(w->sel + (size_t)n_sel * hid, w->x + (size_t)first * hid, sizeof(float) * (size_t)seqs[s].n_logits * hid);
        n_sel += seqs[s].n_logits;
    }
    if (n_sel == 0) return CAIRN_OK;
    cpu_rmsnorm(w->sel, w->sel, m->final_norm, n_sel, hid, c->rms_eps, m->norm_offset);
    int V = c->vocab_size, s = 0, r_in_s = 0;
    for (int r0 = 0; r0 < n_sel; r0 += w->logit_rows) {
        int n = CAIRN_MIN(w->logit_rows, n_sel - r0);
        model_linear_apply(&m->lm_head, w->sel + (size_t)r0 * hid, w->logits, n);
        for (int r = 0; r < n; r++) {
            while (r_in_s >= seqs[s].n_logits) {
                s++;
                r_in_s = 0;
            }
            memcpy(seqs[s].logits + (size_t)r_in_s * V, w->logits + (size_t)r * V, sizeof(float) * (size_t)V);
            r_in_s++;
        }
    }
    return CAIRN_OK;
}

/* Each step holds the cpu room's lock: loaded models (one scheduler thread each) take turns
 * per step on the one compute pool, which a step uses whole anyway. */
int model_forward(struct model *m, struct kv_pool *kv, const struct model_seq *seqs, int n_seqs,
                  struct cairn_err *err)
{
    cpu_lock();
    int rc = model_forward_locked(m, kv, seqs, n_seqs, err);
    cpu_unlock();
    return rc;
}
