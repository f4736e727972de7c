/* cpu_attention: which attention kernel runs and how its work is split over the pool.
 *
 * DESIGN
 * - Prefill (a sequence bringing at least CPU_ATTN_TILED_MIN_ROWS query rows, tokens × group): work
 *   items are (KV head, block of nq query tokens), nq = attn_rows / group (32 rows: 16
 *   queries of Qwen3's group of 2, 8 of Llama's 4). Each item runs the tiled kernel
 *   (attn_tile): it reads the context's K/V once for its nq · group query rows. Items are
 *   handed out through an atomic counter, costliest (the last query block: longest causal
 *   context) first, so two threads stay busy whether the chunk is 16 tokens or 16K, and
 *   whatever the cached prefix.
 * - Decode (fewer rows): items are (token, KV head), strided over the threads; the rowwise
 *   kernel (attn) widens each K row in registers for the few rows there are. Measured with
 *   `cairn bench --attn 16:8:128 -p 512 --chunk C -t 1` (AVX2): tiled/rowwise 0.64x at one
 *   token (Qwen3's 2 rows), 1.2x at 2 tokens (4 rows), 2.2x at 4 and 8.
 * - Long-context decode (one query token, at least CPU_ATTN_SPLIT_MIN_CTX positions): items are
 *   splits of CPU_ATTN_SPLIT_POS positions of the context (flash-decoding), each running the split
 *   kernel (attn_split) over all heads, so K/V rows are read whole and in address order and the
 *   threads share one token's context; a second round combines each head's splits in split
 *   order. The splits are fixed by the context length, not the thread count, so the result
 *   depends on neither the threads nor the batch (each sequence is its own call). auto takes it
 *   from 512 positions, two splits, so that a 2-core pool always has an item per thread (at one
 *   split the rowwise kernel's KV-head items spread wider); from there up to 8K it ran as fast
 *   as the old choice or faster in a decode micro-benchmark (one token, 28 layers of bf16 KV).
 * - CAIRN_CPU_ATTN=rowwise|tiled|split forces one kernel for every call (A/B benchmarks,
 *   tests); legacy is auto without the split kernel (the A/B of long-context decode).
 * - The timer (cpu_attn_timer_*) is for `cairn bench`: one clock read pair per call while on.
 * Results do not depend on the thread count or on which thread ran an item. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/file.h"
#include "cpu/cpu.h"
#include "cpu/cpu_int.h"

/* auto: the tiled kernel from this many query rows (tokens × group) of one sequence */
#define CPU_ATTN_TILED_MIN_ROWS 4
/* Positions per split of the split kernel (a multiple of the block sizes in use, 16 and 64),
 * and the context from which auto takes it for a decode token. */
#define CPU_ATTN_SPLIT_POS 256
#define CPU_ATTN_SPLIT_MIN_CTX 512

static _Atomic int cpu_attn_mode_cur = CPU_ATTN_AUTO;
static _Atomic int cpu_attn_timing;
static _Atomic uint64_t cpu_attn_ns;

void cpu_attn_mode_set(enum cpu_attn_mode mode)
{
    if ((unsigned)mode < CPU_ATTN_N) atomic_store(&cpu_attn_mode_cur, (int)mode);
}

enum cpu_attn_mode cpu_attn_mode_get(void) { return (enum cpu_attn_mode)atomic_load(&cpu_attn_mode_cur); }

const char *cpu_attn_mode_name(enum cpu_attn_mode mode)
{
    static const char *const names[] = {"auto", "rowwise", "tiled", "split", "legacy"};
    return (unsigned)mode < CPU_ATTN_N ? names[mode] : "?";
}

int cpu_attn_mode_parse(const char *s)
{
    for (int i = 0; i < CPU_ATTN_N; i++)
        if (s && strcmp(s, cpu_attn_mode_name((enum cpu_attn_mode)i)) == 0) return i;
    return -1;
}

void cpu_attn_timer_enable(int on) { atomic_store(&cpu_attn_timing, on != 0); }
void cpu_attn_timer_reset(void) { atomic_store(&cpu_attn_ns, 0); }
double cpu_attn_timer_seconds(void) { return (double)atomic_load(&cpu_attn_ns) * 1e-9; }

