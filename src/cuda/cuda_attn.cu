/* Paged causal attention over the block tables of one step (tensor/backend.h backend_attn).
 *
 * Shapes: q, out [n_tokens, n_heads, head_dim] f32; K, V in the pool as backend_kv_view says
 * (bf16 or f32); row r of sequence s attends to positions [0, pos[r]] of s; GQA: head h reads
 * KV head h / (n_heads / n_kv_heads); head_dim <= CUDA_ATTN_MAX_HEAD_DIM.
 *
 * One kernel serves decode and prefill rows: a block of CUDA_ATTN_THREADS threads takes one
 * (row, head, split), where the split is a range of split_len positions; it walks the range in
 * chunks of CUDA_ATTN_CHUNK positions (one thread per position computes q.k, with 16-byte
 * loads of its K row when rows are 16-byte aligned, and the chunk's
 * softmax is folded into a running max and sum, and threads then own head dims and accumulate
 * p.v over the chunk, coalesced across the block). When a step has few rows (decode), the
 * context is split so that the grid fills the GPU (flash-decoding split-K) and a second kernel
 * combines the partials (acc, max, sum per split) in f32; with many rows (prefill) each block
 * takes a row's whole context and writes out directly.
 * Batch invariance: in a step of at most CUDA_ATTN_EXACT_ROWS rows (decode, small batches, the
 * k + 1 rows of a speculative verify chunk) a row's split length comes from its own context
 * alone (cuda_attn_row_split_len: at most CUDA_ATTN_ROW_SPLITS splits of whole passes), the
 * splits are combined in a fixed order, and such steps never take the tiled kernels: a row's
 * output is then the same bits alone, beside other sequences and as row j of a chunk (the
 * GEMVs are invariant up to the same row count, so greedy decoding is the same with and without
 * speculation). Larger steps plan for throughput (their matmuls take cuBLAS anyway).
 * Bytes per call: every (row, head) reads its context's K and V once (KV heads are re-read by
 * each query head of their group, mostly from L2): decode is bound by KV bandwidth; prefill is
 * far from the tensor-core bound. Steps with many rows per sequence (prefill chunks) take the
 * tiled kernel below instead, which reads each KV tile once per CUDA_ATTN_TQ rows (with BF16
 * KV and head_dim 64/128, the tensor-core kernel of cuda_attn_prefill.cu instead).
 * Decode steps with BF16 KV and the usual shapes (head_dim 64/128, 1/2/4/8 query heads per KV
 * head) take the decode kernel below: one block per (row, KV head, split) for all the heads of
 * the group, K and V of a pass loaded at once, and the combine done by the split that finishes
 * last, in the same launch. The three kernels fold a chunk of scores into the running softmax
 * with one function (cuda_attn_fold).
 * CPU reference: ref_attention_head in cpu/ref_ops.c. */
#include <math.h>

#include "cuda/cuda_common.cuh"

#define CUDA_ATTN_THREADS 128      /* threads per (row, head, split) block */
#define CUDA_ATTN_CHUNK 64         /* positions scored per pass (shared scores); short, so that
                                    * decode splits the context finely and the p.v loop is short */
#define CUDA_ATTN_MAX_HEAD_DIM CUDA_ATTN_HEAD_DIM_MAX /* q is staged in shared memory; 2 dims per thread */
#define CUDA_ATTN_DIMS_PER_THREAD (CUDA_ATTN_MAX_HEAD_DIM / CUDA_ATTN_THREADS)
#define CUDA_ATTN_TARGET_BLOCKS_PER_SM 8 /* split-K aims at this many blocks per SM */
#define CUDA_ATTN_ROW_SPLITS 32 /* steps of <= CUDA_ATTN_EXACT_ROWS rows: splits per row at most
                                 * (batch 1 of 8 KV heads: 256 blocks, ~2 per SM as before) */

/* Positions per split of a row with ctx positions in a batch-invariant step: whole units
 * (passes or chunks), at most CUDA_ATTN_ROW_SPLITS splits. */
static __host__ __device__ __forceinline__ int cuda_attn_row_split_len(int ctx, int unit)
{
    int units = (ctx + unit - 1) / unit;
    int per = (units + CUDA_ATTN_ROW_SPLITS - 1) / CUDA_ATTN_ROW_SPLITS;
    return (per < 1 ? 1 : per) * unit;
}

struct cuda_attn_args {
    const float *q;
    float *out;       /* n_splits == 1: the output */
    float *part;      /* n_splits > 1: [n_tokens][n_heads][n_splits][head_dim + 2]; the fast
                       * decode kernel: [n_tokens][n_heads][n_splits][head_dim], then part_ml */
    float *part_ml;   /* the fast decode kernel: [n_tokens][n_heads][n_splits] (max, sum) */
    const int32_t *pos;
    const int32_t *seq_off;
    const int32_t *block_tables;
    int bt_stride;
    int bt_min;       /* the fast decode kernel: entries every sequence's table row surely holds
                       * (cuda_k_attention's bt_min): its loads before the context is known stay
                       * below this */
    int n_seqs;
    int n_heads;
    int group;
    int n_splits;
    int split_len;    /* positions per split, a multiple of CUDA_ATTN_CHUNK (decode kernel: of
                       * its pass); 0: per row, cuda_attn_row_split_len of its context */
    float scale;
    int k_vec;        /* K rows are 16-byte aligned (head_dim * dtype size % 16 == 0): vector loads */
    struct backend_kv_view kv;
    int layer;
};

static __device__ __forceinline__ float cuda_attn_kv_load(const struct backend_kv_view &kv,
                                                          const uint8_t *base, int64_t idx)
{
    return kv.dtype == DTYPE_F32 ? ((const float *)base)[idx]
                                 : cuda_bf16_f32(((const uint16_t *)base)[idx]);
}

/* The online-softmax step every attention kernel takes per chunk of scores: the new running
 * max from the chunk's max, and the factor the old sum and accumulators are scaled by (0 on the
 * first chunk, where m_run is -inf). The caller then adds the chunk's sum of e^(s - m_new). */
static __device__ __forceinline__ float cuda_attn_fold(float &m_run, float m_chunk)
{
    float m_new = fmaxf(m_run, m_chunk);
    float corr = expf(m_run - m_new);
    m_run = m_new;
    return corr;
}

