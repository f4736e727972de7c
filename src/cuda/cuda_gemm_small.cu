/* The small-batch matmul on tensor cores: y_i[n, rows_i] = x[n, cols] . W_i[rows_i, cols]^T for
 * n in 1..CUDA_MMA_MAX_N (16) token rows and up to CUDA_GEMV_MAX_W dense BF16 or F16 weights of
 * one layout that read the same x (q/k/v, gate/up: one launch), for decode steps of many
 * streams and speculative verify chunks.
 *
 * Why: the GEMV (cuda_gemv.cu) is built for one row and turns compute-bound at 8 (the 8B BF16:
 * 17.6 ms per step at 8 rows against 5.4 at one). Here W is the M side of mma.sync m16n8k16
 * (bf16 or f16 inputs, f32 accumulation) and x the N side (one 8-column tile for n <= 8, two
 * for n <= 16), so the products cost next to nothing and the kernel streams W at copy speed
 * for any n up to 16.
 *
 * Layout: a block of W warps owns an item of 16 * MT rows of one weight (MT = 1, or 2 with
 * SwiGLU: 16 rows of gate and the same 16 of up); its warps split the columns in W contiguous
 * ranges of 32-column chunks (warp w: chunks [C w / W, C (w + 1) / W), C = cols / 32). W = 8
 * (narrow, 2 blocks per SM), or W = 16 (wide, 1 per SM) when the launch has fewer items than
 * the GPU has SMs: narrow blocks would leave every SM with one block or none there (the 1B's
 * down_proj, 2048 x 8192: 128 items; session 11's ncu: 17.7 us for 33.5 MB, 8.1 us at copy
 * speed), wide ones keep 16 warps' loads in flight on each SM that has an item (H200 ncu,
 * that shape: 14.9 us; 1B tg128 965-982 tok/s against 922). Launches of 256-384 items (the
 * 8B's q/k/v, o_proj, down_proj) lost with wide blocks (8B tg128 204 against 207), so they
 * stay narrow. CAIRN_CUDA_MMA_WIDE=K: wide below K * n_sms items (default 1; 0: never). A lane
 * (group g = lane / 4, t = lane % 4) loads 16 bytes (8 values) of rows g and g + 8 of a chunk
 * with non-caching loads straight into its A fragments: values 8t..8t+7 of the chunk, so the
 * fragment's k order is permuted within the chunk (first MMA: values 8t + 0,1 | 8t + 2,3,
 * second: 8t + 4,5 | 8t + 6,7), and its B fragment takes x's row g at the same 8 columns (two
 * float4 loads from L1/L2, rounded to bf16/f16 as the cuBLAS path rounds them), so the
 * permutation cancels. The grid is persistent (16 warps per SM, the register bound: ~125 per
 * thread) and walks the items grid-stride. A lane keeps two stages of U
 * chunks in registers (8 loads of 16 bytes each, U = 4 / MT) and loads the next stage while it
 * multiplies the current one (software pipeline: 8 to 16 loads in flight per lane all along;
 * CAIRN_CUDA_MMA_PIPE=0 loads both stages, then multiplies both, narrow blocks, for
 * comparison), and the next item's first two stages are loaded before this item's reduction,
 * so the loads do not stop between items. Before its first x read the kernel waits for its predecessor (programmatic
 * dependent launch: the first weight loads overlap the previous kernel's tail).
 * Reduction: each warp's accumulators go to shared memory and are summed in warp order 0..W-1
 * by the block, then the epilogue: y = s, y += s (accumulate: the residual add of o_proj and
 * down_proj) or y[0] = silu(gate) * up (the silu_mul kernel's formula; y[1] not written).
 * Batch invariance: the column split and the chunk order depend on cols and W alone, W on the
 * launch's weights (their items against the SM count), never on n, and an MMA's output column
 * depends only on its own B column, so a row's result is the same bits for every n in 1..16,
 * with or without other weights in the launch while W stays the same, grid size and
 * pipelining (test_cuda_ops checks it). Weights that take a launch across n_sms items change W
 * and so the bits; the model's launches are fixed (q/k/v always together, gate/up likewise).
 * Rows past a weight's last are loaded from its last row and not stored; x rows past n read
 * row n - 1 and are not stored.
 * Bytes per call: W once (rows * cols * 2) + x per item (n * cols * 4, mostly from L1/L2) + y:
 * bound by HBM bandwidth. Measured (H200, test_cuda_ops --bench-mma, % of the copy bandwidth;
 * the GEMV's at n = 1 and 8 in parentheses, cuBLASLt's at 16): 4096 x 4096 n = 1 10.0 us 79 %
 * (11.8), n = 8 11.3 us (32.8), n = 16 13.9 us (13.4); 14336 x 4096 33.9 (31.4), 40.0 (91.7),
 * 47.4 (36.1); 4096 x 14336 33.0 (39.1), 35.0 (108.1), 39.8 (37.4); 128256 x 4096 256 us 97 %
 * (238), 277 (597), 328 (260); gate/up with SwiGLU (2 x 14336 x 4096) 65.1 (65.1), 65.5
 * (159.9), 84.0 (74.0). Two x tiles (n > 8) cost 15-25 % on the long shapes: twice the x
 * loads and products per chunk. The unpipelined order: 2-5 % slower.
 * Not taken (CUDA_MMA_NO, the caller keeps the GEMV or cuBLASLt): other weight types, cols not
 * a multiple of 32, W or x not 16-byte aligned, mixed layouts, n outside 1..16.
 * CPU reference: ref_matmul in cpu/ref_ops.c. */
