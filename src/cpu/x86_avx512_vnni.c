/* AVX-512 VNNI q4/q8 matmul on packed weights (cpu_pack.c has the layout): integer dot products
 * with vpdpbusd, 16 rows per vector. Compiled with the AVX-512 flags (CMakeLists.txt); only
 * called after cpu.c checked cpuid/xgetbv for VNNI.
 *
 * Activations: per (token, group) d = max|x| / 127 and three signed 8-bit digits per input,
 *   x = d·(x0 + x1/254 + x2/254²),  |error| <= d / (2·254²)  (about 2^-24 of the group's max),
 * each digit rounded from what the previous ones left. The f32 sum of each group is kept for
 * the biases:  Σ (scale·code + bias)·x = scale·d·Σ code·(x0 + x1/254 + x2/254²) + bias·Σx.
 * That is as close to the f32 result as the f32 tiles are (tests/unit/test_cpu_ops.c and the
 * oracle logits under tests/integration/cpu_isa_oracle.sh hold it to the same tolerances). One
 * int16 digit per input (vpdpwssd) was measured first: 2^-16 of the group's max put the oracle
 * logits 1.5-35e-3 off, at or past their 2e-3 tolerance. Precision per instruction is the same
 * for both (64 8-bit or 32 16-bit products), so three 8-bit digits cost 1.5× one 16-bit digit
 * where two 16-bit digits would cost 2×. CAIRN_CPU_QACT=fast (opt-in, cpu_vnni_digits) multiplies
 * the first digit alone, x ≈ d·x0 with |error| <= d/2, as llama.cpp's Q8 activations do: a
 * third of the vpdpbusd and broadcasts, at about 2^-8 of the group's max per input (its oracle
 * error is in the README).
 *
 * Kernel: a tile is one block of 16 rows × T tokens (decode and short calls), or from 8 tokens
 * a pair of blocks × up to 3 tokens. Each 8 inputs of a group are one 64-byte vector per block
 * (q4; 16 lanes = rows, 4 code bytes each) that a mask and a shift split into the even and odd
 * inputs, and vpdpbusd multiplies each by the token's broadcast digits: 64 multiply-adds per
 * instruction, two instructions per cycle on Zen 5, against 16 for an f32 FMA after a
 * dequantize. Integer sums are folded into f32 once per group. In a pair each broadcast feeds
 * both blocks: one load per two vpdpbusd instead of one per vpdpbusd (`cairn bench --matmul
 * OUTxIN --dtype q4 -n 512 -t 1`, CPU time per call on the 2-core Zen 5 VM under load, best of
 * 3 alternating runs: 2048x8192 79.8 -> 71.7 ms, 6144x1024 28.4 -> 27.6, 8192x2048 73.7 ->
 * 73.2). What is left per group (3 conversions and 5 FMAs per token and block against 48
 * vpdpbusd) keeps a tile near 82% of two vpdpbusd a cycle. Rows of a tile do not depend on the
 * tile shape: results are the same bit for bit whichever tiles or chunks a row falls in. */
#include <immintrin.h>

#include "cpu/cpu_int.h"

#define VNNI_TMAX 7 /* tokens per tile */

/* acc += Σ4 u8(w)·s8(x) per lane (vpdpbusd), in place: through the intrinsic GCC 12 copies
 * every accumulator around each instruction (a third more instructions per tile). */
#define VNNI_DPBUSD(acc, w, x) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x))

