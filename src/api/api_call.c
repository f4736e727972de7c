/* Calls: routing, the worker thread and the calls' preparing threads (model load, template,
 * tokenize, submit), engine event handling and the HTTP-facing read/release functions. See api.h
 * for the threading model. The API object's create / shutdown / tick / destroy are in
 * api_life.c, the allocation hook, string buffer and ids in api_util.c.
 *
 * DESIGN: a call is created by api_call_start on an HTTP thread with refs = 1 (HTTP side). A
 * generation call is queued to the worker (+1 ref), which starts a detached thread per call
 * (api_prepare_main, counted in api->n_preparing) that submits one engine request per choice
 * (+1 ref each, dropped at its DONE event). Output produced on the engine thread is encoded into
 * call->body under call->mu, then notify() wakes the HTTP side. */
#include "api/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"

void api_call_notify(struct api_call *c)
{
    if (c->notify) c->notify(c->notify_user);
}

/* Drops one reference; frees at zero. Called without c->mu held. */
static void api_call_unref(struct api_call *c)
{
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left > 0) return;
    struct api *a = c->api;
    pthread_mutex_lock(&a->mu);
    if (c->prev) c->prev->next = c->next;
    else if (a->active == c) a->active = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < c->n_subs; i++) api_sub_free(&c->subs[i]);
    if (c->have_req) api_req_free(&c->req);
    api_sbuf_free(&c->body);
    free(c->path);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Sets a whole-body answer (under c->mu). */
static void api_call_answer(struct api_call *c, int status, const char *content_type, char *body)
{
    if (!body && status < 400) status = 503; /* the answer could not be built: out of memory */
    api_sbuf_free(&c->body);
    c->body.p = body;
    c->body.len = c->body.cap = body ? strlen(body) : 0;
    c->status = status;
    c->content_type = content_type;
    c->streaming = 0;
    c->ready = 1;
    c->done = 1;
    if (status >= 400) __atomic_add_fetch(&c->api->n_errors, 1, __ATOMIC_RELAXED);
}

static int api_call_anthropic(const struct api_call *c)
{
    return c->kind == API_KIND_MESSAGES || c->kind == API_KIND_COUNT_TOKENS;
}

/* An error answer; a NULL body (out of memory) is answered with the static one (api_call_body). */
static void api_call_error(struct api_call *c, int status, const char *code, const char *msg,
                           const char *param)
{
    api_call_answer(c, status, "application/json",
                    api_error_body(api_call_anthropic(c), status, code, msg, param));
    c->failed = 1;
}

int api_path_is_anthropic(const char *path)
{
    return strncmp(path, "/v1/messages", 12) == 0;
}

const char *api_error_json_static(const char *path)
{
    return api_error_body_static(api_path_is_anthropic(path));
}

double api_usage_scale(const struct api *a, const char *model)
{
    for (int i = 0; i < a->cfg.n_model_opts; i++) {
        const struct api_model_opt *o = &a->cfg.model_opts[i];
        if (o->id && !strcmp(o->id, model) && o->usage_scale > 0) return o->usage_scale;
    }
    return 1.0;
}

char *api_error_json(const char *path, int status, const char *code, const char *message,
                     const char *param)
{
    return api_error_body(api_path_is_anthropic(path), status, code, message, param);
}

static const struct {
    const char *path;
    enum api_kind kind;
} api_gen_routes[] = {
    {"/v1/chat/completions", API_KIND_CHAT},
    {"/v1/completions", API_KIND_COMPLETIONS},
    {"/v1/messages", API_KIND_MESSAGES},
    {"/v1/messages/count_tokens", API_KIND_COUNT_TOKENS},
    {"/v1/responses", API_KIND_RESPONSES},
};

int api_route_known(const char *path)
{
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(api_gen_routes); i++)
        if (!strcmp(path, api_gen_routes[i].path)) return 1;
    return !strcmp(path, "/health") || !strcmp(path, "/v1/models") ||
           !strncmp(path, "/v1/models/", 11) || !strcmp(path, "/api/status") ||
           !strcmp(path, "/metrics") || !strcmp(path, "/api/cache/clear") ||
           !strncmp(path, "/v1/", 4) || !strncmp(path, "/api/", 5) || !strncmp(path, "/admin/api/", 11);
}

/* ---- worker ---- */

