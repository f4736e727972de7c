/* Requests through the model pool: admission by the memory guard (start, park, or 507), the
 * engine callback that gives the memory back, parked requests, cancel; and the JSON views of
 * models and memory for /api/status and the admin API. See pool.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include "api/pool_int.h"
#include "base/file.h"
#include "base/log.h"

struct pool_req {
    struct pool *p;
    int idx;                      /* model */
    uint64_t id;                  /* what the API sees */
    uint64_t engine_id;
    int parked;                   /* waiting for memory: the copy below is live */
    int n_prompt;
    engine_event_fn on_event;
    void *user;
    struct engine_guard_hold hold;
    double deadline;              /* parked: when it gives up */
    uint64_t need;                /* parked: bytes it waits for */
    int cancelled;                /* parked: the pool thread ends it (DONE, cancelled) */
    struct engine_request req;    /* parked: deep copy (prompt, stops, logit bias) */
    struct pool_req *next, *prev; /* pool->reqs, under pool->mu */
};

/* ---- detokenizer ---- */

static void *pool_detok_new(void *ctx)
{
    return tok_stream_new((const struct tok *)ctx, 1);
}
static int pool_detok_feed(void *s, int32_t id, const char **text, size_t *len)
{
    return tok_stream_feed((struct tok_stream *)s, id, text, len);
}
static int pool_detok_flush(void *s, const char **text, size_t *len)
{
    return tok_stream_flush((struct tok_stream *)s, text, len);
}
static void pool_detok_free(void *s)
{
    tok_stream_free((struct tok_stream *)s);
}

void pool_detok_opts(struct pool_model *m, struct engine_opts *o)
{
    o->detok.ctx = m->tok;
    o->detok.stream_new = pool_detok_new;
    o->detok.stream_feed = pool_detok_feed;
    o->detok.stream_flush = pool_detok_flush;
    o->detok.stream_free = pool_detok_free;
}

/* ---- the request list ---- */

static void pool_req_link(struct pool *p, struct pool_req *r)
{
    r->prev = NULL;
    r->next = p->reqs;
    if (p->reqs) p->reqs->prev = r;
    p->reqs = r;
}

static void pool_req_unlink(struct pool *p, struct pool_req *r)
{
    if (r->prev) r->prev->next = r->next;
    else p->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    r->next = r->prev = NULL;
}

static void pool_req_copy_free(struct pool_req *r)
{
    free((void *)r->req.prompt);
    free((void *)r->req.stop_ids);
    for (int i = 0; i < r->req.n_stop; i++) free((void *)r->req.stop[i]);
    free((void *)r->req.stop);
    free((void *)r->req.sampling.logit_bias);
    memset(&r->req, 0, sizeof(r->req));
}

/* Deep copy of what engine_submit would copy, for a parked request. */
static int pool_req_copy(struct pool_req *r, const struct engine_request *q)
{
    r->req = *q;
    r->req.prompt = NULL;
    r->req.stop_ids = NULL;
    r->req.stop = NULL;
    r->req.n_stop = 0;
    r->req.sampling.logit_bias = NULL;
    int32_t *pr = malloc((size_t)(q->n_prompt > 0 ? q->n_prompt : 1) * sizeof(int32_t));
    int32_t *si = malloc((size_t)(q->n_stop_ids > 0 ? q->n_stop_ids : 1) * sizeof(int32_t));
    char **st = calloc((size_t)(q->n_stop > 0 ? q->n_stop : 1), sizeof(char *));
    struct engine_logit_bias *lb = malloc((size_t)(q->sampling.n_logit_bias > 0 ? q->sampling.n_logit_bias : 1) * sizeof(*lb));
    r->req.prompt = pr;
    r->req.stop_ids = si;
    r->req.stop = (const char *const *)st;
    r->req.sampling.logit_bias = lb;
    if (!pr || !si || !st || !lb) return CAIRN_ERR_NOMEM;
    if (q->n_prompt > 0) memcpy(pr, q->prompt, (size_t)q->n_prompt * sizeof(int32_t));
    if (q->n_stop_ids > 0) memcpy(si, q->stop_ids, (size_t)q->n_stop_ids * sizeof(int32_t));
    if (q->sampling.n_logit_bias > 0) memcpy(lb, q->sampling.logit_bias, (size_t)q->sampling.n_logit_bias * sizeof(*lb));
    for (int i = 0; i < q->n_stop; i++) {
        st[i] = strdup(q->stop[i]);
        r->req.n_stop = i + 1;
        if (!st[i]) return CAIRN_ERR_NOMEM;
    }
    return CAIRN_OK;
}

