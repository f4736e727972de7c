/* Element-wise and row-wise kernels: embeddings, RMSNorm, RoPE, SwiGLU, residual and bias adds,
 * sigmoid gates, row shuffles, KV stores (alone, or with the q/k norms and RoPE in one launch:
 * qk_rope_store) and MoE routing. RMSNorm, SiLU and qk_rope_store launch with programmatic
 * dependent launch (cuda_common.cuh): they wait for their inputs first thing.
 *
 * Shapes are those of tensor/backend.h (activations f32 row-major [rows, dim]). All of these
 * are memory-bound and small next to the matmuls: each reads its inputs and writes its output
 * once (RMSNorm: x read once into the reduction and once for the scaled write, from L1/L2), so
 * the bound they aim at is HBM bandwidth, with plain coalesced 4-byte accesses and grid-stride
 * loops of CUDA_ELEM_THREADS threads (RMSNorm: float4 rows held in registers, see below).
 * CPU references: cpu/ref_ops.c and model/moe.c. */
#include <math.h>

#include "cuda/cuda_common.cuh"

#define CUDA_ELEM_THREADS 256 /* threads per block of the element-wise kernels */
#define CUDA_ROW_THREADS 256  /* threads per row of RMSNorm and embed */

#define CUDA_GRID_STRIDE(i, n)                                                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

static unsigned cuda_elem_blocks(int64_t n) { return cuda_blocks_for(n, CUDA_ELEM_THREADS); }

/* ---- embed: out[n, cols] = rows ids[i] of W ---- */

static __global__ void cuda_embed_kernel(struct cuda_wdesc w, const int32_t *ids, int n, float *out)
{
    const uint8_t *row = (const uint8_t *)w.data + (size_t)ids[blockIdx.x] * w.row_bytes;
    float *o = out + (int64_t)blockIdx.x * w.cols;
    for (int64_t i = threadIdx.x; i < w.cols; i += blockDim.x) o[i] = cuda_w_elem(w, row, i);
}

extern "C" int cuda_k_embed(cudaStream_t s, const struct cuda_wdesc *w, const int32_t *ids, int n,
                            float *out)
{
    if (n > 0) cuda_embed_kernel<<<n, CUDA_ROW_THREADS, 0, s>>>(*w, ids, n, out);
    return (int)cudaGetLastError();
}

/* ---- rmsnorm: y may alias x (each thread rewrites what it read) ----
 * Rows of up to CUDA_RMS_WARP_DIM floats (q/k norms over head_dim): one warp per row, 8 rows
 * per block. Wider rows (the hidden state): one block per row, sized so that each thread holds
 * at most CUDA_RMS_VEC float4 of the row in registers (x read once, one block reduction).
 * Both need dim % 4 == 0 and 16-byte aligned rows; else one block per row, element-wise. */
#define CUDA_RMS_VEC 4
#define CUDA_RMS_WARP_DIM (CUDA_WARP * 4 * CUDA_RMS_VEC)
#define CUDA_RMS_MAX_THREADS 1024

