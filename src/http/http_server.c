/* HTTP server on libmicrohttpd (see http.h).
 *
 * DESIGN: one struct http_conn per request (MHD's con_cls), made as soon as the request line is
 * in (MHD's URI log callback), so a request whose headers or body never finish is known. conn->mu
 * guards `suspended`, `wake_pending` and `timed_out`: the handshake between the API's notify
 * (any thread) and MHD's threads (a notify while the connection runs sets wake_pending so the
 * next wait doesn't suspend; a notify while suspended resumes it), and the ticker's timeout.
 * srv->mu guards the list of connections; http_completed unlinks a connection under it before
 * releasing its call, so the ticker may use any listed connection's call while holding srv->mu.
 * Lock order: srv->mu -> call->mu (api) -> conn->mu.
 *
 * The ticker thread (every 200 ms): API keep-alives; requests whose headers + body have not
 * arrived within request_timeout_ms get a 408 in the API's error shape, written on the socket
 * (MHD is not writing to it then: nothing was queued) before the socket is shut down; and
 * suspended connections whose client hung up get their call cancelled (MHD does not watch a
 * suspended socket), so a disconnect during a long prefill frees the engine at the next step.
 *
 * Every error this layer answers is JSON in the path's API shape. Limits MHD itself enforces
 * are set above cairn's own (header size / count, checked here first), so the JSON answer wins.
 * Errors MHD answers on its own before any callback (a malformed Content-Length, a header block
 * above its 256 KiB memory limit) have no hook; MHD logs them just before sending its HTML page,
 * so the logger (http_mhd_log) writes the JSON answer on the socket first, when it can tell the
 * request (the only one of that thread between request line and headers). What remains HTML:
 * a request line too long to be read at all. */
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/file.h"
#include "base/log.h"
#include "http/web_assets.h"

struct http_server {
    struct http_config cfg;
    char *api_key;
    char *admin_key;          /* --admin-key, or NULL */
    struct api *api;
    struct MHD_Daemon *d;
    int port;
    pthread_mutex_t mu;        /* guards conns, n_inflight */
    struct http_conn *conns;
    int n_inflight;
    int stopping;
    pthread_t ticker;
    int ticker_run;
};

#define HTTP_MAX_HEADERS 100          /* more: 431 */
#define HTTP_MAX_HEADER_BYTES (64 << 10)  /* names + values; more: 431 */
#define HTTP_MAX_URI_BYTES (64 << 10)     /* the request target; more: 414 */
/* MHD's per-connection pool: the request line and the headers must fit in it to be parsed, and
 * only a parsed request can be answered in JSON (MHD 0.9.75 has no hook for a request line it
 * cannot hold, and logs nothing then). So it is well above cairn's own limits: a request line or
 * header block up to about 1 MiB gets cairn's JSON 414 / 431; beyond that MHD's own HTML page
 * goes out (the residual case, documented in the README). Pages are touched as used. */
#define HTTP_MHD_MEMORY_LIMIT (1 << 20)

struct http_conn {
    struct http_server *srv;
    struct MHD_Connection *mc;
    int fd;                    /* the connection's socket (for the ticker) */
    pthread_mutex_t mu;        /* guards suspended, wake_pending, timed_out; answered, status
                                * and call are written under it (read by the ticker) */
    int suspended;
    int wake_pending;
    int timed_out;             /* answered on the raw socket, which is shut (a 408 from the
                                * ticker, or a header error MHD would have answered in HTML) */
    int seen;                  /* the access handler has run once (headers complete) */
    int status;                /* HTTP status answered (access log); 0 none yet */
    double t_start;            /* request line received */
    pthread_t owner;           /* the MHD thread that parses its headers */
    char method[16];
    char path[1024];
    size_t uri_bytes;          /* length of the request target (path + query) */
    char *body;
    size_t len, cap;
    int too_large;
    int counted;               /* counted in srv->n_inflight */
    int answered;
    struct api_call *call;
    struct http_conn *next, *prev; /* srv->conns */
};

