/* Internals of the CUDA backend, shared by its C files (never included outside cuda/).
 *
 * DESIGN
 * - One struct cuda_impl per opened GPU (be->impl): the device index, one non-blocking stream
 *   on which every op and copy is issued in order, a cuBLASLt handle, device properties read at
 *   open, grow-on-demand device workspaces (bf16 activation tiles, dequantized weights, attention
 *   partials or tile lists, MoE token lists), the step lock, and the first error latched by an op.
 * - Errors: cuda_check(c, err, call) evaluates a CUDA runtime or cuBLASLt call once and, when
 *   it failed, writes "cuda:N: <call text>: <error name>: <description> (file:line)" into err
 *   (may be NULL) and into c's latch (first error wins; c may be NULL), and returns the cairn
 *   status: CAIRN_ERR_NOMEM for an allocation failure, CAIRN_ERR_INTERNAL otherwise. Ops
 *   return nothing (backend.h): they latch, and step_end / sync report the latch and clear it.
 *   Once an op has latched, later ops of the step are skipped (their inputs are garbage).
 * - Waits: every wait for the stream is cuda_stream_wait, bounded by the backend's step timeout
 *   (an event polled, never an unbounded synchronize); a timeout or a sticky fault marks the
 *   context dead (CAIRN_ERR_DEVICE) and nothing runs on it again.
 * - Memory: cuda_dev_alloc / cuda_dev_free are the one way device memory is taken. They keep
 *   the device budget (bytes held by cairn, and the CAIRN_CUDA_MEM_LIMIT cap) and count the
 *   bytes under a base/mem.h tag as well, so /api/status sees device memory where it went.
 * - Graphs: with CAIRN_CUDA_GRAPHS on (the default), the op table's entries record the ops of
 *   a step and replay runs seen before as CUDA graphs (cuda_graph.c).
 * - Threading: c->step_lock is held from step_begin to step_end; ops and the workspaces are
 *   used only under it. Buffer and weight calls take no lock (the stream is thread-safe; they
 *   synchronize it). The budget counter is atomic. Every entry point that can run on a new host
 *   thread calls cudaSetDevice first (the runtime's current device is per thread). */
#ifndef CAIRN_CUDA_CUDA_INT_H
#define CAIRN_CUDA_CUDA_INT_H

#include <pthread.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#if __has_include(<nccl.h>) /* NCCL is a package of its own; without it TP is refused */
#include <nccl.h>
#define CAIRN_HAVE_NCCL 1
#endif

#include "base/mem.h"
#include "base/status.h"
#include "cuda/cuda_kernels.h"
#include "tensor/backend.h"

enum cuda_ws_slot {
    CUDA_WS_ACT = 0, /* matmul: activations converted to bf16/f16 */
    CUDA_WS_DEQ,     /* matmul: a quantized weight dequantized to bf16 for cuBLASLt */
    CUDA_WS_ATTN,    /* attention: split-K partials, or the tiled kernel's tile list */
    CUDA_WS_MOE,     /* moe_experts: token lists per expert (int32) */
    CUDA_WS_ACC,     /* matmul_add of a GEMM-sized step: the product before it is added */
    CUDA_WS_MOE_DEV, /* moe_experts on the device: per-slot activations, sorted slot lists */
    CUDA_WS_SAMPLE,  /* sample: the rows' parameters and edits, then their results */
    CUDA_WS_N,
};

struct cuda_ws {
    void *ptr;    /* device */
    size_t bytes;
};

/* A 16-bit copy of an f32 activation, made by the op that wrote the activation (matmul_fused's
 * SwiGLU at GEMM size) for the matmul that reads it next (down_proj), which then skips its
 * conversion. Valid only while c->n_calls is still seq, i.e. until any other CUDA call (a
 * launch, copy or cuBLASLt call of any op) could have written src; every matmul entry takes it
 * and clears it (cuda_matmul.c). */
struct cuda_mm_memo {
    const float *src;      /* the f32 activation; NULL: none */
    const uint16_t *copy;  /* device: its bf16 (f16) copy, in CUDA_WS_ACT */
    int64_t elems;
    int f16;               /* copy is f16 (for F16 weights), else bf16 */
    uint64_t seq;          /* c->n_calls when copy was complete */
};

