/* Causal flash attention for prefill chunks on the tensor cores (tensor/backend.h
 * backend_attn), over paged BF16 KV.
 *
 * Shapes: q, out [n_tokens, n_heads, head_dim] f32; K, V in the pool as backend_kv_view says
 * (bf16 only); head_dim 64 or 128; row r of sequence s attends to positions [0, pos[r]] of s
 * (its cached prefix and its own chunk). Other cases (F32 KV, other head dims, a GQA group of
 * more than CUDA_FA_BM heads, unaligned buffers) take the tiled kernel of cuda_attn.cu.
 *
 * DESIGN (FlashAttention-2 on mma.sync m16n8k16 bf16 -> f32)
 * - A block of CUDA_FA_WARPS warps takes one tile: CUDA_FA_BM rows of (token, query head)
 *   pairs of ONE KV head, token-major (row m = token m / group, head m % group of the group),
 *   so the query heads of a GQA group share every K/V tile; a tile never crosses a sequence.
 *   Each warp owns 16 rows. Tiles come from the host as (first row, sequence) pairs; the grid
 *   runs them last-first, so the longest (latest positions) start first.
 * - Q is converted to bf16 once (the only rounding of an input beyond the pool's), staged in
 *   shared memory and held in registers as A fragments for the whole walk.
 * - The block walks the sequence's positions [0, max pos of its rows] in KV tiles of CUDA_FA_BN
 *   positions, each gathered through the block table row by row (one 16-byte cp.async per 8
 *   dims, positions past the last zero-filled) into a double-buffered shared-memory stage, so
 *   tile j+1 is in flight while tile j is computed. Shared rows are XOR-swizzled in 16-byte
 *   chunks (chunk ^ row % 8), so ldmatrix reads of 8 rows hit 8 distinct bank groups.
 * - S = Q K^T (f32 accumulators), the causal mask (position > the row's pos: -inf), the online
 *   softmax in registers in log2 units (running max and per-thread partial sums; the 4 lanes
 *   of a row reduce with shuffles), P rounded to bf16 straight from the accumulator layout into
 *   A fragments, O += P V (V read with ldmatrix.trans), O / l written as f32 at the end.
 * Error: beyond the f32 online softmax, q is rounded to bf16 (2^-9 relative per element) and
 * each weight p of P.V is rounded to bf16 (2^-9 relative), so |out - exact| <= ~2^-8 max|v|
 * (tests/cuda/test_cuda_ops.c checks 4e-3 against a reference with q rounded the same way).
 * Memory per call: Q, out once; every KV tile once per block (token tiles of 64 / group
 * tokens), mostly from L2 (a layer's K/V of a 4K-token sequence is 2 MiB per KV head).
 * Bound: tensor-core throughput (4 * n_rows * ctx * head_dim FLOPs, half of them masked-free).
 * Shared memory: Q (BM x hd) + 2 stages x (K, V) (BN x hd), bf16: 80 KiB at hd 128, 40 KiB at 64.
 * CPU reference: ref_attention_head in cpu/ref_ops.c. */
#include <math.h>

#include "cuda/cuda_common.cuh"

#define CUDA_FA_WARPS 4
#define CUDA_FA_THREADS (CUDA_FA_WARPS * CUDA_WARP)
#define CUDA_FA_BM (16 * CUDA_FA_WARPS) /* (token, head) rows per block: 16 per warp */
#define CUDA_FA_BN 64                   /* KV positions per tile */
#define CUDA_FA_LOG2E 1.4426950408889634f

struct cuda_fa_args {
    const float *q;
    float *out;
    const int32_t *pos;
    const int32_t *seq_off;
    const int32_t *block_tables;
    const int32_t *tiles; /* [n_tiles][2]: first row, sequence */
    const uint8_t *k;     /* the layer's K of block 0 (kv.k + layer * layer_block_bytes) */
    const uint8_t *v;
    size_t block_bytes;
    int bt_stride;
    int block_size;
    int n_kv_heads;
    int n_heads;
    int group;        /* query heads per KV head */
    int tok_per_tile; /* CUDA_FA_BM / group */
    int n_tiles;
    float scale_log2; /* scale * log2(e): scores in log2 units */
};

