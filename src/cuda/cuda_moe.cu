/* Routed experts of a MoE FFN over a batch of up to CUDA_MOE_DEVICE_MAX_N tokens (decode
 * steps, small prefill chunks) on the device alone: tokens are sorted by expert on the GPU from
 * moe_route's ids, so no launch depends on the routing and a decode step stays
 * graph-capturable. Each chosen expert's weights are read once per step, whatever number of the
 * step's tokens chose it (tensor/backend.h backend_moe; CPU reference: cpu/cpu_moe.c).
 *
 * Shapes: x [n, hidden], ids / w [n, top_k] (slot s = t * top_k + k), out [n, hidden]; every
 * expert's gate / up is [inter, hidden] and down [hidden, inter], all of one layout (type, row
 * bytes, bits, group size), found through device tables of row-0 pointers (cuda_moe_set: HF
 * per-expert tensors and MLX stacked slices alike). Scratch (cuda_moe_ws): h [slots, inter],
 * ys [slots, hidden], the sorted slot list, per-expert offsets, the active experts.
 * Four kernels, in order on the stream:
 *   sort:    one block: counts per expert (shared-memory atomics), offsets, the slots of each
 *            expert, and the list of experts with at least one slot (n_act of them);
 *   gate_up: a persistent grid of warps over (active expert, row of inter) items: the warp
 *            streams gate row r and up row r once and applies them to the expert's slots,
 *            CUDA_MOE_NT at a time: h[s][r] = silu(gate_e . x_t) * (up_e . x_t);
 *   down:    the same over (active expert, row of hidden): ys[s][r] = down_e . h[s];
 *   combine: out[t] = sum_k w[t,k] * ys[t * top_k + k] in k order (deterministic, no atomics).
 * One token (n = 1, a decode step of one sequence) takes two kernels instead, unsorted (below:
 * gate_up1, then down1 with the combine folded in; MLX q4/q8 weights gate_up1q and down1q, which
 * stage x and h in shared memory), to the same bits; CAIRN_CUDA_MOE=old keeps it on the four,
 * CAIRN_CUDA_MOE=legacy1 on gate_up1 / down1 for q4/q8 too.
 * Each lane streams 16-byte chunks of its rows (8 bf16/f16, 4 f32, 32 q4 or 16 q8 codes: a
 * chunk lies in one quantization group), CUDA_MOE_U chunks in flight before any is used; rows of
 * another layout (q2/q3/q5/q6, unaligned) are read element by element (cuda_w_elem).
 * Bytes per call: each active expert's 3 x inter x hidden weights once per CUDA_MOE_NT of its
 * slots (batch 1: top_k experts), plus x, h, ys and out; the bound is HBM bandwidth. */
#include "cuda/cuda_common.cuh"

#define CUDA_MOE_THREADS 256 /* 8 warps per block */
#define CUDA_MOE_WARPS (CUDA_MOE_THREADS / CUDA_WARP)
#define CUDA_MOE_U 4         /* chunks per row a lane loads before using them */
#define CUDA_MOE_NT 8        /* slots a streamed row is applied to at once */
#define CUDA_MOE_SORT_THREADS 1024
#define CUDA_MOE_BLOCKS_PER_SM 8 /* persistent grid: blocks per SM at most */

enum cuda_moe_kind { MOE_F32 = 0, MOE_F16, MOE_BF16, MOE_Q4, MOE_Q8, MOE_SCALAR };

static __device__ __forceinline__ float cuda_moe_silu(float v) { return v / (1.0f + expf(-v)); }

static __device__ __forceinline__ uint4 cuda_moe_ld(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* MLX q4/q8 chunk arithmetic, shared by every path so that a row's sum has the same bits on
 * each: s = scale * (sum_i code_i x_i) + bias * (sum_i x_i) over the chunk's E codes, the two
 * sums in code order (cx by fmaf, xs by adds), then fmaf(scale, cx, bias * xs). A code becomes
 * its float exactly through the exponent trick (2^23 + code, less 2^23: two full-rate ops
 * instead of a quarter-rate conversion). xv: the chunk's E x values. */
static __device__ __forceinline__ float cuda_moe_code_f(uint32_t code)
{
    return __uint_as_float(0x4B000000u | code) - 8388608.0f;
}

/* cx over the PER_WORD codes of one 32-bit word of a chunk (xw: their x values), in order */
template <int BITS>
static __device__ __forceinline__ float cuda_moe_q_word(uint32_t word, const float *xw, float cx)
{
#pragma unroll
    for (int j = 0; j < 32 / BITS; j++)
        cx = fmaf(cuda_moe_code_f((word >> (BITS * j)) & ((1u << BITS) - 1)), xw[j], cx);
    return cx;
}

template <int BITS>
static __device__ __forceinline__ float cuda_moe_q_cx(const uint32_t *u, const float *xv)
{
    float cx = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) cx = cuda_moe_q_word<BITS>(u[q], xv + q * (32 / BITS), cx);
    return cx;
}

template <int BITS>
static __device__ __forceinline__ float cuda_moe_q_xs(const float *xv)
{
    float xs = 0;
#pragma unroll
    for (int i = 0; i < 128 / BITS; i++) xs += xv[i];
    return xs;
}

/* scale and bias of the group holding element i of a q row (row: its first byte) */
static __device__ __forceinline__ void cuda_moe_q_sb(const struct cuda_wdesc &w, const uint8_t *row, int64_t i,
                                                     int bits, float *scale, float *bias)
{
    int64_t g = i / w.group_size;
    *scale = cuda_bf16_f32(((const uint16_t *)(row + cuda_q_scales_off(w.cols, bits)))[g]);
    *bias = cuda_bf16_f32(((const uint16_t *)(row + cuda_q_biases_off(w.cols, bits, w.group_size)))[g]);
}

