/* The CPU backend's Gated DeltaNet op (tensor/backend.h backend_gdn; the math is described in
 * model/gdn.h): per token, the causal depthwise conv with its rolling state, then per value
 * head l2-normed q/k, the gated delta rule on the head's memory S and the gated RMSNorm.
 * Moved from model/gdn.c with the same arithmetic in the same order (bit-identical). Prefill
 * runs the exact recurrence token by token: on the CPU it is a small cost next to the
 * projections, and it matches the reference step for step.
 *
 * State (g->state, host memory until issue 15): conv [conv_dim, kernel-1], then delta
 * [n_v_heads, head_k_dim, head_v_dim]. Scratch: 2 * head_k_dim + 2 * head_v_dim floats of the
 * pool's shared scratch (the op runs on the calling thread). */
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/cpu_int.h"

static float cpu_gdn_silu(float x) { return x / (1.0f + expf(-x)); }
static float cpu_gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Causal depthwise conv over one token: x[c] becomes silu(sum_j w[c,j] * window[j]) where the
 * window is the K-1 stored inputs followed by x itself; then the window slides. */
static void cpu_gdn_conv_step(int cd, int kernel, const float *conv_w, float *conv_state, float *x)
{
    int km1 = kernel - 1;
    for (int c = 0; c < cd; c++) {
        float *st = conv_state + (size_t)c * km1;
        const float *w = conv_w + (size_t)c * kernel;
        float acc = w[km1] * x[c];
        for (int j = 0; j < km1; j++) acc += w[j] * st[j];
        if (km1 > 0) {
            memmove(st, st + 1, sizeof(float) * (km1 - 1));
            st[km1 - 1] = x[c];
        }
        x[c] = cpu_gdn_silu(acc);
    }
}

static void cpu_gdn_l2norm(float *x, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void cpu_gdn(const struct backend_gdn *g)
{
    const int dk = g->head_k_dim, dv = g->head_v_dim, nv = g->n_v_heads;
    CAIRN_ASSERT(g->n_k_heads > 0 && nv % g->n_k_heads == 0 && g->conv_kernel >= 1);
    const int r = nv / g->n_k_heads, key_dim = g->n_k_heads * dk, cd = 2 * key_dim + nv * dv;
    float *conv_state = g->state;
    float *delta_state = (float *)g->state + (size_t)cd * (g->conv_kernel - 1);
    float *scratch = cpu_shared_scratch((size_t)(2 * dk + 2 * dv));
    float *q = scratch, *k = scratch + dk, *kv_mem = scratch + 2 * dk;
    float scale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < g->n; t++) {
        float *x = g->qkv + (size_t)t * cd;
        cpu_gdn_conv_step(cd, g->conv_kernel, g->conv_w, conv_state, x);
        for (int h = 0; h < nv; h++) {
            int kh = h / r;
            memcpy(q, x + kh * dk, sizeof(float) * dk);
            memcpy(k, x + key_dim + kh * dk, sizeof(float) * dk);
            cpu_gdn_l2norm(q, dk);
            cpu_gdn_l2norm(k, dk);
            for (int i = 0; i < dk; i++) q[i] *= scale;
            const float *v = x + 2 * key_dim + h * dv;
            float gate = -expf(g->a_log[h]) * cpu_gdn_softplus(g->a[(size_t)t * nv + h] + g->dt_bias[h]);
            float decay = expf(gate);
            float beta = 1.0f / (1.0f + expf(-g->b[(size_t)t * nv + h]));
            float *S = delta_state + (size_t)h * dk * dv; /* S[i][j]: key dim i, value dim j */
            for (int j = 0; j < dv; j++) kv_mem[j] = 0;
            for (int i = 0; i < dk; i++) {
                float *row = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) {
                    row[j] *= decay;
                    kv_mem[j] += row[j] * k[i];
                }
            }
            for (int j = 0; j < dv; j++) kv_mem[j] = (v[j] - kv_mem[j]) * beta; /* delta */
            float *o = g->out + (size_t)t * nv * dv + (size_t)h * dv;
            for (int j = 0; j < dv; j++) o[j] = 0;
            for (int i = 0; i < dk; i++) {
                float *row = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) {
                    row[j] += k[i] * kv_mem[j];
                    o[j] += row[j] * q[i];
                }
            }
            /* Gated RMSNorm over this head's output. */
            double ss = 0;
            for (int j = 0; j < dv; j++) ss += (double)o[j] * o[j];
            float inv = (float)(1.0 / sqrt(ss / dv + g->eps));
            const float *zh = g->z + (size_t)t * nv * dv + (size_t)h * dv;
            for (int j = 0; j < dv; j++) o[j] = o[j] * inv * g->norm_w[j] * cpu_gdn_silu(zh[j]);
        }
    }
}
