/* Matmul kernels other than cuBLASLt: the decode GEMV, activation conversion for the GEMM
 * inputs, and the dequantization of MLX weights to bf16 for the GEMM.
 *
 * GEMV: y_i[n, rows_i] = x[n, cols] . W_i[rows_i, cols]^T for n in 1..CUDA_GEMV_MAX_N and up to
 * CUDA_GEMV_MAX_W weights of one layout that read the same x (q/k/v, gate/up: one launch).
 *   Work item: R consecutive rows of one weight (R = 4 for n = 1 and dense n = 2, but 2 for q8
 *   at n = 1 (cuda_gemv_q_rows), else 2; dense n = 1 over few long rows: 1 row with twice the
 *   loads in flight), taken by one warp;
 *   the warps of a persistent grid (the blocks that fit on the SMs at once) walk the items
 *   grid-stride. Each lane streams 16-byte chunks of the R rows (8 bf16/f16, 4 f32, 32 q4 or 16 q8 codes, so a
 *   quantized chunk always lies in one group: group sizes are multiples of 32) with
 *   non-caching loads, CUDA_GEMV_U chunks of each row issued before any is used: R * U
 *   independent 16-byte loads in flight per lane (16 for n <= 2), which is what keeps HBM busy
 *   (Little's law: ~2.5 MB in flight over the GPU at ~4 TB/s). The activation values of a chunk
 *   are read once (from L1: x is n * cols * 4 bytes, read by every warp) and used for all R
 *   rows. Quantized chunks are dequantized in registers: s * sum(code * x) + b * sum(x), with
 *   each group's scale and bias read once per chunk, and each code q made the exact float
 *   1 + q / 2^bits by a shift and one lop3 (cuda_gemv_code; sum(code * x) is recovered from
 *   sum((1 + q / 2^bits) x) - sum(x)): one fma and two integer ops per code instead of three
 *   (the 2^23 magic number needed a subtraction per code). It did not show in the H200's
 *   timings: the q kernels are latency-bound, not issue-bound (ncu, 4096-row q4 weights: 8
 *   warps per SM, 0.35 instructions issued per scheduler cycle, mostly waiting on L1), at
 *   18-40 % of the copy bandwidth for q4 and 40-74 % for q8.
 *   accumulate: y += the product, read and written by the lane that owns the element (the
 *   residual adds of o_proj and down_proj, matmul_add).
 *   Launched with programmatic dependent launch (cuda_common.cuh): the grid may start while
 *   the kernel before it (an RMSNorm, SiLU, attention) still runs, and each warp issues its
 *   first R * U weight loads before it waits for that kernel's x.
 *   Bytes per call: the weights once (rows * row_bytes) + x + y; bound by HBM bandwidth.
 *   Accumulation in f32, one accumulator per (row, activation row) and lane, summed across the
 *   warp with shuffles at the end of the item.
 *   Rows whose chunks would not be 16-byte aligned (cols not a multiple of the chunk, an
 *   activation pointer not 16-byte aligned, or q2/q3/q5/q6) take the scalar kernel, which reads
 *   element by element with cuda_w_elem: correct for every layout, not fast.
 * Conversions: f32 -> bf16/f16 one element per thread (4 bytes in, 2 out per element).
 * Dequant: one element per thread, rows * cols * 2 bytes written; a q4 8B model's prefill pays
 *   it once per matmul per step, which the GEMM's n * 2 * rows * cols FLOPs dwarf at n >= 64.
 * CPU reference: ref_matmul in cpu/ref_ops.c (double accumulation). */
#include <stdlib.h>

#include "cuda/cuda_common.cuh"

#define CUDA_GEMV_THREADS 256 /* 8 warps per block */
#define CUDA_GEMV_WARPS (CUDA_GEMV_THREADS / CUDA_WARP)
#define CUDA_GEMV_U 4              /* chunks of each row a lane loads before using them */
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
template <> struct cuda_gemv_chunk<GEMV_Q4> { static constexpr int elems = 32; };
template <> struct cuda_gemv_chunk<GEMV_Q8> { static constexpr int elems = 16; };

/* The weights of one launch: same type, cols and (for Q) bits and group size. */
struct cuda_gemv_set {
    struct cuda_wdesc w[CUDA_GEMV_MAX_W];
    float *y[CUDA_GEMV_MAX_W];
    int64_t item_end[CUDA_GEMV_MAX_W]; /* cumulative items (R-row groups) up to weight i */
    int count;
    int accumulate; /* y += x . W^T (each y element is read and written by one lane) */
};

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