/* the bf16 scale (low half) and bias (high half) of the group of element i, as cuda_moe_q_sb */
static __device__ __forceinline__ uint32_t cuda_moe_q_sb_raw(const struct cuda_wdesc &w, const uint8_t *row,
                                                             int64_t i, int bits)
{
    int64_t g = i / w.group_size;
    uint32_t sc = ((const uint16_t *)(row + cuda_q_scales_off(w.cols, bits)))[g];
    uint32_t bi = ((const uint16_t *)(row + cuda_q_biases_off(w.cols, bits, w.group_size)))[g];
    return sc | bi << 16;
}

/* chunk . x[i .. i + elems) for one row (row points at its first byte, for q scales). */
template <int K>
static __device__ __forceinline__ float cuda_moe_chunk_dot(uint4 c, const uint8_t *row, int64_t i,
                                                           const struct cuda_wdesc &w, const float *x)
{
    const uint32_t u[4] = {c.x, c.y, c.z, c.w};
    float s = 0;
    if (K == MOE_F32) {
        float4 v = *(const float4 *)(x + i);
        s = __uint_as_float(u[0]) * v.x + __uint_as_float(u[1]) * v.y + __uint_as_float(u[2]) * v.z +
            __uint_as_float(u[3]) * v.w;
    } else if (K == MOE_BF16 || K == MOE_F16) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
            float4 v = *(const float4 *)(x + i + 4 * q);
            uint32_t a = u[2 * q], b = u[2 * q + 1];
            float w0, w1, w2, w3;
            if (K == MOE_BF16) {
                w0 = __uint_as_float(a << 16), w1 = __uint_as_float(a & 0xffff0000u);
                w2 = __uint_as_float(b << 16), w3 = __uint_as_float(b & 0xffff0000u);
            } else {
                w0 = cuda_f16_f32((uint16_t)(a & 0xffffu)), w1 = cuda_f16_f32((uint16_t)(a >> 16));
                w2 = cuda_f16_f32((uint16_t)(b & 0xffffu)), w3 = cuda_f16_f32((uint16_t)(b >> 16));
            }
            s = fmaf(w0, v.x, fmaf(w1, v.y, fmaf(w2, v.z, fmaf(w3, v.w, s))));
        }
    } else {
        constexpr int BITS = K == MOE_Q4 ? 4 : 8, E = 128 / BITS;
        float xv[E]; /* x + i is 16-byte aligned: i is a multiple of E, x rows are (cuda_moe_kind_of) */
#pragma unroll
        for (int f = 0; f < E / 4; f++) {
            float4 v = *(const float4 *)(x + i + 4 * f);
            xv[4 * f] = v.x, xv[4 * f + 1] = v.y, xv[4 * f + 2] = v.z, xv[4 * f + 3] = v.w;
        }
        float scale, bias;
        cuda_moe_q_sb(w, row, i, BITS, &scale, &bias);
        s = fmaf(scale, cuda_moe_q_cx<BITS>(u, xv), bias * cuda_moe_q_xs<BITS>(xv));
    }
    return s;
}

/* out[j] = row . xs[j] over cols for j < ns, summed across the warp (lane 0 has them): the
 * row is streamed once for the ns vectors. */
