/* The API layer: OpenAI chat/completions/responses and Anthropic messages over a backend.
 *
 * The HTTP room hands every request (method, path, headers it cares about, body) to
 * api_call_start and gets back a call. A call is either ready at once (errors, GET routes) or
 * pending (waiting for the model's load, template, tokenize and submit run on a thread of the
 * call's own, handed out by the API's worker, so a load delays only its model's calls; the answer
 * comes from the backend's engine thread). Whenever a call changes (ready, new stream bytes,
 * done) the API invokes the call's notify function; the HTTP room then resumes the connection
 * and pulls with api_call_read. So no HTTP thread ever waits on a model.
 *
 * DESIGN: a call holds a lock (call->mu) guarding its output buffer and state. The engine
 * callback only copies token text and usage into the call under that lock and notifies; the
 * parsing (api_out) and the encoding into SSE events or the whole body (api_emit) happen on
 * the HTTP thread that reads the call (api_call_ready / api_call_read). A call is freed when
 * both the HTTP side (api_call_release) and the backend (DONE event) let go.
 * Lock order: api->mu -> call->mu -> whatever notify takes.
 *
 * Out of memory inside a call fails that call only: its answer becomes an error in the API's
 * shape (a static body when even that can't be allocated), a stream ends early. */
#ifndef CAIRN_API_API_H
#define CAIRN_API_API_H

#include <stddef.h>
#include <stdint.h>

#include "api/api_backend.h"
#include "base/status.h"

/* A per-model option given where models are configured (`cairn serve --usage-scale ID=F`). */
struct api_model_opt {
    const char *id;         /* model id as clients name it */
    double usage_scale;     /* token counts reported to clients are multiplied by this; 0 or 1:
                             * off. For agents that assume a larger window than the model has
                             * (Claude Code assumes 200K): F = assumed window / real window
                             * makes their auto-compaction fire at the real fill level. */
};

struct api_config {
    int keepalive_ms;       /* SSE keep-alive interval while nothing is produced; default 5000 */
    int max_n;              /* largest `n` accepted; default 8 */
    int deterministic;      /* tests: ids count from 1 and created = 0 */
    const struct api_model_opt *model_opts; /* copied by api_create; may be NULL */
    int n_model_opts;
};

struct api;
struct api_call;

/* Creates the API over a backend (the API owns it from here: destroy calls backend.destroy).
 * Starts the worker thread. Free with api_destroy. */
int api_create(const struct api_config *cfg, const struct api_backend *backend, struct api **out,
               struct cairn_err *err);
void api_destroy(struct api *a);

/* The factor applied to the token counts reported for `model` (1 when off). The one place that
 * reads the per-model setting: a settings store can answer here later. */
double api_usage_scale(const struct api *a, const char *model);

/* Which error shape a path uses (Anthropic for /v1/messages*, OpenAI otherwise). */
int api_path_is_anthropic(const char *path);
/* Builds an error body in the path's shape; caller frees. status: HTTP status (the error type
 * follows from it); code (OpenAI's `code`, e.g. "invalid_api_key") and param may be NULL.
 * Returns NULL only when out of memory (then use api_error_json_static). */
char *api_error_json(const char *path, int status, const char *code, const char *message,
                     const char *param);
/* A constant error body in the path's shape saying "out of memory" (never NULL, never freed). */
const char *api_error_json_static(const char *path);

/* Returns 1 if path is an API route (any method); the HTTP room serves the rest (static). */
int api_route_known(const char *path);

typedef void (*api_notify_fn)(void *user);

/* A request as the HTTP room hands it over. */
struct api_call_in {
    const char *method;
    const char *path;               /* without the query string */
    const char *anthropic_version;  /* the anthropic-version header, or NULL */
    const char *body;
    size_t body_len;
    api_notify_fn notify;
    void *notify_user;
};

/* Starts a request. Returns NULL only when out of memory (answer 503 yourself). The body is
 * copied (or parsed) before return. notify may run on any thread, before this returns too; it
 * must not call back into the call. */
struct api_call *api_call_begin(struct api *a, const struct api_call_in *in);
/* The same without headers. */
struct api_call *api_call_start(struct api *a, const char *method, const char *path,
                                const char *body, size_t body_len, api_notify_fn notify,
                                void *notify_user);

/* 1 once the status and headers are known. */
int api_call_ready(struct api_call *c);
int api_call_status(struct api_call *c);
/* 1 for an SSE stream (read with api_call_read), 0 for a whole body (api_call_body). */
int api_call_streaming(struct api_call *c);
const char *api_call_content_type(struct api_call *c);
/* Whole body of a ready non-streaming call (valid until release; never NULL). */
const char *api_call_body(struct api_call *c, size_t *len);
/* Copies up to cap stream bytes. Returns bytes copied; 0 with *eof = 0 means nothing yet
 * (wait for notify), 0 with *eof = 1 means the stream is over. */
size_t api_call_read(struct api_call *c, char *buf, size_t cap, int *eof);
/* What the access log reports of a call (any time; numbers are 0 until known). */
struct api_call_summary {
    char model[128];         /* "" when the request named none */
    int prompt_tokens;       /* as reported to the client (usage scale applied) */
    int cached_tokens;
    int completion_tokens;
    double ttft_s;           /* call start -> first token; < 0 when none came */
};
void api_call_summarize(struct api_call *c, struct api_call_summary *out);
/* The client went away while the call runs (detected by the HTTP room while the connection
 * waits): its engine requests are cancelled now, the call ends (done) and notify runs. */
void api_call_cancel(struct api_call *c);
/* The HTTP side is done (response sent, or the client went away: client_gone cancels the
 * engine requests, every choice). No notify runs after this returns. */
void api_call_release(struct api_call *c, int client_gone);

/* Tests: makes the API's own allocations fail (the call, its buffers, queues and encoders):
 * n > 0: the n-th from now fails once; n < 0: every one from the -n-th on; 0: none. Returns how
 * many were made since the previous call. jansson's allocations are hooked by the test itself
 * (json_set_alloc_funcs). */
long api_test_fail_alloc(long n);

/* Shutting down: new calls get 503, running ones are cancelled and streams end with the API's
 * error event. */
void api_shutdown_begin(struct api *a);
/* Calls not yet released by the HTTP side. */
int api_n_active(struct api *a);
/* Periodic work (SSE keep-alives); call every ~250 ms from any thread. */
void api_tick(struct api *a);

#endif
