/* The admin dashboard's benchmark (POST/GET /admin/api/bench): prefill and decode speed of one
 * model, measured through the backend exactly as a request is (its tokenizer, the pool's
 * admission, the engine).
 *
 * A run takes prompt lengths and an output length. For each length it sends one request of
 * fresh random words (no prefix-cache hit: the words are new each run), greedy, ignoring EOS, and
 * records TTFT, prefill tok/s ((prompt - cached) / TTFT), decode tok/s and the mean inter-token
 * gap. With prefix_hit it then sends a request whose first half (whole KV blocks) is the
 * previous prompt's (cached by now) and whose rest is new: a partial hit, reported with its
 * cached token count. Requests go one at a time, so the numbers are those of one stream.
 *
 * DESIGN: one run at a time per server (a second POST gets 409), on its own thread, which the
 * next run or api_destroy joins. The thread waits for each request's DONE on bench->cv; the
 * engine callback only copies under bench->mu. GET returns the state and the rows so far.
 * Shutdown (api_admin_bench_free) sets stop: the thread cancels its request and ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api_int.h"
#include "base/file.h"
#include "base/log.h"

#define API_BENCH_MAX_ROWS (2 * API_BENCH_MAX_LENGTHS)

struct api_bench_row {
    const char *kind; /* "cold" or "prefix" */
    int prompt_tokens, cached_tokens, output_tokens;
    double ttft_ms, prefill_tok_s, decode_tok_s, itl_ms;
    char error[240]; /* this request failed: why */
};

struct api_bench {
    struct api *api;
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;  /* the request's events */
    pthread_t thread;
    int thread_started; /* joinable (joined by the next run or api_admin_bench_free) */
    int running, stop;
    uint64_t n_runs;
    struct api_bench_params params;
    struct api_bench_row rows[API_BENCH_MAX_ROWS];
    int n_rows, n_planned;
    char error[400];       /* the run failed as a whole (model not found ...) */
    double t_start, t_end; /* unix time */
    /* the request in flight */
    int req_done, req_tokens;
    double t_first, t_last;
    double gap_sum; /* sum of gaps between tokens (s) */
    struct engine_usage usage;
    char req_error[240];
};

int api_admin_bench_parse(json_t *body, struct api_bench_params *out, char *field, size_t cap,
                          struct cairn_err *err)
{
    memset(out, 0, sizeof(*out));
    field[0] = 0;
    if (!json_is_object(body))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "the body must be a JSON object");
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "model") && strcmp(k, "prompt_tokens") && strcmp(k, "output_tokens") &&
            strcmp(k, "prefix_hit")) {
            snprintf(field, cap, "%.200s", k);
            return cairn_err_set(err, CAIRN_ERR_INVALID,
                                 "%s: unknown field (expected model, prompt_tokens, "
                                 "output_tokens, prefix_hit)",
                                 field);
        }
    }
    v = json_object_get(body, "model");
    if (!json_is_string(v) || !json_string_length(v) ||
        json_string_length(v) >= sizeof(out->model)) {
        snprintf(field, cap, "model");
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "model must be a model id (a non-empty string)");
    }
    snprintf(out->model, sizeof(out->model), "%s", json_string_value(v));
    v = json_object_get(body, "prompt_tokens");
    json_t *one = json_is_integer(v) ? v : NULL;
    size_t n = one ? 1 : json_array_size(v);
    if ((!one && !json_is_array(v)) || n == 0 || n > API_BENCH_MAX_LENGTHS) {
        snprintf(field, cap, "prompt_tokens");
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "prompt_tokens must be a length or an array of 1 to %d lengths",
                             API_BENCH_MAX_LENGTHS);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = one ? one : json_array_get(v, i);
        json_int_t l = json_is_integer(x) ? json_integer_value(x) : -1;
        if (l < 2 || l > API_BENCH_MAX_TOKENS) {
            snprintf(field, cap, "prompt_tokens");
            return cairn_err_set(err, CAIRN_ERR_INVALID,
                                 "prompt_tokens: each length must be an integer from 2 to %d",
                                 API_BENCH_MAX_TOKENS);
        }
        out->prompt_tokens[out->n_lengths++] = (int)l;
    }
    v = json_object_get(body, "output_tokens");
    json_int_t o = v ? (json_is_integer(v) ? json_integer_value(v) : -1) : 32;
    if (o < 1 || o > API_BENCH_MAX_TOKENS) {
        snprintf(field, cap, "output_tokens");
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "output_tokens must be an integer from 1 to %d", API_BENCH_MAX_TOKENS);
    }
    out->output_tokens = (int)o;
    v = json_object_get(body, "prefix_hit");
    if (v && !json_is_boolean(v)) {
        snprintf(field, cap, "prefix_hit");
        return cairn_err_set(err, CAIRN_ERR_INVALID, "prefix_hit must be true or false");
    }
    out->prefix_hit = json_is_true(v);
    return CAIRN_OK;
}