template <int K>
static __device__ __forceinline__ void cuda_moe_rows_dot(const struct cuda_wdesc &w, const uint8_t *row,
                                                         const float *const *xs, int ns, int lane, float *out)
{
    float acc[CUDA_MOE_NT];
#pragma unroll
    for (int j = 0; j < CUDA_MOE_NT; j++) acc[j] = 0;
    if (K == MOE_SCALAR) {
        for (int64_t i = lane; i < w.cols; i += CUDA_WARP) {
            float wv = cuda_w_elem(w, row, i);
#pragma unroll
            for (int j = 0; j < CUDA_MOE_NT; j++)
                if (j < ns) acc[j] += wv * xs[j][i];
        }
    } else {
        constexpr int E = K == MOE_F32 ? 4 : K == MOE_Q4 ? 32 : K == MOE_Q8 ? 16 : 8;
        const int64_t n_chunks = w.cols / E;
        for (int64_t c0 = lane; c0 < n_chunks; c0 += (int64_t)CUDA_WARP * CUDA_MOE_U) {
            uint4 cv[CUDA_MOE_U];
#pragma unroll
            for (int u = 0; u < CUDA_MOE_U; u++) {
                int64_t ci = c0 + (int64_t)u * CUDA_WARP;
                cv[u] = ci < n_chunks ? cuda_moe_ld((const uint4 *)row + ci) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < CUDA_MOE_U; u++) {
                int64_t ci = c0 + (int64_t)u * CUDA_WARP;
                if (ci >= n_chunks) continue;
#pragma unroll
                for (int j = 0; j < CUDA_MOE_NT; j++)
                    if (j < ns) acc[j] += cuda_moe_chunk_dot<K>(cv[u], row, ci * E, w, xs[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < CUDA_MOE_NT; j++) out[j] = cuda_warp_sum(acc[j]);
}

template <int K>
static __global__ void __launch_bounds__(CUDA_MOE_THREADS)
    cuda_moe_gate_up_kernel(struct cuda_moe_set set, struct cuda_moe_ws ws,
                            const float *__restrict__ x, int top_k)
{
    int lane = threadIdx.x % CUDA_WARP;
    const int64_t inter = set.gate.rows, hidden = set.gate.cols, n_items = (int64_t)*ws.n_act * inter;
    for (int64_t it = (int64_t)blockIdx.x * CUDA_MOE_WARPS + threadIdx.x / CUDA_WARP; it < n_items;
         it += (int64_t)gridDim.x * CUDA_MOE_WARPS) {
        int e = ws.act[it / inter];
        int64_t r = it % inter;
        const uint8_t *gr = (const uint8_t *)set.gate_data[e] + (size_t)r * set.gate.row_bytes;
        const uint8_t *ur = (const uint8_t *)set.up_data[e] + (size_t)r * set.up.row_bytes;
        for (int s0 = ws.off[e]; s0 < ws.off[e + 1]; s0 += CUDA_MOE_NT) {
            int ns = min(CUDA_MOE_NT, ws.off[e + 1] - s0);
            const float *xs[CUDA_MOE_NT];
            for (int j = 0; j < CUDA_MOE_NT; j++) xs[j] = x + (int64_t)(ws.list[s0 + min(j, ns - 1)] / top_k) * hidden;
            float g[CUDA_MOE_NT], u[CUDA_MOE_NT];
            cuda_moe_rows_dot<K>(set.gate, gr, xs, ns, lane, g);
            cuda_moe_rows_dot<K>(set.up, ur, xs, ns, lane, u);
            if (lane == 0)
                for (int j = 0; j < ns; j++)
                    ws.h[(int64_t)ws.list[s0 + j] * inter + r] = cuda_moe_silu(g[j]) * u[j];
        }
    }
}

template <int K>
static __global__ void __launch_bounds__(CUDA_MOE_THREADS)
    cuda_moe_down_kernel(struct cuda_moe_set set, struct cuda_moe_ws ws)
{
    int lane = threadIdx.x % CUDA_WARP;
    const int64_t hidden = set.down.rows, inter = set.down.cols,
                  n_items = (int64_t)*ws.n_act * hidden;
    for (int64_t it = (int64_t)blockIdx.x * CUDA_MOE_WARPS + threadIdx.x / CUDA_WARP; it < n_items;
         it += (int64_t)gridDim.x * CUDA_MOE_WARPS) {
        int e = ws.act[it / hidden];
        int64_t r = it % hidden;
        const uint8_t *dr = (const uint8_t *)set.down_data[e] + (size_t)r * set.down.row_bytes;
        for (int s0 = ws.off[e]; s0 < ws.off[e + 1]; s0 += CUDA_MOE_NT) {
            int ns = min(CUDA_MOE_NT, ws.off[e + 1] - s0);
            const float *hs[CUDA_MOE_NT];
            for (int j = 0; j < CUDA_MOE_NT; j++) hs[j] = ws.h + (int64_t)ws.list[s0 + min(j, ns - 1)] * inter;
            float y[CUDA_MOE_NT];
            cuda_moe_rows_dot<K>(set.down, dr, hs, ns, lane, y);
            if (lane == 0)
                for (int j = 0; j < ns; j++)
                    ws.ys[(int64_t)ws.list[s0 + j] * hidden + r] = y[j];
        }
    }
}

/* ---- One token (n = 1): slot k is expert ids[k]'s alone, so there is nothing to sort and
 * every warp finds its expert in ids. A warp streams several rows at once (gate_up: CUDA_MOE1_R
 * rows of gate and of up; down: CUDA_MOE1_KB experts' row r) so that a lane has 16 chunks in
 * flight, and down sums the experts into out itself (no ys, no combine launch). Each row's sum
 * is the sorted path's to the bit (a lane's chunks in the same order, the same warp sum, the
 * combine's k order and its skipped invalid ids), so a token's row is the same alone as in a
 * batch. ---- */

#define CUDA_MOE1_R 2  /* gate_up: rows of gate and of up a warp streams (2 R rows) */
#define CUDA_MOE1_KB 8 /* down: experts whose row r a warp streams at once */

/* out[j] = row[j] . x[j] over the rows' cols (one kind, one cols), summed across the warp (every
 * lane has them); even rows are read with wa, odd ones with wb. U chunks of each row in flight. */
template <int K, int NR, int U>
static __device__ __forceinline__ void cuda_moe_multi_dot(const struct cuda_wdesc &wa, const struct cuda_wdesc &wb,
                                                          const uint8_t *const *row, const float *const *x,
                                                          int lane, float *out)
{
    constexpr int E = K == MOE_F32 ? 4 : K == MOE_Q4 ? 32 : K == MOE_Q8 ? 16 : 8;
    const int64_t n_chunks = wa.cols / E;
    float acc[NR];
#pragma unroll
    for (int j = 0; j < NR; j++) acc[j] = 0;
    for (int64_t c0 = lane; c0 < n_chunks; c0 += (int64_t)CUDA_WARP * U) {
        uint4 cv[NR][U];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NR; j++) {
                int64_t ci = c0 + (int64_t)u * CUDA_WARP;
                cv[j][u] = ci < n_chunks ? cuda_moe_ld((const uint4 *)row[j] + ci) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t ci = c0 + (int64_t)u * CUDA_WARP;
            if (ci >= n_chunks) continue;
#pragma unroll
            for (int j = 0; j < NR; j++)
                acc[j] += cuda_moe_chunk_dot<K>(cv[j][u], row[j], ci * E, j % 2 ? wb : wa, x[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < NR; j++) out[j] = cuda_warp_sum(acc[j]);
}

/* h [top_k, inter]: h[k][r] = silu(gate_e . x) * (up_e . x), e = ids[k]; a warp item is
 * (k, CUDA_MOE1_R consecutive rows). */
template <int K>
static __global__ void __launch_bounds__(CUDA_MOE_THREADS)
    cuda_moe_gate_up1_kernel(struct cuda_moe_set set, float *__restrict__ h, const float *__restrict__ x,
                             const int32_t *__restrict__ ids, int top_k)
{
    int lane = threadIdx.x % CUDA_WARP;
    const int64_t inter = set.gate.rows, groups = (inter + CUDA_MOE1_R - 1) / CUDA_MOE1_R,
                  n_items = (int64_t)top_k * groups;
    for (int64_t it = (int64_t)blockIdx.x * CUDA_MOE_WARPS + threadIdx.x / CUDA_WARP; it < n_items;
         it += (int64_t)gridDim.x * CUDA_MOE_WARPS) {
        int k = (int)(it / groups);
        int64_t r0 = it % groups * CUDA_MOE1_R;
        int e = ids[k];
        if (e < 0 || e >= set.n_experts) continue; /* adds nothing (down skips the slot) */
        const uint8_t *g = (const uint8_t *)set.gate_data[e], *u = (const uint8_t *)set.up_data[e];
        const uint8_t *rows[2 * CUDA_MOE1_R];
        const float *xs[2 * CUDA_MOE1_R];
#pragma unroll
        for (int i = 0; i < CUDA_MOE1_R; i++) {
            int64_t r = min(r0 + i, inter - 1); /* past the end: row inter - 1 again, unused */
            rows[2 * i] = g + (size_t)r * set.gate.row_bytes;
            rows[2 * i + 1] = u + (size_t)r * set.up.row_bytes;
            xs[2 * i] = xs[2 * i + 1] = x;
        }
        float o[2 * CUDA_MOE1_R];
        cuda_moe_multi_dot<K, 2 * CUDA_MOE1_R, 4>(set.gate, set.up, rows, xs, lane, o);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < CUDA_MOE1_R; i++)
                if (r0 + i < inter) h[(int64_t)k * inter + r0 + i] = cuda_moe_silu(o[2 * i]) * o[2 * i + 1];
    }
}

/* out[r] = sum_k w[k] * (down_e . h[k]), e = ids[k], in k order; a warp item is one row r. */
template <int K>
static __global__ void __launch_bounds__(CUDA_MOE_THREADS, 2) /* 2 blocks an SM: the 256 blocks of a 2048-row down in one wave */
    cuda_moe_down1_kernel(struct cuda_moe_set set, const float *__restrict__ h, const int32_t *__restrict__ ids,
                          const float *__restrict__ w, float *__restrict__ out, int top_k)
{
    int lane = threadIdx.x % CUDA_WARP;
    const int64_t hidden = set.down.rows, inter = set.down.cols;
    for (int64_t r = (int64_t)blockIdx.x * CUDA_MOE_WARPS + threadIdx.x / CUDA_WARP; r < hidden;
         r += (int64_t)gridDim.x * CUDA_MOE_WARPS) {
        float acc = 0;
        for (int k0 = 0; k0 < top_k; k0 += CUDA_MOE1_KB) {
            const uint8_t *rows[CUDA_MOE1_KB];
            const float *hs[CUDA_MOE1_KB];
            bool ok[CUDA_MOE1_KB];
#pragma unroll
            for (int j = 0; j < CUDA_MOE1_KB; j++) {
                int k = min(k0 + j, top_k - 1), e = ids[k];
                ok[j] = k0 + j < top_k && e >= 0 && e < set.n_experts;
                rows[j] = (const uint8_t *)set.down_data[ok[j] ? e : 0] + (size_t)r * set.down.row_bytes;
                hs[j] = h + (int64_t)k * inter;
            }
            float y[CUDA_MOE1_KB];
            cuda_moe_multi_dot<K, CUDA_MOE1_KB, 2>(set.down, set.down, rows, hs, lane, y);
#pragma unroll
            for (int j = 0; j < CUDA_MOE1_KB; j++)
                if (ok[j]) acc += w[k0 + j] * y[j];
        }
        if (lane == 0) out[r] = acc;
    }
}

/* ---- One token, MLX q4/q8 weights (the staged kernels): x (gate_up) or the k rows of h
 * (down) are first copied by each block into shared memory, so a lane reads its chunk's E
 * values as E / 4 conflict-free 16-byte loads (cuda_moe_sw) instead of E scalar loads from L1
 * that each touch 32 lines (lane chunks are 4 E bytes apart): those loads, not HBM, bound the
 * first one-token q kernels (H200, Qwen3-Next's 10 of 512 experts, 2048 x 512 q4: gate_up 39 us
 * and down 74 us a layer for 17.7 MB). gate_up reads a chunk's x once for its 2 R rows (and
 * its x sum once); down streams short rows with fewer lanes: a q4 row of 512 codes is 16 chunks,
 * so two rows share a warp, 16 lanes each (CUDA_MOE1Q_LPR). A lane's chunks, their order and
 * the sums across lanes are the sorted path's (lanes past a row's chunks add nothing there), and
 * the chunk arithmetic is cuda_moe_q_cx / q_xs: the bits are those of rows_dot. ---- */

#define CUDA_MOE1Q_SMEM (48 << 10) /* staged bytes per block at most (else the kernels above) */
#define CUDA_MOE1Q_R 4             /* gate_up1q: rows of gate and of up a warp streams (2 R rows) */

/* float4 slot of float4 q of chunk c in a staged vector of F4 float4s a chunk: 8 lanes reading
 * float4 q of 8 consecutive chunks hit 8 different 16-byte bank groups. */
template <int F4>
static __device__ __forceinline__ int cuda_moe_sw(int c, int q)
{
    return c * F4 + (q ^ ((c / (8 / F4)) % F4));
}

/* Stages n vectors of len floats (len a multiple of 4 E) from src (row stride len) into dst. */
template <int BITS>
static __device__ __forceinline__ void cuda_moe_stage(float4 *dst, const float *src, int n, int len)
{
    constexpr int F4 = 32 / BITS; /* E / 4 */
    const int per = len / 4;
    for (int f = threadIdx.x; f < n * per; f += blockDim.x) {
        int v = f / per, g = f % per;
        dst[v * per + cuda_moe_sw<F4>(g / F4, g % F4)] = ((const float4 *)src)[f];
    }
    __syncthreads();
}

/* the PER_WORD x values of word q of chunk c of a staged vector */
template <int BITS>
static __device__ __forceinline__ void cuda_moe_staged_word(const float4 *sv, int c, int q, float *xw)
{
    constexpr int F4 = 32 / BITS, PW = 32 / BITS / 4; /* float4s a chunk, a word */
#pragma unroll
    for (int f = 0; f < PW; f++) {
        float4 v = sv[cuda_moe_sw<F4>(c, q * PW + f)];
        xw[4 * f] = v.x, xw[4 * f + 1] = v.y, xw[4 * f + 2] = v.z, xw[4 * f + 3] = v.w;
    }
}

/* y += chunk ci of a q row (its code words wv, raw scale/bias sb) . the staged vector sv: the
 * chunk arithmetic of cuda_moe_chunk_dot, one word's x values live at a time. */
template <int BITS>
static __device__ __forceinline__ float cuda_moe_staged_dot(uint4 wv, uint32_t sb, const float4 *sv, int ci, float y)
{
    const uint32_t u[4] = {wv.x, wv.y, wv.z, wv.w};
    float cx = 0, xs = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float xw[32 / BITS];
        cuda_moe_staged_word<BITS>(sv, ci, q, xw);
#pragma unroll
        for (int j = 0; j < 32 / BITS; j++) xs += xw[j];
        cx = cuda_moe_q_word<BITS>(u[q], xw, cx);
    }
    return y + fmaf(cuda_bf16_f32((uint16_t)(sb & 0xffffu)), cx, cuda_bf16_f32((uint16_t)(sb >> 16)) * xs);
}

/* h [top_k, inter] as gate_up1, x staged; items of CUDA_MOE1Q_R rows of gate and of up (Qwen3-Next:
 * 1,280 warps of 16 loads a lane, one wave at 2 blocks an SM). */
template <int BITS>
static __global__ void __launch_bounds__(CUDA_MOE_THREADS, 2)
    cuda_moe_gate_up1q_kernel(struct cuda_moe_set set, float *__restrict__ h, const float *__restrict__ x,
                              const int32_t *__restrict__ ids, int top_k)
{
    constexpr int E = 128 / BITS, U = 2, NR = 2 * CUDA_MOE1Q_R; /* q4 2048 columns: one pass of 16 loads */
    extern __shared__ float4 cuda_moe_sx[];
    const int64_t hidden = set.gate.cols, inter = set.gate.rows, groups = (inter + CUDA_MOE1Q_R - 1) / CUDA_MOE1Q_R,
                  n_items = (int64_t)top_k * groups;
    const int n_chunks = (int)(hidden / E), lane = threadIdx.x % CUDA_WARP;
    cuda_moe_stage<BITS>(cuda_moe_sx, x, 1, (int)hidden);
    for (int64_t it = (int64_t)blockIdx.x * CUDA_MOE_WARPS + threadIdx.x / CUDA_WARP; it < n_items;
         it += (int64_t)gridDim.x * CUDA_MOE_WARPS) {
        int k = (int)(it / groups);
        int64_t r0 = it % groups * CUDA_MOE1Q_R;
        int e = ids[k];
        if (e < 0 || e >= set.n_experts) continue; /* adds nothing (down skips the slot) */
        const uint8_t *g = (const uint8_t *)set.gate_data[e], *u = (const uint8_t *)set.up_data[e];
        const uint8_t *rows[NR];
#pragma unroll
        for (int i = 0; i < CUDA_MOE1Q_R; i++) {
            int64_t r = min(r0 + i, inter - 1); /* past the end: row inter - 1 again, unused */
            rows[2 * i] = g + (size_t)r * set.gate.row_bytes;
            rows[2 * i + 1] = u + (size_t)r * set.up.row_bytes;
        }
        float acc[NR];
#pragma unroll
        for (int j = 0; j < NR; j++) acc[j] = 0;
        for (int c0 = lane; c0 < n_chunks; c0 += CUDA_WARP * U) {
            uint4 cv[NR][U];
#pragma unroll
            for (int q = 0; q < U; q++)
#pragma unroll
                for (int j = 0; j < NR; j++) {
                    int ci = c0 + q * CUDA_WARP;
                    cv[j][q] = ci < n_chunks ? cuda_moe_ld((const uint4 *)rows[j] + ci) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int q = 0; q < U; q++) {
                int ci = c0 + q * CUDA_WARP;
                if (ci >= n_chunks) continue;
                float cx[NR], xs = 0; /* one x word at a time, for every row */
#pragma unroll
                for (int j = 0; j < NR; j++) cx[j] = 0;
#pragma unroll
                for (int wq = 0; wq < 4; wq++) {
                    float xw[32 / BITS];
                    cuda_moe_staged_word<BITS>(cuda_moe_sx, ci, wq, xw);
#pragma unroll
                    for (int i = 0; i < 32 / BITS; i++) xs += xw[i];
#pragma unroll
                    for (int j = 0; j < NR; j++) {
                        const uint32_t wv[4] = {cv[j][q].x, cv[j][q].y, cv[j][q].z, cv[j][q].w};
                        cx[j] = cuda_moe_q_word<BITS>(wv[wq], xw, cx[j]);
                    }
                }
#pragma unroll
                for (int j = 0; j < NR; j++) {
                    float scale, bias;
                    cuda_moe_q_sb(j % 2 ? set.up : set.gate, rows[j], (int64_t)ci * E, BITS, &scale, &bias);
                    acc[j] += fmaf(scale, cx[j], bias * xs);
                }
            }
        }
        float o[NR];
#pragma unroll
        for (int j = 0; j < NR; j++) o[j] = cuda_warp_sum(acc[j]);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < CUDA_MOE1Q_R; i++)
                if (r0 + i < inter) h[(int64_t)k * inter + r0 + i] = cuda_moe_silu(o[2 * i]) * o[2 * i + 1];
    }
}

/* out[r] = sum_k w[k] * (down_e . h[k]) as down1, the top_k rows of h staged; LPR lanes a row
 * (16: rows of at most 16 chunks, two a warp; 32: any). */
template <int BITS, int LPR>
static __global__ void __launch_bounds__(CUDA_MOE_THREADS, 2)
    cuda_moe_down1q_kernel(struct cuda_moe_set set, const float *__restrict__ h, const int32_t *__restrict__ ids,
                           const float *__restrict__ w, float *__restrict__ out, int top_k)
{
    /* LPR 16: one chunk a lane, every expert's in flight at once (top_k <= 16) */
    constexpr int E = 128 / BITS, RW = CUDA_WARP / LPR, KB = LPR == 16 ? 16 : CUDA_MOE1_KB;
    extern __shared__ float4 cuda_moe_sh[];
    const int64_t hidden = set.down.rows;
    const int inter = (int)set.down.cols, n_chunks = inter / E, per = inter / 4;
    const int lane = threadIdx.x % CUDA_WARP, sub = lane / LPR, sl = lane % LPR;
    cuda_moe_stage<BITS>(cuda_moe_sh, h, top_k, inter);
    for (int64_t r0 = ((int64_t)blockIdx.x * CUDA_MOE_WARPS + threadIdx.x / CUDA_WARP) * RW; r0 < hidden;
         r0 += (int64_t)gridDim.x * CUDA_MOE_WARPS * RW) {
        const int64_t r = min(r0 + sub, hidden - 1); /* past the end: row hidden - 1 again, unused */
        float acc = 0;
        for (int k0 = 0; k0 < top_k; k0 += KB) {
            const uint8_t *rows[KB];
            bool ok[KB];
#pragma unroll
            for (int j = 0; j < KB; j++) {
                int k = min(k0 + j, top_k - 1), e = ids[k];
                ok[j] = k0 + j < top_k && e >= 0 && e < set.n_experts;
                rows[j] = (const uint8_t *)set.down_data[ok[j] ? e : 0] + (size_t)r * set.down.row_bytes;
            }
            float y[KB];
#pragma unroll
            for (int j = 0; j < KB; j++) y[j] = 0;
            /* LPR 16: the row's one chunk a lane (a compile-time single pass, so the row pointers
             * die after the loads and every expert's load fits in registers) */
            const int n_pass = LPR == 16 ? 1 : (n_chunks + LPR - 1) / LPR;
            for (int ps = 0; ps < n_pass; ps++) {
                const int ci = sl + ps * LPR;
                uint4 cv[KB];
                uint32_t sb[KB];
#pragma unroll
                for (int j = 0; j < KB; j++) {
                    bool on = ci < n_chunks && ok[j];
                    cv[j] = on ? cuda_moe_ld((const uint4 *)rows[j] + ci) : make_uint4(0, 0, 0, 0);
                    sb[j] = on ? cuda_moe_q_sb_raw(set.down, rows[j], (int64_t)ci * E, BITS) : 0u;
                }
                if (ci >= n_chunks) continue;
#pragma unroll
                for (int j = 0; j < KB; j++)
                    if (ok[j]) y[j] = cuda_moe_staged_dot<BITS>(cv[j], sb[j], cuda_moe_sh + (size_t)(k0 + j) * per, ci, y[j]);
            }
#pragma unroll
            for (int j = 0; j < KB; j++) {
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1) y[j] += __shfl_xor_sync(0xffffffffu, y[j], o);
                if (ok[j]) acc += w[k0 + j] * y[j];
            }
        }
        if (sl == 0 && r0 + sub < hidden) out[r0 + sub] = acc;
    }
}

/* Counting sort of the slots by expert (one block); ids outside [0, n_experts) are left out
 * (a routing bug: their slots then add nothing, see combine). */
static __global__ void __launch_bounds__(CUDA_MOE_SORT_THREADS)
cuda_moe_sort_kernel(const int32_t *__restrict__ ids, int n_slots, int n_experts, struct cuda_moe_ws ws)
{
    __shared__ int cnt[CUDA_MOE_MAX_EXPERTS], cur[CUDA_MOE_MAX_EXPERTS];
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        int e = ids[s];
        if (e >= 0 && e < n_experts) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* n_experts <= 1024: a serial scan is a few microseconds at most */
        int o = 0, a = 0;
        for (int e = 0; e < n_experts; e++) {
            ws.off[e] = o;
            cur[e] = o;
            if (cnt[e]) ws.act[a++] = e;
            o += cnt[e];
        }
        ws.off[n_experts] = o;
        *ws.n_act = a;
    }
    __syncthreads();
    /* within an expert the order is the atomics' (any order gives the same results: each
     * slot's sums run the same way wherever it sits) */
    for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
        int e = ids[s];
        if (e >= 0 && e < n_experts) ws.list[atomicAdd(&cur[e], 1)] = s;
    }
}

