/* Matmul kernels other than cuBLASLt: the decode GEMV, activation conversion for the GEMM
 * inputs, and the dequantization of MLX weights to bf16 for the GEMM.
 *
 * GEMV: y_i[n, rows_i] = x[n, cols] . W_i[rows_i, cols]^T for n in 1..CUDA_GEMV_MAX_N and up to
 * CUDA_GEMV_MAX_W weights of one layout that read the same x (q/k/v, gate/up: one launch).
 *   Dense weights (f32, f16, bf16), cuda_gemv_kernel. Work item: R consecutive rows of one
 *   weight, taken by one warp; the warps of a persistent grid (the blocks that fit on the SMs
 *   at once) walk the items grid-stride. Each lane streams 16-byte chunks of the R rows (8
 *   bf16/f16 or 4 f32 values) with non-caching loads, U chunks of each row issued before any
 *   is used: R * U = 16 independent 16-byte loads in flight per lane at n <= 2 (Little's law:
 *   ~2.5 MB in flight over the GPU at ~4 TB/s). At n = 1: R = 4, U = 4; rows of at least
 *   CUDA_GEMV_LONG_ROW bytes (the 8B's 4096 and 14336 columns) R = 1, U = 16, one round of
 *   loads per row; few long rows (the 1B's down_proj) and launches whose 4-row items would not
 *   fill an 8-warp block per SM (the 1B's q/k/v and o_proj) R = 1, U = 8. n = 2: R = 4; n > 2:
 *   R = 2. The x values of a chunk are read once (from L1: every warp reads x) for all R rows.
 *   MLX q4/q8: x is first staged by each block in shared memory as int8 digits and the codes
 *   meet it in dp4a integer dot products (the section comment below); 512-thread blocks. At
 *   n = 1, cuda_gemvq_pipe_kernel: 2-row items, each warp's stream of loads pipelined over its
 *   items (round k + 1 in flight while round k is used); n = 2..8, cuda_gemvq_kernel: the dense
 *   kernel's walk with R = 2. Why integer: the earlier kernel dequantized every code to f32 (one
 *   fma and two integer ops per code, x in f32 from L1) and was latency/issue-bound at 18-40 %
 *   of the copy bandwidth for q4 and 40-74 % for q8 (ncu: 0.35 instructions issued per
 *   scheduler cycle, waiting on L1); the integer kernel takes ~30 instructions per 16-byte q4
 *   chunk and row instead of ~100. Why pipelined: the unpipelined integer kernel with 4-row
 *   items at n = 1 left half the SMs idle on 4,096-row weights and stalled each warp on a whole
 *   round of loads (its section comment). H200, n = 1, us (% of the copy bandwidth), pipelined
 *   against unpipelined (CAIRN_CUDA_GEMVQ=old), the same binary (the gemvq helper's device
 *   calls, 3 Dec): q4 4096 x 4096 4.7 (47 %) against 6.7 (34 %), 14336 x 4096 12.2 (64 %) /
 *   13.7, 4096 x 14336 12.8 (61 %) / 18.4, 128256 x 4096 83.9 (84 %) / 85.7; q8 6.1 (69 %) /
 *   9.1, 18.7 (79 %) / 20.4, 20.0 (74 %) / 26.3, 137 (97 %) / 131 (101 %); 8B tg128 q4 428
 *   tok/s against 372, q8 308 against 271.
 *   accumulate: y += the product, read and written by the lane that owns the element (the
 *   residual adds of o_proj and down_proj, matmul_add).
 *   Launched with programmatic dependent launch (cuda_common.cuh): the grid may start while
 *   the kernel before it (an RMSNorm, SiLU, attention) still runs, and each warp issues its
 *   first R * U weight loads (the pipelined q kernel: two rounds) before it waits for x.
 *   Bytes per call: the weights once (rows * row_bytes) + x (from L2, once per block for q4/q8)
 *   + y; bound by HBM bandwidth. Items are R rows of one weight at every n; a lane's chunks of a
 *   row and their order do not depend on R, U or the walk.
 *   Accumulation in f32, one accumulator per (row, activation row) and lane, chunks of a lane in
 *   ascending order, summed across the warp with shuffles at the end of the item: a row's
 *   result is the same bits for every n, R, U and launch split (test_cuda_ops checks it).
 *   Rows whose chunks would not be 16-byte aligned (cols not a multiple of the chunk, an
 *   activation pointer not 16-byte aligned, q2/q3/q5/q6, or a q4/q8 x row over
 *   CUDA_GEMVQ_SMEM_MAX staged) take the scalar kernel, which reads element by element with
 *   cuda_w_elem: correct for every layout, not fast.
 * Conversions: f32 -> bf16/f16 one element per thread (4 bytes in, 2 out per element).
 * Dequant: one element per thread, rows * cols * 2 bytes written; a q4 8B model's prefill pays
 *   it once per matmul per step, which the GEMM's n * 2 * rows * cols FLOPs dwarf at n >= 64.
 * CPU reference: ref_matmul in cpu/ref_ops.c (double accumulation). */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_common.cuh"

#define CUDA_GEMV_THREADS 256 /* 8 warps per block */
#define CUDA_GEMV_WARPS (CUDA_GEMV_THREADS / CUDA_WARP)
#define CUDA_GEMV_U 4              /* chunks of each row a lane loads before using them (x R) */
#define CUDA_GEMV_FILL_BLOCKS 4    /* dense n = 1: 4-row items per SM below which a warp */
#define CUDA_GEMV_FEW_MIN_COLS 4096 /* takes one row, for rows of at least this many values */
#define CUDA_GEMV_BLOCKS_PER_SM 4  /* persistent grid: at most this many blocks per SM (fewer
                                    * when the registers do not allow them) */
#define CUDA_CONV_THREADS 256

enum cuda_gemv_kind { GEMV_F32 = 0, GEMV_F16, GEMV_BF16, GEMV_Q4, GEMV_Q8 };

/* Logical elements per 16-byte chunk of a row. */
template <int K> struct cuda_gemv_chunk;
template <> struct cuda_gemv_chunk<GEMV_F32> { static constexpr int elems = 4; };
template <> struct cuda_gemv_chunk<GEMV_F16> { static constexpr int elems = 8; };
template <> struct cuda_gemv_chunk<GEMV_BF16> { static constexpr int elems = 8; };

/* The weights of one launch: same type, cols and (for Q) bits and group size. */
struct cuda_gemv_set {
    struct cuda_wdesc w[CUDA_GEMV_MAX_W];
    float *y[CUDA_GEMV_MAX_W];
    int64_t item_end[CUDA_GEMV_MAX_W]; /* cumulative items (R-row groups) up to weight i */
    int count;
    int accumulate; /* y += x . W^T (each y element is read and written by one lane) */
    const float *norm; /* CUDA_GEMV_F_NORM: the RMSNorm weight [cols] x is normed with */
    float eps, w_offset; /* CUDA_GEMV_F_NORM: its epsilon and weight offset */
};

/* Fusions (template flags of both kernels; cuda_k_gemv_fused):
 * CUDA_GEMV_F_NORM: y = rmsnorm(x) . W^T. A lane multiplies its x values by the norm weight as
 *   it reads them and sums their squares (its chunks in ascending order, as the products); the
 *   warp's sums give the row's 1 / rms (cuda_rms_inv, the rmsnorm kernels' formula), which
 *   scales the item's results in the epilogue: sum_i w_i (g_i x_i) / rms. The q kernel does the
 *   same while staging (per-chunk sums of squares in shared memory, summed by each warp in a
 *   fixed order). A row's result still depends only on its own x: batch-invariant.
 * CUDA_GEMV_F_SILU: w[0] = gate, w[1] = up (equal rows): an item takes rows r0.. of both (R / 2
 *   of each) and its epilogue writes y[0] = silu(gate) * up (the silu_mul kernel's formula), so
 *   down_proj's input comes out of this launch and y[1] is not written. */
