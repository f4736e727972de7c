/* A model sharded over a tensor-parallel group: loading every rank and running a function on
 * all of them at once (see model_tp.h). */
#include "model/model_tp.h"

#include <pthread.h>
#include <stdlib.h>

int model_tp_load(const char *dir, struct backend_tp *g, struct model_tp **out,
                  struct cairn_err *err)
{
    *out = NULL;
    struct model_tp *t = calloc(1, sizeof(*t));
    if (!t) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    t->world = g->world;
    for (int r = 0; r < g->world; r++) {
        int rc = model_load_shard(dir, g->bes[r], r, g->world, &t->ranks[r], err);
        if (rc != CAIRN_OK) {
            model_tp_free(t);
            return rc;
        }
    }
    *out = t;
    return CAIRN_OK;
}

void model_tp_free(struct model_tp *t)
{
    if (!t) return;
    for (int r = 0; r < t->world; r++)
        model_free(t->ranks[r]);
    free(t);
}

struct model_tp_job {
    struct model *m;
    int rank;
    model_tp_fn fn;
    void *ctx;
    int rc;
    struct cairn_err err;
};

static void *model_tp_thread(void *arg)
{
    struct model_tp_job *j = arg;
    j->rc = j->fn(j->m, j->rank, j->ctx, &j->err);
    return NULL;
}

int model_tp_run(struct model_tp *t, model_tp_fn fn, void *ctx, struct cairn_err *err)
{
    struct model_tp_job jobs[BACKEND_TP_MAX] = {0};
    pthread_t th[BACKEND_TP_MAX];
    int started = 0, rc = CAIRN_OK;
    for (int r = 0; r < t->world; r++) {
        jobs[r] = (struct model_tp_job){.m = t->ranks[r], .rank = r, .fn = fn, .ctx = ctx};
        if (pthread_create(&th[r], NULL, model_tp_thread, &jobs[r]) != 0) {
            /* the started ranks' all-reduces time out (their backend's bounded wait) */
            rc = cairn_err_set(err, CAIRN_ERR_INTERNAL,
                               "tensor parallel: cannot start the thread of rank %d", r);
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < started && rc == CAIRN_OK; r++)
        if (jobs[r].rc != CAIRN_OK) {
            rc = jobs[r].rc;
            if (err) *err = jobs[r].err;
        }
    return rc;
}