static __global__ void cuda_moe_combine_kernel(const int32_t *__restrict__ ids, const float *__restrict__ w,
                                               const float *__restrict__ ys, float *__restrict__ out, int n,
                                               int top_k, int n_experts, int hidden)
{
    int64_t total = (int64_t)n * hidden;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / hidden, j = i % hidden;
        float acc = 0;
        for (int k = 0; k < top_k; k++) {
            int64_t s = t * top_k + k;
            if (ids[s] >= 0 && ids[s] < n_experts) acc += w[s] * ys[s * hidden + j];
        }
        out[i] = acc;
    }
}

/* The vector kind of a weight (MOE_SCALAR: element by element). x rows must be 16-byte aligned
 * too: hidden and inter multiples of 4 floats with the buffers 16-byte aligned. */
static int cuda_moe_kind_of(const struct cuda_wdesc *w, int x_aligned)
{
    int k, elems;
    switch (w->type) {
    case CUDA_W_F32: k = MOE_F32, elems = 4; break;
    case CUDA_W_F16: k = MOE_F16, elems = 8; break;
    case CUDA_W_BF16: k = MOE_BF16, elems = 8; break;
    default:
        if (w->bits == 4) k = MOE_Q4, elems = 32;
        else if (w->bits == 8) k = MOE_Q8, elems = 16;
        else return MOE_SCALAR;
    }
    if (!x_aligned || w->cols % elems || w->row_bytes % 16 || (uintptr_t)w->data % 16) return MOE_SCALAR;
    return k;
}

