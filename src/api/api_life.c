/* The API object's life: api_create (copies the config, starts the worker thread of api_call.c),
 * api_shutdown_begin (cancels every running choice), api_tick (stream keep-alives) and
 * api_destroy (joins the worker, waits for the preparing threads, then lets the backend deliver
 * the last DONE events). The calls themselves live in api_call.c. */
#include "api/api_int.h"

#include <stdlib.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"

void api_shutdown_begin(struct api *a)
{
    struct api_cancel_id {
        int model;
        uint64_t id;
    };
    pthread_mutex_lock(&a->mu);
    __atomic_store_n(&a->shutting_down, 1, __ATOMIC_RELEASE);
    /* Cancel everything running; DONE(CANCELLED) then writes the error events. Cancel must not
     * run under the locks: the ids are collected first, every one of them (any number of calls
     * and choices; a fixed array only if even that allocation fails). */
    int cap = 0;
    for (struct api_call *c = a->active; c; c = c->next) cap += c->n_subs;
    struct api_cancel_id spare[64];
    struct api_cancel_id *todo = cap > (int)CAIRN_ARRAY_LEN(spare) ? malloc((size_t)cap * sizeof(*todo)) : NULL;
    if (!todo) {
        if (cap > (int)CAIRN_ARRAY_LEN(spare))
            LOG_ERROR("api", "out of memory at shutdown: cancelling the first %zu of %d requests",
                      CAIRN_ARRAY_LEN(spare), cap);
        todo = spare;
        if (cap > (int)CAIRN_ARRAY_LEN(spare)) cap = (int)CAIRN_ARRAY_LEN(spare);
    }
    int n = 0;
    for (struct api_call *c = a->active; c; c = c->next) {
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < c->n_subs && n < cap; i++)
            if (c->subs[i].submitted && !c->subs[i].done) {
                todo[n].model = c->model_idx;
                todo[n].id = c->subs[i].engine_id;
                n++;
            }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < n; i++) a->be.cancel(a->be.ctx, todo[i].model, todo[i].id);
    if (todo != spare) free(todo);
}

void api_tick(struct api *a)
{
    double now = cairn_now();
    double ka = (a->cfg.keepalive_ms > 0 ? a->cfg.keepalive_ms : 5000) / 1000.0;
    pthread_mutex_lock(&a->mu);
    for (struct api_call *c = a->active; c; c = c->next) {
        pthread_mutex_lock(&c->mu);
        if (c->streaming && c->ready && !c->done && !c->http_gone && now - c->last_out >= ka) {
            api_emit_keepalive(c);
            c->last_out = now;
            api_call_notify(c);
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&a->mu);
}

static void api_opts_free(struct api *a)
{
    for (int i = 0; i < a->cfg.n_model_opts; i++) free((char *)a->opts_copy[i].id);
    free(a->opts_copy);
}

int api_create(const struct api_config *cfg, const struct api_backend *backend, struct api **out,
               struct cairn_err *err)
{
    struct api *a = calloc(1, sizeof(*a));
    if (!a) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    if (cfg) a->cfg = *cfg;
    if (a->cfg.n_model_opts > 0 && a->cfg.model_opts) {
        a->opts_copy = calloc((size_t)a->cfg.n_model_opts, sizeof(*a->opts_copy));
        if (!a->opts_copy) {
            free(a);
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        }
        for (int i = 0; i < a->cfg.n_model_opts; i++) {
            a->opts_copy[i] = a->cfg.model_opts[i];
            a->opts_copy[i].id = cairn_xstrdup(a->cfg.model_opts[i].id ? a->cfg.model_opts[i].id : "");
        }
        a->cfg.model_opts = a->opts_copy;
    } else {
        a->cfg.model_opts = NULL;
        a->cfg.n_model_opts = 0;
    }
    a->be = *backend;
    a->id_salt = cairn_now_ns() ^ ((uint64_t)getpid() << 32);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->worker, NULL, api_worker_main, a) != 0) {
        api_opts_free(a);
        free(a);
        return cairn_err_set(err, CAIRN_ERR_INTERNAL, "cannot start the API worker thread");
    }
    a->worker_started = 1;
    *out = a;
    return CAIRN_OK;
}

void api_destroy(struct api *a)
{
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop_worker = 1;
    __atomic_store_n(&a->shutting_down, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (a->worker_started) pthread_join(a->worker, NULL);
    pthread_mutex_lock(&a->mu);
    while (a->n_preparing > 0) pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    api_admin_bench_free(a); /* its request goes through the backend: before it goes */
    /* The backend delivers DONE for whatever is left, which drops the calls' references. */
    if (a->be.destroy) a->be.destroy(a->be.ctx);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    api_opts_free(a);
    free(a);
}