static const char *api_status_code_name(int st)
{
    switch (st) {
    case CAIRN_ERR_BUSY: return "queue_full";
    case CAIRN_ERR_NOMEM: return "insufficient_memory";
    case CAIRN_ERR_LIMIT: return "context_length_exceeded";
    case CAIRN_ERR_DEVICE: return "model_failed";
    default: return NULL;
    }
}

static int api_http_status_of(int st)
{
    switch (st) {
    case CAIRN_ERR_BUSY: return 429;
    case CAIRN_ERR_NOMEM: return 507;
    case CAIRN_ERR_INVALID:
    case CAIRN_ERR_LIMIT: return 400;
    case CAIRN_ERR_NOT_FOUND: return 404;
    case CAIRN_ERR_CANCELLED:
    case CAIRN_ERR_DEVICE: return 503; /* the model's device stalled or failed: reload, retry */
    default: return 500;
    }
}

static void api_on_engine_event(void *user, const struct engine_event *ev);

static void api_out_cb(void *user, const struct api_out_event *ev)
{
    api_emit_event((struct api_sub *)user, ev);
}

/* The prompt ends inside <think> when its last <think> has no </think> after it. */
static int api_prompt_in_think(const char *p)
{
    const char *open = NULL, *close = NULL, *q = p;
    while ((q = strstr(q, "<think>"))) open = q++;
    q = p;
    while ((q = strstr(q, "</think>"))) close = q++;
    if (!open) return 0;
    if (close && close > open) return 0;
    /* only whitespace after it */
    for (q = open + 7; *q; q++)
        if (*q != ' ' && *q != '\n' && *q != '\r' && *q != '\t') return 0;
    return 1;
}

/* Renders the chat template and tokenizes it: through the backend's render_chat_ids where it
 * has one (message contents then never make control tokens: tok_encode_plain), else render +
 * tokenize. On success *text and *ids are the caller's to free. */
static int api_call_render(struct api *a, struct api_call *c, const struct api_req *r, json_t *tools,
                           char **text, int32_t **ids, int *n_ids, struct cairn_err *err)
{
    int rc;
    if (a->be.render_chat_ids) {
        rc = a->be.render_chat_ids(a->be.ctx, c->model_idx, r->messages, tools, r->kwargs, 1, text, ids,
                                   n_ids, err);
    } else {
        rc = a->be.render_chat(a->be.ctx, c->model_idx, r->messages, tools, r->kwargs, 1, text, err);
        if (rc == 0) rc = a->be.tokenize(a->be.ctx, c->model_idx, *text, strlen(*text), 0, ids, n_ids, err);
    }
    if (rc == 0) c->in_think = api_prompt_in_think(*text);
    return rc;
}