template <int K>
static void cuda_moe_go(cudaStream_t s, const struct cuda_moe_set *set, int kd,
                        const struct cuda_moe_ws *ws, int64_t max_act, int top_k, int n_sms)
{
    /* worst-case items (every slot on its own expert): surplus warps find no item and exit */
    int64_t cap = (int64_t)(n_sms > 0 ? n_sms : 1) * CUDA_MOE_BLOCKS_PER_SM;
    int64_t b1 = (max_act * set->gate.rows + CUDA_MOE_WARPS - 1) / CUDA_MOE_WARPS;
    int64_t b2 = (max_act * set->down.rows + CUDA_MOE_WARPS - 1) / CUDA_MOE_WARPS;
    b1 = b1 < 1 ? 1 : b1 > cap ? cap : b1;
    b2 = b2 < 1 ? 1 : b2 > cap ? cap : b2;
    cuda_moe_gate_up_kernel<K><<<(unsigned)b1, CUDA_MOE_THREADS, 0, s>>>(*set, *ws, ws->x, top_k);
    if (kd == K)
        cuda_moe_down_kernel<K><<<(unsigned)b2, CUDA_MOE_THREADS, 0, s>>>(*set, *ws);
    else
        cuda_moe_down_kernel<MOE_SCALAR><<<(unsigned)b2, CUDA_MOE_THREADS, 0, s>>>(*set, *ws);
}