/* ---- the run (bench thread) ---- */

/* Copies a message, cut to cap - 1 bytes on purpose (error texts of rows are shown, not parsed),
 * before a whole UTF-8 character (the JSON of the run must stay valid). */
static void api_bench_copy(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    if (src[n])
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
            n--;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static void api_bench_on_event(void *user, const struct engine_event *ev)
{
    struct api_bench *b = user;
    double now = cairn_now();
    pthread_mutex_lock(&b->mu);
    if (ev->kind == ENGINE_EVENT_TOKEN) {
        if (b->req_tokens == 0)
            b->t_first = now;
        else
            b->gap_sum += now - b->t_last;
        b->t_last = now;
        b->req_tokens++;
    } else {
        b->req_done = 1;
        if (ev->finish == ENGINE_FINISH_ERROR)
            api_bench_copy(b->req_error, sizeof(b->req_error),
                           ev->error ? ev->error : "the request failed");
        pthread_cond_broadcast(&b->cv);
    }
    b->usage = ev->usage;
    pthread_mutex_unlock(&b->mu);
}

/* Token ids of random words, at least n of them (the first n are used). NULL on failure. */
static int32_t *api_bench_prompt(struct api *a, int idx, int n, unsigned *seed,
                                 struct cairn_err *err)
{
    for (int words = n + 8; words <= 16 * n + 64; words *= 2) {
        size_t cap = (size_t)words * 12 + 1;
        char *text = malloc(cap);
        if (!text) break;
        size_t len = 0;
        for (int i = 0; i < words; i++)
            len += (size_t)snprintf(text + len, cap - len, "%sw%u", i ? " " : "",
                                    (unsigned)(rand_r(seed) % 100000u));
        int32_t *ids = NULL;
        int n_ids = 0;
        int rc = a->be.tokenize(a->be.ctx, idx, text, len, 0, &ids, &n_ids, err);
        free(text);
        if (rc) {
            free(ids);
            return NULL;
        }
        if (n_ids >= n) return ids;
        free(ids);
    }
    cairn_err_set(err, CAIRN_ERR_NOMEM, "cannot build a prompt of %d tokens", n);
    return NULL;
}

/* Runs one request and fills row (under nothing; takes b->mu). */
static void api_bench_request(struct api_bench *b, int idx, const int32_t *prompt, int n_prompt,
                              const char *kind, struct api_bench_row *row)
{
    struct api *a = b->api;
    memset(row, 0, sizeof(*row));
    row->kind = kind;
    row->prompt_tokens = n_prompt;
    struct engine_request q;
    memset(&q, 0, sizeof(q));
    q.prompt = prompt;
    q.n_prompt = n_prompt;
    engine_sampling_default(&q.sampling);
    q.sampling.temperature = 0;
    q.max_tokens = b->params.output_tokens;
    q.ignore_eos = 1;
    q.on_event = api_bench_on_event;
    q.user = b;
    pthread_mutex_lock(&b->mu);
    b->req_done = b->req_tokens = 0;
    b->gap_sum = b->t_first = b->t_last = 0;
    b->req_error[0] = 0;
    memset(&b->usage, 0, sizeof(b->usage));
    pthread_mutex_unlock(&b->mu);
    uint64_t id = 0;
    struct cairn_err err = {0};
    double t0 = cairn_now();
    int rc = a->be.submit(a->be.ctx, idx, &q, &id, &err);
    if (rc) {
        api_bench_copy(row->error, sizeof(row->error), err.msg[0] ? err.msg : cairn_status_str(rc));
        return;
    }
    pthread_mutex_lock(&b->mu);
    int cancelled = 0;
    while (!b->req_done) {
        if (b->stop && !cancelled) { /* cancel outside the lock: its DONE takes b->mu */
            cancelled = 1;
            pthread_mutex_unlock(&b->mu);
            a->be.cancel(a->be.ctx, idx, id);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    row->cached_tokens = b->usage.cached_tokens;
    row->output_tokens = b->req_tokens;
    if (b->req_error[0])
        api_bench_copy(row->error, sizeof(row->error), b->req_error);
    else if (cancelled)
        snprintf(row->error, sizeof(row->error), "cancelled");
    if (b->req_tokens > 0) {
        double ttft = b->t_first - t0;
        row->ttft_ms = ttft * 1000.0;
        row->prefill_tok_s = ttft > 0 ? (double)(n_prompt - row->cached_tokens) / ttft : 0;
        if (b->req_tokens > 1) {
            double dec = b->t_last - b->t_first;
            row->decode_tok_s = dec > 0 ? (double)(b->req_tokens - 1) / dec : 0;
            row->itl_ms = b->gap_sum / (double)(b->req_tokens - 1) * 1000.0;
        }
    }
    pthread_mutex_unlock(&b->mu);
}

static void api_bench_finish(struct api_bench *b, const char *error)
{
    pthread_mutex_lock(&b->mu);
    if (error) api_bench_copy(b->error, sizeof(b->error), error);
    b->running = 0;
    b->t_end = (double)time(NULL);
    pthread_mutex_unlock(&b->mu);
}

static void *api_bench_main(void *arg)
{
    struct api_bench *b = arg;
    struct api *a = b->api;
    struct cairn_err err = {0};
    int idx = -1;
    if (a->be.get_model(a->be.ctx, b->params.model, &idx, &err) != CAIRN_OK) {
        api_bench_finish(b, err.msg[0] ? err.msg : "cannot load the model");
        return NULL;
    }
    int ctx = a->be.context_length ? a->be.context_length(a->be.ctx, idx) : 0;
    struct engine_stats est;
    memset(&est, 0, sizeof(est));
    int bs = a->be.stats && a->be.stats(a->be.ctx, idx, &est) ? est.block_size : 0;
    unsigned seed = (unsigned)(cairn_now_ns() ^ (b->n_runs * 0x9e3779b9u));
    for (int i = 0; i < b->params.n_lengths; i++) {
        pthread_mutex_lock(&b->mu);
        int stop = b->stop;
        pthread_mutex_unlock(&b->mu);
        if (stop) break;
        int n = b->params.prompt_tokens[i];
        struct api_bench_row row[2];
        int n_row = b->params.prefix_hit ? 2 : 1;
        memset(row, 0, sizeof(row));
        if (ctx > 0 && n + b->params.output_tokens > ctx) {
            for (int r = 0; r < n_row; r++) {
                row[r].kind = r ? "prefix" : "cold";
                row[r].prompt_tokens = n;
                snprintf(row[r].error, sizeof(row[r].error),
                         "%d prompt + %d output tokens pass the model's context of %d", n,
                         b->params.output_tokens, ctx);
            }
        } else {
            int32_t *cold = api_bench_prompt(a, idx, n, &seed, &err);
            int32_t *fresh =
                cold && b->params.prefix_hit ? api_bench_prompt(a, idx, n, &seed, &err) : NULL;
            if (!cold || (b->params.prefix_hit && !fresh)) {
                for (int r = 0; r < n_row; r++) {
                    row[r].kind = r ? "prefix" : "cold";
                    row[r].prompt_tokens = n;
                    api_bench_copy(row[r].error, sizeof(row[r].error), err.msg);
                }
            } else {
                api_bench_request(b, idx, cold, n, "cold", &row[0]);
                if (fresh) {
                    /* the first half (in whole KV blocks: the cache keeps only those; at least
                     * one block when the prompt has more) is the cold prompt's, cached now */
                    int share = bs > 0 ? n / 2 / bs * bs : n / 2;
                    if (share == 0 && bs > 0 && n > bs) share = bs;
                    memcpy(fresh, cold, sizeof(int32_t) * (size_t)share);
                    api_bench_request(b, idx, fresh, n, "prefix", &row[1]);
                }
            }
            free(cold);
            free(fresh);
        }
        pthread_mutex_lock(&b->mu);
        for (int r = 0; r < n_row && b->n_rows < API_BENCH_MAX_ROWS; r++)
            b->rows[b->n_rows++] = row[r];
        pthread_mutex_unlock(&b->mu);
    }
    if (a->be.put_model) a->be.put_model(a->be.ctx, idx);
    LOG_INFO("admin", "benchmark of %s done: %d requests", b->params.model, b->n_rows);
    api_bench_finish(b, NULL);
    return NULL;
}

/* ---- the routes ---- */

static json_t *api_bench_json(struct api_bench *b)
{
    json_t *rows = json_array();
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < b->n_rows; i++) {
        const struct api_bench_row *r = &b->rows[i];
        json_t *o =
            json_pack("{s:s,s:i,s:i,s:i,s:f,s:f,s:f,s:f}", "kind", r->kind, "prompt_tokens",
                      r->prompt_tokens, "cached_tokens", r->cached_tokens, "output_tokens",
                      r->output_tokens, "ttft_ms", r->ttft_ms, "prefill_tok_s", r->prefill_tok_s,
                      "decode_tok_s", r->decode_tok_s, "itl_ms", r->itl_ms);
        if (o && r->error[0]) json_object_set_new(o, "error", json_string(r->error));
        if (o) json_array_append_new(rows, o);
    }
    json_t *lens = json_array();
    for (int i = 0; i < b->params.n_lengths; i++)
        json_array_append_new(lens, json_integer(b->params.prompt_tokens[i]));
    const char *state = b->running       ? "running"
                        : b->n_runs == 0 ? "idle"
                        : b->error[0]    ? "error"
                                         : "done";
    json_t *o = json_pack("{s:s,s:I,s:s,s:o,s:i,s:b,s:i,s:o}", "state", state, "run",
                          (json_int_t)b->n_runs, "model", b->params.model, "prompt_tokens", lens,
                          "output_tokens", b->params.output_tokens, "prefix_hit",
                          b->params.prefix_hit, "requests_planned", b->n_planned, "results", rows);
    if (o && b->n_runs) {
        json_object_set_new(o, "started", json_real(b->t_start));
        if (!b->running) json_object_set_new(o, "finished", json_real(b->t_end));
    }
    if (o && b->error[0]) json_object_set_new(o, "error", json_string(b->error));
    pthread_mutex_unlock(&b->mu);
    return o;
}

static struct api_bench *api_bench_get(struct api *a)
{
    pthread_mutex_lock(&a->mu);
    if (!a->bench) {
        struct api_bench *b = calloc(1, sizeof(*b));
        if (b) {
            b->api = a;
            pthread_mutex_init(&b->mu, NULL);
            pthread_cond_init(&b->cv, NULL);
        }
        a->bench = b;
    }
    struct api_bench *b = a->bench;
    pthread_mutex_unlock(&a->mu);
    return b;
}

char *api_admin_bench_call(struct api *a, const char *method, const char *body, size_t len,
                           int *status)
{
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!is_get && strcmp(method, "POST"))
        return api_admin_err(status, 405, NULL, "method not allowed: use GET or POST", NULL);
    if (!a->be.submit || !a->be.tokenize || !a->be.get_model)
        return api_admin_err(status, 501, NULL, "this backend cannot run a benchmark", NULL);
    struct api_bench *b = api_bench_get(a);
    if (!b) return api_admin_err(status, 503, NULL, "out of memory", NULL);
    if (is_get) return api_admin_dump(status, 200, api_bench_json(b));
    json_error_t je;
    json_t *j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        char msg[300];
        snprintf(msg, sizeof(msg), "the body is not valid JSON (line %d: %s)", je.line, je.text);
        return api_admin_err(status, 400, NULL, msg, NULL);
    }
    struct api_bench_params prm;
    char field[300];
    struct cairn_err err = {0};
    int rc = api_admin_bench_parse(j, &prm, field, sizeof(field), &err);
    json_decref(j);
    if (rc)
        return api_admin_err(status, 400, "invalid_request_error", err.msg,
                             field[0] ? field : NULL);
    if (API_SHUTTING(a))
        return api_admin_err(status, 503, "shutting_down", "the server is shutting down", NULL);
    pthread_mutex_lock(&b->mu);
    if (b->running) {
        pthread_mutex_unlock(&b->mu);
        return api_admin_err(status, 409, "benchmark_running",
                             "a benchmark is running: wait for it (GET /admin/api/bench)", NULL);
    }
    int join = b->thread_started;
    b->thread_started = 0;
    pthread_t old = b->thread;
    pthread_mutex_unlock(&b->mu);
    if (join) pthread_join(old, NULL); /* it has finished: only its exit is left */
    pthread_mutex_lock(&b->mu);
    if (b->running) { /* another POST started one meanwhile */
        pthread_mutex_unlock(&b->mu);
        return api_admin_err(status, 409, "benchmark_running", "a benchmark is running", NULL);
    }
    b->params = prm;
    b->n_rows = 0;
    b->n_planned = prm.n_lengths * (prm.prefix_hit ? 2 : 1);
    b->error[0] = 0;
    b->stop = 0;
    b->running = 1;
    b->n_runs++;
    b->t_start = (double)time(NULL);
    if (pthread_create(&b->thread, NULL, api_bench_main, b) != 0) {
        b->running = 0;
        snprintf(b->error, sizeof(b->error), "cannot start the benchmark thread");
        pthread_mutex_unlock(&b->mu);
        return api_admin_err(status, 503, NULL, "cannot start the benchmark thread", NULL);
    }
    b->thread_started = 1;
    pthread_mutex_unlock(&b->mu);
    LOG_INFO("admin", "benchmark of %s: %d requests", prm.model, b->n_planned);
    return api_admin_dump(status, 202, api_bench_json(b));
}

void api_admin_bench_free(struct api *a)
{
    struct api_bench *b = a->bench;
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_broadcast(&b->cv);
    int join = b->thread_started;
    b->thread_started = 0;
    pthread_mutex_unlock(&b->mu);
    if (join) pthread_join(b->thread, NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
    a->bench = NULL;
}