/* Offset, in 16-byte chunks, of chunk c of row `row` in a swizzled [rows][CH] tile. */
template <int CH> static __device__ __forceinline__ int cuda_fa_sw(int row, int c)
{
    return row * CH + (c ^ (row & 7));
}

static __device__ __forceinline__ uint32_t cuda_fa_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void cuda_fa_ldsm_x4(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cuda_fa_smem_addr(p)));
}

static __device__ __forceinline__ void cuda_fa_ldsm_x4_t(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cuda_fa_smem_addr(p)));
}

/* c[16x8] += a[16x16] . b[16x8], bf16 in, f32 accumulate. */
static __device__ __forceinline__ void cuda_fa_mma(float *c, const uint32_t *a, uint32_t b0,
                                                   uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared; src_bytes 0 fills the chunk with zeros (src is not read). */
static __device__ __forceinline__ void cuda_fa_cp16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(cuda_fa_smem_addr(dst)),
                 "l"(src), "r"(src_bytes));
}

static __device__ __forceinline__ void cuda_fa_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void cuda_fa_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Two f32 -> bf16x2 (lo: a), round to nearest even (one cvt.rn.bf16x2.f32). */
static __device__ __forceinline__ uint32_t cuda_fa_pack(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const uint32_t *)&h;
}

