/* C-callable launchers of the CUDA kernels (cuda_*.cu), internal to cuda/.
 *
 * Every launcher enqueues on `s` and returns the launch's cudaError_t as an int (0: enqueued);
 * the C side (cuda_backend.c, cuda_ops.c) turns it into a status with cuda_check. Arguments are
 * checked by the callers (CAIRN_ASSERT); launchers trust them. All pointers are device pointers
 * unless named *_host. The CPU reference of each kernel is the op of the same name in
 * cpu/ref_ops.c (or model/gdn.c, model/moe.c), as tensor/backend.h defines it. */
#ifndef CAIRN_CUDA_CUDA_KERNELS_H
#define CAIRN_CUDA_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "tensor/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A prepared weight as the kernels see it: `rows` rows of `cols` logical values, row r at
 * data + r * row_bytes. Dense types are the checkpoint's bytes. CUDA_W_Q rows are repacked at
 * upload (cuda_backend.c) as [codes: cols*bits/8 bytes, MLX's uint32 words as is][scales: bf16
 * x groups][biases: bf16 x groups], padded to 16 bytes, so one pointer walks a row and a row
 * slice (one expert) is plain pointer arithmetic. */
enum cuda_wtype {
    CUDA_W_F32 = 0,
    CUDA_W_F16,
    CUDA_W_BF16,
    CUDA_W_Q,
};

struct cuda_wdesc {
    enum cuda_wtype type;
    int64_t rows;
    int64_t cols;
    const void *data;
    size_t row_bytes;
    int bits;       /* CUDA_W_Q: 2..8 */
    int group_size; /* CUDA_W_Q: 32, 64 or 128 */
};

#ifdef __CUDACC__
#define CUDA_HD __host__ __device__
#else
#define CUDA_HD
#endif

/* Byte offsets of a CUDA_W_Q row's scales and biases (codes start at 0). */
static inline CUDA_HD size_t cuda_q_scales_off(int64_t cols, int bits) { return (size_t)(cols * bits / 8); }
static inline CUDA_HD size_t cuda_q_biases_off(int64_t cols, int bits, int group_size)
{
    return cuda_q_scales_off(cols, bits) + (size_t)(cols / group_size) * 2;
}
static inline CUDA_HD size_t cuda_q_row_bytes(int64_t cols, int bits, int group_size)
{
    size_t b = cuda_q_biases_off(cols, bits, group_size) + (size_t)(cols / group_size) * 2;
    return (b + 15) & ~(size_t)15;
}

/* ---- cuda_gemv.cu: matmul pieces ---- */
/* y[n, rows] = x[n, cols] . W^T for n in 1..CUDA_GEMV_MAX_N (weights streamed once); n_sms:
 * the GPU's multiprocessors (the persistent grid's size). accumulate: y += x . W^T instead
 * (the residual add of o_proj and down_proj in the GEMV's epilogue). */
#define CUDA_GEMV_MAX_N 8
#define CUDA_GEMV_MAX_W 4
#define CUDA_GEMV_LONG_ROW 8192 /* dense n = 1: rows of this many bytes take 1-row items */
int cuda_k_gemv(cudaStream_t s, const struct cuda_wdesc *w, const float *x, float *y, int n,
                int n_sms, int accumulate);
/* y[i][n, rows_i] = x . w[i]^T (or += with accumulate) for count <= CUDA_GEMV_MAX_W weights of
 * one layout (cuda_k_gemv_fusable pairwise), in one launch. */
int cuda_k_gemv_multi(cudaStream_t s, const struct cuda_wdesc *w, float *const *y, int count,
                      const float *x, int n, int n_sms, int accumulate);
/* Whether two weights can share a cuda_k_gemv_multi launch (type, cols, bits, group size). */
int cuda_k_gemv_fusable(const struct cuda_wdesc *a, const struct cuda_wdesc *b);
/* cuda_k_gemv_multi with an RMSNorm of x and/or SwiGLU folded in (cuda_op_matmul_fused):
 * norm != NULL: each x row is rms-normed with the weight norm [cols] (+ w_offset, eps) first;
 * silu (count == 2, gate and up of equal rows): y[0] = silu(x . w[0]^T) * (x . w[1]^T), y[1] not
 * written. A row's result is the same bits for any n <= CUDA_GEMV_MAX_N. Compiled for BF16 and
 * MLX q4/q8 weights with the norm (and SwiGLU or not). Returns CUDA_GEMV_UNFUSED for the rest
 * (other weight types, SwiGLU without a norm, the scalar layouts, mixed layouts, misaligned
 * pointers): nothing was launched and the caller runs the plain ops. */
#define CUDA_GEMV_UNFUSED (-1)
int cuda_k_gemv_fused(cudaStream_t s, const struct cuda_wdesc *w, float *const *y, int count, const float *x,
                      int n, int n_sms, const float *norm, float eps, float w_offset, int silu);
