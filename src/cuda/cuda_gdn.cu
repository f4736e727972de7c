/* Gated DeltaNet over the n tokens of one sequence (tensor/backend.h backend_gdn; the math is in
 * model/gdn.h, whose gdn_forward is the CPU reference, step for step).
 *
 * Shapes: qkv [n, conv_dim] (convolved in place), z [n, n_v_heads * head_v_dim], b, a
 * [n, n_v_heads], out [n, n_v_heads * head_v_dim]; state = conv state [conv_dim][kernel - 1]
 * then the delta state S [n_v_heads][head_k_dim][head_v_dim].
 * Two kernels, in order on the stream:
 *   conv:  one thread per channel walks the n tokens with its kernel-1 window in registers
 *          (reads qkv once, writes it once).
 *   delta: one block per value head walks the n tokens; thread j owns value columns j,
 *          j + CUDA_GDN_THREADS, ... of S, so the decay, S^T k, the rank-1 update and S^T q are
 *          per-thread loops over the key dim (no reductions), and S stays in device memory
 *          (L1/L2 resident: head_k_dim * head_v_dim * 4 bytes per head). l2 norms of q and k and
 *          the gated RMSNorm are block reductions.
 * Bound: latency (a sequential recurrence of n steps); simple and correct first: decode (n = 1)
 * reads S once and writes it once per head, which is the bandwidth bound. */
#include <math.h>

#include "cuda/cuda_common.cuh"

#define CUDA_GDN_THREADS 128    /* threads per value head */
#define CUDA_GDN_MAX_KERNEL 8   /* conv window kept in registers */
#define CUDA_GDN_MAX_HEAD_DIM 512 /* q, k and o staged in shared memory */

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

extern "C" int cuda_k_gdn(cudaStream_t s, const struct backend_gdn *g)
{
    if (g->n <= 0) return (int)cudaGetLastError();
    if (g->conv_kernel < 1 || g->conv_kernel > CUDA_GDN_MAX_KERNEL ||
        g->head_k_dim > CUDA_GDN_MAX_HEAD_DIM || g->head_v_dim > CUDA_GDN_MAX_HEAD_DIM ||
        g->n_k_heads < 1 || g->n_v_heads % g->n_k_heads)
        return (int)cudaErrorInvalidValue;
    int conv_dim = 2 * g->n_k_heads * g->head_k_dim + g->n_v_heads * g->head_v_dim;
    cuda_gdn_conv_kernel<<<cuda_blocks_for(conv_dim, 128), 128, 0, s>>>(*g, conv_dim);
    cuda_gdn_delta_kernel<<<g->n_v_heads, CUDA_GDN_THREADS, 0, s>>>(*g, conv_dim);
    return (int)cudaGetLastError();
}