#define CUDA_GEMV_F_NORM 1
#define CUDA_GEMV_F_SILU 2

/* A 16-byte weight load that bypasses L1 (the stream is read once; L1 keeps x). */
static __device__ __forceinline__ uint4 cuda_gemv_ld(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* Weight values of a dense chunk, widened to f32. */
template <int K> static __device__ __forceinline__ void cuda_gemv_widen(uint4 c, float *w)
{
    const uint32_t u[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (K == GEMV_F32) {
            w[j] = __uint_as_float(u[j]);
        } else if (K == GEMV_BF16) {
            w[2 * j] = __uint_as_float(u[j] << 16);
            w[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        } else {
            w[2 * j] = cuda_f16_f32((uint16_t)(u[j] & 0xffffu));
            w[2 * j + 1] = cuda_f16_f32((uint16_t)(u[j] >> 16));
        }
    }
}

/* acc[j][t] += chunk_j . x[t][i .. i + E) for the R rows j and t < n (NT: bound on n). NORM: x
 * times (g + g_off) instead, and ss[t] += the squares of x[t]'s values. */
template <int K, int NT, int R, bool NORM>
static __device__ __forceinline__ void cuda_gemv_chunk_dot(const uint4 *c, int64_t i, int64_t cols,
                                                           const float *__restrict__ x, const float *__restrict__ g,
                                                           float g_off, int n, float (*acc)[NT], float *ss)
{
    constexpr int E = cuda_gemv_chunk<K>::elems;
    float wv[R][E];
#pragma unroll
    for (int j = 0; j < R; j++) cuda_gemv_widen<K>(c[j], wv[j]);
    float gv[E];
    if (NORM) {
#pragma unroll
        for (int q = 0; q < E / 4; q++) {
            float4 v = __ldg((const float4 *)(g + i) + q);
            gv[4 * q] = v.x + g_off;
            gv[4 * q + 1] = v.y + g_off;
            gv[4 * q + 2] = v.z + g_off;
            gv[4 * q + 3] = v.w + g_off;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        const float4 *xp = (const float4 *)(x + (int64_t)t * cols + i);
        float xv[E];
#pragma unroll
        for (int q = 0; q < E / 4; q++) {
            float4 v = cuda_ld_dep(xp + q); /* x: an earlier kernel's (cuda_common.cuh) */
            xv[4 * q] = v.x;
            xv[4 * q + 1] = v.y;
            xv[4 * q + 2] = v.z;
            xv[4 * q + 3] = v.w;
        }
        if (NORM) {
#pragma unroll
            for (int e = 0; e < E; e++) {
                ss[t] = fmaf(xv[e], xv[e], ss[t]);
                xv[e] *= gv[e];
            }
        }
#pragma unroll
        for (int j = 0; j < R; j++) {
            float s = 0;
#pragma unroll
            for (int e = 0; e < E; e++) s = fmaf(wv[j][e], xv[e], s);
            acc[j][t] += s;
        }
    }
}

/* Row pointers of an item: rows r0.. of weight wi, or (SILU) rows r0.. of gate then of up. */
template <int R, int F>
static __device__ __forceinline__ void cuda_gemv_rows_of(const struct cuda_gemv_set &set, int wi, int64_t r0,
                                                         const uint8_t **row)
{
    constexpr int H = (F & CUDA_GEMV_F_SILU) ? R / 2 : R;
#pragma unroll
    for (int j = 0; j < R; j++) { /* rows past the end re-read the last row, never written */
        const struct cuda_wdesc &w = set.w[(F & CUDA_GEMV_F_SILU) ? j / H : wi];
        row[j] = (const uint8_t *)w.data + (size_t)min(r0 + j % H, w.rows - 1) * w.row_bytes;
    }
}

/* The item's epilogue, by every lane (the warp sums); lane 0 writes. inv: NORM's 1 / rms. */
template <int NT, int R, int F>
static __device__ __forceinline__ void cuda_gemv_store(const struct cuda_gemv_set &set, int wi, int64_t r0,
                                                       float (*acc)[NT], const float *inv, int n, int lane)
{
    constexpr int H = (F & CUDA_GEMV_F_SILU) ? R / 2 : R;
    float v[R][NT];
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            v[j][t] = cuda_warp_sum(acc[j][t]);
            if (F & CUDA_GEMV_F_NORM) v[j][t] *= inv[t];
        }
    if (lane != 0) return;
    const struct cuda_wdesc &w = set.w[(F & CUDA_GEMV_F_SILU) ? 0 : wi];
    float *y = set.y[(F & CUDA_GEMV_F_SILU) ? 0 : wi];
#pragma unroll
    for (int j = 0; j < H; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n || r0 + j >= w.rows) continue;
            float *o = y + (int64_t)t * w.rows + r0 + j;
            if (F & CUDA_GEMV_F_SILU) {
                float g = v[j][t];
                *o = g / (1.0f + expf(-g)) * v[j + H][t];
            } else {
                *o = set.accumulate ? *o + v[j][t] : v[j][t];
            }
        }
}

template <int K, int NT, int R, int U, int F>
static __global__ void __launch_bounds__(CUDA_GEMV_THREADS)
cuda_gemv_kernel(struct cuda_gemv_set set, const float *__restrict__ x, int n)
{
    constexpr int E = cuda_gemv_chunk<K>::elems;
    constexpr bool NORM = F & CUDA_GEMV_F_NORM, SILU = F & CUDA_GEMV_F_SILU;
    constexpr int H = SILU ? R / 2 : R; /* rows of one weight per item */
    static_assert(!SILU || R % 2 == 0, "a SILU item pairs gate and up rows");
    int lane = threadIdx.x % CUDA_WARP;
    const int64_t n_items = set.item_end[set.count - 1];
    const int64_t n_chunks = set.w[0].cols / E;
    bool waited = false; /* PDL: the first weight loads go out before the wait (cuda_common.cuh) */
    cuda_pdl_trigger();
    for (int64_t it = (int64_t)blockIdx.x * CUDA_GEMV_WARPS + threadIdx.x / CUDA_WARP; it < n_items;
         it += (int64_t)gridDim.x * CUDA_GEMV_WARPS) {
        int wi = 0;
        if (!SILU)
            while (it >= set.item_end[wi]) wi++;
        const int64_t cols = set.w[0].cols;
        int64_t r0 = (it - (wi ? set.item_end[wi - 1] : 0)) * H;
        const uint8_t *row[R];
        cuda_gemv_rows_of<R, F>(set, wi, r0, row);
        float acc[R][NT], ss[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            ss[t] = 0;
#pragma unroll
            for (int j = 0; j < R; j++) acc[j][t] = 0;
        }
        for (int64_t c0 = lane; c0 < n_chunks; c0 += (int64_t)CUDA_WARP * U) {
            uint4 cv[U][R];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int64_t ci = c0 + (int64_t)u * CUDA_WARP;
#pragma unroll
                for (int j = 0; j < R; j++)
                    cv[u][j] = ci < n_chunks ? cuda_gemv_ld((const uint4 *)row[j] + ci) : make_uint4(0, 0, 0, 0);
            }
            if (!waited) { /* x and y belong to earlier kernels: not before this */
                cuda_pdl_wait();
                waited = true;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int64_t ci = c0 + (int64_t)u * CUDA_WARP;
                if (ci < n_chunks)
                    cuda_gemv_chunk_dot<K, NT, R, NORM>(cv[u], ci * E, cols, x, set.norm, set.w_offset, n, acc, ss);
            }
        }
        float inv[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) inv[t] = NORM ? cuda_rms_inv(cuda_warp_sum(ss[t]), (int)cols, set.eps) : 1.0f;
        cuda_gemv_store<NT, R, F>(set, wi, r0, acc, inv, n, lane);
    }
}