/* Sequence of row r: the last s with seq_off[s] <= r. */
static __device__ int cuda_attn_seq_of(const int32_t *seq_off, int n_seqs, int r)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seq_off[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The same, trying s = r first (a decode step: one row per sequence), checked with two loads
 * that go out together, so that a decode block does not wait on log2(n_seqs) dependent loads
 * before its first KV load. */
static __device__ __forceinline__ int cuda_attn_seq_of_guess(const int32_t *seq_off, int n_seqs,
                                                             int r)
{
    int g = min(r, n_seqs - 1);
    int lo = seq_off[g], hi = seq_off[g + 1];
    if (lo <= r && r < hi) return g;
    return cuda_attn_seq_of(seq_off, n_seqs, r);
}

static __global__ void __launch_bounds__(CUDA_ATTN_THREADS) cuda_attn_kernel(struct cuda_attn_args a)
{
    __shared__ float qs[CUDA_ATTN_MAX_HEAD_DIM];
    __shared__ float sc[CUDA_ATTN_CHUNK];
    __shared__ float red[32];
    const struct backend_kv_view &kv = a.kv;
    int r = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    int hd = kv.head_dim, kvh = h / a.group;
    int p_end = a.pos[r] + 1;
    int split_len = a.split_len ? a.split_len : cuda_attn_row_split_len(p_end, CUDA_ATTN_CHUNK);
    int p_begin = sp * split_len;
    if (p_begin >= p_end) return; /* the combine reads only the splits that hold positions */
    p_end = min(p_end, p_begin + split_len);
    int s = cuda_attn_seq_of(a.seq_off, a.n_seqs, r);
    const int32_t *bt = a.block_tables + (int64_t)s * a.bt_stride;
    const float *q = a.q + ((int64_t)r * a.n_heads + h) * hd;
    for (int d = tid; d < hd; d += CUDA_ATTN_THREADS) qs[d] = q[d];
    const uint8_t *kbase = (const uint8_t *)kv.k + (size_t)a.layer * kv.layer_block_bytes;
    const uint8_t *vbase = (const uint8_t *)kv.v + (size_t)a.layer * kv.layer_block_bytes;
    float m_run = -INFINITY, l_run = 0;
    float acc[CUDA_ATTN_DIMS_PER_THREAD];
#pragma unroll
    for (int j = 0; j < CUDA_ATTN_DIMS_PER_THREAD; j++) acc[j] = 0;
    __syncthreads();
    for (int c0 = p_begin; c0 < p_end; c0 += CUDA_ATTN_CHUNK) {
        int cn = min(CUDA_ATTN_CHUNK, p_end - c0);
        float m_loc = -INFINITY;
        for (int i = tid; i < cn; i += CUDA_ATTN_THREADS) {
            int p = c0 + i, blk = bt[p / kv.block_size], off = p % kv.block_size;
            const uint8_t *kb = kbase + (size_t)blk * kv.block_bytes;
            int64_t e0 = ((int64_t)off * kv.n_kv_heads + kvh) * hd;
            float dot = 0;
            if (a.k_vec && kv.dtype == DTYPE_BF16) { /* 16-byte loads: 8 bf16 */
                const uint4 *kr = (const uint4 *)((const uint16_t *)kb + e0);
                for (int d8 = 0; d8 < hd / 8; d8++) {
                    uint4 c = kr[d8];
                    const uint32_t u[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        dot += qs[d8 * 8 + 2 * j] * cuda_bf16_f32((uint16_t)(u[j] & 0xffffu));
                        dot += qs[d8 * 8 + 2 * j + 1] * cuda_bf16_f32((uint16_t)(u[j] >> 16));
                    }
                }
            } else if (a.k_vec) { /* 16-byte loads: 4 f32 */
                const float4 *kr = (const float4 *)((const float *)kb + e0);
                for (int d4 = 0; d4 < hd / 4; d4++) {
                    float4 c = kr[d4];
                    dot += qs[d4 * 4] * c.x + qs[d4 * 4 + 1] * c.y + qs[d4 * 4 + 2] * c.z + qs[d4 * 4 + 3] * c.w;
                }
            } else {
                for (int d = 0; d < hd; d++) dot += qs[d] * cuda_attn_kv_load(kv, kb, e0 + d);
            }
            dot *= a.scale;
            sc[i] = dot;
            m_loc = fmaxf(m_loc, dot);
        }
        float corr = cuda_attn_fold(m_run, cuda_block_max(m_loc, red)); /* syncs: sc is complete */
        float l_loc = 0;
        for (int i = tid; i < cn; i += CUDA_ATTN_THREADS) {
            float e = expf(sc[i] - m_run);
            sc[i] = e;
            l_loc += e;
        }
        l_run = l_run * corr + cuda_block_sum(l_loc, red); /* syncs: sc holds the weights */
#pragma unroll
        for (int j = 0; j < CUDA_ATTN_DIMS_PER_THREAD; j++) {
            int d = tid + j * CUDA_ATTN_THREADS;
            if (d >= hd) break;
            float sum = 0;
#pragma unroll 8
            for (int i = 0; i < cn; i++) {
                int p = c0 + i, blk = bt[p / kv.block_size], off = p % kv.block_size;
                const uint8_t *vb = vbase + (size_t)blk * kv.block_bytes;
                sum += sc[i] * cuda_attn_kv_load(kv, vb, ((int64_t)off * kv.n_kv_heads + kvh) * hd + d);
            }
            acc[j] = acc[j] * corr + sum;
        }
        __syncthreads(); /* sc is rewritten by the next chunk */
    }
    if (a.n_splits == 1) {
        float *o = a.out + ((int64_t)r * a.n_heads + h) * hd;
#pragma unroll
        for (int j = 0; j < CUDA_ATTN_DIMS_PER_THREAD; j++) {
            int d = tid + j * CUDA_ATTN_THREADS;
            if (d < hd) o[d] = acc[j] / l_run;
        }
        return;
    }
    float *pp = a.part + (((int64_t)r * a.n_heads + h) * a.n_splits + sp) * (hd + 2);
#pragma unroll
    for (int j = 0; j < CUDA_ATTN_DIMS_PER_THREAD; j++) {
        int d = tid + j * CUDA_ATTN_THREADS;
        if (d < hd) pp[d] = acc[j];
    }
    if (tid == 0) {
        pp[hd] = m_run;
        pp[hd + 1] = l_run;
    }
}

/* out[r, h] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits holding positions. */
static __global__ void __launch_bounds__(CUDA_ATTN_THREADS) cuda_attn_combine_kernel(struct cuda_attn_args a)
{
    int r = blockIdx.x, h = blockIdx.y, hd = a.kv.head_dim;
    int split_len = a.split_len ? a.split_len : cuda_attn_row_split_len(a.pos[r] + 1, CUDA_ATTN_CHUNK);
    int n_valid = (a.pos[r] + split_len) / split_len; /* ceil((pos + 1) / split_len) */
    n_valid = min(n_valid, a.n_splits);
    const float *pp = a.part + ((int64_t)r * a.n_heads + h) * a.n_splits * (hd + 2);
    float M = -INFINITY;
    for (int sp = 0; sp < n_valid; sp++) M = fmaxf(M, pp[(int64_t)sp * (hd + 2) + hd]);
    float L = 0;
    for (int sp = 0; sp < n_valid; sp++) {
        const float *p = pp + (int64_t)sp * (hd + 2);
        L += expf(p[hd] - M) * p[hd + 1];
    }
    float *o = a.out + ((int64_t)r * a.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += CUDA_ATTN_THREADS) {
        float v = 0;
        for (int sp = 0; sp < n_valid; sp++) {
            const float *p = pp + (int64_t)sp * (hd + 2);
            v += expf(p[hd] - M) * p[d];
        }
        o[d] = v / L;
    }
}

/* ---- decode: one block per (row, KV head, split), all G query heads of the KV head ----
 * For few rows per sequence (decode, small batches) with BF16 KV, head_dim 64 or 128 and a
 * group of 1, 2, 4 or 8 query heads per KV head: each KV row is read once for the G heads that
 * share it. hd / 8 lanes hold one position (a 16-byte chunk of its K and V row each), so a warp
 * covers 32 / (hd / 8) positions per load and a pass of CUDA_DEC_U loads per lane covers
 * CUDA_DEC_PASS positions: K and V of the whole pass are loaded before any is used (all in
 * flight at once), scores are reduced over the hd / 8 lanes by shuffles, the pass's max and sum
 * per head over the block (cuda_attn_fold), and p.v accumulated in registers. The last split
 * block of a (row, KV head) to finish combines the partials (a counter per (row, KV head) in
 * `counters`, zero between calls), so decode attention is one launch.
 * Versions (enum cuda_attn_dec, CAIRN_CUDA_ATTN_DEC): at batch 1 a block has one pass to do, so
 * its time is the chain of memory round trips it waits on, not bandwidth. The fast version
 * shortens that chain; the tuned and legacy ones stay for comparison:
 *  - with a split length fixed for the step (batch-invariant steps whose longest row needs at
 *    most CUDA_ATTN_ROW_SPLITS passes, where every row's split is one pass anyway; larger
 *    steps), the first pass's block-table entries, q and seq_off are loaded together with the
 *    row's position (the table of sequence r guessed, checked against seq_off, reloaded if
 *    wrong), not after it. The plan is the context bucket's, so the pass may lie past the
 *    row's real context, and a graph replays the launch for any context in the bucket: these
 *    early loads index the table at most at bt_min - 1 (entries every row surely holds: a
 *    graph's record drops the stride of a sequence alone, cuda_graph.c), and the entries of
 *    positions at or past bt_min * block_size are loaded again once the context is known. A
 *    block reads K/V only for positions below its row's context, so a table entry past it
 *    (padding, garbage) is never used;
 *  - the next pass's block-table entries are loaded while the current pass computes, so a pass
 *    waits on its K/V alone; positions past the split are not loaded at all;
 *  - the combine loads max, sum and acc (float4) of CUDA_DEC_COMBINE splits at once and folds
 *    them with a running max in split order, where the others wait on 2 x n_splits dependent
 *    loads. The order depends on the row's own split count only: batch invariance holds.
 * H200, graphs on, tuned -> fast: 8B BF16 tg128 after pp512 198.9 -> 209.9 tok/s (GPU 4,995 ->
 * 4,737 us a step), after pp4096 181.9 -> 195.5; 1B 879 -> 926; the kernel alone (bench-engine
 * --attn-sweep, 16/8 heads of 128, one step each) 15.3 -> 12.8 us at context 530. */
#define CUDA_DEC_THREADS 128
#define CUDA_DEC_WARPS (CUDA_DEC_THREADS / CUDA_WARP)
#define CUDA_DEC_U 4 /* positions per lane per pass */
/* The tuned kernel, groups of up to 4: registers capped (128) so that 4 blocks fit an SM (148
 * registers left 3: a 64-row step of the 8B, 512 blocks, ran 1.3 waves of 396 slots); a group of
 * 8 would spill. */
#define CUDA_DEC_MIN_BLOCKS 4
#define CUDA_DEC_COMBINE 8 /* fast: splits whose partials the combine loads at once */

template <int HD> struct cuda_dec_geom {
    static constexpr int lpp = HD / 8;                           /* lanes per position */
    static constexpr int ppw = CUDA_WARP / lpp;                  /* positions per warp load */
    static constexpr int pass = CUDA_DEC_WARPS * ppw * CUDA_DEC_U; /* positions per pass */
};

/* fast: the combine of the last split block: out[r, h] = sum_k e^(m_k - M) acc_k / sum_k
 * e^(m_k - M) l_k, folded CUDA_DEC_COMBINE splits at a time in split order (all of a group's
 * loads in flight together). */
template <int HD, int G>
static __device__ void cuda_dec_combine(const struct cuda_attn_args &a, int r, int kvh, int n_valid)
{
    for (int c = threadIdx.x; c < G * HD / 4; c += CUDA_DEC_THREADS) {
        int g = c / (HD / 4), d4 = c % (HD / 4);
        int64_t rh = (int64_t)r * a.n_heads + kvh * G + g;
        const float4 *pa = (const float4 *)(a.part + rh * a.n_splits * HD) + d4;
        const float2 *pm = (const float2 *)(a.part_ml + rh * a.n_splits * 2);
        float M = -INFINITY, L = 0;
        float4 v = make_float4(0, 0, 0, 0);
        for (int k0 = 0; k0 < n_valid; k0 += CUDA_DEC_COMBINE) {
            float4 t[CUDA_DEC_COMBINE];
            float2 ml[CUDA_DEC_COMBINE];
#pragma unroll
            for (int j = 0; j < CUDA_DEC_COMBINE; j++) {
                bool in = k0 + j < n_valid;
                t[j] = in ? __ldcg(pa + (int64_t)(k0 + j) * (HD / 4)) : make_float4(0, 0, 0, 0);
                ml[j] = in ? __ldcg(pm + k0 + j) : make_float2(-INFINITY, 0);
            }
            float mg = M;
#pragma unroll
            for (int j = 0; j < CUDA_DEC_COMBINE; j++) mg = fmaxf(mg, ml[j].x);
            /* mg is finite: split k0 holds positions; the first group scales the zeros by 0 */
            float corr = expf(M - mg);
            L *= corr;
            v.x *= corr, v.y *= corr, v.z *= corr, v.w *= corr;
#pragma unroll
            for (int j = 0; j < CUDA_DEC_COMBINE; j++) {
                float e = expf(ml[j].x - mg); /* 0 past n_valid */
                L = fmaf(e, ml[j].y, L);
                v.x = fmaf(e, t[j].x, v.x), v.y = fmaf(e, t[j].y, v.y);
                v.z = fmaf(e, t[j].z, v.z), v.w = fmaf(e, t[j].w, v.w);
            }
            M = mg;
        }
        float *o = a.out + rh * HD + d4 * 4;
        o[0] = v.x / L, o[1] = v.y / L, o[2] = v.z / L, o[3] = v.w / L;
    }
}

/* Position u of a lane's pass, from the pass's first position. */
template <int HD> static __device__ __forceinline__ int cuda_dec_lpos(int u, int warp, int pw)
{
    return (u * CUDA_DEC_WARPS + warp) * cuda_dec_geom<HD>::ppw + pw;
}

/* The lane's 8 dims of q for the G heads of KV head kvh. */
template <int HD, int G>
static __device__ __forceinline__ void cuda_dec_load_q(const struct cuda_attn_args &a, int r, int kvh,
                                                       int sub, float (&qv)[G][8])
{
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float4 *q4 = (const float4 *)(a.q + ((int64_t)r * a.n_heads + kvh * G + g) * HD + sub * 8);
        float4 lo = q4[0], hi = q4[1];
        qv[g][0] = lo.x, qv[g][1] = lo.y, qv[g][2] = lo.z, qv[g][3] = lo.w;
        qv[g][4] = hi.x, qv[g][5] = hi.y, qv[g][6] = hi.z, qv[g][7] = hi.w;
    }
}

