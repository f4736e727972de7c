/* CPU backend entry points: ISA dispatch (cpuid/xgetbv, CAIRN_CPU_ISA) and the split of each op
 * over the pool (attention: cpu_attn.c). The kernels themselves live in ref_ops.c (scalar
 * reference) and the x86_* variants; see cpu_int.h for the design. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "base/log.h"
#include "base/mem.h"
#include "cpu/cpu.h"
#include "cpu/cpu_int.h"
#include "cpu/ref.h"

static enum cpu_isa cpu_active_isa = CPU_ISA_SCALAR;
static const struct cpu_kernels *cpu_k = &cpu_kernels_ref;
static struct cpu_features cpu_feat;
static int cpu_feat_done;
/* The VNNI q4/q8 path on packed weights (cpu_pack.c, x86_*_vnni.c): on by default where the
 * active ISA has it (AVX-512 VNNI, or AVX-VNNI under AVX2); CAIRN_CPU_VNNI=0 turns it off
 * (weights are then not packed at load and the f32 dequantize-and-FMA tiles run). Read once
 * per cpu_isa_set. Mode: -1 not read yet, 0 off, 1 on. */
static int cpu_vnni_enabled = -1;
static int cpu_vnni_n_digits = CPU_VNNI_DIGITS;
/* cpu_lock: the pool and its scratch, for callers on different threads (cpu.h, Threading) */
static pthread_mutex_t cpu_mu = PTHREAD_MUTEX_INITIALIZER;

void cpu_lock(void) { pthread_mutex_lock(&cpu_mu); }
void cpu_unlock(void) { pthread_mutex_unlock(&cpu_mu); }

/* ---- ISA detection ---- */

#if defined(__x86_64__)
static uint64_t cpu_xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

const struct cpu_features *cpu_features_get(void)
{
    if (cpu_feat_done) return &cpu_feat;
    memset(&cpu_feat, 0, sizeof(cpu_feat));
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
        uint64_t xcr0 = osxsave ? cpu_xgetbv0() : 0;
        int ymm_os = (xcr0 & 0x6) == 0x6, zmm_os = (xcr0 & 0xe6) == 0xe6;
        if (avx && ymm_os) {
            cpu_feat.fma = (c >> 12) & 1;
            cpu_feat.f16c = (c >> 29) & 1;
            if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
                cpu_feat.avx2 = (b >> 5) & 1;
                unsigned a1 = 0, b1, c1, d1;
                if (!__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) a1 = 0;
                cpu_feat.avx_vnni = (a1 >> 4) & 1;
                if (zmm_os) {
                    cpu_feat.avx512f = (b >> 16) & 1;
                    cpu_feat.avx512dq = (b >> 17) & 1;
                    cpu_feat.avx512bw = (b >> 30) & 1;
                    cpu_feat.avx512vl = (b >> 31) & 1;
                    cpu_feat.avx512vnni = (c >> 11) & 1;
                    cpu_feat.avx512bf16 = (a1 >> 5) & 1;
                }
            }
        }
    }
#endif
    cpu_feat_done = 1;
    return &cpu_feat;
}

int cpu_isa_supported(enum cpu_isa isa)
{
    const struct cpu_features *f = cpu_features_get();
    switch (isa) {
    case CPU_ISA_SCALAR: return 1;
    case CPU_ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case CPU_ISA_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw && f->avx512vl &&
               f->avx512dq;
    default: return 0;
    }
}

int cpu_isa_set(enum cpu_isa isa)
{
    cpu_vnni_enabled = -1;
    if ((unsigned)isa >= CPU_ISA_N || !cpu_isa_supported(isa)) return CAIRN_ERR_UNSUPPORTED;
    cpu_active_isa = isa;
    cpu_k = isa == CPU_ISA_AVX512 ? &cpu_avx512_kernels
          : isa == CPU_ISA_AVX2   ? &cpu_avx2_kernels
                                  : &cpu_kernels_ref;
    return CAIRN_OK;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa < CPU_ISA_N ? names[isa] : "?";
}

int cpu_isa_parse(const char *s)
{
    for (int i = 0; i < CPU_ISA_N; i++)
        if (s && strcmp(s, cpu_isa_name((enum cpu_isa)i)) == 0) return i;
    return -1;
}

enum cpu_isa cpu_isa_get(void) { return cpu_active_isa; }

const struct cpu_kernels *cpu_kernels_active(void) { return cpu_k; }

