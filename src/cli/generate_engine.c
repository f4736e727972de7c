/* cairn generate --speculative MODE: the same greedy (or sampled) continuation as the plain
 * generate loop, but through the engine (scheduler, prefix cache, speculative decoding), so a
 * device run can show that drafting, verifying and rolling a hybrid's recurrent state back leave
 * the tokens unchanged. One request; the ids are printed comma-separated like --tokens does, and
 * the drafts verified / accepted go to stderr. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli_generate.h"
#include "engine/engine.h"

struct generate_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int32_t *tokens; /* [cap] */
    int n_tokens, cap;
    enum engine_finish finish;
    char error[256];
    struct engine_usage usage;
};

static void generate_engine_event(void *user, const struct engine_event *ev)
{
    struct generate_wait *w = user;
    pthread_mutex_lock(&w->mu);
    if (ev->kind == ENGINE_EVENT_TOKEN) {
        if (w->n_tokens < w->cap) w->tokens[w->n_tokens++] = ev->token;
    } else {
        w->done = 1;
        w->finish = ev->finish;
        w->usage = ev->usage;
        if (ev->error) snprintf(w->error, sizeof(w->error), "%s", ev->error);
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

int generate_engine_run(struct model *m, const struct generate_engine_opts *g, int32_t *out, int *n_out,
                        struct cairn_err *err)
{
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_dtype = g->kv_dtype;
    o.max_running = 4;
    o.kv_bytes = 256ull << 20;
    o.speculative = g->mode;
    o.spec_draft_cost = g->spec_draft_cost;
    struct engine *e = NULL;
    int rc = engine_create(m, &o, &e, err);
    if (rc != CAIRN_OK) return rc;
    struct generate_wait w = {.tokens = out, .cap = g->n_new};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    struct engine_request r;
    memset(&r, 0, sizeof(r));
    r.prompt = g->prompt;
    r.n_prompt = g->n_prompt;
    engine_sampling_default(&r.sampling);
    r.sampling.temperature = (float)g->temp;
    r.sampling.seed = g->seed;
    r.sampling.has_seed = 1;
    r.max_tokens = g->n_new;
    r.on_event = generate_engine_event;
    r.user = &w;
    rc = engine_submit(e, &r, NULL, err);
    if (rc == CAIRN_OK) {
        pthread_mutex_lock(&w.mu);
        while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        if (w.finish == ENGINE_FINISH_ERROR || w.finish == ENGINE_FINISH_CANCELLED)
            rc = cairn_err_set(err, CAIRN_ERR_INTERNAL, "the request failed: %s", w.error[0] ? w.error : "cancelled");
        fprintf(stderr, "generate: engine, speculative %s: %d drafted, %d accepted\n", engine_spec_mode_name(g->mode),
                w.usage.spec_drafted, w.usage.spec_accepted);
    }
    engine_destroy(e);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    *n_out = w.n_tokens;
    return rc;
}