/* ---- MLX q4/q8: integer dot products against x staged in shared memory as int8 digits ----
 * x is cut into chunk-sized blocks (E = the codes of one 16-byte chunk: 32 for q4, 16 for q8;
 * a block never straddles a weight group). Block b of x row t, with m its largest |x|, is
 * written as two int8 digits per value: x ~ (m / 127) * (h + l / 256), h = rint(127 x / m),
 * l = rint(256 * (127 x / m - h)) clamped to 127 in magnitude: an error of at most m / 65,024
 * per value (m / 32,512 where the clamp cuts l = 128), 2^-16 to 2^-15 of the block's largest,
 * 64 to 128 times below the 2^-9 of a bf16 value of that size; plus the f32 sum of the
 * block's x for the bias term. Then for each chunk and row
 *   dot = s * (m / 127 / 256) * (256 * sum(q * h) + sum(q * l)) + b * sum(x),
 * the two integer sums taken by dp4a (4 byte products per instruction; q4 codes unpacked by a
 * mask and a shift, q8 codes used as they are, unsigned against signed x digits), exact. Per
 * 16-byte q4 chunk and row that is ~30 instructions instead of ~100, and the x of a chunk is
 * 64 bytes of shared memory in 4 loads instead of 128 bytes of f32 in 8 L1 loads.
 * Staging: after the PDL wait every block converts the n x rows (read from L2) into its
 * shared memory: [t][piece][chunk] 16-byte pieces (a lane's chunk c reads piece k at
 * k * n_chunks + c: consecutive lanes, consecutive pieces, no bank conflicts), pieces 0..E/16-1
 * the h digits and the rest the l digits, in the order the unpacked codes need (q4: word k of
 * a chunk holds codes 8k..8k+7 as nibbles; its even codes (mask) meet digit word 2k, its odd
 * codes (shift, mask) word 2k + 1); then [t][chunk] (m / 127 / 256, sum x) as float2.
 * Every value of a row depends only on that row's x and the weight: the same bits for any n,
 * rows per item, block size or launch split (tests/cuda/test_cuda_ops.c checks it). */
#define CUDA_GEMVQ_SMEM_MAX (96 << 10) /* shared bytes per block: n is split to fit */
#define CUDA_GEMVQ_THREADS 512          /* 16 warps: x staged once per 16 warps (1024 spill) */

template <int BITS> struct cuda_gemvq_shape {
    static constexpr int E = BITS == 4 ? 32 : 16; /* codes per 16-byte chunk */
    static constexpr int P = 2 * E / 16;         /* 16-byte digit pieces per chunk (h, then l) */
};

/* Shared bytes of one staged x row of cols values (norm: with the per-chunk sums of squares). */
static inline size_t cuda_gemvq_row_bytes(int bits, int64_t cols, bool norm)
{
    int64_t e = bits == 4 ? 32 : 16;
    return (size_t)(cols / e) * (size_t)(2 * e + 8 + (norm ? 4 : 0));
}

/* sum of the 4 products of unsigned bytes of a and signed bytes of b, plus c */
static __device__ __forceinline__ int cuda_dp4a_us(uint32_t a, uint32_t b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* One 8-value slot s of the staging (see cuda_gemvq_stage): v the values (times the norm weight
 * for NORM), sq their sum of squares; on: s < total. Every thread of the block calls it with the
 * same trip count (the shuffles). */
template <int BITS, bool NORM>
static __device__ __forceinline__ void cuda_gemvq_stage_slot(float *v, float sq, bool on, int64_t s, int n,
                                                             int64_t n_chunks, int64_t slots_row, uint4 *sh)
{
    constexpr int E = cuda_gemvq_shape<BITS>::E, P = cuda_gemvq_shape<BITS>::P, TPC = E / 8;
    float2 *meta = (float2 *)(sh + (size_t)n * P * n_chunks);
    float m = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) m = fmaxf(m, fabsf(v[e]));
    float sum = __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[1]), __fadd_rn(v[2], v[3])),
                          __fadd_rn(__fadd_rn(v[4], v[5]), __fadd_rn(v[6], v[7])));
#pragma unroll
    for (int o = 1; o < TPC; o <<= 1) { /* a + b == b + a: every lane of the block gets one sum */
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
        if (NORM) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, o));
    }
    if (!on) return;
    float inv = m > 0 ? __fdiv_rn(127.0f, m) : 0.0f;
    uint32_t hw[2] = {0, 0}, lw[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float p = __fmul_rn(v[e], inv);
        int h = __float2int_rn(p);
        int l = __float2int_rn(__fmul_rn(__fsub_rn(p, (float)h), 256.0f)); /* p - h is exact */
        l = max(-127, min(127, l));
        /* q4: this thread's 8 values are word k of the chunk: even codes -> digit word 0
         * (bytes e / 2), odd -> word 1; q8: bytes in order. */
        int wd = BITS == 4 ? (e & 1) : e >> 2, by = BITS == 4 ? e >> 1 : e & 3;
        hw[wd] |= (uint32_t)(h & 0xff) << (8 * by);
        lw[wd] |= (uint32_t)(l & 0xff) << (8 * by);
    }
    int64_t t = s / slots_row, c = (s % slots_row) / TPC;
    int k = (int)(s % TPC); /* 8-byte slot k of the chunk's E digit bytes */
    uint8_t *hp = (uint8_t *)(sh + ((size_t)t * P + k / 2) * n_chunks + c) + 8 * (k % 2);
    uint8_t *lp = (uint8_t *)(sh + ((size_t)t * P + P / 2 + k / 2) * n_chunks + c) + 8 * (k % 2);
    *(uint2 *)hp = make_uint2(hw[0], hw[1]);
    *(uint2 *)lp = make_uint2(lw[0], lw[1]);
    if (k == 0) meta[t * n_chunks + c] = make_float2(__fdiv_rn(m, 127.0f) * (1.0f / 256.0f), sum);
    if (NORM && k == 0) ((float *)(meta + (size_t)n * n_chunks))[t * n_chunks + c] = sq;
}

/* x[n][cols] (f32) -> the block's digits (see above). Called by every thread of the block.
 * Each thread takes 8 consecutive values (E / 8 threads per x block, reduced by shuffles), SB
 * slots THREADS apart per round: their loads (from L2) all go out before the first is
 * converted, so a 14,336-wide row is one L2 round trip instead of four (SB = 4). */
template <int BITS, int THREADS, bool NORM, int SB>
static __device__ __forceinline__ void cuda_gemvq_stage(const float *__restrict__ x, int n, int64_t cols,
                                                        const float *__restrict__ g, float g_off, uint4 *sh)
{
    constexpr int E = cuda_gemvq_shape<BITS>::E;
    const int64_t n_chunks = cols / E, slots_row = cols / 8, total = (int64_t)n * slots_row;
    for (int64_t base = 0; base < total; base += (int64_t)THREADS * SB) { /* uniform trip count */
        float4 a[SB], b[SB], ga[SB], gb[SB];
#pragma unroll
        for (int q = 0; q < SB; q++) {
            int64_t s = base + (int64_t)q * THREADS + threadIdx.x;
            if (s < total) {
                a[q] = cuda_ld_dep((const float4 *)x + 2 * s); /* an earlier kernel's (cuda_common.cuh) */
                b[q] = cuda_ld_dep((const float4 *)x + 2 * s + 1);
                if (NORM) {
                    const float4 *gp = (const float4 *)(g + (s % slots_row) * 8);
                    ga[q] = __ldg(gp);
                    gb[q] = __ldg(gp + 1);
                }
            } else {
                a[q] = b[q] = ga[q] = gb[q] = make_float4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int q = 0; q < SB; q++) {
            int64_t s = base + (int64_t)q * THREADS + threadIdx.x;
            if (base + (int64_t)q * THREADS >= total) break; /* uniform: no thread of the block has slots left */
            float v[8] = {a[q].x, a[q].y, a[q].z, a[q].w, b[q].x, b[q].y, b[q].z, b[q].w}, sq = 0;
            if (NORM) { /* the squares of x, then x times the norm weight is what is staged */
                const float gv[8] = {ga[q].x, ga[q].y, ga[q].z, ga[q].w, gb[q].x, gb[q].y, gb[q].z, gb[q].w};
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    sq = fmaf(v[e], v[e], sq);
                    v[e] *= gv[e] + g_off;
                }
            }
            cuda_gemvq_stage_slot<BITS, NORM>(v, sq, s < total, s, n, n_chunks, slots_row, sh);
        }
    }
}

