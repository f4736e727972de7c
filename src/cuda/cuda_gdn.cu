/* Gated DeltaNet over the n tokens of one sequence (tensor/backend.h backend_gdn; the math is in
 * model/gdn.h, whose gdn_forward is the CPU reference, step for step).
 *
 * Shapes: qkv [n, conv_dim] (convolved in place), z [n, n_v_heads * head_v_dim], b, a
 * [n, n_v_heads], out [n, n_v_heads * head_v_dim]; state (device memory, the sequence's
 * recurrent state) = conv state [conv_dim][kernel - 1] then the delta state
 * S [n_v_heads][head_k_dim][head_v_dim].
 * Two kernels, in order on the stream:
 *   conv:  one thread per channel walks the n tokens with its kernel-1 window in registers
 *          (reads qkv once, writes it once).
 *   delta: one block per value head walks the n tokens with the head's S in REGISTERS:
 *          CUDA_GDN_GROUPS x head_v_dim threads, thread (g, j) holding S[i][j] for the key rows
 *          i = g, g + GROUPS, ... (at most CUDA_GDN_REG_ROWS of them). S is read from device
 *          memory once and written once per call, whatever n is: a decode step (n = 1) moves
 *          2 x head_k_dim x head_v_dim x 4 bytes per head, the bandwidth bound (Qwen3-Next:
 *          128 KiB per head and layer). Per token: S^T k and S^T q are partial sums over a
 *          thread's rows, added across the groups through shared memory; the l2 norms of q and k
 *          and the gated RMSNorm are block reductions. Heads with head_k_dim above
 *          GROUPS x REG_ROWS or head_v_dim not a multiple of 8 take the plain kernel (S in
 *          device memory, a thread per value column, two passes over the key dim per token).
 * Bound: HBM for decode; latency for a prefill chunk (a sequential recurrence of n steps, one
 * block per head): the chunked WY form is not done. */
#include <math.h>

#include "cuda/cuda_common.cuh"

#define CUDA_GDN_THREADS 128    /* threads per value head */
#define CUDA_GDN_MAX_KERNEL 8   /* conv window kept in registers */
#define CUDA_GDN_MAX_HEAD_DIM 512 /* q, k and o staged in shared memory */
#define CUDA_GDN_GROUPS 8       /* register kernel: thread groups splitting the key rows */
#define CUDA_GDN_REG_ROWS 16    /* register kernel: key rows of S per thread (head_k_dim <= 128) */
#define CUDA_GDN_REG_MAX_DV 128 /* register kernel: GROUPS x head_v_dim threads <= 1024, at
                                 * most 64 registers each: 16 rows of S fit without spills
                                 * (ptxas -v; 4 groups of 32 rows spill even at 128 registers) */

static __device__ __forceinline__ float cuda_gdn_silu(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float cuda_gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static __global__ void cuda_gdn_conv_kernel(struct backend_gdn g, int conv_dim)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    int km1 = g.conv_kernel - 1;
    float *st = (float *)g.state + (int64_t)c * km1;
    const float *w = g.conv_w + (int64_t)c * g.conv_kernel;
    float win[CUDA_GDN_MAX_KERNEL];
    for (int j = 0; j < km1; j++) win[j] = st[j];
    for (int t = 0; t < g.n; t++) {
        float *x = g.qkv + (int64_t)t * conv_dim + c;
        float xv = *x, acc = w[km1] * xv;
        for (int j = 0; j < km1; j++) acc += w[j] * win[j];
        for (int j = 0; j + 1 < km1; j++) win[j] = win[j + 1];
        if (km1 > 0) win[km1 - 1] = xv;
        *x = cuda_gdn_silu(acc);
    }
    for (int j = 0; j < km1; j++) st[j] = win[j];
}