static void http_notify(void *user)
{
    struct http_conn *hc = user;
    pthread_mutex_lock(&hc->mu);
    if (hc->suspended) {
        hc->suspended = 0;
        MHD_resume_connection(hc->mc);
    } else {
        hc->wake_pending = 1;
    }
    pthread_mutex_unlock(&hc->mu);
}

/* Suspends unless a notify came in since the last check. Returns 1 if suspended, 0 if the
 * caller should check again, -1 if the server is stopping (don't wait: give up). Only from the
 * access handler or the content reader. */
static int http_wait(struct http_conn *hc)
{
    if (__atomic_load_n(&hc->srv->stopping, __ATOMIC_ACQUIRE)) return -1;
    pthread_mutex_lock(&hc->mu);
    if (hc->wake_pending) {
        hc->wake_pending = 0;
        pthread_mutex_unlock(&hc->mu);
        return 0;
    }
    hc->suspended = 1;
    MHD_suspend_connection(hc->mc);
    pthread_mutex_unlock(&hc->mu);
    return 1;
}

/* answered / status / call are read by the ticker under conn->mu */
static void http_mark_answered(struct http_conn *hc, int status)
{
    pthread_mutex_lock(&hc->mu);
    hc->answered = 1;
    hc->status = status;
    pthread_mutex_unlock(&hc->mu);
}

