/* AVX-512 (F/BW/VL/DQ) build of the SIMD kernels in x86_simd_ops.h: 16 f32 lanes, 8×3 dense
 * tiles (24 zmm accumulators of 32: 76% of FMA peak on bf16 prefill, 64% with 4×3), 4×3 MLX tiles. Compiled with the AVX-512 flags (CMakeLists.txt); only called
 * after cpu.c checked cpuid/xgetbv. */
#include <immintrin.h>
#include <math.h>

#define VW 16
#define VF __m512
#define VI __m512i
#define MM_RTD 8
#define MM_RTQ 4
#define MM_TT 3
#define K(name) cpu_avx512_##name

#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps((p), (v))
#define V_SET1(f) _mm512_set1_ps(f)
#define V_ZERO() _mm512_setzero_ps()
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_FNMADD(a, b, c) _mm512_fnmadd_ps((a), (b), (c))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_DIV(a, b) _mm512_div_ps((a), (b))
#define V_MIN(a, b) _mm512_min_ps((a), (b))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_ROUND(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2I(n)                                                                                \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define V_LOAD_BF16(p)                                                                            \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_U8I(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define V_I2F(v) _mm512_cvtepi32_ps(v)
#define VI_AND15(v) _mm512_and_si512((v), _mm512_set1_epi32(15))
#define VI_SRL4(v) _mm512_srli_epi32((v), 4)

#include "cpu/x86_simd_ops.h"

/* ---- AVX-512 VNNI q4/q8: integer dot products on int16 activations ----
 *
 * Per group of x: d = max|x| / 32767, xh = round(x / d), xl = round((x - xh·d) · 65536 / d),
 * so x = d·(xh + xl / 65536) to ~2e-10 of the group's max (two int16 "digits"). Then
 *   Σ (scale·code + bias)·x = scale·d·(Σ code·xh + Σ code·xl / 65536) + bias·Σx.
 * Codes are widened to int16 (vpmovzxbw) and multiplied pairwise by vpdpwssd into int32 lanes
 * (no overflow: code < 256, |xh|,|xl| <= 32767, at most gs/16 products per lane). 64 codes per
 * step for q4 (32 bytes: low nibbles pair with the 32 even inputs of the chunk, high nibbles
 * with the 32 odd ones), 32 for q8. About half the instructions per weight of the f32
 * dequantize-and-FMA tile, which matters because q4/q8 decode is instruction-bound before it
 * is bandwidth-bound on a small or busy machine. Needs group_size % 64 == 0, in % 64 == 0. */
#define Q16_RT 4

int cpu_avx512_q16_ok(const struct tensor *w)
{
    return w->dtype == DTYPE_Q && (w->bits == 4 || w->bits == 8) && w->group_size % 64 == 0 &&
           w->shape[1] % 64 == 0;
}

void cpu_avx512_q16_prep(struct cpu_mm *mm, int t0, int t1)
{
    const int64_t in = mm->in, gs = mm->w->group_size, groups = in / gs;
    int16_t *xqh = (int16_t *)mm->xq, *xql = xqh + (int64_t)mm->n * in;
    float *xd = (float *)mm->xd, *xs = (float *)mm->xsum;
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int t = t0; t < t1; t++) {
        const float *x = mm->x + (int64_t)t * in;
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = x + g * gs;
            __m512 mx = _mm512_setzero_ps(), sm = _mm512_setzero_ps();
            for (int64_t i = 0; i < gs; i += 16) {
                __m512 v = _mm512_loadu_ps(xg + i);
                mx = _mm512_max_ps(mx, _mm512_andnot_ps(sign, v));
                sm = _mm512_add_ps(sm, v);
            }
            float amax = _mm512_reduce_max_ps(mx);
            float d = amax / 32767.0f, inv = amax > 0 ? 32767.0f / amax : 0.0f;
            xd[(int64_t)t * groups + g] = d;
            xs[(int64_t)t * groups + g] = _mm512_reduce_add_ps(sm);
            int16_t *qh = xqh + (int64_t)t * in + g * gs, *ql = xql + (int64_t)t * in + g * gs;
            for (int64_t i = 0; i < gs; i++) {
                /* q4: each 64-chunk holds its 32 even inputs, then its 32 odd ones. */
                int64_t src = mm->w->bits == 8 ? i : (i & ~63) + ((i & 63) < 32 ? 2 * (i & 31) : 2 * (i & 31) + 1);
                float v = xg[src];
                float h = rintf(v * inv);
                float l = rintf((v - h * d) * inv * 65536.0f);
                qh[i] = (int16_t)h;
                ql[i] = (int16_t)(l > 32767.0f ? 32767.0f : l < -32767.0f ? -32767.0f : l);
            }
        }
    }
}