static __global__ void __launch_bounds__(CUDA_GDN_THREADS) cuda_gdn_delta_kernel(struct backend_gdn g, int conv_dim)
{
    __shared__ float qs[CUDA_GDN_MAX_HEAD_DIM], ks[CUDA_GDN_MAX_HEAD_DIM], os[CUDA_GDN_MAX_HEAD_DIM];
    __shared__ float red[32];
    int h = blockIdx.x, tid = threadIdx.x;
    int dk = g.head_k_dim, dv = g.head_v_dim, nv = g.n_v_heads;
    int kh = h / (nv / g.n_k_heads), key_dim = g.n_k_heads * dk;
    float *S = (float *)g.state + (int64_t)conv_dim * (g.conv_kernel - 1) + (int64_t)h * dk * dv;
    float scale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < g.n; t++) {
        const float *x = g.qkv + (int64_t)t * conv_dim;
        float sq = 0, sk = 0;
        for (int i = tid; i < dk; i += CUDA_GDN_THREADS) {
            float qv = x[kh * dk + i], kv = x[key_dim + kh * dk + i];
            qs[i] = qv;
            ks[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
        float inv_q = (float)(1.0 / sqrt((double)cuda_block_sum(sq, red) + 1e-6));
        float inv_k = (float)(1.0 / sqrt((double)cuda_block_sum(sk, red) + 1e-6));
        for (int i = tid; i < dk; i += CUDA_GDN_THREADS) {
            qs[i] = qs[i] * inv_q * scale;
            ks[i] *= inv_k;
        }
        __syncthreads();
        float gate = -expf(g.a_log[h]) * cuda_gdn_softplus(g.a[(int64_t)t * nv + h] + g.dt_bias[h]);
        float decay = expf(gate);
        float beta = 1.0f / (1.0f + expf(-g.b[(int64_t)t * nv + h]));
        const float *v = x + 2 * key_dim + (int64_t)h * dv;
        float ss = 0;
        for (int j = tid; j < dv; j += CUDA_GDN_THREADS) {
            float kv_mem = 0;
            for (int i = 0; i < dk; i++) {
                float s = S[(int64_t)i * dv + j] * decay;
                S[(int64_t)i * dv + j] = s;
                kv_mem += s * ks[i];
            }
            float delta = (v[j] - kv_mem) * beta;
            float o = 0;
            for (int i = 0; i < dk; i++) {
                float s = S[(int64_t)i * dv + j] + ks[i] * delta;
                S[(int64_t)i * dv + j] = s;
                o += s * qs[i];
            }
            os[j] = o;
            ss += o * o;
        }
        float inv = (float)(1.0 / sqrt((double)cuda_block_sum(ss, red) / dv + (double)g.eps));
        const float *zh = g.z + (int64_t)t * nv * dv + (int64_t)h * dv;
        float *out = g.out + (int64_t)t * nv * dv + (int64_t)h * dv;
        for (int j = tid; j < dv; j += CUDA_GDN_THREADS)
            out[j] = os[j] * inv * g.norm_w[j] * cuda_gdn_silu(zh[j]);
        __syncthreads(); /* qs, ks are rewritten by the next token */
    }
}

/* The delta rule with S in registers (see the file comment); blockDim.x = GROUPS * head_v_dim. */
static __global__ void __launch_bounds__(CUDA_GDN_GROUPS * CUDA_GDN_REG_MAX_DV)
cuda_gdn_delta_reg_kernel(struct backend_gdn g, int conv_dim)
{
    __shared__ float qs[CUDA_GDN_GROUPS * CUDA_GDN_REG_ROWS], ks[CUDA_GDN_GROUPS * CUDA_GDN_REG_ROWS];
    __shared__ float part[CUDA_GDN_GROUPS][CUDA_GDN_REG_MAX_DV];
    __shared__ float red[32];
    int h = blockIdx.x, tid = threadIdx.x;
    int dk = g.head_k_dim, dv = g.head_v_dim, nv = g.n_v_heads;
    int j = tid % dv, grp = tid / dv;
    int kh = h / (nv / g.n_k_heads), key_dim = g.n_k_heads * dk;
    float *S = (float *)g.state + (int64_t)conv_dim * (g.conv_kernel - 1) + (int64_t)h * dk * dv;
    float scale = 1.0f / sqrtf((float)dk);
    float st[CUDA_GDN_REG_ROWS];
#pragma unroll
    for (int r = 0; r < CUDA_GDN_REG_ROWS; r++) {
        int i = grp + CUDA_GDN_GROUPS * r;
        st[r] = i < dk ? S[(int64_t)i * dv + j] : 0.0f;
    }
    for (int t = 0; t < g.n; t++) {
        const float *x = g.qkv + (int64_t)t * conv_dim;
        float sq = 0, sk = 0;
        for (int i = tid; i < dk; i += blockDim.x) {
            float qv = x[kh * dk + i], kv = x[key_dim + kh * dk + i];
            qs[i] = qv;
            ks[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
        float inv_q = (float)(1.0 / sqrt((double)cuda_block_sum(sq, red) + 1e-6));
        float inv_k = (float)(1.0 / sqrt((double)cuda_block_sum(sk, red) + 1e-6));
        for (int i = tid; i < dk; i += blockDim.x) { /* each thread rescales what it wrote */
            qs[i] = qs[i] * inv_q * scale;
            ks[i] *= inv_k;
        }
        __syncthreads();
        float gate = -expf(g.a_log[h]) * cuda_gdn_softplus(g.a[(int64_t)t * nv + h] + g.dt_bias[h]);
        float decay = expf(gate);
        float beta = 1.0f / (1.0f + expf(-g.b[(int64_t)t * nv + h]));
        float p = 0;
#pragma unroll
        for (int r = 0; r < CUDA_GDN_REG_ROWS; r++) {
            int i = grp + CUDA_GDN_GROUPS * r;
            if (i < dk) p += st[r] * decay * ks[i];
        }
        part[grp][j] = p;
        __syncthreads();
        float kv_mem = 0;
#pragma unroll
        for (int q = 0; q < CUDA_GDN_GROUPS; q++) kv_mem += part[q][j];
        float delta = (x[2 * key_dim + (int64_t)h * dv + j] - kv_mem) * beta;
        float o = 0;
#pragma unroll
        for (int r = 0; r < CUDA_GDN_REG_ROWS; r++) {
            int i = grp + CUDA_GDN_GROUPS * r;
            if (i < dk) {
                st[r] = st[r] * decay + ks[i] * delta;
                o += st[r] * qs[i];
            }
        }
        __syncthreads(); /* every thread has read part */
        part[grp][j] = o;
        __syncthreads();
        o = 0;
#pragma unroll
        for (int q = 0; q < CUDA_GDN_GROUPS; q++) o += part[q][j];
        float inv = (float)(1.0 / sqrt((double)cuda_block_sum(grp == 0 ? o * o : 0.0f, red) / dv + (double)g.eps));
        if (grp == 0) {
            const float *zh = g.z + (int64_t)t * nv * dv + (int64_t)h * dv;
            g.out[(int64_t)t * nv * dv + (int64_t)h * dv + j] = o * inv * g.norm_w[j] * cuda_gdn_silu(zh[j]);
        }
        __syncthreads(); /* qs, ks and part are rewritten by the next token */
    }
#pragma unroll
    for (int r = 0; r < CUDA_GDN_REG_ROWS; r++) {
        int i = grp + CUDA_GDN_GROUPS * r;
        if (i < dk) S[(int64_t)i * dv + j] = st[r];
    }
}

extern "C" int cuda_k_gdn(cudaStream_t s, const struct backend_gdn *g)
{
    if (g->n <= 0) return (int)cudaGetLastError();
    if (g->conv_kernel < 1 || g->conv_kernel > CUDA_GDN_MAX_KERNEL ||
        g->head_k_dim > CUDA_GDN_MAX_HEAD_DIM || g->head_v_dim > CUDA_GDN_MAX_HEAD_DIM ||
        g->n_k_heads < 1 || g->n_v_heads % g->n_k_heads)
        return (int)cudaErrorInvalidValue;
    int conv_dim = 2 * g->n_k_heads * g->head_k_dim + g->n_v_heads * g->head_v_dim;
    cuda_gdn_conv_kernel<<<cuda_blocks_for(conv_dim, 128), 128, 0, s>>>(*g, conv_dim);
    if (g->head_k_dim <= CUDA_GDN_GROUPS * CUDA_GDN_REG_ROWS && g->head_v_dim <= CUDA_GDN_REG_MAX_DV &&
        g->head_v_dim % 8 == 0)
        cuda_gdn_delta_reg_kernel<<<g->n_v_heads, CUDA_GDN_GROUPS * g->head_v_dim, 0, s>>>(*g, conv_dim);
    else
        cuda_gdn_delta_kernel<<<g->n_v_heads, CUDA_GDN_THREADS, 0, s>>>(*g, conv_dim);
    return (int)cudaGetLastError();
}