static enum MHD_Result http_send(struct http_conn *hc, int status, const char *ctype,
                                 const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(hc->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    http_mark_answered(hc, status);
    return ret;
}

static enum MHD_Result http_send_error(struct http_conn *hc, int status, const char *code,
                                       const char *msg)
{
    char *b = api_error_json(hc->path, status, code, msg, NULL);
    const char *body = b ? b : api_error_json_static(hc->path);
    enum MHD_Result r = http_send(hc, status, "application/json", body, strlen(body));
    free(b);
    return r;
}

static ssize_t http_stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct http_conn *hc = cls;
    for (;;) {
        int eof;
        size_t n = api_call_read(hc->call, buf, max, &eof);
        if (n) return (ssize_t)n;
        if (eof) return MHD_CONTENT_READER_END_OF_STREAM;
        int w = http_wait(hc);
        if (w < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (w) return 0;
    }
}

static enum MHD_Result http_answer_call(struct http_conn *hc)
{
    struct api_call *c = hc->call;
    for (;;) {
        if (api_call_ready(c)) break;
        int w = http_wait(hc);
        if (w < 0) return http_send_error(hc, 503, "shutting_down", "the server is shutting down");
        if (w) return MHD_YES;
    }
    int status = api_call_status(c);
    if (!api_call_streaming(c) || status != 200) {
        size_t len;
        const char *b = api_call_body(c, &len);
        return http_send(hc, status, api_call_content_type(c), b, len);
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, http_stream_reader, hc, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(hc->mc, 200, r);
    MHD_destroy_response(r);
    http_mark_answered(hc, 200);
    return ret;
}

/* Constant-time comparison (the key must not leak through timing). */
static int http_key_eq(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

static int http_authorized(struct http_conn *hc)
{
    const char *key = hc->srv->api_key;
    if (!key) return 1;
    const char *x = MHD_lookup_connection_value(hc->mc, MHD_HEADER_KIND, "x-api-key");
    if (x && http_key_eq(x, key)) return 1;
    const char *auth = MHD_lookup_connection_value(hc->mc, MHD_HEADER_KIND, "Authorization");
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        auth += 7;
        while (*auth == ' ') auth++;
        if (http_key_eq(auth, key)) return 1;
    }
    return 0;
}

static const struct web_asset *http_find_asset(const char *path)
{
    const char *name = !strcmp(path, "/") ? "index.html"
                       : !strcmp(path, "/admin") || !strcmp(path, "/admin/") ? "admin.html" /* the dashboard */
                                                                               : path + 1;
    for (const struct web_asset *a = web_assets; a->name; a++)
        if (!strcmp(a->name, name)) return a;
    return NULL;
}

/* A request starts: its request line is in, headers may follow slowly (MHD's URI log callback;
 * the result becomes the request's con_cls). NULL (out of memory) makes the access handler try
 * once more. */
static void *http_request_begin(void *cls, const char *uri, struct MHD_Connection *mc)
{
    struct http_server *srv = cls;
    struct http_conn *hc = calloc(1, sizeof(*hc));
    if (!hc) return NULL;
    hc->srv = srv;
    hc->mc = mc;
    hc->fd = -1;
    hc->t_start = cairn_now();
    hc->owner = pthread_self();
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) hc->fd = ci->connect_fd;
    pthread_mutex_init(&hc->mu, NULL);
    snprintf(hc->path, sizeof(hc->path), "%s", uri ? uri : "/");
    hc->uri_bytes = uri ? strlen(uri) : 1;
    char *q = strchr(hc->path, '?');
    if (q) *q = 0;
    pthread_mutex_lock(&srv->mu);
    hc->next = srv->conns;
    if (srv->conns) srv->conns->prev = hc;
    srv->conns = hc;
    pthread_mutex_unlock(&srv->mu);
    return hc;
}

struct http_hdr_count {
    int n;
    size_t bytes;
};

static enum MHD_Result http_count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                         const char *value)
{
    struct http_hdr_count *h = cls;
    h->n++;
    h->bytes += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *mc, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_data_size,
                                   void **con_cls)
{
    struct http_server *srv = cls;
    struct http_conn *hc = *con_cls;
    if (!hc) hc = *con_cls = http_request_begin(srv, url, mc);
    if (!hc) return MHD_NO;
    pthread_mutex_lock(&hc->mu);
    int timed_out = hc->timed_out;
    pthread_mutex_unlock(&hc->mu);
    if (timed_out) return MHD_NO; /* the ticker answered 408: close */
    if (!hc->seen) {
        hc->seen = 1;
        snprintf(hc->method, sizeof(hc->method), "%s", method);

        if (hc->uri_bytes > HTTP_MAX_URI_BYTES) {
            char msg[160];
            snprintf(msg, sizeof(msg), "the request target is %zu bytes; the limit is %d", hc->uri_bytes, HTTP_MAX_URI_BYTES);
            return http_send_error(hc, 414, "uri_too_long", msg);
        }
        struct http_hdr_count hn = {0, 0};
        MHD_get_connection_values(mc, MHD_HEADER_KIND, http_count_header, &hn);
        if (hn.n > HTTP_MAX_HEADERS || hn.bytes > HTTP_MAX_HEADER_BYTES) {
            char msg[200];
            snprintf(msg, sizeof(msg), "the request has %d header fields (%zu bytes); the limit is %d fields and %d bytes",
                     hn.n, hn.bytes, HTTP_MAX_HEADERS, HTTP_MAX_HEADER_BYTES);
            return http_send_error(hc, 431, "request_header_fields_too_large", msg);
        }
        /* a malformed Content-Length never gets here: MHD rejects it (see http_mhd_log) */

        int is_api = api_route_known(hc->path);
        if (!is_api) {
            const struct web_asset *a = http_find_asset(hc->path);
            if (!a) return http_send_error(hc, 404, NULL, "not found");
            if (strcmp(method, "GET") && strcmp(method, "HEAD"))
                return http_send_error(hc, 405, NULL, "method not allowed");
            struct MHD_Response *r = MHD_create_response_from_buffer(a->size, (void *)a->data, MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(r, "Content-Type", a->mime);
            enum MHD_Result ret = MHD_queue_response(mc, 200, r);
            MHD_destroy_response(r);
            http_mark_answered(hc, 200);
            return ret;
        }
        if (strcmp(hc->path, "/health") && !http_authorized(hc))
            return http_send_error(hc, 401, "invalid_api_key", "missing or invalid API key (use Authorization: Bearer KEY or x-api-key)");
        if (srv->admin_key && !strncmp(hc->path, "/admin/api/", 11)) {
            const char *k = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-admin-key");
            if (!k || !http_key_eq(k, srv->admin_key))
                return http_send_error(hc, 401, "invalid_admin_key", "missing or invalid admin key (use x-admin-key)");
        }
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body_bytes) {
            char msg[160];
            snprintf(msg, sizeof(msg), "request body of %s bytes is larger than the limit of %llu bytes", cl,
                     (unsigned long long)srv->cfg.max_body_bytes);
            return http_send_error(hc, 413, "request_too_large", msg);
        }
        pthread_mutex_lock(&srv->mu);
        int full = srv->n_inflight >= srv->cfg.max_concurrent;
        if (!full) {
            srv->n_inflight++;
            hc->counted = 1;
        }
        pthread_mutex_unlock(&srv->mu);
        if (full) return http_send_error(hc, 429, "too_many_requests", "too many concurrent requests");
        return MHD_YES;
    }
    if (hc->answered && !hc->call) {
        *upload_data_size = 0; /* discard the body of an answered request */
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (hc->too_large) return MHD_YES;
        if (hc->len + n > hc->srv->cfg.max_body_bytes) {
            hc->too_large = 1;
            free(hc->body);
            hc->body = NULL;
            hc->len = hc->cap = 0;
            return MHD_YES;
        }
        if (hc->len + n + 1 > hc->cap) {
            size_t cap = hc->cap ? hc->cap : 4096;
            while (cap < hc->len + n + 1) cap *= 2;
            char *b = realloc(hc->body, cap);
            if (!b) return MHD_NO;
            hc->body = b;
            hc->cap = cap;
        }
        memcpy(hc->body + hc->len, upload_data, n);
        hc->len += n;
        return MHD_YES;
    }
    if (hc->too_large) {
        char msg[160];
        snprintf(msg, sizeof(msg), "request body is larger than the limit of %llu bytes",
                 (unsigned long long)srv->cfg.max_body_bytes);
        return http_send_error(hc, 413, "request_too_large", msg);
    }
    if (!hc->call) {
        struct api_call_in in = {
            .method = hc->method,
            .path = hc->path,
            .anthropic_version = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "anthropic-version"),
            .body = hc->body,
            .body_len = hc->len,
            .notify = http_notify,
            .notify_user = hc,
        };
        /* the anthropic-beta header and ?beta=true (Claude Code) select nothing here: cairn
         * accepts those requests as they are */
        struct api_call *call = api_call_begin(srv->api, &in);
        pthread_mutex_lock(&hc->mu);
        hc->call = call;
        pthread_mutex_unlock(&hc->mu);
        free(hc->body);
        hc->body = NULL;
        if (!hc->call) return http_send_error(hc, 503, NULL, "out of memory");
    }
    if (hc->answered) return MHD_YES;
    return http_answer_call(hc);
}

