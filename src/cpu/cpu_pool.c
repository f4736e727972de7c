/* The compute pool: persistent workers, one round at a time, the caller taking part.
 *
 * DESIGN: a round is published by bumping `gen` (the futex word workers wait on) after storing
 * fn/ctx/nth. Worker i (1..n-1) runs fn(ctx, i, nth) if i < nth, then bumps `n_done`; the caller
 * runs ith 0 and waits until n_done reaches n-1 (spin, then futex on n_done). Workers spin a
 * little after each round before sleeping so back-to-back ops (a decode step issues hundreds)
 * don't pay a futex wake each. Nothing is allocated per round. One round runs at a time (the
 * contract of cpu.h: ops come from one thread); a nested call runs inline on one thread. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/mem.h"
#include "cpu/cpu_int.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_pool_relax() _mm_pause()
#else
#define cpu_pool_relax() ((void)0)
#endif

#define CPU_POOL_MAX 256

static struct {
    int n; /* threads including the caller */
    pthread_t th[CPU_POOL_MAX];
    _Atomic uint32_t gen;    /* futex: round number */
    _Atomic uint32_t n_done; /* futex: workers done with the current round */
    _Atomic int stop;
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    int nth;
    int spin;           /* pause iterations before sleeping */
    uint32_t gen_start; /* gen when the workers were created: a worker that starts late must
                           still see every round published after its creation */
} cpu_pool = {.n = 1};

static _Thread_local int cpu_pool_in_round;

/* Per-thread scratch. */
static float *cpu_scratch_buf[CPU_POOL_MAX];
static size_t cpu_scratch_cap; /* floats, same for every thread */
static float *cpu_shared_buf;
static size_t cpu_shared_cap;

static void cpu_futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void cpu_futex_wake(_Atomic uint32_t *addr, int n)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void *cpu_pool_worker(void *arg)
{
    int ith = (int)(intptr_t)arg;
    uint32_t seen = cpu_pool.gen_start;
    cpu_pool_in_round = 1; /* a worker never starts a nested round */
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&cpu_pool.gen, memory_order_acquire)) == seen) {
            if (spins < cpu_pool.spin) {
                cpu_pool_relax();
                spins++;
            } else {
                cpu_futex_wait(&cpu_pool.gen, seen);
            }
        }
        seen = g;
        if (atomic_load_explicit(&cpu_pool.stop, memory_order_acquire)) break;
        if (ith < cpu_pool.nth) cpu_pool.fn(cpu_pool.ctx, ith, cpu_pool.nth);
        uint32_t d = atomic_fetch_add_explicit(&cpu_pool.n_done, 1, memory_order_acq_rel) + 1;
        if (d == (uint32_t)(cpu_pool.n - 1)) cpu_futex_wake(&cpu_pool.n_done, 1);
    }
    return NULL;
}

int cpu_pool_start(int n_threads)
{
    cpu_pool_stop();
    if (n_threads < 1) n_threads = 1;
    if (n_threads > CPU_POOL_MAX) n_threads = CPU_POOL_MAX;
    const char *s = getenv("CAIRN_CPU_SPIN");
    cpu_pool.spin = s ? atoi(s) : 1000;
    atomic_store(&cpu_pool.stop, 0);
    cpu_pool.n = 1;
    cpu_pool.gen_start = atomic_load(&cpu_pool.gen);
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&cpu_pool.th[i], NULL, cpu_pool_worker, (void *)(intptr_t)i) != 0)
            break;
        cpu_pool.n = i + 1;
    }
    /* Scratch for the new threads, at the size already reserved. */
    size_t cap = cpu_scratch_cap;
    cpu_scratch_cap = 0;
    if (cap) cpu_scratch_reserve(cap);
    return cpu_pool.n == n_threads ? CAIRN_OK : CAIRN_ERR_INTERNAL;
}

void cpu_pool_stop(void)
{
    if (cpu_pool.n > 1) {
        atomic_store_explicit(&cpu_pool.stop, 1, memory_order_release);
        atomic_fetch_add_explicit(&cpu_pool.gen, 1, memory_order_acq_rel);
        cpu_futex_wake(&cpu_pool.gen, INT_MAX);
        for (int i = 1; i < cpu_pool.n; i++) pthread_join(cpu_pool.th[i], NULL);
    }
    cpu_pool.n = 1;
    for (int i = 0; i < CPU_POOL_MAX; i++) {
        if (cpu_scratch_buf[i]) cairn_mem_free(cpu_scratch_buf[i], cpu_scratch_cap * sizeof(float), CAIRN_MEM_SCRATCH);
        cpu_scratch_buf[i] = NULL;
    }
    cpu_scratch_cap = 0;
    if (cpu_shared_buf) cairn_mem_free(cpu_shared_buf, cpu_shared_cap * sizeof(float), CAIRN_MEM_SCRATCH);
    cpu_shared_buf = NULL;
    cpu_shared_cap = 0;
}

int cpu_pool_size(void) { return cpu_pool.n; }

void cpu_pool_run(void (*fn)(void *ctx, int ith, int nth), void *ctx, int nth)
{
    if (nth > cpu_pool.n) nth = cpu_pool.n;
    if (nth <= 1 || cpu_pool_in_round) {
        fn(ctx, 0, 1);
        return;
    }
    cpu_pool.fn = fn;
    cpu_pool.ctx = ctx;
    cpu_pool.nth = nth;
    atomic_store_explicit(&cpu_pool.n_done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&cpu_pool.gen, 1, memory_order_release);
    cpu_futex_wake(&cpu_pool.gen, INT_MAX);
    cpu_pool_in_round = 1;
    fn(ctx, 0, nth);
    cpu_pool_in_round = 0;
    uint32_t want = (uint32_t)(cpu_pool.n - 1), d;
    int spins = 0;
    while ((d = atomic_load_explicit(&cpu_pool.n_done, memory_order_acquire)) != want) {
        if (spins < cpu_pool.spin) {
            cpu_pool_relax();
            spins++;
        } else {
            cpu_futex_wait(&cpu_pool.n_done, d);
        }
    }
}

void cpu_scratch_reserve(size_t floats)
{
    if (floats <= cpu_scratch_cap) return;
    floats = floats + floats / 2 + 1024;
    for (int i = 0; i < cpu_pool.n; i++) {
        if (cpu_scratch_buf[i]) cairn_mem_free(cpu_scratch_buf[i], cpu_scratch_cap * sizeof(float), CAIRN_MEM_SCRATCH);
        cpu_scratch_buf[i] = cairn_mem_alloc(floats * sizeof(float), CAIRN_MEM_SCRATCH);
        CAIRN_ASSERT(cpu_scratch_buf[i] != NULL);
    }
    cpu_scratch_cap = floats;
}

float *cpu_scratch(int ith) { return cpu_scratch_buf[ith]; }

float *cpu_shared_scratch(size_t floats)
{
    if (floats > cpu_shared_cap) {
        if (cpu_shared_buf) cairn_mem_free(cpu_shared_buf, cpu_shared_cap * sizeof(float), CAIRN_MEM_SCRATCH);
        cpu_shared_cap = floats + floats / 2 + 1024;
        cpu_shared_buf = cairn_mem_alloc(cpu_shared_cap * sizeof(float), CAIRN_MEM_SCRATCH);
        CAIRN_ASSERT(cpu_shared_buf != NULL);
    }
    return cpu_shared_buf;
}
