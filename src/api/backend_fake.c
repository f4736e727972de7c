/* The scripted fake backend: behaves like the model pool + engine + tokenizer + template, with
 * no model. Used by the API unit tests and by `cairn serve --fake-backend SCRIPT` in the
 * integration tests.
 *
 * Script (JSON):
 *   {"models": [{"id": "fake", "context_length": 4096}],
 *    "replies": [{"match": "weather", "text": "<tool_call>...</tool_call>", "error_after": -1}],
 *    "default": "Hello!",          reply when no `match` is a substring of the rendered prompt
 *    "chunk_bytes": 3,             bytes of reply per token (never splitting a UTF-8 sequence)
 *    "token_delay_ms": 0,          time per engine step
 *    "max_running": 64, "max_waiting": 256,   more in flight -> CAIRN_ERR_BUSY (429)
 *    "kv_tokens": 1000000,         prompt + max_tokens beyond this -> CAIRN_ERR_NOMEM (507)
 *    "cached_tokens": 0,           reported as served from cache (capped at the prompt)
 *    "load_delay_ms": 0,           first get_model of a model sleeps this long
 *    "prefill_steps": 0,           steps (token_delay_ms each) before a request's first token,
 *                                  cancellable at every step, as the engine's prefill chunks
 *    "system_first_only": false,   the template refuses a system message after the first one
 *    "prompt_log": "PATH"}         append every submitted prompt to PATH, each followed by a
 *                                  line "=== end of prompt ===" (tests of agent loops read it)
 * Tokenizer: one token per byte (id = byte value). Template: "<|role|>\ncontent\n" per message,
 * tools as "<|tools|>\nJSON\n" first, "<|assistant|>\n" for the generation prompt, plus
 * "<think>\n" when kwargs.enable_thinking is true.
 *
 * Threading: one "engine" thread runs steps; fk->mu guards the request list and counters. */
#include "api/api_backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

struct fake_model {
    char id[256];
    int context_length;
    int loaded;
    struct engine_stats st;
};

struct fake_reply {
    char *match;
    char *text;
    int error_after;
};

struct fake_req {
    uint64_t id;
    int model;
    char *text;            /* reply, truncated at the first stop string */
    size_t len, pos;
    char *stop_text;
    int max_tokens, n_out, error_after, cancelled, finished_length;
    int prefill_left;      /* steps before the first token */
    int n_prompt;
    engine_event_fn on_event;
    void *user;
    int logprobs, n_top;
    struct fake_req *next;
};

struct fake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop;
    struct fake_model *models;
    int n_models;
    struct fake_reply *replies;
    int n_replies;
    char *def;
    char *prompt_log;
    int chunk, delay_ms, max_running, max_waiting, cached, load_delay_ms, prefill_steps, system_first_only;
    long long kv_tokens;
    struct fake_req *reqs;
    int n_reqs;
    uint64_t next_id;
};

static int fake_list(void *ctx, struct api_model_desc *out, int max)
{
    struct fake *fk = ctx;
    pthread_mutex_lock(&fk->mu);
    for (int i = 0; i < fk->n_models && i < max; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        snprintf(out[i].id, sizeof(out[i].id), "%s", fk->models[i].id);
        out[i].loaded = fk->models[i].loaded;
        out[i].context_length = fk->models[i].context_length;
        out[i].created = 1700000000;
    }
    int n = fk->n_models;
    pthread_mutex_unlock(&fk->mu);
    return n;
}

static int fake_get(void *ctx, const char *id, int *idx, struct cairn_err *err)
{
    struct fake *fk = ctx;
    for (int i = 0; i < fk->n_models; i++) {
        if (strcmp(fk->models[i].id, id)) continue;
        pthread_mutex_lock(&fk->mu);
        int loaded = fk->models[i].loaded;
        pthread_mutex_unlock(&fk->mu);
        if (!loaded && fk->load_delay_ms) usleep((useconds_t)fk->load_delay_ms * 1000);
        pthread_mutex_lock(&fk->mu);
        fk->models[i].loaded = 1;
        pthread_mutex_unlock(&fk->mu);
        *idx = i;
        return CAIRN_OK;
    }
    return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "model '%s' not found", id);
}

