/* Sampling on the device (tensor/backend.h's sample op): one block per row of logits.
 *
 * Shapes: logits [n_rows_total, vocab] f32 (edited in place); rows [n] (struct cuda_sample_row,
 * packed by cuda_backend.c), edits [sum of n_edits] (struct backend_logit_edit, in the order the
 * host's sampler applies them), out [n] (struct backend_sample_out, copied back to the host).
 * Per row the kernel reads the vocab-sized row once for greedy (argmax), three times with
 * temperature (max, the chunk sums of the tempered softmax, the draw's scan of one chunk) plus
 * once more for logprobs and once per top_logprobs entry (a top-k row: the max, then once per k,
 * cuda_sample_top_k); a 128K-vocab row is 0.5 MB, so 64 rows of greedy read 33 MB: HBM-bound at ~10 us, against the 33 MB download and ~1 ms per row of
 * host work they replace. The CPU reference is engine/sampler.c (sampler_row_reference).
 *
 * Exactness against the host:
 * - edits: one thread applies them in order with the same IEEE float ops (no contraction: each
 *   is a single division, multiplication, subtraction or addition).
 * - greedy: the scalar rule's id (first maximum; NaN never wins except at id 0), bit for bit.
 * - temperature: probabilities as (float)exp((double)x), i.e. correctly rounded like glibc's expf
 *   but for rare last-bit cases, summed in double per chunk of consecutive ids and the chunks
 *   combined by a scan, where the host sums sequentially: the cumulative masses agree to ~1e-12
 *   relative, so the drawn id is the host's but where u * total falls that close to a boundary
 *   (tests/cuda/test_cuda_sample.c checks with a tolerance of 1e-6 on u).
 * - logprobs: log-softmax in double sums, within 1e-5 of the host. */
#include <math.h>

#include "cuda/cuda_common.cuh"

#define CUDA_SAMPLE_THREADS 1024 /* threads per row (one block) */

struct cuda_sample_row_dev {
    int row;
    float temperature;
    float min_p;
    int logprobs;
    int top_logprobs;
    int edit0; /* first of its edits in the edit array */
    int n_edits;
    int top_k; /* 0: off; 1..BACKEND_SAMPLE_MAX_TOP_K */
    float top_p;
    int pad;
    double u;
};

/* (value, id) ranks above (bv, bi): the scalar argmax's order over non-NaN values */
static __device__ __forceinline__ bool cuda_sample_above(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

/* Best (value, id) over the block by cuda_sample_above; every thread gets it. */
static __device__ void cuda_sample_block_best(float *v, int *i, float *sv, int *si)
{
    int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP;
#pragma unroll
    for (int o = CUDA_WARP / 2; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (cuda_sample_above(ov, oi, *v, *i)) {
            *v = ov;
            *i = oi;
        }
    }
    __syncthreads(); /* sv/si may still be read from a previous call */
    if (lane == 0) {
        sv[warp] = *v;
        si[warp] = *i;
    }
    __syncthreads();
    if (warp == 0) {
        int n_warps = blockDim.x / CUDA_WARP;
        *v = lane < n_warps ? sv[lane] : -INFINITY;
        *i = lane < n_warps ? si[lane] : INT32_MAX;
#pragma unroll
        for (int o = CUDA_WARP / 2; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, *v, o);
            int oi = __shfl_xor_sync(0xffffffffu, *i, o);
            if (cuda_sample_above(ov, oi, *v, *i)) {
                *v = ov;
                *i = oi;
            }
        }
        if (lane == 0) {
            sv[0] = *v;
            si[0] = *i;
        }
    }
    __syncthreads();
    *v = sv[0];
    *i = si[0];
}

static __device__ double cuda_sample_block_dsum(double x, double *sd)
{
    int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP;
#pragma unroll
    for (int o = CUDA_WARP / 2; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    __syncthreads();
    if (lane == 0) sd[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int n_warps = blockDim.x / CUDA_WARP;
        x = lane < n_warps ? sd[lane] : 0.0;
#pragma unroll
        for (int o = CUDA_WARP / 2; o > 0; o >>= 1)
            x += __shfl_xor_sync(0xffffffffu, x, o);
        if (lane == 0) sd[0] = x;
    }
    __syncthreads();
    x = sd[0];
    return x;
}

/* Exclusive prefix sum of x over the block's threads in thread order; *total gets the sum. */
static __device__ double cuda_sample_block_dscan(double x, double *sd, double *total)
{
    int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP;
    double inc = x;
#pragma unroll
    for (int o = 1; o < CUDA_WARP; o <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == CUDA_WARP - 1) sd[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int n_warps = blockDim.x / CUDA_WARP;
        double wv = lane < n_warps ? sd[lane] : 0.0, winc = wv;
#pragma unroll
        for (int o = 1; o < CUDA_WARP; o <<= 1) {
            double y = __shfl_up_sync(0xffffffffu, winc, o);
            if (lane >= o) winc += y;
        }
        if (lane < n_warps) sd[lane] = winc - wv; /* exclusive per warp */
        if (lane == n_warps - 1) sd[CUDA_WARP] = winc;
    }
    __syncthreads();
    *total = sd[CUDA_WARP];
    return sd[warp] + inc - x;
}

/* Greedy id of w[V]: the first maximum over non-NaN values; NaN at 0 wins (nothing is greater). */
static __device__ int cuda_sample_argmax(const float *w, int V, float *sv, int *si)
{
    float bv = -INFINITY;
    int bi = INT32_MAX;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float x = w[i];
        if (x == x && cuda_sample_above(x, i, bv, bi)) {
            bv = x;
            bi = i;
        }
    }
    cuda_sample_block_best(&bv, &bi, sv, si);
    if (w[0] != w[0] || bi == INT32_MAX) return 0;
    return bi;
}