#include <string.h>

#include "cuda/cuda_common.cuh"

#define CUDA_MMA_WARPS_NARROW 8 /* warps of a block (the column split): 2 blocks per SM */
#define CUDA_MMA_WARPS_WIDE 16  /* 1 block per SM, for launches of fewer items than SMs */
#define CUDA_MMA_WIDE_DEFAULT 1 /* wide below this * n_sms items (CAIRN_CUDA_MMA_WIDE) */
#define CUDA_MMA_CHUNK 32 /* columns per lane-quad load round: 16 bytes per lane and row */
#define CUDA_MMA_LOADS 8 /* 16-byte weight loads per lane and stage (U * MT * 2); two stages */
#define CUDA_MMA_SM_WARPS 16    /* register bound (~125 per thread): 16 warps per SM */

struct cuda_mma_set {
    const uint8_t *w[CUDA_GEMV_MAX_W];
    size_t row_bytes[CUDA_GEMV_MAX_W];
    int64_t rows[CUDA_GEMV_MAX_W];
    float *y[CUDA_GEMV_MAX_W];
    int64_t item_end[CUDA_GEMV_MAX_W]; /* cumulative items up to weight i (SwiGLU: of w[0]) */
    int count;                         /* weights (SwiGLU: 1 item list over gate and up) */
    int64_t cols;
    int accumulate;
};

static __device__ __forceinline__ uint4 cuda_mma_ld(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Two floats as a bf16x2 / f16x2 register (lo in the low half), round to nearest even. */
template <bool F16> static __device__ __forceinline__ uint32_t cuda_mma_pack(float lo, float hi)
{
    if (F16) return (uint32_t)cuda_f32_f16(lo) | ((uint32_t)cuda_f32_f16(hi) << 16);
    return (uint32_t)cuda_f32_bf16(lo) | ((uint32_t)cuda_f32_bf16(hi) << 16);
}

/* c[4] += A (16 x 16: a0 rows g k-slots 2t.., a1 rows g + 8, a2 / a3 k-slots 2t + 8..) . B. */
template <bool F16>
static __device__ __forceinline__ void cuda_mma_16816(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                      uint32_t b0, uint32_t b1)
{
    if (F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Stage load: chunks c .. c + U - 1 (those below c1) of rows g and g + 8 of each tile. */
template <int U, int MT>
static __device__ __forceinline__ void cuda_mma_load(uint4 (&w)[U][MT][2], const uint4 *const (&wp)[MT][2],
                                                     int64_t c, int64_t c1)
{
#pragma unroll
    for (int u = 0; u < U; u++)
        if (c + u < c1)
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) w[u][m][h] = cuda_mma_ld(wp[m][h] + (c + u) * 4);
}

/* Stage products: acc += W chunk . x chunk for chunks c .. c + U - 1 below c1, in order. */
template <bool F16, int NT, int U, int MT>
static __device__ __forceinline__ void cuda_mma_stage(float (&acc)[MT][NT][4], const uint4 (&w)[U][MT][2],
                                                      const float4 *const (&xp)[NT], int64_t c, int64_t c1)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (c + u >= c1) break;
        uint32_t xb[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            /* x: an earlier kernel's, never through the read-only path (cuda_common.cuh) */
            float4 v0 = cuda_ld_dep(xp[nt] + (c + u) * 8), v1 = cuda_ld_dep(xp[nt] + (c + u) * 8 + 1);
            xb[nt][0] = cuda_mma_pack<F16>(v0.x, v0.y);
            xb[nt][1] = cuda_mma_pack<F16>(v0.z, v0.w);
            xb[nt][2] = cuda_mma_pack<F16>(v1.x, v1.y);
            xb[nt][3] = cuda_mma_pack<F16>(v1.z, v1.w);
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 lo = w[u][m][0], hi = w[u][m][1];
                cuda_mma_16816<F16>(acc[m][nt], lo.x, hi.x, lo.y, hi.y, xb[nt][0], xb[nt][1]);
                cuda_mma_16816<F16>(acc[m][nt], lo.z, hi.z, lo.w, hi.w, xb[nt][2], xb[nt][3]);
            }
    }
}