/* pipe: 16 bytes global -> shared, zeros (src not read) when !in; commit; wait for all but N
 * of this thread's groups. */
static __device__ __forceinline__ void cuda_dec_cp16(uint4 *dst, const void *src, bool in)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(in ? 16 : 0));
}

template <int N> static __device__ __forceinline__ void cuda_dec_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* pipe: this lane's K and V chunks of the pass at c0 (block entries blk) into stage st, one
 * commit group. */
template <int HD>
static __device__ __forceinline__ void cuda_dec_issue(const struct cuda_attn_args &a, const uint8_t *kbase,
                                                      const uint8_t *vbase, int kvh, int sub, int warp, int pw,
                                                      int c0, int p_end, int b0, int b1, int b2, int b3,
                                                      uint4 *stg, int st)
{
    static_assert(CUDA_DEC_U == 4, "the block entries by value");
    const struct backend_kv_view &kv = a.kv;
    const int blk[CUDA_DEC_U] = {b0, b1, b2, b3};
#pragma unroll
    for (int u = 0; u < CUDA_DEC_U; u++) {
        int p = c0 + cuda_dec_lpos<HD>(u, warp, pw);
        bool in = p < p_end;
        size_t off = in ? (size_t)blk[u] * kv.block_bytes +
                              ((size_t)(p % kv.block_size) * kv.n_kv_heads + kvh) * HD * 2 + (size_t)sub * 16
                        : 0;
        cuda_dec_cp16(&stg[((st * 2 + 0) * CUDA_DEC_U + u) * CUDA_DEC_THREADS + threadIdx.x], kbase + off, in);
        cuda_dec_cp16(&stg[((st * 2 + 1) * CUDA_DEC_U + u) * CUDA_DEC_THREADS + threadIdx.x], vbase + off, in);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int HD, int G, int VER>
static __global__ void __launch_bounds__(CUDA_DEC_THREADS,
                                         (VER != CUDA_ATTN_DEC_LEGACY && G <= 4) ? CUDA_DEC_MIN_BLOCKS : 1)
    cuda_attn_decode_kernel(struct cuda_attn_args a, int *counters)
{
    typedef cuda_dec_geom<HD> geo;
    constexpr bool pipe = VER == CUDA_ATTN_DEC_PIPE, fast = VER == CUDA_ATTN_DEC_FAST || pipe;
    /* pipe: two stages of each lane's K and V chunks of a pass ([stage][K, V][u][thread]); the
     * block's partial sums (accs) reuse them once the passes are done */
    constexpr int ST = pipe ? 2 * 2 * CUDA_DEC_U * CUDA_DEC_THREADS : 1;
    static_assert(!pipe || ST * sizeof(uint4) >= sizeof(float) * CUDA_DEC_WARPS * G * HD, "accs in the stages");
    __shared__ __align__(16) uint4 stg[ST];
    __shared__ float red[2][CUDA_DEC_WARPS][G];
    __shared__ float accs_own[pipe ? 1 : CUDA_DEC_WARPS][G][HD];
    float (*accs)[G][HD] = pipe ? (float (*)[G][HD])(void *)stg : accs_own;
    __shared__ int last;
    const struct backend_kv_view &kv = a.kv;
    int r = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    int warp = tid / CUDA_WARP, lane = tid % CUDA_WARP, sub = lane % geo::lpp, pw = lane / geo::lpp;
    cuda_pdl_trigger(); /* the o_proj GEMV may launch and load weights (cuda_common.cuh) */
    int blk[CUDA_DEC_U] = {}; /* fast: the block of each of this lane's positions in the pass */
    int guess = min(r, a.n_seqs - 1), so_lo = 0, so_hi = 0;
    float qv[G][8];
    if (fast) { /* all of these before the position is in (see the comment above) */
        so_lo = a.seq_off[guess], so_hi = a.seq_off[guess + 1];
        if (a.split_len) {
            const int32_t *bt = a.block_tables + (int64_t)guess * a.bt_stride;
#pragma unroll
            for (int u = 0; u < CUDA_DEC_U; u++) { /* clamped into the entries every row holds */
                int p = sp * a.split_len + cuda_dec_lpos<HD>(u, warp, pw);
                blk[u] = __ldg(bt + min(p / kv.block_size, a.bt_min - 1));
            }
        }
    }
    int ctx = a.pos[r] + 1;
    if (fast) cuda_dec_load_q<HD, G>(a, r, kvh, sub, qv);
    int split_len = a.split_len ? a.split_len : cuda_attn_row_split_len(ctx, geo::pass);
    int n_valid = min((ctx + split_len - 1) / split_len, a.n_splits);
    if (sp >= n_valid) return; /* the combine counts only the splits that hold positions */
    int p_begin = sp * split_len, p_end = min(ctx, p_begin + split_len);
    int s;
    if (fast) s = so_lo <= r && r < so_hi ? guess : cuda_attn_seq_of(a.seq_off, a.n_seqs, r);
    else if (VER == CUDA_ATTN_DEC_TUNED) s = cuda_attn_seq_of_guess(a.seq_off, a.n_seqs, r);
    else s = cuda_attn_seq_of(a.seq_off, a.n_seqs, r);
    const int32_t *bt = a.block_tables + (int64_t)s * a.bt_stride;
    const uint8_t *kbase = (const uint8_t *)kv.k + (size_t)a.layer * kv.layer_block_bytes;
    const uint8_t *vbase = (const uint8_t *)kv.v + (size_t)a.layer * kv.layer_block_bytes;
    if (fast) { /* the first pass's blocks the early loads did not get right, now */
        bool early = a.split_len && s == guess; /* blk holds row s's entries below bt_min */
#pragma unroll
        for (int u = 0; u < CUDA_DEC_U; u++) {
            int p = p_begin + cuda_dec_lpos<HD>(u, warp, pw), i = p / kv.block_size;
            if (p < p_end && (!early || i >= a.bt_min)) blk[u] = __ldg(bt + i);
        }
    }
    if (!fast) cuda_dec_load_q<HD, G>(a, r, kvh, sub, qv); /* where the older versions load it */
    float m_run[G], l_run[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m_run[g] = -INFINITY;
        l_run[g] = 0;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0;
    }
    int flip = 0, stage = 0;
    if (pipe) { /* the first pass in flight, then the second's blocks */
        cuda_dec_issue<HD>(a, kbase, vbase, kvh, sub, warp, pw, p_begin, p_end, blk[0], blk[1], blk[2], blk[3], stg,
                           0);
#pragma unroll
        for (int u = 0; u < CUDA_DEC_U; u++) {
            int p = p_begin + geo::pass + cuda_dec_lpos<HD>(u, warp, pw);
            blk[u] = p < p_end ? __ldg(bt + p / kv.block_size) : 0;
        }
    }
    for (int c0 = p_begin; c0 < p_end; c0 += geo::pass) {
        uint4 kc[CUDA_DEC_U], vc[CUDA_DEC_U];
        bool ok[CUDA_DEC_U];
        if (pipe) { /* the next pass in flight, then this one's chunks from shared memory */
            const int nx = c0 + geo::pass;
            if (nx < p_end) {
                cuda_dec_issue<HD>(a, kbase, vbase, kvh, sub, warp, pw, nx, p_end, blk[0], blk[1], blk[2], blk[3], stg,
                                   stage ^ 1);
#pragma unroll
                for (int u = 0; u < CUDA_DEC_U; u++) {
                    int p = nx + geo::pass + cuda_dec_lpos<HD>(u, warp, pw);
                    blk[u] = p < p_end ? __ldg(bt + p / kv.block_size) : 0;
                }
                cuda_dec_wait<1>();
            } else {
                cuda_dec_wait<0>();
            }
        }
#pragma unroll
        for (int u = 0; u < CUDA_DEC_U; u++) {
            int p = c0 + cuda_dec_lpos<HD>(u, warp, pw);
            ok[u] = p < p_end;
            if (pipe) { /* this lane's own copies: no barrier needed */
                kc[u] = stg[((stage * 2 + 0) * CUDA_DEC_U + u) * CUDA_DEC_THREADS + threadIdx.x];
                vc[u] = stg[((stage * 2 + 1) * CUDA_DEC_U + u) * CUDA_DEC_THREADS + threadIdx.x];
            } else if (fast) {
                size_t off = (size_t)blk[u] * kv.block_bytes +
                             ((size_t)(p % kv.block_size) * kv.n_kv_heads + kvh) * HD * 2 + (size_t)sub * 16;
                kc[u] = ok[u] ? __ldg((const uint4 *)(kbase + off)) : make_uint4(0, 0, 0, 0);
                vc[u] = ok[u] ? __ldg((const uint4 *)(vbase + off)) : make_uint4(0, 0, 0, 0);
            } else {
                int pp = ok[u] ? p : p_begin;
                size_t off = (size_t)bt[pp / kv.block_size] * kv.block_bytes +
                             ((size_t)(pp % kv.block_size) * kv.n_kv_heads + kvh) * HD * 2 + (size_t)sub * 16;
                kc[u] = __ldg((const uint4 *)(kbase + off));
                vc[u] = __ldg((const uint4 *)(vbase + off));
            }
        }
        stage ^= 1;
        if (fast && !pipe) { /* the next pass's blocks, in flight while this pass computes */
#pragma unroll
            for (int u = 0; u < CUDA_DEC_U; u++) {
                int p = c0 + geo::pass + cuda_dec_lpos<HD>(u, warp, pw);
                blk[u] = p < p_end ? __ldg(bt + p / kv.block_size) : 0;
            }
        }
        float sc[CUDA_DEC_U][G], mx[G];
#pragma unroll
        for (int g = 0; g < G; g++) mx[g] = -INFINITY;
#pragma unroll
        for (int u = 0; u < CUDA_DEC_U; u++) {
            const uint32_t w[4] = {kc[u].x, kc[u].y, kc[u].z, kc[u].w};
#pragma unroll
            for (int g = 0; g < G; g++) {
                float d = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    d = fmaf(qv[g][2 * j], __uint_as_float(w[j] << 16), d);
                    d = fmaf(qv[g][2 * j + 1], __uint_as_float(w[j] & 0xffff0000u), d);
                }
#pragma unroll
                for (int o = geo::lpp / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                sc[u][g] = ok[u] ? d * a.scale : -INFINITY;
                mx[g] = fmaxf(mx[g], sc[u][g]);
            }
        }
        /* the pass's max per head over the block (red[flip] is not read by the previous pass
         * any more: that pass's sums used red[!flip] after a barrier) */
#pragma unroll
        for (int g = 0; g < G; g++) {
            float m = cuda_warp_max(mx[g]);
            if (lane == 0) red[flip][warp][g] = m;
        }
        __syncthreads();
        float corr[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            float m = red[flip][0][g];
#pragma unroll
            for (int w = 1; w < CUDA_DEC_WARPS; w++) m = fmaxf(m, red[flip][w][g]);
            corr[g] = cuda_attn_fold(m_run[g], m);
        }
        float ls[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            ls[g] = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] *= corr[g];
        }
#pragma unroll
        for (int u = 0; u < CUDA_DEC_U; u++) {
            const uint32_t w[4] = {vc[u].x, vc[u].y, vc[u].z, vc[u].w};
#pragma unroll
            for (int g = 0; g < G; g++) {
                float pr = expf(sc[u][g] - m_run[g]); /* 0 for positions past the split */
                if (sub == 0) ls[g] += pr;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    acc[g][2 * j] = fmaf(pr, __uint_as_float(w[j] << 16), acc[g][2 * j]);
                    acc[g][2 * j + 1] = fmaf(pr, __uint_as_float(w[j] & 0xffff0000u), acc[g][2 * j + 1]);
                }
            }
        }
        flip ^= 1;
#pragma unroll
        for (int g = 0; g < G; g++) {
            float l = cuda_warp_sum(ls[g]);
            if (lane == 0) red[flip][warp][g] = l;
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < G; g++) {
            float l = 0;
#pragma unroll
            for (int w = 0; w < CUDA_DEC_WARPS; w++) l += red[flip][w][g];
            l_run[g] = l_run[g] * corr[g] + l;
        }
        flip ^= 1;
    }
    if (pipe) cuda_dec_wait<0>(); /* (the last pass waited for all already) */
    /* acc over the positions of the block: lanes of one dim chunk, then warps (pipe: accs is
     * the stages, which every thread has finished reading: the last pass's barriers) */
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float v = acc[g][e];
#pragma unroll
            for (int o = geo::lpp; o < CUDA_WARP; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (pw == 0) accs[warp][g][sub * 8 + e] = v;
        }
    __syncthreads();
    bool single = n_valid == 1;
    for (int i = tid; i < G * HD; i += CUDA_DEC_THREADS) {
        int g = i / HD, d = i % HD;
        float v = 0;
#pragma unroll
        for (int w = 0; w < CUDA_DEC_WARPS; w++) v += accs[w][g][d];
        int64_t rh = (int64_t)r * a.n_heads + kvh * G + g;
        if (single) {
            a.out[rh * HD + d] = v / l_run[g];
        } else if (fast) {
            a.part[(rh * a.n_splits + sp) * HD + d] = v;
            if (d == 0) {
                a.part_ml[2 * (rh * a.n_splits + sp)] = m_run[g];
                a.part_ml[2 * (rh * a.n_splits + sp) + 1] = l_run[g];
            }
        } else {
            float *pp = a.part + (rh * a.n_splits + sp) * (HD + 2);
            pp[d] = v;
            if (d == 0) {
                pp[HD] = m_run[g];
                pp[HD + 1] = l_run[g];
            }
        }
    }
    if (single) return;
    /* the last split block of (r, kvh) combines: partials made visible before the count */
    __threadfence();
    __syncthreads();
    int *cnt = counters + (int64_t)r * kv.n_kv_heads + kvh;
    if (tid == 0) last = atomicAdd(cnt, 1) == n_valid - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (fast)
        cuda_dec_combine<HD, G>(a, r, kvh, n_valid);
    else
        for (int i = tid; i < G * HD; i += CUDA_DEC_THREADS) {
            int g = i / HD, d = i % HD;
            const float *pp = a.part + ((int64_t)r * a.n_heads + kvh * G + g) * a.n_splits * (HD + 2);
            float M = -INFINITY;
            for (int k = 0; k < n_valid; k++) M = fmaxf(M, __ldcg(pp + (int64_t)k * (HD + 2) + HD));
            float L = 0, v = 0;
            for (int k = 0; k < n_valid; k++) {
                const float *q = pp + (int64_t)k * (HD + 2);
                float e = expf(__ldcg(q + HD) - M);
                L += e * __ldcg(q + HD + 1);
                v += e * __ldcg(q + d);
            }
            a.out[((int64_t)r * a.n_heads + kvh * G + g) * HD + d] = v / L;
        }
    if (tid == 0) *cnt = 0; /* ready for the next call */
}

