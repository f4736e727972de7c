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
 * - CAIRN_CPU_ATTN=rowwise|tiled forces one kernel for every call (A/B benchmarks, tests).
 * - The timer (cpu_attn_timer_*) is for `cairn bench`: one clock read pair per call while on.
 * Results do not depend on the thread count or on which thread ran an item. */
#include <stdatomic.h>
#include <string.h>

#include "base/file.h"
#include "cpu/cpu.h"
#include "cpu/cpu_int.h"

/* auto: the tiled kernel from this many query rows (tokens × group) of one sequence */
#define CPU_ATTN_TILED_MIN_ROWS 4

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
    static const char *const names[] = {"auto", "rowwise", "tiled"};
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
    _Atomic int64_t next;     /* tiled: the next item to take */
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

static void cpu_attention_run(const struct cpu_attn *a)
{
    const struct cpu_kernels *k = cpu_kernels_active();
    const int n_kv = a->kv->n_kv_heads, group = a->n_heads / n_kv;
    const enum cpu_attn_mode mode = cpu_attn_mode_get();
    int tiled = mode == CPU_ATTN_TILED ||
                (mode == CPU_ATTN_AUTO && k->attn_tile_auto &&
                 (int64_t)a->n_tokens * group >= CPU_ATTN_TILED_MIN_ROWS);
    struct cpu_attn_job j = {.a = a, .k = k};
    if (tiled) {
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
    cpu_pool_run(tiled ? cpu_attn_tiled_task : cpu_attn_rowwise_task, &j, (int)nth);
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