/* The staged q kernels' launches, when they take this layer (else 0: the kernels above). */
template <int BITS>
static int cuda_moe_gate_up1q(cudaStream_t s, const struct cuda_moe_set *set, const struct cuda_moe_ws *ws,
                              const int32_t *ids, int top_k, int64_t cap)
{
    size_t smem = (size_t)set->gate.cols * sizeof(float);
    if (smem > CUDA_MOE1Q_SMEM) return 0;
    int64_t items = (int64_t)top_k * ((set->gate.rows + CUDA_MOE1Q_R - 1) / CUDA_MOE1Q_R);
    int64_t b = (items + CUDA_MOE_WARPS - 1) / CUDA_MOE_WARPS;
    b = b < 1 ? 1 : b > cap ? cap : b;
    cuda_moe_gate_up1q_kernel<BITS><<<(unsigned)b, CUDA_MOE_THREADS, smem, s>>>(*set, ws->h, ws->x, ids, top_k);
    return 1;
}

template <int BITS>
static int cuda_moe_down1q(cudaStream_t s, const struct cuda_moe_set *set, const struct cuda_moe_ws *ws,
                           const int32_t *ids, const float *w, float *out, int top_k, int64_t cap)
{
    size_t smem = (size_t)top_k * (size_t)set->down.cols * sizeof(float);
    int64_t n_chunks = set->down.cols / (128 / BITS);
    int half = n_chunks <= 16 && top_k <= 16; /* CUDA_MOE1Q_LPR 16: two rows a warp */
    if (smem > CUDA_MOE1Q_SMEM) return 0;
    int64_t warps = half ? (set->down.rows + 1) / 2 : set->down.rows;
    int64_t b = (warps + CUDA_MOE_WARPS - 1) / CUDA_MOE_WARPS;
    b = b < 1 ? 1 : b > cap ? cap : b;
    if (half)
        cuda_moe_down1q_kernel<BITS, 16><<<(unsigned)b, CUDA_MOE_THREADS, smem, s>>>(*set, ws->h, ids, w, out, top_k);
    else
        cuda_moe_down1q_kernel<BITS, 32><<<(unsigned)b, CUDA_MOE_THREADS, smem, s>>>(*set, ws->h, ids, w, out, top_k);
    return 1;
}

