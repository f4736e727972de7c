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
 * The projections are the family's linears (arch_qwen3_hybrid.c); the core above is the
 * backend's gdn op (tensor/backend.h backend_gdn; the CPU's is cpu/cpu_gdn.c). This header keeps
 * the dimensions and the state size. */
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

static inline int gdn_key_dim(const struct gdn_dims *d) { return d->n_k_heads * d->head_k_dim; }
static inline int gdn_value_dim(const struct gdn_dims *d) { return d->n_v_heads * d->head_v_dim; }
static inline int gdn_conv_dim(const struct gdn_dims *d)
{
    return 2 * gdn_key_dim(d) + gdn_value_dim(d);
}
/* Floats of state per sequence for one layer: conv + delta. */
static inline size_t gdn_state_floats(const struct gdn_dims *d)
{
    return (size_t)gdn_conv_dim(d) * (size_t)(d->conv_kernel - 1) +
           (size_t)d->n_v_heads * (size_t)d->head_k_dim * (size_t)d->head_v_dim;
}

#endif
