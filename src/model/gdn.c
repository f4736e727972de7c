/* Gated DeltaNet layer core: conv1d with rolling state, the delta rule, gated RMSNorm. */
#include "model/gdn.h"

#include <math.h>
#include <string.h>

size_t gdn_state_floats(const struct gdn_dims *d)
{
    return (size_t)gdn_conv_dim(d) * (size_t)(d->conv_kernel - 1) +
           (size_t)d->n_v_heads * (size_t)d->head_k_dim * (size_t)d->head_v_dim;
}

size_t gdn_scratch_floats(const struct gdn_dims *d)
{
    return (size_t)d->head_k_dim * 2 + (size_t)d->head_v_dim * 2;
}

void gdn_unpack_qwen3_next(const struct gdn_dims *d, const float *qkvz, const float *ba, float *qkv,
                           float *z, float *b, float *a)
{
    int dk = d->head_k_dim, dv = d->head_v_dim, r = d->n_v_heads / d->n_k_heads;
    int key_dim = gdn_key_dim(d);
    int per_head = 2 * dk + 2 * r * dv;
    for (int h = 0; h < d->n_k_heads; h++) {
        const float *src = qkvz + (size_t)h * per_head;
        memcpy(qkv + h * dk, src, sizeof(float) * dk);
        memcpy(qkv + key_dim + h * dk, src + dk, sizeof(float) * dk);
        memcpy(qkv + 2 * key_dim + h * r * dv, src + 2 * dk, sizeof(float) * r * dv);
        memcpy(z + h * r * dv, src + 2 * dk + r * dv, sizeof(float) * r * dv);
        memcpy(b + h * r, ba + h * 2 * r, sizeof(float) * r);
        memcpy(a + h * r, ba + h * 2 * r + r, sizeof(float) * r);
    }
}

static float gdn_silu(float x) { return x / (1.0f + expf(-x)); }
static float gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Causal depthwise conv over one token: x[c] becomes silu(sum_j w[c,j] * window[j]) where the
 * window is the K-1 stored inputs followed by x itself; then the window slides. */
static void gdn_conv_step(const struct gdn_dims *d, const float *conv_w, float *conv_state,
                          float *x)
{
    int cd = gdn_conv_dim(d), km1 = d->conv_kernel - 1;
    for (int c = 0; c < cd; c++) {
        float *st = conv_state + (size_t)c * km1;
        const float *w = conv_w + (size_t)c * d->conv_kernel;
        float acc = w[km1] * x[c];
        for (int j = 0; j < km1; j++) acc += w[j] * st[j];
        if (km1 > 0) {
            memmove(st, st + 1, sizeof(float) * (km1 - 1));
            st[km1 - 1] = x[c];
        }
        x[c] = gdn_silu(acc);
    }
}

static void gdn_l2norm(float *x, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void gdn_forward(const struct gdn_dims *d, const struct gdn_params *p, float *state, float *qkv,
                 const float *z, const float *b, const float *a, int n, float *out,
                 float *scratch)
{
    int dk = d->head_k_dim, dv = d->head_v_dim, nv = d->n_v_heads;
    int r = nv / d->n_k_heads, key_dim = gdn_key_dim(d), cd = gdn_conv_dim(d);
    float *conv_state = state;
    float *delta_state = state + (size_t)cd * (d->conv_kernel - 1);
    float *q = scratch, *k = scratch + dk, *kv_mem = scratch + 2 * dk;
    float scale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < n; t++) {
        float *x = qkv + (size_t)t * cd;
        gdn_conv_step(d, p->conv_w, conv_state, x);
        for (int h = 0; h < nv; h++) {
            int kh = h / r;
            memcpy(q, x + kh * dk, sizeof(float) * dk);
            memcpy(k, x + key_dim + kh * dk, sizeof(float) * dk);
            gdn_l2norm(q, dk);
            gdn_l2norm(k, dk);
            for (int i = 0; i < dk; i++) q[i] *= scale;
            const float *v = x + 2 * key_dim + h * dv;
            float g = -expf(p->a_log[h]) * gdn_softplus(a[(size_t)t * nv + h] + p->dt_bias[h]);
            float decay = expf(g);
            float beta = 1.0f / (1.0f + expf(-b[(size_t)t * nv + h]));
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
            float *o = out + (size_t)t * nv * dv + (size_t)h * dv;
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
            float inv = (float)(1.0 / sqrt(ss / dv + p->eps));
            const float *zh = z + (size_t)t * nv * dv + (size_t)h * dv;
            for (int j = 0; j < dv; j++) o[j] = o[j] * inv * p->norm_w[j] * gdn_silu(zh[j]);
        }
    }
}
