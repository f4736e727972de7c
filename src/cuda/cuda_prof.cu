/* CAIRN_CUDA_PROFILE=1: GPU time of the prefill-side ops by kind (cuda_kernels.h), printed to
 * stderr when the process exits. A region is bracketed by two events on the op's stream and
 * waited for at its end, so the ops are serialized with the host while profiling (the figures
 * are each kind's GPU time; the step's wall time grows by the lost overlap). Off (the default),
 * each call is one load of a flag. Regions inside a stream capture are not timed. A .cu file
 * (C linkage through cuda_kernels.h), so that kernel launchers and C callers both reach it.
 * Below it, the whole-step profile (CAIRN_CUDA_STEP_PROFILE, CAIRN_CUDA_PROF_STEPS): see there. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_common.cuh"

struct cuda_prof_region {
    cudaEvent_t e0, e1;
};

static const char *const cuda_prof_names[CUDA_PROF_N] = {"gemm", "act->bf16", "dequant",
                                                         "attention (flash)"};

static pthread_once_t cuda_prof_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t cuda_prof_lock = PTHREAD_MUTEX_INITIALIZER;
static int cuda_prof_enabled;
static double cuda_prof_ms[CUDA_PROF_N];
static double cuda_prof_flops[CUDA_PROF_N];
static long cuda_prof_calls[CUDA_PROF_N];

static void cuda_prof_report(void)
{
    double total = 0;
    for (int k = 0; k < CUDA_PROF_N; k++)
        total += cuda_prof_ms[k];
    fprintf(stderr, "cuda profile: %.1f ms of GPU time in the timed ops\n", total);
    for (int k = 0; k < CUDA_PROF_N; k++) {
        if (!cuda_prof_calls[k]) continue;
        fprintf(stderr, "cuda profile: %-18s %9.1f ms %6ld calls", cuda_prof_names[k],
                cuda_prof_ms[k], cuda_prof_calls[k]);
        if (cuda_prof_flops[k] > 0 && cuda_prof_ms[k] > 0)
            fprintf(stderr, " %7.1f TFLOP/s", cuda_prof_flops[k] / (cuda_prof_ms[k] * 1e9));
        fputc('\n', stderr);
    }
}

static void cuda_prof_init(void)
{
    const char *s = getenv("CAIRN_CUDA_PROFILE");
    cuda_prof_enabled = s && *s && strcmp(s, "0") != 0;
    if (cuda_prof_enabled) atexit(cuda_prof_report);
}

extern "C" void *cuda_prof_begin(cudaStream_t s)
{
    pthread_once(&cuda_prof_once, cuda_prof_init);
    if (!cuda_prof_enabled) return NULL;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return NULL;
    struct cuda_prof_region *r = (struct cuda_prof_region *)calloc(1, sizeof(*r));
    if (!r) return NULL;
    if (cudaEventCreate(&r->e0) != cudaSuccess) {
        free(r);
        return NULL;
    }
    if (cudaEventCreate(&r->e1) != cudaSuccess) {
        (void)cudaEventDestroy(r->e0);
        free(r);
        return NULL;
    }
    (void)cudaEventRecord(r->e0, s);
    return r;
}

extern "C" void cuda_prof_end(void *region, cudaStream_t s, enum cuda_prof_kind kind, double flops)
{
    struct cuda_prof_region *r = (struct cuda_prof_region *)region;
    if (!r) return;
    float ms = 0;
    if (cudaEventRecord(r->e1, s) == cudaSuccess && cudaEventSynchronize(r->e1) == cudaSuccess &&
        cudaEventElapsedTime(&ms, r->e0, r->e1) == cudaSuccess) {
        pthread_mutex_lock(&cuda_prof_lock);
        cuda_prof_ms[kind] += ms;
        cuda_prof_flops[kind] += flops;
        cuda_prof_calls[kind]++;
        pthread_mutex_unlock(&cuda_prof_lock);
    }
    (void)cudaEventDestroy(r->e0);
    (void)cudaEventDestroy(r->e1);
    free(r);
}

/* ---- CAIRN_CUDA_STEP_PROFILE=1: where a step's wall time goes ----
 * Per step (step_begin .. step_end): the host time before its first launch (staging, upload,
 * recording the ops: the GPU idles meanwhile), the GPU time from an event just before that
 * launch to one recorded before the step's last wait (the graph, or the eager replay, plus the
 * sampling kernel and its copies), and the rest of the wall time (waking up after the GPU,
 * copies back). Summed by the step's token rows and by how its ops ran (graph launch or not),
 * printed to stderr at exit: every step is kept (row counts up to CUDA_PROF_STEP_EXACT each,
 * larger ones in buckets of 1/16 of an octave), and steps with no launch or no GPU time are counted
 * with their wall time, so the lines add up to the steps' whole time. Each step pays two event
 * records and one extra event query.
 * CAIRN_CUDA_PROF_STEPS=ROWS[,ROWS...]:SKIP:COUNT brackets graph-launched steps of each ROWS
 * token rows, from the SKIP-th such step (counted per row count) on, COUNT of them, with
 * cudaProfilerStart/Stop: `ncu
 * --profile-from-start off` then profiles exactly those steps' kernels. */
