/* Speculative verification: one sampler pass per row, accept while the draft agrees (see
 * spec_verify.h for why this is exact for greedy and sampled requests). */
#include "engine/spec_verify.h"

int spec_verify(struct sampler *s, const float *rows, size_t row_stride, int32_t *tokens,
                int n_tokens, int n_generated, const int32_t *draft, int k,
                spec_verify_emit_fn emit, void *ctx, int *n_accepted)
{
    return spec_verify_masked(s, rows, row_stride, tokens, n_tokens, n_generated, draft, k, NULL,
                              emit, ctx, n_accepted);
}

int spec_verify_masked(struct sampler *s, const float *rows, size_t row_stride, int32_t *tokens,
                       int n_tokens, int n_generated, const int32_t *draft, int k,
                       spec_verify_mask_fn mask, spec_verify_emit_fn emit, void *ctx,
                       int *n_accepted)
{
    int n_emitted = 0, n_acc = 0;
    for (int j = 0; j <= k; j++) {
        if (mask && mask(ctx)) break;
        int32_t t =
            sampler_sample(s, rows + (size_t)j * row_stride, tokens, n_tokens + j, n_generated + j);
        sampler_accept(s, t);
        tokens[n_tokens + j] = t;
        n_emitted++;
        int stop = emit ? emit(ctx, t) : 0;
        if (j == k || t != draft[j]) break;
        n_acc++;
        if (stop) break;
    }
    if (n_accepted) *n_accepted = n_acc;
    return n_emitted;
}