/* DONE for a request that never reached the engine (parked). Without pool->mu. */
static void pool_req_done_here(struct pool_req *r, enum engine_finish fin, int code, const char *msg)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = ENGINE_EVENT_DONE;
    ev.request_id = r->id;
    ev.finish = fin;
    ev.stop_token = -1;
    ev.error = msg;
    ev.error_code = code;
    ev.usage.prompt_tokens = r->n_prompt;
    r->on_event(r->user, &ev);
    pool_req_copy_free(r);
    free(r);
}

static void pool_kick(struct pool *p);

static void pool_on_event(void *user, const struct engine_event *ev)
{
    struct pool_req *r = user;
    if (ev->kind != ENGINE_EVENT_DONE) {
        r->on_event(r->user, ev);
        return;
    }
    struct pool *p = r->p;
    engine_guard_release(p->guard, &r->hold);
    pthread_mutex_lock(&p->mu);
    pool_req_unlink(p, r);
    struct pool_model *m = &p->models[r->idx];
    m->n_active--;
    m->last_used = cairn_now();
    pthread_cond_signal(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    struct engine_event e2 = *ev;
    e2.request_id = r->id;
    r->on_event(r->user, &e2);
    free(r);
    pool_kick(p);
}

/* engine_submit through the pool's callback. Under pool->mu. */
static int pool_req_start(struct pool *p, struct pool_req *r, const struct engine_request *q,
                          struct cairn_err *err)
{
    struct engine_request er = *q;
    er.on_event = pool_on_event;
    er.user = r;
    return engine_submit(p->models[r->idx].e, &er, &r->engine_id, err);
}

/* Starts parked requests in arrival order while they fit. Under pool->mu; requests whose
 * engine_submit failed are moved to *failed (to be ended without the lock). */
static int pool_parked_try(struct pool *p, struct pool_req **failed)
{
    int n = 0;
    while (p->n_parked > 0 && !p->stopping) {
        struct pool_req *oldest = NULL;
        for (struct pool_req *r = p->reqs; r; r = r->next)
            if (r->parked && !r->cancelled && (!oldest || r->id < oldest->id)) oldest = r;
        if (!oldest) break;
        struct pool_model *m = &p->models[oldest->idx];
        uint64_t need[CAIRN_MEM_N_TAGS];
        engine_guard_request_need(engine_model_info(m->e), ENGINE_DEFAULT_BLOCK_SIZE,
                                  (int)oldest->req.max_tokens + oldest->n_prompt, need);
        if (engine_guard_reserve(p->guard, &oldest->hold, need, NULL, NULL) != CAIRN_OK) break;
        oldest->parked = 0;
        p->n_parked--;
        struct cairn_err err = {0};
        if (pool_req_start(p, oldest, &oldest->req, &err) != CAIRN_OK) {
            engine_guard_release(p->guard, &oldest->hold);
            pool_req_unlink(p, oldest);
            m->n_active--;
            snprintf(oldest->hold.owner, sizeof(oldest->hold.owner), "%.120s", err.msg); /* the message */
            oldest->next = *failed;
            *failed = oldest;
        } else {
            pool_req_copy_free(oldest);
        }
        n++;
    }
    return n;
}

static void pool_end_failed(struct pool_req *failed)
{
    while (failed) {
        struct pool_req *r = failed;
        failed = r->next;
        pool_req_done_here(r, ENGINE_FINISH_ERROR, CAIRN_ERR_INTERNAL, r->hold.owner);
    }
}

static void pool_kick(struct pool *p)
{
    struct pool_req *failed = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->n_parked) pool_parked_try(p, &failed);
    pthread_mutex_unlock(&p->mu);
    pool_end_failed(failed);
}