static const char *http_termination_name(enum MHD_RequestTerminationCode toe)
{
    switch (toe) {
    case MHD_REQUEST_TERMINATED_COMPLETED_OK: return "ok";
    case MHD_REQUEST_TERMINATED_WITH_ERROR: return "client gone";
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED: return "idle timeout";
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN: return "shutdown";
    case MHD_REQUEST_TERMINATED_READ_ERROR: return "client gone";
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT: return "client gone";
    default: return "error";
    }
}

/* One line per request at info (unless --access-log off); the dashboard's polls (successful
 * GETs under /admin/api/, /health) at debug, so they don't bury the log it shows. */
static void http_access_log(struct http_conn *hc, enum MHD_RequestTerminationCode toe)
{
    if (hc->srv->cfg.access_log_off || cairn_log_get_level() > CAIRN_LOG_INFO) return;
    struct api_call_summary sum;
    memset(&sum, 0, sizeof(sum));
    sum.ttft_s = -1;
    int status = hc->status;
    if (hc->call) {
        api_call_summarize(hc->call, &sum);
        int st = api_call_status(hc->call);
        if (st) status = st;
    }
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !hc->timed_out) status = status ? status : 499;
    char ttft[32] = "-";
    if (sum.ttft_s >= 0) snprintf(ttft, sizeof(ttft), "%.0fms", sum.ttft_s * 1000);
    int poll = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && !strcmp(hc->method, "GET") && status < 400 &&
               (!strncmp(hc->path, "/admin/api/", 11) || !strcmp(hc->path, "/health"));
    cairn_log(poll ? CAIRN_LOG_DEBUG : CAIRN_LOG_INFO, "http",
             "%s %s model=%s status=%d prompt=%d cached=%d completion=%d ttft=%s duration=%.0fms%s%s",
             hc->method[0] ? hc->method : "-", hc->path, sum.model[0] ? sum.model : "-", status,
             sum.prompt_tokens, sum.cached_tokens, sum.completion_tokens, ttft,
             (cairn_now() - hc->t_start) * 1000, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " end=",
             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? ""
             : hc->timed_out ? (status == 408 ? "timeout" : "rejected") : http_termination_name(toe));
}