template <int HD>
static __global__ void __launch_bounds__(CUDA_FA_THREADS, 2) cuda_fa_kernel(struct cuda_fa_args a)
{
    constexpr int CH = HD / 8;           /* 16-byte chunks per row */
    constexpr int NT_S = CUDA_FA_BN / 8; /* n-tiles of S per warp */
    constexpr int NT_O = HD / 8;         /* n-tiles of O per warp */
    extern __shared__ uint4 cuda_fa_smem[];
    uint4 *qs = cuda_fa_smem;             /* [BM][CH] */
    uint4 *ks = qs + CUDA_FA_BM * CH;     /* [2][BN][CH] */
    uint4 *vs = ks + 2 * CUDA_FA_BN * CH; /* [2][BN][CH] */
    __shared__ int s_pos_max, s_pos_min;
    const int tid = threadIdx.x, warp = tid / CUDA_WARP, lane = tid % CUDA_WARP;
    const int tile = a.n_tiles - 1 - (int)blockIdx.x, kvh = blockIdx.y;
    const int r0 = a.tiles[2 * tile], s = a.tiles[2 * tile + 1];
    const int n_tok = min(a.tok_per_tile, a.seq_off[s + 1] - r0);
    const int n_rows = n_tok * a.group;
    const int32_t *bt = a.block_tables + (int64_t)s * a.bt_stride;
    const size_t kv_row_bytes = (size_t)a.n_kv_heads * HD * 2; /* one slot of a block */
    const size_t kv_head_off = (size_t)kvh * HD * 2;

    if (tid == 0) {
        s_pos_max = 0;
        s_pos_min = 0x7fffffff;
    }
    __syncthreads();
    if (tid < n_tok) {
        int p = a.pos[r0 + tid];
        atomicMax(&s_pos_max, p);
        atomicMin(&s_pos_min, p);
    }
    /* Q: rows past n_rows are zeros (finite scores, never written). */
    for (int idx = tid; idx < CUDA_FA_BM * CH; idx += CUDA_FA_THREADS) {
        int m = idx / CH, c = idx % CH;
        uint4 u = make_uint4(0, 0, 0, 0);
        if (m < n_rows) {
            int r = r0 + m / a.group, h = kvh * a.group + m % a.group;
            const float4 *src = (const float4 *)(a.q + ((int64_t)r * a.n_heads + h) * HD + c * 8);
            float4 x0 = src[0], x1 = src[1];
            u = make_uint4(cuda_fa_pack(x0.x, x0.y), cuda_fa_pack(x0.z, x0.w),
                           cuda_fa_pack(x1.x, x1.y), cuda_fa_pack(x1.z, x1.w));
        }
        qs[cuda_fa_sw<CH>(m, c)] = u;
    }
    __syncthreads(); /* s_pos_max, s_pos_min are final */
    const int pos_max = s_pos_max, pos_min = s_pos_min;
    const int n_kv_tiles = pos_max / CUDA_FA_BN + 1;

    /* K/V tile j into stage st: BN positions, one cp.async per 16 bytes. */
    auto load_kv = [&](int st, int j) {
        uint4 *kd = ks + st * CUDA_FA_BN * CH, *vd = vs + st * CUDA_FA_BN * CH;
        for (int idx = tid; idx < CUDA_FA_BN * CH; idx += CUDA_FA_THREADS) {
            int row = idx / CH, c = idx % CH, p = j * CUDA_FA_BN + row;
            const uint8_t *ksrc = a.k, *vsrc = a.v;
            int bytes = 0;
            if (p <= pos_max) {
                size_t off = (size_t)bt[p / a.block_size] * a.block_bytes +
                             (size_t)(p % a.block_size) * kv_row_bytes + kv_head_off +
                             (size_t)c * 16;
                ksrc += off;
                vsrc += off;
                bytes = 16;
            }
            cuda_fa_cp16(kd + cuda_fa_sw<CH>(row, c), ksrc, bytes);
            cuda_fa_cp16(vd + cuda_fa_sw<CH>(row, c), vsrc, bytes);
        }
    };
    load_kv(0, 0);
    cuda_fa_commit();

    /* This thread's two rows (accumulator rows g and g + 8 of its warp). */
    const int g = lane / 4, t4 = lane % 4;
    const int m_a = warp * 16 + g, m_b = m_a + 8;
    const int pos_a = m_a < n_rows ? a.pos[r0 + m_a / a.group] : 0;
    const int pos_b = m_b < n_rows ? a.pos[r0 + m_b / a.group] : 0;

    /* Q fragments for the whole walk: k-step kk covers dims 16 kk .. 16 kk + 15. */
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        cuda_fa_ldsm_x4(qf[kk], qs + cuda_fa_sw<CH>(warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8,
                                                    kk * 2 + lane / 16));

    float o[NT_O][4];
#pragma unroll
    for (int d = 0; d < NT_O; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m_run_a = -INFINITY, m_run_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    for (int j = 0; j < n_kv_tiles; j++) {
        const int st = j & 1;
        if (j + 1 < n_kv_tiles) {
            load_kv(st ^ 1, j + 1); /* its stage was last read in iteration j - 1 (synced) */
            cuda_fa_commit();
            cuda_fa_wait<1>();
        } else {
            cuda_fa_wait<0>();
        }
        __syncthreads(); /* stage st is complete for every thread */
        const uint4 *kt = ks + st * CUDA_FA_BN * CH, *vt = vs + st * CUDA_FA_BN * CH;

        float sc[NT_S][4];
#pragma unroll
        for (int n = 0; n < NT_S; n++)
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
            for (int nb = 0; nb < NT_S / 2; nb++) {
                uint32_t b[4];
                cuda_fa_ldsm_x4(b, kt + cuda_fa_sw<CH>(nb * 16 + (lane % 8) + (lane / 16) * 8,
                                                       kk * 2 + (lane / 8) % 2));
                cuda_fa_mma(sc[2 * nb], qf[kk], b[0], b[1]);
                cuda_fa_mma(sc[2 * nb + 1], qf[kk], b[2], b[3]);
            }
        }

        /* Scale to log2 units, mask, row maxima. sc[n][0..1]: row a, positions p0 + 8n + {0,1};
         * sc[n][2..3]: row b. */
        const int p0 = j * CUDA_FA_BN + 2 * t4;
        const bool masked = j * CUDA_FA_BN + CUDA_FA_BN - 1 > pos_min;
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT_S; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int p = p0 + 8 * n + e;
                float xa = sc[n][e] * a.scale_log2, xb = sc[n][2 + e] * a.scale_log2;
                if (masked && p > pos_a) xa = -INFINITY;
                if (masked && p > pos_b) xb = -INFINITY;
                sc[n][e] = xa;
                sc[n][2 + e] = xb;
                mx_a = fmaxf(mx_a, xa);
                mx_b = fmaxf(mx_b, xb);
            }
        }
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
        /* Finite: position 0 is in tile 0 and unmasked for every row (padding rows: pos 0). */
        const float mn_a = fmaxf(m_run_a, mx_a), mn_b = fmaxf(m_run_b, mx_b);
        const float corr_a = exp2f(m_run_a - mn_a), corr_b = exp2f(m_run_b - mn_b); /* 0 at j = 0 */
        m_run_a = mn_a;
        m_run_b = mn_b;
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int n = 0; n < NT_S; n++) {
            sc[n][0] = exp2f(sc[n][0] - mn_a);
            sc[n][1] = exp2f(sc[n][1] - mn_a);
            sc[n][2] = exp2f(sc[n][2] - mn_b);
            sc[n][3] = exp2f(sc[n][3] - mn_b);
            sum_a += sc[n][0] + sc[n][1];
            sum_b += sc[n][2] + sc[n][3];
        }
        l_a = l_a * corr_a + sum_a; /* this thread's columns; the quad is summed at the end */
        l_b = l_b * corr_b + sum_b;