/* Whether a split-K step can take the decode kernel. */
static bool cuda_attn_use_decode(const struct backend_attn *at, int k_vec, size_t n_counters)
{
    const struct backend_kv_view *kv = at->kv;
    int g = at->n_heads / kv->n_kv_heads;
    return kv->dtype == DTYPE_BF16 && k_vec && (kv->head_dim == 64 || kv->head_dim == 128) &&
           (g == 1 || g == 2 || g == 4 || g == 8) &&
           (size_t)at->n_tokens * kv->n_kv_heads <= n_counters;
}

/* Splits of a batch-invariant step (n_tokens <= CUDA_ATTN_EXACT_ROWS): split_len 0 (per row),
 * as many splits as the longest row of the bucket can need. */
static void cuda_attn_row_plan(int max_ctx, int unit, int *n_splits, int *split_len)
{
    int units = (max_ctx + unit - 1) / unit;
    *n_splits = units < 1 ? 1 : units < CUDA_ATTN_ROW_SPLITS ? units : CUDA_ATTN_ROW_SPLITS;
    *split_len = 0;
}

/* Splits for the decode kernel: enough blocks for ~2 per SM, at least one pass per split
 * (steps of few rows: per row, cuda_attn_row_plan). Planning for 4 or 8 blocks per SM on
 * 64/128-row steps of the 8B was slower (H200: 8 layers' graph step 2,108 / 2,125 us at 64 rows
 * against 2,036 with the tuned kernel). */