static void http_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    struct http_server *srv = cls;
    struct http_conn *hc = *con_cls;
    if (!hc) return;
    http_access_log(hc, toe);
    /* unlink first: the ticker uses a listed connection's call under srv->mu */
    pthread_mutex_lock(&srv->mu);
    if (hc->counted) srv->n_inflight--;
    if (hc->prev) hc->prev->next = hc->next;
    else srv->conns = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    pthread_mutex_unlock(&srv->mu);
    if (hc->call) api_call_release(hc->call, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    free(hc->body);
    pthread_mutex_destroy(&hc->mu);
    free(hc);
    *con_cls = NULL;
}

static void http_conn_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                             enum MHD_ConnectionNotificationCode toe)
{
    if (toe != MHD_CONNECTION_NOTIFY_STARTED) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    int one = 1;
    setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Writes a whole JSON error answer straight on a request's socket (best effort, never blocks)
 * and shuts the socket's sending side, so MHD closes the connection (the client's FIN, or a
 * failed send of MHD's own answer). For what MHD gives no hook for: a request that never
 * completes, and the header errors MHD answers itself. Under hc->mu, with nothing written by
 * MHD for this request yet. */
static void http_write_raw_error(struct http_conn *hc, int status, const char *reason, const char *code,
                                 const char *msg)
{
    char *b = api_error_json(hc->path, status, code, msg, NULL);
    const char *body = b ? b : api_error_json_static(hc->path);
    char head[256];
    int hn = snprintf(head, sizeof(head),
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n", status, reason, strlen(body));
    if (send(hc->fd, head, (size_t)hn, MSG_NOSIGNAL | MSG_DONTWAIT) == hn)
        (void)!send(hc->fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
    free(b);
    shutdown(hc->fd, SHUT_WR);
    hc->timed_out = 1;
    hc->status = status;
}

static void http_write_timeout(struct http_conn *hc)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "the request's headers and body did not arrive within %d ms",
             hc->srv->cfg.request_timeout_ms);
    http_write_raw_error(hc, 408, "Request Timeout", "request_timeout", msg);
}

/* The server whose MHD threads log through http_mhd_log (one per process: set at start). */
static struct http_server *http_log_srv;

/* MHD is about to answer a header error of a request this thread parses with its own HTML page:
 * answer first, in JSON, when exactly one request of this thread is between its request line
 * and the end of its headers (otherwise it can't be told which, and MHD's page goes out). */
static void http_preempt_mhd_error(int status, const char *reason, const char *code, const char *msg)
{
    struct http_server *srv = __atomic_load_n(&http_log_srv, __ATOMIC_ACQUIRE);
    if (!srv) return;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&srv->mu);
    struct http_conn *one = NULL;
    int n = 0;
    for (struct http_conn *hc = srv->conns; hc; hc = hc->next)
        if (!hc->seen && hc->fd >= 0 && pthread_equal(hc->owner, self)) {
            one = hc;
            n++;
        }
    if (n == 1) {
        pthread_mutex_lock(&one->mu);
        if (!one->timed_out) http_write_raw_error(one, status, reason, code, msg);
        pthread_mutex_unlock(&one->mu);
    }
    pthread_mutex_unlock(&srv->mu);
}