/* Code j (0..PER_WORD-1) of a word, q, as the exact float 1 + q / 2^BITS: the code shifted to
 * the top of the mantissa and or'ed with the exponent of 1.0 (a shift and one lop3), with no
 * conversion and no subtraction per code. The caller forms sum(q * x) from
 * sum((1 + q / 2^BITS) * x) - sum(x), times 2^BITS (exact). Accuracy: the f32 sum now carries
 * the sum(x) term too, so its rounding error is a few times larger relative to sum(q * x)
 * (both terms are of one magnitude as 1 + q / 2^BITS lies in [1, 2)): about 2^-21 of it,
 * against 2^-8 for the bf16 weights of a BF16 model. */
template <int BITS> static __device__ __forceinline__ float cuda_gemv_code(uint32_t word, int j)
{
    constexpr int TOP = 23 - BITS; /* the code's lowest bit in 1.0's mantissa */
    const int at = BITS * j;
    uint32_t m = at <= TOP ? word << (TOP - at) : word >> (at - TOP);
    return __uint_as_float((m & (((1u << BITS) - 1) << TOP)) | 0x3F800000u);
}

/* acc[j][t] += chunk_j . x[t][i .. i + E) for the R rows j and t < n (NT: bound on n). */
template <int K, int NT, int R>
static __device__ __forceinline__ void cuda_gemv_chunk_dot(const uint4 *c, const uint8_t *const *row,
                                                           int64_t i, const struct cuda_wdesc &w,
                                                           const float *__restrict__ x, int n,
                                                           float (*acc)[NT])
{
    constexpr int E = cuda_gemv_chunk<K>::elems;
    if (K == GEMV_F32 || K == GEMV_F16 || K == GEMV_BF16) {
        float wv[R][E];
#pragma unroll
        for (int j = 0; j < R; j++) cuda_gemv_widen<K>(c[j], wv[j]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + (int64_t)t * w.cols + i);
            float xv[E];
#pragma unroll
            for (int q = 0; q < E / 4; q++) {
                float4 v = __ldg(xp + q);
                xv[4 * q] = v.x;
                xv[4 * q + 1] = v.y;
                xv[4 * q + 2] = v.z;
                xv[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < R; j++) {
                float s = 0;
#pragma unroll
                for (int e = 0; e < E; e++) s = fmaf(wv[j][e], xv[e], s);
                acc[j][t] += s;
            }
        }
    } else {
        constexpr int BITS = K == GEMV_Q4 ? 4 : 8, PER_WORD = 32 / BITS;
        int64_t g = i / w.group_size;
        float scale[R], bias[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
            const uint16_t *sc = (const uint16_t *)(row[j] + cuda_q_scales_off(w.cols, BITS));
            const uint16_t *bi = (const uint16_t *)(row[j] + cuda_q_biases_off(w.cols, BITS, w.group_size));
            scale[j] = cuda_bf16_f32(__ldg(sc + g));
            bias[j] = cuda_bf16_f32(__ldg(bi + g));
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + (int64_t)t * w.cols + i);
            float cx[R], xs = 0; /* sum (1 + code / 2^BITS) * x per row, sum x */
#pragma unroll
            for (int j = 0; j < R; j++) cx[j] = 0;
#pragma unroll
            for (int q = 0; q < 4; q++) { /* word q of the chunk: PER_WORD codes */
#pragma unroll
                for (int h = 0; h < PER_WORD / 4; h++) {
                    float4 v = __ldg(xp + q * (PER_WORD / 4) + h);
                    xs += (v.x + v.y) + (v.z + v.w);
#pragma unroll
                    for (int j = 0; j < R; j++) {
                        uint32_t word = q == 0 ? c[j].x : q == 1 ? c[j].y : q == 2 ? c[j].z : c[j].w;
                        cx[j] = fmaf(cuda_gemv_code<BITS>(word, 4 * h), v.x, cx[j]);
                        cx[j] = fmaf(cuda_gemv_code<BITS>(word, 4 * h + 1), v.y, cx[j]);
                        cx[j] = fmaf(cuda_gemv_code<BITS>(word, 4 * h + 2), v.z, cx[j]);
                        cx[j] = fmaf(cuda_gemv_code<BITS>(word, 4 * h + 3), v.w, cx[j]);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < R; j++) /* sum(q * x) = 2^BITS (sum((1 + q / 2^BITS) x) - sum(x)) */
                acc[j][t] += scale[j] * ((cx[j] - xs) * (float)(1 << BITS)) + bias[j] * xs;
        }
    }
}

template <int K, int NT, int R, int U>
static __global__ void __launch_bounds__(CUDA_GEMV_THREADS)
cuda_gemv_kernel(struct cuda_gemv_set set, const float *__restrict__ x, int n)
{
    constexpr int E = cuda_gemv_chunk<K>::elems;
    int lane = threadIdx.x % CUDA_WARP;
    const int64_t n_items = set.item_end[set.count - 1];
    const int64_t n_chunks = set.w[0].cols / E;
    bool waited = false; /* PDL: the first weight loads go out before the wait (cuda_common.cuh) */
    cuda_pdl_trigger();
    for (int64_t it = (int64_t)blockIdx.x * CUDA_GEMV_WARPS + threadIdx.x / CUDA_WARP; it < n_items;
         it += (int64_t)gridDim.x * CUDA_GEMV_WARPS) {
        int wi = 0;
        while (it >= set.item_end[wi]) wi++;
        const struct cuda_wdesc &w = set.w[wi];
        int64_t r0 = (it - (wi ? set.item_end[wi - 1] : 0)) * R;
        const uint8_t *row[R];
#pragma unroll
        for (int j = 0; j < R; j++) /* rows past the end re-read the last row, never written */
            row[j] = (const uint8_t *)w.data + (size_t)min(r0 + j, w.rows - 1) * w.row_bytes;
        float acc[R][NT];
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[j][t] = 0;
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
                if (ci < n_chunks) cuda_gemv_chunk_dot<K, NT, R>(cv[u], row, ci * E, w, x, n, acc);
            }
        }
        float *y = set.y[wi];
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = cuda_warp_sum(acc[j][t]);
                if (lane == 0 && t < n && r0 + j < w.rows) {
                    float *o = y + (int64_t)t * w.rows + r0 + j;
                    *o = set.accumulate ? *o + v : v;
                }
            }
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