int cpu_init(int n_threads, struct cairn_err *err)
{
    enum cpu_isa isa = CPU_ISA_SCALAR;
    for (int i = CPU_ISA_N - 1; i >= 0; i--)
        if (cpu_isa_supported((enum cpu_isa)i)) {
            isa = (enum cpu_isa)i;
            break;
        }
    const char *env = getenv("CAIRN_CPU_ISA");
    if (env && *env) {
        int forced = cpu_isa_parse(env);
        if (forced < 0)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "CAIRN_CPU_ISA=%s: expected scalar|avx2|avx512", env);
        if (!cpu_isa_supported((enum cpu_isa)forced))
            return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "CAIRN_CPU_ISA=%s: this CPU lacks it", env);
        isa = (enum cpu_isa)forced;
    }
    const char *attn = getenv("CAIRN_CPU_ATTN");
    int attn_mode = CPU_ATTN_AUTO;
    if (attn && *attn && (attn_mode = cpu_attn_mode_parse(attn)) < 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "CAIRN_CPU_ATTN=%s: expected auto|rowwise|tiled|split|legacy", attn);
    cpu_attn_mode_set((enum cpu_attn_mode)attn_mode);
    cpu_prof_init();
    cpu_isa_set(isa);
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (cpu_pool_start(n_threads) != CAIRN_OK)
        return cairn_err_set(err, CAIRN_ERR_INTERNAL, "cpu: could only start %d of %d threads",
                             cpu_pool_size(), n_threads);
    return CAIRN_OK;
}

void cpu_shutdown(void)
{
    cpu_prof_report();
    cpu_pool_stop();
}
int cpu_n_threads(void) { return cpu_pool_size(); }


/* ---- splitting helpers ---- */

/* [begin, end) of chunk ith of nth over [0, n), chunk edges aligned to `align`. */
static void cpu_split(int64_t n, int64_t align, int ith, int nth, int64_t *begin, int64_t *end)
{
    int64_t units = (n + align - 1) / align;
    int64_t b = units * ith / nth, e = units * (ith + 1) / nth;
    *begin = CAIRN_MIN(b * align, n);
    *end = CAIRN_MIN(e * align, n);
}

/* Threads worth using for `work` units of roughly equal cost (min_per_thread each). */
static int cpu_nth_for(int64_t work, int64_t min_per_thread)
{
    int nth = cpu_pool_size();
    int64_t want = work / (min_per_thread > 0 ? min_per_thread : 1);
    if (want < 1) want = 1;
    return want < nth ? (int)want : nth;
}

/* ---- matmul ---- */

/* One matmul round: up to CPU_MM_MAX weights that read the same x (q/k/v, gate/up), with their
 * rows laid end to end so one dispatch and one activation prep serve them all. */
#define CPU_MM_MAX 4

struct cpu_mm_job {
    struct cpu_mm mm[CPU_MM_MAX];
    int count;
    int64_t first_chunk[CPU_MM_MAX + 1]; /* chunks of weight i: [first_chunk[i], first_chunk[i+1]) */
    const struct cpu_kernels *k;
    int64_t chunk_rows;       /* rows per chunk (multiple of 16) */
    _Atomic int64_t next;     /* next chunk to take, or (guided) the next row */
    int guided;               /* prefill: shrinking chunks (cpu_matmul_take) */
    int nth;                  /* guided: threads of the round */
    int64_t first_row[CPU_MM_MAX + 1]; /* guided: weight i's rows (each rounded up to 16) from
                                          first_row[i] in the rows laid end to end */
    int use_vnni;             /* VNNI path for packed q4/q8 */
    _Atomic uint64_t busy_ns; /* CAIRN_CPU_PROF: thread time in the round */
};


static void cpu_vnni_prep_task(void *ctx, int ith, int nth)
{
    struct cpu_mm_job *j = ctx;
    int64_t t0, t1;
    cpu_split(j->mm[0].n, 1, ith, nth, &t0, &t1);
    if (t0 < t1) cpu_vnni_prep(&j->mm[0], (int)t0, (int)t1);
}

/* Guided split for prefill: each take is 1/(2·nth) of the rows still left, at least
 * CPU_MM_GUIDED_MIN_ROWS and never across two weights. Big chunks first (few restarts of the
 * weight stream), small ones at the end, so that the threads finish together even when one
 * joined the round late or was preempted in it: with a fixed 4 chunks per round of 2 threads a
 * 512-token prefill of the Llama-3.2-1B shape had 13-16% of its q/k/v and o rounds idle
 * (CAIRN_CPU_PROF), with 16 fixed chunks 10-12%. Returns 0 when no rows are left, else sets
 * *i (the weight) and its rows [*r0, *r1). */