static void cuda_attn_decode_plan(int n_tokens, int n_kv, int hd, int max_ctx, int n_sms,
                                  int *n_splits, int *split_len)
{
    int pass = hd == 64 ? cuda_dec_geom<64>::pass : cuda_dec_geom<128>::pass;
    if (n_tokens <= CUDA_ATTN_EXACT_ROWS) {
        cuda_attn_row_plan(max_ctx, pass, n_splits, split_len);
        return;
    }
    int64_t items = (int64_t)n_tokens * n_kv;
    int64_t want = (2 * (int64_t)n_sms + items - 1) / items;
    int max_passes = (max_ctx + pass - 1) / pass;
    int ns = (int)(want < 1 ? 1 : want > max_passes ? max_passes : want);
    if (ns < 1) ns = 1;
    int passes = (max_passes + ns - 1) / ns;
    *split_len = (passes < 1 ? 1 : passes) * pass;
    *n_splits = (max_ctx + *split_len - 1) / *split_len;
    if (*n_splits < 1) *n_splits = 1;
}

template <int HD, int VER>
static void cuda_attn_decode_launch(cudaStream_t s, const struct cuda_attn_args &a, int n_tokens,
                                    int n_kv, int *counters)
{
    dim3 grid((unsigned)n_tokens, (unsigned)n_kv, (unsigned)a.n_splits);
    switch (a.group) {
    case 1: cuda_attn_decode_kernel<HD, 1, VER><<<grid, CUDA_DEC_THREADS, 0, s>>>(a, counters); break;
    case 2: cuda_attn_decode_kernel<HD, 2, VER><<<grid, CUDA_DEC_THREADS, 0, s>>>(a, counters); break;
    case 4: cuda_attn_decode_kernel<HD, 4, VER><<<grid, CUDA_DEC_THREADS, 0, s>>>(a, counters); break;
    default: cuda_attn_decode_kernel<HD, 8, VER><<<grid, CUDA_DEC_THREADS, 0, s>>>(a, counters); break;
    }
}

