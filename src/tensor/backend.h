/* The backend seam: the op table every backend fills (cpu/, cuda/), and the plain views its
 * kernels read. model/ runs a forward step only through this table; it never calls cpu_* or
 * CUDA directly, and kernels never see kv/ or an architecture.
 *
 * DESIGN
 * - A `struct backend` is one device (the CPU, or one GPU). It owns its buffers, its per-weight
 *   data and its threads or streams. Pointers called "device" below are addresses in the
 *   backend's memory: host memory on the CPU (host_visible = 1), GPU memory on CUDA. Only
 *   buf_upload / buf_download / buf_copy move bytes between host and device; model/ never
 *   dereferences a device pointer.
 * - Activations are f32, contiguous, row-major ([n_tokens, dim]); accumulation is in f32 on
 *   every backend. Token ids, positions, slots, sequence offsets and block tables are int32
 *   device arrays that the caller uploads once per step.
 * - Weights are `struct tensor` (tensor.h): `data`/`scales`/`biases` point at the checkpoint's
 *   bytes in host memory (mmap). weight_prepare makes a weight usable by this backend: the CPU
 *   packs MLX q4/q8 for its VNNI kernel, CUDA uploads (and may repack) it to device memory. The
 *   result hangs off `tensor.be_data`, opaque to everyone but the backend that set it.
 * - Ops are issued in order on the backend's one queue (the CPU runs each op to completion on
 *   its pool; CUDA enqueues on its stream). step_begin / step_end bracket one forward step:
 *   step_end waits for the step's work and returns the first error any op hit (asynchronous
 *   device errors surface there). Ops themselves return nothing: invalid arguments are
 *   programmer errors (CAIRN_ASSERT); device failures are latched and reported by step_end or
 *   sync. A latched error fails the step, never the process.
 * - Memory: every buffer is accounted (base/mem.h) under the tag the caller names; a backend
 *   with its own memory (a GPU) also counts it on its own budget (backend_mem_stats).
 *
 * - Fused ops: the entries under "optional fused ops" may be NULL. Each is defined as a
 *   sequence of the plain ops (results equal to it within rounding); forward.c issues the fused
 *   op when the backend has it and the plain sequence otherwise, so a backend adds one only
 *   where it pays (the GPU, whose decode step is otherwise a long chain of tiny kernels).
 *
 * Threading: one backend may be used by several models (one scheduler thread each). A backend
 * serializes steps itself: step_begin takes the backend's lock, step_end releases it; buffer and
 * weight calls may run on any thread, outside a step. */
#ifndef CAIRN_TENSOR_BACKEND_H
#define CAIRN_TENSOR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "base/status.h"
#include "tensor/tensor.h"

enum backend_kind {
    BACKEND_CPU = 0,
    BACKEND_CUDA,
};

struct backend_ops;

struct backend {
    const struct backend_ops *ops;
    enum backend_kind kind;
    char name[32];        /* "cpu", "cuda:0" */
    int host_visible;     /* device pointers are host pointers (the CPU) */
    void *impl;           /* backend-private */
    double step_timeout_s; /* bound of every wait on the device (step_end, sync); 0 = the
                            * default BACKEND_STEP_TIMEOUT_S. A wait that passes it fails with
                            * CAIRN_ERR_DEVICE, as does a sticky device error; a backend whose
                            * device timed out refuses later steps (CUDA: the context is not
                            * reused). Set once, before steps run (cairn serve --step-timeout). */
    int tp_rank, tp_world; /* tensor-parallel group membership (0, 0: none), set when the
                              backend joins one (cpu_backend_tp_join, cuda_tp_init) */
    int exact_rows;        /* steps of at most this many token rows give every row the same
                            * bits it would get alone or in any other such step (the GPU's
                            * small-batch matmuls, tensor-core or GEMV, and split-K attention
                            * limit: 16 or 8, cuda_backend.c); 0: any step (the CPU). The
                            * speculative planner keeps drafts inside it, so greedy output is
                            * the same with and without speculation. */
    int sample_top_k;      /* the sample op takes rows with top_k in 1..sample_top_k (and any
                            * top_p over those k); 0: no top-k rows (they are sampled on the
                            * host). At most BACKEND_SAMPLE_MAX_TOP_K. */
};

