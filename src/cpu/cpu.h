/* CPU backend: the ops the forward pass calls, on f32 activations.
 *
 * Every op here has a readable scalar reference (cpu/ref_*.c). SIMD variants (x86_avx2_*.c,
 * x86_avx512_*.c) are picked at start by cpuid/xgetbv (CAIRN_CPU_ISA=scalar|avx2|avx512 forces
 * one) and the work is split over a persistent thread pool. Callers see only these functions.
 *
 * Threading: the pool and its scratch serve one caller at a time. A thread that runs ops while
 * another may too holds cpu_lock around them: the CPU backend (cpu_backend.c) takes it in
 * step_begin and releases it in step_end, so loaded models (one scheduler thread each) take
 * turns per step; cpu_pack takes it itself (a model may be loaded while another one runs). Ops
 * fan out to the pool internally. cpu_init must be called once first (ops work without it,
 * single-threaded with the scalar reference).
 *
 * Environment: CAIRN_CPU_ISA=scalar|avx2|avx512 forces the kernels; CAIRN_CPU_VNNI=0 turns the
 * VNNI q4/q8 path off (on by default where the CPU has AVX-512 VNNI, or AVX-VNNI under the
 * AVX2 kernels: weights packed at load);
 * CAIRN_CPU_ATTN=auto|rowwise|tiled|split|legacy picks the attention kernel (cpu_attn_mode below);
 * CAIRN_CPU_SPIN=N sets how many pause iterations pool threads spin before sleeping on a futex
 * (default 1000; lower it when the machine is oversubscribed); CAIRN_CPU_PROF=1 prints each op's
 * wall time by kind and shape to stderr when the pool stops (cpu_prof.c).
 *
 * Numerics: every variant widens weights to f32 exactly and accumulates in f32, so all ISAs
 * agree with the double-precision reference to ~1e-5 relative; tests/unit/test_cpu_ops.c states
 * the tolerances. The VNNI path splits activations into three int8 digits (2^-24 of the group's
 * max) and sums integers, to the same tolerances (x86_avx512_vnni.c).
 *
 * Weights: used in place (mmap'd, MLX layout), except that MLX q4/q8 linears get a packed copy
 * at load when the VNNI path is active (cpu_pack_bytes / cpu_pack), hung off tensor.be_data
 * (the CPU backend's weight_prepare owns it).
 *
 * KV: kernels read the paged pool through tensor/backend.h's backend_kv_view, never kv/.
 *
 * cpu_backend_open (cpu_backend.c) wraps all of this as a `struct backend` (tensor/backend.h);
 * other rooms use that. Direct cpu_* calls are for cpu/ itself, its tests and `cairn bench`'s
 * CPU probes. */
#ifndef CAIRN_CPU_CPU_H
#define CAIRN_CPU_CPU_H

#include <stdint.h>

#include "base/status.h"
#include "tensor/backend.h"
#include "tensor/tensor.h"

enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2,   /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512, /* AVX-512 F/BW/VL/DQ (+BF16/VNNI where present) */
    CPU_ISA_N,
};

/* Starts the pool (n_threads <= 0: one per core) and picks the ISA (best supported, or
 * CAIRN_CPU_ISA). Calling it again resizes the pool. */
int cpu_init(int n_threads, struct cairn_err *err);
/* The process-wide lock of the pool (see Threading above); not recursive. */
void cpu_lock(void);
void cpu_unlock(void);
void cpu_shutdown(void);
int cpu_n_threads(void);
enum cpu_isa cpu_isa_get(void);
/* Forces an ISA (tests, bench). Fails with CAIRN_ERR_UNSUPPORTED if the CPU lacks it. */
int cpu_isa_set(enum cpu_isa isa);
int cpu_isa_supported(enum cpu_isa isa);
const char *cpu_isa_name(enum cpu_isa isa);
/* Parses "scalar|avx2|avx512"; -1 if unknown. */
int cpu_isa_parse(const char *s);

/* y[n, out] = x[n, in] · W[out, in]^T for W of any dtype (F32, F16, BF16, Q). */
void cpu_matmul(const struct tensor *w, const float *x, float *y, int n);
/* y[i] = x · w[i]^T for `count` weights that read the same x: one round over all their rows, and
 * one activation prep, which is what decode pays most for (q/k/v, gate/up). Weights of different
 * input width or quantization are run one by one. */