/* ---- tiled prefill: CUDA_ATTN_TQ query rows of one sequence x one head per block ----
 * The block walks KV tiles of CUDA_ATTN_TK positions up to the tile's last position: K and V
 * go to shared memory once for all TQ rows (TQ times less KV traffic than a block per row);
 * 8 threads per query row compute its TK scores (the causal mask sets p > pos to -inf), fold
 * them into the row's running max and sum (shuffles among the 8), and accumulate p.v for
 * head_dim / 8 dims each, in registers. f32 on the CUDA cores: a correct tiled kernel; the
 * tensor-core (wmma/wgmma, bf16) version is the next step. */
#define CUDA_ATTN_TQ 16             /* query rows per tile */
#define CUDA_ATTN_TK 32             /* KV positions per tile */
#define CUDA_ATTN_TILE_THREADS 128  /* 8 threads per query row */
#define CUDA_ATTN_TILE_MAX_HD 128   /* shared memory (43 KB at 128) stays under the 48 KB default */
#define CUDA_ATTN_TILE_DPT (CUDA_ATTN_TILE_MAX_HD / 8) /* output dims per thread */

static size_t cuda_attn_tile_smem(int hd)
{
    return sizeof(float) * ((size_t)CUDA_ATTN_TQ * (hd + 1) + (size_t)CUDA_ATTN_TK * (hd + 1) +
                            (size_t)CUDA_ATTN_TK * hd + (size_t)CUDA_ATTN_TQ * (CUDA_ATTN_TK + 1));
}