struct cuda_impl {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;                /* device: cuBLASLt workspace, CUDA_LT_WS_BYTES */
    struct cuda_ws ws[CUDA_WS_N];
    int n_sms;                  /* multiprocessors */
    size_t smem_optin;          /* shared memory per block after opt-in */
    size_t l2_bytes;
    char dev_name[256];
    int gemv_max_rows;          /* matmuls of up to this many rows use the GEMV kernel */
    int mma_min_rows;           /* matmuls of mma_min_rows..mma_max_rows rows whose weights it takes
                                 * use the tensor-core kernel (cuda_gemm_small.cu); max 0: never
                                 * (CAIRN_CUDA_MMA=0); min 2: the GEMV keeps n = 1 (=2) */
    int mma_max_rows;
    int exact_rows_mma;         /* be->exact_rows while every weight prepared goes to that kernel */
    int fuse;                   /* the fused ops fuse (CAIRN_CUDA_FUSE=0: they run the plain
                                 * sequence, for comparison) */
    int fuse_norm;              /* matmul_fused folds the RMSNorm into the GEMV: 0 never
                                 * (CAIRN_CUDA_FUSE_NORM=0 or CAIRN_CUDA_FUSE=0), 1 but for dense
                                 * long rows (the default: cuda_matmul.c), 2 always (=1) */
    int fuse_silu;              /* ... and SwiGLU into gate/up's epilogue (CAIRN_CUDA_FUSE_SILU=0) */
    int fuse_gemm;              /* GEMM-sized steps (n > 16): the norm and SwiGLU write the GEMM's
                                 * 16-bit x, matmul_add adds in cuBLASLt (beta = 1); 0: the plain
                                 * sequence (CAIRN_CUDA_FUSE_GEMM=0 or CAIRN_CUDA_FUSE=0) */
    uint64_t n_calls;           /* atomic: CUDA calls checked so far (cuda_check, cuda_check_launch):
                                 * what dates mm_memo */
    struct cuda_mm_memo mm_memo;
    int sync_each_op;           /* CAIRN_CUDA_SYNC=1: wait after every launch (debugging) */
    int attn_mode;              /* enum cuda_attn_mode, CAIRN_CUDA_ATTN */
    int attn_dec;               /* enum cuda_attn_dec, CAIRN_CUDA_ATTN_DEC (cuda_k_attention) */
    int32_t *attn_tiles_host;   /* attention: the tiled kernel's tile list, grown on demand */
    size_t attn_tiles_cap;      /* ints it holds */
    int *attn_counters;         /* device: CUDA_ATTN_COUNTERS ints, zero between attention calls */
    uint64_t mem_limit;         /* CAIRN_CUDA_MEM_LIMIT, 0: none */
    uint64_t mem_used;          /* atomic: device bytes cairn holds */
    pthread_mutex_t step_lock;  /* held from step_begin to step_end */
    int err_status;             /* first error latched by an op (CAIRN_OK: none) */
    struct cairn_err err;       /* its message */
    int32_t *moe_ids_host;      /* moe_experts: host copy of ids, grown on demand */
    int32_t *moe_list_host;     /* moe_experts: sorted entries, offsets, cursors (cuda_ops.c) */
    size_t moe_host_cap;        /* ints each of the two host arrays holds */
    struct cuda_graphs *graphs; /* decode graphs (cuda_graph.c); NULL: CAIRN_CUDA_GRAPHS=0 */
    struct cuda_moe_tables *moe_tables; /* expert pointer tables per MoE layer (cuda_moe.c) */
    int moe_host_only;          /* CAIRN_CUDA_MOE=host: every moe_experts groups on the host */
    int moe_old;                /* CAIRN_CUDA_MOE=old: one token takes the sorted path too */
    uint64_t g_gen;             /* atomic: bumped when device memory a graph may name is freed */
    int g_capturing;            /* a graph capture is in progress on the stream */
    struct backend *pub;        /* the struct backend holding this (its step_timeout_s) */
    cudaEvent_t wait_event;     /* recorded on the stream by cuda_stream_wait; lazily created */
    int dead;                   /* a wait timed out or hit a sticky error: no more steps */
    char dead_why[256];         /* what happened, for the errors of later calls */
    void *sample_host;          /* sample: host staging (rows, edits, results), grown on demand */
    size_t sample_host_bytes;
    struct backend_ops ops_nosample; /* CAIRN_CUDA_SAMPLE=0: the table in use less its sample op */
    void *prof_step;                 /* cuda_prof_step_open's state; NULL: step profiling off */
    void *nccl_comm;            /* ncclComm_t of the rank's tensor-parallel group, or NULL
                                   (cuda_nccl.c, set by cuda_tp_init) */
};

/* Recorded runs of ops kept as graphs (cuda_graph.c). */
#define CUDA_GRAPH_CACHE 16

#define CUDA_LT_WS_BYTES ((size_t)32 << 20)

/* cuBLASLt entry points, loaded by cuda_lt_load (cuda_lt.c) before the first backend opens;
 * call them as cuda_lt.matmul(...). */