static void api_call_prepare(struct api_call *c)
{
    struct api *a = c->api;
    struct api_req *r = &c->req;
    struct cairn_err err = {0};
    char *text = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, have_model = 0;
    char msg[1024];

    int rc = a->be.get_model(a->be.ctx, r->model, &c->model_idx, &err);
    if (rc == CAIRN_ERR_NOT_FOUND) {
        snprintf(msg, sizeof(msg), api_call_anthropic(c) ? "model: %.250s" : "The model '%.250s' does not exist",
                 r->model);
        pthread_mutex_lock(&c->mu);
        api_call_error(c, 404, "model_not_found", msg, "model");
        goto out_locked;
    }
    if (rc) {
        snprintf(msg, sizeof(msg), "loading model '%.200s' failed: %.500s", r->model, err.msg);
        pthread_mutex_lock(&c->mu);
        int st = rc == CAIRN_ERR_NOMEM || rc == CAIRN_ERR_BUSY || rc == CAIRN_ERR_CANCELLED ? api_http_status_of(rc) : 500;
        api_call_error(c, st == 429 ? 503 : st, api_status_code_name(rc), msg, NULL);
        goto out_locked;
    }
    have_model = 1;
    if (r->kind == API_KIND_COMPLETIONS) {
        if (r->prompt_ids) {
            ids = api_malloc((size_t)r->n_prompt_ids * sizeof(int32_t));
            if (ids) memcpy(ids, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof(int32_t));
            n_ids = r->n_prompt_ids;
            rc = ids ? 0 : cairn_err_set(&err, CAIRN_ERR_NOMEM, "out of memory");
        } else {
            rc = a->be.tokenize(a->be.ctx, c->model_idx, r->prompt, strlen(r->prompt), 1, &ids,
                                &n_ids, &err);
        }
    } else {
        json_t *tools = r->tools && json_array_size(r->tools) ? r->tools : NULL;
        rc = api_call_render(a, c, r, tools, &text, &ids, &n_ids, &err);
        if (rc && rc != CAIRN_ERR_NOMEM && api_req_merge_system(r->messages)) {
            /* The template refused a system message after the first turn (Claude Code sends
             * them): the same words merged into the leading system prompt. */
            LOG_DEBUG("api", "%s: template refused a later system message (%s); merged into the first", c->id, err.msg);
            memset(&err, 0, sizeof(err));
            free(text);
            free(ids);
            text = NULL;
            ids = NULL;
            n_ids = 0;
            rc = api_call_render(a, c, r, tools, &text, &ids, &n_ids, &err);
        }
    }
    pthread_mutex_lock(&c->mu);
    if (rc) {
        int st = rc == CAIRN_ERR_NOMEM ? 507 : (rc == CAIRN_ERR_INVALID || rc == CAIRN_ERR_FORMAT) ? 400 : 500;
        api_call_error(c, st, NULL, err.msg[0] ? err.msg : cairn_status_str(rc), NULL);
        goto out_locked;
    }
    c->n_prompt = n_ids;
    c->usage_scale = api_usage_scale(a, r->model);
    if (r->kind == API_KIND_COUNT_TOKENS) {
        snprintf(msg, sizeof(msg), "{\"input_tokens\":%d}", api_scaled(c, n_ids));
        api_call_answer(c, 200, "application/json", api_strdup(msg));
        goto out_locked;
    }
    int ctx = a->be.context_length(a->be.ctx, c->model_idx);
    if (ctx > 0 && n_ids >= ctx) {
        /* Each family's own wording, which its agents recognise (Claude Code compacts on
         * "prompt is too long"; OpenAI clients match the code and this sentence). Counts are
         * the client's (scaled), so they agree with the usage it was shown. */
        if (api_call_anthropic(c))
            snprintf(msg, sizeof(msg), "prompt is too long: %d tokens > %d maximum", api_scaled(c, n_ids),
                     api_scaled(c, ctx - 1));
        else
            snprintf(msg, sizeof(msg),
                     "This model's maximum context length is %d tokens. However, your prompt has %d "
                     "tokens, leaving no room for the completion.", api_scaled(c, ctx), api_scaled(c, n_ids));
        api_call_error(c, 400, "context_length_exceeded", msg,
                       r->kind == API_KIND_COMPLETIONS ? "prompt" : r->kind == API_KIND_RESPONSES ? "input" : "messages");
        goto out_locked;
    }
    int max_tokens = r->max_tokens > 0 ? r->max_tokens : 0;
    if (ctx > 0 && (max_tokens == 0 || n_ids + max_tokens > ctx)) max_tokens = ctx - n_ids;
    if (c->http_gone || c->failed) goto out_locked;
    if (API_SHUTTING(a)) {
        api_call_error(c, 503, "shutting_down", "the server is shutting down", NULL);
        goto out_locked;
    }
    if (a->be.sampling_defaults) a->be.sampling_defaults(a->be.ctx, c->model_idx, &r->sampling, r->sampling_given);
    /* constrained output: the grammar compiled at parse, or again when the prompt opened <think>
     * or the model's tool-call format is the bare JSON one (no <tool_call> in its prompt) */
    struct grammar *gram = NULL;
    const struct grammar_vocab *gvocab = NULL;
    if (r->grammar && a->be.grammar_vocab) {
        int tools = r->grammar_kind == API_GRAMMAR_TOOLS || r->grammar_kind == API_GRAMMAR_TOOLS_AUTO;
        enum api_tool_form form = tools && text && !strstr(text, "<tool_call>") ? API_TOOL_FORM_JSON : API_TOOL_FORM_HERMES;
        struct api_req_err gerr;
        if (c->in_think || form != API_TOOL_FORM_HERMES) {
            if (api_req_grammar(r, c->in_think, form, &gram, &gerr)) {
                api_call_error(c, 400, NULL, gerr.message, gerr.param);
                goto out_locked;
            }
        } else {
            gram = grammar_retain(r->grammar);
        }
        gvocab = a->be.grammar_vocab(a->be.ctx, c->model_idx, &err);
        if (!gvocab) {
            grammar_free(gram);
            api_call_error(c, 500, NULL, err.msg[0] ? err.msg : "cannot build the vocabulary for constrained decoding", NULL);
            goto out_locked;
        }
    }
    int parse = r->kind != API_KIND_COMPLETIONS;
    for (int i = 0; i < c->n_subs; i++) {
        struct api_sub *s = &c->subs[i];
        if (parse) api_out_init(&s->parser, c->in_think, r->tools != NULL, api_out_cb, s);
    }
    /* Anthropic's message_start carries the usage, prefix-cache hits included: it waits for the
     * first token event, which brings them (api_call_pump). */
    if (c->streaming && c->kind != API_KIND_MESSAGES) {
        api_emit_stream_start(c);
        c->started = 1;
    }
    for (int i = 0; i < c->n_subs; i++) {
        struct api_sub *s = &c->subs[i];
        struct engine_request er = {0};
        er.prompt = ids;
        er.n_prompt = n_ids;
        er.sampling = r->sampling;
        /* r is c->req, a copy of the request parsed on the HTTP thread's stack: point the bias
         * at this copy's array (engine_submit copies it). */
        er.sampling.logit_bias = r->sampling.n_logit_bias ? r->logit_bias : NULL;
        if (c->n_subs > 1 && r->sampling.has_seed) er.sampling.seed += (uint64_t)i;
        er.max_tokens = max_tokens;
        er.ignore_eos = r->ignore_eos;
        er.speculative = (enum engine_spec_mode)r->speculative;
        er.stop = (const char *const *)r->stop;
        er.n_stop = r->n_stop;
        er.grammar = gram;
        er.grammar_vocab = gvocab;
        er.on_event = api_on_engine_event;
        er.user = s;
        c->refs++;
        s->submitted = 1;
        /* Events can arrive before submit returns: they need c->mu, which we hold, so they
         * wait; submit itself must not wait for an event. */
        rc = a->be.submit(a->be.ctx, c->model_idx, &er, &s->engine_id, &err);
        if (rc) {
            c->refs--;
            s->submitted = 0;
            int st = api_http_status_of(rc);
            /* A request already streaming to the client can't change status: cancel the rest. */
            for (int j = 0; j < i; j++) a->be.cancel(a->be.ctx, c->model_idx, c->subs[j].engine_id);
            api_call_error(c, st, api_status_code_name(rc), err.msg[0] ? err.msg : cairn_status_str(rc), NULL);
            grammar_free(gram);
            goto out_locked;
        }
    }
    grammar_free(gram); /* each engine request holds its own reference */
    if (c->streaming) {
        c->status = 200;
        c->content_type = "text/event-stream";
        c->ready = 1;
        c->last_out = cairn_now();
        if (c->oom) {
            /* the opening events did not fit in memory: nothing was sent yet, answer an error */
            for (int i = 0; i < c->n_subs; i++) a->be.cancel(a->be.ctx, c->model_idx, c->subs[i].engine_id);
            c->oom = 0;
            api_call_error(c, 503, NULL, "out of memory", NULL);
        }
    }
out_locked:
    api_call_notify(c);
    pthread_mutex_unlock(&c->mu);
    /* submitted requests keep the model loaded on their own */
    if (have_model && a->be.put_model) a->be.put_model(a->be.ctx, c->model_idx);
    free(text);
    free(ids);
}

