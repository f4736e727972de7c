/* HTTP server on libmicrohttpd (see http.h).
 *
 * DESIGN: one struct http_conn per request (MHD's con_cls). conn->mu guards `suspended` and
 * `wake_pending`, the handshake between the API's notify (any thread) and MHD's threads: a
 * notify while the connection runs sets wake_pending so the next wait doesn't suspend; a notify
 * while suspended resumes it. srv->mu guards the list of connections (resumed at stop). */
#include "http/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
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

struct http_conn {
    struct http_server *srv;
    struct MHD_Connection *mc;
    pthread_mutex_t mu;        /* guards suspended, wake_pending */
    int suspended;
    int wake_pending;
    char method[16];
    char path[1024];
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

static enum MHD_Result http_send(struct http_conn *hc, int status, const char *ctype,
                                 const char *body, size_t len, const char *warning)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (warning) MHD_add_response_header(r, "x-cairn-warning", warning);
    enum MHD_Result ret = MHD_queue_response(hc->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    hc->answered = 1;
    return ret;
}

static enum MHD_Result http_send_error(struct http_conn *hc, int status, const char *code,
                                       const char *msg)
{
    char *b = api_error_json(hc->path, status, code, msg, NULL);
    enum MHD_Result r = http_send(hc, status, "application/json", b ? b : "{}", b ? strlen(b) : 2, NULL);
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
        return http_send(hc, status, api_call_content_type(c), b, len, api_call_warning(c));
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, http_stream_reader, hc, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    if (api_call_warning(c)) MHD_add_response_header(r, "x-cairn-warning", api_call_warning(c));
    enum MHD_Result ret = MHD_queue_response(hc->mc, 200, r);
    MHD_destroy_response(r);
    hc->answered = 1;
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
    const char *name = !strcmp(path, "/") ? "index.html" : path + 1;
    for (const struct web_asset *a = web_assets; a->name; a++)
        if (!strcmp(a->name, name)) return a;
    return NULL;
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *mc, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_data_size,
                                   void **con_cls)
{
    struct http_server *srv = cls;
    struct http_conn *hc = *con_cls;
    if (!hc) {
        hc = calloc(1, sizeof(*hc));
        if (!hc) return MHD_NO;
        hc->srv = srv;
        hc->mc = mc;
        pthread_mutex_init(&hc->mu, NULL);
        snprintf(hc->method, sizeof(hc->method), "%s", method);
        snprintf(hc->path, sizeof(hc->path), "%s", url);
        char *q = strchr(hc->path, '?');
        if (q) *q = 0;
        pthread_mutex_lock(&srv->mu);
        hc->next = srv->conns;
        if (srv->conns) srv->conns->prev = hc;
        srv->conns = hc;
        pthread_mutex_unlock(&srv->mu);
        *con_cls = hc;

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
            hc->answered = 1;
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
        hc->call = api_call_start(srv->api, hc->method, hc->path, hc->body, hc->len, http_notify, hc);
        free(hc->body);
        hc->body = NULL;
        if (!hc->call) return http_send_error(hc, 503, NULL, "out of memory");
    }
    if (hc->answered) return MHD_YES;
    return http_answer_call(hc);
}

static void http_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    struct http_server *srv = cls;
    struct http_conn *hc = *con_cls;
    if (!hc) return;
    if (hc->call) api_call_release(hc->call, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    pthread_mutex_lock(&srv->mu);
    if (hc->counted) srv->n_inflight--;
    if (hc->prev) hc->prev->next = hc->next;
    else srv->conns = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    pthread_mutex_unlock(&srv->mu);
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

static void *http_ticker_main(void *arg)
{
    struct http_server *srv = arg;
    for (;;) {
        pthread_mutex_lock(&srv->mu);
        int run = srv->ticker_run;
        pthread_mutex_unlock(&srv->mu);
        if (!run) break;
        api_tick(srv->api);
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
    srv->d = MHD_start_daemon(flags, (uint16_t)srv->cfg.port, NULL, NULL, http_access, srv,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)srv->cfg.n_threads,
                              MHD_OPTION_NOTIFY_COMPLETED, http_completed, srv,
                              MHD_OPTION_NOTIFY_CONNECTION, http_conn_notify, srv,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned int)4096,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)600,
                              MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
                              MHD_OPTION_END);
    if (!srv->d) {
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
    pthread_mutex_destroy(&srv->mu);
    free(srv->api_key);
    free(srv->admin_key);
    free(srv);
}
