/* Helpers for the engine tests: a request result collector fed by the engine's event callback
 * (which runs on the scheduler thread) and a blocking wait. */
#ifndef CAIRN_TEST_ENGINE_TESTUTIL_H
#define CAIRN_TEST_ENGINE_TESTUTIL_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"

#define COLLECT_MAX_TOKENS 2048

struct collect {
    int32_t tokens[COLLECT_MAX_TOKENS];
    float logprobs[COLLECT_MAX_TOKENS];
    int n_tokens;
    char text[8192];
    size_t n_text;
    int done;
    int n_done_events;
    enum engine_finish finish;
    int error_code;           /* the DONE event's */
    char error[256];          /* and its message */
    char stop_text[64];
    int32_t stop_token;
    struct engine_usage usage;
    struct engine *cancel_engine; /* if set, cancel self after cancel_after tokens */
    int cancel_after;
    uint64_t id;
};

static pthread_mutex_t collect_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t collect_cv = PTHREAD_COND_INITIALIZER;

static inline void collect_event(void *user, const struct engine_event *ev)
{
    struct collect *c = user;
    pthread_mutex_lock(&collect_mu);
    if (ev->kind == ENGINE_EVENT_TOKEN) {
        if (c->n_tokens < COLLECT_MAX_TOKENS) {
            c->logprobs[c->n_tokens] = ev->logprob;
            c->tokens[c->n_tokens++] = ev->token;
        }
        if (c->n_text + ev->text_len < sizeof(c->text)) {
            memcpy(c->text + c->n_text, ev->text, ev->text_len);
            c->n_text += ev->text_len;
            c->text[c->n_text] = 0;
        }
        if (c->cancel_engine && c->n_tokens == c->cancel_after) engine_cancel(c->cancel_engine, ev->request_id);
    } else {
        c->done = 1;
        c->n_done_events++;
        c->finish = ev->finish;
        c->error_code = ev->error_code;
        if (ev->error) snprintf(c->error, sizeof(c->error), "%s", ev->error);
        c->stop_token = ev->stop_token;
        if (ev->stop_text) snprintf(c->stop_text, sizeof(c->stop_text), "%s", ev->stop_text);
        c->usage = ev->usage;
        pthread_cond_broadcast(&collect_cv);
    }
    pthread_mutex_unlock(&collect_mu);
}

/* Waits until every collector is done (or ~120 s pass). Returns 1 if all finished. */
static inline int collect_wait(struct collect *cs, int n)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 120;
    pthread_mutex_lock(&collect_mu);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        while (!cs[i].done) {
            if (pthread_cond_timedwait(&collect_cv, &collect_mu, &dl) != 0) {
                ok = 0;
                break;
            }
        }
        if (!ok) break;
    }
    pthread_mutex_unlock(&collect_mu);
    return ok;
}

static inline struct engine_request collect_request(struct collect *c, const int32_t *prompt, int n_prompt,
                                                    int max_tokens)
{
    struct engine_request r;
    memset(&r, 0, sizeof(r));
    memset(c, 0, sizeof(*c));
    c->stop_token = -1;
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    engine_sampling_default(&r.sampling);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.on_event = collect_event;
    r.user = c;
    return r;
}

/* Waits until the engine's published stats show n_done requests finished and nothing running
 * or waiting (DONE events are emitted before the stats of that step are published). */
static inline void collect_wait_idle(struct engine *e, uint64_t n_done)
{
    for (int i = 0; i < 20000; i++) {
        struct engine_stats st;
        engine_get_stats(e, &st);
        if (st.n_requests_done >= n_done && st.n_running == 0 && st.n_waiting == 0) return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

#endif