/* One thread per call being prepared, so a model load (or a long tokenize) delays only that
 * call: the worker hands calls out and never waits on a model. */
static void *api_prepare_main(void *arg)
{
    struct api_call *c = arg;
    struct api *a = c->api;
    api_call_prepare(c);
    api_call_unref(c);
    pthread_mutex_lock(&a->mu);
    a->n_preparing--;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

void *api_worker_main(void *arg)
{
    struct api *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->qhead && !a->stop_worker) pthread_cond_wait(&a->cv, &a->mu);
        if (!a->qhead && a->stop_worker) break;
        struct api_call *c = a->qhead;
        a->qhead = c->qnext;
        if (!a->qhead) a->qtail = NULL;
        int shutting = API_SHUTTING(a) || a->stop_worker;
        pthread_mutex_unlock(&a->mu);
        pthread_mutex_lock(&c->mu);
        int gone = c->http_gone;
        if (shutting && !gone) {
            api_call_error(c, 503, "shutting_down", "the server is shutting down", NULL);
            api_call_notify(c);
        }
        pthread_mutex_unlock(&c->mu);
        pthread_attr_t at;
        pthread_t th;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_mutex_lock(&a->mu);
        a->n_preparing++;
        pthread_mutex_unlock(&a->mu);
        if (gone || shutting || pthread_create(&th, &at, api_prepare_main, c) != 0) {
            if (!gone && !shutting) api_call_prepare(c); /* no thread: do it here */
            api_call_unref(c);
            pthread_mutex_lock(&a->mu);
            a->n_preparing--;
            pthread_mutex_unlock(&a->mu);
        }
        pthread_attr_destroy(&at);
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* ---- engine events (backend thread) ---- */

/* Copies one token (text + logprobs) into the sub's raw queue. Under c->mu. */
static void api_sub_queue_token(struct api_sub *s, const struct engine_event *ev)
{
    if (s->n_toks == s->cap_toks) {
        int cap = s->cap_toks ? s->cap_toks * 2 : 16;
        struct api_tok_raw *t = api_realloc(s->toks, (size_t)cap * sizeof(*t));
        if (!t) {
            s->call->oom = 1; /* a lost token would be a wrong answer: the call ends (pump) */
            return;
        }
        s->toks = t;
        s->cap_toks = cap;
    }
    struct api_tok_raw *t = &s->toks[s->n_toks];
    t->off = s->raw.len;
    if (api_sbuf_add(&s->raw, ev->text ? ev->text : "", ev->text_len) != CAIRN_OK) {
        s->call->oom = 1;
        return;
    }
    t->len = ev->text_len;
    t->id = ev->token;
    t->logprob = ev->logprob;
    t->n_top = ev->n_top < API_TOP_MAX ? ev->n_top : API_TOP_MAX;
    for (int i = 0; i < t->n_top; i++) {
        t->top_ids[i] = ev->top_ids[i];
        t->top_logprobs[i] = ev->top_logprobs[i];
    }
    s->n_toks++;
}

/* The engine's callback: copy and signal, nothing more (it runs on the scheduler thread). */
static void api_on_engine_event(void *user, const struct engine_event *ev)
{
    struct api_sub *s = user;
    struct api_call *c = s->call;
    pthread_mutex_lock(&c->mu);
    if (ev->usage.prompt_tokens > 0 && !s->done) {
        /* prompt and cached counts are final from the first token on (engine.h) */
        s->usage.prompt_tokens = ev->usage.prompt_tokens;
        s->usage.cached_tokens = ev->usage.cached_tokens;
        s->have_usage = 1;
    }
    if (ev->kind == ENGINE_EVENT_TOKEN) {
        double now = cairn_now();
        struct api_latency *lat = &c->api->lat; /* the dashboard's live TTFT and token gaps */
        if (c->t_first_token == 0) {
            c->t_first_token = now;
            __atomic_fetch_add(&lat->ttft_us, (uint64_t)((now - c->t_start) * 1e6), __ATOMIC_RELAXED);
            __atomic_fetch_add(&lat->n_ttft, 1, __ATOMIC_RELAXED);
        } else if (c->last_out > 0 && now >= c->last_out) {
            __atomic_fetch_add(&lat->itl_us, (uint64_t)((now - c->last_out) * 1e6), __ATOMIC_RELAXED);
            __atomic_fetch_add(&lat->n_itl, 1, __ATOMIC_RELAXED);
        }
        if (!c->failed && !s->done && !c->http_gone) api_sub_queue_token(s, ev);
        c->last_out = cairn_now(); /* output is coming: no keep-alive needed */
        api_call_notify(c);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    s->done = 1;
    c->n_done++;
    s->finish = ev->finish;
    s->usage = ev->usage;
    s->have_usage = 1;
    s->error_code = ev->error_code;
    /* Out of memory here loses the stop string's name (the reason stays) or the error's text
     * (a generic one is reported). */
    if (ev->stop_text) s->stop_text = api_strdup(ev->stop_text);
    if (ev->finish == ENGINE_FINISH_ERROR) s->error = api_strdup(ev->error ? ev->error : "generation failed");
    api_call_notify(c);
    pthread_mutex_unlock(&c->mu);
    api_call_unref(c);
}

/* Encodes what the engine queued: parser, SSE / body, the end of each choice and of the call.
 * Runs under c->mu on the thread that reads the call. */
/* Ends a call whose output could not be written for memory: a stream stops where it is (the
 * client sees it end without its final event), a whole body becomes a 503. Under c->mu. */
static void api_call_fail_oom(struct api_call *c)
{
    c->failed = 1;
    for (int j = 0; j < c->n_subs; j++)
        if (!c->subs[j].done && c->subs[j].submitted)
            c->api->be.cancel(c->api->be.ctx, c->model_idx, c->subs[j].engine_id);
    if (!c->streaming) api_call_error(c, 503, NULL, "out of memory", NULL);
    LOG_WARN("api", "%s: out of memory while writing the answer: request ended", c->id);
}

static void api_call_pump(struct api_call *c)
{
    if (c->done || !c->have_req) return;
    if (c->oom && !c->failed) api_call_fail_oom(c);
    if (c->streaming && !c->started && !c->failed) {
        struct api_sub *s0 = &c->subs[0];
        if (!s0->have_usage && !s0->done) return; /* message_start waits for the usage */
        api_emit_stream_start(c);
        c->started = 1;
        if (c->oom) api_call_fail_oom(c);
    }
    for (int i = 0; i < c->n_subs; i++) {
        struct api_sub *s = &c->subs[i];
        for (int k = 0; k < s->n_toks && !c->failed; k++) {
            const struct api_tok_raw *t = &s->toks[k];
            if (c->req.sampling.logprobs) api_emit_token_logprobs(s, t);
            if (!t->len) continue;
            if (c->kind == API_KIND_COMPLETIONS) {
                struct api_out_event oe = {.kind = API_OUT_TEXT, .text = s->raw.p + t->off, .len = t->len};
                api_emit_event(s, &oe);
            } else if (api_out_feed(&s->parser, s->raw.p + t->off, t->len) != CAIRN_OK) {
                c->oom = 1;
            }
            if (c->oom) api_call_fail_oom(c);
        }
        s->n_toks = 0;
        s->raw.len = 0;
        if (!s->done || s->finished) continue;
        s->finished = 1;
        c->n_finished++;
        if (c->failed) continue;
        if (c->kind != API_KIND_COMPLETIONS && api_out_finish(&s->parser) != CAIRN_OK) c->oom = 1;
        if (c->oom) {
            api_call_fail_oom(c);
            continue;
        }
        int shutdown = s->finish == ENGINE_FINISH_CANCELLED && API_SHUTTING(c->api);
        if (s->finish == ENGINE_FINISH_ERROR || shutdown) {
            const char *m = shutdown ? "the server is shutting down" : s->error ? s->error : "generation failed";
            if (c->streaming) api_emit_stream_error(c, m);
            else if (shutdown) api_call_error(c, 503, "shutting_down", m, NULL);
            else api_call_error(c, s->error_code ? api_http_status_of(s->error_code) : 500,
                                api_status_code_name(s->error_code), m, NULL);
            c->failed = 1;
            for (int j = 0; j < c->n_subs; j++) /* the other choices */
                if (!c->subs[j].done && c->subs[j].submitted)
                    c->api->be.cancel(c->api->be.ctx, c->model_idx, c->subs[j].engine_id);
        } else if (c->streaming) {
            api_emit_sub_done(s);
        }
    }
    if (c->n_finished < c->n_subs) return;
    if (!c->failed) {
        if (c->streaming) {
            api_emit_stream_end(c);
        } else {
            api_emit_body(c);
            if (c->oom) {
                api_call_error(c, 503, NULL, "out of memory", NULL);
            } else {
                c->status = 200;
                c->content_type = "application/json";
            }
        }
    }
    c->ready = 1;
    c->done = 1;
}

/* ---- HTTP-facing ---- */

static struct api_call *api_call_new(struct api *a, const char *path, int n_subs,
                                     api_notify_fn notify, void *notify_user)
{
    struct api_call *c = api_calloc(1, sizeof(*c) + (size_t)n_subs * sizeof(struct api_sub));
    if (!c) return NULL;
    c->path = api_strdup(path);
    if (!c->path) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->api = a;
    c->refs = 1;
    c->n_subs = n_subs;
    c->notify = notify;
    c->notify_user = notify_user;
    c->kind = API_KIND_CHAT;
    c->usage_scale = 1.0;
    c->t_start = cairn_now();
    for (int i = 0; i < n_subs; i++) {
        c->subs[i].call = c;
        c->subs[i].index = i;
    }
    c->created = a->cfg.deterministic ? 0 : (int64_t)time(NULL);
    pthread_mutex_lock(&a->mu);
    c->next = a->active;
    if (a->active) a->active->prev = c;
    a->active = c;
    pthread_mutex_unlock(&a->mu);
    return c;
}

struct api_call *api_call_start(struct api *a, const char *method, const char *path,
                                const char *body, size_t body_len, api_notify_fn notify,
                                void *notify_user)
{
    struct api_call_in in = {.method = method, .path = path, .body = body, .body_len = body_len,
                             .notify = notify, .notify_user = notify_user};
    return api_call_begin(a, &in);
}

struct api_call *api_call_begin(struct api *a, const struct api_call_in *in)
{
    const char *method = in->method, *path = in->path, *body = in->body;
    size_t body_len = in->body_len;
    api_notify_fn notify = in->notify;
    void *notify_user = in->notify_user;
    int is_post = !strcmp(method, "POST"), is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(api_gen_routes); i++) {
        if (strcmp(path, api_gen_routes[i].path)) continue;
        enum api_kind kind = api_gen_routes[i].kind;
        int anth = kind == API_KIND_MESSAGES || kind == API_KIND_COUNT_TOKENS;
        if (!is_post) {
            struct api_call *c = api_call_new(a, path, 1, NULL, NULL);
            if (!c) return NULL;
            c->kind = kind;
            api_call_answer(c, 405, "application/json",
                            api_error_body(anth, 405, NULL, "method not allowed: use POST", NULL));
            return c;
        }
        struct api_req req;
        struct api_req_err rerr;
        int prc = api_req_parse(kind, body, body_len, a->cfg.max_n > 0 ? a->cfg.max_n : 8, &req, &rerr);
        struct api_call *c = api_call_new(a, path, prc == 0 ? req.n : 1, notify, notify_user);
        if (!c) {
            if (prc == 0) api_req_free(&req);
            return NULL;
        }
        c->kind = kind;
        pthread_mutex_lock(&c->mu);
        if (prc) {
            api_call_error(c, rerr.status, NULL, rerr.message, rerr.param[0] ? rerr.param : NULL);
            pthread_mutex_unlock(&c->mu);
            return c;
        }
        c->req = req;
        c->have_req = 1;
        c->streaming = req.stream && kind != API_KIND_COUNT_TOKENS;
        snprintf(c->model, sizeof(c->model), "%s", req.model);
        const char *prefix = kind == API_KIND_CHAT ? "chatcmpl-" : kind == API_KIND_COMPLETIONS ? "cmpl-"
                           : kind == API_KIND_RESPONSES ? "resp_" : "msg_";
        pthread_mutex_unlock(&c->mu);
        api_new_id(a, prefix, c->id, sizeof(c->id));
        pthread_mutex_lock(&a->mu);
        if (API_SHUTTING(a)) {
            pthread_mutex_unlock(&a->mu);
            pthread_mutex_lock(&c->mu);
            api_call_error(c, 503, "shutting_down", "the server is shutting down", NULL);
            pthread_mutex_unlock(&c->mu);
            return c;
        }
        a->n_requests++;
        c->refs++; /* the worker's */
        c->qnext = NULL;
        if (a->qtail) a->qtail->qnext = c;
        else a->qhead = c;
        a->qtail = c;
        pthread_cond_signal(&a->cv);
        pthread_mutex_unlock(&a->mu);
        return c;
    }

    struct api_call *c = api_call_new(a, path, 1, NULL, NULL);
    if (!c) return NULL;
    /* the answer is built without c->mu: api_info_status takes api->mu, which comes first in
     * the lock order (api_tick holds it while it visits every call) */
    int st = 200;
    char *out = NULL;
    const char *ct = "application/json";
    if (!strncmp(path, "/admin/api/", 11)) {
        out = api_admin_call(a, method, path + 11, body, body_len, &st);
    } else if (!strcmp(path, "/health")) {
        if (!is_get) st = 405;
        else out = API_SHUTTING(a) ? api_strdup("{\"status\":\"shutting_down\"}") : api_info_health(a);
        if (API_SHUTTING(a) && is_get) st = 503;
    } else if (!strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11)) {
        if (!is_get) st = 405;
        else out = api_info_models(a, path[10] == '/' ? path + 11 : NULL, in->anthropic_version != NULL, &st);
    } else if (!strcmp(path, "/api/status")) {
        if (!is_get) st = 405;
        else out = api_info_status(a, &st);
    } else if (!strcmp(path, "/metrics")) {
        if (!is_get) st = 405;
        else {
            out = api_info_metrics(a, &st);
            ct = "text/plain; version=0.0.4; charset=utf-8";
        }
    } else if (!strcmp(path, "/api/cache/clear")) {
        if (!is_post) st = 405;
        else out = api_info_cache_clear(a, body, body_len, &st);
    } else {
        st = 404;
    }
    if (!out && st == 200) st = 503; /* out of memory: the static body (api_call_body) */
    pthread_mutex_lock(&c->mu);
    if (st == 405 && !out) {
        api_call_answer(c, 405, ct, api_error_json(path, 405, NULL, "method not allowed", NULL));
    } else if (st == 404 && !out) {
        char msg[300];
        snprintf(msg, sizeof(msg), "no route for %s %.200s", method, path);
        api_call_answer(c, 404, ct, api_error_json(path, 404, NULL, msg, NULL));
    } else {
        api_call_answer(c, st, ct, out);
    }
    pthread_mutex_unlock(&c->mu);
    return c;
}