/* dst[i] = (bf16 or f16) src[i], round to nearest even. */
int cuda_k_f32_to_bf16(cudaStream_t s, uint16_t *dst, const float *src, int64_t n);
int cuda_k_f32_to_f16(cudaStream_t s, uint16_t *dst, const float *src, int64_t n);
/* dst[rows, cols] (bf16) = dequantized CUDA_W_Q weight. */
int cuda_k_dequant_bf16(cudaStream_t s, const struct cuda_wdesc *w, uint16_t *dst);

/* ---- cuda_gemm_small.cu: the small-batch matmul on tensor cores ---- */
/* y[i][n, rows_i] = x[n, cols] . w[i]^T (accumulate: +=) for n in 1..CUDA_MMA_MAX_N and count <=
 * CUDA_GEMV_MAX_W dense BF16 or F16 weights of one layout, in one launch (x rounded to bf16 / f16,
 * f32 accumulation); silu (count == 2, gate and up of equal rows, no accumulate): y[0] =
 * silu(x . w[0]^T) * (x . w[1]^T), y[1] not written. A row's result is the same bits for any n
 * <= CUDA_MMA_MAX_N. n_sms: the GPU's multiprocessors (the persistent grid). Returns CUDA_MMA_NO when it cannot take the call (cuda_k_mma_takes false:
 * other types, cols % 32, unaligned W or x, mixed layouts): nothing was launched. */
#define CUDA_MMA_MAX_N 16
#define CUDA_MMA_NO (-1)
int cuda_k_mma_takes(const struct cuda_wdesc *w, int count, const float *x, int n);
int cuda_k_mma(cudaStream_t s, const struct cuda_wdesc *w, float *const *y, int count, const float *x, int n,
               int n_sms, int accumulate, int silu);

/* ---- cuda_elem.cu: element-wise, norms, rope, embeddings, KV stores, routing ---- */
int cuda_k_embed(cudaStream_t s, const struct cuda_wdesc *w, const int32_t *ids, int n, float *out);
int cuda_k_rmsnorm(cudaStream_t s, float *y, const float *x, const float *w, int n_rows, int dim,
                   float eps, float w_offset);
int cuda_k_rope(cudaStream_t s, float *x, int n_tokens, int n_heads, int head_dim, int rot_dim,
                const int32_t *pos, const float *inv_freq);
int cuda_k_silu_mul(cudaStream_t s, float *out, const float *gate, const float *up, int64_t n);
/* The GEMM's 16-bit x made where it is computed (cuda_matmul.c): rmsnorm_h16 writes h [n_rows,
 * dim] = bf16 (f16 when f16) of the normed rows, and y (f32, NULL: not written) as cuda_k_rmsnorm;
 * silu_mul_h16 writes out = silu(gate) * up and h = its bf16 (f16) copy. Each h value is the
 * f32 result of the plain kernel rounded to nearest even. Both return CUDA_ELEM_UNFUSED (nothing
 * launched) for shapes or alignments their float4 kernels do not take (dim or n % 4, pointers). */
#define CUDA_ELEM_UNFUSED (-1)
int cuda_k_rmsnorm_h16(cudaStream_t s, float *y, uint16_t *h, int f16, const float *x, const float *w, int n_rows,
                       int dim, float eps, float w_offset);
int cuda_k_silu_mul_h16(cudaStream_t s, float *out, uint16_t *h, int f16, const float *gate, const float *up,
                        int64_t n);
int cuda_k_add(cudaStream_t s, float *y, const float *x, int64_t n);
int cuda_k_add_bias(cudaStream_t s, float *y, const float *b, int n_rows, int dim);
int cuda_k_mul_sigmoid(cudaStream_t s, float *y, const float *g, int64_t n);
int cuda_k_add_sigmoid_scaled(cudaStream_t s, float *y, const float *x, const float *g, int n_rows,
                              int dim);
int cuda_k_split_halves(cudaStream_t s, float *a, float *b, const float *src, int n_rows, int width);
int cuda_k_gather_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n,
                       int dim);
int cuda_k_kv_store(cudaStream_t s, const struct backend_kv_view *kv, int layer,
                    const int32_t *slots, int n_tokens, const float *k, const float *v);
/* The fused qk_rope_store op (tensor/backend.h) for head_dim <= CUDA_QKR_MAX_DIM. */
#define CUDA_QKR_MAX_DIM 512
int cuda_k_qk_rope_store(cudaStream_t s, const struct backend_qk_rope_store *r);
int cuda_k_moe_route(cudaStream_t s, const float *logits, int n, int n_experts, int top_k,
                     int norm_topk, int32_t *ids, float *w);