/* libmicrohttpd's own messages, through cairn's logger: a peer that hangs up is routine. */
static void http_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    static const char *const routine[] = {"closed", "closure", "reset by", "disconnect", "Connection reset",
                                          "Broken pipe", "timed out", "timeout", "Failed to send",
                                          "Failed to receive", "unexpectedly"};
    int debug = 0;
    const char *at;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(routine); i++)
        if (strcasestr(msg, routine[i])) debug = 1;
    if (strstr(msg, "Failed to parse `Content-Length'")) {
        debug = 1;
        http_preempt_mhd_error(400, "Bad Request", "invalid_content_length",
                               "the Content-Length header is not a number of bytes");
    } else if (strstr(msg, "Too large value of 'Content-Length'")) {
        debug = 1;
        http_preempt_mhd_error(413, "Content Too Large", "request_too_large",
                               "the Content-Length header is larger than any body this server accepts");
    } else if (strstr(msg, "Not enough memory in pool to allocate header record")) {
        debug = 1;
        http_preempt_mhd_error(431, "Request Header Fields Too Large", "request_header_fields_too_large",
                               "the request's header block is too large");
    } else if ((at = strstr(msg, "Error processing request (HTTP response code is ")) != NULL) {
        /* MHD logs this just before it sends any page of its own: the answers above came first
         * (then this finds the request answered), anything else is answered here */
        debug = 1;
        int st = atoi(at + strlen("Error processing request (HTTP response code is "));
        if (st == 413)
            http_preempt_mhd_error(413, "Content Too Large", "request_too_large", "the request is too large");
        else if (st == 414)
            http_preempt_mhd_error(414, "URI Too Long", "uri_too_long", "the request target is too long");
        else if (st == 431)
            http_preempt_mhd_error(431, "Request Header Fields Too Large", "request_header_fields_too_large",
                                   "the request's header block is too large");
        else if (st >= 400 && st < 500)
            http_preempt_mhd_error(400, "Bad Request", "invalid_request", "the HTTP request is malformed");
        else if (st >= 500)
            http_preempt_mhd_error(500, "Internal Server Error", NULL, "the HTTP layer failed to answer the request");
    }
    cairn_log(debug ? CAIRN_LOG_DEBUG : CAIRN_LOG_WARN, "http", "libmicrohttpd: %s", msg);
}

/* 1 if the peer of a socket has hung up (or the socket failed). */
static int http_peer_gone(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void http_tick_conns(struct http_server *srv)
{
    double now = cairn_now();
    double limit = srv->cfg.request_timeout_ms / 1000.0;
    pthread_mutex_lock(&srv->mu);
    for (struct http_conn *hc = srv->conns; hc; hc = hc->next) {
        if (hc->fd < 0) continue;
        pthread_mutex_lock(&hc->mu);
        int waiting_input = !hc->call && !hc->answered && !hc->timed_out;
        if (waiting_input && limit > 0 && now - hc->t_start > limit) {
            LOG_DEBUG("http", "%s %s: headers/body not complete after %.1f s: 408", hc->method, hc->path, now - hc->t_start);
            http_write_timeout(hc);
        }
        int check_gone = hc->suspended && hc->call;
        pthread_mutex_unlock(&hc->mu);
        /* a suspended socket is not watched by MHD: a client that left would hold its engine
         * request until the next byte is written. (A client that half-closes its side after
         * the request, which HTTP clients don't do, reads as gone too.) Lock order holds:
         * srv->mu -> call->mu -> conn->mu (notify). */
        if (check_gone && http_peer_gone(hc->fd)) api_call_cancel(hc->call);
    }
    pthread_mutex_unlock(&srv->mu);
}

static void *http_ticker_main(void *arg)
{
    struct http_server *srv = arg;
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        int run = srv->ticker_run;
        pthread_mutex_unlock(&srv->mu);
        if (!run) break;
        api_tick(srv->api);
        http_tick_conns(srv);
        usleep(200 * 1000);
    }
    return NULL;
}