static int fake_ctx_len(void *ctx, int idx)
{
    struct fake *fk = ctx;
    return fk->models[idx].context_length;
}

static int fake_render(void *ctx, int idx, json_t *messages, json_t *tools, json_t *kwargs,
                       int add_generation_prompt, char **out, struct cairn_err *err)
{
    struct fake *fk = ctx;
    if (fk->system_first_only) {
        size_t k;
        json_t *mm;
        json_array_foreach(messages, k, mm) {
            const char *role = json_string_value(json_object_get(mm, "role"));
            if (k > 0 && role && !strcmp(role, "system"))
                return cairn_err_set(err, CAIRN_ERR_FORMAT, "chat template: System message must be at the beginning.");
        }
    }
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    s[0] = 0;
#define FAKE_ADD(str)                                                                              \
    do {                                                                                           \
        const char *a_ = (str);                                                                    \
        size_t n_ = strlen(a_);                                                                    \
        if (len + n_ + 1 > cap) {                                                                  \
            while (len + n_ + 1 > cap) cap *= 2;                                                   \
            char *t_ = realloc(s, cap);                                                            \
            if (!t_) {                                                                             \
                free(s);                                                                           \
                return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");                       \
            }                                                                                      \
            s = t_;                                                                                \
        }                                                                                          \
        memcpy(s + len, a_, n_ + 1);                                                               \
        len += n_;                                                                                 \
    } while (0)
    if (tools) {
        char *t = json_dumps(tools, JSON_COMPACT);
        FAKE_ADD("<|tools|>\n");
        FAKE_ADD(t ? t : "");
        FAKE_ADD("\n");
        free(t);
    }
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        FAKE_ADD("<|");
        FAKE_ADD(role ? role : "?");
        FAKE_ADD("|>\n");
        FAKE_ADD(content ? content : "");
        json_t *tc = json_object_get(m, "tool_calls");
        if (tc) {
            char *t = json_dumps(tc, JSON_COMPACT);
            FAKE_ADD(t ? t : "");
            free(t);
        }
        FAKE_ADD("\n");
    }
    if (add_generation_prompt) {
        FAKE_ADD("<|assistant|>\n");
        if (kwargs && json_is_true(json_object_get(kwargs, "enable_thinking"))) FAKE_ADD("<think>\n");
    }
#undef FAKE_ADD
    *out = s;
    return CAIRN_OK;
}

static int fake_tokenize(void *ctx, int idx, const char *text, size_t len, int add_special,
                         int32_t **ids, int *n_ids, struct cairn_err *err)
{
    int32_t *v = malloc((len ? len : 1) * sizeof(int32_t));
    if (!v) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) v[i] = (unsigned char)text[i];
    *ids = v;
    *n_ids = (int)len;
    return CAIRN_OK;
}

static int fake_token_text(void *ctx, int idx, int32_t id, char *buf, size_t cap)
{
    if (id < 0 || id > 255 || cap < 2) return -1;
    buf[0] = (char)id;
    buf[1] = 0;
    return 1;
}

static int fake_submit(void *ctx, int idx, const struct engine_request *req, uint64_t *id,
                       struct cairn_err *err)
{
    struct fake *fk = ctx;
    if (req->n_prompt <= 0) return cairn_err_set(err, CAIRN_ERR_INVALID, "empty prompt");
    if ((long long)req->n_prompt + req->max_tokens > fk->kv_tokens)
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "request needs %d tokens of KV, the budget is %lld",
                             req->n_prompt + req->max_tokens, fk->kv_tokens);
    /* The rendered prompt is the byte string of the ids. */
    char *prompt = malloc((size_t)req->n_prompt + 1);
    if (!prompt) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < req->n_prompt; i++) prompt[i] = (char)(req->prompt[i] ? req->prompt[i] : ' ');
    prompt[req->n_prompt] = 0;
    const char *text = fk->def;
    int error_after = -1;
    for (int i = 0; i < fk->n_replies; i++)
        if (strstr(prompt, fk->replies[i].match)) {
            text = fk->replies[i].text;
            error_after = fk->replies[i].error_after;
            break;
        }
    if (fk->prompt_log) {
        pthread_mutex_lock(&fk->mu);
        FILE *f = fopen(fk->prompt_log, "a");
        if (f) {
            fprintf(f, "%s\n=== end of prompt ===\n", prompt);
            fclose(f);
        }
        pthread_mutex_unlock(&fk->mu);
    }
    free(prompt);
    struct fake_req *r = calloc(1, sizeof(*r));
    if (!r) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    r->text = strdup(text);
    r->len = strlen(text);
    for (int i = 0; i < req->n_stop; i++) {
        char *at = strstr(r->text, req->stop[i]);
        if (at && (size_t)(at - r->text) <= r->len) {
            r->len = (size_t)(at - r->text);
            free(r->stop_text);
            r->stop_text = strdup(req->stop[i]);
        }
    }
    r->model = idx;
    r->max_tokens = req->max_tokens;
    r->error_after = error_after;
    r->n_prompt = req->n_prompt;
    r->prefill_left = fk->prefill_steps;
    r->on_event = req->on_event;
    r->user = req->user;
    r->logprobs = req->sampling.logprobs;
    r->n_top = req->sampling.top_logprobs;
    pthread_mutex_lock(&fk->mu);
    if (fk->n_reqs >= fk->max_running + fk->max_waiting) {
        pthread_mutex_unlock(&fk->mu);
        free(r->text);
        free(r->stop_text);
        free(r);
        return cairn_err_set(err, CAIRN_ERR_BUSY, "the queue is full (%d requests)", fk->max_running + fk->max_waiting);
    }
    r->id = ++fk->next_id;
    r->next = fk->reqs;
    fk->reqs = r;
    fk->n_reqs++;
    fk->models[idx].st.n_running++;
    *id = r->id;
    pthread_cond_signal(&fk->cv);
    pthread_mutex_unlock(&fk->mu);
    return CAIRN_OK;
}