void cpu_matmul_multi(const struct tensor *const *w, float *const *y, int count, const float *x, int n);
/* Bytes of w's packed copy for the kernels active now, or 0 if w is not packed (not MLX q4/q8
 * with group size % 32 == 0, or the VNNI path is off). cpu_pack fills dst (that many bytes,
 * 64-byte aligned) from w; the caller sets w->be_data = dst. cpu_packed_rows: the packed copy of
 * rows [row0, ...) of w, for a row slice of it (NULL unless w is packed and row0 % 16 == 0). */
size_t cpu_pack_bytes(const struct tensor *w);
void cpu_pack(const struct tensor *w, void *dst);
void *cpu_packed_rows(const struct tensor *w, int64_t row0);
/* Whether the packed VNNI q4/q8 path runs now (AVX-512 active with AVX-512 VNNI, or AVX2 active
 * with AVX-VNNI; CAIRN_CPU_VNNI not 0). */
int cpu_vnni_active(void);
/* Digits of each activation the VNNI tiles multiply: 3 by default; 1 with
 * CAIRN_CPU_QACT=fast (opt-in, read with CAIRN_CPU_VNNI, again at cpu_isa_set): the first digit
 * alone is x rounded to d·round(x/d), |error| <= d/2 = max|x|/254 of the group (about 2^-8,
 * the activations of llama.cpp's Q8 dot products), for a third of the integer work. */
int cpu_vnni_digits(void);
/* out[n, dim] = rows ids[i] of W[vocab, dim] (any dtype). */
void cpu_embed(const struct tensor *w, const int32_t *ids, int n, float *out);
/* y[r] = x[r] / rms(x[r]) * (w + w_offset) over n_rows rows of dim; y may alias x.
 * w_offset is 1 for zero-centred norms (qwen3_next/qwen3_5), else 0. w NULL: no weight. */
void cpu_rmsnorm(float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                 float w_offset);
/* Rotary embedding, rotate-half (GPT-NeoX / HF) style, in place on the first rot_dim dims of
 * each head: x: [n_tokens, n_heads, head_dim]; inv_freq: [rot_dim/2]; pos: [n_tokens]. */
void cpu_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim,
              const int32_t *pos, const float *inv_freq);
/* out[i] = silu(gate[i]) * up[i]; out may alias gate or up. */
void cpu_silu_mul(float *out, const float *gate, const float *up, int64_t n);
/* y[i] += x[i] */
void cpu_add(float *y, const float *x, int64_t n);
/* y[r, i] += b[i] over n_rows rows (bias add) */
void cpu_add_bias(float *y, const float *b, int n_rows, int dim);

/* Stores k, v: [n_tokens, n_kv_heads, head_dim] of one layer at global slots[] (block
 * slots[i] / block_size, slot slots[i] % block_size; see backend_kv_view). */
void cpu_kv_store(const struct backend_kv_view *kv, int layer, const int32_t *slots, int n_tokens,
                  const float *k, const float *v);
/* K or V of (block, layer) in the view: [block_size][n_kv_heads][head_dim]. */
static inline void *cpu_kv_k(const struct backend_kv_view *kv, int block, int layer)
{
    return (uint8_t *)kv->k + (size_t)block * kv->block_bytes + (size_t)layer * kv->layer_block_bytes;
}
static inline void *cpu_kv_v(const struct backend_kv_view *kv, int block, int layer)
{
    return (uint8_t *)kv->v + (size_t)block * kv->block_bytes + (size_t)layer * kv->layer_block_bytes;
}

/* Causal attention of one sequence over paged KV. Query token i at absolute position pos[i]
 * attends to KV positions [0, pos[i]] (already stored with cpu_kv_store). GQA: query head h
 * uses KV head h / (n_heads / n_kv_heads). Online softmax in f32. Positions rise along the
 * tokens (a prefill chunk after its cached prefix, or decode tokens); the work is split by
 * (KV head, block of queries), costliest blocks first, so both cores stay busy at any chunk
 * size and a chunk pays only for its own queries × context; a decode token over a long
 * context by fixed splits of the context (cpu_attn.c). */
struct cpu_attn {
    const float *q;              /* [n_tokens, n_heads, head_dim] */
    float *out;                  /* [n_tokens, n_heads, head_dim] */
    int n_tokens;
    int n_heads;
    const int32_t *pos;          /* [n_tokens] */
    const struct backend_kv_view *kv;
    int layer;
    const int32_t *block_table;  /* this sequence's row of the block tables */
    float scale;                 /* usually 1/sqrt(head_dim) */
};
void cpu_attention(const struct cpu_attn *a);