struct cuda_lt_api {
    __typeof__(&cublasLtCreate) create;
    __typeof__(&cublasLtDestroy) destroy;
    __typeof__(&cublasLtGetStatusName) status_name;
    __typeof__(&cublasLtGetStatusString) status_string;
    __typeof__(&cublasLtMatmulDescCreate) desc_create;
    __typeof__(&cublasLtMatmulDescDestroy) desc_destroy;
    __typeof__(&cublasLtMatmulDescSetAttribute) desc_set;
    __typeof__(&cublasLtMatrixLayoutCreate) layout_create;
    __typeof__(&cublasLtMatrixLayoutDestroy) layout_destroy;
    __typeof__(&cublasLtMatmulPreferenceCreate) pref_create;
    __typeof__(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    __typeof__(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    __typeof__(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    __typeof__(&cublasLtMatmul) matmul;
};
extern struct cuda_lt_api cuda_lt;
/* Loads cuBLASLt once per process; CAIRN_ERR_UNSUPPORTED saying why when it cannot. */
int cuda_lt_load(struct cairn_err *err);

enum cuda_res_kind {
    CUDA_RES_RT = 0,   /* cudaError_t */
    CUDA_RES_BLAS = 1, /* cublasStatus_t */
    CUDA_RES_NCCL = 2, /* ncclResult_t */
};

#ifdef CAIRN_HAVE_NCCL
#define cuda_res_kind_of(call)                                                                     \
    _Generic((call), cudaError_t: CUDA_RES_RT, cublasStatus_t: CUDA_RES_BLAS,                      \
             ncclResult_t: CUDA_RES_NCCL)
#else
#define cuda_res_kind_of(call)                                                                     \
    _Generic((call), cudaError_t: CUDA_RES_RT, cublasStatus_t: CUDA_RES_BLAS)
#endif

/* Counts a checked call in c->n_calls (c may be NULL); returns c. */
static inline struct cuda_impl *cuda_calls_bump(struct cuda_impl *c)
{
    if (c) __atomic_fetch_add(&c->n_calls, 1, __ATOMIC_RELAXED);
    return c;
}

/* A kernel launcher's result (cuda_kernels.h), checked like a runtime call; with
 * CAIRN_CUDA_SYNC=1 the stream is also waited for, so an asynchronous fault is reported at
 * the launch that caused it rather than at step_end. Returns the status. */
#define cuda_check_launch(c, call)                                                                 \
    cuda_check_launch_at(cuda_calls_bump(c), (call), #call, __FILE__, __LINE__)
int cuda_check_launch_at(struct cuda_impl *c, int code, const char *text, const char *file, int line);

/* Evaluates call once; see DESIGN. */
#define cuda_check(c, err, call)                                                                   \
    cuda_check_result(cuda_calls_bump(c), (err), cuda_res_kind_of(call), (int)(call), #call, __FILE__, __LINE__)

int cuda_check_result(struct cuda_impl *c, struct cairn_err *err, enum cuda_res_kind kind, int code,
                      const char *text, const char *file, int line);
/* Waits for the stream, bounded by the backend's step timeout (backend.h): polls an event
 * (spinning for the first 2 ms, then sleeping 50 us at a time) instead of an unbounded
 * cudaStreamSynchronize. Past the timeout, or on an error other than "not ready" (a sticky
 * fault), returns CAIRN_ERR_DEVICE (into err and the latch) and marks the context dead: every
 * later wait and step_begin fails at once, so a timed-out context is never reused. */
#define cuda_stream_wait(c, err) cuda_stream_wait_at((c), (err), __FILE__, __LINE__)
int cuda_stream_wait_at(struct cuda_impl *c, struct cairn_err *err, const char *file, int line);
/* NCCL (cuda_nccl.c): the text of an ncclResult_t, and the seam's allreduce of a rank. */
const char *cuda_nccl_error_string(int code);
void cuda_nccl_allreduce(struct backend *be, float *buf, int64_t n);
/* Latches an error that is not a CUDA result (a workspace that cannot grow). */
void cuda_latch(struct cuda_impl *c, const struct cairn_err *err);

static inline struct cuda_impl *cuda_impl_of(struct backend *be)
{
    return (struct cuda_impl *)be->impl;
}

/* Device memory through the budget; zeroed when zero is set. */
int cuda_dev_alloc(struct cuda_impl *c, size_t bytes, enum cairn_mem_tag tag, int zero, void **out,
                   struct cairn_err *err);
void cuda_dev_free(struct cuda_impl *c, void *p, size_t bytes, enum cairn_mem_tag tag);
/* Pointer to at least `bytes` of workspace `slot` (grown, after a stream sync, when smaller);
 * NULL with the error latched when the device has no room. Inside a step only. */
void *cuda_ws_get(struct cuda_impl *c, enum cuda_ws_slot slot, size_t bytes);

/* The kernels' view of a prepared weight (asserts w was prepared by this backend). */
struct cuda_wdesc cuda_wdesc_of(const struct tensor *w);

/* cuda_graph.c: see its DESIGN. init reads CAIRN_CUDA_GRAPHS; fill_ops puts the recording
 * entries into an op table; step_begin/step_end bracket a step; before_copy flushes the run
 * recorded so far (a copy or sync on the step's thread needs its results); invalidate drops
 * every cached graph at the next flush (any thread). */
int cuda_graphs_init(struct cuda_impl *c);
void cuda_graphs_free(struct cuda_impl *c);
void cuda_graphs_fill_ops(struct backend_ops *ops);
void cuda_graphs_step_begin(struct cuda_impl *c);
void cuda_graphs_step_end(struct backend *be);
void cuda_graphs_before_copy(struct backend *be);
void cuda_graphs_invalidate(struct cuda_impl *c);

/* cuda_ops.c: whether attention `a` takes a split-K kernel (what graphs can hold), and the
 * context bucket its split plan is made from (the longest context rounded up). */
int cuda_attn_split_path(struct cuda_impl *c, const struct backend_attn *a);
int cuda_attn_ctx_bucket(const struct backend_attn *a);
/* Block-table entries every sequence's row of `a` surely holds in any step in the same bucket
 * (what a graph of it may be replayed for): cuda_k_attention's bt_min. */
int cuda_attn_bt_min(const struct backend_attn *a);

/* cuda_matmul.c */
void cuda_op_matmul(struct backend *be, const struct tensor *w, const float *x, float *y, int n);
void cuda_op_matmul_multi(struct backend *be, const struct tensor *const *w, float *const *y,
                          int count, const float *x, int n);
void cuda_op_matmul_add(struct backend *be, const struct tensor *w, const float *x, float *y, int n);
void cuda_op_matmul_fused(struct backend *be, const struct backend_matmul_fused *f);
/* Rows up to which matmul_fused folds into one kernel (the GEMV's or the tensor-core one's). */
int cuda_mm_small_rows(const struct cuda_impl *c);

/* cuda_ops.c: the ops other than matmul, in the order of backend_ops. */
void cuda_op_embed(struct backend *be, const struct tensor *w, const int32_t *ids, int n,
                   float *out);
void cuda_op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n_rows,
                     int dim, float eps, float w_offset);
void cuda_op_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_dim,
                  int rot_dim, const int32_t *pos, const float *inv_freq);
void cuda_op_silu_mul(struct backend *be, float *out, const float *gate, const float *up,
                      int64_t n);
void cuda_op_add(struct backend *be, float *y, const float *x, int64_t n);
void cuda_op_add_bias(struct backend *be, float *y, const float *b, int n_rows, int dim);
void cuda_op_mul_sigmoid(struct backend *be, float *y, const float *g, int64_t n);
void cuda_op_add_sigmoid_scaled(struct backend *be, float *y, const float *x, const float *g,
                                int n_rows, int dim);
void cuda_op_split_halves(struct backend *be, float *a, float *b, const float *src, int n_rows,
                          int width);
void cuda_op_gather_rows(struct backend *be, float *dst, const float *src, const int32_t *rows,
                         int n, int dim);
void cuda_op_kv_store(struct backend *be, const struct backend_kv_view *kv, int layer,
                      const int32_t *slots, int n_tokens, const float *k, const float *v);
void cuda_op_attention(struct backend *be, const struct backend_attn *a);
void cuda_op_qk_rope_store(struct backend *be, const struct backend_qk_rope_store *r);
void cuda_op_moe_route(struct backend *be, const float *logits, int n, int n_experts, int top_k,
                       int norm_topk, int32_t *ids, float *w);
void cuda_op_moe_experts(struct backend *be, const struct backend_moe *m);
/* cuda_moe.c: moe_experts for n <= CUDA_MOE_DEVICE_MAX_N tokens on the device alone (sorted
 * by expert there); returns 0 (nothing launched) when the layer's experts do not share one
 * layout, so the caller takes the host-grouped path. cuda_moe_tabled: whether m's layer takes
 * that path (its table built or checked now, outside any capture). cuda_moe_free: the tables,
 * at destroy. */
int cuda_moe_experts_device(struct backend *be, const struct backend_moe *m);
int cuda_moe_tabled(struct backend *be, const struct backend_moe *m);
void cuda_moe_free(struct cuda_impl *c);
void cuda_op_gdn(struct backend *be, const struct backend_gdn *g);
void cuda_op_copy_rows(struct backend *be, float *dst, int64_t dst_stride, const float *src,
                       int64_t src_stride, int n_rows, int width);

#endif