/* NORM: 1 / rms of each staged x row t < n from its chunks' sums of squares (after the staging's
 * barrier), by every lane of a warp: lane-strided in ascending order, then the warp's sum; the
 * same order for any block size, n or launch split. */
template <int NT>
static __device__ __forceinline__ void cuda_gemvq_inv_rms(const uint4 *sh, int P, int64_t n_chunks, int n,
                                                          int64_t cols, float eps, int lane, float *inv)
{
    const float *sq = (const float *)((const float2 *)(sh + (size_t)n * P * n_chunks) + (size_t)n * n_chunks);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float a = 0;
        if (t < n)
            for (int64_t c = lane; c < n_chunks; c += CUDA_WARP) a += sq[t * n_chunks + c];
        inv[t] = cuda_rms_inv(cuda_warp_sum(a), (int)cols, eps);
    }
}

/* acc[j][t] += chunk ci of rows j . x[t] (the staged digits) for the R rows and t < n, with
 * scale[j] and bias[j] the chunk's group's. */
template <int BITS, int NT, int R>
static __device__ __forceinline__ void cuda_gemvq_dot(const uint4 *c, const float *scale, const float *bias,
                                                      int64_t ci, const uint4 *sh, int64_t n_chunks, int n,
                                                      float (*acc)[NT])
{
    constexpr int P = cuda_gemvq_shape<BITS>::P;
    const float2 *meta = (const float2 *)(sh + (size_t)n * P * n_chunks);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        uint32_t xd[P][4]; /* the chunk's h digit words, then its l digit words */
#pragma unroll
        for (int k = 0; k < P; k++) {
            uint4 v = sh[((size_t)t * P + k) * n_chunks + ci];
            xd[k][0] = v.x, xd[k][1] = v.y, xd[k][2] = v.z, xd[k][3] = v.w;
        }
        const float2 mt = meta[t * n_chunks + ci];
#pragma unroll
        for (int j = 0; j < R; j++) {
            const uint32_t wq[4] = {c[j].x, c[j].y, c[j].z, c[j].w};
            int sh_ = 0, sl = 0;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                if (BITS == 4) { /* digit word 2q (piece q / 2, word 2q % 4) for the even codes */
                    uint32_t ev = wq[q] & 0x0f0f0f0fu, od = (wq[q] >> 4) & 0x0f0f0f0fu;
                    sh_ = cuda_dp4a_us(ev, xd[q / 2][(2 * q) % 4], sh_);
                    sh_ = cuda_dp4a_us(od, xd[q / 2][(2 * q) % 4 + 1], sh_);
                    sl = cuda_dp4a_us(ev, xd[P / 2 + q / 2][(2 * q) % 4], sl);
                    sl = cuda_dp4a_us(od, xd[P / 2 + q / 2][(2 * q) % 4 + 1], sl);
                } else {
                    sh_ = cuda_dp4a_us(wq[q], xd[0][q], sh_);
                    sl = cuda_dp4a_us(wq[q], xd[1][q], sl);
                }
            }
            float p = __fmul_rn(mt.x, __int2float_rn(sh_ * 256 + sl)); /* |.| < 2^31: q8 255 * 127 * 16 * 257 */
            acc[j][t] = __fmaf_rn(scale[j], p, acc[j][t]);
            acc[j][t] = __fmaf_rn(bias[j], mt.y, acc[j][t]);
        }
    }
}

/* cuda_gemvq_dot with the chunk's scales and biases read here (the unpipelined kernel). */
template <int BITS, int NT, int R>
static __device__ __forceinline__ void cuda_gemvq_chunk(const uint4 *c, const uint8_t *const *row, int64_t ci,
                                                        const struct cuda_wdesc &w, const uint4 *sh,
                                                        int64_t n_chunks, int n, float (*acc)[NT])
{
    constexpr int E = cuda_gemvq_shape<BITS>::E;
    const int64_t g = ci * E / w.group_size;
    float scale[R], bias[R];
#pragma unroll
    for (int j = 0; j < R; j++) {
        const uint16_t *sc = (const uint16_t *)(row[j] + cuda_q_scales_off(w.cols, BITS));
        const uint16_t *bi = (const uint16_t *)(row[j] + cuda_q_biases_off(w.cols, BITS, w.group_size));
        scale[j] = cuda_bf16_f32(__ldg(sc + g));
        bias[j] = cuda_bf16_f32(__ldg(bi + g));
    }
    cuda_gemvq_dot<BITS, NT, R>(c, scale, bias, ci, sh, n_chunks, n, acc);
}

template <int BITS, int NT, int R, int THREADS, int F>
static __global__ void __launch_bounds__(THREADS)
cuda_gemvq_kernel(struct cuda_gemv_set set, const float *__restrict__ x, int n)
{
    extern __shared__ uint4 cuda_gemvq_sh[];
    constexpr int E = cuda_gemvq_shape<BITS>::E, U = CUDA_GEMV_U, WARPS = THREADS / CUDA_WARP;
    constexpr bool NORM = F & CUDA_GEMV_F_NORM, SILU = F & CUDA_GEMV_F_SILU;
    constexpr int H = SILU ? R / 2 : R; /* rows of one weight per item */
    static_assert(!SILU || R % 2 == 0, "a SILU item pairs gate and up rows");
    const int lane = threadIdx.x % CUDA_WARP;
    const int64_t n_items = set.item_end[set.count - 1];
    const int64_t n_chunks = set.w[0].cols / E;
    const int64_t stride = (int64_t)gridDim.x * WARPS;
    int64_t it = (int64_t)blockIdx.x * WARPS + threadIdx.x / CUDA_WARP;
    cuda_pdl_trigger();
    uint4 cv[U][R];
    const uint8_t *row[R];
    int wi = 0;
    int64_t r0 = 0;
    /* the first item's first loads go out before the wait and the staging */
    if (it < n_items) {
        if (!SILU)
            while (it >= set.item_end[wi]) wi++;
        r0 = (it - (wi ? set.item_end[wi - 1] : 0)) * H;
        cuda_gemv_rows_of<R, F>(set, wi, r0, row);
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t ci = lane + (int64_t)u * CUDA_WARP;
#pragma unroll
            for (int j = 0; j < R; j++)
                cv[u][j] = ci < n_chunks ? cuda_gemv_ld((const uint4 *)row[j] + ci) : make_uint4(0, 0, 0, 0);
        }
    }
    cuda_pdl_wait(); /* x and y belong to earlier kernels */
    cuda_gemvq_stage<BITS, THREADS, NORM, 1>(x, n, set.w[0].cols, set.norm, set.w_offset, cuda_gemvq_sh);
    __syncthreads();
    float inv[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) inv[t] = 1.0f;
    if (NORM)
        cuda_gemvq_inv_rms<NT>(cuda_gemvq_sh, cuda_gemvq_shape<BITS>::P, n_chunks, n, set.w[0].cols, set.eps, lane,
                               inv);
    bool pre = true;
    for (; it < n_items; it += stride) {
        if (!pre) {
            wi = 0;
            if (!SILU)
                while (it >= set.item_end[wi]) wi++;
            r0 = (it - (wi ? set.item_end[wi - 1] : 0)) * H;
            cuda_gemv_rows_of<R, F>(set, wi, r0, row);
        }
        const struct cuda_wdesc &w = set.w[wi];
        float acc[R][NT];
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[j][t] = 0;
        for (int64_t c0 = lane; c0 < n_chunks; c0 += (int64_t)CUDA_WARP * U) {
            if (!pre) {
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int64_t ci = c0 + (int64_t)u * CUDA_WARP;
#pragma unroll
                    for (int j = 0; j < R; j++)
                        cv[u][j] = ci < n_chunks ? cuda_gemv_ld((const uint4 *)row[j] + ci) : make_uint4(0, 0, 0, 0);
                }
            }
            pre = false;
#pragma unroll
            for (int u = 0; u < U; u++) {
                int64_t ci = c0 + (int64_t)u * CUDA_WARP;
                if (ci < n_chunks) cuda_gemvq_chunk<BITS, NT, R>(cv[u], row, ci, w, cuda_gemvq_sh, n_chunks, n, acc);
            }
        }
        pre = false;
        cuda_gemv_store<NT, R, F>(set, wi, r0, acc, inv, n, lane);
    }
}