#include <cuda_profiler_api.h>
#include <time.h>

#define CUDA_PROF_STEP_ROWS 8      /* row counts CAIRN_CUDA_PROF_STEPS may name */
#define CUDA_PROF_STEP_EXACT 256   /* row counts summed one by one (a decode step's, up to 256 running) */
#define CUDA_PROF_STEP_SUB 16      /* buckets per octave above that */
#define CUDA_PROF_STEP_OCTAVES 12  /* 256 .. 2^20 rows; more go to the last bucket */
#define CUDA_PROF_STEP_BUCKETS (CUDA_PROF_STEP_EXACT + CUDA_PROF_STEP_SUB * CUDA_PROF_STEP_OCTAVES + 1)

struct cuda_prof_step_sum {
    long n;
    double host_us, gpu_us, wall_us;
};

struct cuda_prof_step {
    cudaEvent_t e0, e1;
    double t_begin, t_launch;
    int rows, graph, launched, marked;
    int frozen;                        /* step_end's own wait: no more marks */
    int ncu_on;                        /* cudaProfilerStart was called for this step */
    long n_match[CUDA_PROF_STEP_ROWS]; /* graph steps of each cuda_step_rows[] count seen */
};

static pthread_once_t cuda_step_once = PTHREAD_ONCE_INIT;
static int cuda_step_enabled;
static int cuda_step_rows[CUDA_PROF_STEP_ROWS], cuda_step_n_rows, cuda_step_skip, cuda_step_count;
static struct cuda_prof_step_sum cuda_step_sums[CUDA_PROF_STEP_BUCKETS][2]; /* [bucket][graph] */
static long cuda_step_n_untimed;     /* steps with no launch or no GPU time (events failed) */
static double cuda_step_untimed_us;  /* their wall time */

/* Bucket of a step of `rows` token rows (>= 1) and the row range [*lo, *hi] it holds. */
static int cuda_step_bucket(int rows)
{
    if (rows <= CUDA_PROF_STEP_EXACT) return rows < 1 ? 0 : rows - 1;
    int k = 0;
    while (k < CUDA_PROF_STEP_OCTAVES && rows >= (CUDA_PROF_STEP_EXACT << (k + 1))) k++;
    if (k == CUDA_PROF_STEP_OCTAVES) return CUDA_PROF_STEP_BUCKETS - 1;
    int base = CUDA_PROF_STEP_EXACT << k, width = base / CUDA_PROF_STEP_SUB;
    return CUDA_PROF_STEP_EXACT + k * CUDA_PROF_STEP_SUB + (rows - base) / width;
}

static void cuda_step_bucket_range(int b, int *lo, int *hi)
{
    if (b < CUDA_PROF_STEP_EXACT) {
        *lo = *hi = b + 1;
        return;
    }
    if (b == CUDA_PROF_STEP_BUCKETS - 1) {
        *lo = CUDA_PROF_STEP_EXACT << CUDA_PROF_STEP_OCTAVES;
        *hi = -1;
        return;
    }
    int k = (b - CUDA_PROF_STEP_EXACT) / CUDA_PROF_STEP_SUB, j = (b - CUDA_PROF_STEP_EXACT) % CUDA_PROF_STEP_SUB;
    int base = CUDA_PROF_STEP_EXACT << k, width = base / CUDA_PROF_STEP_SUB;
    *lo = base + j * width;
    *hi = *lo + width - 1;
    if (*lo <= CUDA_PROF_STEP_EXACT) *lo = CUDA_PROF_STEP_EXACT + 1; /* 256 itself is exact */
}

static double cuda_prof_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* One line per bucket and way of running: rows, graph/eager, steps, their total wall seconds,
 * then the mean split (sort on field 9 for where the time went), and a total. */
static void cuda_step_report(void)
{
    long n_all = cuda_step_n_untimed;
    double wall_all = cuda_step_untimed_us;
    for (int b = 0; b < CUDA_PROF_STEP_BUCKETS; b++)
        for (int g = 0; g < 2; g++) {
            const struct cuda_prof_step_sum *s = &cuda_step_sums[b][g];
            if (!s->n) continue;
            int lo, hi;
            cuda_step_bucket_range(b, &lo, &hi);
            char rows[32];
            if (lo == hi) snprintf(rows, sizeof(rows), "%d", lo);
            else if (hi < 0) snprintf(rows, sizeof(rows), "%d+", lo);
            else snprintf(rows, sizeof(rows), "%d-%d", lo, hi);
            double n = (double)s->n;
            n_all += s->n;
            wall_all += s->wall_us;
            fprintf(stderr,
                    "cuda step profile: rows %-11s %-5s %6ld steps, %8.3f s: wall %8.1f us = host before "
                    "launch %7.1f + GPU %8.1f + after %6.1f\n",
                    rows, g ? "graph" : "eager", s->n, s->wall_us / 1e6, s->wall_us / n, s->host_us / n,
                    s->gpu_us / n, (s->wall_us - s->host_us - s->gpu_us) / n);
        }
    fprintf(stderr, "cuda step profile: total %ld steps, %.3f s of wall (%ld untimed: no launch or no GPU "
            "time, %.3f s)\n", n_all, wall_all / 1e6, cuda_step_n_untimed, cuda_step_untimed_us / 1e6);
}

