/* Token sampler: one per request, buffers sized at admission so sampling allocates nothing.
 *
 * Pipeline over the raw logits of one position (the order matters and is fixed):
 *   1. repetition_penalty over the distinct tokens among the last repetition_context_size tokens
 *      of prompt + generated (logit > 0: divided by the penalty, else multiplied; as mlx-lm and
 *      Hugging Face do); context size 20 when the penalty is set and the size is 0;
 *   2. presence / frequency penalties over the GENERATED tokens (OpenAI:
 *      logit -= count * frequency + (count > 0) * presence);
 *   3. logit_bias added;
 *   3b. grammar mask (`allowed`, when the caller set one for this call): every token not in the
 *      bitset becomes -inf, so it can be neither sampled nor listed among top_logprobs;
 *   -> logprobs: log-softmax of these processed logits (before temperature, top-k/p, min-p), i.e.
 *      the model's distribution as adjusted by the request's penalties and bias;
 *   4. temperature == 0: greedy argmax (ties -> lowest id);
 *      else divide by temperature, keep top_k, then the top_p nucleus, then min_p (relative to the
 *      top probability), renormalize and draw with the request's PRNG.
 * The PRNG (xoshiro256**) is seeded from the request seed (has_seed) so results are the same
 * whatever else is batched; without a seed it is seeded from a global counter and the clock. One
 * draw per sampled token. */
#ifndef CAIRN_ENGINE_SAMPLER_H
#define CAIRN_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/status.h"
#include "engine/engine.h"
#include "tensor/backend.h"

#define SAMPLER_MAX_TOP_LOGPROBS BACKEND_SAMPLE_MAX_TOP
#define SAMPLER_N_BUCKETS 1024

struct sampler {
    struct engine_sampling p;         /* copy; p.logit_bias points to `bias` below */
    int vocab_size;
    int rep_ctx;                      /* effective repetition context size */
    uint64_t rng[4];
    struct engine_logit_bias *bias;   /* [p.n_logit_bias], owned */
    float *work;                      /* [vocab] processed logits (only written when a penalty or
                                       * a bias applies; else the input logits are used as is) */
    float *probs;                     /* [vocab] */
    int32_t *idx;                     /* [vocab] candidate ids / top-k heap */
    int32_t *counts;                  /* [vocab] generated-token counts, or NULL if unused */
    uint8_t *mark;                    /* [vocab] repetition-penalty dedupe, or NULL */
    struct backend_logit_edit *edits; /* [cap_edits] steps 1-3 of this call as edits, or NULL */
    int cap_edits;
    const uint32_t *allowed;          /* [(vocab + 31) / 32] grammar mask for the next
                                       * sampler_sample only (it resets it to NULL); not owned */
    double *bucket_mass;              /* [SAMPLER_N_BUCKETS] top-p histogram */
    int32_t *bucket_count;            /* [SAMPLER_N_BUCKETS] */
    /* outputs of the last sampler_sample */
    float logprob;
    int n_top;
    int32_t top_ids[SAMPLER_MAX_TOP_LOGPROBS];
    float top_logprobs[SAMPLER_MAX_TOP_LOGPROBS];
};

/* Validates parameters (error names the bad one) and allocates the buffers. */
int sampler_init(struct sampler *s, const struct engine_sampling *p, int vocab_size,
                 struct cairn_err *err);
void sampler_free(struct sampler *s);

/* Checks sampling parameters without allocating. */
int sampler_validate(const struct engine_sampling *p, int vocab_size, struct cairn_err *err);

/* Samples one token from logits[vocab]. `history` holds prompt + generated tokens so far
 * (n_history), of which the last n_generated are generated. Fills logprob/top_* when requested.
 * Does not record the token: call sampler_accept with it. With s->allowed set (at least one bit
 * on), only an allowed token can come out; without it nothing of the mask is touched, so an
 * unconstrained request pays nothing. */
int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history,
                       int n_history, int n_generated);
/* Records a generated token (presence/frequency counts). */
void sampler_accept(struct sampler *s, int32_t token);

/* Rows sampled by the backend (its optional sample op, tensor/backend.h), same pipeline:
 * _eligible: 1 when the op can take s's next row: no grammar mask set for it, and with
 * temperature no top-p without top-k and top_k at most max_top_k (the backend's sample_top_k);
 * greedy rows ignore both (other rows are sampled here from downloaded logits). _prepare: fills
 * row with s's parameters (top_k / top_p only for a truncating top-k with temperature), the
 * edits of steps 1-3 (pointing into s, valid until s's next call) and, when temperature > 0, the
 * one uniform draw sampler_sample would take from s's PRNG, so a request's seeded stream is
 * the same on either path. _finish: takes the op's result (logprob, top_* into s) and returns the
 * token; call sampler_accept with it as usual. */
int sampler_row_eligible(const struct sampler *s, int max_top_k);
void sampler_row_prepare(struct sampler *s, const int32_t *history, int n_history, int n_generated,
                         struct backend_sample_row *row);
int32_t sampler_row_finish(struct sampler *s, const struct backend_sample_out *out);
/* The sample op's semantics on the host, for one row of logits[vocab] (tests; a fake backend):
 * the edits applied in order, then steps 4 and the logprobs with the row's draw. Allocates. */
int sampler_row_reference(const float *logits, int vocab_size, const struct backend_sample_row *row,
                          struct backend_sample_out *out);
/* Applies n edits to w in order (what a backend's sample op must do bit for bit). */
void sampler_edits_apply(float *w, const struct backend_logit_edit *e, int n);

/* Helpers shared with tests: indices of the k largest values (ties -> lower index first), sorted
 * by decreasing value, written to out[k] (which is also the selection heap: no other scratch). */
void sampler_top_k_indices(const float *v, int n, int k, int32_t *out);

#endif