/* ---- the pipelined q4/q8 kernel (batch 1) ----
 * The same products in the same order as cuda_gemvq_kernel (the same bits), walked as a stream
 * of rounds: a round is U = 2 chunks per lane of an item's R = 2 rows, with their scales and
 * biases; a warp's rounds run over its item's chunks and then on to its next item, and round
 * k + 1 is in flight while round k is used (two register buffers, 8 loads per lane in flight).
 * Why: the 512-thread blocks take ~125 registers, so an SM holds 16 warps; the unpipelined
 * kernel's 4-row items of a 4,096-row weight (1,024 items) filled 64 of the H200's 132 SMs, and
 * each of its warps waited for a whole round of loads, then computed with none in flight.
 * 2-row items spread a 4,096-row weight over 128 SMs, and a warp's loads never stop; the
 * staging's loads of x go out at once (SB) while the first two rounds of weights are in flight.
 * Tried and dropped (H200, the gemvq helper's device calls, 3 Dec): 1-row items (x's digits read
 * once per row instead of once per two): q4 4096 x 4096 5.2 us against 4.4, 128256 x 4096 93.7
 * against 83.2, 8B q4 tg128 416 tok/s against 428; an L2 prefetch of each warp's next item
 * (cp.async.bulk.prefetch.L2 of its rows when a warp moved to an item): microbenchmark mixed
 * (q4 14336 x 4096 11.4 us against 12.2, q8 128256 x 4096 149 against 137), 8B q8 tg128 269
 * against 308, q4 390 against 428. */
#define CUDA_GEMVQ_PIPE_LOADS 4 /* 16-byte weight loads per lane and round (R rows x U chunks; x 2 buffers) */
#define CUDA_GEMVQ_STAGE_SB 4    /* staging slots per thread whose loads go out together (2 with NORM) */

template <int R, int U> struct cuda_gemvq_buf {
    uint4 c[U][R];
    uint32_t sb[U][R]; /* the chunk's group's bf16 scale (low half) and bias (high half) */
    int64_t c0;        /* the round's first chunk (lane 0's, u = 0) */
    int64_t r0;        /* the item's first row */
    int wi;            /* the item's weight */
    bool on, last;     /* a round was issued; it is its item's last */
};

/* The warp's cursor over its rounds: item it (rows r0.. of weight wi at row[]) and chunk c0. */
template <int R> struct cuda_gemvq_cursor {
    const uint8_t *row[R];
    int64_t it, r0, c0;
    int wi;
};

template <int R, int F>
static __device__ __forceinline__ void cuda_gemvq_locate(const struct cuda_gemv_set &set,
                                                         struct cuda_gemvq_cursor<R> &k)
{
    constexpr int H = (F & CUDA_GEMV_F_SILU) ? R / 2 : R;
    k.wi = 0;
    if (!(F & CUDA_GEMV_F_SILU))
        while (k.it >= set.item_end[k.wi]) k.wi++;
    k.r0 = (k.it - (k.wi ? set.item_end[k.wi - 1] : 0)) * H;
    cuda_gemv_rows_of<R, F>(set, k.wi, k.r0, k.row);
}

/* Issues the cursor's round into b (b.on = false past the warp's last item) and advances. */
template <int BITS, int R, int U, int F>
static __device__ __forceinline__ void cuda_gemvq_issue(const struct cuda_gemv_set &set, int64_t n_items,
                                                        int64_t n_chunks, int64_t stride, int lane,
                                                        struct cuda_gemvq_cursor<R> &k, struct cuda_gemvq_buf<R, U> &b)
{
    constexpr int E = cuda_gemvq_shape<BITS>::E;
    b.on = k.it < n_items;
    if (!b.on) return;
    const struct cuda_wdesc &w = set.w[0]; /* the layout (cols, group size) of every weight */
    const size_t so = cuda_q_scales_off(w.cols, BITS), bo = cuda_q_biases_off(w.cols, BITS, w.group_size);
    const int gshift = __ffs(w.group_size / E) - 1; /* chunks per group: 1 to 8, a power of two */
    b.c0 = k.c0;
    b.r0 = k.r0;
    b.wi = k.wi;
    b.last = k.c0 + (int64_t)CUDA_WARP * U >= n_chunks;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t ci = k.c0 + lane + (int64_t)u * CUDA_WARP;
        int64_t g = ci >> gshift;
#pragma unroll
        for (int j = 0; j < R; j++) {
            if (ci < n_chunks) {
                b.c[u][j] = cuda_gemv_ld((const uint4 *)k.row[j] + ci);
                uint32_t sc = __ldg((const uint16_t *)(k.row[j] + so) + g);
                uint32_t bi = __ldg((const uint16_t *)(k.row[j] + bo) + g);
                b.sb[u][j] = sc | bi << 16;
            } else {
                b.c[u][j] = make_uint4(0, 0, 0, 0);
                b.sb[u][j] = 0;
            }
        }
    }
    k.c0 += (int64_t)CUDA_WARP * U;
    if (k.c0 >= n_chunks) {
        k.c0 = 0;
        k.it += stride;
        if (k.it < n_items) cuda_gemvq_locate<R, F>(set, k);
    }
}

/* Uses round b: its products into acc, and at its item's last round the item's results out. */
template <int BITS, int NT, int R, int U, int F>
static __device__ __forceinline__ void cuda_gemvq_use(const struct cuda_gemv_set &set, const struct cuda_gemvq_buf<R, U> &b,
                                                      const uint4 *sh, int64_t n_chunks, int n, int lane,
                                                      const float *inv, float (*acc)[NT])
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        int64_t ci = b.c0 + lane + (int64_t)u * CUDA_WARP;
        float scale[R], bias[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
            scale[j] = __uint_as_float(b.sb[u][j] << 16);
            bias[j] = __uint_as_float(b.sb[u][j] & 0xffff0000u);
        }
        if (ci < n_chunks) cuda_gemvq_dot<BITS, NT, R>(b.c[u], scale, bias, ci, sh, n_chunks, n, acc);
    }
    if (b.last) {
        cuda_gemv_store<NT, R, F>(set, b.wi, b.r0, acc, inv, n, lane);
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[j][t] = 0;
    }
}