static void fake_cancel(void *ctx, int idx, uint64_t id)
{
    struct fake *fk = ctx;
    pthread_mutex_lock(&fk->mu);
    for (struct fake_req *r = fk->reqs; r; r = r->next)
        if (r->id == id) r->cancelled = 1;
    pthread_cond_signal(&fk->cv);
    pthread_mutex_unlock(&fk->mu);
}

static int fake_stats(void *ctx, int idx, struct engine_stats *st)
{
    struct fake *fk = ctx;
    pthread_mutex_lock(&fk->mu);
    int loaded = fk->models[idx].loaded;
    if (loaded) *st = fk->models[idx].st;
    pthread_mutex_unlock(&fk->mu);
    return loaded;
}

static int fake_cache_clear(void *ctx, const char *tier, struct cairn_err *err)
{
    if (!strcmp(tier, "hot") || !strcmp(tier, "ssd"))
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "the %s tier is not enabled", tier);
    return 1;
}

/* One step for one request: its next token, or its end. Runs without fk->mu. Returns 1 when the
 * request is finished (DONE sent). */
static int fake_step_req(struct fake *fk, struct fake_req *r, int cancelled)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.request_id = r->id;
    ev.stop_token = -1;
    int done = 0;
    if (cancelled) {
        ev.finish = ENGINE_FINISH_CANCELLED;
        done = 1;
    } else if (r->error_after >= 0 && r->n_out >= r->error_after) {
        ev.finish = ENGINE_FINISH_ERROR;
        ev.error = "scripted failure";
        done = 1;
    } else if (r->pos >= r->len) {
        ev.finish = ENGINE_FINISH_STOP;
        ev.stop_text = r->stop_text;
        done = 1;
    } else if (r->max_tokens > 0 && r->n_out >= r->max_tokens) {
        ev.finish = ENGINE_FINISH_LENGTH;
        done = 1;
    }
    if (!done && r->prefill_left > 0) {
        r->prefill_left--; /* a prefill chunk: no event */
        return 0;
    }
    if (done) {
        ev.kind = ENGINE_EVENT_DONE;
        ev.usage.prompt_tokens = r->n_prompt;
        ev.usage.cached_tokens = fk->cached < r->n_prompt ? fk->cached : r->n_prompt;
        ev.usage.completion_tokens = r->n_out;
        r->on_event(r->user, &ev);
        return 1;
    }
    size_t n = (size_t)fk->chunk;
    if (r->pos + n > r->len) n = r->len - r->pos;
    while (r->pos + n < r->len && ((unsigned char)r->text[r->pos + n] & 0xC0) == 0x80) n++;
    ev.kind = ENGINE_EVENT_TOKEN;
    ev.usage.prompt_tokens = r->n_prompt; /* as the engine: prompt and cached known at once */
    ev.usage.cached_tokens = fk->cached < r->n_prompt ? fk->cached : r->n_prompt;
    ev.usage.completion_tokens = r->n_out + 1;
    ev.token = (unsigned char)r->text[r->pos];
    ev.text = r->text + r->pos;
    ev.text_len = n;
    int32_t top_ids[20];
    float top_lp[20];
    if (r->logprobs) {
        ev.logprob = -0.5f;
        ev.n_top = r->n_top < 20 ? r->n_top : 20;
        for (int i = 0; i < ev.n_top; i++) {
            top_ids[i] = ev.token + i;
            top_lp[i] = -0.5f - (float)i;
        }
        ev.top_ids = top_ids;
        ev.top_logprobs = top_lp;
    }
    r->pos += n;
    r->n_out++;
    r->on_event(r->user, &ev);
    return 0;
}

