/* Internals of the API room shared by api_util.c (allocation hook, string buffer, ids: used by all
 * the others, uses none), api_call.c (calls, worker), api_life.c (the api object's create,
 * shutdown, tick, destroy), api_emit.c (JSON and SSE encoders), api_info.c (models, status,
 * metrics, cache) and the admin files. Not for other rooms. */
#ifndef CAIRN_API_API_INT_H
#define CAIRN_API_API_INT_H

#include <pthread.h>
#include <stdint.h>

#include "api/api.h"
#include "api/api_out.h"
#include "api/api_req.h"

/* Allocation of the API room (api_util.c): plain malloc & co, with the test hook of
 * api_test_fail_alloc. Everything these return is freed with free(). */
void *api_malloc(size_t n);
void *api_calloc(size_t n, size_t size);
void *api_realloc(void *p, size_t n);
char *api_strdup(const char *s);

/* Growable byte buffer. api_sbuf_add returns CAIRN_ERR_NOMEM (buffer unchanged) or CAIRN_OK. */
struct api_sbuf {
    char *p;
    size_t len, cap;
};
int api_sbuf_add(struct api_sbuf *b, const char *s, size_t n);
int api_sbuf_adds(struct api_sbuf *b, const char *s);
void api_sbuf_free(struct api_sbuf *b);

enum api_seg_kind { API_SEG_TEXT = 0, API_SEG_REASONING, API_SEG_TOOL };

/* A piece of output in order: a run of text or reasoning, or one tool call. */
struct api_seg {
    enum api_seg_kind kind;
    struct api_sbuf text;
    char *name;              /* TOOL */
    char *args;              /* TOOL: JSON text */
    char id[48];             /* TOOL: call id; Responses: item id */
    int out_index;           /* Anthropic block index / Responses output_index */
};

#define API_TOP_MAX 20

/* One generated token as the engine reported it, waiting to be encoded on an HTTP thread. */
struct api_tok_raw {
    size_t off, len;         /* its text in api_sub.raw */
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[API_TOP_MAX];
    float top_logprobs[API_TOP_MAX];
};

/* One choice of a call (OpenAI n > 1 gives several). Guarded by call->mu.
 * The engine thread only copies into raw/toks and sets done (+ finish, usage ...); the parsing
 * and encoding happen in api_call_pump, on the HTTP thread that reads the call. */
struct api_sub {
    struct api_call *call;
    int index;
    uint64_t engine_id;
    int submitted, done;     /* done: the engine sent DONE */
    int finished;            /* DONE has been encoded (api_call_pump) */
    struct api_sbuf raw;     /* text of the tokens not encoded yet */
    struct api_tok_raw *toks;
    int n_toks, cap_toks;
    struct api_out parser;
    struct api_seg *segs;
    int n_segs, cap_segs;
    int seg_open;            /* streaming: last seg's block/item is open (Anthropic, Responses) */
    int n_tool_calls;
    json_t *logprobs;        /* pending (stream) or all (whole) logprob entries, or NULL */
    enum engine_finish finish;
    char *stop_text;
    char *error;
    int error_code;          /* the engine's DONE error_code (CAIRN_ERR_NOMEM: 507) */
    struct engine_usage usage; /* from the DONE event; prompt/cached from the first token on */
    int have_usage;          /* usage.prompt_tokens / cached_tokens are the engine's */
};

enum api_route {
    API_ROUTE_NONE = 0,
    API_ROUTE_GEN,           /* one of the generation kinds (call->kind) */
};

struct api_call {
    struct api *api;
    pthread_mutex_t mu;
    int refs;                /* HTTP side + worker + submitted subs; freed at 0 */
    enum api_kind kind;
    struct api_req req;
    int have_req;
    int model_idx;
    int n_prompt;
    int in_think;
    int status;
    int ready;
    int streaming;
    int done;                /* all subs done and the final bytes/body written */
    int failed;              /* an error was reported; later events are ignored */
    int oom;                 /* an append to the output failed: the stream ends there */
    int started;             /* streaming: the opening events are written (Anthropic's
                              * message_start waits for the engine's prefix-cache result) */
    int http_gone;
    struct api_sbuf body;    /* whole body, or the stream buffer */
    size_t out_pos;          /* stream bytes already read */
    double last_out;         /* time of the last stream bytes (keep-alives) */
    double t_start;          /* api_call_begin */
    double t_first_token;    /* first token event, 0 before */
    double usage_scale;      /* api_usage_scale of the model (1 = off) */
    const char *content_type;
    api_notify_fn notify;
    void *notify_user;
    char id[64];
    char model[256];
    int64_t created;
    int seq;                 /* Responses: sequence_number */
    char resp_item_prefix[24];
    int n_out_items;         /* Anthropic blocks / Responses output items so far */
    char *path;
    struct api_call *next, *prev; /* api->active, under api->mu */
    struct api_call *qnext;       /* worker queue, under api->mu */
    int n_subs, n_done, n_finished;
    struct api_sub subs[];
};