template <int BITS, int NT, int R, int THREADS, int F>
static __global__ void __launch_bounds__(THREADS)
cuda_gemvq_pipe_kernel(struct cuda_gemv_set set, const float *__restrict__ x, int n)
{
    extern __shared__ uint4 cuda_gemvq_sh[];
    constexpr int U = CUDA_GEMVQ_PIPE_LOADS / R, WARPS = THREADS / CUDA_WARP;
    constexpr bool NORM = F & CUDA_GEMV_F_NORM, SILU = F & CUDA_GEMV_F_SILU;
    constexpr int SB = NORM ? CUDA_GEMVQ_STAGE_SB / 2 : CUDA_GEMVQ_STAGE_SB; /* registers: 4 float4 per slot */
    static_assert(!SILU || R % 2 == 0, "a SILU item pairs gate and up rows");
    static_assert(U >= 1 && R * U == CUDA_GEMVQ_PIPE_LOADS, "R divides the loads of a round");
    const int lane = threadIdx.x % CUDA_WARP;
    const int64_t n_items = set.item_end[set.count - 1];
    const int64_t n_chunks = set.w[0].cols / cuda_gemvq_shape<BITS>::E;
    const int64_t stride = (int64_t)gridDim.x * WARPS;
    cuda_pdl_trigger();
    struct cuda_gemvq_cursor<R> k;
    k.it = (int64_t)blockIdx.x * WARPS + threadIdx.x / CUDA_WARP;
    k.c0 = 0;
    if (k.it < n_items) cuda_gemvq_locate<R, F>(set, k);
    struct cuda_gemvq_buf<R, U> a, b;
    /* two rounds go out before the wait and the staging (weights only: read-only) */
    cuda_gemvq_issue<BITS, R, U, F>(set, n_items, n_chunks, stride, lane, k, a);
    cuda_gemvq_issue<BITS, R, U, F>(set, n_items, n_chunks, stride, lane, k, b);
    cuda_pdl_wait(); /* x and y belong to earlier kernels */
    cuda_gemvq_stage<BITS, THREADS, NORM, SB>(x, n, set.w[0].cols, set.norm, set.w_offset, cuda_gemvq_sh);
    __syncthreads();
    float inv[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) inv[t] = 1.0f;
    if (NORM)
        cuda_gemvq_inv_rms<NT>(cuda_gemvq_sh, cuda_gemvq_shape<BITS>::P, n_chunks, n, set.w[0].cols, set.eps, lane,
                               inv);
    float acc[R][NT];
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[j][t] = 0;
    while (a.on) {
        cuda_gemvq_use<BITS, NT, R, U, F>(set, a, cuda_gemvq_sh, n_chunks, n, lane, inv, acc);
        cuda_gemvq_issue<BITS, R, U, F>(set, n_items, n_chunks, stride, lane, k, a);
        if (!b.on) break;
        cuda_gemvq_use<BITS, NT, R, U, F>(set, b, cuda_gemvq_sh, n_chunks, n, lane, inv, acc);
        cuda_gemvq_issue<BITS, R, U, F>(set, n_items, n_chunks, stride, lane, k, b);
    }
}

/* Any layout, element by element, one warp per row. */
template <int NT>
static __global__ void __launch_bounds__(CUDA_GEMV_THREADS)
cuda_gemv_scalar_kernel(struct cuda_wdesc w, const float *__restrict__ x, float *__restrict__ y, int n,
                        int accumulate)
{
    int lane = threadIdx.x % CUDA_WARP;
    for (int64_t r = (int64_t)blockIdx.x * CUDA_GEMV_WARPS + threadIdx.x / CUDA_WARP;
         r < w.rows; r += (int64_t)gridDim.x * CUDA_GEMV_WARPS) {
        const uint8_t *row = (const uint8_t *)w.data + (size_t)r * w.row_bytes;
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0;
        for (int64_t i = lane; i < w.cols; i += CUDA_WARP) {
            float wv = cuda_w_elem(w, row, i);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < n) acc[t] += wv * x[(int64_t)t * w.cols + i];
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = cuda_warp_sum(acc[t]);
            if (lane == 0 && t < n) y[(int64_t)t * w.rows + r] = accumulate ? y[(int64_t)t * w.rows + r] + v : v;
        }
    }
}

/* The vector kernel's kind for a weight (-1: scalar kernel only). */
static int cuda_gemv_kind_of(const struct cuda_wdesc *w, int *elems)
{
    switch (w->type) {
    case CUDA_W_F32: *elems = 4; return GEMV_F32;
    case CUDA_W_F16: *elems = 8; return GEMV_F16;
    case CUDA_W_BF16: *elems = 8; return GEMV_BF16;
    case CUDA_W_Q:
        if (w->bits == 4) return *elems = 32, GEMV_Q4;
        if (w->bits == 8) return *elems = 16, GEMV_Q8;
        return -1;
    }
    return -1;
}

/* Work items of a launch of R-row items: cumulative per weight, or (SILU) R / 2 rows of gate and
 * of up per item. */
template <int R, int F> static int64_t cuda_gemv_items(struct cuda_gemv_set *set)
{
    int64_t items = 0;
    if constexpr ((F & CUDA_GEMV_F_SILU) != 0) {
        constexpr int H = R / 2;
        items = (set->w[0].rows + H - 1) / H;
        for (int i = 0; i < set->count; i++) set->item_end[i] = items;
    } else {
        for (int i = 0; i < set->count; i++) {
            items += (set->w[i].rows + R - 1) / R;
            set->item_end[i] = items;
        }
    }
    return items;
}

template <int K, int NT, int R, int U, int F>
static void cuda_gemv_go(cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n, int n_sms)
{
    int64_t items = cuda_gemv_items<R, F>(set);
    /* Blocks resident per SM at this kernel's register count, asked once per kernel. */
    static int per_sm = 0;
    int ps = __atomic_load_n(&per_sm, __ATOMIC_RELAXED);
    if (!ps) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, cuda_gemv_kernel<K, NT, R, U, F>,
                                                          CUDA_GEMV_THREADS, 0) != cudaSuccess)
            (void)cudaGetLastError();
        ps = ps < 1 ? 1 : ps > CUDA_GEMV_BLOCKS_PER_SM ? CUDA_GEMV_BLOCKS_PER_SM : ps;
        __atomic_store_n(&per_sm, ps, __ATOMIC_RELAXED);
    }
    int64_t blocks = (items + CUDA_GEMV_WARPS - 1) / CUDA_GEMV_WARPS;
    int64_t cap = (int64_t)(n_sms > 0 ? n_sms : 1) * ps;
    blocks = blocks < 1 ? 1 : blocks > cap ? cap : blocks;
    (void)cuda_launch_pdl(cuda_gemv_kernel<K, NT, R, U, F>, (unsigned)blocks, CUDA_GEMV_THREADS, s, *set, x, n);
}

/* CAIRN_CUDA_GEMVQ=old: the q4/q8 GEMV at n = 1 takes the unpipelined kernel with 4-row items
 * (the kernel before the pipelined one), for comparison. Read once. */