/* The one-token path's two launches; blocks as the sorted path's (at most n_sms x
 * CUDA_MOE_BLOCKS_PER_SM, surplus warps exit). staged: q4/q8 take the staged kernels. */
template <int KG>
static void cuda_moe_go1(cudaStream_t s, const struct cuda_moe_set *set, int kd, const struct cuda_moe_ws *ws,
                         const int32_t *ids, const float *w, float *out, int top_k, int n_sms, int staged)
{
    int64_t cap = (int64_t)(n_sms > 0 ? n_sms : 1) * CUDA_MOE_BLOCKS_PER_SM;
    int64_t items1 = (int64_t)top_k * ((set->gate.rows + CUDA_MOE1_R - 1) / CUDA_MOE1_R);
    int64_t b1 = (items1 + CUDA_MOE_WARPS - 1) / CUDA_MOE_WARPS, b2 = (set->down.rows + CUDA_MOE_WARPS - 1) / CUDA_MOE_WARPS;
    b1 = b1 < 1 ? 1 : b1 > cap ? cap : b1;
    b2 = b2 < 1 ? 1 : b2 > cap ? cap : b2;
    int done = 0;
    if (staged && KG == MOE_Q4) done = cuda_moe_gate_up1q<4>(s, set, ws, ids, top_k, cap);
    if (staged && KG == MOE_Q8) done = cuda_moe_gate_up1q<8>(s, set, ws, ids, top_k, cap);
    if (!done) cuda_moe_gate_up1_kernel<KG><<<(unsigned)b1, CUDA_MOE_THREADS, 0, s>>>(*set, ws->h, ws->x, ids, top_k);
    const float *h = ws->h;
    if (staged && kd == MOE_Q4 && cuda_moe_down1q<4>(s, set, ws, ids, w, out, top_k, cap)) return;
    if (staged && kd == MOE_Q8 && cuda_moe_down1q<8>(s, set, ws, ids, w, out, top_k, cap)) return;
    switch (kd) {
    case MOE_F32: cuda_moe_down1_kernel<MOE_F32><<<(unsigned)b2, CUDA_MOE_THREADS, 0, s>>>(*set, h, ids, w, out, top_k); break;
    case MOE_F16: cuda_moe_down1_kernel<MOE_F16><<<(unsigned)b2, CUDA_MOE_THREADS, 0, s>>>(*set, h, ids, w, out, top_k); break;
    case MOE_BF16: cuda_moe_down1_kernel<MOE_BF16><<<(unsigned)b2, CUDA_MOE_THREADS, 0, s>>>(*set, h, ids, w, out, top_k); break;
    case MOE_Q4: cuda_moe_down1_kernel<MOE_Q4><<<(unsigned)b2, CUDA_MOE_THREADS, 0, s>>>(*set, h, ids, w, out, top_k); break;
    default: cuda_moe_down1_kernel<MOE_Q8><<<(unsigned)b2, CUDA_MOE_THREADS, 0, s>>>(*set, h, ids, w, out, top_k); break;
    }
}