/* An item's place: its weight, that weight's rows, its first row, and this lane's 16 bytes of
 * chunk 0 in rows g and g + 8 of each of its tiles (rows past the last read the last). */
template <int MT> struct cuda_mma_item {
    const uint4 *wp[MT][2];
    int64_t rows, row0;
    int wi;
};

template <int MT, bool SILU>
static __device__ __forceinline__ void cuda_mma_item_of(const struct cuda_mma_set &set, int64_t item, int g, int t,
                                                        struct cuda_mma_item<MT> *it)
{
    int wi = 0;
    while (wi + 1 < set.count && item >= set.item_end[wi]) wi++;
    it->wi = wi;
    it->rows = set.rows[wi];
    it->row0 = (item - (wi ? set.item_end[wi - 1] : 0)) * (SILU ? 16 : 16 * MT);
#pragma unroll
    for (int m = 0; m < MT; m++) {
        const uint8_t *base = set.w[SILU ? m : wi];
        size_t rb = set.row_bytes[SILU ? m : wi];
        int64_t r = it->row0 + (SILU ? 0 : 16 * m) + g;
        int64_t ra = r < it->rows ? r : it->rows - 1, rc = r + 8 < it->rows ? r + 8 : it->rows - 1;
        it->wp[m][0] = (const uint4 *)(base + (size_t)ra * rb) + t;
        it->wp[m][1] = (const uint4 *)(base + (size_t)rc * rb) + t;
    }
}

/* F16: f16 weights (else bf16); NT: 8-column tiles of x (n <= 8 * NT); MT: 16-row tiles per
 * item; SILU: MT == 2, tile 0 of gate (w[0]) and tile 1 of up (w[1]) at the same rows; WARPS:
 * the block's warps and column ranges (CUDA_MMA_WARPS_NARROW or _WIDE). */