/* The bf16 values of 16 rows as f32. */
static inline __m512 vnni_bf16x16(const uint8_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m512i vnni_bcast4(const int8_t *p)
{
    int32_t v;
    __builtin_memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* NB blocks of 16 rows (blk, blk + 1, ...) × tokens [t0, t0 + T); T, NB and bits are
 * compile-time constants in each instantiation below so that the accumulators live in
 * registers: per (token, block) one integer chain per digit (two for a lone token, decode: its
 * even and odd halves, so that enough vpdpbusd are independent to cover their latency) and one
 * f32 sum. Two blocks let each broadcast activation feed two vpdpbusd, which halves the loads
 * per multiply (two loads a cycle feed two vpdpbusd a cycle only if most of them are not
 * broadcasts). One block at a time for decode: with one weight stream per thread the hardware
 * prefetcher keeps decode at the memory's speed, where four interleaved block streams ran q4
 * decode of a 150K×1K matrix 30% slower. */
static inline __attribute__((always_inline)) void
vnni_tile(const struct cpu_mm *mm, int64_t blk, int t0, const int T, const int NB, const int bits, const int D)
{
    const int64_t in = mm->in, gs = mm->w->group_size, groups = in / gs;
    const int64_t gcode = (int64_t)CPU_VNNI_ROWS * gs * bits / 8, gbytes = gcode + 4 * CPU_VNNI_ROWS;
    const int64_t step_bytes = 8 * CPU_VNNI_ROWS * bits / 8, pf_ahead = cpu_prefetch_ahead(gbytes);
    const uint8_t *wp[2];
    const int8_t *xq[VNNI_TMAX];
    __m512 acc[VNNI_TMAX][2];
#pragma GCC unroll 2
    for (int b = 0; b < NB; b++) wp[b] = (const uint8_t *)mm->w->be_data + (blk + b) * groups * gbytes;
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        xq[t] = (const int8_t *)mm->xq + (int64_t)(t0 + t) * CPU_VNNI_DIGITS * in;
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++) acc[t][b] = _mm512_setzero_ps();
    }
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512 r1 = _mm512_set1_ps(1.0f / CPU_VNNI_RADIX), r2 = _mm512_set1_ps(1.0f / (CPU_VNNI_RADIX * CPU_VNNI_RADIX));
    for (int64_t g = 0; g < groups; g++) {
        __m512i ia[VNNI_TMAX][CPU_VNNI_DIGITS][2], ib[VNNI_TMAX][CPU_VNNI_DIGITS];
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++)
            for (int64_t off = 0; off < gbytes; off += 64) _mm_prefetch((const char *)wp[b] + off + pf_ahead, _MM_HINT_T0);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
#pragma GCC unroll 4
            for (int k = 0; k < D; k++) {
                ib[t][k] = _mm512_setzero_si512();
#pragma GCC unroll 2
                for (int b = 0; b < NB; b++) ia[t][k][b] = _mm512_setzero_si512();
            }
        for (int64_t s = 0; s < gs / 8; s++) {
            /* q4: the 4 even / 4 odd inputs of the 8 per lane; q8: inputs 0-3 / 4-7 */
            __m512i wl[2], wh[2];
#pragma GCC unroll 2
            for (int b = 0; b < NB; b++) {
                if (bits == 4) {
                    __m512i v = _mm512_loadu_si512(wp[b] + s * step_bytes);
                    wl[b] = _mm512_and_si512(v, m15);
                    wh[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
                } else {
                    wl[b] = _mm512_loadu_si512(wp[b] + s * step_bytes);
                    wh[b] = _mm512_loadu_si512(wp[b] + s * step_bytes + 64);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
#pragma GCC unroll 4
                for (int k = 0; k < D; k++) {
                    const int8_t *xp = xq[t] + (g * gs / 8 + s) * CPU_VNNI_STEP_BYTES + 8 * k;
                    const __m512i xl = vnni_bcast4(xp), xh = vnni_bcast4(xp + 4);
#pragma GCC unroll 2
                    for (int b = 0; b < NB; b++) {
                        VNNI_DPBUSD(ia[t][k][b], wl[b], xl);
                        if (T == 1 && NB == 1) VNNI_DPBUSD(ib[t][k], wh[b], xh);
                        else VNNI_DPBUSD(ia[t][k][b], wh[b], xh);
                    }
                }
        }
#pragma GCC unroll 2
        for (int b = 0; b < NB; b++) {
            const __m512 sc = vnni_bf16x16(wp[b] + gcode), bi = vnni_bf16x16(wp[b] + gcode + 2 * CPU_VNNI_ROWS);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int64_t tg = (int64_t)(t0 + t) * groups + g;
                if (T == 1 && NB == 1)
#pragma GCC unroll 4
                    for (int k = 0; k < D; k++) ia[t][k][b] = _mm512_add_epi32(ia[t][k][b], ib[t][k]);
                __m512 dot = _mm512_cvtepi32_ps(ia[t][0][b]);
                if (D == 3) {
                    dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][2][b]), r2, dot);
                    dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][1][b]), r1, dot);
                }
                acc[t][b] = _mm512_fmadd_ps(dot, _mm512_mul_ps(sc, _mm512_set1_ps(mm->xd[tg])), acc[t][b]);
                acc[t][b] = _mm512_fmadd_ps(bi, _mm512_set1_ps(mm->xsum[tg]), acc[t][b]);
            }
            wp[b] += gbytes;
        }
    }
#pragma GCC unroll 2
    for (int b = 0; b < NB; b++) {
        const int64_t row0 = (blk + b) * CPU_VNNI_ROWS, left = mm->out - row0;
        const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(mm->y + (int64_t)(t0 + t) * mm->out + row0, m, acc[t][b]);
    }
}

typedef void (*vnni_tile_fn)(const struct cpu_mm *mm, int64_t blk, int t0);