#define CPU_MM_GUIDED_MIN_ROWS 64
#define CPU_MM_GUIDED_MIN_N 8
static int cpu_matmul_take(struct cpu_mm_job *j, int *i, int64_t *r0, int64_t *r1)
{
    const int64_t total = j->first_row[j->count];
    int64_t cur = atomic_load_explicit(&j->next, memory_order_relaxed), take;
    int w;
    do {
        if (cur >= total) return 0;
        w = 0;
        while (cur >= j->first_row[w + 1]) w++;
        take = ((total - cur) / (2 * j->nth) + 31) / 32 * 32;
        take = CAIRN_MIN(CAIRN_MAX(take, (int64_t)CPU_MM_GUIDED_MIN_ROWS), j->first_row[w + 1] - cur);
    } while (!atomic_compare_exchange_weak_explicit(&j->next, &cur, cur + take, memory_order_relaxed,
                                                    memory_order_relaxed));
    *i = w;
    *r0 = cur - j->first_row[w];
    *r1 = CAIRN_MIN(*r0 + take, j->mm[w].out);
    return 1;
}

/* Threads take row chunks from a shared counter rather than a fixed share: on a busy machine a
 * preempted thread's rows are picked up by the others instead of stalling the round. */
static void cpu_matmul_task(void *ctx, int ith, int nth)
{
    (void)nth;
    struct cpu_mm_job *j = ctx;
    const int64_t n_chunks = j->first_chunk[j->count];
    const uint64_t t0 = cpu_prof_now();
    int i = 0;
    for (;;) {
        int64_t r0, r1;
        if (j->guided) {
            if (!cpu_matmul_take(j, &i, &r0, &r1)) break;
        } else {
            int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
            if (c >= n_chunks) break;
            while (c >= j->first_chunk[i + 1]) i++;
            r0 = (c - j->first_chunk[i]) * j->chunk_rows;
            r1 = CAIRN_MIN(r0 + j->chunk_rows, j->mm[i].out);
        }
        const struct cpu_mm *mm = &j->mm[i];
        if (j->use_vnni) (j->k == &cpu_avx512_kernels ? cpu_avx512_vnni_matmul : cpu_avx2_vnni_matmul)(mm, r0, r1);
        else j->k->matmul(mm, r0, r1, cpu_scratch(ith));
    }
    if (t0) atomic_fetch_add_explicit(&j->busy_ns, cpu_prof_now() - t0, memory_order_relaxed);
}

static int cpu_vnni_mode(void)
{
    if (cpu_vnni_enabled < 0) {
        const char *e = getenv("CAIRN_CPU_VNNI");
        cpu_vnni_enabled = !(e && strcmp(e, "0") == 0);
        const char *q = getenv("CAIRN_CPU_QACT");
        cpu_vnni_n_digits = q && strcmp(q, "fast") == 0 ? 1 : CPU_VNNI_DIGITS;
    }
    return cpu_vnni_enabled;
}

int cpu_vnni_digits(void)
{
    (void)cpu_vnni_mode();
    return cpu_vnni_n_digits;
}

int cpu_vnni_active(void)
{
    const struct cpu_features *f = cpu_features_get();
    return cpu_vnni_mode() && ((cpu_k == &cpu_avx512_kernels && f->avx512vnni) ||
                               (cpu_k == &cpu_avx2_kernels && f->avx_vnni));
}

/* Can w share a round (and its prepared activations) with w0? Same input width, and for
 * quantized weights the same bits and group size. */
static int cpu_mm_compatible(const struct tensor *w0, const struct tensor *w)
{
    if (w->shape[1] != w0->shape[1] || w->dtype != w0->dtype) return 0;
    return w->dtype != DTYPE_Q || (w->bits == w0->bits && w->group_size == w0->group_size);
}