template <int K, int NT, int R, int U>
static void cuda_gemv_go(cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n, int n_sms)
{
    int64_t items = 0;
    for (int i = 0; i < set->count; i++) {
        items += (set->w[i].rows + R - 1) / R;
        set->item_end[i] = items;
    }
    /* Blocks resident per SM at this kernel's register count, asked once per kernel. */
    static int per_sm = 0;
    int ps = __atomic_load_n(&per_sm, __ATOMIC_RELAXED);
    if (!ps) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, cuda_gemv_kernel<K, NT, R, U>,
                                                          CUDA_GEMV_THREADS, 0) != cudaSuccess)
            (void)cudaGetLastError();
        ps = ps < 1 ? 1 : ps > CUDA_GEMV_BLOCKS_PER_SM ? CUDA_GEMV_BLOCKS_PER_SM : ps;
        __atomic_store_n(&per_sm, ps, __ATOMIC_RELAXED);
    }
    int64_t blocks = (items + CUDA_GEMV_WARPS - 1) / CUDA_GEMV_WARPS;
    int64_t cap = (int64_t)(n_sms > 0 ? n_sms : 1) * ps;
    blocks = blocks < 1 ? 1 : blocks > cap ? cap : blocks;
    (void)cuda_launch_pdl(cuda_gemv_kernel<K, NT, R, U>, (unsigned)blocks, CUDA_GEMV_THREADS, s, *set, x, n);
}

/* Rows per work item of the q4/q8 kernels at n = 1 (bits: 4 or 8): q8 2, q4 4;
 * CAIRN_CUDA_GEMV_QROWS=1|2|4 sets both, to compare. Why: 4-row items leave 4096-row weights
 * with 8 warps per SM (H200, ncu: 2 warps per scheduler, 0.35 instructions issued per cycle,
 * mostly waiting on L1); 2-row items double the warps. On the H200 that paid for q8 (8B tg128
 * 194 -> 199 tok/s with the fused ops) but not for q4, whose 2-row GEMVs were slower on every
 * 8B shape (4096 x 4096: 16.3 us against 12.4; 8B tg128 162 tok/s), so q4 keeps 4. */
static int cuda_gemv_q_rows(int bits)
{
    static int rows = -1; /* 0: the defaults */
    int r = __atomic_load_n(&rows, __ATOMIC_RELAXED);
    if (r < 0) {
        const char *e = getenv("CAIRN_CUDA_GEMV_QROWS");
        r = e && (atoi(e) == 1 || atoi(e) == 2 || atoi(e) == 4) ? atoi(e) : 0;
        __atomic_store_n(&rows, r, __ATOMIC_RELAXED);
    }
    return r ? r : bits == 8 ? 2 : 4;
}

