/* Matmul kernels other than cuBLASLt: the decode GEMV, activation conversion for the GEMM
 * inputs, and the dequantization of MLX weights to bf16 for the GEMM.
 *
 * GEMV: y[n, rows] = x[n, cols] . W[rows, cols]^T for n in 1..CUDA_GEMV_MAX_N.
 *   One warp per weight row (CUDA_GEMV_THREADS / 32 rows per block, grid-stride over rows);
 *   each lane streams 16-byte chunks of the row (8 bf16/f16, 4 f32, 32 q4 or 16 q8 codes, so a
 *   quantized chunk always lies in one group: group sizes are multiples of 32) and multiplies
 *   them with the n activation rows, which stay in L1/L2 (x is n * cols * 4 bytes, read by every
 *   warp). Quantized chunks are dequantized in registers: s * sum(code * x) + b * sum(x).
 *   Bytes per call: the weight once (rows * row_bytes) + x + y; it is bound by HBM bandwidth
 *   (the aim: the device's copy bandwidth for the weight stream). Accumulation in f32, one
 *   accumulator per activation row and lane, summed across the warp at the end.
 *   Rows whose chunks would not be 16-byte aligned (cols not a multiple of the chunk, an
 *   activation pointer not 16-byte aligned, or q2/q3/q5/q6) take the scalar kernel, which reads
 *   element by element with cuda_w_elem: correct for every layout, not fast.
 * Conversions: f32 -> bf16/f16 one element per thread (4 bytes in, 2 out per element).
 * Dequant: one element per thread, rows * cols * 2 bytes written; a q4 8B model's prefill pays
 *   it once per matmul per step, which the GEMM's n * 2 * rows * cols FLOPs dwarf at n >= 64.
 * CPU reference: ref_matmul in cpu/ref_ops.c (double accumulation). */
#include "cuda/cuda_common.cuh"

#define CUDA_GEMV_THREADS 256 /* 8 warps: 8 weight rows per block */
#define CUDA_GEMV_ROWS_PER_BLOCK (CUDA_GEMV_THREADS / CUDA_WARP)
#define CUDA_CONV_THREADS 256

enum cuda_gemv_kind { GEMV_F32 = 0, GEMV_F16, GEMV_BF16, GEMV_Q4, GEMV_Q8 };

/* Logical elements per 16-byte chunk of a row. */
template <int K> struct cuda_gemv_chunk;
template <> struct cuda_gemv_chunk<GEMV_F32> { static constexpr int elems = 4; };
template <> struct cuda_gemv_chunk<GEMV_F16> { static constexpr int elems = 8; };
template <> struct cuda_gemv_chunk<GEMV_BF16> { static constexpr int elems = 8; };
template <> struct cuda_gemv_chunk<GEMV_Q4> { static constexpr int elems = 32; };
template <> struct cuda_gemv_chunk<GEMV_Q8> { static constexpr int elems = 16; };

/* Widens the 8 16-bit values of a chunk. */
template <int K> static __device__ __forceinline__ void cuda_gemv_widen8(uint4 c, float *w)
{
    const uint32_t u[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (K == GEMV_BF16) {
            w[2 * j] = cuda_bf16_f32((uint16_t)(u[j] & 0xffffu));
            w[2 * j + 1] = cuda_bf16_f32((uint16_t)(u[j] >> 16));
        } else {
            w[2 * j] = cuda_f16_f32((uint16_t)(u[j] & 0xffffu));
            w[2 * j + 1] = cuda_f16_f32((uint16_t)(u[j] >> 16));
        }
    }
}

/* acc[t] += chunk . x[t][i .. i + elems) for t < n (NT: compile-time bound on n). */
template <int K, int NT>
static __device__ __forceinline__ void cuda_gemv_chunk_dot(uint4 c, const uint8_t *row, int64_t i,
                                                           const struct cuda_wdesc &w,
                                                           const float *__restrict__ x, int n,
                                                           float *acc)
{
    constexpr int E = cuda_gemv_chunk<K>::elems;
    if (K == GEMV_F32 || K == GEMV_F16 || K == GEMV_BF16) {
        float wv[E];
        if (K == GEMV_F32) {
            wv[0] = __uint_as_float(c.x);
            wv[1] = __uint_as_float(c.y);
            wv[2] = __uint_as_float(c.z);
            wv[3] = __uint_as_float(c.w);
        } else {
            cuda_gemv_widen8<K>(c, wv);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + (int64_t)t * w.cols + i);
            float s = 0;
#pragma unroll
            for (int j = 0; j < E / 4; j++) {
                float4 xv = xp[j];
                s += wv[4 * j] * xv.x + wv[4 * j + 1] * xv.y + wv[4 * j + 2] * xv.z + wv[4 * j + 3] * xv.w;
            }
            acc[t] += s;
        }
    } else {
        constexpr int BITS = K == GEMV_Q4 ? 4 : 8, PER_WORD = 32 / BITS;
        const uint16_t *sc = (const uint16_t *)(row + cuda_q_scales_off(w.cols, BITS));
        const uint16_t *bi = (const uint16_t *)(row + cuda_q_biases_off(w.cols, BITS, w.group_size));
        int64_t g = i / w.group_size;
        float scale = cuda_bf16_f32(sc[g]), bias = cuda_bf16_f32(bi[g]);
        const uint32_t u[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const float4 *xp = (const float4 *)(x + (int64_t)t * w.cols + i);
            float cx = 0, xs = 0; /* sum code * x, sum x */
#pragma unroll
            for (int q = 0; q < 4; q++) {
#pragma unroll
                for (int j = 0; j < PER_WORD / 4; j++) {
                    float4 xv = xp[q * (PER_WORD / 4) + j];
                    uint32_t word = u[q] >> (BITS * 4 * j);
                    const uint32_t mask = (1u << BITS) - 1;
                    cx += (float)(word & mask) * xv.x + (float)((word >> BITS) & mask) * xv.y +
                          (float)((word >> (2 * BITS)) & mask) * xv.z +
                          (float)((word >> (3 * BITS)) & mask) * xv.w;
                    xs += (xv.x + xv.y) + (xv.z + xv.w);
                }
            }
            acc[t] += scale * cx + bias * xs;
        }
    }
}

