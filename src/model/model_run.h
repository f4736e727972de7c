/* A forward loop over model_forward for a fixed set of sequences: their paged KV (a kv_pool on
 * the model's backend), block tables, recurrent states and positions. One helper for the
 * commands that drive a model without the engine: `cairn generate`, `cairn bench` and the
 * oracle check (check.c, `cairn check-logits`).
 *
 * Usage: model_run_open; per step model_run_step with one item per sequence that moves (a
 * prefill chunk or one decode token; each item's tokens go at that sequence's current
 * position), or model_run_prefill for a whole prompt in chunks; model_run_reset to start a
 * sequence again; model_run_close. Not thread-safe: one caller per struct. */
#ifndef CAIRN_MODEL_MODEL_RUN_H
#define CAIRN_MODEL_MODEL_RUN_H

#include <stdint.h>

#include "base/status.h"
#include "kv/kv_pool.h"
#include "model/model.h"

struct model_run_opts {
    int n_seqs;          /* sequences */
    int max_ctx;         /* tokens each sequence may reach */
    int max_step;        /* tokens of one step over all sequences (model_reserve) */
    int block_size;      /* KV block size (tokens) */
    enum dtype kv_dtype; /* DTYPE_BF16 or DTYPE_F32 */
    int n_blocks;        /* pool blocks; 0: n_seqs * blocks_per_seq (each sequence its own) */
};

struct model_run {
    struct model *m; /* not owned */
    struct kv_pool kv;
    int n_seqs;
    int blocks_per_seq;   /* ceil(max_ctx / block_size) */
    int32_t *tables;      /* [n_seqs][blocks_per_seq]; default: sequence s owns blocks
                             s * blocks_per_seq + j (model_run_table to set others) */
    uint8_t *states;      /* [n_seqs][state_bytes] recurrent state in the model's backend
                           * memory (kv_state.h), or NULL */
    int *pos;             /* [n_seqs] tokens already in KV */
    struct model_seq *ms; /* [n_seqs] a step's sequences */
};

/* One sequence's part of a step: n_tokens tokens at its current position; logits of its last
 * n_logits tokens into logits ([n_logits, vocab]). */
struct model_run_item {
    int seq;
    const int32_t *tokens;
    int n_tokens;
    int n_logits;
    float *logits;
};

int model_run_open(struct model_run *r, struct model *m, const struct model_run_opts *o,
                   struct cairn_err *err);
void model_run_close(struct model_run *r);
/* Sequence s's block table (blocks_per_seq entries), writable before its first step. */
int32_t *model_run_table(struct model_run *r, int s);
/* Sequence s is empty again: position 0, fresh recurrent state (its KV is overwritten). */
void model_run_reset(struct model_run *r, int s);
/* One model_forward over the items (at most one per sequence). Fails with CAIRN_ERR_LIMIT when
 * a sequence would pass max_ctx. */
int model_run_step(struct model_run *r, const struct model_run_item *items, int n,
                   struct cairn_err *err);
/* Prefills n tokens of sequence s in steps of `chunk`; logits of the last token into logits
 * ([vocab]; NULL: none). */
int model_run_prefill(struct model_run *r, int s, const int32_t *tokens, int n, int chunk,
                      float *logits, struct cairn_err *err);

#endif
