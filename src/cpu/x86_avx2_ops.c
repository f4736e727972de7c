/* AVX2 + FMA + F16C build of the SIMD kernels in x86_simd_ops.h: 8 f32 lanes, 4×2 tiles
 * (8 ymm accumulators of 16). Compiled with the AVX2 flags (CMakeLists.txt); only called after
 * cpu.c checked cpuid/xgetbv. */
#include <immintrin.h>

#define VW 8
#define VF __m256
#define VI __m256i
#define MM_RTD 4
#define MM_RTQ 4
#define MM_TT 2
/* Tiled attention (x86_simd_attn.h): 32 query rows per item (16 ran ~10% slower: more K/V
 * widening per FMA), S tiles of 3 positions × 4 vectors and O tiles of 4 rows × 2 vectors
 * (12 and 8 of 16 ymm). */
#define ATT_ROWS 32
#define ATT_AUTO 1 /* tested on AVX2 machines: auto takes it */
#define ATT_ST_PT 3
#define ATT_ST_RV 4
#define ATT_O_RT 4
#define ATT_O_NV 2
#define K(name) cpu_avx2_##name

static inline float cpu_avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps((p), (v))
#define V_SET1(f) _mm256_set1_ps(f)
#define V_ZERO() _mm256_setzero_ps()
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_FNMADD(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_DIV(a, b) _mm256_div_ps((a), (b))
#define V_MIN(a, b) _mm256_min_ps((a), (b))
#define V_MAX(a, b) _mm256_max_ps((a), (b))
#define V_HSUM(v) cpu_avx2_hsum(v)
#define V_ROUND(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2I(n)                                                                                \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define V_LOAD_BF16(p)                                                                            \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
/* 2·VW bf16 at p widened by halves, without a cross-lane shuffle: e the even elements (shift),
 * o the odd ones (mask) */
#define V_LOAD_BF16_EO(p, e, o)                                                                   \
    do {                                                                                          \
        __m256i x_ = _mm256_loadu_si256((const __m256i *)(p));                                    \
        (e) = _mm256_castsi256_ps(_mm256_slli_epi32(x_, 16));                                     \
        (o) = _mm256_castsi256_ps(_mm256_and_si256(x_, _mm256_set1_epi32((int)0xffff0000u)));    \
    } while (0)
#define V_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_LOAD_U8I(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define V_I2F(v) _mm256_cvtepi32_ps(v)
#define VI_AND15(v) _mm256_and_si256((v), _mm256_set1_epi32(15))
#define VI_SRL4(v) _mm256_srli_epi32((v), 4)

#include "cpu/x86_simd_ops.h"