extern "C" int cuda_k_moe_grouped(cudaStream_t s, const struct cuda_moe_set *set,
                                  const struct cuda_moe_ws *ws, const int32_t *ids, const float *w,
                                  float *out, int n, int top_k, int one, int n_sms)
{
    if (n <= 0) return (int)cudaGetLastError();
    if (set->n_experts > CUDA_MOE_MAX_EXPERTS) return (int)cudaErrorInvalidValue;
    int n_slots = n * top_k;
    int al_x = (uintptr_t)ws->x % 16 == 0 && set->gate.cols % 4 == 0;
    int al_h = (uintptr_t)ws->h % 16 == 0 && set->down.cols % 4 == 0;
    int kg = cuda_moe_kind_of(&set->gate, al_x), ku = cuda_moe_kind_of(&set->up, al_x);
    int kd = cuda_moe_kind_of(&set->down, al_h);
    if (ku != kg) kg = MOE_SCALAR; /* gate and up are read by one kernel: one kind for both */
    if (one && n == 1 && kg != MOE_SCALAR && kd != MOE_SCALAR) {
        int st = one == 2;
        switch (kg) {
        case MOE_F32: cuda_moe_go1<MOE_F32>(s, set, kd, ws, ids, w, out, top_k, n_sms, st); break;
        case MOE_F16: cuda_moe_go1<MOE_F16>(s, set, kd, ws, ids, w, out, top_k, n_sms, st); break;
        case MOE_BF16: cuda_moe_go1<MOE_BF16>(s, set, kd, ws, ids, w, out, top_k, n_sms, st); break;
        case MOE_Q4: cuda_moe_go1<MOE_Q4>(s, set, kd, ws, ids, w, out, top_k, n_sms, st); break;
        default: cuda_moe_go1<MOE_Q8>(s, set, kd, ws, ids, w, out, top_k, n_sms, st); break;
        }
        return (int)cudaGetLastError();
    }
    cuda_moe_sort_kernel<<<1, CUDA_MOE_SORT_THREADS, 0, s>>>(ids, n_slots, set->n_experts, *ws);
    int64_t max_act = n_slots < set->n_experts ? n_slots : set->n_experts;
    switch (kg) {
    case MOE_F32:
        cuda_moe_go<MOE_F32>(s, set, kd, ws, max_act, top_k, n_sms);
        break;
    case MOE_F16:
        cuda_moe_go<MOE_F16>(s, set, kd, ws, max_act, top_k, n_sms);
        break;
    case MOE_BF16:
        cuda_moe_go<MOE_BF16>(s, set, kd, ws, max_act, top_k, n_sms);
        break;
    case MOE_Q4:
        cuda_moe_go<MOE_Q4>(s, set, kd, ws, max_act, top_k, n_sms);
        break;
    case MOE_Q8:
        cuda_moe_go<MOE_Q8>(s, set, kd, ws, max_act, top_k, n_sms);
        break;
    default:
        cuda_moe_go<MOE_SCALAR>(s, set, kd, ws, max_act, top_k, n_sms);
        break;
    }
    int64_t total = (int64_t)n * set->down.rows;
    cuda_moe_combine_kernel<<<cuda_blocks_for(total, 256), 256, 0, s>>>(ids, w, ws->ys, out, n, top_k,
                                                                         set->n_experts, (int)set->down.rows);
    return (int)cudaGetLastError();
}