static bool cuda_gemvq_old(void)
{
    static int old = -1;
    int v = __atomic_load_n(&old, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("CAIRN_CUDA_GEMVQ");
        v = e && strcmp(e, "old") == 0;
        __atomic_store_n(&old, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* Rows per item of a short dense launch at n = 1 (cuda_gemv_launch): 1 by default,
 * CAIRN_CUDA_GEMV_SHORT=2 or 4 (the general 4-row items, as before) for comparison; read once. */
static int cuda_gemv_short_rows(void)
{
    static int v = 0;
    int r = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (!r) {
        const char *e = getenv("CAIRN_CUDA_GEMV_SHORT");
        r = e && (atoi(e) == 1 || atoi(e) == 2 || atoi(e) == 4) ? atoi(e) : 1;
        __atomic_store_n(&v, r, __ATOMIC_RELAXED);
    }
    return r;
}

template <int K, int F>
static void cuda_gemv_launch(cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n, int n_sms)
{
    constexpr bool SILU = F & CUDA_GEMV_F_SILU;
    int64_t rows = 0;
    for (int i = 0; i < set->count; i++) rows += set->w[i].rows;
    /* Few long rows (the 1B's down_proj, 2048 x 8192): a row per warp with twice the loads, so
     * that the grid still fills the SMs several times (H200: 10.0 us instead of 13.2 there;
     * no gain on 2048 x 2048 or 4096-row shapes). */
    /* (the fused kernels take the 4-row items there: fewer kernels in the binary) */
    constexpr bool FEW_OK = F == 0;
    bool few = FEW_OK && rows < (int64_t)4 * CUDA_GEMV_FILL_BLOCKS * (n_sms > 0 ? n_sms : 1) &&
               set->w[0].cols >= CUDA_GEMV_FEW_MIN_COLS;
    /* Rows of at least CUDA_GEMV_LONG_ROW bytes: a row per warp item with 4 U of loads per
     * lane, so that one round of loads covers the row (a warp reads it as one contiguous 8 KiB
     * stream, and an item is one load-then-use round instead of four). H200, 8B shapes at
     * n = 1: 4096 x 4096 8.6 us against 11.1 (92 % of the copy bandwidth against 72 %),
     * 14336 x 4096 29.3 against 32.5, 4096 x 14336 29.9 against 34.6; shorter rows (the 1B's
     * 2048 columns) lose (8192 x 2048: 9.1 against 7.6), so they keep 4-row items.
     * SILU items pair a gate row with its up row: the 1-row items become 2-row ones with half
     * the loads of each row in flight (the same loads per lane). */
    bool long_rows = set->w[0].row_bytes >= CUDA_GEMV_LONG_ROW;
    /* Short launches (the 1B's q/k/v, 3072 x 2048, and o_proj, 2048 x 2048): 4-row items
     * would fill fewer 8-warp blocks than there are SMs (96 and 64 of 132), so an item is one
     * row (cuda_gemv_short_rows), read in one round of 8 loads per lane: 3072 and 2048 warps,
     * all resident at once. H200, 1B BF16 tg128 (cairn bench -p 512 -n 128 --reps 3, one
     * call, two passes): 1-row items 1,003.6 / 1,010.9 tok/s, 2-row 989.4 / 1,011.9, 4-row
     * 968.6 / 952.0. */
    int short_r = !SILU && n <= 1 && !long_rows && !few && rows < (int64_t)4 * CUDA_GEMV_WARPS * (n_sms > 0 ? n_sms : 1)
                      ? cuda_gemv_short_rows()
                      : 4;
    if constexpr (SILU) {
        if (n <= 1 && long_rows) cuda_gemv_go<K, 1, 2, 2 * CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 1) cuda_gemv_go<K, 1, 4, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 2) cuda_gemv_go<K, 2, 4, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 4) cuda_gemv_go<K, 4, 2, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else cuda_gemv_go<K, 8, 2, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
    } else {
        if (n <= 1 && few) {
            if constexpr (FEW_OK) cuda_gemv_go<K, 1, 1, 2 * CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        } else if (n <= 1 && long_rows) cuda_gemv_go<K, 1, 1, 4 * CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 1 && short_r == 2) cuda_gemv_go<K, 1, 2, 2 * CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 1 && short_r == 1) cuda_gemv_go<K, 1, 1, 2 * CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 1) cuda_gemv_go<K, 1, 4, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 2) cuda_gemv_go<K, 2, 4, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else if (n <= 4) cuda_gemv_go<K, 4, 2, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
        else cuda_gemv_go<K, 8, 2, CUDA_GEMV_U, F>(s, set, x, n, n_sms);
    }
}

template <int BITS, int NT, int R, int THREADS, int F, bool PIPE>
static void cuda_gemvq_go(cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n, int n_sms)
{
    constexpr int WARPS = THREADS / CUDA_WARP;
    void (*kern)(struct cuda_gemv_set, const float *, int);
    if constexpr (PIPE) kern = cuda_gemvq_pipe_kernel<BITS, NT, R, THREADS, F>;
    else kern = cuda_gemvq_kernel<BITS, NT, R, THREADS, F>;
    int64_t items = cuda_gemv_items<R, F>(set);
    size_t smem = (size_t)n * cuda_gemvq_row_bytes(BITS, set->w[0].cols, F & CUDA_GEMV_F_NORM);
    /* Blocks per SM by registers (asked once per kernel, which may then take up to
     * CUDA_GEMVQ_SMEM_MAX of shared memory), and by this launch's shared memory. */
    static int per_sm = 0, smem_sm = 0;
    int ps = __atomic_load_n(&per_sm, __ATOMIC_RELAXED);
    if (!ps) {
        int dev = 0, v = 0;
        if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, CUDA_GEMVQ_SMEM_MAX) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, kern, THREADS, 0) != cudaSuccess ||
            cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess)
            (void)cudaGetLastError();
        ps = ps < 1 ? 1 : ps > CUDA_GEMV_BLOCKS_PER_SM ? CUDA_GEMV_BLOCKS_PER_SM : ps;
        __atomic_store_n(&smem_sm, v > 0 ? v : CUDA_GEMVQ_SMEM_MAX, __ATOMIC_RELAXED);
        __atomic_store_n(&per_sm, ps, __ATOMIC_RELAXED);
    }
    int by_smem = (int)((size_t)__atomic_load_n(&smem_sm, __ATOMIC_RELAXED) / (smem + 1024)); /* 1 KiB reserved per block */
    ps = by_smem < 1 ? 1 : by_smem < ps ? by_smem : ps;
    int64_t blocks = (items + WARPS - 1) / WARPS;
    int64_t cap = (int64_t)(n_sms > 0 ? n_sms : 1) * ps;
    blocks = blocks < 1 ? 1 : blocks > cap ? cap : blocks;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = cuda_pdl_enabled();
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, kern, *set, x, n);
}

template <int BITS, int F>
static void cuda_gemvq_rows(cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n, int n_sms)
{
    constexpr int T = CUDA_GEMVQ_THREADS;
    if (n <= 1 && cuda_gemvq_old()) cuda_gemvq_go<BITS, 1, 4, T, F, false>(s, set, x, n, n_sms);
    else if (n <= 1) cuda_gemvq_go<BITS, 1, 2, T, F, true>(s, set, x, n, n_sms);
    else if (n <= 2) cuda_gemvq_go<BITS, 2, 2, T, F, false>(s, set, x, n, n_sms);
    else if (n <= 4) cuda_gemvq_go<BITS, 4, 2, T, F, false>(s, set, x, n, n_sms);
    else cuda_gemvq_go<BITS, 8, 2, T, F, false>(s, set, x, n, n_sms);
}

/* The q4/q8 integer kernel over n rows of x, as many per launch as CUDA_GEMVQ_SMEM_MAX holds
 * (each launch streams the weights once; a row's values do not depend on the split). */
template <int BITS, int F>
static void cuda_gemvq_launch(cudaStream_t s, const struct cuda_gemv_set *set, const float *x, int n, int n_sms)
{
    const int64_t cols = set->w[0].cols;
    int nt = (int)(CUDA_GEMVQ_SMEM_MAX / cuda_gemvq_row_bytes(BITS, cols, F & CUDA_GEMV_F_NORM));
    nt = nt < 1 ? 1 : nt > n ? n : nt;
    for (int t0 = 0; t0 < n; t0 += nt) {
        int m = n - t0 < nt ? n - t0 : nt;
        struct cuda_gemv_set part = *set;
        for (int i = 0; i < part.count; i++) part.y[i] = set->y[i] + (int64_t)t0 * set->w[i].rows;
        cuda_gemvq_rows<BITS, F>(s, &part, x + (int64_t)t0 * cols, m, n_sms);
    }
}

static void cuda_gemv_kind_launch(int kind, cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n,
                                  int n_sms)
{
    switch (kind) {
    case GEMV_F32: cuda_gemv_launch<GEMV_F32, 0>(s, set, x, n, n_sms); break;
    case GEMV_F16: cuda_gemv_launch<GEMV_F16, 0>(s, set, x, n, n_sms); break;
    case GEMV_BF16: cuda_gemv_launch<GEMV_BF16, 0>(s, set, x, n, n_sms); break;
    case GEMV_Q4: cuda_gemvq_launch<4, 0>(s, set, x, n, n_sms); break;
    default: cuda_gemvq_launch<8, 0>(s, set, x, n, n_sms); break;
    }
}