int pool_parked_step(struct pool *p)
{
    if (!p->n_parked) return 0;
    struct pool_req *failed = NULL, *late = NULL;
    int changed = 0;
    double now = cairn_now();
    /* cancelled and out of time first: they must not make anyone evict */
    for (struct pool_req *r = p->reqs, *nx; r; r = nx) {
        nx = r->next;
        if (!r->parked || (now < r->deadline && !r->cancelled)) continue;
        pool_req_unlink(p, r);
        p->n_parked--;
        p->models[r->idx].n_active--;
        r->next = late;
        late = r;
        changed = 1;
    }
    if (pool_parked_try(p, &failed) > 0) changed = 1;
    else if (p->n_parked && pool_evict_for_parked(p)) changed = 1;
    if (failed || late) {
        pthread_mutex_unlock(&p->mu);
        pool_end_failed(failed);
        while (late) {
            struct pool_req *r = late;
            late = r->next;
            if (r->cancelled) {
                pool_req_done_here(r, ENGINE_FINISH_CANCELLED, 0, NULL);
                continue;
            }
            char msg[400];
            snprintf(msg, sizeof(msg), "insufficient memory: the request waited %.0f s for %llu bytes and memory did "
                     "not free up (raise --max-process-memory, lower max_tokens, or unload models)",
                     p->opts.memory_wait_s > 0 ? p->opts.memory_wait_s : 60,
                     (unsigned long long)r->need);
            pool_req_done_here(r, ENGINE_FINISH_ERROR, CAIRN_ERR_NOMEM, msg);
        }
        pthread_mutex_lock(&p->mu);
    }
    return changed;
}

void pool_reqs_cancel_all(struct pool *p)
{
    struct pool_req *list = NULL;
    pthread_mutex_lock(&p->mu);
    for (struct pool_req *r = p->reqs, *nx; r; r = nx) {
        nx = r->next;
        if (!r->parked) continue;
        pool_req_unlink(p, r);
        p->n_parked--;
        p->models[r->idx].n_active--;
        r->next = list;
        list = r;
    }
    pthread_mutex_unlock(&p->mu);
    while (list) {
        struct pool_req *r = list;
        list = r->next;
        pool_req_done_here(r, ENGINE_FINISH_CANCELLED, 0, NULL);
    }
}

/* ---- submit / cancel ---- */

/* Bytes that waiting could give back: transient holds and every loaded, unpinned model other
 * than idx (busy ones become idle, then evictable). Under pool->mu. */
static uint64_t pool_freeable(struct pool *p, int idx, uint64_t transient)
{
    uint64_t n = transient;
    for (int i = 0; i < p->n_models; i++)
        if (i != idx && p->models[i].state == POOL_LOADED && !pool_pinned(p, i))
            n += engine_guard_hold_total(&p->models[i].hold);
    return n;
}

