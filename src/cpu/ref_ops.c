/* Scalar reference ops: the readable definition every SIMD variant is checked against. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/cpu_int.h"
#include "cpu/ref.h"

void ref_matmul(const struct tensor *w, const float *x, float *y, int n, int64_t row_begin,
                int64_t row_end, float *row_buf)
{
    int64_t in = w->shape[1], out = w->shape[0];
    for (int64_t r = row_begin; r < row_end; r++) {
        tensor_row_to_f32(w, r, row_buf);
        for (int t = 0; t < n; t++) {
            const float *xt = x + (int64_t)t * in;
            double acc = 0; /* the reference accumulates in double: it is the yardstick */
            for (int64_t i = 0; i < in; i++) acc += (double)row_buf[i] * xt[i];
            y[(int64_t)t * out + r] = (float)acc;
        }
    }
}

void ref_embed(const struct tensor *w, const int32_t *ids, int n, float *out)
{
    int64_t dim = w->shape[1];
    for (int i = 0; i < n; i++) tensor_row_to_f32(w, ids[i], out + (int64_t)i * dim);
}

void ref_rmsnorm(float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                 float w_offset)
{
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (int64_t)r * dim;
        float *yr = y + (int64_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) yr[i] = xr[i] * inv * (w ? w[i] + w_offset : 1.0f);
    }
}

void ref_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
              const float *inv_freq)
{
    int half = rot_dim / 2;
    for (int t = 0; t < n_tokens; t++) {
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((int64_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                double ang = (double)pos[t] * inv_freq[i];
                float c = (float)cos(ang), s = (float)sin(ang);
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

void ref_silu_mul(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static float ref_kv_load(const struct backend_kv_view *kv, const void *base, int64_t idx)
{
    if (kv->dtype == DTYPE_F32) return ((const float *)base)[idx];
    return bf16_to_f32(((const uint16_t *)base)[idx]);
}

void ref_kv_store(const struct backend_kv_view *kv, int layer, const int32_t *slots, int n_tokens,
                  const float *k, const float *v)
{
    int64_t row = (int64_t)kv->n_kv_heads * kv->head_dim;
    for (int t = 0; t < n_tokens; t++) {
        int blk = slots[t] / kv->block_size, off = slots[t] % kv->block_size;
        uint8_t *kb = cpu_kv_k(kv, blk, layer), *vb = cpu_kv_v(kv, blk, layer);
        for (int64_t i = 0; i < row; i++) {
            if (kv->dtype == DTYPE_F32) {
                ((float *)kb)[off * row + i] = k[t * row + i];
                ((float *)vb)[off * row + i] = v[t * row + i];
            } else {
                ((uint16_t *)kb)[off * row + i] = f32_to_bf16(k[t * row + i]);
                ((uint16_t *)vb)[off * row + i] = f32_to_bf16(v[t * row + i]);
            }
        }
    }
}

/* One query head of one token: online softmax over positions [0, pos[t]]. */
void ref_attention_head(const struct cpu_attn *a, int t, int h, float *acc)
{
    const struct backend_kv_view *kv = a->kv;
    int hd = kv->head_dim, group = a->n_heads / kv->n_kv_heads;
    int64_t row = (int64_t)kv->n_kv_heads * hd;
    const float *q = a->q + ((int64_t)t * a->n_heads + h) * hd;
    int kvh = h / group;
    float m = -INFINITY, l = 0;
    for (int i = 0; i < hd; i++) acc[i] = 0;
    for (int p = 0; p <= a->pos[t]; p++) {
        int blk = a->block_table[p / kv->block_size], off = p % kv->block_size;
        const void *kb = cpu_kv_k(kv, blk, a->layer), *vb = cpu_kv_v(kv, blk, a->layer);
        int64_t base = off * row + (int64_t)kvh * hd;
        float s = 0;
        for (int i = 0; i < hd; i++) s += q[i] * ref_kv_load(kv, kb, base + i);
        s *= a->scale;
        /* Online softmax: rescale what was accumulated when the max grows. */
        float m_new = s > m ? s : m;
        float corr = expf(m - m_new), e = expf(s - m_new);
        l = l * corr + e;
        for (int i = 0; i < hd; i++) acc[i] = acc[i] * corr + e * ref_kv_load(kv, vb, base + i);
        m = m_new;
    }
    float *o = a->out + ((int64_t)t * a->n_heads + h) * hd;
    for (int i = 0; i < hd; i++) o[i] = acc[i] / l;
}

void ref_attention(const struct cpu_attn *a, int t_begin, int t_end, float *scratch)
{
    for (int t = t_begin; t < t_end; t++)
        for (int h = 0; h < a->n_heads; h++) ref_attention_head(a, t, h, scratch);
}

/* ---- the scalar kernel table (CAIRN_CPU_ISA=scalar) ---- */

static void ref_k_matmul(const struct cpu_mm *mm, int64_t r0, int64_t r1, float *row_buf)
{
    ref_matmul(mm->w, mm->x, mm->y, mm->n, r0, r1, row_buf);
}

static void ref_k_add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void ref_k_attn(const struct cpu_attn *a, int t, int kvh, float *scratch)
{
    int group = a->n_heads / a->kv->n_kv_heads;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) ref_attention_head(a, t, h, scratch);
}

static void ref_k_attn_tile(const struct cpu_attn *a, int kvh, int t0, int t1, float *scratch)
{
    for (int t = t0; t < t1; t++) ref_k_attn(a, t, kvh, scratch);
}

static float ref_probe_sum(const float *x, int64_t n)
{
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

static void ref_probe_triad(float *a, const float *b, const float *c, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

static float ref_probe_fma(int64_t iters, int *lanes)
{
    float acc[CPU_PROBE_FMA_CHAINS];
    for (int c = 0; c < CPU_PROBE_FMA_CHAINS; c++) acc[c] = (float)c;
    for (int64_t it = 0; it < iters; it++)
        for (int c = 0; c < CPU_PROBE_FMA_CHAINS; c++) acc[c] = acc[c] * 0.999999f + 1e-7f;
    float s = 0;
    for (int c = 0; c < CPU_PROBE_FMA_CHAINS; c++) s += acc[c];
    *lanes = 1;
    return s;
}

const struct cpu_kernels cpu_kernels_ref = {
    .probe_sum = ref_probe_sum,
    .probe_triad = ref_probe_triad,
    .probe_fma = ref_probe_fma,
    .matmul = ref_k_matmul,
    .rmsnorm = ref_rmsnorm,
    .rope = ref_rope,
    .silu_mul = ref_silu_mul,
    .add = ref_k_add,
    .attn = ref_k_attn,
    .attn_tile = ref_k_attn_tile,
    .attn_tile_auto = 1,
    .attn_rows = 16, /* the tiled split, with the reference doing each (token, head) */
};