/* Latency of generation calls since start, for the admin dashboard (which turns deltas between
 * two polls into live means): time to first token per call, gaps between a call's tokens.
 * Updated with relaxed atomics on the engine callback. */
struct api_latency {
    uint64_t n_ttft, ttft_us;  /* calls that got a first token; sum of their TTFTs */
    uint64_t n_itl, itl_us;    /* token gaps; their sum */
};

struct api_bench;             /* api_admin_bench.c */

struct api {
    struct api_config cfg;   /* model_opts points into opts_copy */
    struct api_model_opt *opts_copy;
    struct api_backend be;
    pthread_mutex_t mu;      /* guards active, queue, shutting_down, counters */
    pthread_cond_t cv;
    pthread_t worker;
    int worker_started;
    int stop_worker;
    int n_preparing;         /* calls in their preparing threads (api_destroy waits for 0) */
    int shutting_down;       /* atomic: API_SHUTTING() */
    struct api_call *active;
    struct api_call *qhead, *qtail;
    uint64_t id_counter;
    uint64_t id_salt;
    uint64_t n_requests;     /* generation requests started */
    uint64_t n_errors;       /* answered with status >= 400 */
    struct api_latency lat;
    struct api_bench *bench; /* the admin benchmark (created on first use, under mu) */
};

/* Read without api->mu (set once, never cleared). */
#define API_SHUTTING(a) __atomic_load_n(&(a)->shutting_down, __ATOMIC_ACQUIRE)

/* Fresh id "prefix<hex>" (deterministic in tests). api_util.c. */
void api_new_id(struct api *a, const char *prefix, char *out, size_t cap);

/* api_call.c, for api_life.c: the worker thread's body (arg: the struct api), and the wake-up of
 * a call's HTTP side (under c->mu). */
void *api_worker_main(void *arg);
void api_call_notify(struct api_call *c);

/* api_emit.c: encoders. All run under call->mu. An append that fails for memory sets c->oom
 * and c->failed and cuts the output back to the last whole event. */
char *api_error_body(int anthropic, int status, const char *code, const char *message,
                     const char *param);
const char *api_error_body_static(int anthropic);
/* A token count as reported to clients (the call's usage scale applied). */
int api_scaled(const struct api_call *c, int n);
void api_emit_stream_start(struct api_call *c);
void api_emit_event(struct api_sub *s, const struct api_out_event *ev);
void api_emit_token_logprobs(struct api_sub *s, const struct api_tok_raw *t);
void api_emit_sub_done(struct api_sub *s);
void api_emit_stream_end(struct api_call *c);
void api_emit_stream_error(struct api_call *c, const char *message);
void api_emit_keepalive(struct api_call *c);
/* Builds the whole (non-streaming) body into c->body. */
void api_emit_body(struct api_call *c);
void api_sub_free(struct api_sub *s);

/* api_info.c: GET routes and cache clear. Return the body (malloc'd), set *status.
 * api_info_models answers in Anthropic's shape when `anthropic` (anthropic-version sent). */
char *api_info_models(struct api *a, const char *id, int anthropic, int *status);
char *api_info_status(struct api *a, int *status);
/* /health: {"status":"ok"}, or "degraded" with failed_models [{id, reason}] when a model's
 * device stalled or failed (the others serve; HTTP 200 either way). */
char *api_info_health(struct api *a);
char *api_info_metrics(struct api *a, int *status);
char *api_info_cache_clear(struct api *a, const char *body, size_t len, int *status);

/* api_admin.c: everything under /admin/api/ (sub: the path after it). Body malloc'd. */
char *api_admin_call(struct api *a, const char *method, const char *sub, const char *body, size_t len,
                     int *status);

/* api_admin_bench.c: the dashboard's benchmark, one run at a time on its own thread, through the
 * backend like any request (POST /admin/api/bench starts it, GET reads it). */
#define API_BENCH_MAX_LENGTHS 8
#define API_BENCH_MAX_TOKENS 32768   /* prompt or output length of one request */
struct api_bench_params {
    char model[256];
    int prompt_tokens[API_BENCH_MAX_LENGTHS];
    int n_lengths;
    int output_tokens;
    int prefix_hit;                  /* also a run that shares half of its prompt with the last */
};
/* Validates a POST bench body ({"model", "prompt_tokens": [..] or N, "output_tokens",
 * "prefix_hit"}); field names what was wrong (CAIRN_ERR_INVALID). */
int api_admin_bench_parse(json_t *body, struct api_bench_params *out, char *field, size_t cap,
                          struct cairn_err *err);
char *api_admin_bench_call(struct api *a, const char *method, const char *body, size_t len, int *status);
/* Stops a running benchmark (cancels its request) and frees it; from api_destroy. */
void api_admin_bench_free(struct api *a);
/* api_admin_call's helpers (api_admin.c). */
char *api_admin_err(int *status, int st, const char *code, const char *msg, const char *param);
char *api_admin_dump(int *status, int st, json_t *o);

#endif