int pool_submit(struct pool *p, int idx, const struct engine_request *q, uint64_t *id,
                struct cairn_err *err)
{
    struct pool_model *m = &p->models[idx];
    const struct model_info *mi = engine_model_info(m->e);
    int ctx = m->context_length;
    long cap = q->max_tokens ? (long)q->n_prompt + q->max_tokens : ctx;
    if (cap > ctx) cap = ctx;
    uint64_t need[CAIRN_MEM_N_TAGS];
    engine_guard_request_need(mi, ENGINE_DEFAULT_BLOCK_SIZE, (int)cap, need);
    struct pool_req *r = calloc(1, sizeof(*r));
    if (!r) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    r->p = p;
    r->idx = idx;
    r->on_event = q->on_event;
    r->user = q->user;
    r->n_prompt = q->n_prompt;
    int rc;
    pthread_mutex_lock(&p->mu);
    r->id = p->next_req_id++;
    char owner[300];
    snprintf(owner, sizeof(owner), "request %llu (%s)", (unsigned long long)r->id, m->id);
    engine_guard_hold_init(&r->hold, owner, 1);
    struct engine_guard_deny deny;
    struct cairn_err gerr = {0};
    if (engine_guard_reserve(p->guard, &r->hold, need, &deny, &gerr) == CAIRN_OK) {
        rc = pool_req_start(p, r, q, err);
        if (rc) engine_guard_release(p->guard, &r->hold);
    } else {
        uint64_t freeable = pool_freeable(p, idx, deny.transient);
        if (deny.need > deny.available + freeable) {
            p->n_rejected_507++;
            rc = cairn_err_set(err, CAIRN_ERR_NOMEM,
                               "insufficient memory: this request needs %llu bytes (recurrent state %llu, token and "
                               "sampler buffers %llu) and %llu of the %llu-byte --max-process-memory are available; "
                               "waiting could free at most %llu more: lower max_tokens, raise --max-process-memory, "
                               "or unload or unpin models",
                               (unsigned long long)deny.need, (unsigned long long)need[CAIRN_MEM_STATE],
                               (unsigned long long)need[CAIRN_MEM_REQUEST], (unsigned long long)deny.available,
                               (unsigned long long)deny.limit, (unsigned long long)freeable);
        } else {
            rc = pool_req_copy(r, q);
            if (rc) {
                rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            } else {
                r->req.max_tokens = (int)cap - q->n_prompt; /* what the hold was sized for */
                r->parked = 1;
                r->need = deny.need;
                r->deadline = cairn_now() + (p->opts.memory_wait_s > 0 ? p->opts.memory_wait_s : 60);
                p->n_parked++;
                p->n_parked_total++;
                pthread_cond_signal(&p->cv_work);
                LOG_DEBUG("pool", "request %llu for %s waits for memory: %s", (unsigned long long)r->id, m->id, gerr.msg);
            }
        }
    }
    if (rc == CAIRN_OK) {
        pool_req_link(p, r);
        m->n_active++;
        m->last_used = cairn_now();
        *id = r->id;
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        pool_req_copy_free(r);
        free(r);
    }
    return rc;
}