struct cpu_attn_job {
    const struct cpu_attn *a;
    const struct cpu_kernels *k;
    int nq;                   /* query tokens per tiled item */
    int n_qb;                 /* query blocks */
    int64_t n_items;
    _Atomic int64_t next;     /* tiled, split: the next item to take */
    int n_splits;             /* split: splits per token (of the longest context) */
    float *acc, *m, *l;       /* split: per item, [n_heads][head_dim], [n_heads], [n_heads] */
};

/* Rowwise: item i = (token i / n_kv, KV head i % n_kv), strided (causal cost grows with the
 * token, so strided items balance). */
static void cpu_attn_rowwise_task(void *ctx, int ith, int nth)
{
    struct cpu_attn_job *j = ctx;
    int n_kv = j->a->kv->n_kv_heads;
    for (int64_t i = ith; i < j->n_items; i += nth)
        j->k->attn(j->a, (int)(i / n_kv), (int)(i % n_kv), cpu_scratch(ith));
}

/* Tiled: item i = (query block n_qb - 1 - i / n_kv, KV head i % n_kv), taken in turn. */
static void cpu_attn_tiled_task(void *ctx, int ith, int nth)
{
    (void)nth;
    struct cpu_attn_job *j = ctx;
    const int n_kv = j->a->kv->n_kv_heads, n = j->a->n_tokens;
    float *scratch = cpu_scratch(ith);
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n_items) break;
        int qb = j->n_qb - 1 - (int)(i / n_kv), t0 = qb * j->nq;
        int t1 = t0 + j->nq < n ? t0 + j->nq : n;
        j->k->attn_tile(j->a, (int)(i % n_kv), t0, t1, scratch);
    }
}

/* Split: item i = (token i / n_splits, split i % n_splits), taken in turn; a split past the
 * token's position (the longest context sets n_splits) is skipped. */
static void cpu_attn_split_task(void *ctx, int ith, int nth)
{
    (void)nth;
    struct cpu_attn_job *j = ctx;
    const struct cpu_attn *a = j->a;
    const size_t nh = (size_t)a->n_heads, hd = (size_t)a->kv->head_dim;
    float *scratch = cpu_scratch(ith);
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n_items) break;
        const int t = (int)(i / j->n_splits), c0 = (int)(i % j->n_splits) * CPU_ATTN_SPLIT_POS;
        const int n_pos = a->pos[t] + 1, c1 = c0 + CPU_ATTN_SPLIT_POS < n_pos ? c0 + CPU_ATTN_SPLIT_POS : n_pos;
        if (c0 >= n_pos) continue;
        j->k->attn_split(a, t, c0, c1, j->acc + (size_t)i * nh * hd, j->m + (size_t)i * nh, j->l + (size_t)i * nh,
                         scratch);
    }
}

/* Combines the splits of (token, head) i = t · n_heads + h, strided, in split order:
 * out = Σ_s e^(m_s - M) acc_s / Σ_s e^(m_s - M) l_s with M the largest m_s. */
static void cpu_attn_combine_task(void *ctx, int ith, int nth)
{
    struct cpu_attn_job *j = ctx;
    const struct cpu_attn *a = j->a;
    const int nh = a->n_heads, hd = a->kv->head_dim;
    for (int64_t i = ith; i < (int64_t)a->n_tokens * nh; i += nth) {
        const int t = (int)(i / nh), h = (int)(i % nh), ns = a->pos[t] / CPU_ATTN_SPLIT_POS + 1;
        const int64_t i0 = (int64_t)t * j->n_splits; /* the token's first item */
        float mx = -INFINITY, sum = 0;
        for (int s = 0; s < ns; s++) mx = fmaxf(mx, j->m[(i0 + s) * nh + h]);
        float *o = a->out + i * hd;
        for (int d = 0; d < hd; d++) o[d] = 0;
        for (int s = 0; s < ns; s++) {
            const float w = expf(j->m[(i0 + s) * nh + h] - mx);
            const float *acc = j->acc + ((size_t)(i0 + s) * nh + h) * hd;
            sum += w * j->l[(i0 + s) * nh + h];
            for (int d = 0; d < hd; d++) o[d] += w * acc[d];
        }
        const float inv = 1.0f / sum;
        for (int d = 0; d < hd; d++) o[d] *= inv;
    }
}