void cpu_matmul_multi(const struct tensor *const *w, float *const *y, int count, const float *x, int n)
{
    if (count > CPU_MM_MAX || count < 1) {
        for (int i = 0; i < count; i++) cpu_matmul(w[i], x, y[i], n);
        return;
    }
    for (int i = 1; i < count; i++)
        if (!cpu_mm_compatible(w[0], w[i])) {
            for (int k = 0; k < count; k++) cpu_matmul(w[k], x, y[k], n);
            return;
        }
    if (n <= 0) return;
    struct cpu_mm_job j = {.k = cpu_k, .count = count};
    const struct tensor *w0 = w[0];
    const int64_t in = w0->shape[1];
    int64_t total_out = 0;
    for (int i = 0; i < count; i++) {
        j.mm[i] = (struct cpu_mm){.w = w[i], .x = x, .y = y[i], .n = n, .in = in, .out = w[i]->shape[0]};
        total_out += j.mm[i].out;
    }
    if (total_out <= 0) return;
    uint64_t t_prep = cpu_prof_now();
    cpu_scratch_reserve((size_t)in + 64);
    int packed = 1;
    for (int i = 0; i < count; i++) packed &= w[i]->be_data != NULL;
    if (packed && cpu_vnni_active()) {
        int64_t groups = in / w0->group_size;
        size_t xq_floats = (3 * (size_t)n * (size_t)in + 3) / 4 + 16; /* three int8 digits per input */
        float *buf = cpu_shared_scratch(xq_floats + 2 * (size_t)n * (size_t)groups + 16);
        for (int i = 0; i < count; i++) {
            j.mm[i].xq = (const int8_t *)buf;
            j.mm[i].xd = buf + xq_floats;
            j.mm[i].xsum = buf + xq_floats + (size_t)n * (size_t)groups;
            j.mm[i].digits = cpu_vnni_digits();
        }
        j.use_vnni = 1;
        cpu_pool_run(cpu_vnni_prep_task, &j, cpu_nth_for((int64_t)n * in, 1 << 15));
        cpu_prof_add("mm_prep", 0, in, count, n, t_prep, 0, 0);
    } else if (cpu_k != &cpu_kernels_ref && w0->dtype == DTYPE_Q && w0->bits == 4 && in % 32 == 0 &&
               w0->group_size % 32 == 0) {
        /* De-interleave each 32-chunk of x: byte b of a chunk holds codes 2b (low nibble) and
         * 2b+1 (high nibble), so kernels read 16 even inputs then 16 odd ones. */
        float *xp = cpu_shared_scratch((size_t)n * (size_t)in);
        for (int64_t i = 0; i < (int64_t)n * in; i += 32)
            for (int b = 0; b < 16; b++) {
                xp[i + b] = x[i + 2 * b];
                xp[i + 16 + b] = x[i + 2 * b + 1];
            }
        for (int i = 0; i < count; i++) j.mm[i].xp = xp;
    }
    /* Rows cost in/… each; below ~64K weights a second thread costs more than it saves. */
    int nth = cpu_nth_for(total_out * in * (int64_t)n, 1 << 16);
    /* Decode and other short calls: about 2 chunks per thread, each at least 16 rows (and ~16K
     * weights): every chunk starts its weight stream cold (decode q4 was 12% slower with 8),
     * while a second chunk still lets an idle thread take over from a preempted one. Prefill
     * (compute-bound, CPU_MM_GUIDED_MIN_N tokens or more): the guided split of
     * cpu_matmul_take. */
    int64_t rows = (total_out + 2 * nth - 1) / (2 * nth);
    int64_t min_rows = CAIRN_MAX((int64_t)16, ((int64_t)1 << 14) / CAIRN_MAX(in, (int64_t)1));
    rows = CAIRN_MAX(rows, min_rows);
    j.chunk_rows = (rows + 15) / 16 * 16;
    j.first_chunk[0] = 0;
    j.first_row[0] = 0;
    for (int i = 0; i < count; i++) {
        j.first_chunk[i + 1] = j.first_chunk[i] + (j.mm[i].out + j.chunk_rows - 1) / j.chunk_rows;
        j.first_row[i + 1] = j.first_row[i] + (j.mm[i].out + 15) / 16 * 16;
    }
    j.guided = n >= CPU_MM_GUIDED_MIN_N;
    j.nth = nth;
    atomic_init(&j.next, 0);
    atomic_init(&j.busy_ns, 0);
    uint64_t t_mm = cpu_prof_now();
    cpu_pool_run(cpu_matmul_task, &j, nth);
    if (t_mm) cpu_prof_add(j.use_vnni ? "mm_vnni" : "matmul", total_out, in, count, n, t_mm, atomic_load(&j.busy_ns), nth);
}

void cpu_matmul(const struct tensor *w, const float *x, float *y, int n)
{
    cpu_matmul_multi(&w, &y, 1, x, n);
}

void cpu_embed(const struct tensor *w, const int32_t *ids, int n, float *out)
{
    uint64_t t0 = cpu_prof_now();
    ref_embed(w, ids, n, out);
    if (t0) cpu_prof_add("embed", w->shape[0], w->shape[1], 1, n, t0, 0, 0);
}

/* ---- element-wise and row ops ---- */

struct cpu_rows_job {
    float *y;
    const float *x, *w, *b;
    int n_rows, dim;
    float eps, w_offset;
    int64_t n;
    const struct cpu_kernels *k;
};