static void *fake_main(void *arg)
{
    struct fake *fk = arg;
    pthread_mutex_lock(&fk->mu);
    for (;;) {
        while (!fk->reqs && !fk->stop) pthread_cond_wait(&fk->cv, &fk->mu);
        if (!fk->reqs && fk->stop) break;
        /* snapshot this step's requests (only this thread removes them) */
        struct fake_req *list = fk->reqs;
        pthread_mutex_unlock(&fk->mu);
        for (struct fake_req *r = list; r; r = r->next) {
            pthread_mutex_lock(&fk->mu);
            int cancelled = r->cancelled || fk->stop;
            pthread_mutex_unlock(&fk->mu);
            int was_out = r->n_out;
            if (fake_step_req(fk, r, cancelled)) {
                r->finished_length = 1; /* mark for removal */
            } else {
                pthread_mutex_lock(&fk->mu);
                fk->models[r->model].st.n_generated_tokens += (uint64_t)(r->n_out - was_out);
                pthread_mutex_unlock(&fk->mu);
            }
        }
        if (fk->delay_ms) usleep((useconds_t)fk->delay_ms * 1000);
        pthread_mutex_lock(&fk->mu);
        struct fake_req **pp = &fk->reqs;
        while (*pp) {
            struct fake_req *r = *pp;
            if (r->finished_length) {
                *pp = r->next;
                fk->n_reqs--;
                struct engine_stats *st = &fk->models[r->model].st;
                st->n_running--;
                st->n_requests_done++;
                st->n_prompt_tokens += (uint64_t)r->n_prompt;
                st->n_prefix_lookups++;
                if (fk->cached) {
                    st->n_prefix_hits++;
                    st->n_cached_tokens += (uint64_t)(fk->cached < r->n_prompt ? fk->cached : r->n_prompt);
                }
                free(r->text);
                free(r->stop_text);
                free(r);
            } else {
                pp = &r->next;
            }
        }
    }
    pthread_mutex_unlock(&fk->mu);
    return NULL;
}

static void fake_destroy(void *ctx)
{
    struct fake *fk = ctx;
    pthread_mutex_lock(&fk->mu);
    fk->stop = 1;
    pthread_cond_signal(&fk->cv);
    pthread_mutex_unlock(&fk->mu);
    pthread_join(fk->thread, NULL);
    for (int i = 0; i < fk->n_replies; i++) {
        free(fk->replies[i].match);
        free(fk->replies[i].text);
    }
    free(fk->replies);
    free(fk->models);
    free(fk->def);
    free(fk->prompt_log);
    pthread_mutex_destroy(&fk->mu);
    pthread_cond_destroy(&fk->cv);
    free(fk);
}