static void cpu_attention_run(const struct cpu_attn *a)
{
    const struct cpu_kernels *k = cpu_kernels_active();
    const int n_kv = a->kv->n_kv_heads, group = a->n_heads / n_kv;
    const enum cpu_attn_mode mode = cpu_attn_mode_get();
    int tiled = mode == CPU_ATTN_TILED ||
                ((mode == CPU_ATTN_AUTO || mode == CPU_ATTN_LEGACY) && k->attn_tile_auto &&
                 (int64_t)a->n_tokens * group >= CPU_ATTN_TILED_MIN_ROWS);
    const int split = k->attn_split && (mode == CPU_ATTN_SPLIT || (mode == CPU_ATTN_AUTO && a->n_tokens == 1 &&
                                                                     a->pos[0] + 1 >= CPU_ATTN_SPLIT_MIN_CTX));
    if (split) tiled = 0;
    struct cpu_attn_job j = {.a = a, .k = k};
    if (split) {
        j.n_splits = a->pos[a->n_tokens - 1] / CPU_ATTN_SPLIT_POS + 1;
        j.n_items = (int64_t)a->n_tokens * j.n_splits;
        atomic_init(&j.next, 0);
        const size_t nh = (size_t)a->n_heads, per = nh * ((size_t)a->kv->head_dim + 2);
        j.acc = cpu_shared_scratch((size_t)j.n_items * per);
        j.m = j.acc + (size_t)j.n_items * nh * (size_t)a->kv->head_dim;
        j.l = j.m + (size_t)j.n_items * nh;
        cpu_scratch_reserve(cpu_attn_split_scratch_floats(a));
    } else if (tiled) {
        j.nq = k->attn_rows / group > 0 ? k->attn_rows / group : 1;
        if (j.nq > a->n_tokens) j.nq = a->n_tokens;
        j.n_qb = (a->n_tokens + j.nq - 1) / j.nq;
        j.n_items = (int64_t)j.n_qb * n_kv;
        atomic_init(&j.next, 0);
        cpu_scratch_reserve(cpu_attn_tile_scratch_floats(a, j.nq));
    } else {
        j.n_items = (int64_t)a->n_tokens * n_kv;
        cpu_scratch_reserve(cpu_attn_scratch_floats(a));
    }
    /* Threads: one per 16K multiply-adds of work, at most one per item. */
    int64_t work = (int64_t)a->n_tokens * a->n_heads * (a->pos[a->n_tokens - 1] + 1) * a->kv->head_dim;
    int64_t want = work >> 14, nth = cpu_pool_size();
    if (want < nth) nth = want > 0 ? want : 1;
    if (nth > j.n_items) nth = j.n_items;
    if (!split) {
        cpu_pool_run(tiled ? cpu_attn_tiled_task : cpu_attn_rowwise_task, &j, (int)nth);
        return;
    }
    cpu_pool_run(cpu_attn_split_task, &j, (int)nth);
    const int64_t n_comb = (int64_t)a->n_tokens * a->n_heads; /* rows to combine */
    cpu_pool_run(cpu_attn_combine_task, &j, (int)(nth < n_comb ? nth : n_comb));
}

void cpu_attention(const struct cpu_attn *a)
{
    if (a->n_tokens <= 0) return;
    const int timing = atomic_load_explicit(&cpu_attn_timing, memory_order_relaxed);
    const uint64_t t0 = timing ? cairn_now_ns() : cpu_prof_now();
    cpu_attention_run(a);
    if (!t0) return;
    const uint64_t dt = cairn_now_ns() - t0;
    if (timing) atomic_fetch_add(&cpu_attn_ns, dt);
    cpu_prof_add("attention", a->n_heads, a->kv->head_dim, 1, a->n_tokens, t0, 0, 0);
}