static __global__ void __launch_bounds__(CUDA_ATTN_TILE_THREADS)
cuda_attn_tiled_kernel(struct cuda_attn_args a, const int32_t *tiles)
{
    extern __shared__ float smem[];
    const struct backend_kv_view &kv = a.kv;
    int hd = kv.head_dim, ld = hd + 1;
    float *qs = smem;                              /* [TQ][hd + 1] */
    float *ks = qs + CUDA_ATTN_TQ * ld;            /* [TK][hd + 1] */
    float *vs = ks + CUDA_ATTN_TK * ld;            /* [TK][hd] */
    float *ps = vs + CUDA_ATTN_TK * hd;            /* [TQ][TK + 1] */
    int h = blockIdx.y, tid = threadIdx.x;
    int r0 = tiles[2 * blockIdx.x], s = tiles[2 * blockIdx.x + 1];
    int nq = min(CUDA_ATTN_TQ, a.seq_off[s + 1] - r0);
    int kvh = h / a.group;
    const int32_t *bt = a.block_tables + (int64_t)s * a.bt_stride;
    for (int idx = tid; idx < CUDA_ATTN_TQ * hd; idx += CUDA_ATTN_TILE_THREADS) {
        int i = idx / hd, d = idx % hd;
        qs[i * ld + d] = i < nq ? a.q[((int64_t)(r0 + i) * a.n_heads + h) * hd + d] : 0.0f;
    }
    int max_pos = 0;
    for (int i = 0; i < nq; i++) max_pos = max(max_pos, a.pos[r0 + i]);
    int row = tid / 8, sub = tid % 8;
    int my_pos = row < nq ? a.pos[r0 + row] : 0; /* rows past the sequence: finite, not written */
    const uint8_t *kbase = (const uint8_t *)kv.k + (size_t)a.layer * kv.layer_block_bytes;
    const uint8_t *vbase = (const uint8_t *)kv.v + (size_t)a.layer * kv.layer_block_bytes;
    float m_run = -INFINITY, l_run = 0;
    float acc[CUDA_ATTN_TILE_DPT];
#pragma unroll
    for (int k = 0; k < CUDA_ATTN_TILE_DPT; k++) acc[k] = 0;
    for (int k0 = 0; k0 <= max_pos; k0 += CUDA_ATTN_TK) {
        __syncthreads(); /* the previous tile's ks, vs, ps are read; qs is written */
        for (int idx = tid; idx < CUDA_ATTN_TK * hd; idx += CUDA_ATTN_TILE_THREADS) {
            int j = idx / hd, d = idx % hd, p = k0 + j;
            float kf = 0, vf = 0;
            if (p <= max_pos) {
                int blk = bt[p / kv.block_size], off = p % kv.block_size;
                int64_t e = ((int64_t)off * kv.n_kv_heads + kvh) * hd + d;
                kf = cuda_attn_kv_load(kv, kbase + (size_t)blk * kv.block_bytes, e);
                vf = cuda_attn_kv_load(kv, vbase + (size_t)blk * kv.block_bytes, e);
            }
            ks[j * ld + d] = kf;
            vs[j * hd + d] = vf;
        }
        __syncthreads();
        float sc[CUDA_ATTN_TK / 8], mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < CUDA_ATTN_TK / 8; c++) {
            int j = sub + 8 * c;
            float dot = 0;
            for (int d = 0; d < hd; d++) dot += qs[row * ld + d] * ks[j * ld + d];
            dot = k0 + j > my_pos ? -INFINITY : dot * a.scale;
            sc[c] = dot;
            mx = fmaxf(mx, dot);
        }
        /* the 8 lanes of a row are consecutive and 8-aligned: xor 4, 2, 1 stays among them */
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        /* m_run finite after: position 0 is in every row's first tile */
        float corr = cuda_attn_fold(m_run, mx), sum = 0;
#pragma unroll
        for (int c = 0; c < CUDA_ATTN_TK / 8; c++) {
            float e = expf(sc[c] - m_run);
            ps[row * (CUDA_ATTN_TK + 1) + sub + 8 * c] = e;
            sum += e;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l_run = l_run * corr + sum;
        __syncwarp(); /* ps of this row was written by lanes of this warp */
#pragma unroll
        for (int k = 0; k < CUDA_ATTN_TILE_DPT; k++) {
            int d = sub + 8 * k;
            if (d < hd) {
                float o = acc[k] * corr;
                for (int j = 0; j < CUDA_ATTN_TK; j++) o += ps[row * (CUDA_ATTN_TK + 1) + j] * vs[j * hd + d];
                acc[k] = o;
            }
        }
    }
    if (row < nq) {
        float *o = a.out + ((int64_t)(r0 + row) * a.n_heads + h) * hd;
#pragma unroll
        for (int k = 0; k < CUDA_ATTN_TILE_DPT; k++) {
            int d = sub + 8 * k;
            if (d < hd) o[d] = acc[k] / l_run;
        }
    }
}

/* Whether a step takes the tiled kernel: many rows per sequence (prefill), head_dim it holds. */
static bool cuda_attn_use_tiled(const struct backend_attn *at, int mode)
{
    if (mode == CUDA_ATTN_SPLIT || at->kv->head_dim > CUDA_ATTN_TILE_MAX_HD) return false;
    if (mode == CUDA_ATTN_TILED) return true;
    /* small steps stay on split-K: a verify chunk's rows get their decode bits */
    return at->n_tokens > CUDA_ATTN_EXACT_ROWS && at->n_tokens >= CUDA_ATTN_TILED_MIN_ROWS * at->n_seqs;
}

/* Splits per (row, head) and positions per split for a step. */
static void cuda_attn_plan(int n_tokens, int n_heads, int max_ctx, int n_sms, int *n_splits,
                           int *split_len)
{
    if (n_tokens <= CUDA_ATTN_EXACT_ROWS) {
        cuda_attn_row_plan(max_ctx, CUDA_ATTN_CHUNK, n_splits, split_len);
        return;
    }
    int64_t rows = (int64_t)n_tokens * n_heads;
    int max_chunks = (max_ctx + CUDA_ATTN_CHUNK - 1) / CUDA_ATTN_CHUNK;
    int64_t want = ((int64_t)CUDA_ATTN_TARGET_BLOCKS_PER_SM * n_sms + rows - 1) / rows;
    int ns = (int)(want < 1 ? 1 : want > max_chunks ? max_chunks : want);
    if (ns < 1) ns = 1;
    int chunks_per_split = (max_chunks + ns - 1) / ns;
    *split_len = (chunks_per_split < 1 ? 1 : chunks_per_split) * CUDA_ATTN_CHUNK;
    *n_splits = (max_ctx + *split_len - 1) / *split_len;
    if (*n_splits < 1) *n_splits = 1;
}

extern "C" int cuda_attn_tiled(const struct backend_attn *a, int mode)
{
    return cuda_attn_use_tiled(a, mode);
}

/* K rows 16-byte aligned (head_dim * dtype size % 16 == 0 and aligned bases): vector loads. */
static int cuda_attn_k_vec(const struct backend_kv_view *kv)
{
    size_t row_bytes = (size_t)kv->head_dim * (kv->dtype == DTYPE_F32 ? 4 : 2);
    return row_bytes % 16 == 0 && (uintptr_t)kv->k % 16 == 0 && (uintptr_t)kv->v % 16 == 0 &&
           kv->layer_block_bytes % 16 == 0;
}