void pool_cancel(struct pool *p, int idx, uint64_t id)
{
    pthread_mutex_lock(&p->mu);
    struct pool_req *r = p->reqs;
    while (r && r->id != id) r = r->next;
    if (!r) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (!r->parked) {
        engine_cancel(p->models[r->idx].e, r->engine_id);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    /* its DONE comes from the pool thread, as an engine's would from its own: the caller may
     * hold the lock its callback takes */
    r->cancelled = 1;
    pthread_cond_signal(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
}

/* ---- JSON views ---- */

static json_t *pool_bytes_json(const uint64_t *bytes)
{
    json_t *o = json_object();
    uint64_t total = 0;
    for (int t = 0; t < CAIRN_MEM_N_TAGS; t++) {
        total += bytes[t];
        if (bytes[t]) json_object_set_new(o, cairn_mem_tag_name((enum cairn_mem_tag)t), json_integer((json_int_t)bytes[t]));
    }
    json_object_set_new(o, "total", json_integer((json_int_t)total));
    return o;
}

json_t *pool_model_json(struct pool *p, int idx)
{
    struct pool_model *m = &p->models[idx];
    pthread_mutex_lock(&p->mu);
    double now = cairn_now(), wall = (double)time(NULL);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(m->id));
    char failure[sizeof(m->failure)];
    int failed = pool_model_failure(p, idx, failure, sizeof(failure));
    json_object_set_new(o, "state", json_string(failed ? "failed" : pool_state_name(m->state)));
    if (failed) json_object_set_new(o, "failure", json_string(failure));
    if (m->state == POOL_LOADING) {
        const char *ph = __atomic_load_n(&m->phase, __ATOMIC_RELAXED);
        uint64_t done = __atomic_load_n(&m->progress.bytes_done, __ATOMIC_RELAXED);
        uint64_t total = __atomic_load_n(&m->progress.bytes_total, __ATOMIC_RELAXED);
        /* percent: bytes of weights prepared / their total; 0 until the files are open */
        double pct = total ? 100.0 * (double)done / (double)total : 0.0;
        json_object_set_new(o, "progress", json_pack("{s:s,s:f,s:I,s:I,s:f}", "phase", ph ? ph : "queued", "elapsed_s",
                                                     now - m->t_state, "bytes_done", (json_int_t)done, "bytes_total",
                                                     (json_int_t)total, "percent", pct));
    }
    json_object_set_new(o, "memory", pool_bytes_json(m->hold.bytes));
    if (p->dguard) json_object_set_new(o, "device_memory", pool_bytes_json(m->dhold.bytes));
    if (m->state != POOL_LOADED) {
        uint64_t est[CAIRN_MEM_N_TAGS], dest[CAIRN_MEM_N_TAGS];
        pool_load_estimate(p, idx, est, dest);
        json_object_set_new(o, "memory_estimate", pool_bytes_json(est));
        if (p->dguard) json_object_set_new(o, "device_memory_estimate", pool_bytes_json(dest));
    }
    json_object_set_new(o, "pinned", json_boolean(pool_pinned(p, idx)));
    json_object_set_new(o, "ttl", json_real(pool_ttl(p, idx)));
    json_t *alias = json_object_get(json_object_get(json_object_get(p->settings, "models"), m->id), "alias");
    json_object_set_new(o, "alias", alias ? json_incref(alias) : json_null());
    json_object_set_new(o, "last_used", m->last_used > 0 ? json_integer((json_int_t)(wall - (now - m->last_used))) : json_null());
    int parked = 0;
    for (struct pool_req *r = p->reqs; r; r = r->next) parked += r->idx == idx && r->parked;
    struct engine_stats st;
    memset(&st, 0, sizeof(st));
    if (m->state == POOL_LOADED) engine_get_stats(m->e, &st);
    json_object_set_new(o, "running_requests", json_integer(st.n_running));
    json_object_set_new(o, "queued_requests", json_integer(st.n_waiting + parked));
    json_object_set_new(o, "waiting_for_memory", json_integer(parked));
    json_object_set_new(o, "context_length", json_integer(m->state == POOL_LOADED ? m->context_length : 0));
    json_object_set_new(o, "loads", json_integer((json_int_t)m->n_loads));
    if (m->n_loads) json_object_set_new(o, "load_s", json_real(m->load_s));
    if (m->load_error[0]) json_object_set_new(o, "last_error", json_string(m->load_error));
    pthread_mutex_unlock(&p->mu);
    return o;
}

struct pool_holds_ctx {
    json_t *arr;
};

static void pool_hold_json(void *user, const struct engine_guard_hold *h)
{
    struct pool_holds_ctx *c = user;
    json_t *o = pool_bytes_json(h->bytes);
    json_object_set_new(o, "owner", json_string(h->owner));
    json_array_append_new(c->arr, o);
}

/* One budget: its limit, what is reserved (by category) and the holders. */
static json_t *pool_budget_json(struct engine_guard *g)
{
    struct engine_guard_stats st;
    engine_guard_get_stats(g, &st);
    json_t *o = json_object();
    json_object_set_new(o, "domain", json_string(cairn_mem_domain_name(st.domain)));
    json_object_set_new(o, "limit", json_integer((json_int_t)st.limit));
    json_object_set_new(o, "reserved", json_integer((json_int_t)st.reserved));
    json_object_set_new(o, "available", json_integer((json_int_t)(st.limit > st.reserved ? st.limit - st.reserved : 0)));
    json_object_set_new(o, "by_category", pool_bytes_json(st.by_cat));
    struct pool_holds_ctx c = {json_array()};
    engine_guard_foreach(g, pool_hold_json, &c);
    json_object_set_new(o, "holders", c.arr);
    json_object_set_new(o, "denied_total", json_integer((json_int_t)st.n_denied));
    return o;
}

json_t *pool_memory_json(struct pool *p)
{
    struct engine_guard_stats st;
    engine_guard_get_stats(p->guard, &st);
    json_t *o = json_object();
    /* the device budget (GPU backends): the same fields as the host's at the top level */
    if (p->dguard) json_object_set_new(o, "device", pool_budget_json(p->dguard));
    json_object_set_new(o, "domain", json_string(cairn_mem_domain_name(st.domain)));
    json_object_set_new(o, "limit", json_integer((json_int_t)st.limit));
    json_object_set_new(o, "reserved", json_integer((json_int_t)st.reserved));
    json_object_set_new(o, "available", json_integer((json_int_t)(st.limit > st.reserved ? st.limit - st.reserved : 0)));
    json_object_set_new(o, "by_category", pool_bytes_json(st.by_cat));
    json_object_set_new(o, "requests_reserved", json_integer((json_int_t)st.transient));
    struct pool_holds_ctx c = {json_array()};
    engine_guard_foreach(p->guard, pool_hold_json, &c);
    json_object_set_new(o, "holders", c.arr);
    json_object_set_new(o, "denied_total", json_integer((json_int_t)st.n_denied));
    pthread_mutex_lock(&p->mu);
    json_object_set_new(o, "waiting_for_memory", json_integer(p->n_parked));
    json_object_set_new(o, "waited_total", json_integer((json_int_t)p->n_parked_total));
    json_object_set_new(o, "rejected_total", json_integer((json_int_t)p->n_rejected_507));
    json_object_set_new(o, "evictions_total", json_integer((json_int_t)p->n_evictions));
    json_object_set_new(o, "ttl_unloads_total", json_integer((json_int_t)p->n_ttl_unloads));
    json_object_set_new(o, "max_loaded_models", json_integer(p->opts.max_loaded_models));
    pthread_mutex_unlock(&p->mu);
    json_t *alloc = json_object();
    for (int d = 0; d < CAIRN_MEM_N_DOMAINS; d++) {
        uint64_t b[CAIRN_MEM_N_TAGS];
        for (int t = 0; t < CAIRN_MEM_N_TAGS; t++) b[t] = cairn_mem_used_in((enum cairn_mem_domain)d, (enum cairn_mem_tag)t);
        json_object_set_new(alloc, cairn_mem_domain_name((enum cairn_mem_domain)d), pool_bytes_json(b));
    }
    json_object_set_new(o, "allocated", alloc);
    /* the lower KV tiers' configuration (per model budgets) and the SSD folder's disk */
    const struct kv_tiers_opts *to = p->opts.tiers_opts;
    if (to) {
        json_t *t = json_pack("{s:I,s:s?,s:I}", "hot_max_bytes", (json_int_t)to->hot_max_bytes, "ssd_dir",
                              to->ssd_dir && *to->ssd_dir ? to->ssd_dir : NULL, "ssd_max_bytes", (json_int_t)to->ssd_max_bytes);
        struct statvfs vf;
        if (t && to->ssd_dir && *to->ssd_dir && statvfs(to->ssd_dir, &vf) == 0) {
            json_object_set_new(t, "ssd_disk_bytes", json_integer((json_int_t)((uint64_t)vf.f_blocks * vf.f_frsize)));
            json_object_set_new(t, "ssd_disk_free_bytes", json_integer((json_int_t)((uint64_t)vf.f_bavail * vf.f_frsize)));
        }
        if (t) json_object_set_new(o, "cache_tiers", t);
    }
    /* ok; waiting: requests wait for memory now */
    json_object_set_new(o, "state", json_string(p->n_parked ? "waiting" : "ok"));
    return o;
}
