/* AVX-VNNI (the 256-bit VEX form, on CPUs with AVX2 but no AVX-512, such as Intel's client
 * cores since Alder Lake) build of the packed q4/q8 matmul of x86_avx512_vnni.c: same packed
 * weights (cpu_pack.c), same three int8 digits per activation (or the first alone, CAIRN_CPU_QACT=fast), same accuracy. A 16-row block
 * is two vectors of 8 rows, and with 16 ymm registers a tile is one token (6 integer and 2 f32
 * accumulators, 4 weight vectors, 2 broadcasts). Compiled with the AVX2 flags plus -mavxvnni
 * (CMakeLists.txt); only called after cpu.c found AVX-VNNI. */
#include <immintrin.h>

#include "cpu/cpu_int.h"

static inline float avx2_vnni_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float avx2_vnni_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The activations of both VNNI kernels (cpu_int.h), 8 inputs (one step) at a time: per group
 * d = max|x|/127, then each digit takes the rounded part of x/d and the rest is scaled by the
 * radix for the next. Within a step's 8 bytes the inputs are in the order the kernels pair
 * them with codes (q4: x0 x2 x4 x6 x1 x3 x5 x7, the low then the high nibbles of a lane).
 * Only AVX2 instructions, so the AVX-512 path calls it too. */
void cpu_vnni_prep(struct cpu_mm *mm, int t0, int t1)
{
    const int64_t in = mm->in, gs = mm->w->group_size, groups = in / gs;
    const int q4 = mm->w->bits == 4;
    int8_t *xq = (int8_t *)mm->xq;
    float *xd = (float *)mm->xd, *xs = (float *)mm->xsum;
    const __m256 sign = _mm256_set1_ps(-0.0f), radix = _mm256_set1_ps(CPU_VNNI_RADIX);
    const __m128i order = q4 ? _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                             : _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int t = t0; t < t1; t++) {
        const float *x = mm->x + (int64_t)t * in;
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = x + g * gs;
            __m256 mx = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
            for (int64_t i = 0; i < gs; i += 8) {
                __m256 v = _mm256_loadu_ps(xg + i);
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
                sm = _mm256_add_ps(sm, v);
            }
            float amax = avx2_vnni_hmax(mx);
            xd[(int64_t)t * groups + g] = amax / 127.0f;
            xs[(int64_t)t * groups + g] = avx2_vnni_hsum(sm);
            const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
            int8_t *q = xq + (int64_t)t * CPU_VNNI_DIGITS * in + g * gs / 8 * CPU_VNNI_STEP_BYTES;
            for (int64_t i = 0; i < gs; i += 8, q += CPU_VNNI_STEP_BYTES) {
                __m256 u = _mm256_mul_ps(_mm256_loadu_ps(xg + i), inv);
                for (int k = 0; k < CPU_VNNI_DIGITS; k++) {
                    __m256 dk = _mm256_round_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    __m256i d32 = _mm256_cvtps_epi32(dk);
                    __m128i d16 = _mm_packs_epi32(_mm256_castsi256_si128(d32), _mm256_extracti128_si256(d32, 1));
                    _mm_storel_epi64((__m128i *)(q + 8 * k), _mm_shuffle_epi8(_mm_packs_epi16(d16, d16), order));
                    u = _mm256_mul_ps(_mm256_sub_ps(u, dk), radix);
                }
            }
        }
    }
}

/* acc += Σ4 u8(w)·s8(x) per lane, VEX-encoded ({vex}: the assembler would otherwise pick the
 * AVX-512 form, which these CPUs lack); in place, as in x86_avx512_vnni.c. */
#define AVX2_DPBUSD(acc, w, x) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x))