#define VNNI_TILE(T, NB, B, D)                                                                     \
    static void vnni_tile_##T##x##NB##_q##B##_d##D(const struct cpu_mm *mm, int64_t blk, int t0) \
    {                                                                                              \
        vnni_tile(mm, blk, t0, T, NB, B, D);                                                       \
    }
#define VNNI_TILES(B, D)                                                                           \
    VNNI_TILE(1, 1, B, D) VNNI_TILE(2, 1, B, D) VNNI_TILE(3, 1, B, D) VNNI_TILE(4, 1, B, D)        \
    VNNI_TILE(5, 1, B, D) VNNI_TILE(6, 1, B, D) VNNI_TILE(7, 1, B, D) VNNI_TILE(1, 2, B, D)        \
    VNNI_TILE(2, 2, B, D) VNNI_TILE(3, 2, B, D)
VNNI_TILES(4, 3)
VNNI_TILES(8, 3)
VNNI_TILES(4, 1)
VNNI_TILES(8, 1)

#define VNNI_ROW(B, D)                                                                             \
    {vnni_tile_1x1_q##B##_d##D, vnni_tile_2x1_q##B##_d##D, vnni_tile_3x1_q##B##_d##D,             \
     vnni_tile_4x1_q##B##_d##D, vnni_tile_5x1_q##B##_d##D, vnni_tile_6x1_q##B##_d##D,             \
     vnni_tile_7x1_q##B##_d##D}
#define VNNI_ROW2(B, D) {vnni_tile_1x2_q##B##_d##D, vnni_tile_2x2_q##B##_d##D, vnni_tile_3x2_q##B##_d##D}

/* [3 digits / 1 digit][bits 4/8][T - 1]: T <= 7 keeps 3·T integer and T f32 accumulators, the
 * weights and a broadcast in 32 zmm (7 ran 4% faster than 6). */
static const vnni_tile_fn vnni_tiles[2][2][VNNI_TMAX] = {
    {VNNI_ROW(4, 3), VNNI_ROW(8, 3)},
    {VNNI_ROW(4, 1), VNNI_ROW(8, 1)},
};
/* Two blocks at once, [digits][bits 4/8][T - 1], T <= 3: 18 integer and 6 f32 accumulators, 4
 * weight vectors, the mask and a broadcast in 32 zmm. */
#define VNNI_TMAX2 3
/* tokens from which a call takes the block pairs: fewer tokens are memory-bound like decode,
 * where one weight stream per thread is what the prefetcher keeps at speed */
#define VNNI_PAIR_MIN_N 8
static const vnni_tile_fn vnni_tiles2[2][2][VNNI_TMAX2] = {
    {VNNI_ROW2(4, 3), VNNI_ROW2(8, 3)},
    {VNNI_ROW2(4, 1), VNNI_ROW2(8, 1)},
};

/* Rows [r0, r1) (r0 a multiple of 16) of every token. Tokens go in blocks of ~64 so that a row
 * block's weights stay in L1 or L2 while the block's token tiles pass over them. */
void cpu_avx512_vnni_matmul(const struct cpu_mm *mm, int64_t r0, int64_t r1)
{
    const int bi = mm->w->bits == 4 ? 0 : 1, di = mm->digits == 1 ? 1 : 0;
    const int64_t b0 = r0 / CPU_VNNI_ROWS, b1 = (r1 + CPU_VNNI_ROWS - 1) / CPU_VNNI_ROWS;
    if (mm->n >= VNNI_PAIR_MIN_N) {
        /* Prefill: pairs of blocks in tiles of 3 tokens (and a last odd block in tiles of 7) */
        enum { TB = 21 * VNNI_TMAX2 }; /* whole tiles */
        for (int tb = 0; tb < mm->n; tb += TB) {
            const int te = tb + TB < mm->n ? tb + TB : mm->n;
            int64_t b = b0;
            for (; b + 2 <= b1; b += 2)
                for (int t = tb; t < te; t += VNNI_TMAX2) vnni_tiles2[di][bi][(te - t < VNNI_TMAX2 ? te - t : VNNI_TMAX2) - 1](mm, b, t);
            for (; b < b1; b++)
                for (int t = tb; t < te; t += VNNI_TMAX) vnni_tiles[di][bi][(te - t < VNNI_TMAX ? te - t : VNNI_TMAX) - 1](mm, b, t);
        }
        return;
    }
    enum { TB = 9 * VNNI_TMAX }; /* whole tiles */
    for (int tb = 0; tb < mm->n; tb += TB) {
        const int te = tb + TB < mm->n ? tb + TB : mm->n;
        for (int64_t b = b0; b < b1; b++)
            for (int t = tb; t < te; t += VNNI_TMAX) vnni_tiles[di][bi][(te - t < VNNI_TMAX ? te - t : VNNI_TMAX) - 1](mm, b, t);
    }
}