int api_call_ready(struct api_call *c)
{
    pthread_mutex_lock(&c->mu);
    if (!c->ready) api_call_pump(c);
    int r = c->ready;
    pthread_mutex_unlock(&c->mu);
    return r;
}

int api_call_status(struct api_call *c)
{
    return c->status;
}

int api_call_streaming(struct api_call *c)
{
    return c->streaming;
}

const char *api_call_content_type(struct api_call *c)
{
    return c->content_type ? c->content_type : "application/json";
}

const char *api_call_body(struct api_call *c, size_t *len)
{
    if (!c->body.p && c->status >= 400) {
        const char *b = api_error_body_static(api_call_anthropic(c) || api_path_is_anthropic(c->path));
        *len = strlen(b);
        return b;
    }
    *len = c->body.len;
    return c->body.p ? c->body.p : "";
}

size_t api_call_read(struct api_call *c, char *buf, size_t cap, int *eof)
{
    pthread_mutex_lock(&c->mu);
    if (c->out_pos == c->body.len) api_call_pump(c);
    size_t avail = c->body.len - c->out_pos;
    size_t n = avail < cap ? avail : cap;
    if (n) memcpy(buf, c->body.p + c->out_pos, n);
    c->out_pos += n;
    if (c->out_pos == c->body.len && c->out_pos > (1u << 16)) {
        /* everything read: reuse the buffer from the start */
        c->body.len = 0;
        c->out_pos = 0;
    }
    *eof = c->done && c->out_pos == c->body.len;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Cancels every submitted choice of c (any n). Called after http_gone was set under c->mu:
 * from then on the worker submits nothing more, so `submitted` and `engine_id` no longer change
 * and can be read without the lock (which cancel must not be called under). Finished ids are
 * ignored by the backend. The caller holds a reference. */
static void api_call_cancel_subs(struct api_call *c)
{
    for (int i = 0; i < c->n_subs; i++)
        if (c->subs[i].submitted) c->api->be.cancel(c->api->be.ctx, c->model_idx, c->subs[i].engine_id);
}

void api_call_cancel(struct api_call *c)
{
    pthread_mutex_lock(&c->mu);
    int was_done = c->done;
    c->http_gone = 1;
    if (!was_done) {
        LOG_DEBUG("api", "client went away: cancelling %s", c->id);
        c->failed = 1;
        c->done = 1;
        c->ready = 1;
        if (!c->status) c->status = 499; /* nginx's "client closed request", for the access log */
        api_call_notify(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (!was_done) api_call_cancel_subs(c);
}

void api_call_release(struct api_call *c, int client_gone)
{
    pthread_mutex_lock(&c->mu);
    c->notify = NULL;
    c->notify_user = NULL;
    c->http_gone = 1;
    int cancel = !c->done;
    if (cancel && client_gone) LOG_DEBUG("api", "client went away: cancelling %s", c->id);
    pthread_mutex_unlock(&c->mu);
    if (cancel) api_call_cancel_subs(c);
    api_call_unref(c);
}

void api_call_summarize(struct api_call *c, struct api_call_summary *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_lock(&c->mu);
    /* The access log shows at most sizeof(o->model) - 1 bytes of the id (cut on purpose). */
    size_t n_model = strnlen(c->model, sizeof(o->model) - 1);
    memcpy(o->model, c->model, n_model);
    o->model[n_model] = 0;
    o->prompt_tokens = api_scaled(c, c->subs[0].have_usage ? c->subs[0].usage.prompt_tokens : c->n_prompt);
    o->cached_tokens = api_scaled(c, c->subs[0].usage.cached_tokens);
    for (int i = 0; i < c->n_subs; i++) o->completion_tokens += api_scaled(c, c->subs[i].usage.completion_tokens);
    o->ttft_s = c->t_first_token > 0 ? c->t_first_token - c->t_start : -1;
    pthread_mutex_unlock(&c->mu);
}