#define BACKEND_STEP_TIMEOUT_S 30.0
static inline double backend_step_timeout(const struct backend *be)
{
    return be && be->step_timeout_s > 0 ? be->step_timeout_s : BACKEND_STEP_TIMEOUT_S;
}
/* Test hook, inert unless env CAIRN_TEST_STALL_MS is set: the first step (per process) of a model
 * whose model_type is CAIRN_TEST_STALL_ARCH (any model when unset) stands for a device that does
 * not finish: it waits min(stall, the backend's step timeout) and, when the stall is not shorter
 * than the timeout, fails with CAIRN_ERR_DEVICE as a bounded wait on a GPU does. model/forward.c
 * calls it after step_end (the backend's lock is free: other models keep stepping).
 * CAIRN_TEST_STEP_DELAY_MS (inert unless set) adds that delay to every step: a slow device, so a
 * test's stream reliably outlasts the checks made while it runs (tests/integration/pool.sh). */
int backend_test_stall(const struct backend *be, const char *model_type, struct cairn_err *err);

/* Paged KV, as kernels see it. K and V are each laid out
 *   [n_blocks][n_layers][block_size][n_kv_heads][head_dim] of `dtype`,
 * so element (block b, layer l, slot t, head h, dim d) of K is at byte
 *   b * block_bytes + l * layer_block_bytes + ((t * n_kv_heads + h) * head_dim + d) * dtype_size
 * from `k`. A token at absolute position p of a sequence with block table bt lives in block
 * bt[p / block_size], slot p % block_size; its global slot is bt[p / block_size] * block_size +
 * p % block_size. */
struct backend_kv_view {
    void *k;                  /* device */
    void *v;                  /* device */
    int n_blocks;
    int n_layers;
    int block_size;
    int n_kv_heads;
    int head_dim;
    enum dtype dtype;         /* DTYPE_BF16 or DTYPE_F32 */
    size_t layer_block_bytes; /* block_size * n_kv_heads * head_dim * dtype_size */
    size_t block_bytes;       /* n_layers * layer_block_bytes */
};

/* Causal attention over paged KV for the sequences of one step. Query row r of sequence s
 * (rows [seq_off[s], seq_off[s+1]) of q) at absolute position pos[r] attends to that sequence's
 * positions [0, pos[r]], which kv_store has written. GQA: query head h reads KV head
 * h / (n_heads / kv->n_kv_heads). Softmax in f32. The *_host arrays are host copies of the
 * same metadata, for launch planning (split-K, tile counts) without a device round trip. */
struct backend_attn {
    const float *q;               /* device [n_tokens, n_heads, head_dim] */
    float *out;                   /* device [n_tokens, n_heads, head_dim] */
    int n_tokens;
    int n_seqs;
    int n_heads;
    const int32_t *pos;           /* device [n_tokens] */
    const int32_t *seq_off;       /* device [n_seqs + 1] */
    const int32_t *block_tables;  /* device [n_seqs][bt_stride] */
    int bt_stride;                /* entries per sequence row of block_tables */
    const int32_t *seq_off_host;  /* host [n_seqs + 1] */
    const int32_t *ctx_len_host;  /* host [n_seqs]: last position + 1 of each sequence */
    const struct backend_kv_view *kv;
    int layer;
    float scale;                  /* usually 1/sqrt(head_dim) */
};

/* Gated DeltaNet over the n tokens of ONE sequence (qwen3_next, qwen3_5): causal depthwise conv
 * with a rolling state, then the gated delta rule, then the gated RMSNorm, as model/gdn.h
 * describes. Dimensions and weights are plain numbers and device vectors: kernels know no
 * architecture. */
struct backend_gdn {
    int n_k_heads, n_v_heads;
    int head_k_dim, head_v_dim;
    int conv_kernel;
    float eps;
    const float *conv_w;          /* device [conv_dim, conv_kernel] */
    const float *a_log;           /* device [n_v_heads] */
    const float *dt_bias;         /* device [n_v_heads] */
    const float *norm_w;          /* device [head_v_dim] */
    void *state;                  /* device: conv state then delta state (gdn_state_floats),
                                   * the sequence's recurrent state (kv/kv_state.h), read and
                                   * written in place */
    float *qkv;                   /* device [n, conv_dim], convolved in place */
    const float *z;               /* device [n, n_v_heads * head_v_dim] */
    const float *b;               /* device [n, n_v_heads] */
    const float *a;               /* device [n, n_v_heads] */
    int n;
    float *out;                   /* device [n, n_v_heads * head_v_dim] */
};

