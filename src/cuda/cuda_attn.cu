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
 * Bytes per call: every (row, head) reads its context's K and V once (KV heads are re-read by
 * each query head of their group, mostly from L2): decode is bound by KV bandwidth; prefill is
 * far from the tensor-core bound (this is the correct f32 kernel; a tiled tensor-core prefill
 * kernel is the next step). CPU reference: ref_attention_head in cpu/ref_ops.c. */
#include <math.h>

#include "cuda/cuda_common.cuh"

#define CUDA_ATTN_THREADS 128      /* threads per (row, head, split) block */
#define CUDA_ATTN_CHUNK 256        /* positions scored per pass (shared scores) */
#define CUDA_ATTN_MAX_HEAD_DIM CUDA_ATTN_HEAD_DIM_MAX /* q is staged in shared memory; 2 dims per thread */
#define CUDA_ATTN_DIMS_PER_THREAD (CUDA_ATTN_MAX_HEAD_DIM / CUDA_ATTN_THREADS)
#define CUDA_ATTN_TARGET_BLOCKS_PER_SM 4 /* split-K aims at this many blocks per SM */

struct cuda_attn_args {
    const float *q;
    float *out;       /* n_splits == 1: the output */
    float *part;      /* n_splits > 1: [n_tokens][n_heads][n_splits][head_dim + 2] */
    const int32_t *pos;
    const int32_t *seq_off;
    const int32_t *block_tables;
    int bt_stride;
    int n_seqs;
    int n_heads;
    int group;
    int n_splits;
    int split_len;    /* positions per split, a multiple of CUDA_ATTN_CHUNK */
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

static __global__ void __launch_bounds__(CUDA_ATTN_THREADS) cuda_attn_kernel(struct cuda_attn_args a)
{
    __shared__ float qs[CUDA_ATTN_MAX_HEAD_DIM];
    __shared__ float sc[CUDA_ATTN_CHUNK];
    __shared__ float red[32];
    const struct backend_kv_view &kv = a.kv;
    int r = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
    int hd = kv.head_dim, kvh = h / a.group;
    int p_end = a.pos[r] + 1;
    int p_begin = sp * a.split_len;
    if (p_begin >= p_end) return; /* the combine reads only the splits that hold positions */
    p_end = min(p_end, p_begin + a.split_len);
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
        float m_new = fmaxf(m_run, cuda_block_max(m_loc, red)); /* syncs: sc is complete */
        float l_loc = 0;
        for (int i = tid; i < cn; i += CUDA_ATTN_THREADS) {
            float e = expf(sc[i] - m_new);
            sc[i] = e;
            l_loc += e;
        }
        float corr = expf(m_run - m_new); /* 0 on the first chunk (m_run = -inf) */
        l_run = l_run * corr + cuda_block_sum(l_loc, red); /* syncs: sc holds the weights */
        m_run = m_new;
#pragma unroll
        for (int j = 0; j < CUDA_ATTN_DIMS_PER_THREAD; j++) {
            int d = tid + j * CUDA_ATTN_THREADS;
            if (d >= hd) break;
            float sum = 0;
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
    int n_valid = (a.pos[r] + a.split_len) / a.split_len; /* ceil((pos + 1) / split_len) */
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

/* Splits per (row, head) and positions per split for a step. */
static void cuda_attn_plan(int n_tokens, int n_heads, int max_ctx, int n_sms, int *n_splits,
                           int *split_len)
{
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

extern "C" size_t cuda_attn_ws_floats(int n_tokens, int n_heads, int head_dim, int max_ctx, int n_sms)
{
    int ns, len;
    cuda_attn_plan(n_tokens, n_heads, max_ctx, n_sms, &ns, &len);
    return ns == 1 ? 0 : (size_t)n_tokens * n_heads * ns * (size_t)(head_dim + 2);
}

extern "C" int cuda_k_attention(cudaStream_t s, const struct backend_attn *at, int max_ctx,
                                int n_sms, float *ws)
{
    if (at->n_tokens <= 0) return (int)cudaGetLastError();
    if (at->kv->head_dim > CUDA_ATTN_MAX_HEAD_DIM || at->n_heads > 65535)
        return (int)cudaErrorInvalidValue;
    struct cuda_attn_args a;
    a.q = at->q;
    a.out = at->out;
    a.part = ws;
    a.pos = at->pos;
    a.seq_off = at->seq_off;
    a.block_tables = at->block_tables;
    a.bt_stride = at->bt_stride;
    a.n_seqs = at->n_seqs;
    a.n_heads = at->n_heads;
    a.group = at->n_heads / at->kv->n_kv_heads;
    a.scale = at->scale;
    a.kv = *at->kv;
    a.layer = at->layer;
    size_t row_bytes = (size_t)at->kv->head_dim * (at->kv->dtype == DTYPE_F32 ? 4 : 2);
    a.k_vec = row_bytes % 16 == 0 && (uintptr_t)at->kv->k % 16 == 0 && at->kv->layer_block_bytes % 16 == 0;
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
