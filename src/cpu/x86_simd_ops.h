/* The SIMD kernels, written once over a vector abstraction and compiled twice: included by
 * x86_avx2_ops.c (8 lanes) and x86_avx512_ops.c (16 lanes), which define the V_* macros, VW,
 * the tile sizes and K(name) (the symbol prefix) before including this file.
 *
 * Numerics: weights are widened to f32 exactly (bf16: shift; f16: vcvtph2ps; MLX affine:
 * scale * code + bias in f32) and multiplied with f32 activations in f32 FMA, so results match
 * the scalar reference up to summation order (tests: relative error ~1e-5 of the row norm).
 *
 * matmul: y[n, out] = x[n, in] · W^T, register-tiled rows × MM_TT tokens (n = 1: rows × 1), with
 * MM_RTD rows for dense weights and MM_RTQ for MLX quantized ones (whose tiles also hold each
 * row's scale and bias in registers),
 * tokens blocked by MM_TB so the x block stays in L2 while a thread walks its rows. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu/cpu_int.h"

#define CPU_AI static inline __attribute__((always_inline))

/* ---- vector helpers ---- */

/* e^x for x in [-87, 88] (clamped): 2^n · p(r), r = x - n ln2, degree-6 Taylor on |r| <= ln2/2
 * (relative error < 2e-7). */