/* Routed experts of a mixture-of-experts FFN over n tokens: out[t] = sum_k w[t,k] *
 * expert_{ids[t,k]}(x[t]) with expert(x) = down(silu(gate(x)) * up(x)). The backend groups
 * tokens by expert (the CPU gathers rows; a GPU runs a grouped GEMM). */
struct backend_moe {
    const float *x;               /* device [n, hidden] */
    float *out;                   /* device [n, hidden], overwritten */
    int n;
    int hidden;
    int inter;
    int n_experts;
    int top_k;
    const int32_t *ids;           /* device [n, top_k] from moe_route */
    const float *w;               /* device [n, top_k] */
    const struct tensor *gate;    /* [n_experts] weights [inter, hidden], prepared */
    const struct tensor *up;      /* [n_experts] [inter, hidden] */
    const struct tensor *down;    /* [n_experts] [hidden, inter] */
    float *scratch;               /* device, backend_moe_scratch_floats(...) floats */
};

/* One attention layer's q/k preparation and KV write for the tokens of a step (the optional
 * qk_rope_store op): for each token t, each q head and k head is RMS-normed over head_dim with
 * q_norm / k_norm (each may be NULL: no norm) then rotated (rope), in place; then k and v are
 * stored into the pool at slots[t]. Equal to rmsnorm(q), rmsnorm(k), rope(q), rope(k),
 * kv_store(k, v) with the same arguments. */
struct backend_qk_rope_store {
    float *q;                     /* device [n_tokens, n_heads, head_dim] */
    float *k;                     /* device [n_tokens, n_kv_heads, head_dim] */
    const float *v;               /* device [n_tokens, n_kv_heads, head_dim] */
    const float *q_norm;          /* device [head_dim] or NULL */
    const float *k_norm;          /* device [head_dim] or NULL */
    const int32_t *pos;           /* device [n_tokens] */
    const float *inv_freq;        /* device [rot_dim / 2] */
    const int32_t *slots;         /* device [n_tokens] */
    const struct backend_kv_view *kv;
    int n_tokens;
    int n_heads;
    int rot_dim;
    int layer;
    float eps;
    float w_offset;
};

/* Sampling on the device (the optional sample op): for each row, the logits' edits (the
 * request's penalties and logit_bias, listed by the host in the order they apply, each one
 * float op: engine/sampler.c builds them) then greedy argmax (temperature 0; ties -> lowest id,
 * NaN never wins but at id 0) or, with temperature > 0, the tempered softmax with the min_p floor
 * (relative to the top probability) and one draw: the first id, in id order, whose cumulative
 * (unnormalised, double) mass exceeds u times the total (the scalar fallback: the argmax).
 * With logprobs / top_logprobs, the log-softmax of the edited logits (before temperature) at the
 * chosen id and at the top_logprobs best (ties -> lowest id, trailing -inf dropped but one).
 * top_k > 0 (only where be->sample_top_k admits it): the k best tempered probabilities by
 * (value desc, id asc), then top_p over them in that order (kept up to the first whose
 * cumulative mass reaches top_p times theirs), min_p from the tail, and the draw in that order:
 * the host sampler's sorted path (engine/sampler.c sampler_pick). top-p without top-k and
 * grammar masks are not part of it: the engine samples such rows on the host from downloaded
 * logits. */
#define BACKEND_SAMPLE_MAX_TOP 20
#define BACKEND_SAMPLE_MAX_TOP_K 64 /* the most top_k a backend's sample op may take */
enum backend_logit_edit_kind {
    BACKEND_EDIT_REPETITION = 0, /* x = x > 0 ? x / v : x * v */
    BACKEND_EDIT_SUB,            /* x -= v (presence + count * frequency) */
    BACKEND_EDIT_ADD,            /* x += v (logit_bias) */
};
struct backend_logit_edit {
    int32_t id;
    int32_t kind;                 /* enum backend_logit_edit_kind */
    float v;
};
struct backend_sample_row {
    int row;                      /* row of the logits */
    float temperature;            /* 0: greedy */
    float min_p;                  /* 0: off */
    int logprobs;
    int top_logprobs;             /* 0..BACKEND_SAMPLE_MAX_TOP */
    int top_k;                    /* 0: off; else 1..be->sample_top_k (temperature > 0) */
    float top_p;                  /* with top_k: 1 = off */
    double u;                     /* the draw in [0, 1) (temperature > 0) */
    const struct backend_logit_edit *edits; /* host [n_edits], applied in order */
    int n_edits;
};
struct backend_sample_out {
    int32_t id;
    float logprob;                /* when logprobs or top_logprobs */
    int n_top;
    int32_t top_ids[BACKEND_SAMPLE_MAX_TOP];
    float top_logprobs[BACKEND_SAMPLE_MAX_TOP];
};

