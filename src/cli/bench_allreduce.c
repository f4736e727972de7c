/* cairn bench --allreduce HIDDEN --tensor-parallel N [-p ROWS] [-n ITERS] [--reps R] [--device D]
 * [--json]: the time of one tensor-parallel all-reduce of [ROWS, HIDDEN] f32 (what a sharded
 * layer sums twice: after the mixer and after the FFN, model/shard.h) over the ranks of a group,
 * through the backend seam's allreduce op (NCCL on GPUs 0..N-1, the in-process sum of simulated
 * CPU ranks). Each rank runs on its own thread: per rep one step of ITERS all-reduces, after one
 * untimed warm-up step; rank 0 times them (the collective makes its time the group's). Reports
 * the median and best microseconds per all-reduce, the per-layer cost (2 x), and the bus
 * bandwidth as NCCL's tests define it (2 (N-1) / N x bytes / time). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/mem.h"
#include "cli/cli.h"

struct bench_ar_rank {
    struct backend *be;
    int64_t n;
    int iters, reps;
    double *secs; /* [reps], rank 0 only */
    int rc;
    struct cairn_err err;
};

static int bench_ar_step(struct bench_ar_rank *a, float *buf, int iters, struct cairn_err *err)
{
    int rc = a->be->ops->step_begin(a->be, err);
    if (rc != CAIRN_OK) return rc;
    for (int i = 0; i < iters; i++)
        a->be->ops->allreduce(a->be, buf, a->n);
    return a->be->ops->step_end(a->be, err);
}

static void *bench_ar_main(void *arg)
{
    struct bench_ar_rank *a = arg;
    size_t bytes = (size_t)a->n * sizeof(float);
    void *buf = NULL;
    a->rc = a->be->ops->buf_alloc(a->be, bytes, CAIRN_MEM_SCRATCH, &buf, &a->err);
    if (a->rc == CAIRN_OK) a->rc = bench_ar_step(a, buf, a->iters, &a->err); /* warm-up */
    for (int r = 0; r < a->reps && a->rc == CAIRN_OK; r++) {
        double t0 = cairn_now();
        a->rc = bench_ar_step(a, buf, a->iters, &a->err);
        if (a->secs) a->secs[r] = cairn_now() - t0;
    }
    if (buf) a->be->ops->buf_free(a->be, buf, bytes, CAIRN_MEM_SCRATCH);
    return NULL;
}

static int bench_ar_cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int bench_allreduce(const char *device, int world, int hidden, int rows, int iters, int reps,
                    int json)
{
    if (hidden < 1 || rows < 1 || iters < 1 || reps < 1) {
        fprintf(stderr, "cairn bench: --allreduce: sizes and counts must be positive\n");
        return 2;
    }
    struct backend_tp *tp = NULL;
    struct cairn_err err = {0};
    if (backend_tp_open(device, world, &tp, &err) != CAIRN_OK) {
        fprintf(stderr, "cairn bench: --allreduce --tensor-parallel %d --device %s: %s\n", world,
                device, err.msg);
        return 2;
    }
    struct bench_ar_rank ranks[BACKEND_TP_MAX];
    pthread_t th[BACKEND_TP_MAX];
    double *secs = cairn_xcalloc((size_t)reps, sizeof(double));
    int started = 0, rc = 0;
    for (int r = 0; r < world; r++) {
        ranks[r] = (struct bench_ar_rank){.be = tp->bes[r],
                                          .n = (int64_t)hidden * rows,
                                          .iters = iters,
                                          .reps = reps,
                                          .secs = r == 0 ? secs : NULL};
        if (!tp->bes[r]->ops->allreduce) {
            fprintf(stderr, "cairn bench: %s has no all-reduce\n", tp->bes[r]->name);
            rc = 1;
            break;
        }
        if (pthread_create(&th[r], NULL, bench_ar_main, &ranks[r]) != 0) {
            fprintf(stderr, "cairn bench: cannot start the thread of rank %d\n", r);
            rc = 1; /* the started ranks' all-reduces time out (bounded) */
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < started && !rc; r++)
        if (ranks[r].rc != CAIRN_OK) {
            fprintf(stderr, "cairn bench: --allreduce: rank %d: %s\n", r, ranks[r].err.msg);
            rc = 1;
        }
    if (!rc) {
        qsort(secs, (size_t)reps, sizeof(double), bench_ar_cmp);
        double med =
            (reps % 2 ? secs[reps / 2] : 0.5 * (secs[reps / 2 - 1] + secs[reps / 2])) / iters;
        double best = secs[0] / iters;
        double bytes = (double)hidden * rows * sizeof(float);
        double bus = world > 1 ? 2.0 * (world - 1) / world * bytes / med / 1e9 : 0;
        if (json)
            printf("{\"mode\": \"allreduce\", \"device\": \"%s\", \"tensor_parallel\": %d, "
                   "\"hidden\": %d, \"rows\": %d, "
                   "\"iters\": %d, \"reps\": %d, \"us_median\": %.2f, \"us_best\": %.2f, "
                   "\"us_per_layer_median\": %.2f, "
                   "\"bus_gbs_median\": %.2f}\n",
                   tp->bes[0]->name, world, hidden, rows, iters, reps, med * 1e6, best * 1e6,
                   2e6 * med, bus);
        else
            printf("all-reduce of [%d, %d] f32 (%.1f KiB) over %d ranks (%s): median %.2f us, best "
                   "%.2f us per call; "
                   "%.2f us per layer (2 per layer); bus bandwidth %.2f GB/s (median)\n",
                   rows, hidden, bytes / 1024.0, world, tp->bes[0]->name, med * 1e6, best * 1e6,
                   2e6 * med, bus);
    }
    free(secs);
    backend_tp_close(tp);
    return rc;
}
