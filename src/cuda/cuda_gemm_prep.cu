/* The GEMM's bf16 inputs, at memory speed: activations f32 -> bf16, and MLX q4/q8 weights
 * dequantized to bf16 for cuBLASLt (cuda_matmul.c).
 *
 * f32 -> bf16: x [n] f32, 8 values per thread (two 16-byte loads, one 16-byte store) when the
 *   pointers are 16-byte aligned and n % 8 == 0, else cuda_k_f32_to_bf16 (cuda_gemv.cu).
 *   6 bytes per value: bound by HBM bandwidth.
 * Dequant: W [rows, cols] CUDA_W_Q (cuda_kernels.h's row layout) -> dst [rows, cols] bf16. One
 *   thread per 16-byte chunk of codes (32 q4 or 16 q8 values, always inside one group, since
 *   groups are 32/64/128 values), each value scale * code + bias formed in f32 and rounded once
 *   to bf16, exactly as cuda_w_elem and cuda_k_dequant_bf16 do; 4 or 2 16-byte stores. Other
 *   widths (q2/q3/q5/q6) and shapes whose chunks would not be aligned take cuda_k_dequant_bf16.
 *   Bytes per call: rows * (row_bytes + 2 * cols): bound by HBM bandwidth.
 * CPU reference: tensor_row_to_f32 (tensor/tensor.c), then f32_to_bf16. */
#include "cuda/cuda_common.cuh"

#define CUDA_PREP_THREADS 256

static __device__ __forceinline__ uint32_t cuda_prep_pack(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const uint32_t *)&h;
}

static __global__ void cuda_prep_bf16x8_kernel(uint4 *dst, const float4 *src, int64_t n8)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = src[2 * i], b = src[2 * i + 1];
        dst[i] = make_uint4(cuda_prep_pack(a.x, a.y), cuda_prep_pack(a.z, a.w),
                            cuda_prep_pack(b.x, b.y), cuda_prep_pack(b.z, b.w));
    }
}

extern "C" int cuda_k_act_bf16(cudaStream_t s, uint16_t *dst, const float *src, int64_t n)
{
    if (n % 8 || (uintptr_t)dst % 16 || (uintptr_t)src % 16)
        return cuda_k_f32_to_bf16(s, dst, src, n);
    int64_t n8 = n / 8;
    if (n8 > 0)
        cuda_prep_bf16x8_kernel<<<cuda_blocks_for(n8, CUDA_PREP_THREADS), CUDA_PREP_THREADS, 0,
                                  s>>>((uint4 *)dst, (const float4 *)src, n8);
    return (int)cudaGetLastError();
}

/* BITS 4 or 8: chunk i of the weight is row i / chunks_per_row, codes chunk i % chunks_per_row. */
template <int BITS>
static __global__ void cuda_prep_dequant_kernel(struct cuda_wdesc w, uint16_t *dst,
                                                int64_t n_chunks)
{
    constexpr int PER_WORD = 32 / BITS, VALS = 128 / BITS; /* values per uint32, per chunk */
    constexpr uint32_t MASK = (1u << BITS) - 1;
    const int64_t chunks_per_row = w.cols / VALS;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_chunks;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / chunks_per_row, c = i % chunks_per_row;
        const uint8_t *row = (const uint8_t *)w.data + (size_t)r * w.row_bytes;
        uint4 q = ((const uint4 *)row)[c];
        int64_t g = c * VALS / w.group_size;
        const uint16_t *sc = (const uint16_t *)(row + cuda_q_scales_off(w.cols, BITS));
        const uint16_t *bi =
            (const uint16_t *)(row + cuda_q_biases_off(w.cols, BITS, w.group_size));
        float s = cuda_bf16_f32(sc[g]), b = cuda_bf16_f32(bi[g]);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
        uint32_t out[VALS / 2];
#pragma unroll
        for (int wi = 0; wi < 4; wi++)
#pragma unroll
            for (int j = 0; j < PER_WORD; j += 2) {
                float v0 = s * (float)((words[wi] >> (BITS * j)) & MASK) + b;
                float v1 = s * (float)((words[wi] >> (BITS * (j + 1))) & MASK) + b;
                out[(wi * PER_WORD + j) / 2] = cuda_prep_pack(v0, v1);
            }
        uint4 *d = (uint4 *)(dst + r * w.cols + c * VALS);
#pragma unroll
        for (int k = 0; k < VALS / 8; k++)
            d[k] = make_uint4(out[4 * k], out[4 * k + 1], out[4 * k + 2], out[4 * k + 3]);
    }
}

extern "C" int cuda_k_dequant_q_bf16(cudaStream_t s, const struct cuda_wdesc *w, uint16_t *dst)
{
    int vals = w->bits == 4 || w->bits == 8 ? 128 / w->bits : 0;
    if (!vals || w->cols % vals || w->row_bytes % 16 || (uintptr_t)w->data % 16 ||
        (uintptr_t)dst % 16 || w->group_size % vals)
        return cuda_k_dequant_bf16(s, w, dst);
    int64_t n_chunks = w->rows * (w->cols / vals);
    if (n_chunks <= 0) return (int)cudaGetLastError();
    unsigned blocks = cuda_blocks_for(n_chunks, CUDA_PREP_THREADS);
    if (w->bits == 4)
        cuda_prep_dequant_kernel<4><<<blocks, CUDA_PREP_THREADS, 0, s>>>(*w, dst, n_chunks);
    else
        cuda_prep_dequant_kernel<8><<<blocks, CUDA_PREP_THREADS, 0, s>>>(*w, dst, n_chunks);
    return (int)cudaGetLastError();
}