template <int K>
static void cuda_gemv_launch(cudaStream_t s, struct cuda_gemv_set *set, const float *x, int n, int n_sms)
{
    constexpr bool Q = K == GEMV_Q4 || K == GEMV_Q8;
    constexpr int R2 = Q ? 2 : 4; /* n = 2: the q kernels spill at R = 4 */
    int64_t rows = 0;
    for (int i = 0; i < set->count; i++) rows += set->w[i].rows;
    /* Few long rows (the 1B's down_proj, 2048 x 8192): a row per warp with twice the loads, so
     * that the grid still fills the SMs several times (H200: 10.0 us instead of 13.2 there;
     * no gain on 2048 x 2048 or 4096-row shapes, and a loss for q kernels, which stay at R = 4). */
    bool few = !Q && rows < (int64_t)4 * CUDA_GEMV_FILL_BLOCKS * (n_sms > 0 ? n_sms : 1) &&
               set->w[0].cols >= CUDA_GEMV_FEW_MIN_COLS;
    if (n <= 1 && few) cuda_gemv_go<K, 1, 1, 2 * CUDA_GEMV_U>(s, set, x, n, n_sms);
    else if (n <= 1 && Q && cuda_gemv_q_rows(K == GEMV_Q8 ? 8 : 4) == 1)
        cuda_gemv_go<K, 1, 1, CUDA_GEMV_U>(s, set, x, n, n_sms);
    else if (n <= 1 && Q && cuda_gemv_q_rows(K == GEMV_Q8 ? 8 : 4) == 2)
        cuda_gemv_go<K, 1, 2, CUDA_GEMV_U>(s, set, x, n, n_sms);
    else if (n <= 1) cuda_gemv_go<K, 1, 4, CUDA_GEMV_U>(s, set, x, n, n_sms);
    else if (n <= 2) cuda_gemv_go<K, 2, R2, CUDA_GEMV_U>(s, set, x, n, n_sms);
    else if (n <= 4) cuda_gemv_go<K, 4, 2, CUDA_GEMV_U>(s, set, x, n, n_sms);
    else cuda_gemv_go<K, 8, 2, CUDA_GEMV_U>(s, set, x, n, n_sms);
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

extern "C" int cuda_k_gemv_multi(cudaStream_t s, const struct cuda_wdesc *w, float *const *y,
                                 int count, const float *x, int n, int n_sms, int accumulate)
{
    if (n <= 0 || count <= 0) return (int)cudaGetLastError();
    if (n > CUDA_GEMV_MAX_N || count > CUDA_GEMV_MAX_W) return (int)cudaErrorInvalidValue;
    struct cuda_gemv_set set;
    int elems = 0, kind = cuda_gemv_kind_of(&w[0], &elems);
    bool vec = kind >= 0 && w[0].cols % elems == 0 && (uintptr_t)x % 16 == 0;
    for (int i = 0; i < count && vec; i++)
        vec = cuda_gemv_same_layout(&w[0], &w[i]) && w[i].row_bytes % 16 == 0 &&
              (uintptr_t)w[i].data % 16 == 0;
    if (!vec) { /* one scalar launch per weight; a mixed set is split by the caller */
        for (int i = 0; i < count; i++)
            if (w[i].rows > 0) cuda_gemv_scalar(s, &w[i], x, y[i], n, accumulate);
        return (int)cudaGetLastError();
    }
    set.count = 0;
    set.accumulate = accumulate;
    for (int i = 0; i < count; i++) {
        if (w[i].rows <= 0) continue;
        set.w[set.count] = w[i];
        set.y[set.count] = y[i];
        set.count++;
    }
    if (!set.count) return (int)cudaGetLastError();
    switch (kind) {
    case GEMV_F32: cuda_gemv_launch<GEMV_F32>(s, &set, x, n, n_sms); break;
    case GEMV_F16: cuda_gemv_launch<GEMV_F16>(s, &set, x, n, n_sms); break;
    case GEMV_BF16: cuda_gemv_launch<GEMV_BF16>(s, &set, x, n, n_sms); break;
    case GEMV_Q4: cuda_gemv_launch<GEMV_Q4>(s, &set, x, n, n_sms); break;
    default: cuda_gemv_launch<GEMV_Q8>(s, &set, x, n, n_sms); break;
    }
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