#pragma unroll
        for (int d = 0; d < NT_O; d++) {
            o[d][0] *= corr_a;
            o[d][1] *= corr_a;
            o[d][2] *= corr_b;
            o[d][3] *= corr_b;
        }

        /* O += P V: k-step jj covers positions 16 jj .. 16 jj + 15 of the tile; the S
         * accumulators of n-tiles 2 jj, 2 jj + 1 are exactly the A fragment of P. */
#pragma unroll
        for (int jj = 0; jj < CUDA_FA_BN / 16; jj++) {
            uint32_t pf[4];
            pf[0] = cuda_fa_pack(sc[2 * jj][0], sc[2 * jj][1]);
            pf[1] = cuda_fa_pack(sc[2 * jj][2], sc[2 * jj][3]);
            pf[2] = cuda_fa_pack(sc[2 * jj + 1][0], sc[2 * jj + 1][1]);
            pf[3] = cuda_fa_pack(sc[2 * jj + 1][2], sc[2 * jj + 1][3]);
#pragma unroll
            for (int db = 0; db < NT_O / 2; db++) {
                uint32_t b[4];
                cuda_fa_ldsm_x4_t(b,
                                  vt + cuda_fa_sw<CH>(jj * 16 + (lane % 8) + ((lane / 8) % 2) * 8,
                                                      db * 2 + lane / 16));
                cuda_fa_mma(o[2 * db], pf, b[0], b[1]);
                cuda_fa_mma(o[2 * db + 1], pf, b[2], b[3]);
            }
        }
        __syncthreads(); /* stage st is reloaded in iteration j + 1 */
    }

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    if (m_a < n_rows) {
        float inv = 1.0f / l_a;
        float *dst =
            a.out +
            ((int64_t)(r0 + m_a / a.group) * a.n_heads + kvh * a.group + m_a % a.group) * HD;
#pragma unroll
        for (int d = 0; d < NT_O; d++)
            *(float2 *)(dst + 8 * d + 2 * t4) = make_float2(o[d][0] * inv, o[d][1] * inv);
    }
    if (m_b < n_rows) {
        float inv = 1.0f / l_b;
        float *dst =
            a.out +
            ((int64_t)(r0 + m_b / a.group) * a.n_heads + kvh * a.group + m_b % a.group) * HD;
#pragma unroll
        for (int d = 0; d < NT_O; d++)
            *(float2 *)(dst + 8 * d + 2 * t4) = make_float2(o[d][2] * inv, o[d][3] * inv);
    }
}

static size_t cuda_fa_smem_bytes(int hd)
{
    return (size_t)(CUDA_FA_BM + 4 * CUDA_FA_BN) * (size_t)(hd / 8) * 16;
}

