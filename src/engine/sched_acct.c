/* The scheduler's accounting (engine.h's engine_sched_acct): each step's rows by kind, its time
 * before, in and after the forward, every step kept (summed by kind and by a log2 bucket of its
 * rows, never dropped), and the scheduler thread's time outside steps, so that a serving run's
 * wall time is covered whole: elapsed = idle + between + steps.
 *
 * Scheduler thread only (engine.acct); sched_publish_stats copies it into engine.stats under mu.
 * A step costs a few additions: always on. */
#include "base/file.h"
#include "engine/engine_int.h"

int engine_step_row_bucket(int rows)
{
    int b = 0;
    while (rows > 1 && b < ENGINE_STEP_ROW_BUCKETS - 1) {
        rows >>= 1;
        b++;
    }
    return b;
}

void engine_step_row_range(int bucket, int *lo, int *hi)
{
    *lo = 1 << bucket;
    *hi = bucket == ENGINE_STEP_ROW_BUCKETS - 1 ? -1 : (1 << (bucket + 1)) - 1; /* -1: no bound */
}

static void engine_acct_add(struct engine_step_sum *sum, int rows, int64_t ctx, double t_forward, double t_wall)
{
    sum->n_steps++;
    sum->n_rows += (uint64_t)rows;
    sum->n_ctx += (uint64_t)ctx;
    sum->forward_s += t_forward;
    sum->wall_s += t_wall;
}

void engine_acct_step(struct engine *e, const struct engine_step_rows *r, double t_pre, double t_forward,
                      double t_post)
{
    struct engine_sched_acct *a = &e->acct;
    int rows = r->n_decode + r->n_verify + r->n_prefill;
    enum engine_step_kind k = r->n_prefill == 0 ? ENGINE_STEP_DECODE
                              : r->n_decode + r->n_verify == 0 ? ENGINE_STEP_PREFILL
                                                                : ENGINE_STEP_MIXED;
    double wall = t_pre + t_forward + t_post;
    engine_acct_add(&a->kind[k], rows, r->n_ctx, t_forward, wall);
    engine_acct_add(&a->by_rows[engine_step_row_bucket(rows)], rows, r->n_ctx, t_forward, wall);
    if (rows < e->n_rows_seen && !(e->rows_seen[rows / 8] & (1u << (rows % 8)))) {
        e->rows_seen[rows / 8] |= (uint8_t)(1u << (rows % 8));
        engine_acct_add(&a->new_rows, rows, r->n_ctx, t_forward, wall);
    }
    a->t_steps_s += wall;
    a->t_pre_s += t_pre;
    a->t_post_s += t_post;
    a->n_rows_decode += (uint64_t)r->n_decode;
    a->n_rows_verify += (uint64_t)r->n_verify;
    a->n_rows_prefill += (uint64_t)r->n_prefill;
    a->n_rows_recomputed += (uint64_t)r->n_recomputed;
}

void engine_acct_publish(struct engine *e, struct engine_sched_acct *out)
{
    struct engine_sched_acct *a = &e->acct;
    a->t_elapsed_s = cairn_now() - e->t_sched_start;
    a->t_between_s = a->t_elapsed_s - a->t_idle_s - a->t_steps_s;
    if (a->t_between_s < 0) a->t_between_s = 0; /* clock granularity */
    a->growth_ratio = e->growth_ratio;
    *out = *a;
}
