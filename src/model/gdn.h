/* Gated DeltaNet (linear attention with a recurrent state), as in Qwen3-Next and Qwen3.5.
 *
 * Per sequence and GDN layer the state is:
 *   conv:  [conv_dim, kernel-1]  the last kernel-1 inputs of the causal depthwise conv1d
 *   delta: [n_v_heads, head_k_dim, head_v_dim]  the delta-rule memory S
 * Per token (after the input projections):
 *   qkv = silu(conv1d(qkv))  (conv over time, per channel, with the rolling state)
 *   q, k: l2-normalised per head; q *= 1/sqrt(head_k_dim); value head h uses key head
 *         h / (n_v_heads / n_k_heads)
 *   g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
 *   S = S * exp(g); delta = (v - S^T k) * beta; S += k ⊗ delta; o = S^T q
 *   out = rmsnorm(o) * w * silu(z)   (per value head, head_v_dim wide)
 * Prefill runs the exact recurrence token by token: on CPU it is a small cost next to the
 * projections, and it matches the reference math step for step. */
#ifndef CAIRN_MODEL_GDN_H
#define CAIRN_MODEL_GDN_H

#include <stddef.h>

struct gdn_dims {
    int n_k_heads;
    int n_v_heads;
    int head_k_dim;
    int head_v_dim;
    int conv_kernel;
};

struct gdn_params {
    const float *conv_w;  /* [conv_dim, conv_kernel] */
    const float *a_log;   /* [n_v_heads] */
    const float *dt_bias; /* [n_v_heads] */
    const float *norm_w;  /* [head_v_dim] (gated RMSNorm weight, plain, not zero-centred) */
    float eps;
};

static inline int gdn_key_dim(const struct gdn_dims *d) { return d->n_k_heads * d->head_k_dim; }
static inline int gdn_value_dim(const struct gdn_dims *d) { return d->n_v_heads * d->head_v_dim; }
static inline int gdn_conv_dim(const struct gdn_dims *d)
{
    return 2 * gdn_key_dim(d) + gdn_value_dim(d);
}
/* Floats of state per sequence for one layer: conv + delta. */
size_t gdn_state_floats(const struct gdn_dims *d);
/* Floats of scratch gdn_forward needs. */
size_t gdn_scratch_floats(const struct gdn_dims *d);

/* Qwen3-Next packs in_proj_qkvz per key head as [q, k, v-group, z-group] and in_proj_ba as
 * [b-group, a-group]; this reorders one token into the Qwen3.5 layout used below:
 * qkv: [q heads | k heads | v heads], z: [value_dim], b, a: [n_v_heads]. */
void gdn_unpack_qwen3_next(const struct gdn_dims *d, const float *qkvz, const float *ba, float *qkv,
                           float *z, float *b, float *a);

/* Runs n tokens of one sequence through the layer core and advances state.
 * qkv: [n, conv_dim] (overwritten), z: [n, value_dim], b, a: [n, n_v_heads];
 * out: [n, value_dim]. */
void gdn_forward(const struct gdn_dims *d, const struct gdn_params *p, float *state, float *qkv,
                 const float *z, const float *b, const float *a, int n, float *out,
                 float *scratch);

#endif
