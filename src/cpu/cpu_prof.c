/* CAIRN_CPU_PROF=1: wall time of the CPU ops by kind and shape, printed to stderr when the pool
 * stops (cpu_shutdown), for finding where a prefill's time goes without perf.
 *
 * DESIGN: cpu_prof_on is read once by cpu_init; while it is 0 the ops read no clock (one
 * predictable branch each). Rows are keyed by (kind, out, in, count); each keeps calls, tokens,
 * wall ns and, for rounds on the pool, the busy ns summed over threads, so that
 * 1 - busy / (threads · wall) is the round's idle share (hand-off, imbalance, a preempted
 * core). Ops are issued from one thread at a time (cpu.h, Threading), so the table needs no
 * lock; busy ns are added by the pool threads with atomics. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cpu/cpu_int.h"

#define CPU_PROF_ROWS 64

struct cpu_prof_row {
    const char *kind;
    int64_t out, in;
    int count;
    int one; /* calls of one token (decode) are kept apart from the others */
    int64_t calls, tokens;
    uint64_t wall_ns, busy_ns, cap_ns; /* cap: wall × threads of the rounds that measured busy */
};

int cpu_prof_on;
static struct cpu_prof_row cpu_prof_rows[CPU_PROF_ROWS];
static int cpu_prof_n;

void cpu_prof_init(void)
{
    const char *e = getenv("CAIRN_CPU_PROF");
    cpu_prof_on = e && *e && strcmp(e, "0") != 0;
}

uint64_t cpu_prof_now(void)
{
    return cpu_prof_on ? cairn_now_ns() : 0;
}

void cpu_prof_add(const char *kind, int64_t out, int64_t in, int count, int n, uint64_t t0,
                  uint64_t busy_ns, int nth)
{
    if (!cpu_prof_on) return;
    uint64_t dt = cairn_now_ns() - t0;
    struct cpu_prof_row *r = NULL;
    for (int i = 0; i < cpu_prof_n && !r; i++) {
        struct cpu_prof_row *c = &cpu_prof_rows[i];
        if (c->kind == kind && c->out == out && c->in == in && c->count == count &&
            c->one == (n == 1))
            r = c;
    }
    if (!r) {
        if (cpu_prof_n == CPU_PROF_ROWS) return;
        r = &cpu_prof_rows[cpu_prof_n++];
        *r = (struct cpu_prof_row){
            .kind = kind, .out = out, .in = in, .count = count, .one = n == 1};
    }
    r->calls++;
    r->tokens += n;
    r->wall_ns += dt;
    if (busy_ns) {
        r->busy_ns += busy_ns;
        r->cap_ns += dt * (uint64_t)nth;
    }
}

static int cpu_prof_cmp(const void *a, const void *b)
{
    const struct cpu_prof_row *x = a, *y = b;
    return x->wall_ns < y->wall_ns ? 1 : x->wall_ns > y->wall_ns ? -1 : 0;
}

void cpu_prof_report(void)
{
    if (!cpu_prof_on || cpu_prof_n == 0) return;
    qsort(cpu_prof_rows, (size_t)cpu_prof_n, sizeof(cpu_prof_rows[0]), cpu_prof_cmp);
    uint64_t total = 0;
    for (int i = 0; i < cpu_prof_n; i++)
        total += cpu_prof_rows[i].wall_ns;
    fprintf(stderr,
            "cpu prof: %.3f s in ops (n1: rows of one-token calls)\n%-12s %2s %6s %6s %2s %8s %9s "
            "%10s %6s %8s %6s\n",
            total * 1e-9, "op", "n1", "out", "in", "w", "calls", "tokens", "ms", "share", "us/tok",
            "idle");
    for (int i = 0; i < cpu_prof_n; i++) {
        const struct cpu_prof_row *r = &cpu_prof_rows[i];
        double idle = r->cap_ns ? 1.0 - (double)r->busy_ns / (double)r->cap_ns : 0;
        fprintf(stderr, "%-12s %2s %6lld %6lld %2d %8lld %9lld %10.2f %5.1f%% %8.3f %5.1f%%\n",
                r->kind, r->one ? "*" : "", (long long)r->out, (long long)r->in, r->count,
                (long long)r->calls, (long long)r->tokens, r->wall_ns * 1e-6,
                100.0 * (double)r->wall_ns / (double)total,
                r->tokens ? r->wall_ns * 1e-3 / (double)r->tokens : 0, 100.0 * idle);
    }
    cpu_prof_n = 0;
}