/* Per-group scalars are handled 16 groups at a time in vectors: the row's scales times the
 * activations' digit scales (one lane per group, broadcast with a permute where the group's
 * integer sums are folded in), and Σ bias·Σx as a vector dot product. That keeps the work per
 * group and row to two conversions, a permute and two FMAs, instead of a dozen scalar ops:
 * with 64-weight groups that overhead was as large as the dot products themselves. The bias
 * sums live in memory (bsum) so the loop over groups keeps everything else in registers. */
CPU_AI void cpu_avx512_q16_row4(const struct cpu_mm *mm, int64_t r, int64_t nr, int t, const int bits,
                                const int gs_const)
{
    const struct tensor *w = mm->w;
    /* gs_const: the group size as a compile-time constant (64, MLX's default) so the loop over
     * a group's inputs unrolls; 0 for any other size. */
    const int64_t in = mm->in, gs = gs_const ? gs_const : w->group_size, groups = in / gs;
    const int64_t row_bytes = in * bits / 8, gbytes = gs * bits / 8, pf_ahead = cpu_prefetch_ahead(Q16_RT * row_bytes);
    const uint8_t *wrow[Q16_RT];
    const uint16_t *sc[Q16_RT], *bi[Q16_RT];
    const int16_t *xh = mm->xq + (int64_t)t * in, *xl = mm->xq + ((int64_t)mm->n + t) * in;
    const float *xd = mm->xd + (int64_t)t * groups, *xs = mm->xsum + (int64_t)t * groups;
    __m512 acc[Q16_RT];
    float bsum[Q16_RT];
#pragma GCC unroll 8
    for (int i = 0; i < Q16_RT; i++) {
        int64_t ri = r + (i < nr ? i : nr - 1);
        wrow[i] = (const uint8_t *)w->data + ri * row_bytes;
        sc[i] = w->scales + ri * groups;
        bi[i] = w->biases + ri * groups;
        acc[i] = _mm512_setzero_ps();
        bsum[i] = 0;
    }
    const __m512i m15 = _mm512_set1_epi16(15);
    const __m512 lo_scale = _mm512_set1_ps(1.0f / 65536.0f);
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
        const int ng = groups - g0 < 16 ? (int)(groups - g0) : 16;
        const __mmask16 gm = (__mmask16)((1u << ng) - 1);
        const __m512 dv = _mm512_maskz_loadu_ps(gm, xd + g0), sv = _mm512_maskz_loadu_ps(gm, xs + g0);
        __m512 sd[Q16_RT];
#pragma GCC unroll 8
        for (int i = 0; i < Q16_RT; i++) {
            /* the next tile's scales and biases (4 KiB pages stop the hardware prefetcher) */
            _mm_prefetch((const char *)(sc[i] + g0 + pf_ahead / row_bytes * groups), _MM_HINT_T0);
            _mm_prefetch((const char *)(bi[i] + g0 + pf_ahead / row_bytes * groups), _MM_HINT_T0);
            __m512 scv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(gm, sc[i] + g0)), 16));
            __m512 biv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(gm, bi[i] + g0)), 16));
            sd[i] = _mm512_mul_ps(scv, dv);
            bsum[i] += _mm512_reduce_add_ps(_mm512_mul_ps(biv, sv));
        }
        for (int gi = 0; gi < ng; gi++) {
            const int64_t g = g0 + gi;
            __m512i ih[Q16_RT], il[Q16_RT];
#pragma GCC unroll 8
            for (int i = 0; i < Q16_RT; i++) {
                for (int64_t off = 0; off < gbytes; off += 64)
                    _mm_prefetch((const char *)wrow[i] + g * gbytes + off + pf_ahead, _MM_HINT_T0);
                ih[i] = _mm512_setzero_si512();
                il[i] = _mm512_setzero_si512();
            }
            for (int64_t k = g * gs; k < (g + 1) * gs; k += (bits == 4 ? 64 : 32)) {
                if (bits == 8) {
                    __m512i vh = _mm512_loadu_si512(xh + k), vl = _mm512_loadu_si512(xl + k);
#pragma GCC unroll 8
                    for (int i = 0; i < Q16_RT; i++) {
                        __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(wrow[i] + k)));
                        ih[i] = _mm512_dpwssd_epi32(ih[i], c, vh);
                        il[i] = _mm512_dpwssd_epi32(il[i], c, vl);
                    }
                } else {
                    __m512i vh0 = _mm512_loadu_si512(xh + k), vh1 = _mm512_loadu_si512(xh + k + 32);
                    __m512i vl0 = _mm512_loadu_si512(xl + k), vl1 = _mm512_loadu_si512(xl + k + 32);
#pragma GCC unroll 8
                    for (int i = 0; i < Q16_RT; i++) {
                        __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(wrow[i] + k / 2)));
                        __m512i lo = _mm512_and_si512(c, m15), hi = _mm512_srli_epi16(c, 4);
                        ih[i] = _mm512_dpwssd_epi32(ih[i], lo, vh0);
                        ih[i] = _mm512_dpwssd_epi32(ih[i], hi, vh1);
                        il[i] = _mm512_dpwssd_epi32(il[i], lo, vl0);
                        il[i] = _mm512_dpwssd_epi32(il[i], hi, vl1);
                    }
                }
            }
            const __m512i lane = _mm512_set1_epi32(gi);
