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
/* Tiled attention (x86_simd_attn.h): 32 query rows per item (2 zmm of lanes), S tiles of 12
 * positions × 2 vectors and O tiles of 4 rows × 4 vectors (24 and 16 of 32 zmm). */
#define ATT_ROWS 32
/* auto takes it: test_cpu_ops and cpu_isa_oracle.sh (CAIRN_CPU_ATTN=tiled) pass on an AVX-512 CPU
 * (Zen 5), where Qwen3-0.6B bf16 pp4096 ran 2.3x faster than rowwise (README, CPU prefill). */
#define ATT_AUTO 1
#define ATT_ST_PT 12
#define ATT_ST_RV 2
#define ATT_O_RT 4
#define ATT_O_NV 4
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
/* 2·VW bf16 at p widened by halves, without a cross-lane shuffle: e the even elements (shift),
 * o the odd ones (mask) */
#define V_LOAD_BF16_EO(p, e, o)                                                                   \
    do {                                                                                          \
        __m512i x_ = _mm512_loadu_si512((const void *)(p));                                       \
        (e) = _mm512_castsi512_ps(_mm512_slli_epi32(x_, 16));                                     \
        (o) = _mm512_castsi512_ps(_mm512_and_si512(x_, _mm512_set1_epi32((int)0xffff0000u)));    \
    } while (0)
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_U8I(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define V_I2F(v) _mm512_cvtepi32_ps(v)
#define VI_AND15(v) _mm512_and_si512((v), _mm512_set1_epi32(15))
#define VI_SRL4(v) _mm512_srli_epi32((v), 4)

#include "cpu/x86_simd_ops.h"