CPU_AI VF K(vexp)(VF x)
{
    x = V_MIN(V_MAX(x, V_SET1(-87.0f)), V_SET1(88.0f));
    VF n = V_ROUND(V_MUL(x, V_SET1(1.44269504088896341f)));
    VF r = V_FNMADD(n, V_SET1(0.693145751953125f), x);
    r = V_FNMADD(n, V_SET1(1.428606765330187e-06f), r);
    VF p = V_SET1(1.0f / 720);
    p = V_FMA(p, r, V_SET1(1.0f / 120));
    p = V_FMA(p, r, V_SET1(1.0f / 24));
    p = V_FMA(p, r, V_SET1(1.0f / 6));
    p = V_FMA(p, r, V_SET1(0.5f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_FMA(p, r, V_SET1(1.0f));
    return V_MUL(p, V_POW2I(n));
}

CPU_AI VF K(kvload)(const void *p, int64_t i, int is_f32)
{
    return is_f32 ? V_LOAD((const float *)p + i) : V_LOAD_BF16((const uint16_t *)p + i);
}

CPU_AI float K(kvload1)(const void *p, int64_t i, int is_f32)
{
    return is_f32 ? ((const float *)p)[i] : bf16_to_f32(((const uint16_t *)p)[i]);
}

static float K(dot_f32)(const float *a, const float *b, int64_t n)
{
    VF acc0 = V_ZERO(), acc1 = V_ZERO();
    int64_t i = 0;
    for (; i + 2 * VW <= n; i += 2 * VW) {
        acc0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), acc0);
        acc1 = V_FMA(V_LOAD(a + i + VW), V_LOAD(b + i + VW), acc1);
    }
    for (; i + VW <= n; i += VW) acc0 = V_FMA(V_LOAD(a + i), V_LOAD(b + i), acc0);
    float s = V_HSUM(V_ADD(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- matmul ---- */

CPU_AI VF K(wload)(const void *row, int64_t k, const int dt)
{
    if (dt == DTYPE_F32) return V_LOAD((const float *)row + k);
    if (dt == DTYPE_BF16) return V_LOAD_BF16((const uint16_t *)row + k);
    return V_LOAD_F16((const uint16_t *)row + k);
}

CPU_AI float K(wload1)(const void *row, int64_t k, const int dt)
{
    if (dt == DTYPE_F32) return ((const float *)row)[k];
    if (dt == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)row)[k]);
    return f16_to_f32(((const uint16_t *)row)[k]);
}

#define MM_TB 64 /* tokens per block: the block's x stays in L2 while a thread walks its rows */

/* Does the tile at token t fetch the next row tile ahead? In decode (n < 2 MM_TT) always: each
 * weight is streamed once. In prefill only the first token tile of a block, which fetches the
 * next row tile from DRAM while the others reuse this one's rows from cache (fetching from every
 * tile evicted the rows in use). */
CPU_AI int K(tile_prefetches)(const struct cpu_mm *mm, int t)
{
    return mm->n < 2 * MM_TT || t % MM_TB == 0;
}

/* Rows [r, r+nr) (nr <= RT <= MM_RTD; missing rows repeat the last one and are not stored) ×
 * tokens [t, t+TT) of a dense (f32/bf16/f16) weight, over inputs [k0, k1): y = the dot products,
 * or y += them when add (k-blocked prefill, see matmul_dense). */
CPU_AI void K(dense_tile)(const struct cpu_mm *mm, int64_t r, int64_t nr, int t, const int dt,
                          const int TT, const int RT, int64_t k0, int64_t k1, int add)
{
    const int prefetch = K(tile_prefetches)(mm, t);
    const int64_t in = mm->in;
    const size_t esz = dt == DTYPE_F32 ? 4 : 2;
    const size_t pf_ahead = (size_t)cpu_prefetch_ahead((int64_t)RT * in * (int64_t)esz);
    const char *wrow[MM_RTD];
    const float *xr[MM_TT];
    VF acc[MM_RTD][MM_TT];
#pragma GCC unroll 8
    for (int i = 0; i < RT; i++)
        wrow[i] = (const char *)mm->w->data + (size_t)(r + (i < nr ? i : nr - 1)) * (size_t)in * esz;
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) xr[j] = mm->x + (int64_t)(t + j) * in;
#pragma GCC unroll 8
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 8
        for (int j = 0; j < TT; j++) acc[i][j] = V_ZERO();
    int64_t k = k0;
    for (; k + VW <= k1; k += VW) {
        VF xv[MM_TT];
#pragma GCC unroll 8
        for (int j = 0; j < TT; j++) xv[j] = V_LOAD(xr[j] + k);
#pragma GCC unroll 8
        for (int i = 0; i < RT; i++) {
            /* Weights usually sit in 4 KiB pages of an mmap'd file, where the hardware
             * prefetcher stops at every page: fetch the next tile's rows ahead. */
            if (prefetch) _mm_prefetch(wrow[i] + (size_t)k * esz + pf_ahead, _MM_HINT_T0);
            VF wv = K(wload)(wrow[i], k, dt);
#pragma GCC unroll 8
            for (int j = 0; j < TT; j++) acc[i][j] = V_FMA(wv, xv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < TT; j++) {
            float s = V_HSUM(acc[i][j]);
            for (int64_t kk = k; kk < k1; kk++) s += K(wload1)(wrow[i], kk, dt) * xr[j][kk];
            float *y = &mm->y[(int64_t)(t + j) * mm->out + r + i];
            *y = add ? *y + s : s;
        }
}

/* Row r · token t over all inputs, for decode: one weight stream (a 4-row tile's four streams
 * ran a bf16 matrix of 32K×2K 22% slower out of DRAM: the hardware prefetcher keeps up with
 * one sequential stream per core), four accumulators to cover the FMA latency. */
CPU_AI void K(dense_row)(const struct cpu_mm *mm, int64_t r, int t, const int dt)
{
    const int64_t in = mm->in;
    const size_t esz = dt == DTYPE_F32 ? 4 : 2, pf_ahead = (size_t)cpu_prefetch_ahead(in * (int64_t)esz);
    const char *w = (const char *)mm->w->data + (size_t)r * (size_t)in * esz;
    const float *x = mm->x + (int64_t)t * in;
    VF acc[4] = {V_ZERO(), V_ZERO(), V_ZERO(), V_ZERO()};
    int64_t k = 0;
    for (; k + 4 * VW <= in; k += 4 * VW) {
        /* 4 KiB pages of an mmap'd file stop the hardware prefetcher: fetch ahead */
        for (size_t off = 0; off < 4 * VW * esz; off += 64) _mm_prefetch(w + (size_t)k * esz + off + pf_ahead, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) acc[u] = V_FMA(K(wload)(w, k + u * VW, dt), V_LOAD(x + k + u * VW), acc[u]);
    }
    for (; k + VW <= in; k += VW) acc[0] = V_FMA(K(wload)(w, k, dt), V_LOAD(x + k), acc[0]);
    float s = V_HSUM(V_ADD(V_ADD(acc[0], acc[1]), V_ADD(acc[2], acc[3])));
    for (; k < in; k++) s += K(wload1)(w, k, dt) * x[k];
    mm->y[(int64_t)t * mm->out + r] = s;
}

/* Decode and small batches (n < 2 MM_TT): row by row (dense_row), weights streamed once.
 * Prefill: MM_RTD-row tiles over blocks of MM_KB inputs, so a tile's rows stay in L1 while
 * every token tile of the token block reuses them; over whole rows of 2K+ inputs they spilled
 * to L2 and prefill fell to ~40% of the FMA peak. */
#define MM_KB 2048
CPU_AI void K(matmul_dense)(const struct cpu_mm *mm, int64_t r0, int64_t r1, const int dt)
{
    const int64_t in = mm->in, kb = dt == DTYPE_F32 ? MM_KB / 2 : MM_KB;
    for (int tb = 0; tb < mm->n; tb += MM_TB) {
        int te = tb + MM_TB < mm->n ? tb + MM_TB : mm->n;
        if (mm->n < 2 * MM_TT) {
            for (int64_t r = r0; r < r1; r++)
                for (int t = tb; t < te; t++) K(dense_row)(mm, r, t, dt);
            continue;
        }
        for (int64_t r = r0; r < r1; r += MM_RTD) {
            int64_t nr = r1 - r < MM_RTD ? r1 - r : MM_RTD;
            for (int64_t k0 = 0; k0 < in; k0 += kb) {
                int64_t k1 = in - k0 < kb ? in : k0 + kb;
                int t = tb;
                for (; t + MM_TT <= te; t += MM_TT)
                    K(dense_tile)(mm, r, nr, t, dt, MM_TT, MM_RTD, k0, k1, k0 > 0);
                for (; t < te; t++) K(dense_tile)(mm, r, nr, t, dt, 1, MM_RTD, k0, k1, k0 > 0);
            }
        }
    }
}

/* Same for MLX affine q4/q8 with in % 32 == 0 and group_size % 32 == 0: each weight is
 * dequantized in-register (scale * code + bias) and FMA'd with the activations. bits 4 reads
 * the de-interleaved activations mm->xp (see struct cpu_mm). */
CPU_AI void K(q_tile)(const struct cpu_mm *mm, int64_t r, int64_t nr, int t, const int bits,
                      const int TT, const int RT)
{
    (void)RT;
    const int prefetch = K(tile_prefetches)(mm, t);
    const struct tensor *w = mm->w;
    const int64_t in = mm->in, gs = w->group_size, groups = in / gs;
    const int64_t row_bytes = in * bits / 8, gbytes = gs * bits / 8;
    const int64_t pf_ahead = cpu_prefetch_ahead(MM_RTQ * row_bytes);
    const uint8_t *wrow[MM_RTQ];
    const uint16_t *sc[MM_RTQ], *bi[MM_RTQ];
    const float *xr[MM_TT];
    VF acc[MM_RTQ][MM_TT];
#pragma GCC unroll 8
    for (int i = 0; i < MM_RTQ; i++) {
        int64_t ri = r + (i < nr ? i : nr - 1);
        wrow[i] = (const uint8_t *)w->data + ri * row_bytes;
        sc[i] = w->scales + ri * groups;
        bi[i] = w->biases + ri * groups;
    }
#pragma GCC unroll 8
    for (int j = 0; j < TT; j++) xr[j] = (bits == 4 ? mm->xp : mm->x) + (int64_t)(t + j) * in;
#pragma GCC unroll 8
    for (int i = 0; i < MM_RTQ; i++)
#pragma GCC unroll 8
        for (int j = 0; j < TT; j++) acc[i][j] = V_ZERO();
    for (int64_t g = 0; g < groups; g++) {
        VF s[MM_RTQ], b[MM_RTQ];
#pragma GCC unroll 8
        for (int i = 0; i < MM_RTQ; i++) {
            s[i] = V_SET1(bf16_to_f32(sc[i][g]));
            b[i] = V_SET1(bf16_to_f32(bi[i][g]));
            /* Next tile's codes (see dense_tile: 4 KiB pages stop the hardware prefetcher). */
            if (!prefetch) continue;
            for (int64_t off = 0; off < gbytes; off += 64)
                _mm_prefetch((const char *)wrow[i] + g * gbytes + off + pf_ahead, _MM_HINT_T0);
            if ((g & 31) == 0) {
                _mm_prefetch((const char *)(sc[i] + g + pf_ahead / row_bytes * groups), _MM_HINT_T0);
                _mm_prefetch((const char *)(bi[i] + g + pf_ahead / row_bytes * groups), _MM_HINT_T0);
            }
        }
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
            if (bits == 8) {
#pragma GCC unroll 4
                for (int64_t u = 0; u < 32; u += VW) {
                    VF xv[MM_TT];
#pragma GCC unroll 8
                    for (int j = 0; j < TT; j++) xv[j] = V_LOAD(xr[j] + k + u);
#pragma GCC unroll 8
                    for (int i = 0; i < MM_RTQ; i++) {
                        VF wv = V_FMA(V_I2F(V_LOAD_U8I(wrow[i] + k + u)), s[i], b[i]);
#pragma GCC unroll 8
                        for (int j = 0; j < TT; j++) acc[i][j] = V_FMA(wv, xv[j], acc[i][j]);
                    }
                }
            } else {
#pragma GCC unroll 4
                for (int64_t u = 0; u < 16; u += VW) {
                    VF xlo[MM_TT], xhi[MM_TT];
#pragma GCC unroll 8
                    for (int j = 0; j < TT; j++) {
                        xlo[j] = V_LOAD(xr[j] + k + u);
                        xhi[j] = V_LOAD(xr[j] + k + 16 + u);
                    }
#pragma GCC unroll 8
                    for (int i = 0; i < MM_RTQ; i++) {
                        VI c = V_LOAD_U8I(wrow[i] + k / 2 + u);
                        VF wlo = V_FMA(V_I2F(VI_AND15(c)), s[i], b[i]);
                        VF whi = V_FMA(V_I2F(VI_SRL4(c)), s[i], b[i]);
#pragma GCC unroll 8
                        for (int j = 0; j < TT; j++) {
                            acc[i][j] = V_FMA(wlo, xlo[j], acc[i][j]);
                            acc[i][j] = V_FMA(whi, xhi[j], acc[i][j]);
                        }
                    }
                }
            }
        }
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < TT; j++) mm->y[(int64_t)(t + j) * mm->out + r + i] = V_HSUM(acc[i][j]);
}


#define K_MM_LOOP(TILE, ARG, RT)                                                                  \
    for (int tb = 0; tb < mm->n; tb += MM_TB) {                                                   \
        int te = tb + MM_TB < mm->n ? tb + MM_TB : mm->n;                                         \
        for (int64_t r = r0; r < r1; r += RT) {                                                   \
            int64_t nr = r1 - r < RT ? r1 - r : RT;                                               \
            int t = tb;                                                                           \
            for (; t + MM_TT <= te; t += MM_TT) TILE(mm, r, nr, t, ARG, MM_TT, RT);               \
            for (; t < te; t++) TILE(mm, r, nr, t, ARG, 1, RT);                                   \
        }                                                                                         \
    }

static void K(matmul_bf16)(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    K(matmul_dense)(mm, r0, r1, DTYPE_BF16);
}
static void K(matmul_f16)(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    K(matmul_dense)(mm, r0, r1, DTYPE_F16);
}
static void K(matmul_f32)(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    K(matmul_dense)(mm, r0, r1, DTYPE_F32);
}
static void K(matmul_q4)(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    K_MM_LOOP(K(q_tile), 4, MM_RTQ)
}
static void K(matmul_q8)(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    K_MM_LOOP(K(q_tile), 8, MM_RTQ)
}

/* Any other layout (quant bits 2..8 other than the fast cases): dequantize one row with the
 * shared scalar dequantizer, then SIMD dots with every token. */
static void K(matmul_generic)(const struct cpu_mm *mm, int64_t r0, int64_t r1, float *row_buf)
{
    for (int64_t r = r0; r < r1; r++) {
        tensor_row_to_f32(mm->w, r, row_buf);
        for (int t = 0; t < mm->n; t++)
            mm->y[(int64_t)t * mm->out + r] = K(dot_f32)(row_buf, mm->x + (int64_t)t * mm->in, mm->in);
    }
}

static void K(matmul)(const struct cpu_mm *mm, int64_t r0, int64_t r1, float *row_buf)
{
    const struct tensor *w = mm->w;
    switch (w->dtype) {
    case DTYPE_BF16: K(matmul_bf16)(mm, r0, r1); return;
    case DTYPE_F16: K(matmul_f16)(mm, r0, r1); return;
    case DTYPE_F32: K(matmul_f32)(mm, r0, r1); return;
    case DTYPE_Q:
        if (mm->in % 32 == 0 && w->group_size % 32 == 0) {
            if (w->bits == 8) {
                K(matmul_q8)(mm, r0, r1);
                return;
            }
            if (w->bits == 4 && mm->xp) {
                K(matmul_q4)(mm, r0, r1);
                return;
            }
        }
        K(matmul_generic)(mm, r0, r1, row_buf);
        return;
    default: K(matmul_generic)(mm, r0, r1, row_buf); return;
    }
}

/* ---- row and element-wise ops ---- */

static void K(rmsnorm)(float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                       float w_offset)
{
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (int64_t)r * dim;
        float *yr = y + (int64_t)r * dim;
        float ss = K(dot_f32)(xr, xr, dim);
        float inv = (float)(1.0 / sqrt((double)ss / dim + eps));
        VF vinv = V_SET1(inv), voff = V_SET1(w_offset);
        int i = 0;
        if (w) {
            for (; i + VW <= dim; i += VW)
                V_STORE(yr + i, V_MUL(V_MUL(V_LOAD(xr + i), vinv), V_ADD(V_LOAD(w + i), voff)));
            for (; i < dim; i++) yr[i] = xr[i] * inv * (w[i] + w_offset);
        } else {
            for (; i + VW <= dim; i += VW) V_STORE(yr + i, V_MUL(V_LOAD(xr + i), vinv));
            for (; i < dim; i++) yr[i] = xr[i] * inv;
        }
    }
}