template <bool F16, int NT, int MT, bool SILU, bool PIPE, int WARPS>
static __global__ void __launch_bounds__(WARPS *CUDA_WARP, CUDA_MMA_SM_WARPS / WARPS)
    cuda_mma_kernel(const struct cuda_mma_set set, const float *__restrict__ x, int n)
{
    constexpr int U = CUDA_MMA_LOADS / (MT * 2);
    constexpr int NJ = NT * 8;
    constexpr int THREADS = WARPS * CUDA_WARP;
    __shared__ float red[WARPS][MT][16][NJ];
    const int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP;
    const int g = lane / 4, t = lane % 4;
    const int64_t n_items = set.item_end[set.count - 1];
    const int64_t n_chunks = set.cols / CUDA_MMA_CHUNK;
    const int64_t c0 = n_chunks * warp / WARPS, c1 = n_chunks * (warp + 1) / WARPS;
    const float4 *xp[NT]; /* x row nt * 8 + g (clamped to n - 1), this lane's 8 values of chunk 0 */
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int xr = nt * 8 + g < n ? nt * 8 + g : n - 1;
        xp[nt] = (const float4 *)(x + (int64_t)xr * set.cols) + 2 * t;
    }

    /* two stages of U chunks in registers: PIPE loads stage b while stage a is multiplied
     * (8 to 16 loads in flight per lane all along); else both are loaded, then both used. The
     * grid is persistent: the next item's first two stages are loaded before this item's
     * reduction, so the loads never stop between items. */
    uint4 wa[U][MT][2], wb[U][MT][2];
    struct cuda_mma_item<MT> it, nx;
    int64_t item = blockIdx.x;
    if (item < n_items) {
        cuda_mma_item_of<MT, SILU>(set, item, g, t, &it);
        cuda_mma_load<U, MT>(wa, it.wp, c0, c1);
        cuda_mma_load<U, MT>(wb, it.wp, c0 + U, c1);
    }
    cuda_pdl_wait(); /* x (and y when accumulating) come from earlier kernels */
    cuda_pdl_trigger();
    for (; item < n_items; item += gridDim.x) {
        float acc[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int q = 0; q < 4; q++) acc[m][nt][q] = 0.0f;
        for (int64_t c = c0; c < c1; c += 2 * U) {
            if (!PIPE && c != c0) {
                cuda_mma_load<U, MT>(wa, it.wp, c, c1);
                cuda_mma_load<U, MT>(wb, it.wp, c + U, c1);
            }
            cuda_mma_stage<F16, NT, U, MT>(acc, wa, xp, c, c1);
            if (PIPE) cuda_mma_load<U, MT>(wa, it.wp, c + 2 * U, c1);
            cuda_mma_stage<F16, NT, U, MT>(acc, wb, xp, c + U, c1);
            if (PIPE) cuda_mma_load<U, MT>(wb, it.wp, c + 3 * U, c1);
        }
        const int64_t next = item + gridDim.x;
        if (next < n_items) {
            cuda_mma_item_of<MT, SILU>(set, next, g, t, &nx);
            cuda_mma_load<U, MT>(wa, nx.wp, c0, c1);
            cuda_mma_load<U, MT>(wb, nx.wp, c0 + U, c1);
        }

        /* C fragment: c0, c1 at (row g, columns 2t, 2t + 1), c2, c3 at row g + 8 */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int j = nt * 8 + 2 * t;
                red[warp][m][g][j] = acc[m][nt][0];
                red[warp][m][g][j + 1] = acc[m][nt][1];
                red[warp][m][g + 8][j] = acc[m][nt][2];
                red[warp][m][g + 8][j + 1] = acc[m][nt][3];
            }
        __syncthreads();
        constexpr int OUTS = (SILU ? 1 : MT) * 16 * NJ;
        for (int o = threadIdx.x; o < OUTS; o += THREADS) {
            const int j = o % NJ, r = (o / NJ) % 16, m = o / (NJ * 16);
            if (j >= n) continue;
            float sum = red[0][m][r][j];
#pragma unroll
            for (int w = 1; w < WARPS; w++) sum += red[w][m][r][j];
            if (SILU) {
                float u = red[0][1][r][j];
#pragma unroll
                for (int w = 1; w < WARPS; w++) u += red[w][1][r][j];
                const int64_t row = it.row0 + r;
                if (row < it.rows) set.y[0][(int64_t)j * it.rows + row] = sum / (1.0f + expf(-sum)) * u;
            } else {
                const int64_t row = it.row0 + 16 * m + r;
                float *yp = set.y[it.wi] + (int64_t)j * it.rows + row;
                if (row < it.rows) *yp = set.accumulate ? *yp + sum : sum;
            }
        }
        __syncthreads(); /* red is rewritten by the next item */
        it = nx;
    }
}

/* CAIRN_CUDA_MMA_PIPE=0: both stages loaded, then both used (16 loads a round), for
 * comparison with the default software pipeline; the same bits either way. */
static bool cuda_mma_pipe(void)
{
    static int on = -1;
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("CAIRN_CUDA_MMA_PIPE");
        v = !(e && e[0] == '0');
        __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    }
    return v != 0;
}

/* CAIRN_CUDA_MMA_WIDE=K: wide blocks for launches of fewer than K * n_sms items (default
 * CUDA_MMA_WIDE_DEFAULT; 0: never, for comparison). Read once. */
static int cuda_mma_wide_k(void)
{
    static int k = -1;
    int v = __atomic_load_n(&k, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("CAIRN_CUDA_MMA_WIDE");
        v = e && *e ? atoi(e) : CUDA_MMA_WIDE_DEFAULT;
        v = v < 0 ? 0 : v;
        __atomic_store_n(&k, v, __ATOMIC_RELAXED);
    }
    return v;
}

