/* The forward-loop helper of generate, bench and the oracle check (model_run.h). */
#include "model/model_run.h"

#include <stdlib.h>
#include <string.h>

#include "kv/kv_state.h"

int model_run_open(struct model_run *r, struct model *m, const struct model_run_opts *o,
                   struct cairn_err *err)
{
    memset(r, 0, sizeof(*r));
    const struct model_info *info = model_get_info(m);
    if (o->n_seqs < 1 || o->max_ctx < 1 || o->max_step < 1 || o->block_size < 1)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "model_run: bad sizes (%d seqs, ctx %d, step %d, block %d)", o->n_seqs,
                             o->max_ctx, o->max_step, o->block_size);
    if (o->max_ctx > info->max_position && info->max_position > 0)
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "%d tokens > max_position %d", o->max_ctx,
                             info->max_position);
    r->m = m;
    r->n_seqs = o->n_seqs;
    r->blocks_per_seq = (o->max_ctx + o->block_size - 1) / o->block_size;
    int n_blocks = o->n_blocks > 0 ? o->n_blocks : o->n_seqs * r->blocks_per_seq;
    size_t sb = info->state_bytes;
    r->tables = calloc((size_t)o->n_seqs * (size_t)r->blocks_per_seq, sizeof(int32_t));
    r->pos = calloc((size_t)o->n_seqs, sizeof(int));
    r->ms = calloc((size_t)o->n_seqs, sizeof(*r->ms));
    if (!r->tables || !r->pos || !r->ms) {
        model_run_close(r);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "model_run: out of memory");
    }
    if (sb) {
        void *st = NULL;
        int rc = kv_state_alloc(model_backend(m), sb * (size_t)o->n_seqs, &st, err);
        r->states = st;
        if (rc != CAIRN_OK) {
            model_run_close(r);
            return rc;
        }
    }
    for (int i = 0; i < o->n_seqs * r->blocks_per_seq; i++)
        r->tables[i] = i % n_blocks;
    for (int s = 0; s < o->n_seqs; s++)
        model_run_reset(r, s);
    int rc = kv_pool_init(&r->kv, model_backend(m), info->n_kv_layers, n_blocks, o->block_size,
                          info->n_kv_heads > 0 ? info->n_kv_heads : 1,
                          info->head_dim > 0 ? info->head_dim : 1, o->kv_dtype, err);
    if (rc == CAIRN_OK) rc = model_reserve(m, o->max_step, err);
    if (rc != CAIRN_OK) model_run_close(r);
    return rc;
}

void model_run_close(struct model_run *r)
{
    if (r->kv.k) kv_pool_free(&r->kv);
    free(r->tables);
    free(r->pos);
    free(r->ms);
    if (r->states)
        kv_state_free(model_backend(r->m), r->states, model_get_info(r->m)->state_bytes * (size_t)r->n_seqs);
    memset(r, 0, sizeof(*r));
}

int32_t *model_run_table(struct model_run *r, int s)
{
    CAIRN_ASSERT(s >= 0 && s < r->n_seqs);
    return r->tables + (size_t)s * (size_t)r->blocks_per_seq;
}

void model_run_reset(struct model_run *r, int s)
{
    CAIRN_ASSERT(s >= 0 && s < r->n_seqs);
    r->pos[s] = 0;
    size_t sb = model_get_info(r->m)->state_bytes;
    if (sb) model_state_init(r->m, r->states + sb * (size_t)s);
}

int model_run_step(struct model_run *r, const struct model_run_item *items, int n,
                   struct cairn_err *err)
{
    size_t sb = model_get_info(r->m)->state_bytes;
    int bs = r->kv.block_size;
    if (n < 1 || n > r->n_seqs)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model_run: %d items", n);
    for (int i = 0; i < n; i++) {
        const struct model_run_item *it = &items[i];
        if (it->seq < 0 || it->seq >= r->n_seqs)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "model_run: no sequence %d", it->seq);
        if ((long)r->pos[it->seq] + it->n_tokens > (long)r->blocks_per_seq * bs)
            return cairn_err_set(err, CAIRN_ERR_LIMIT, "model_run: sequence %d passes %d tokens",
                                 it->seq, r->blocks_per_seq * bs);
        r->ms[i] = (struct model_seq){
            .tokens = it->tokens,
            .n_tokens = it->n_tokens,
            .pos0 = r->pos[it->seq],
            .block_table = model_run_table(r, it->seq),
            .state = sb ? r->states + sb * (size_t)it->seq : NULL,
            .n_logits = it->n_logits,
            .logits = it->logits,
        };
    }
    int rc = model_forward(r->m, kv_pool_view(&r->kv), r->ms, n, err);
    if (rc != CAIRN_OK) return rc;
    for (int i = 0; i < n; i++)
        r->pos[items[i].seq] += items[i].n_tokens;
    return CAIRN_OK;
}

int model_run_prefill(struct model_run *r, int s, const int32_t *tokens, int n, int chunk,
                      float *logits, struct cairn_err *err)
{
    if (chunk < 1) return cairn_err_set(err, CAIRN_ERR_INVALID, "model_run: chunk %d", chunk);
    for (int done = 0; done < n;) {
        int k = CAIRN_MIN(chunk, n - done);
        struct model_run_item it = {.seq = s,
                                    .tokens = tokens + done,
                                    .n_tokens = k,
                                    .n_logits = done + k == n && logits ? 1 : 0,
                                    .logits = logits};
        int rc = model_run_step(r, &it, 1, err);
        if (rc != CAIRN_OK) return rc;
        done += k;
    }
    return CAIRN_OK;
}