static inline __m256 avx2_vnni_bf16x8(const uint8_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static inline __m256i avx2_vnni_bcast4(const int8_t *p)
{
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Block blk × token t. */
static inline __attribute__((always_inline)) void avx2_vnni_tile(const struct cpu_mm *mm, int64_t blk, int t,
                                                                const int bits, const int D)
{
    const int64_t in = mm->in, gs = mm->w->group_size, groups = in / gs;
    const int64_t gcode = (int64_t)CPU_VNNI_ROWS * gs * bits / 8, gbytes = gcode + 4 * CPU_VNNI_ROWS;
    const int64_t step_bytes = 8 * CPU_VNNI_ROWS * bits / 8, pf_ahead = cpu_prefetch_ahead(gbytes);
    const uint8_t *wp = (const uint8_t *)mm->w->be_data + blk * groups * gbytes;
    const int8_t *xq = (const int8_t *)mm->xq + (int64_t)t * CPU_VNNI_DIGITS * in;
    const __m256i m15 = _mm256_set1_epi8(15);
    const __m256 r1 = _mm256_set1_ps(1.0f / CPU_VNNI_RADIX), r2 = _mm256_set1_ps(1.0f / (CPU_VNNI_RADIX * CPU_VNNI_RADIX));
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(); /* rows 0-7, 8-15 */
    for (int64_t g = 0; g < groups; g++, wp += gbytes) {
        __m256i ia[CPU_VNNI_DIGITS][2];
        for (int64_t off = 0; off < gbytes; off += 64) _mm_prefetch((const char *)wp + off + pf_ahead, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int k = 0; k < D; k++) ia[k][0] = ia[k][1] = _mm256_setzero_si256();
        for (int64_t s = 0; s < gs / 8; s++) {
            const uint8_t *p = wp + s * step_bytes;
            __m256i wl0, wl1, wh0, wh1; /* q4: even / odd inputs; q8: inputs 0-3 / 4-7 */
            if (bits == 4) {
                __m256i v0 = _mm256_loadu_si256((const __m256i *)p), v1 = _mm256_loadu_si256((const __m256i *)(p + 32));
                wl0 = _mm256_and_si256(v0, m15);
                wh0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m15);
                wl1 = _mm256_and_si256(v1, m15);
                wh1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m15);
            } else {
                wl0 = _mm256_loadu_si256((const __m256i *)p);
                wl1 = _mm256_loadu_si256((const __m256i *)(p + 32));
                wh0 = _mm256_loadu_si256((const __m256i *)(p + 64));
                wh1 = _mm256_loadu_si256((const __m256i *)(p + 96));
            }
#pragma GCC unroll 4
            for (int k = 0; k < D; k++) {
                const int8_t *xp = xq + (g * gs / 8 + s) * CPU_VNNI_STEP_BYTES + 8 * k;
                const __m256i xa = avx2_vnni_bcast4(xp), xb = avx2_vnni_bcast4(xp + 4);
                AVX2_DPBUSD(ia[k][0], wl0, xa);
                AVX2_DPBUSD(ia[k][1], wl1, xa);
                AVX2_DPBUSD(ia[k][0], wh0, xb);
                AVX2_DPBUSD(ia[k][1], wh1, xb);
            }
        }
        const __m256 d = _mm256_set1_ps(mm->xd[(int64_t)t * groups + g]);
        const __m256 sum = _mm256_set1_ps(mm->xsum[(int64_t)t * groups + g]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 dot = _mm256_cvtepi32_ps(ia[0][h]);
            if (D == 3) {
                dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[2][h]), r2, dot);
                dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[1][h]), r1, dot);
            }
            const __m256 sc = avx2_vnni_bf16x8(wp + gcode + 16 * h), bi = avx2_vnni_bf16x8(wp + gcode + 32 + 16 * h);
            __m256 *acc = h ? &acc1 : &acc0;
            *acc = _mm256_fmadd_ps(dot, _mm256_mul_ps(sc, d), *acc);
            *acc = _mm256_fmadd_ps(bi, sum, *acc);
        }
    }
    const int64_t row0 = blk * CPU_VNNI_ROWS, left = mm->out - row0;
    float *y = mm->y + (int64_t)t * mm->out + row0;
    if (left >= 16) {
        _mm256_storeu_ps(y, acc0);
        _mm256_storeu_ps(y + 8, acc1);
    } else {
        float tmp[16];
        _mm256_storeu_ps(tmp, acc0);
        _mm256_storeu_ps(tmp + 8, acc1);
        for (int64_t i = 0; i < left; i++) y[i] = tmp[i];
    }
}

static void avx2_vnni_tile_q4(const struct cpu_mm *mm, int64_t blk, int t) { avx2_vnni_tile(mm, blk, t, 4, 3); }
static void avx2_vnni_tile_q8(const struct cpu_mm *mm, int64_t blk, int t) { avx2_vnni_tile(mm, blk, t, 8, 3); }
/* CAIRN_CPU_QACT=fast: the first digit alone (cpu_vnni_digits) */
static void avx2_vnni_tile_q4_d1(const struct cpu_mm *mm, int64_t blk, int t) { avx2_vnni_tile(mm, blk, t, 4, 1); }
static void avx2_vnni_tile_q8_d1(const struct cpu_mm *mm, int64_t blk, int t) { avx2_vnni_tile(mm, blk, t, 8, 1); }

/* Rows [r0, r1) (r0 a multiple of 16) of every token; a block's weights stay in L1/L2 while
 * the tokens of a 64-token block pass over them. */
void cpu_avx2_vnni_matmul(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    void (*tile)(const struct cpu_mm *, int64_t, int) =
        mm->digits == 1 ? (mm->w->bits == 4 ? avx2_vnni_tile_q4_d1 : avx2_vnni_tile_q8_d1)
                        : (mm->w->bits == 4 ? avx2_vnni_tile_q4 : avx2_vnni_tile_q8);
    const int64_t b0 = r0 / CPU_VNNI_ROWS, b1 = (r1 + CPU_VNNI_ROWS - 1) / CPU_VNNI_ROWS;
    enum { TB = 64 };
    for (int tb = 0; tb < mm->n; tb += TB) {
        const int te = tb + TB < mm->n ? tb + TB : mm->n;
        for (int64_t b = b0; b < b1; b++)
            for (int t = tb; t < te; t++) tile(mm, b, t);
    }
}