template <bool F16, int NT, int MT, bool SILU>
static void cuda_mma_go(cudaStream_t s, const struct cuda_mma_set *set, const float *x, int n, int n_sms)
{
    const int64_t items = set->item_end[set->count - 1], sms = n_sms > 0 ? n_sms : 1;
    const bool pipe = cuda_mma_pipe(), wide = pipe && items < (int64_t)cuda_mma_wide_k() * sms;
    const int warps = wide ? CUDA_MMA_WARPS_WIDE : CUDA_MMA_WARPS_NARROW;
    const int64_t cap = sms * (CUDA_MMA_SM_WARPS / warps);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = cuda_pdl_enabled();
    cfg.gridDim = dim3((unsigned)(items < cap ? items : cap));
    cfg.blockDim = dim3((unsigned)(warps * CUDA_WARP));
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (wide)
        (void)cudaLaunchKernelEx(&cfg, cuda_mma_kernel<F16, NT, MT, SILU, true, CUDA_MMA_WARPS_WIDE>, *set, x, n);
    else if (pipe)
        (void)cudaLaunchKernelEx(&cfg, cuda_mma_kernel<F16, NT, MT, SILU, true, CUDA_MMA_WARPS_NARROW>, *set, x, n);
    else
        (void)cudaLaunchKernelEx(&cfg, cuda_mma_kernel<F16, NT, MT, SILU, false, CUDA_MMA_WARPS_NARROW>, *set, x, n);
}

template <bool F16, int MT, bool SILU>
static void cuda_mma_go_n(cudaStream_t s, const struct cuda_mma_set *set, const float *x, int n, int n_sms)
{
    if (n <= 8) cuda_mma_go<F16, 1, MT, SILU>(s, set, x, n, n_sms);
    else cuda_mma_go<F16, 2, MT, SILU>(s, set, x, n, n_sms);
}

extern "C" int cuda_k_mma_takes(const struct cuda_wdesc *w, int count, const float *x, int n)
{
    if (n < 1 || n > CUDA_MMA_MAX_N || count < 1 || count > CUDA_GEMV_MAX_W || (uintptr_t)x % 16 != 0) return 0;
    for (int i = 0; i < count; i++)
        if ((w[i].type != CUDA_W_BF16 && w[i].type != CUDA_W_F16) || w[i].type != w[0].type ||
            w[i].cols != w[0].cols || w[i].cols % CUDA_MMA_CHUNK != 0 || w[i].row_bytes % 16 != 0 ||
            (uintptr_t)w[i].data % 16 != 0)
            return 0;
    return 1;
}

extern "C" int cuda_k_mma(cudaStream_t s, const struct cuda_wdesc *w, float *const *y, int count, const float *x,
                          int n, int n_sms, int accumulate, int silu)
{
    if (!cuda_k_mma_takes(w, count, x, n)) return CUDA_MMA_NO;
    if (silu && (count != 2 || w[0].rows != w[1].rows || accumulate)) return CUDA_MMA_NO;
    struct cuda_mma_set set;
    memset(&set, 0, sizeof(set));
    const int mt = silu ? 2 : 1;
    int64_t items = 0;
    for (int i = 0; i < (silu ? 2 : count); i++) {
        if (w[i].rows <= 0) continue;
        set.w[set.count] = (const uint8_t *)w[i].data;
        set.row_bytes[set.count] = w[i].row_bytes;
        set.rows[set.count] = w[i].rows;
        set.y[set.count] = y[i];
        items += silu ? (i == 0 ? (w[i].rows + 15) / 16 : 0) : (w[i].rows + 16 * mt - 1) / (16 * mt);
        set.item_end[set.count] = items;
        set.count++;
    }
    if (!items) return (int)cudaGetLastError();
    if (silu) set.count = 1; /* one item list; tile 1 reads w[1] */
    set.cols = w[0].cols;
    set.accumulate = accumulate;
    const bool f16 = w[0].type == CUDA_W_F16;
    if (silu) {
        if (f16) cuda_mma_go_n<true, 2, true>(s, &set, x, n, n_sms);
        else cuda_mma_go_n<false, 2, true>(s, &set, x, n, n_sms);
    } else {
        if (f16) cuda_mma_go_n<true, 1, false>(s, &set, x, n, n_sms);
        else cuda_mma_go_n<false, 1, false>(s, &set, x, n, n_sms);
    }
    return (int)cudaGetLastError();
}