template <int K, int NT>
static __global__ void __launch_bounds__(CUDA_GEMV_THREADS)
cuda_gemv_kernel(struct cuda_wdesc w, const float *__restrict__ x, float *__restrict__ y, int n)
{
    constexpr int E = cuda_gemv_chunk<K>::elems;
    int lane = threadIdx.x % CUDA_WARP;
    int64_t n_chunks = w.cols / E;
    for (int64_t r = (int64_t)blockIdx.x * CUDA_GEMV_ROWS_PER_BLOCK + threadIdx.x / CUDA_WARP;
         r < w.rows; r += (int64_t)gridDim.x * CUDA_GEMV_ROWS_PER_BLOCK) {
        const uint8_t *row = (const uint8_t *)w.data + (size_t)r * w.row_bytes;
        const uint4 *chunks = (const uint4 *)row;
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0;
#pragma unroll 4
        for (int64_t ci = lane; ci < n_chunks; ci += CUDA_WARP)
            cuda_gemv_chunk_dot<K, NT>(__ldg(chunks + ci), row, ci * E, w, x, n, acc);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = cuda_warp_sum(acc[t]);
            if (lane == 0 && t < n) y[(int64_t)t * w.rows + r] = v;
        }
    }
}

/* Any layout, element by element. */
template <int NT>
static __global__ void __launch_bounds__(CUDA_GEMV_THREADS)
cuda_gemv_scalar_kernel(struct cuda_wdesc w, const float *__restrict__ x, float *__restrict__ y, int n)
{
    int lane = threadIdx.x % CUDA_WARP;
    for (int64_t r = (int64_t)blockIdx.x * CUDA_GEMV_ROWS_PER_BLOCK + threadIdx.x / CUDA_WARP;
         r < w.rows; r += (int64_t)gridDim.x * CUDA_GEMV_ROWS_PER_BLOCK) {
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
            if (lane == 0 && t < n) y[(int64_t)t * w.rows + r] = v;
        }
    }
}


template <int K>
static void cuda_gemv_launch(cudaStream_t s, const struct cuda_wdesc *w, const float *x, float *y,
                             int n, unsigned blocks)
{
    if (n <= 1) cuda_gemv_kernel<K, 1><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
    else if (n <= 2) cuda_gemv_kernel<K, 2><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
    else if (n <= 4) cuda_gemv_kernel<K, 4><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
    else cuda_gemv_kernel<K, 8><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
}

extern "C" int cuda_k_gemv(cudaStream_t s, const struct cuda_wdesc *w, const float *x, float *y, int n)
{
    if (n <= 0 || w->rows <= 0) return (int)cudaGetLastError();
    if (n > CUDA_GEMV_MAX_N) return (int)cudaErrorInvalidValue;
    unsigned blocks = cuda_blocks_for(w->rows, CUDA_GEMV_ROWS_PER_BLOCK);
    int kind = -1, elems = 0;
    switch (w->type) {
    case CUDA_W_F32: kind = GEMV_F32; elems = 4; break;
    case CUDA_W_F16: kind = GEMV_F16; elems = 8; break;
    case CUDA_W_BF16: kind = GEMV_BF16; elems = 8; break;
    case CUDA_W_Q:
        if (w->bits == 4) kind = GEMV_Q4, elems = 32;
        else if (w->bits == 8) kind = GEMV_Q8, elems = 16;
        break;
    }
    bool vec = kind >= 0 && w->cols % elems == 0 && w->row_bytes % 16 == 0 &&
               (uintptr_t)w->data % 16 == 0 && (uintptr_t)x % 16 == 0;
    if (!vec) {
        if (n <= 1) cuda_gemv_scalar_kernel<1><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
        else if (n <= 2) cuda_gemv_scalar_kernel<2><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
        else if (n <= 4) cuda_gemv_scalar_kernel<4><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
        else cuda_gemv_scalar_kernel<8><<<blocks, CUDA_GEMV_THREADS, 0, s>>>(*w, x, y, n);
        return (int)cudaGetLastError();
    }
    switch (kind) {
    case GEMV_F32: cuda_gemv_launch<GEMV_F32>(s, w, x, y, n, blocks); break;
    case GEMV_F16: cuda_gemv_launch<GEMV_F16>(s, w, x, y, n, blocks); break;
    case GEMV_BF16: cuda_gemv_launch<GEMV_BF16>(s, w, x, y, n, blocks); break;
    case GEMV_Q4: cuda_gemv_launch<GEMV_Q4>(s, w, x, y, n, blocks); break;
    default: cuda_gemv_launch<GEMV_Q8>(s, w, x, y, n, blocks); break;
    }
    return (int)cudaGetLastError();
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