static void cuda_gemv_scalar(cudaStream_t s, const struct cuda_wdesc *w, const float *x, float *y, int n,
                             int acc)
{
    unsigned blocks = cuda_blocks_for(w->rows, CUDA_GEMV_WARPS);
    if (n <= 1) cuda_gemv_scalar_kernel<1><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n, acc);
    else if (n <= 2) cuda_gemv_scalar_kernel<2><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n, acc);
    else if (n <= 4) cuda_gemv_scalar_kernel<4><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n, acc);
    else cuda_gemv_scalar_kernel<8><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n, acc);
}

/* Whether weights a and b can share one vector launch. */
static bool cuda_gemv_same_layout(const struct cuda_wdesc *a, const struct cuda_wdesc *b)
{
    return a->type == b->type && a->cols == b->cols &&
           (a->type != CUDA_W_Q || (a->bits == b->bits && a->group_size == b->group_size));
}

/* The vector kernels' set for count weights, or false where they cannot take them (the scalar
 * kernel's layouts, mixed layouts, a staged q row over CUDA_GEMVQ_SMEM_MAX, misalignment). */
static bool cuda_gemv_set_of(const struct cuda_wdesc *w, float *const *y, int count, const float *x, bool norm,
                             int *kind, struct cuda_gemv_set *set)
{
    int elems = 0;
    *kind = cuda_gemv_kind_of(&w[0], &elems);
    bool vec = *kind >= 0 && w[0].cols % elems == 0 && (uintptr_t)x % 16 == 0;
    if (vec && (*kind == GEMV_Q4 || *kind == GEMV_Q8)) /* one x row must fit in shared memory */
        vec = cuda_gemvq_row_bytes(w[0].bits, w[0].cols, norm) <= CUDA_GEMVQ_SMEM_MAX;
    for (int i = 0; i < count && vec; i++)
        vec = cuda_gemv_same_layout(&w[0], &w[i]) && w[i].row_bytes % 16 == 0 && (uintptr_t)w[i].data % 16 == 0;
    if (!vec) return false;
    memset(set, 0, sizeof(*set));
    for (int i = 0; i < count; i++) {
        if (w[i].rows <= 0) continue;
        set->w[set->count] = w[i];
        set->y[set->count] = y[i];
        set->count++;
    }
    return true;
}

extern "C" int cuda_k_gemv_multi(cudaStream_t s, const struct cuda_wdesc *w, float *const *y,
                                 int count, const float *x, int n, int n_sms, int accumulate)
{
    if (n <= 0 || count <= 0) return (int)cudaGetLastError();
    if (n > CUDA_GEMV_MAX_N || count > CUDA_GEMV_MAX_W) return (int)cudaErrorInvalidValue;
    struct cuda_gemv_set set;
    int kind = 0;
    if (!cuda_gemv_set_of(w, y, count, x, false, &kind, &set)) { /* one scalar launch per weight; a mixed set is split by the caller */
        for (int i = 0; i < count; i++)
            if (w[i].rows > 0) cuda_gemv_scalar(s, &w[i], x, y[i], n, accumulate);
        return (int)cudaGetLastError();
    }
    set.accumulate = accumulate;
    if (set.count) cuda_gemv_kind_launch(kind, s, &set, x, n, n_sms);
    return (int)cudaGetLastError();
}

/* The fused kernels compiled: BF16 and MLX q4/q8 weights (the models decode runs on), the norm
 * alone (q/k/v, lm_head) or the norm with SwiGLU (gate/up). Each variant is a kernel per launch
 * shape, and the binary carries them all: other weight types and SwiGLU without the norm take
 * the plain ops. */
static bool cuda_gemv_fused_has(int kind, bool norm)
{
    return norm && (kind == GEMV_BF16 || kind == GEMV_Q4 || kind == GEMV_Q8);
}

static void cuda_gemv_fused_launch(int kind, cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n,
                                   int n_sms, int silu)
{
    constexpr int F = CUDA_GEMV_F_NORM, FS = CUDA_GEMV_F_NORM | CUDA_GEMV_F_SILU;
    switch (kind) {
    case GEMV_BF16:
        if (silu) cuda_gemv_launch<GEMV_BF16, FS>(s, set, x, n, n_sms);
        else cuda_gemv_launch<GEMV_BF16, F>(s, set, x, n, n_sms);
        break;
    case GEMV_Q4:
        if (silu) cuda_gemvq_launch<4, FS>(s, set, x, n, n_sms);
        else cuda_gemvq_launch<4, F>(s, set, x, n, n_sms);
        break;
    default:
        if (silu) cuda_gemvq_launch<8, FS>(s, set, x, n, n_sms);
        else cuda_gemvq_launch<8, F>(s, set, x, n, n_sms);
        break;
    }
}

extern "C" int cuda_k_gemv_fused(cudaStream_t s, const struct cuda_wdesc *w, float *const *y, int count,
                                 const float *x, int n, int n_sms, const float *norm, float eps, float w_offset,
                                 int silu)
{
    if (n <= 0 || count <= 0 || n > CUDA_GEMV_MAX_N || count > CUDA_GEMV_MAX_W || (!norm && !silu))
        return CUDA_GEMV_UNFUSED;
    if (norm && (uintptr_t)norm % 16 != 0) return CUDA_GEMV_UNFUSED;
    if (silu && (count != 2 || w[0].rows != w[1].rows || w[0].rows <= 0)) return CUDA_GEMV_UNFUSED;
    struct cuda_gemv_set set;
    int kind = 0;
    if (!cuda_gemv_set_of(w, y, count, x, norm != NULL, &kind, &set) || !cuda_gemv_fused_has(kind, norm != NULL))
        return CUDA_GEMV_UNFUSED;
    if (!set.count) return (int)cudaGetLastError();
    set.norm = norm;
    set.eps = eps;
    set.w_offset = w_offset;
    cuda_gemv_fused_launch(kind, s, &set, x, n, n_sms, silu);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_gemv(cudaStream_t s, const struct cuda_wdesc *w, const float *x, float *y, int n,
                           int n_sms, int accumulate)
{
    return cuda_k_gemv_multi(s, w, &y, 1, x, n, n_sms, accumulate);
}

extern "C" int cuda_k_gemv_fusable(const struct cuda_wdesc *a, const struct cuda_wdesc *b)
{
    return cuda_gemv_same_layout(a, b);
}

/* ---- conversions for the GEMM inputs ---- */

static __global__ void cuda_to_bf16_kernel(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = cuda_f32_bf16(src[i]);
}

static __global__ void cuda_to_f16_kernel(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = cuda_f32_f16(src[i]);
}

static __global__ void cuda_dequant_bf16_kernel(struct cuda_wdesc w, uint16_t *dst)
{
    int64_t n = w.rows * w.cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / w.cols;
        dst[i] = cuda_f32_bf16(cuda_w_elem(w, (const uint8_t *)w.data + (size_t)r * w.row_bytes, i % w.cols));
    }
}

extern "C" int cuda_k_f32_to_bf16(cudaStream_t s, uint16_t *dst, const float *src, int64_t n)
{
    if (n > 0) cuda_to_bf16_kernel<<<cuda_blocks_for(n, CUDA_CONV_THREADS), CUDA_CONV_THREADS, 0, s>>>(dst, src, n);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_f32_to_f16(cudaStream_t s, uint16_t *dst, const float *src, int64_t n)
{
    if (n > 0) cuda_to_f16_kernel<<<cuda_blocks_for(n, CUDA_CONV_THREADS), CUDA_CONV_THREADS, 0, s>>>(dst, src, n);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_dequant_bf16(cudaStream_t s, const struct cuda_wdesc *w, uint16_t *dst)
{
    int64_t n = w->rows * w->cols;
    if (n > 0)
        cuda_dequant_bf16_kernel<<<cuda_blocks_for(n, CUDA_CONV_THREADS), CUDA_CONV_THREADS, 0, s>>>(*w, dst);
    return (int)cudaGetLastError();
}