/* A matmul round with the sub-layer's RMSNorm and/or SwiGLU folded in (the optional
 * matmul_fused op): equal, within rounding, to
 *   norm != NULL:  rmsnorm(h, x, norm, n, in, eps, w_offset), and the matmuls read h;
 *   matmul_multi(w, y, count, x or h, n);
 *   silu_mul:      silu_mul(y[0], y[0], y[1], n * out)  (count == 2: gate and up, equal out)
 * The decode GEMV does the norm while it reads x (decode: no rmsnorm kernel) and writes
 * silu(gate) * up from its epilogue (no silu_mul kernel). x is not written unless h is x; h and,
 * with silu_mul, y[1] hold unspecified values afterwards (scratch). Biases are the caller's: it
 * adds them after, and asks for silu_mul only when gate and up have none. */
struct backend_matmul_fused {
    const struct tensor *const *w; /* count (<= 4) weights of the same input width `in` */
    float *const *y;              /* device [n, out_i] each */
    int count;
    const float *x;               /* device [n, in] */
    int n;
    const float *norm;            /* device [in]: x is rms-normed with this weight first; NULL: not */
    float eps, w_offset;          /* the norm's */
    float *h;                     /* device [n, in] scratch (may be x itself) */
    int silu_mul;                 /* y[0] = silu(y[0]) * y[1] (count == 2) */
};

struct backend_mem_stats {
    uint64_t device_total;        /* bytes of device memory (0 on the CPU: see base/mem.h) */
    uint64_t device_free;
    uint64_t device_used_by_cairn;
};

struct backend_ops {
    /* ---- lifetime ---- */
    void (*destroy)(struct backend *be);
    int (*mem_stats)(struct backend *be, struct backend_mem_stats *out);

    /* ---- buffers (any thread, outside a step) ---- */
    /* Zeroed, 64-byte (CPU) or 256-byte (GPU) aligned, accounted under tag. */
    int (*buf_alloc)(struct backend *be, size_t bytes, enum cairn_mem_tag tag, void **dptr,
                     struct cairn_err *err);
    void (*buf_free)(struct backend *be, void *dptr, size_t bytes, enum cairn_mem_tag tag);
    /* Synchronous copies (they also work inside a step, ordered after the ops issued so far). */
    int (*buf_upload)(struct backend *be, void *dst, const void *src, size_t bytes,
                      struct cairn_err *err);
    int (*buf_download)(struct backend *be, void *dst, const void *src, size_t bytes,
                        struct cairn_err *err);
    int (*buf_copy)(struct backend *be, void *dst, const void *src, size_t bytes,
                    struct cairn_err *err);
    /* Zeroes bytes at dst (synchronous, like the copies): a hybrid sequence's fresh state. */
    int (*buf_zero)(struct backend *be, void *dst, size_t bytes, struct cairn_err *err);
    /* Optional (NULL on the CPU, whose host memory is its device memory): page-lock host memory
     * [ptr, ptr + bytes) so buf_upload / buf_download from or into it run at DMA speed (CUDA:
     * cudaHostRegister; pinned H2D ~36 GB/s against ~6 GB/s pageable on an H200). Costly (~15 ms
     * for 256 MiB): pin large long-lived regions once (kv/tier_slab.h), never per copy. A
     * failure (CAIRN_ERR_*, e.g. a page-lock limit) leaves the memory usable unpinned and the
     * backend healthy. host_unpin undoes one successful host_pin of the same ptr, before the
     * memory is freed and while the backend is open. Any thread. */
    int (*host_pin)(struct backend *be, void *ptr, size_t bytes, struct cairn_err *err);
    void (*host_unpin)(struct backend *be, void *ptr);