static void K(rope)(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim,
                    const int32_t *pos, const float *inv_freq)
{
    int half = rot_dim / 2;
    float cs[512], sn[512];
    CAIRN_ASSERT(half <= 512);
    for (int t = 0; t < n_tokens; t++) {
        for (int i = 0; i < half; i++) {
            double ang = (double)pos[t] * inv_freq[i];
            cs[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((int64_t)t * n_heads + h) * head_dim;
            int i = 0;
            for (; i + VW <= half; i += VW) {
                VF a = V_LOAD(v + i), b = V_LOAD(v + i + half), c = V_LOAD(cs + i), s = V_LOAD(sn + i);
                V_STORE(v + i, V_SUB(V_MUL(a, c), V_MUL(b, s)));
                V_STORE(v + i + half, V_ADD(V_MUL(b, c), V_MUL(a, s)));
            }
            for (; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}

static void K(silu_mul)(float *out, const float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    VF one = V_SET1(1.0f);
    for (; i + VW <= n; i += VW) {
        VF g = V_LOAD(gate + i);
        VF e = K(vexp)(V_SUB(V_ZERO(), g));
        V_STORE(out + i, V_MUL(V_DIV(g, V_ADD(one, e)), V_LOAD(up + i)));
    }
    for (; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static void K(add)(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V_STORE(y + i, V_ADD(V_LOAD(y + i), V_LOAD(x + i)));
    for (; i < n; i++) y[i] += x[i];
}

#include "cpu/x86_simd_attn.h"

/* ---- probes ---- */

static float K(probe_sum)(const float *x, int64_t n)
{
    VF a0 = V_ZERO(), a1 = V_ZERO(), a2 = V_ZERO(), a3 = V_ZERO();
    int64_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) {
        a0 = V_ADD(a0, V_LOAD(x + i));
        a1 = V_ADD(a1, V_LOAD(x + i + VW));
        a2 = V_ADD(a2, V_LOAD(x + i + 2 * VW));
        a3 = V_ADD(a3, V_LOAD(x + i + 3 * VW));
    }
    float s = V_HSUM(V_ADD(V_ADD(a0, a1), V_ADD(a2, a3)));
    for (; i < n; i++) s += x[i];
    return s;
}

static void K(probe_triad)(float *a, const float *b, const float *c, float s, int64_t n)
{
    VF vs = V_SET1(s);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) V_STORE(a + i, V_FMA(vs, V_LOAD(c + i), V_LOAD(b + i)));
    for (; i < n; i++) a[i] = b[i] + s * c[i];
}

static float K(probe_fma)(int64_t iters, int *lanes)
{
    VF acc[CPU_PROBE_FMA_CHAINS];
    VF m = V_SET1(0.999999f), add = V_SET1(1e-7f);
#pragma GCC unroll 16
    for (int c = 0; c < CPU_PROBE_FMA_CHAINS; c++) acc[c] = V_SET1((float)c);
    for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 16
        for (int c = 0; c < CPU_PROBE_FMA_CHAINS; c++) acc[c] = V_FMA(acc[c], m, add);
    }
    VF s = V_ZERO();
    for (int c = 0; c < CPU_PROBE_FMA_CHAINS; c++) s = V_ADD(s, acc[c]);
    *lanes = VW;
    return V_HSUM(s);
}

const struct cpu_kernels K(kernels) = {
    .probe_sum = K(probe_sum),
    .probe_triad = K(probe_triad),
    .probe_fma = K(probe_fma), /* declared in cpu_int.h */
    .matmul = K(matmul),
    .rmsnorm = K(rmsnorm),
    .rope = K(rope),
    .silu_mul = K(silu_mul),
    .add = K(add),
    .attn = K(attn),
    .attn_tile = K(attn_tile),
    .attn_split = K(attn_split),
    .attn_rows = ATT_ROWS,
    .attn_tile_auto = ATT_AUTO,
};