/* dst[i] = x[list[i] / top_k] for i < cnt (rows of dim). */
int cuda_k_moe_gather(cudaStream_t s, float *dst, const float *x, const int32_t *list, int cnt,
                      int top_k, int dim);
/* out[list[i] / top_k] += w[list[i]] * y[i] for i < cnt; list holds each token at most once. */
int cuda_k_moe_scatter(cudaStream_t s, float *out, const float *y, const float *w,
                       const int32_t *list, int cnt, int top_k, int dim);

/* ---- cuda_attn.cu: paged attention ---- */
/* Attention kernels: CUDA_ATTN_AUTO picks the tiled prefill kernel when the step has more than
 * CUDA_ATTN_EXACT_ROWS rows, at least CUDA_ATTN_TILED_MIN_ROWS per sequence (and head_dim <= 128),
 * else split-K; steps of at most CUDA_ATTN_EXACT_ROWS rows plan their splits per row, so a
 * row's output does not depend on the rest of the step (bit for bit); a prefill
 * step with BF16 KV and head_dim 64/128 then takes the tensor-core kernel (cuda_attn_prefill.cu)
 * unless the mode is CUDA_ATTN_TILED (CAIRN_CUDA_ATTN=tiled: the f32 tiled kernel). */
enum cuda_attn_mode { CUDA_ATTN_AUTO = 0, CUDA_ATTN_SPLIT, CUDA_ATTN_TILED };
#define CUDA_ATTN_TILED_MIN_ROWS 8
#define CUDA_ATTN_EXACT_ROWS CUDA_MMA_MAX_N /* the small matmuls' batch-invariant row count too */
/* Floats of device workspace cuda_k_attention needs for this step (max_ctx: its longest
 * sequence; n_sms: the GPU's multiprocessors; n_counters: as cuda_k_attention's); 0: none. */
size_t cuda_attn_ws_floats(const struct backend_attn *a, int max_ctx, int n_sms, int mode,
                           size_t n_counters);
/* tiles_host: host scratch of 2 * (n_tokens + n_seqs) ints (the tiled kernel's tile list).
 * counters: n_counters device ints, zero, left zero (the decode kernel's split counts, one per
 * (row, KV head); steps with more take the generic split-K kernels). */
/* dec: the version of the decode kernel (CAIRN_CUDA_ATTN_DEC): FAST (the default) waits on
 * fewer dependent memory round trips per block (cuda_attn.cu); TUNED ("tuned") has its
 * registers capped so that 4 blocks fit an SM and finds a decode row's sequence without a
 * search; LEGACY ("legacy") is the kernel before tuning; PIPE ("pipe") is fast with the next
 * pass's K and V copied to shared memory (cp.async) while a pass computes. Legacy and tuned
 * give the same bits, fast and pipe the same bits; fast the same plans as tuned, its combine
 * rounds differently. */
enum cuda_attn_dec { CUDA_ATTN_DEC_LEGACY = 0, CUDA_ATTN_DEC_TUNED, CUDA_ATTN_DEC_FAST, CUDA_ATTN_DEC_PIPE };
/* bt_min: block-table entries every sequence's row surely holds in every step this launch may be
 * replayed for (cuda_attn_bt_min); the fast decode kernel reads no entry past it before it
 * knows a row's context. */
int cuda_k_attention(cudaStream_t s, const struct backend_attn *a, int max_ctx, int bt_min, int n_sms,
                     int mode, int dec, float *ws, int32_t *tiles_host, int *counters, size_t n_counters);
/* Whether cuda_k_attention takes the tiled prefill kernel for this step (else split-K). */
int cuda_attn_tiled(const struct backend_attn *a, int mode);
/* Device ints the backend keeps zeroed for cuda_k_attention's counters. */
#define CUDA_ATTN_COUNTERS 65536
/* Largest head_dim cuda_k_attention takes. */
#define CUDA_ATTN_HEAD_DIM_MAX 256

/* ---- cuda_attn_prefill.cu: tensor-core flash attention for prefill chunks ---- */
/* Whether the kernel takes this step: BF16 KV, head_dim 64 or 128, a GQA group of at most 64
 * query heads, 16-byte aligned q and pool. cuda_k_attention calls it for prefill steps. */
int cuda_attn_prefill_ok(const struct backend_attn *a);
/* tiles_dev: device scratch of 2 * (n_tokens + n_seqs) ints; tiles_host: host scratch as big. */
int cuda_k_attn_prefill(cudaStream_t s, const struct backend_attn *a, int32_t *tiles_dev,
                        int32_t *tiles_host);

/* ---- cuda_gemm_prep.cu: the GEMM's bf16 inputs at memory speed ---- */
/* dst[i] = bf16(src[i]), 8 per thread (cuda_k_f32_to_bf16 when unaligned). */
int cuda_k_act_bf16(cudaStream_t s, uint16_t *dst, const float *src, int64_t n);
/* As cuda_k_dequant_bf16, by 16-byte chunks for q4/q8 (the same values, bit for bit). */
int cuda_k_dequant_q_bf16(cudaStream_t s, const struct cuda_wdesc *w, uint16_t *dst);