static __global__ void cuda_rmsnorm_kernel(float *y, const float *x, const float *w, int dim,
                                           float eps, float w_offset)
{
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = cuda_block_sum(ss, red);
    float inv = cuda_rms_inv(ss, dim, eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = xr[i] * inv * (w ? w[i] + w_offset : 1.0f);
}

/* One row in float4s: thread `first` holds elements first + k * stride (k < CUDA_RMS_VEC) in
 * registers; the sum of squares is reduced over the warp (warp_only) or the block (red). */
static __device__ __forceinline__ void cuda_rms_vec_row(float4 *y4, const float4 *x4, const float4 *w4,
                                                        int n4, int first, int stride, int dim,
                                                        float eps, float w_offset, bool warp_only,
                                                        float *red)
{
    float4 v[CUDA_RMS_VEC];
    float ss = 0;
#pragma unroll
    for (int k = 0; k < CUDA_RMS_VEC; k++) {
        int i = first + k * stride;
        v[k] = i < n4 ? x4[i] : make_float4(0, 0, 0, 0);
        ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    ss = warp_only ? cuda_warp_sum(ss) : cuda_block_sum(ss, red);
    float inv = cuda_rms_inv(ss, dim, eps);
#pragma unroll
    for (int k = 0; k < CUDA_RMS_VEC; k++) {
        int i = first + k * stride;
        if (i >= n4) break;
        float4 o = make_float4(v[k].x * inv, v[k].y * inv, v[k].z * inv, v[k].w * inv);
        if (w4) {
            float4 g = w4[i];
            o.x *= g.x + w_offset;
            o.y *= g.y + w_offset;
            o.z *= g.z + w_offset;
            o.w *= g.w + w_offset;
        }
        y4[i] = o;
    }
}

static __global__ void __launch_bounds__(CUDA_RMS_MAX_THREADS)
cuda_rmsnorm_row_kernel(float *y, const float *x, const float *w, int dim, float eps, float w_offset)
{
    __shared__ float red[32];
    int n4 = dim / 4;
    cuda_pdl_wait();
    cuda_pdl_trigger();
    cuda_rms_vec_row((float4 *)(y + (int64_t)blockIdx.x * dim), (const float4 *)(x + (int64_t)blockIdx.x * dim),
                     (const float4 *)w, n4, threadIdx.x, blockDim.x, dim, eps, w_offset, false, red);
}

static __global__ void __launch_bounds__(CUDA_ELEM_THREADS)
cuda_rmsnorm_warp_kernel(float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                         float w_offset)
{
    int64_t r = (int64_t)blockIdx.x * (CUDA_ELEM_THREADS / CUDA_WARP) + threadIdx.x / CUDA_WARP;
    cuda_pdl_wait();
    cuda_pdl_trigger();
    if (r >= n_rows) return; /* whole warps leave: the shuffles below see full warps */
    cuda_rms_vec_row((float4 *)(y + r * dim), (const float4 *)(x + r * dim), (const float4 *)w, dim / 4,
                     threadIdx.x % CUDA_WARP, CUDA_WARP, dim, eps, w_offset, true, NULL);
}

extern "C" int cuda_k_rmsnorm(cudaStream_t s, float *y, const float *x, const float *w, int n_rows,
                              int dim, float eps, float w_offset)
{
    if (n_rows <= 0) return (int)cudaGetLastError();
    bool vec = dim % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)y % 16 == 0 && (!w || (uintptr_t)w % 16 == 0);
    int n4 = dim / 4;
    if (vec && dim <= CUDA_RMS_WARP_DIM) {
        (void)cuda_launch_pdl(cuda_rmsnorm_warp_kernel, cuda_blocks_for(n_rows, CUDA_ELEM_THREADS / CUDA_WARP),
                              CUDA_ELEM_THREADS, s, y, x, w, n_rows, dim, eps, w_offset);
    } else if (vec && n4 <= CUDA_RMS_MAX_THREADS * CUDA_RMS_VEC) {
        int threads = (n4 + CUDA_RMS_VEC - 1) / CUDA_RMS_VEC;
        threads = (threads + CUDA_WARP - 1) / CUDA_WARP * CUDA_WARP;
        (void)cuda_launch_pdl(cuda_rmsnorm_row_kernel, (unsigned)n_rows, (unsigned)threads, s, y, x, w, dim, eps,
                              w_offset);
    } else {
        cuda_rmsnorm_kernel<<<n_rows, CUDA_ROW_THREADS, 0, s>>>(y, x, w, dim, eps, w_offset);
    }
    return (int)cudaGetLastError();
}

/* ---- rope: rotate-half on the first rot_dim dims of each head; the angle in double, as the
 * reference, because pos * inv_freq reaches 1e5 rad and f32 would lose the phase ---- */

static __global__ void cuda_rope_kernel(float *x, int n_tokens, int n_heads, int head_dim, int half,
                                        const int32_t *pos, const float *inv_freq)
{
    int64_t n = (int64_t)n_tokens * n_heads * half;
    CUDA_GRID_STRIDE(idx, n) {
        int i = (int)(idx % half);
        int64_t th = idx / half; /* token * n_heads + head */
        int t = (int)(th / n_heads);
        float *v = x + th * head_dim;
        double sn, cs;
        sincos((double)pos[t] * (double)inv_freq[i], &sn, &cs);
        float c = (float)cs, sf = (float)sn;
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * sf;
        v[i + half] = b * c + a * sf;
    }
}

extern "C" int cuda_k_rope(cudaStream_t s, float *x, int n_tokens, int n_heads, int head_dim,
                           int rot_dim, const int32_t *pos, const float *inv_freq)
{
    int half = rot_dim / 2;
    int64_t n = (int64_t)n_tokens * n_heads * half;
    if (n > 0)
        cuda_rope_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(x, n_tokens, n_heads,
                                                                            head_dim, half, pos, inv_freq);
    return (int)cudaGetLastError();
}

/* ---- element-wise ---- */

static __global__ void cuda_silu_mul_kernel(float *out, const float *gate, const float *up, int64_t n)
{
    cuda_pdl_wait();
    cuda_pdl_trigger();
    CUDA_GRID_STRIDE(i, n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static __global__ void cuda_add_kernel(float *y, const float *x, int64_t n)
{
    CUDA_GRID_STRIDE(i, n) y[i] += x[i];
}

static __global__ void cuda_add_bias_kernel(float *y, const float *b, int64_t n, int dim)
{
    CUDA_GRID_STRIDE(i, n) y[i] += b[i % dim];
}

static __global__ void cuda_mul_sigmoid_kernel(float *y, const float *g, int64_t n)
{
    CUDA_GRID_STRIDE(i, n) y[i] *= 1.0f / (1.0f + expf(-g[i]));
}

static __global__ void cuda_add_sigmoid_scaled_kernel(float *y, const float *x, const float *g,
                                                      int64_t n, int dim)
{
    CUDA_GRID_STRIDE(i, n) y[i] += 1.0f / (1.0f + expf(-g[i / dim])) * x[i];
}

static __global__ void cuda_split_halves_kernel(float *a, float *b, const float *src, int64_t n,
                                                int width)
{
    CUDA_GRID_STRIDE(i, n) { /* i over [n_rows, width] */
        int64_t r = i / width, j = i % width;
        a[i] = src[r * 2 * width + j];
        b[i] = src[r * 2 * width + width + j];
    }
}

static __global__ void cuda_gather_rows_kernel(float *dst, const float *src, const int32_t *rows,
                                               int64_t n, int dim)
{
    CUDA_GRID_STRIDE(i, n) dst[i] = src[(int64_t)rows[i / dim] * dim + i % dim];
}

extern "C" int cuda_k_silu_mul(cudaStream_t s, float *out, const float *gate, const float *up, int64_t n)
{
    if (n > 0) (void)cuda_launch_pdl(cuda_silu_mul_kernel, cuda_elem_blocks(n), CUDA_ELEM_THREADS, s, out, gate, up, n);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_add(cudaStream_t s, float *y, const float *x, int64_t n)
{
    if (n > 0) cuda_add_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(y, x, n);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_add_bias(cudaStream_t s, float *y, const float *b, int n_rows, int dim)
{
    int64_t n = (int64_t)n_rows * dim;
    if (n > 0) cuda_add_bias_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(y, b, n, dim);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_mul_sigmoid(cudaStream_t s, float *y, const float *g, int64_t n)
{
    if (n > 0) cuda_mul_sigmoid_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(y, g, n);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_add_sigmoid_scaled(cudaStream_t s, float *y, const float *x, const float *g,
                                         int n_rows, int dim)
{
    int64_t n = (int64_t)n_rows * dim;
    if (n > 0)
        cuda_add_sigmoid_scaled_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(y, x, g, n, dim);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_split_halves(cudaStream_t s, float *a, float *b, const float *src, int n_rows,
                                   int width)
{
    int64_t n = (int64_t)n_rows * width;
    if (n > 0)
        cuda_split_halves_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(a, b, src, n, width);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_gather_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows,
                                  int n, int dim)
{
    int64_t total = (int64_t)n * dim;
    if (total > 0)
        cuda_gather_rows_kernel<<<cuda_elem_blocks(total), CUDA_ELEM_THREADS, 0, s>>>(dst, src, rows,
                                                                                       total, dim);
    return (int)cudaGetLastError();
}

/* ---- kv_store: k, v [n_tokens, n_kv_heads * head_dim] f32 -> the pool at global slots ---- */

static __global__ void cuda_kv_store_kernel(struct backend_kv_view kv, int layer, const int32_t *slots,
                                            int64_t n, const float *k, const float *v)
{
    int64_t row = (int64_t)kv.n_kv_heads * kv.head_dim;
    CUDA_GRID_STRIDE(i, n) {
        int64_t t = i / row, e = i % row;
        int slot = slots[t], blk = slot / kv.block_size, off = slot % kv.block_size;
        size_t at = (size_t)blk * kv.block_bytes + (size_t)layer * kv.layer_block_bytes;
        int64_t idx = (int64_t)off * row + e;
        if (kv.dtype == DTYPE_F32) {
            ((float *)((uint8_t *)kv.k + at))[idx] = k[i];
            ((float *)((uint8_t *)kv.v + at))[idx] = v[i];
        } else {
            ((uint16_t *)((uint8_t *)kv.k + at))[idx] = cuda_f32_bf16(k[i]);
            ((uint16_t *)((uint8_t *)kv.v + at))[idx] = cuda_f32_bf16(v[i]);
        }
    }
}

extern "C" int cuda_k_kv_store(cudaStream_t s, const struct backend_kv_view *kv, int layer,
                               const int32_t *slots, int n_tokens, const float *k, const float *v)
{
    int64_t n = (int64_t)n_tokens * kv->n_kv_heads * kv->head_dim;
    if (n > 0)
        cuda_kv_store_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(*kv, layer, slots, n, k, v);
    return (int)cudaGetLastError();
}

/* ---- qk_rope_store: q/k norms, rope and the KV write of one layer in one launch ----
 * One block per (token, head) of q, k and v (blocks [0, nh) of a token are its q heads, then
 * nkv k heads, then nkv v heads). The head is read once into shared memory; q and k heads are
 * normed (when their weight is given: the sum of squares over the block, cuda_rms_inv, then
 * (x * inv) * (w + offset) as the rmsnorm kernels do) and rotated with the angles of
 * cuda_rope_kernel (double sincos, the same products), then written back in place; k and v
 * heads are stored into the pool as cuda_kv_store_kernel stores them. So each value equals the
 * unfused sequence's but for the order of the norm's sum of squares. Decode: 48 blocks on the
 * 8B instead of five launches (two norms, two ropes, the store). */
#define CUDA_QKR_THREADS 128

struct cuda_qkr {
    float *q, *k;
    const float *v, *q_norm, *k_norm, *inv_freq;
    const int32_t *pos, *slots;
    struct backend_kv_view kv;
    int n_heads, rot_dim, layer;
    float eps, w_offset;
};

static __global__ void __launch_bounds__(CUDA_QKR_THREADS) cuda_qk_rope_store_kernel(struct cuda_qkr p)
{
    __shared__ float hv[CUDA_QKR_MAX_DIM];
    __shared__ float red[32];
    const int nh = p.n_heads, nkv = p.kv.n_kv_heads, hd = p.kv.head_dim, per_tok = nh + 2 * nkv;
    const int t = blockIdx.x / per_tok, h = blockIdx.x % per_tok;
    const int kind = h < nh ? 0 : h < nh + nkv ? 1 : 2; /* q, k, v */
    cuda_pdl_wait();
    cuda_pdl_trigger();
    const int hh = kind == 0 ? h : kind == 1 ? h - nh : h - nh - nkv;
    float *io = kind == 0 ? p.q + ((int64_t)t * nh + hh) * hd : kind == 1 ? p.k + ((int64_t)t * nkv + hh) * hd : NULL;
    const float *src = kind == 2 ? p.v + ((int64_t)t * nkv + hh) * hd : io;
    const float *nw = kind == 0 ? p.q_norm : kind == 1 ? p.k_norm : NULL;
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float x = src[i];
        hv[i] = x;
        ss += x * x;
    }
    if (nw) { /* uniform over the block: every thread reaches the block sum */
        ss = cuda_block_sum(ss, red);
        float inv = cuda_rms_inv(ss, hd, p.eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) hv[i] = hv[i] * inv * (nw[i] + p.w_offset);
    }
    __syncthreads();
    const int half = p.rot_dim / 2, pos = p.pos[t];
    const int slot = p.slots[t], blk = slot / p.kv.block_size, off = slot % p.kv.block_size;
    const size_t at = (size_t)blk * p.kv.block_bytes + (size_t)p.layer * p.kv.layer_block_bytes;
    const int64_t base = ((int64_t)off * nkv + hh) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = hv[i];
        if (kind < 2 && i < 2 * half) {
            int j = i < half ? i : i - half;
            double sn, cs;
            sincos((double)pos * (double)p.inv_freq[j], &sn, &cs);
            float c = (float)cs, sf = (float)sn;
            float a = hv[j], b = hv[j + half];
            o = i < half ? a * c - b * sf : b * c + a * sf;
        }
        if (io) io[i] = o;
        if (kind == 0) continue;
        void *pool = (uint8_t *)(kind == 1 ? p.kv.k : p.kv.v) + at;
        if (p.kv.dtype == DTYPE_F32) ((float *)pool)[base + i] = o;
        else ((uint16_t *)pool)[base + i] = cuda_f32_bf16(o);
    }
}

extern "C" int cuda_k_qk_rope_store(cudaStream_t s, const struct backend_qk_rope_store *r)
{
    const struct backend_kv_view *kv = r->kv;
    int64_t blocks = (int64_t)r->n_tokens * (r->n_heads + 2 * kv->n_kv_heads);
    if (blocks <= 0) return (int)cudaGetLastError();
    struct cuda_qkr p = {
        .q = r->q, .k = r->k, .v = r->v, .q_norm = r->q_norm, .k_norm = r->k_norm,
        .inv_freq = r->inv_freq, .pos = r->pos, .slots = r->slots, .kv = *kv,
        .n_heads = r->n_heads, .rot_dim = r->rot_dim, .layer = r->layer, .eps = r->eps,
        .w_offset = r->w_offset,
    };
    if (blocks > INT32_MAX) return (int)cudaErrorInvalidValue;
    (void)cuda_launch_pdl(cuda_qk_rope_store_kernel, (unsigned)blocks, CUDA_QKR_THREADS, s, p);
    return (int)cudaGetLastError();
}

/* ---- MoE: routing (one block per token, as model/moe.c: softmax in f32 with a double sum,
 * then top-k by probability, ties to the lower id), gather and weighted scatter ----
 * The block holds the token's logits and probabilities in shared memory: the max and each
 * probability in parallel, the double sum and the chosen weights' sum in expert order by one
 * thread (the sequential order the reference sums in, so the bits are the same), and each
 * expert's rank among the others by (probability desc, id asc) in parallel: the top_k ranks are
 * the choices, in order. (One thread per token, choosing by k scans of all experts, took 240 us
 * a layer on the H200 at batch 1: two thirds of a Qwen3-30B-A3B-shaped decode step.) */

#define CUDA_MOE_MAX_TOPK 32       /* the chosen weights of one token, in shared memory */
#define CUDA_MOE_ROUTE_THREADS 128 /* threads per token */

static __global__ void __launch_bounds__(CUDA_MOE_ROUTE_THREADS)
    cuda_moe_route_kernel(const float *logits, int n_experts, int top_k, int norm_topk,
                          int32_t *ids, float *w)
{
    __shared__ float sl[CUDA_MOE_MAX_EXPERTS]; /* logits, then probabilities */
    __shared__ float se[CUDA_MOE_MAX_EXPERTS]; /* exp(logit - max) */
    __shared__ float sm[CUDA_WARP];
    __shared__ float sw[CUDA_MOE_MAX_TOPK];
    __shared__ double s_sum;
    const int t = blockIdx.x, tid = threadIdx.x;
    const float *l = logits + (int64_t)t * n_experts;
    float m = -INFINITY;
    for (int e = tid; e < n_experts; e += blockDim.x) {
        float v = l[e];
        sl[e] = v;
        m = fmaxf(m, v);
    }
    m = cuda_warp_max(m);
    if (tid % CUDA_WARP == 0) sm[tid / CUDA_WARP] = m;
    __syncthreads();
    m = sm[0];
    for (int i = 1; i < (int)blockDim.x / CUDA_WARP; i++)
        m = fmaxf(m, sm[i]);
    /* the exponentials in parallel, their sum in expert order by one thread: its serial loop is
     * then a chain of double adds alone */
    for (int e = tid; e < n_experts; e += blockDim.x)
        se[e] = expf(sl[e] - m);
    __syncthreads();
    if (tid == 0) {
        double sum = 0;
#pragma unroll 8
        for (int e = 0; e < n_experts; e++)
            sum += se[e];
        s_sum = sum;
    }
    __syncthreads();
    const double sum = s_sum;
    for (int e = tid; e < n_experts; e += blockDim.x)
        sl[e] = (float)(se[e] / sum);
    __syncthreads();
    for (int e = tid; e < n_experts; e += blockDim.x) {
        float p = sl[e];
        int rank = 0; /* over all experts, no early exit: the loop unrolls, same count below top_k */
#pragma unroll 8
        for (int o = 0; o < n_experts; o++) {
            float q = sl[o];
            rank += q > p || (q == p && o < e);
        }
        if (rank < top_k) {
            ids[(int64_t)t * top_k + rank] = e;
            sw[rank] = p;
        }
    }
    __syncthreads();
    if (tid == 0) {
        double wsum = 0;
        for (int k = 0; k < top_k; k++)
            wsum += sw[k];
        for (int k = 0; k < top_k; k++)
            w[(int64_t)t * top_k + k] = norm_topk ? (float)(sw[k] / wsum) : sw[k];
    }
}

extern "C" int cuda_k_moe_route(cudaStream_t s, const float *logits, int n, int n_experts, int top_k,
                                int norm_topk, int32_t *ids, float *w)
{
    if (top_k > CUDA_MOE_MAX_TOPK || n_experts > CUDA_MOE_MAX_EXPERTS)
        return (int)cudaErrorInvalidValue;
    if (n > 0)
        cuda_moe_route_kernel<<<(unsigned)n, CUDA_MOE_ROUTE_THREADS, 0, s>>>(
            logits, n_experts, top_k, norm_topk, ids, w);
    return (int)cudaGetLastError();
}

static __global__ void cuda_moe_gather_kernel(float *dst, const float *x, const int32_t *list,
                                              int64_t n, int top_k, int dim)
{
    CUDA_GRID_STRIDE(i, n) dst[i] = x[(int64_t)(list[i / dim] / top_k) * dim + i % dim];
}

static __global__ void cuda_moe_scatter_kernel(float *out, const float *y, const float *w,
                                               const int32_t *list, int64_t n, int top_k, int dim)
{
    CUDA_GRID_STRIDE(i, n) {
        int entry = list[i / dim];
        out[(int64_t)(entry / top_k) * dim + i % dim] += w[entry] * y[i];
    }
}

extern "C" int cuda_k_moe_gather(cudaStream_t s, float *dst, const float *x, const int32_t *list,
                                 int cnt, int top_k, int dim)
{
    int64_t n = (int64_t)cnt * dim;
    if (n > 0)
        cuda_moe_gather_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(dst, x, list, n, top_k, dim);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_moe_scatter(cudaStream_t s, float *out, const float *y, const float *w,
                                  const int32_t *list, int cnt, int top_k, int dim)
{
    int64_t n = (int64_t)cnt * dim;
    if (n > 0)
        cuda_moe_scatter_kernel<<<cuda_elem_blocks(n), CUDA_ELEM_THREADS, 0, s>>>(out, y, w, list, n,
                                                                                   top_k, dim);
    return (int)cudaGetLastError();
}
