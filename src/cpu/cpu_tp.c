/* Simulated tensor-parallel ranks on the CPU: the backend seam's allreduce as an in-process sum,
 * so the sharded forward pass (model/shard.h) can be proved on one machine exactly as a GPU rank
 * runs it, with host memory where NCCL would all-reduce.
 *
 * DESIGN
 * - A group (cpu_tp_group_create) holds `world` ranks; each rank is its own CPU backend
 *   (cpu_backend_open), joined with cpu_backend_tp_join, and its own model, driven by its own
 *   thread. The group must outlive its backends.
 * - The compute pool is process-wide and a step holds cpu_lock (cpu_backend.c). A rank that
 *   reaches an all-reduce therefore hands the pool over: it releases cpu_lock, waits at the
 *   group's barrier until every rank has posted its buffer, sums its own slice of the elements
 *   (rank order 0..world-1 for every element, so every rank gets the same bits), waits for the
 *   others' slices, then takes cpu_lock back. Ranks thus take turns on the pool between
 *   all-reduces; the ops themselves keep nothing in the pool across calls.
 * - A rank that does not come within CPU_TP_TIMEOUT_S (a test whose other rank failed) fails
 *   the group: every waiting rank latches CAIRN_ERR_INTERNAL, which step_end reports; later
 *   all-reduces of a failed group do nothing and latch the same error.
 *
 * Locking: cpu_tp_group.mu guards every field of the group; a member's fields belong to its
 * rank's thread. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"

#define CPU_TP_TIMEOUT_S 60

struct cpu_tp_member {
    struct cpu_tp_group *g;
    int rank;
    int status; /* latched error (CAIRN_OK: none), reported by step_end */
    char msg[160];
};

struct cpu_tp_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int world;
    int arrived;                   /* ranks at the current barrier */
    uint64_t generation;           /* barriers passed */
    int failed;                    /* a barrier timed out or sizes disagreed */
    float **bufs;                  /* [world] this all-reduce's buffers */
    int64_t *n;                    /* [world] their lengths */
    struct cpu_tp_member *members; /* [world] */
};

int cpu_tp_group_create(int world, struct cpu_tp_group **out, struct cairn_err *err)
{
    *out = NULL;
    if (world < 1 || world > 1024)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "cpu tp: world %d out of range", world);
    struct cpu_tp_group *g = calloc(1, sizeof(*g));
    if (g) {
        g->bufs = calloc((size_t)world, sizeof(*g->bufs));
        g->n = calloc((size_t)world, sizeof(*g->n));
        g->members = calloc((size_t)world, sizeof(*g->members));
    }
    if (!g || !g->bufs || !g->n || !g->members) {
        cpu_tp_group_free(g);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "cpu tp: out of memory");
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->world = world;
    for (int r = 0; r < world; r++) {
        g->members[r].g = g;
        g->members[r].rank = r;
    }
    *out = g;
    return CAIRN_OK;
}

void cpu_tp_group_free(struct cpu_tp_group *g)
{
    if (!g) return;
    if (g->members) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
    }
    free(g->bufs);
    free(g->n);
    free(g->members);
    free(g);
}

int cpu_backend_tp_join(struct backend *be, struct cpu_tp_group *g, int rank, struct cairn_err *err)
{
    if (!be || be->kind != BACKEND_CPU || !g || rank < 0 || rank >= g->world)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "cpu tp: cannot join rank %d of a group of %d",
                             rank, g ? g->world : 0);
    if (be->impl)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "cpu tp: %s is in a group already", be->name);
    be->impl = &g->members[rank];
    be->tp_rank = rank;
    be->tp_world = g->world;
    snprintf(be->name, sizeof(be->name), "cpu:tp%d/%d", rank, g->world);
    return CAIRN_OK;
}

/* Waits until every rank has arrived (g->mu held); 0 on success, -1 on timeout or a failed
 * group. */
static int cpu_tp_barrier(struct cpu_tp_group *g)
{
    if (g->failed) return -1;
    uint64_t gen = g->generation;
    if (++g->arrived == g->world) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
        return 0;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += CPU_TP_TIMEOUT_S;
    while (g->generation == gen && !g->failed)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT) {
            g->failed = 1;
            pthread_cond_broadcast(&g->cv);
        }
    return g->failed ? -1 : 0;
}

static void cpu_tp_latch(struct cpu_tp_member *me, const char *what)
{
    if (me->status != CAIRN_OK) return;
    me->status = CAIRN_ERR_INTERNAL;
    snprintf(me->msg, sizeof(me->msg), "cpu tp rank %d of %d: all-reduce failed: %s", me->rank,
             me->g->world, what);
}

void cpu_tp_allreduce(struct backend *be, float *buf, int64_t n)
{
    struct cpu_tp_member *me = be->impl;
    if (!me || me->g->world <= 1) return;
    struct cpu_tp_group *g = me->g;
    cpu_unlock(); /* hand the pool to the other ranks (DESIGN) */
    pthread_mutex_lock(&g->mu);
    g->bufs[me->rank] = buf;
    g->n[me->rank] = n;
    int ok = cpu_tp_barrier(g) == 0;
    for (int r = 0; ok && r < g->world; r++)
        if (g->n[r] != n) {
            g->failed = 1; /* every rank sees the mismatch and fails alike */
            ok = 0;
        }
    pthread_mutex_unlock(&g->mu);
    if (ok) {
        /* this rank's slice of the elements; the others' slices are disjoint */
        int64_t lo = n * me->rank / g->world, hi = n * (me->rank + 1) / g->world;
        for (int64_t i = lo; i < hi; i++) {
            float s = 0.0f;
            for (int r = 0; r < g->world; r++)
                s += g->bufs[r][i];
            for (int r = 0; r < g->world; r++)
                g->bufs[r][i] = s;
        }
        pthread_mutex_lock(&g->mu);
        ok = cpu_tp_barrier(g) == 0;
        pthread_mutex_unlock(&g->mu);
    }
    if (!ok) cpu_tp_latch(me, "a rank did not come, or the ranks' sizes differ");
    cpu_lock();
}

int cpu_tp_take_error(struct backend *be, struct cairn_err *err)
{
    struct cpu_tp_member *me = be->impl;
    if (!me || me->status == CAIRN_OK) return CAIRN_OK;
    int rc = cairn_err_set(err, me->status, "%s", me->msg);
    me->status = CAIRN_OK;
    return rc;
}