/* ---- cuda_prof.cu: CAIRN_CUDA_PROFILE=1, GPU time per op kind, printed at exit ---- */
enum cuda_prof_kind {
    CUDA_PROF_GEMM = 0,
    CUDA_PROF_ACT,          /* activations f32 -> bf16/f16 for the GEMM */
    CUDA_PROF_DEQUANT,      /* MLX weights -> bf16 for the GEMM */
    CUDA_PROF_ATTN_PREFILL, /* cuda_k_attn_prefill */
    CUDA_PROF_N,
};
/* Opens a timed region on s (NULL when profiling is off or s is capturing); cuda_prof_end
 * closes it (waits for s), adding its time and `flops` to `kind`. NULL regions are no-ops. */
void *cuda_prof_begin(cudaStream_t s);
void cuda_prof_end(void *region, cudaStream_t s, enum cuda_prof_kind kind, double flops);
/* CAIRN_CUDA_STEP_PROFILE=1 / CAIRN_CUDA_PROF_STEPS=ROWS[,ROWS..]:SKIP:COUNT (cuda_prof.cu): a
 * step's wall time split into the host's time before its first launch, the GPU's and the rest, by
 * token rows; and a cudaProfilerStart/Stop range around chosen steps, for ncu. open returns NULL
 * when both are off (then every call is a no-op); the backend calls begin at step_begin, launch
 * at the step's first launch (rows: its token rows, graph: a graph launch), mark before each
 * wait for the stream, freeze before step_end's own wait, and end after it. */
void *cuda_prof_step_open(void);
void cuda_prof_step_close(void *prof);
void cuda_prof_step_begin(void *prof);
void cuda_prof_step_launch(void *prof, cudaStream_t s, int rows, int graph);
void cuda_prof_step_mark(void *prof, cudaStream_t s);
void cuda_prof_step_freeze(void *prof, cudaStream_t s);
void cuda_prof_step_end(void *prof);

/* ---- cuda_moe.cu: routed experts of a batch, sorted by expert on the device ---- */
#define CUDA_MOE_DEVICE_MAX_N 128  /* tokens: more (a prefill) take the host-grouped GEMMs (cuda_ops.c) */
#define CUDA_MOE_MAX_EXPERTS 1024 /* the sort's shared-memory counters */
/* One MoE layer's experts: expert 0's view of each projection (every expert has its layout) and
 * device tables of each expert's row-0 pointer. */
struct cuda_moe_set {
    struct cuda_wdesc gate, up, down;
    const void *const *gate_data; /* device [n_experts] */
    const void *const *up_data;
    const void *const *down_data;
    int n_experts;
};
/* Device scratch of one call over `slots` = n * top_k slots (cuda_moe.c carves it). */
struct cuda_moe_ws {
    const float *x;   /* [n, hidden] the input */
    float *h;         /* [slots, inter] */
    float *ys;        /* [slots, hidden] */
    int32_t *list;    /* [slots] slot ids sorted by expert */
    int32_t *off;     /* [n_experts + 1] */
    int32_t *act;     /* [n_experts] experts with a slot, ascending */
    int32_t *n_act;   /* [1] */
};
/* out [n, down.rows] = sum_k w[s] * down_e(silu(gate_e x_t) * up_e x_t) over the slots
 * s = t * top_k + k, e = ids[s]; ids, w: moe_route's [n, top_k]. one: n = 1 may take the
 * unsorted two-kernel path (0: CAIRN_CUDA_MOE=old, the sorted path always; 1: its first kernels
 * for every kind, CAIRN_CUDA_MOE=legacy1; 2: MLX q4/q8 take the staged kernels); the bits are
 * the same. */
int cuda_k_moe_grouped(cudaStream_t s, const struct cuda_moe_set *set, const struct cuda_moe_ws *ws,
                       const int32_t *ids, const float *w, float *out, int n, int top_k, int one, int n_sms);

/* ---- cuda_gdn.cu: gated DeltaNet over one sequence ---- */
int cuda_k_gdn(cudaStream_t s, const struct backend_gdn *g);

/* sample (cuda_sample.cu): n rows, one block each; rows: n packed row records of
 * cuda_k_sample_row_bytes() bytes (cuda_backend.c packs them), edits: the rows' edits, out: n
 * struct backend_sample_out. */
int cuda_k_sample(cudaStream_t s, float *logits, int vocab, const void *rows, const void *edits, int n, void *out);
size_t cuda_k_sample_row_bytes(void);

#ifdef __cplusplus
}
#endif

#endif