static int fake_int(json_t *o, const char *k, int def)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

int api_backend_fake_create_str(const char *script_json, struct api_backend *out,
                                struct cairn_err *err)
{
    json_error_t je;
    json_t *o = json_loads(script_json, 0, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "fake backend script: line %d: %s", je.line, je.text);
    }
    struct fake *fk = calloc(1, sizeof(*fk));
    if (!fk) {
        json_decref(o);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&fk->mu, NULL);
    pthread_cond_init(&fk->cv, NULL);
    json_t *models = json_object_get(o, "models");
    size_t nm = json_is_array(models) && json_array_size(models) ? json_array_size(models) : 1;
    fk->models = calloc(nm, sizeof(*fk->models));
    fk->n_models = (int)nm;
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_is_array(models) ? json_array_get(models, i) : NULL;
        const char *id = json_string_value(json_object_get(m, "id"));
        snprintf(fk->models[i].id, sizeof(fk->models[i].id), "%s", id ? id : "fake");
        fk->models[i].context_length = fake_int(m, "context_length", 4096);
    }
    json_t *replies = json_object_get(o, "replies");
    fk->n_replies = json_is_array(replies) ? (int)json_array_size(replies) : 0;
    fk->replies = calloc((size_t)fk->n_replies + 1, sizeof(*fk->replies));
    for (int i = 0; i < fk->n_replies; i++) {
        json_t *r = json_array_get(replies, (size_t)i);
        const char *m = json_string_value(json_object_get(r, "match"));
        const char *t = json_string_value(json_object_get(r, "text"));
        fk->replies[i].match = strdup(m ? m : "");
        fk->replies[i].text = strdup(t ? t : "");
        fk->replies[i].error_after = fake_int(r, "error_after", -1);
    }
    const char *def = json_string_value(json_object_get(o, "default"));
    fk->def = strdup(def ? def : "Hello!");
    const char *plog = json_string_value(json_object_get(o, "prompt_log"));
    fk->prompt_log = plog ? strdup(plog) : NULL;
    fk->chunk = fake_int(o, "chunk_bytes", 3);
    if (fk->chunk < 1) fk->chunk = 1;
    fk->delay_ms = fake_int(o, "token_delay_ms", 0);
    fk->max_running = fake_int(o, "max_running", 64);
    fk->max_waiting = fake_int(o, "max_waiting", 256);
    fk->cached = fake_int(o, "cached_tokens", 0);
    fk->load_delay_ms = fake_int(o, "load_delay_ms", 0);
    fk->prefill_steps = fake_int(o, "prefill_steps", 0);
    fk->system_first_only = json_is_true(json_object_get(o, "system_first_only"));
    json_t *kv = json_object_get(o, "kv_tokens");
    fk->kv_tokens = json_is_integer(kv) ? json_integer_value(kv) : 1000000000LL;
    json_decref(o);
    if (pthread_create(&fk->thread, NULL, fake_main, fk) != 0) {
        fk->n_replies = 0;
        free(fk->replies);
        free(fk->models);
        free(fk->def);
        free(fk->prompt_log);
        free(fk);
        return cairn_err_set(err, CAIRN_ERR_INTERNAL, "cannot start the fake engine thread");
    }
    memset(out, 0, sizeof(*out));
    out->ctx = fk;
    out->list_models = fake_list;
    out->get_model = fake_get;
    out->context_length = fake_ctx_len;
    out->render_chat = fake_render;
    out->tokenize = fake_tokenize;
    out->token_text = fake_token_text;
    out->submit = fake_submit;
    out->cancel = fake_cancel;
    out->stats = fake_stats;
    out->cache_clear = fake_cache_clear;
    out->destroy = fake_destroy;
    return CAIRN_OK;
}

int api_backend_fake_create(const char *script_path, struct api_backend *out,
                            struct cairn_err *err)
{
    char *s;
    size_t n;
    int rc = cairn_file_read_all(script_path, 16u << 20, &s, &n, err);
    if (rc) return rc;
    rc = api_backend_fake_create_str(s, out, err);
    free(s);
    return rc;
}