static __device__ float cuda_sample_max(const float *w, int V, float *sv, int *si)
{
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        m = w[i] > m ? w[i] : m;
    int dummy = 0;
    cuda_sample_block_best(&m, &dummy, sv, si);
    return m;
}

/* exp of a float as the host's expf computes it (correctly rounded but for rare last bits) */
static __device__ __forceinline__ float cuda_sample_expf(float x)
{
    return (float)exp((double)x);
}

/* A top-k row (temperature > 0): the host's sorted path (engine/sampler.c sampler_pick). The k
 * best tempered probabilities p_i = exp((w_i - max) / T) by (p desc, id asc), one block pass
 * each (each takes the best below the previous in that order, as the top_logprobs passes do:
 * k <= BACKEND_SAMPLE_MAX_TOP_K passes over the row, p recomputed in each), then on one thread
 * in that order, in double as the host: their sum, the top-p cut (the first i whose cumulative
 * mass reaches top_p times the sum), the min_p cut from the tail (p < min_p, keeping one), the
 * total, and the draw u * total against the cumulative mass. p is (float)exp((double)x), so the
 * sums are the host's but where its expf rounds a last bit differently. */
static __device__ int cuda_sample_top_k(const float *w, int V, const struct cuda_sample_row_dev &r, float *sv,
                                        int *si, int *s_tok)
{
    __shared__ float kp[BACKEND_SAMPLE_MAX_TOP_K];
    __shared__ int ki[BACKEND_SAMPLE_MAX_TOP_K];
    const float inv_t = 1.0f / r.temperature;
    const float mx = cuda_sample_max(w, V, sv, si);
    const int k = min(r.top_k, min(V, BACKEND_SAMPLE_MAX_TOP_K));
    float pv = INFINITY;
    int pi = -1, n = 0;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = INT32_MAX;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            float p = cuda_sample_expf(__fmul_rn(__fsub_rn(w[i], mx), inv_t));
            if (p == p && cuda_sample_above(pv, pi, p, i) && cuda_sample_above(p, i, bv, bi)) {
                bv = p;
                bi = i;
            }
        }
        cuda_sample_block_best(&bv, &bi, sv, si);
        if (bi == INT32_MAX) break; /* fewer than k ids that are not NaN */
        if (threadIdx.x == 0) {
            kp[j] = bv;
            ki[j] = bi;
        }
        n = j + 1;
        pv = bv;
        pi = bi;
    }
    if (threadIdx.x == 0) {
        int tok = n > 0 ? ki[n - 1] : 0;
        if (n > 0) {
            double sum = 0;
            for (int i = 0; i < n; i++) sum += kp[i];
            if (r.top_p < 1.0f) {
                double target = (double)r.top_p * sum, c = 0;
                for (int i = 0; i < n; i++) {
                    c += kp[i];
                    if (c >= target) {
                        n = i + 1;
                        break;
                    }
                }
            }
            float floor_p = r.min_p > 0.0f ? r.min_p : 0.0f;
            if (floor_p > 0)
                while (n > 1 && kp[n - 1] < floor_p) n--;
            double total = 0;
            for (int i = 0; i < n; i++) total += kp[i];
            double u = r.u * total, c = 0;
            tok = ki[n - 1];
            for (int i = 0; i < n; i++) {
                c += kp[i];
                if (u < c) {
                    tok = ki[i];
                    break;
                }
            }
        }
        *s_tok = tok;
    }
    __syncthreads();
    int tok = *s_tok;
    __syncthreads(); /* s_tok is reused by the caller's paths */
    return tok;
}