#pragma GCC unroll 8
            for (int i = 0; i < Q16_RT; i++) {
                __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(il[i]), lo_scale, _mm512_cvtepi32_ps(ih[i]));
                acc[i] = _mm512_fmadd_ps(v, _mm512_permutexvar_ps(lane, sd[i]), acc[i]);
            }
        }
    }
    for (int i = 0; i < nr; i++) mm->y[(int64_t)t * mm->out + r + i] = _mm512_reduce_add_ps(acc[i]) + bsum[i];
}

#define Q16_LOOP(BITS, GS)                                                                         \
    for (int tb = 0; tb < mm->n; tb += MM_TB) {                                                    \
        int te = tb + MM_TB < mm->n ? tb + MM_TB : mm->n;                                          \
        for (int64_t r = r0; r < r1; r += Q16_RT) {                                                \
            int64_t nr = r1 - r < Q16_RT ? r1 - r : Q16_RT;                                        \
            for (int t = tb; t < te; t++) cpu_avx512_q16_row4(mm, r, nr, t, BITS, GS);             \
        }                                                                                          \
    }

static void cpu_avx512_q16_matmul4(const struct cpu_mm *mm, int64_t r0, int64_t r1) { Q16_LOOP(4, 0) }
static void cpu_avx512_q16_matmul8(const struct cpu_mm *mm, int64_t r0, int64_t r1) { Q16_LOOP(8, 0) }
static void cpu_avx512_q16_matmul4_g64(const struct cpu_mm *mm, int64_t r0, int64_t r1) { Q16_LOOP(4, 64) }
static void cpu_avx512_q16_matmul8_g64(const struct cpu_mm *mm, int64_t r0, int64_t r1) { Q16_LOOP(8, 64) }

void cpu_avx512_q16_matmul(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    const int g64 = mm->w->group_size == 64;
    if (mm->w->bits == 4) (g64 ? cpu_avx512_q16_matmul4_g64 : cpu_avx512_q16_matmul4)(mm, r0, r1);
    else (g64 ? cpu_avx512_q16_matmul8_g64 : cpu_avx512_q16_matmul8)(mm, r0, r1);
}