    /* ---- weights ---- */
    /* Makes w usable by the ops (sets w->be_data, or leaves it NULL where the host bytes are
     * used in place); *extra_bytes: memory it holds for w (accounted under CAIRN_MEM_WEIGHTS).
     * hint_release: BACKEND_WEIGHT_* bits (below; 0 or 1 keep their first meaning):
     * RELEASE_HOST: the host bytes are pages of a read-only file mapping that are not needed
     * any more once this returns (the CPU then drops the file's pages it has copied; a GPU drops
     * them after upload); never set for heap memory. LOOKUP_ONLY: only `embed` reads w (an
     * untied embedding), never matmul: the CPU leaves it in place unpacked. */
    int (*weight_prepare)(struct backend *be, struct tensor *w, int hint_release,
                          size_t *extra_bytes, struct cairn_err *err);
    /* Frees what weight_prepare set (not for weight_slice_rows views); be_data becomes NULL. */
    void (*weight_release)(struct backend *be, struct tensor *w);
    /* View of rows [row0, row0 + rows) of a prepared 2-D weight (one expert of a stacked
     * [n_experts * out, in] weight), with be_data pointing into w's own. */
    void (*weight_slice_rows)(struct backend *be, const struct tensor *w, int64_t row0,
                              int64_t rows, struct tensor *view);

    /* ---- steps ---- */
    int (*step_begin)(struct backend *be, struct cairn_err *err);
    int (*step_end)(struct backend *be, struct cairn_err *err);
    int (*sync)(struct backend *be, struct cairn_err *err);

    /* ---- ops (inside a step; all pointers device) ---- */
    /* y[n, out] = x[n, in] . W[out, in]^T, W of any dtype (F32, F16, BF16, Q). */
    void (*matmul)(struct backend *be, const struct tensor *w, const float *x, float *y, int n);
    /* y[i] = x . w[i]^T for count (<= 4) weights of the same input width (q/k/v, gate/up). */
    void (*matmul_multi)(struct backend *be, const struct tensor *const *w, float *const *y,
                         int count, const float *x, int n);
    /* out[n, dim] = rows ids[i] of W[vocab, dim] (any dtype). */
    void (*embed)(struct backend *be, const struct tensor *w, const int32_t *ids, int n,
                  float *out);
    /* y[r] = x[r] / rms(x[r]) * (w + w_offset) over n_rows rows of dim; y may alias x; w NULL:
     * no weight. */
    void (*rmsnorm)(struct backend *be, float *y, const float *x, const float *w, int n_rows,
                    int dim, float eps, float w_offset);
    /* Rotate-half RoPE in place on the first rot_dim dims of each head of x [n_tokens, n_heads,
     * head_dim]; pos [n_tokens]; inv_freq [rot_dim / 2] (device). */
    void (*rope)(struct backend *be, float *x, int n_tokens, int n_heads, int head_dim,
                 int rot_dim, const int32_t *pos, const float *inv_freq);
    /* out[i] = silu(gate[i]) * up[i]; out may alias gate or up. */
    void (*silu_mul)(struct backend *be, float *out, const float *gate, const float *up,
                     int64_t n);
    /* y[i] += x[i] */
    void (*add)(struct backend *be, float *y, const float *x, int64_t n);
    /* y[r, i] += b[i] over n_rows rows */
    void (*add_bias)(struct backend *be, float *y, const float *b, int n_rows, int dim);
    /* y[i] *= sigmoid(g[i]) (gated attention output) */
    void (*mul_sigmoid)(struct backend *be, float *y, const float *g, int64_t n);
    /* y[r, i] += sigmoid(g[r]) * x[r, i] (shared-expert gate: g is [n_rows]) */
    void (*add_sigmoid_scaled)(struct backend *be, float *y, const float *x, const float *g,
                               int n_rows, int dim);
    /* Splits rows of src [n_rows][2 * width] into a [n_rows][width] (first halves) and
     * b [n_rows][width] (second halves); a and b must not alias src. */
    void (*split_halves)(struct backend *be, float *a, float *b, const float *src, int n_rows,
                         int width);
    /* dst[i] = src[rows[i]] for n rows of dim floats; rows device [n]. */
    void (*gather_rows)(struct backend *be, float *dst, const float *src, const int32_t *rows,
                        int n, int dim);
    /* Writes k, v [n_tokens, n_kv_heads, head_dim] (f32) of one layer into the pool at global
     * slots[i] (see backend_kv_view), converting to kv->dtype. */
    void (*kv_store)(struct backend *be, const struct backend_kv_view *kv, int layer,
                     const int32_t *slots, int n_tokens, const float *k, const float *v);
    void (*attention)(struct backend *be, const struct backend_attn *a);
    /* Router: logits [n, n_experts] -> softmax -> top_k (ties: lower id) -> ids, w (renormalised
     * to sum 1 when norm_topk). */
    void (*moe_route)(struct backend *be, const float *logits, int n, int n_experts, int top_k,
                      int norm_topk, int32_t *ids, float *w);
    void (*moe_experts)(struct backend *be, const struct backend_moe *m);
    void (*gdn)(struct backend *be, const struct backend_gdn *g);
    /* dst[r * dst_stride + i] = src[r * src_stride + i] for r < n_rows, i < width (strides in
     * floats): a strided row copy (qwen3_next's interleaved qkvz/ba unpacked per key head). The
     * rows must not overlap. */
    void (*copy_rows)(struct backend *be, float *dst, int64_t dst_stride, const float *src,
                      int64_t src_stride, int n_rows, int width);