extern "C" size_t cuda_attn_ws_floats(const struct backend_attn *a, int max_ctx, int n_sms,
                                      int mode, size_t n_counters)
{
    if (cuda_attn_use_tiled(a, mode)) return 2 * (size_t)(a->n_tokens + a->n_seqs); /* tile list */
    int ns, len;
    if (cuda_attn_use_decode(a, cuda_attn_k_vec(a->kv), n_counters))
        cuda_attn_decode_plan(a->n_tokens, a->kv->n_kv_heads, a->kv->head_dim, max_ctx, n_sms, &ns,
                              &len);
    else
        cuda_attn_plan(a->n_tokens, a->n_heads, max_ctx, n_sms, &ns, &len);
    return ns == 1 ? 0 : (size_t)a->n_tokens * a->n_heads * ns * (size_t)(a->kv->head_dim + 2);
}

extern "C" int cuda_k_attention(cudaStream_t s, const struct backend_attn *at, int max_ctx,
                                int bt_min, int n_sms, int mode, int dec, float *ws,
                                int32_t *tiles_host, int *counters, size_t n_counters)
{
    if (at->n_tokens <= 0) return (int)cudaGetLastError();
    if (at->kv->head_dim > CUDA_ATTN_MAX_HEAD_DIM || at->n_heads > 65535)
        return (int)cudaErrorInvalidValue;
    struct cuda_attn_args a;
    a.q = at->q;
    a.out = at->out;
    a.part = ws;
    a.part_ml = NULL;
    a.pos = at->pos;
    a.seq_off = at->seq_off;
    a.block_tables = at->block_tables;
    a.bt_stride = at->bt_stride;
    a.bt_min = bt_min < 1 ? 1 : bt_min; /* a row with positions holds one entry at least */
    a.n_seqs = at->n_seqs;
    a.n_heads = at->n_heads;
    a.group = at->n_heads / at->kv->n_kv_heads;
    a.scale = at->scale;
    a.kv = *at->kv;
    a.layer = at->layer;
    a.k_vec = cuda_attn_k_vec(at->kv);
    if (cuda_attn_use_tiled(at, mode)) {
        /* BF16 KV, head_dim 64/128: the tensor-core kernel (cuda_attn_prefill.cu), unless
         * CAIRN_CUDA_ATTN=tiled asks for this one. */
        if (mode != CUDA_ATTN_TILED && cuda_attn_prefill_ok(at))
            return cuda_k_attn_prefill(s, at, (int32_t *)ws, tiles_host);
        /* Tiles of up to TQ rows that never cross a sequence: (first row, sequence) pairs. */
        int n_tiles = 0;
        for (int q = 0; q < at->n_seqs; q++)
            for (int r0 = at->seq_off_host[q]; r0 < at->seq_off_host[q + 1]; r0 += CUDA_ATTN_TQ) {
                tiles_host[2 * n_tiles] = r0;
                tiles_host[2 * n_tiles + 1] = q;
                n_tiles++;
            }
        if (!n_tiles) return (int)cudaGetLastError();
        /* pageable: staged before the call returns, so tiles_host may be reused at once */
        cudaError_t rc = cudaMemcpyAsync(ws, tiles_host, sizeof(int32_t) * 2 * (size_t)n_tiles,
                                         cudaMemcpyHostToDevice, s);
        if (rc != cudaSuccess) return (int)rc;
        a.n_splits = 1;
        a.split_len = 0;
        dim3 grid((unsigned)n_tiles, (unsigned)at->n_heads);
        cuda_attn_tiled_kernel<<<grid, CUDA_ATTN_TILE_THREADS, cuda_attn_tile_smem(at->kv->head_dim), s>>>(
            a, (const int32_t *)ws);
        return (int)cudaGetLastError();
    }
    if (cuda_attn_use_decode(at, a.k_vec, n_counters)) {
        int n_kv = at->kv->n_kv_heads;
        cuda_attn_decode_plan(at->n_tokens, n_kv, at->kv->head_dim, max_ctx, n_sms, &a.n_splits,
                              &a.split_len);
        if (a.n_splits > 65535 || n_kv > 65535) return (int)cudaErrorInvalidValue;
        int hd = at->kv->head_dim, pass = hd == 64 ? cuda_dec_geom<64>::pass : cuda_dec_geom<128>::pass;
        if (dec == CUDA_ATTN_DEC_FAST || dec == CUDA_ATTN_DEC_PIPE) {
            /* every row's split one pass, fixed, so that blocks need not wait for the position
             * to find their first pass (cuda_attn_row_split_len is one pass for any context up
             * to CUDA_ATTN_ROW_SPLITS passes: the same splits, the same bits) */
            if (a.split_len == 0 && (max_ctx + pass - 1) / pass <= CUDA_ATTN_ROW_SPLITS) a.split_len = pass;
            if (a.n_splits > 1) a.part_ml = ws + (size_t)at->n_tokens * at->n_heads * a.n_splits * hd;
        }
        if (dec == CUDA_ATTN_DEC_PIPE) {
            if (hd == 64) cuda_attn_decode_launch<64, CUDA_ATTN_DEC_PIPE>(s, a, at->n_tokens, n_kv, counters);
            else cuda_attn_decode_launch<128, CUDA_ATTN_DEC_PIPE>(s, a, at->n_tokens, n_kv, counters);
        } else if (dec == CUDA_ATTN_DEC_FAST) {
            if (hd == 64) cuda_attn_decode_launch<64, CUDA_ATTN_DEC_FAST>(s, a, at->n_tokens, n_kv, counters);
            else cuda_attn_decode_launch<128, CUDA_ATTN_DEC_FAST>(s, a, at->n_tokens, n_kv, counters);
        } else if (dec == CUDA_ATTN_DEC_TUNED) {
            if (hd == 64) cuda_attn_decode_launch<64, CUDA_ATTN_DEC_TUNED>(s, a, at->n_tokens, n_kv, counters);
            else cuda_attn_decode_launch<128, CUDA_ATTN_DEC_TUNED>(s, a, at->n_tokens, n_kv, counters);
        } else {
            if (hd == 64) cuda_attn_decode_launch<64, CUDA_ATTN_DEC_LEGACY>(s, a, at->n_tokens, n_kv, counters);
            else cuda_attn_decode_launch<128, CUDA_ATTN_DEC_LEGACY>(s, a, at->n_tokens, n_kv, counters);
        }
        return (int)cudaGetLastError();
    }
    cuda_attn_plan(at->n_tokens, at->n_heads, max_ctx, n_sms, &a.n_splits, &a.split_len);
    if (a.n_splits > 65535) return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)at->n_tokens, (unsigned)at->n_heads, (unsigned)a.n_splits);
    cuda_attn_kernel<<<grid, CUDA_ATTN_THREADS, 0, s>>>(a);
    if (a.n_splits > 1) {
        dim3 g2((unsigned)at->n_tokens, (unsigned)at->n_heads);
        cuda_attn_combine_kernel<<<g2, CUDA_ATTN_THREADS, 0, s>>>(a);
    }
    return (int)cudaGetLastError();
}
