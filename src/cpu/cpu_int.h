/* Internal to cpu/: the per-ISA kernel table, the thread pool and per-thread scratch.
 *
 * DESIGN: cpu.c owns the public ops. Each op picks the active kernel table (scalar reference,
 * AVX2, AVX-512), sizes the per-thread scratch on the calling thread (grow-only, so steady-state
 * calls allocate nothing) and fans the work out with cpu_pool_run: matmuls split by output rows,
 * attention by (KV head, query block) or, for decode, (token, KV head) or (token, context split)
 * (cpu_attn.c), element-wise
 * ops by contiguous chunks. Kernels only see index
 * ranges and the scratch they were handed. */
#ifndef CAIRN_CPU_CPU_INT_H
#define CAIRN_CPU_CPU_INT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu.h"

/* One matmul call as the kernels see it: y[n, out] = x[n, in] · W[out, in]^T. */
struct cpu_mm {
    const struct tensor *w;
    const float *x;  /* [n, in] */
    const float *xp; /* DTYPE_Q bits 4: x with each 32-chunk de-interleaved (16 even, 16 odd
                        inputs) so the low/high nibbles of 16 packed bytes meet their inputs in
                        order; NULL otherwise */
    float *y;        /* [n, out] */
    int n;
    int64_t in, out;
    /* VNNI path for packed MLX q4/q8 (see CPU_VNNI_* below), else NULL: x as three int8
     * digits per input with scale xd = max|x|/127 per (token, group), and each group's f32 sum. */
    const int8_t *xq;  /* [n, in / 8, 3, 8] */
    const float *xd;   /* [n, in / group_size] */
    const float *xsum; /* [n, in / group_size] */
    int digits;        /* digits the VNNI tiles use: 3, or 1 (CAIRN_CPU_QACT=fast, cpu_vnni_digits) */
};

/* Decode streams every weight once from memory. Weights sit in 4 KiB pages of an mmap'd file,
 * where the hardware prefetcher stops at each page, so the tiles prefetch whole tiles about
 * 8 KiB ahead. One small tile ahead (2 KiB for q4 rows of 1024 inputs) came too late to hide
 * DRAM latency on a 2-core Zen 5 VM (q4 lm_head 13% slower); 32 KiB ahead made bf16 slower. */
static inline int64_t cpu_prefetch_ahead(int64_t tile_bytes)
{
    int64_t tiles = tile_bytes > 0 ? 8192 / tile_bytes : 1;
    return (tiles > 1 ? tiles : 1) * tile_bytes;
}

struct cpu_kernels {
    /* Rows [r0, r1) of mm->y for all n tokens. row_buf: mm->in floats of per-thread scratch. */
    void (*matmul)(const struct cpu_mm *mm, int64_t r0, int64_t r1, float *row_buf);
    void (*rmsnorm)(float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                    float w_offset);
    void (*rope)(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim,
                 const int32_t *pos, const float *inv_freq);
    void (*silu_mul)(float *out, const float *gate, const float *up, int64_t n);
    void (*add)(float *y, const float *x, int64_t n);
    /* Query token t, the query heads that share KV head kvh. scratch: cpu_attn_scratch_floats. */
    void (*attn)(const struct cpu_attn *a, int t, int kvh, float *scratch);
    /* Tiled prefill attention: query tokens [t0, t1) × the query heads of KV head kvh, against
     * the context in tiles of CPU_ATTN_TK positions (x86_simd_attn.h). scratch:
     * cpu_attn_tile_scratch_floats(a, t1 - t0). attn_rows: the query rows (tokens × group) one
     * item is sized for (cpu_attn.c). attn_tile_auto: whether CAIRN_CPU_ATTN=auto takes the tiled
     * kernel on this ISA (0 where it has not yet been run on such a CPU: tiled only when asked). */
    void (*attn_tile)(const struct cpu_attn *a, int kvh, int t0, int t1, float *scratch);
    int attn_rows, attn_tile_auto;
    /* Split decode attention: query token t, all heads, context positions [c0, c1); the
     * unnormalized state acc [n_heads][head_dim], m, l [n_heads] (cpu_attn.c combines the splits).
     * scratch: cpu_attn_split_scratch_floats. NULL in the scalar table (it runs rowwise). */
    void (*attn_split)(const struct cpu_attn *a, int t, int c0, int c1, float *acc, float *m, float *l,
                       float *scratch);
    /* Probes for `cairn bench`: sum of n floats (read bandwidth); a = b + s*c (triad);
     * iters rounds of CPU_PROBE_FMA_CHAINS independent vector FMAs (returns a value so the
     * work is kept; *lanes gets the vector width). */
    float (*probe_sum)(const float *x, int64_t n);
    void (*probe_triad)(float *a, const float *b, const float *c, float s, int64_t n);
    float (*probe_fma)(int64_t iters, int *lanes);
};

/* The VNNI q4/q8 path (x86_avx512_vnni.c says how and why). Weights: blocks of CPU_VNNI_ROWS
 * rows, one int32 lane each of a 512-bit vector (cpu_pack.c). Activations: three int8 digits
 * per input, x = d·(x0 + x1/RADIX + x2/RADIX²), a token's digits in steps of 8 inputs
 * (CPU_VNNI_STEP_BYTES: 8 bytes of each digit in turn), so that a tile reads one stream per
 * token (one per token and digit ran inputs of 8192 at half speed). */