static void cuda_step_init(void)
{
    const char *s = getenv("CAIRN_CUDA_STEP_PROFILE");
    cuda_step_enabled = s && *s && strcmp(s, "0") != 0;
    s = getenv("CAIRN_CUDA_PROF_STEPS"); /* ROWS[,ROWS...]:SKIP:COUNT */
    while (s && *s && cuda_step_n_rows < CUDA_PROF_STEP_ROWS) {
        char *end = NULL;
        long r = strtol(s, &end, 10);
        if (end == s || r < 1) break;
        cuda_step_rows[cuda_step_n_rows++] = (int)r;
        s = end;
        if (*s != ',') break;
        s++;
    }
    if (cuda_step_n_rows && (!s || sscanf(s, ":%d:%d", &cuda_step_skip, &cuda_step_count) != 2)) {
        fprintf(stderr, "cuda: CAIRN_CUDA_PROF_STEPS: want ROWS[,ROWS...]:SKIP:COUNT\n");
        cuda_step_n_rows = 0;
    }
    if (cuda_step_n_rows) cuda_step_enabled = 1;
    if (cuda_step_enabled) atexit(cuda_step_report);
}

extern "C" void *cuda_prof_step_open(void)
{
    pthread_once(&cuda_step_once, cuda_step_init);
    if (!cuda_step_enabled) return NULL;
    struct cuda_prof_step *p = (struct cuda_prof_step *)calloc(1, sizeof(*p));
    if (!p) return NULL;
    if (cudaEventCreate(&p->e0) != cudaSuccess || cudaEventCreate(&p->e1) != cudaSuccess) {
        free(p);
        return NULL;
    }
    return p;
}

extern "C" void cuda_prof_step_close(void *prof)
{
    struct cuda_prof_step *p = (struct cuda_prof_step *)prof;
    if (!p) return;
    (void)cudaEventDestroy(p->e0);
    (void)cudaEventDestroy(p->e1);
    free(p);
}

extern "C" void cuda_prof_step_begin(void *prof)
{
    struct cuda_prof_step *p = (struct cuda_prof_step *)prof;
    if (!p) return;
    p->t_begin = cuda_prof_now_us();
    p->launched = p->marked = p->ncu_on = p->frozen = 0;
    p->rows = 0;
    p->graph = 0;
}

extern "C" void cuda_prof_step_launch(void *prof, cudaStream_t s, int rows, int graph)
{
    struct cuda_prof_step *p = (struct cuda_prof_step *)prof;
    if (!p || p->launched) return;
    p->launched = 1;
    p->rows = rows;
    p->graph = graph;
    p->t_launch = cuda_prof_now_us();
    for (int k = 0; graph && k < cuda_step_n_rows; k++) {
        if (rows != cuda_step_rows[k]) continue;
        long i = p->n_match[k]++;
        if (i >= cuda_step_skip && i < (long)cuda_step_skip + cuda_step_count) {
            (void)cudaProfilerStart();
            p->ncu_on = 1;
        }
    }
    (void)cudaEventRecord(p->e0, s);
}

extern "C" void cuda_prof_step_mark(void *prof, cudaStream_t s)
{
    struct cuda_prof_step *p = (struct cuda_prof_step *)prof;
    if (!p || !p->launched || p->frozen) return;
    p->marked = cudaEventRecord(p->e1, s) == cudaSuccess;
}

extern "C" void cuda_prof_step_freeze(void *prof, cudaStream_t s)
{
    struct cuda_prof_step *p = (struct cuda_prof_step *)prof;
    if (!p) return;
    if (!p->marked) cuda_prof_step_mark(p, s);
    p->frozen = 1;
}

extern "C" void cuda_prof_step_end(void *prof)
{
    struct cuda_prof_step *p = (struct cuda_prof_step *)prof;
    if (!p) return;
    if (p->ncu_on) (void)cudaProfilerStop();
    float ms = 0;
    int timed = p->launched && p->marked && cudaEventSynchronize(p->e1) == cudaSuccess &&
                cudaEventElapsedTime(&ms, p->e0, p->e1) == cudaSuccess;
    double wall = cuda_prof_now_us() - p->t_begin;
    pthread_mutex_lock(&cuda_prof_lock);
    if (!timed) {
        cuda_step_n_untimed++;
        cuda_step_untimed_us += wall;
    } else {
        struct cuda_prof_step_sum *sum = &cuda_step_sums[cuda_step_bucket(p->rows)][p->graph ? 1 : 0];
        sum->n++;
        sum->host_us += p->t_launch - p->t_begin;
        sum->gpu_us += 1e3 * ms;
        sum->wall_us += wall;
    }
    pthread_mutex_unlock(&cuda_prof_lock);
}