static void cpu_rmsnorm_task(void *ctx, int ith, int nth)
{
    const struct cpu_rows_job *j = ctx;
    int64_t r0, r1;
    cpu_split(j->n_rows, 1, ith, nth, &r0, &r1);
    if (r0 < r1)
        j->k->rmsnorm(j->y + r0 * j->dim, j->x + r0 * j->dim, j->w, (int)(r1 - r0), j->dim, j->eps,
                      j->w_offset);
}

void cpu_rmsnorm(float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                 float w_offset)
{
    struct cpu_rows_job j = {.y = y, .x = x, .w = w, .n_rows = n_rows, .dim = dim, .eps = eps,
                             .w_offset = w_offset, .k = cpu_k};
    int nth = cpu_nth_for((int64_t)n_rows * dim, 1 << 15);
    if (nth > n_rows) nth = n_rows > 0 ? n_rows : 1;
    uint64_t t0 = cpu_prof_now();
    cpu_pool_run(cpu_rmsnorm_task, &j, nth);
    if (t0) cpu_prof_add("rmsnorm", dim, 0, 1, n_rows, t0, 0, 0);
}

struct cpu_rope_job {
    float *x;
    int n_tokens, n_heads, head_dim, rot_dim;
    const int32_t *pos;
    const float *inv_freq;
    const struct cpu_kernels *k;
};

static void cpu_rope_task(void *ctx, int ith, int nth)
{
    const struct cpu_rope_job *j = ctx;
    int64_t t0, t1;
    cpu_split(j->n_tokens, 1, ith, nth, &t0, &t1);
    if (t0 < t1)
        j->k->rope(j->x + t0 * j->n_heads * j->head_dim, (int)(t1 - t0), j->n_heads, j->head_dim,
                   j->rot_dim, j->pos + t0, j->inv_freq);
}

void cpu_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
              const float *inv_freq)
{
    struct cpu_rope_job j = {x, n_tokens, n_heads, head_dim, rot_dim, pos, inv_freq, cpu_k};
    int nth = cpu_nth_for((int64_t)n_tokens * n_heads * rot_dim * 8, 1 << 15);
    if (nth > n_tokens) nth = n_tokens > 0 ? n_tokens : 1;
    uint64_t t0 = cpu_prof_now();
    cpu_pool_run(cpu_rope_task, &j, nth);
    if (t0) cpu_prof_add("rope", n_heads, head_dim, 1, n_tokens, t0, 0, 0);
}

static void cpu_silu_task(void *ctx, int ith, int nth)
{
    const struct cpu_rows_job *j = ctx;
    int64_t b, e;
    cpu_split(j->n, 64, ith, nth, &b, &e);
    if (b < e) j->k->silu_mul(j->y + b, j->x + b, j->w + b, e - b);
}

void cpu_silu_mul(float *out, const float *gate, const float *up, int64_t n)
{
    struct cpu_rows_job j = {.y = out, .x = gate, .w = up, .n = n, .k = cpu_k};
    uint64_t t0 = cpu_prof_now();
    cpu_pool_run(cpu_silu_task, &j, cpu_nth_for(n, 1 << 14));
    if (t0) cpu_prof_add("silu_mul", 0, 0, 1, 0, t0, 0, 0);
}

static void cpu_add_task(void *ctx, int ith, int nth)
{
    const struct cpu_rows_job *j = ctx;
    int64_t b, e;
    cpu_split(j->n, 64, ith, nth, &b, &e);
    if (b < e) j->k->add(j->y + b, j->x + b, e - b);
}

void cpu_add(float *y, const float *x, int64_t n)
{
    struct cpu_rows_job j = {.y = y, .x = x, .n = n, .k = cpu_k};
    uint64_t t0 = cpu_prof_now();
    cpu_pool_run(cpu_add_task, &j, cpu_nth_for(n, 1 << 16));
    if (t0) cpu_prof_add("add", 0, 0, 1, 0, t0, 0, 0);
}

void cpu_add_bias(float *y, const float *b, int n_rows, int dim)
{
    for (int r = 0; r < n_rows; r++) cpu_k->add(y + (int64_t)r * dim, b, dim);
}

/* ---- KV and attention ---- */

void cpu_kv_store(const struct backend_kv_view *kv, int layer, const int32_t *slots, int n_tokens,
                  const float *k, const float *v)
{
    uint64_t t0 = cpu_prof_now();
    ref_kv_store(kv, layer, slots, n_tokens, k, v);
    if (t0) cpu_prof_add("kv_store", 0, 0, 1, n_tokens, t0, 0, 0);
}

void cpu_parallel(void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    cpu_pool_run(fn, ctx, cpu_pool_size());
}