#define CPU_VNNI_ROWS 16
#define CPU_VNNI_DIGITS 3
#define CPU_VNNI_RADIX 254.0f
#define CPU_VNNI_STEP_BYTES (8 * CPU_VNNI_DIGITS)
/* Fills xq/xd/xsum of mm for tokens [t0, t1) (mm->x, w, in set). AVX2 code (x86_avx2_vnni.c):
 * it serves both widths, and is about 1% of a prefill. */
void cpu_vnni_prep(struct cpu_mm *mm, int t0, int t1);
/* Rows [r0, r1) of mm->w->be_data (the packed copy), r0 a multiple of 16: AVX-512 VNNI (vpdpbusd) and AVX-VNNI
 * (its 256-bit VEX form, under the AVX2 kernels). */
void cpu_avx512_vnni_matmul(const struct cpu_mm *mm, int64_t r0, int64_t r1);
void cpu_avx2_vnni_matmul(const struct cpu_mm *mm, int64_t r0, int64_t r1);

#define CPU_PROBE_FMA_CHAINS 12

/* Floats of scratch one attention work item needs. */
static inline size_t cpu_attn_scratch_floats(const struct cpu_attn *a)
{
    int group = a->n_heads / a->kv->n_kv_heads;
    return (size_t)group * ((size_t)a->kv->head_dim + (size_t)a->kv->block_size + 2) + 64;
}

/* Positions per softmax tile of the split kernel, whatever the block size: the online-softmax
 * rescale of every head costs about as much as 16 positions of its dot products. */
#define CPU_ATTN_SPLIT_TP 64

/* Floats of scratch one split item needs: scores [n_heads][CPU_ATTN_SPLIT_TP], then Q of the
 * token in the bf16 path's order [n_heads][head_dim]. */
static inline size_t cpu_attn_split_scratch_floats(const struct cpu_attn *a)
{
    return (size_t)a->n_heads * (CPU_ATTN_SPLIT_TP + (size_t)a->kv->head_dim) + 64;
}

/* Positions per K/V tile of the tiled kernel: a tile (K and V widened to f32, 64 KiB at head_dim
 * 128) plus Q^T and O of 32 rows stays in L2 and amortizes each O rescale over 64 positions. */
#define CPU_ATTN_TK 64

/* Floats of scratch one tiled work item of nq query tokens needs (x86_simd_attn.h's layout,
 * with rows and head_dim rounded up to 16 lanes, the widest ISA). */
static inline size_t cpu_attn_tile_scratch_floats(const struct cpu_attn *a, int nq)
{
    size_t group = (size_t)(a->n_heads / a->kv->n_kv_heads), hd = (size_t)a->kv->head_dim;
    size_t rows = ((size_t)nq * group + 15) / 16 * 16, hdp = (hd + 15) / 16 * 16;
    return hd * rows + rows * hdp + CPU_ATTN_TK * (rows + hd + hdp) + 4 * rows + 64;
}

/* The active kernel table (cpu.c; cpu_kernels_ref before cpu_init). */
const struct cpu_kernels *cpu_kernels_active(void);

extern const struct cpu_kernels cpu_kernels_ref;
extern const struct cpu_kernels cpu_avx2_kernels;
extern const struct cpu_kernels cpu_avx512_kernels;

/* The pool (cpu_pool.c). Workers sleep on a futex between rounds after a short spin. The caller
 * runs ith = 0 itself. Not reentrant: a call from inside a round runs fn(ctx, 0, 1) inline. */
int cpu_pool_start(int n_threads);
void cpu_pool_stop(void);
int cpu_pool_size(void);
void cpu_pool_run(void (*fn)(void *ctx, int ith, int nth), void *ctx, int nth);

/* Per-thread scratch of at least `floats` floats for thread ith, 64-byte aligned. Call
 * cpu_scratch_reserve on the calling thread (outside a round) before a round uses it. */
void cpu_scratch_reserve(size_t floats);
float *cpu_scratch(int ith);
/* Shared scratch (prepared activations), grow-only. */
float *cpu_shared_scratch(size_t floats);

/* CAIRN_CPU_PROF=1 (cpu_prof.c): per-op wall time by kind and shape, printed to stderr by
 * cpu_shutdown. cpu_prof_now() is 0 (no clock read) while off; cpu_prof_add records one call of
 * n tokens that started at t0; busy_ns: thread time summed over the nth threads of its round
 * (0: not measured). kind must be a string literal (rows are keyed by its address). */
extern int cpu_prof_on;
void cpu_prof_init(void);
uint64_t cpu_prof_now(void);
void cpu_prof_add(const char *kind, int64_t out, int64_t in, int count, int n, uint64_t t0, uint64_t busy_ns,
                  int nth);
void cpu_prof_report(void);

/* x86 feature bits (cpu.c). */
struct cpu_features {
    int avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512bf16, avx512vnni, avx_vnni;
};
const struct cpu_features *cpu_features_get(void);

#endif