    /* ---- optional fused ops (may be NULL; see DESIGN) ---- */
    /* y[n, out] += x[n, in] . W^T: matmul into a temporary, then add (the residual adds after
     * o_proj and down_proj). */
    void (*matmul_add)(struct backend *be, const struct tensor *w, const float *x, float *y, int n);
    /* struct backend_qk_rope_store above. */
    void (*qk_rope_store)(struct backend *be, const struct backend_qk_rope_store *r);
    /* struct backend_sample_row above: samples n rows of logits [*, vocab] (device; the rows'
     * logits are edited in place) and writes out[n] (host). Synchronous, like buf_download
     * (ordered after the ops issued so far; usable inside a step); only the ids (and logprobs)
     * cross to the host. NULL on the CPU, whose engine samples the logits in place. */
    int (*sample)(struct backend *be, float *logits, int vocab, const struct backend_sample_row *rows, int n,
                  struct backend_sample_out *out, struct cairn_err *err);
    /* struct backend_matmul_fused above. */
    void (*matmul_fused)(struct backend *be, const struct backend_matmul_fused *f);
    /* ---- tensor parallel (optional: NULL when the backend cannot join a group) ---- */
    /* buf[n] (f32) = the sum of buf over every rank of the backend's group (tp_world ranks), in
     * place, ordered after the ops issued so far; every rank gets the same bits. Each rank calls
     * it in the same order with the same n (the row-parallel partial sums of model/shard.h).
     * Outside a group (tp_world <= 1) it does nothing. Failures (a rank that never comes, a
     * communicator error) are latched and reported by step_end. CPU: the in-process sum of
     * simulated ranks (cpu/cpu_tp.c); CUDA: ncclAllReduce on the rank's stream. */
    void (*allreduce)(struct backend *be, float *buf, int64_t n);
};

/* weight_prepare's hint_release bits. */
#define BACKEND_WEIGHT_RELEASE_HOST 1
#define BACKEND_WEIGHT_LOOKUP_ONLY 2

/* Scratch floats moe_experts needs for up to n tokens (the same on every backend). */
size_t backend_moe_scratch_floats(int n, int hidden, int inter, int top_k);

/* Opens a backend by name: "cpu", "cuda" (= "cuda:0"), "cuda:N", or "auto" (the first GPU when
 * one is usable, else the CPU). n_threads: CPU compute threads (<= 0: one per core). A name this
 * build or machine cannot serve fails with CAIRN_ERR_UNSUPPORTED and says why (no CUDA in this
 * build, no driver, no device). Caller frees with backend_close. */
int backend_open(const char *name, int n_threads, struct backend **out, struct cairn_err *err);
void backend_close(struct backend *be);
/* Whether this build has the CUDA backend compiled in. */
int backend_cuda_compiled(void);

/* A tensor-parallel group (issue 23, model/shard.h): `world` backends, rank r = bes[r], whose
 * allreduce op sums over the group. device "cuda" (or "auto" with a GPU): GPUs 0..world-1 with
 * NCCL communicators (cuda_tp_init: bounded start-up, NVLink multicast off); more ranks than
 * visible GPUs fail with CAIRN_ERR_INVALID saying how many there are. device "cpu": simulated
 * ranks (cpu/cpu_tp.c) sharing the one CPU pool, for checking the sharding math; no speed-up.
 * Each rank's steps must run on its own thread. Close with backend_tp_close (closes the
 * backends). */
#define BACKEND_TP_MAX 16
struct backend_tp {
    int world;
    enum backend_kind kind;
    struct backend *bes[BACKEND_TP_MAX];
    void *group; /* cpu_tp_group or cuda_tp */
};
int backend_tp_open(const char *device, int world, struct backend_tp **out, struct cairn_err *err);
void backend_tp_close(struct backend_tp *tp);

#endif