static __global__ void __launch_bounds__(CUDA_SAMPLE_THREADS)
    cuda_sample_kernel(float *logits, int V, const struct cuda_sample_row_dev *rows,
                       const struct backend_logit_edit *edits, struct backend_sample_out *out)
{
    __shared__ float sv[CUDA_WARP];
    __shared__ int si[CUDA_WARP];
    __shared__ double sd[CUDA_WARP + 1];
    __shared__ int s_tok;
    const struct cuda_sample_row_dev r = rows[blockIdx.x];
    float *w = logits + (int64_t)r.row * V;
    if (threadIdx.x == 0) {
        for (int k = 0; k < r.n_edits; k++) {
            const struct backend_logit_edit e = edits[r.edit0 + k];
            float x = w[e.id];
            if (e.kind == BACKEND_EDIT_REPETITION)
                x = x > 0 ? __fdiv_rn(x, e.v) : __fmul_rn(x, e.v);
            else if (e.kind == BACKEND_EDIT_SUB)
                x = __fsub_rn(x, e.v);
            else
                x = __fadd_rn(x, e.v);
            w[e.id] = x;
        }
    }
    __syncthreads();

    int tok;
    if (r.temperature == 0.0f) {
        tok = cuda_sample_argmax(w, V, sv, si);
    } else if (r.top_k > 0) {
        tok = cuda_sample_top_k(w, V, r, sv, si, &s_tok);
    } else {
        float inv_t = 1.0f / r.temperature;
        float mx = cuda_sample_max(w, V, sv, si);
        float floor_p = r.min_p > 0.0f ? r.min_p : 0.0f;
        /* thread t owns ids [t * chunk, (t + 1) * chunk): the host's order within a chunk */
        int chunk = (V + blockDim.x - 1) / blockDim.x;
        int i0 = min(V, (int)threadIdx.x * chunk), i1 = min(V, i0 + chunk);
        double part = 0;
        for (int i = i0; i < i1; i++) {
            float p = cuda_sample_expf(__fmul_rn(__fsub_rn(w[i], mx), inv_t));
            if (p < floor_p) p = 0;
            part += p;
        }
        double total;
        double before = cuda_sample_block_dscan(part, sd, &total);
        double target = r.u * total;
        if (threadIdx.x == 0) s_tok = INT32_MAX;
        __syncthreads();
        if (!(target < before)) { /* the crossing may be in this chunk */
            double c = before;
            for (int i = i0; i < i1; i++) {
                float p = cuda_sample_expf(__fmul_rn(__fsub_rn(w[i], mx), inv_t));
                if (p < floor_p) p = 0;
                c += p;
                if (p > 0 && target < c) {
                    atomicMin(&s_tok, i);
                    break;
                }
            }
        }
        __syncthreads();
        tok = s_tok;
        __syncthreads();
        if (tok == INT32_MAX) tok = cuda_sample_argmax(w, V, sv, si); /* rounding at the very end */
    }

    struct backend_sample_out *o = &out[blockIdx.x];
    if (threadIdx.x == 0) {
        o->id = tok;
        o->n_top = 0;
        o->logprob = 0;
    }
    if (!r.logprobs && !r.top_logprobs) return;
    float mx = cuda_sample_max(w, V, sv, si);
    double part = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        part += expf(__fsub_rn(w[i], mx));
    double sum = cuda_sample_block_dsum(part, sd);
    float lse = mx + (float)log(sum);
    if (threadIdx.x == 0) o->logprob = w[tok] - lse;
    int n_top = min(r.top_logprobs, V);
    /* the n_top best by (value desc, id asc), one block pass each: each pass takes the best
     * below the previous one in that order */
    float pv = INFINITY;
    int pi = -1, kept = 0;
    for (int k = 0; k < n_top; k++) {
        float bv = -INFINITY;
        int bi = INT32_MAX;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            float x = w[i];
            if (x == x && cuda_sample_above(pv, pi, x, i) && cuda_sample_above(x, i, bv, bi)) {
                bv = x;
                bi = i;
            }
        }
        cuda_sample_block_best(&bv, &bi, sv, si);
        if (bi == INT32_MAX) break;
        if (k > 0 && bv == -INFINITY) break; /* masked-out tokens are no alternatives */
        if (threadIdx.x == 0) {
            o->top_ids[k] = bi;
            o->top_logprobs[k] = bv - lse;
        }
        kept = k + 1;
        pv = bv;
        pi = bi;
    }
    if (threadIdx.x == 0) o->n_top = kept;
}

extern "C" int cuda_k_sample(cudaStream_t s, float *logits, int vocab, const void *rows,
                             const void *edits, int n, void *out)
{
    if (n > 0)
        cuda_sample_kernel<<<n, CUDA_SAMPLE_THREADS, 0, s>>>(
            logits, vocab, (const struct cuda_sample_row_dev *)rows,
            (const struct backend_logit_edit *)edits, (struct backend_sample_out *)out);
    return (int)cudaGetLastError();
}

extern "C" size_t cuda_k_sample_row_bytes(void)
{
    return sizeof(struct cuda_sample_row_dev);
}