extern "C" int cuda_attn_prefill_ok(const struct backend_attn *at)
{
    const struct backend_kv_view *kv = at->kv;
    int group = at->n_heads / kv->n_kv_heads;
    return kv->dtype == DTYPE_BF16 && (kv->head_dim == 64 || kv->head_dim == 128) && group >= 1 &&
           group <= CUDA_FA_BM && kv->n_kv_heads <= 65535 && (uintptr_t)kv->k % 16 == 0 &&
           (uintptr_t)kv->v % 16 == 0 && kv->block_bytes % 16 == 0 && (uintptr_t)at->q % 16 == 0 &&
           (uintptr_t)at->out % 8 == 0;
}

template <int HD>
static int cuda_fa_launch(cudaStream_t s, const struct cuda_fa_args *a, int n_kv_heads)
{
    /* The opt-in past 48 KiB, set on every launch: it is per device, and cheap. */
    size_t smem = cuda_fa_smem_bytes(HD);
    cudaError_t rc = cudaFuncSetAttribute(cuda_fa_kernel<HD>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc != cudaSuccess) return (int)rc;
    dim3 grid((unsigned)a->n_tiles, (unsigned)n_kv_heads);
    cuda_fa_kernel<HD><<<grid, CUDA_FA_THREADS, smem, s>>>(*a);
    return (int)cudaGetLastError();
}

extern "C" int cuda_k_attn_prefill(cudaStream_t s, const struct backend_attn *at,
                                   int32_t *tiles_dev, int32_t *tiles_host)
{
    const struct backend_kv_view *kv = at->kv;
    struct cuda_fa_args a;
    a.group = at->n_heads / kv->n_kv_heads;
    a.tok_per_tile = CUDA_FA_BM / a.group;
    /* Tiles of up to tok_per_tile tokens that never cross a sequence. */
    int n_tiles = 0;
    for (int q = 0; q < at->n_seqs; q++)
        for (int r0 = at->seq_off_host[q]; r0 < at->seq_off_host[q + 1]; r0 += a.tok_per_tile) {
            tiles_host[2 * n_tiles] = r0;
            tiles_host[2 * n_tiles + 1] = q;
            n_tiles++;
        }
    if (!n_tiles) return (int)cudaGetLastError();
    /* pageable: staged before the call returns, so tiles_host may be reused at once */
    cudaError_t rc = cudaMemcpyAsync(tiles_dev, tiles_host, sizeof(int32_t) * 2 * (size_t)n_tiles,
                                     cudaMemcpyHostToDevice, s);
    if (rc != cudaSuccess) return (int)rc;
    a.q = at->q;
    a.out = at->out;
    a.pos = at->pos;
    a.seq_off = at->seq_off;
    a.block_tables = at->block_tables;
    a.tiles = tiles_dev;
    a.k = (const uint8_t *)kv->k + (size_t)at->layer * kv->layer_block_bytes;
    a.v = (const uint8_t *)kv->v + (size_t)at->layer * kv->layer_block_bytes;
    a.block_bytes = kv->block_bytes;
    a.bt_stride = at->bt_stride;
    a.block_size = kv->block_size;
    a.n_kv_heads = kv->n_kv_heads;
    a.n_heads = at->n_heads;
    a.n_tiles = n_tiles;
    a.scale_log2 = at->scale * CUDA_FA_LOG2E;
    void *prof = cuda_prof_begin(s);
    int ret = kv->head_dim == 64 ? cuda_fa_launch<64>(s, &a, kv->n_kv_heads)
                                 : cuda_fa_launch<128>(s, &a, kv->n_kv_heads);
    if (prof) { /* 4 hd FLOPs per (row, head, attended position); rows at consecutive positions */
        double pairs = 0;
        for (int q = 0; q < at->n_seqs; q++) {
            double n = at->seq_off_host[q + 1] - at->seq_off_host[q];
            pairs += n * at->ctx_len_host[q] - n * (n - 1) / 2;
        }
        cuda_prof_end(prof, s, CUDA_PROF_ATTN_PREFILL, 4.0 * kv->head_dim * at->n_heads * pairs);
    }
    return ret;
}
