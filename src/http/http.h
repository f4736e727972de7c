/* The HTTP server: libmicrohttpd (epoll, internal thread pool), auth, header / body limits,
 * timeouts, routing to the API room, static files of web/, the access log.
 *
 * Handlers never run model code: a request is handed to api_call_begin; while its answer isn't
 * ready the connection is suspended (costing no thread), and the API's notify resumes it. SSE
 * streams are pulled from the call in the content-reader callback, which suspends again when
 * nothing is buffered. A client that goes away releases its call (which cancels the engine
 * request); one that goes away while its connection is suspended is noticed by a 200 ms ticker.
 * Every error answered here is JSON in the API's error shape (OpenAI's, Anthropic's under
 * /v1/messages): 400 bad Content-Length, 401, 404, 405, 408 timeout, 413, 429, 431, 503. */
#ifndef CAIRN_HTTP_HTTP_H
#define CAIRN_HTTP_HTTP_H

#include <stdint.h>

#include "api/api.h"
#include "base/status.h"

struct http_config {
    const char *host;          /* IPv4/IPv6 literal or "localhost"; default 127.0.0.1 */
    int port;                  /* 0 = any free port (see http_server_port) */
    int n_threads;             /* MHD thread pool; default 4 */
    const char *api_key;       /* NULL = no auth; else Bearer or x-api-key must match */
    uint64_t max_body_bytes;   /* default 32 MiB */
    int max_concurrent;        /* API requests in flight before 429; 0 = 1024 */
    int request_timeout_ms;    /* headers + body must arrive within this from the request line,
                                * else 408 (JSON); 0 = 30000, < 0 = none */
    int idle_timeout_s;        /* a connection with no traffic is closed (MHD); 0 = 120. Waiting
                                * for an answer (suspended) does not count */
    int access_log_off;        /* no per-request info line */
};

struct http_server;

/* Starts listening. The server does not own the api. */
int http_server_start(const struct http_config *cfg, struct api *api, struct http_server **out,
                      struct cairn_err *err);
int http_server_port(const struct http_server *s);
/* Graceful stop: new requests get 503, streams end with an error event, waits up to
 * drain_ms for in-flight requests to finish, then stops the daemon and frees. */
void http_server_stop(struct http_server *s, int drain_ms);

#endif
