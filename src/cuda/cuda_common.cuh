/* Device helpers shared by the kernel files (cuda_*.cu): dtype conversions, one element of a
 * prepared weight, warp and block reductions. Device code only. */
#ifndef CAIRN_CUDA_CUDA_COMMON_CUH
#define CAIRN_CUDA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda/cuda_kernels.h"

#define CUDA_WARP 32

static __device__ __forceinline__ float cuda_bf16_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ float cuda_f16_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

/* Round to nearest even, like tensor.h's f32_to_bf16. */
static __device__ __forceinline__ uint16_t cuda_f32_bf16(float f)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

static __device__ __forceinline__ uint16_t cuda_f32_f16(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

/* Element i of a weight row (row points at the row's first byte), widened exactly to f32 for
 * the dense types; for CUDA_W_Q the code is read from MLX's LSB-first bit stream and
 * scale * code + bias is formed in f32, as tensor_row_to_f32 does. */
static __device__ __forceinline__ float cuda_w_elem(const struct cuda_wdesc &w, const uint8_t *row,
                                                    int64_t i)
{
    switch (w.type) {
    case CUDA_W_F32: return ((const float *)row)[i];
    case CUDA_W_F16: return cuda_f16_f32(((const uint16_t *)row)[i]);
    case CUDA_W_BF16: return cuda_bf16_f32(((const uint16_t *)row)[i]);
    default: {
        const uint32_t *words = (const uint32_t *)row;
        int64_t bit = i * w.bits;
        uint64_t word = words[bit / 32];
        if ((bit % 32) + w.bits > 32) word |= (uint64_t)words[bit / 32 + 1] << 32;
        uint32_t code = (uint32_t)(word >> (bit % 32)) & ((1u << w.bits) - 1);
        const uint16_t *sc = (const uint16_t *)(row + cuda_q_scales_off(w.cols, w.bits));
        const uint16_t *bi = (const uint16_t *)(row + cuda_q_biases_off(w.cols, w.bits, w.group_size));
        int64_t g = i / w.group_size;
        return cuda_bf16_f32(sc[g]) * (float)code + cuda_bf16_f32(bi[g]);
    }
    }
}

static __device__ __forceinline__ float cuda_warp_sum(float v)
{
#pragma unroll
    for (int o = CUDA_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* 1 / rms of a row of dim values whose squares sum to ss (the rmsnorm kernels and the GEMV's
 * folded norm): in double, as the reference. */
static __device__ __forceinline__ float cuda_rms_inv(float ss, int dim, float eps)
{
    return (float)(1.0 / sqrt((double)ss / dim + (double)eps));
}

static __device__ __forceinline__ float cuda_warp_max(float v)
{
#pragma unroll
    for (int o = CUDA_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
 * red: __shared__ float[32]. Contains __syncthreads: call from all threads. */
static __device__ __forceinline__ float cuda_block_sum(float v, float *red)
{
    int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP;
    int n_warps = blockDim.x / CUDA_WARP;
    v = cuda_warp_sum(v);
    __syncthreads(); /* red may still be read by a previous reduction */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < n_warps ? red[lane] : 0.0f;
    return cuda_warp_sum(v);
}

static __device__ __forceinline__ float cuda_block_max(float v, float *red)
{
    int lane = threadIdx.x % CUDA_WARP, warp = threadIdx.x / CUDA_WARP;
    int n_warps = blockDim.x / CUDA_WARP;
    v = cuda_warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < n_warps ? red[lane] : -INFINITY;
    return cuda_warp_max(v);
}

/* ---- Programmatic dependent launch (Hopper) ----
 * A kernel launched with cuda_launch_pdl may start while the kernel before it on the stream is
 * still running (once every block of that one has called cuda_pdl_trigger or exited), so its
 * launch and ramp overlap the predecessor's tail. Such a kernel MUST call cuda_pdl_wait before
 * it reads anything an earlier kernel wrote or writes anything an earlier kernel may read:
 * the wait returns when the predecessor has completed and its memory is visible (and the
 * predecessor had itself waited for its own, so every earlier kernel is done). Before the wait
 * only read-only data may be touched (the GEMV issues its first weight loads there).
 * cuda_pdl_trigger only lets the next kernel be scheduled: it orders nothing, so any kernel may
 * call it anywhere. In a stream capture the launches become programmatic graph edges (CUDA
 * 12.3+). CAIRN_CUDA_PDL=0 launches them as ordinary launches (the results are the same bits:
 * only the scheduling differs). */
static __device__ __forceinline__ void cuda_pdl_wait(void)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

static __device__ __forceinline__ void cuda_pdl_trigger(void)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* A load of data an earlier kernel wrote (activations, the residual), in a kernel launched with
 * cuda_launch_pdl. Never __ldg / ld.global.nc there: the non-coherent path promises the data is
 * read-only for the whole life of the kernel, and a PDL kernel lives while its predecessor still
 * writes, so the compiler may hoist such a load above cuda_pdl_wait and the read-only cache may
 * keep a stale line. Seen on the H200 (session 12): with two processes on the GPU the BF16 GEMV
 * read the normed x before the RMSNorm kernel had written it (a wrong answer in test_cuda_ops,
 * never with CAIRN_CUDA_PDL=0). ld.global.ca is an ordinary load (still cached in L1, which the
 * GEMV's warps share x through), ordered after the wait like any other. Weights, norm weights
 * and other read-only tensors keep __ldg. */
static __device__ __forceinline__ float4 cuda_ld_dep(const float4 *p) { return __ldca(p); }

static inline int cuda_pdl_enabled(void)
{
    static int on = -1; /* per translation unit; the environment does not change */
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("CAIRN_CUDA_PDL");
        v = !(e && e[0] == '0');
        __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    }
    return v;
}

template <typename... P, typename... A>
static inline cudaError_t cuda_launch_pdl(void (*kernel)(P...), unsigned grid, unsigned block, cudaStream_t s,
                                          A... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = cuda_pdl_enabled();
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Grid size for n items at `per_block` items per block, capped at the grid-stride limit. */
static inline unsigned cuda_blocks_for(int64_t n, int per_block)
{
    int64_t b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > 65535LL * 32) b = 65535LL * 32;
    return (unsigned)b;
}

#endif