/* Which kernel cpu_attention runs (CAIRN_CPU_ATTN=auto|rowwise|tiled|split|legacy, read by
 * cpu_init; set directly by tests and benchmarks). auto (the default): the split kernel for one
 * decode token over a long context (flash-decoding: the context split over the threads;
 * cpu_attn.c says from what length), else the tiled kernel when the sequence brings at least 4
 * query rows (tokens × group: prefill chunks, speculative drafts), else the rowwise one.
 * rowwise, tiled and split force one, for A/B comparisons and tests (split runs rowwise under
 * the scalar kernels); legacy is auto without the split kernel (the choice before it, for A/B). */
enum cpu_attn_mode {
    CPU_ATTN_AUTO = 0,
    CPU_ATTN_ROWWISE,
    CPU_ATTN_TILED,
    CPU_ATTN_SPLIT,
    CPU_ATTN_LEGACY,
    CPU_ATTN_N,
};
void cpu_attn_mode_set(enum cpu_attn_mode mode);
enum cpu_attn_mode cpu_attn_mode_get(void);
const char *cpu_attn_mode_name(enum cpu_attn_mode mode);
/* Parses "auto|rowwise|tiled|split|legacy"; -1 if unknown. */
int cpu_attn_mode_parse(const char *s);
/* Wall time spent in cpu_attention, for `cairn bench`'s share of prefill in attention. Off by
 * default (no clock reads); while on, every call adds its time. Process-wide. */
void cpu_attn_timer_enable(int on);
void cpu_attn_timer_reset(void);
double cpu_attn_timer_seconds(void);

/* Machine probes for `cairn bench`, run on the pool with the active ISA; best of `reps`.
 * read: every thread sums its slice of a `bytes` buffer (bytes/s read); triad: a = b + s*c over
 * three arrays of bytes/3 each (STREAM counting: 3 arrays moved, write-allocate not counted);
 * fma: every thread runs independent vector FMA chains (2 flops per lane per FMA). */
struct cpu_probe {
    double read_gbs;
    double triad_gbs;
    double fma_gflops;
    int n_threads;
};
int cpu_probe_run(size_t bytes, int reps, struct cpu_probe *out, struct cairn_err *err);
/* Read bandwidth right now (GB/s, best of 3 passes over a `bytes` buffer kept between calls),
 * for benchmarks on a shared machine: measure next to each timed run. 0 if out of memory.
 * cpu_probe_release frees the buffer. */
double cpu_probe_read_now(size_t bytes);
void cpu_probe_release(void);

/* Mixture-of-experts and Gated DeltaNet ops of the CPU backend (cpu_moe.c, cpu_gdn.c): the
 * semantics of moe_route, moe_experts and gdn in tensor/backend.h. */
void cpu_moe_route(const float *logits, int n, int n_experts, int top_k, int norm_topk, int32_t *ids,
                   float *w);
void cpu_moe_experts(const struct backend_moe *m);
void cpu_gdn(const struct backend_gdn *g);

/* The CPU backend (cpu_backend.c): the op table of tensor/backend.h over this room. The first
 * open starts the pool (cpu_init(n_threads)); later ones share it; the last backend_close stops
 * it. Prefer backend_open("cpu", ...). */
int cpu_backend_open(int n_threads, struct backend **out, struct cairn_err *err);

/* Simulated tensor-parallel ranks (cpu_tp.c): a group of `world` ranks whose backends (one
 * cpu_backend_open each, one thread each) sum their row-parallel partials in host memory
 * through the seam's allreduce. The group outlives its backends; free it after closing them. */
struct cpu_tp_group;
int cpu_tp_group_create(int world, struct cpu_tp_group **out, struct cairn_err *err);
void cpu_tp_group_free(struct cpu_tp_group *g);
/* Makes backend be (not yet in a group) rank `rank` of g: sets be->tp_rank / tp_world. */
int cpu_backend_tp_join(struct backend *be, struct cpu_tp_group *g, int rank, struct cairn_err *err);
/* The backend op (backend_ops.allreduce) and step_end's check for its latched error. */
void cpu_tp_allreduce(struct backend *be, float *buf, int64_t n);
int cpu_tp_take_error(struct backend *be, struct cairn_err *err);

/* Runs fn(ctx, ith, nth) for ith in [0, nth) on the pool and waits (nth = cpu_n_threads()). */
void cpu_parallel(void (*fn)(void *ctx, int ith, int nth), void *ctx);

#endif
