/* The GEMM's bf16 inputs, at memory speed: activations f32 -> bf16 for cuBLASLt
 * (cuda_matmul.c).
 *
 * f32 -> bf16: x [n] f32, 8 values per thread (two 16-byte loads, one 16-byte store) when the
 *   pointers are 16-byte aligned and n % 8 == 0, else cuda_k_f32_to_bf16 (cuda_gemv.cu).
 *   6 bytes per value: bound by HBM bandwidth.
 * CPU reference: f32_to_bf16 (tensor/tensor.h). */
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
