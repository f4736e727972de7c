/* Verification of a speculative draft against the target model's logits.
 *
 * A verify step ran the forward over [last committed token, draft[0], ..., draft[k-1]] and has
 * k + 1 rows of logits: row j predicts the token after draft[j-1] (row 0: after the last
 * committed token). Row j is sampled with the request's sampler exactly as plain decoding would
 * sample it, the whole pipeline of sampler.h included (penalties see the history with draft[0,
 * j) in it, which is what plain decoding would have by then), giving t_j. draft[j] is accepted
 * iff t_j == draft[j]; the first t_j that differs is the correction and ends the step; when all
 * k are accepted, t_k is the bonus token. So 1 to k + 1 tokens are emitted per step.
 *
 * Greedy (temperature 0): t_j is the argmax, so this is "accept the longest prefix equal to the
 * argmax", and the output is identical to decoding without speculation.
 *
 * Sampled: this is standard speculative rejection sampling for a deterministic drafter, written
 * as a coupling. With q a point mass on the draft token d, the textbook rule accepts d with
 * probability min(1, p(d) / q(d)) = p(d) and otherwise draws from the residual (p - q)+
 * normalized, which is p restricted to tokens != d, renormalized. Drawing x ~ p and accepting iff
 * x == d has the same law: P(accept) = p(d), and given a rejection x is distributed as
 * p(x) / (1 - p(d)) over x != d, the residual. Both emit a token distributed exactly as p
 * (tests/unit/test_spec_verify.c checks it statistically). Doing it this way draws exactly one
 * uniform per emitted token from the request's PRNG, as plain decoding does, so a seeded
 * request produces the same tokens with and without speculation, whatever the drafts were
 * and whether the controller drafted at all. (A drafter with a spread-out q, such as a sampled
 * draft model, would need the general rule with p and q vectors; no such drafter exists yet.)
 *
 * Nothing here allocates; the sampler's buffers are used. */
#ifndef CAIRN_ENGINE_SPEC_VERIFY_H
#define CAIRN_ENGINE_SPEC_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"

/* Called for each emitted token t_j, in order, right after it was sampled (the sampler's
 * logprob / top_* fields describe it). Return nonzero to stop after this token (EOS, a stop
 * string, the length limit): the rest of the draft is discarded. */
typedef int (*spec_verify_emit_fn)(void *ctx, int32_t token);

/* Verifies draft[0, k) (k >= 0; k = 0 is a plain decode step) against rows[(k + 1) * row_stride]
 * floats. tokens[0, n_tokens) is the sequence so far, of which the last n_generated were
 * generated; tokens[n_tokens, n_tokens + k] must have room: t_j is written at tokens[n_tokens + j]
 * before emit is called (so a draft the forward read from there is overwritten by what was
 * really emitted). Each t_j is passed to sampler_accept. Returns the number of tokens emitted
 * (1 to k + 1); *n_accepted (may be NULL) gets how many draft tokens were accepted. */
int spec_verify(struct sampler *s, const float *rows, size_t row_stride, int32_t *tokens,
                int n_tokens, int n_generated, const int32_t *draft, int k,
                spec_verify_emit_fn emit, void *ctx, int *n_accepted);

/* Called before row j is sampled (a grammar sets the sampler's mask for the state after t_0 ..
 * t_(j-1), which emit advanced it by). Nonzero: stop before sampling row j (the grammar is
 * complete, or an error); spec_verify_masked then returns the j tokens emitted so far (0 when
 * j = 0). */
typedef int (*spec_verify_mask_fn)(void *ctx);

/* spec_verify with a mask hook (NULL: none). Since only emitted tokens reach the hook's state
 * (through emit), a rejected draft token never enters it: nothing to roll back. */
int spec_verify_masked(struct sampler *s, const float *rows, size_t row_stride, int32_t *tokens,
                       int n_tokens, int n_generated, const int32_t *draft, int k,
                       spec_verify_mask_fn mask, spec_verify_emit_fn emit, void *ctx,
                       int *n_accepted);

#endif