int http_server_start(const struct http_config *cfg, struct api *api, struct http_server **out,
                      struct cairn_err *err)
{
    struct http_server *srv = calloc(1, sizeof(*srv));
    if (!srv) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    srv->cfg = *cfg;
    if (!srv->cfg.host || !strcmp(srv->cfg.host, "localhost")) srv->cfg.host = "127.0.0.1";
    if (srv->cfg.n_threads <= 0) srv->cfg.n_threads = 4;
    if (!srv->cfg.max_body_bytes) srv->cfg.max_body_bytes = 32u << 20;
    if (srv->cfg.max_concurrent <= 0) srv->cfg.max_concurrent = 1024;
    if (srv->cfg.request_timeout_ms == 0) srv->cfg.request_timeout_ms = 30000;
    if (srv->cfg.request_timeout_ms < 0) srv->cfg.request_timeout_ms = 0;
    if (srv->cfg.idle_timeout_s <= 0) srv->cfg.idle_timeout_s = 120;
    srv->api_key = cfg->api_key && *cfg->api_key ? strdup(cfg->api_key) : NULL;
    srv->admin_key = cfg->admin_key && *cfg->admin_key ? strdup(cfg->admin_key) : NULL;
    srv->api = api;
    pthread_mutex_init(&srv->mu, NULL);

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, srv->cfg.host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)srv->cfg.port);
    } else if (inet_pton(AF_INET6, srv->cfg.host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)srv->cfg.port);
        flags |= MHD_USE_IPv6;
    } else {
        free(srv->api_key);
        free(srv->admin_key);
        free(srv);
        return cairn_err_set(err, CAIRN_ERR_INVALID, "--host '%s' is not an IPv4 or IPv6 address", cfg->host);
    }
    __atomic_store_n(&http_log_srv, srv, __ATOMIC_RELEASE);
    srv->d = MHD_start_daemon(flags, (uint16_t)srv->cfg.port, NULL, NULL, http_access, srv,
                              MHD_OPTION_EXTERNAL_LOGGER, http_mhd_log, srv,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)srv->cfg.n_threads,
                              MHD_OPTION_NOTIFY_COMPLETED, http_completed, srv,
                              MHD_OPTION_NOTIFY_CONNECTION, http_conn_notify, srv,
                              MHD_OPTION_URI_LOG_CALLBACK, http_request_begin, srv,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_MHD_MEMORY_LIMIT,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned int)4096,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)srv->cfg.idle_timeout_s,
                              MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
                              MHD_OPTION_END);
    if (!srv->d) {
        __atomic_store_n(&http_log_srv, NULL, __ATOMIC_RELEASE);
        free(srv->api_key);
        free(srv->admin_key);
        free(srv);
        return cairn_err_set(err, CAIRN_ERR_IO, "cannot listen on %s:%d (in use?)", cfg->host ? cfg->host : "127.0.0.1", cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : srv->cfg.port;
    srv->ticker_run = 1;
    pthread_create(&srv->ticker, NULL, http_ticker_main, srv);
    *out = srv;
    return CAIRN_OK;
}

int http_server_port(const struct http_server *s)
{
    return s->port;
}

void http_server_stop(struct http_server *srv, int drain_ms)
{
    if (!srv) return;
    api_shutdown_begin(srv->api);
    double t0 = cairn_now();
    /* Wait for in-flight requests to finish writing their last bytes. */
    while (cairn_now() - t0 < drain_ms / 1000.0) {
        pthread_mutex_lock(&srv->mu);
        int n = srv->n_inflight;
        pthread_mutex_unlock(&srv->mu);
        if (n == 0) break;
        usleep(20 * 1000);
    }
    pthread_mutex_lock(&srv->mu);
    srv->ticker_run = 0;
    pthread_mutex_unlock(&srv->mu);
    pthread_join(srv->ticker, NULL);
    /* MHD must not be stopped with suspended connections. */
    MHD_quiesce_daemon(srv->d);
    __atomic_store_n(&srv->stopping, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&srv->mu);
    for (struct http_conn *hc = srv->conns; hc; hc = hc->next) {
        pthread_mutex_lock(&hc->mu);
        if (hc->suspended) {
            hc->suspended = 0;
            MHD_resume_connection(hc->mc);
        }
        pthread_mutex_unlock(&hc->mu);
    }
    pthread_mutex_unlock(&srv->mu);
    MHD_stop_daemon(srv->d);
    __atomic_store_n(&http_log_srv, NULL, __ATOMIC_RELEASE);
    pthread_mutex_destroy(&srv->mu);
    free(srv->api_key);
    free(srv->admin_key);
    free(srv);
}
