/* Stop handling: EOS / stop ids and stop strings with hold-back (see stop.h). */
#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

#define STOP_SPARE 1024 /* room for one token's text beyond the longest stop string */

static int stop_reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return CAIRN_OK;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    char *p = realloc(*buf, n);
    if (!p) return CAIRN_ERR_NOMEM;
    *buf = p;
    *cap = n;
    return CAIRN_OK;
}

int stop_init(struct stop_state *s, const struct engine_detok *detok, const char *const *stops,
              int n_stop, const int32_t *stop_ids, int n_stop_ids, const int32_t *eos_ids,
              int n_eos, int ignore_eos, struct cairn_err *err)
{
    memset(s, 0, sizeof(*s));
    s->matched = -1;
    s->stop_token = -1;
    s->detok = (detok && detok->stream_new) ? detok : NULL;
    size_t max_len = 0;
    if (n_stop > 0) {
        s->stops = calloc((size_t)n_stop, sizeof(char *));
        s->stop_lens = calloc((size_t)n_stop, sizeof(size_t));
        if (!s->stops || !s->stop_lens) goto nomem;
        s->n_stop = n_stop;
        for (int i = 0; i < n_stop; i++) {
            s->stop_lens[i] = strlen(stops[i]);
            s->stops[i] = strdup(stops[i]);
            if (!s->stops[i]) goto nomem;
            if (s->stop_lens[i] > max_len) max_len = s->stop_lens[i];
        }
    }
    int n_ids = n_stop_ids + (ignore_eos ? 0 : n_eos);
    if (n_ids > 0) {
        s->ids = malloc((size_t)n_ids * sizeof(int32_t));
        if (!s->ids) goto nomem;
        if (n_stop_ids) memcpy(s->ids, stop_ids, (size_t)n_stop_ids * sizeof(int32_t));
        if (!ignore_eos && n_eos) memcpy(s->ids + n_stop_ids, eos_ids, (size_t)n_eos * sizeof(int32_t));
        s->n_ids = n_ids;
    }
    if (stop_reserve(&s->pending, &s->cap_pending, max_len + STOP_SPARE) ||
        stop_reserve(&s->out, &s->cap_out, max_len + STOP_SPARE))
        goto nomem;
    if (s->detok) {
        s->stream = s->detok->stream_new(s->detok->ctx);
        if (!s->stream) goto nomem;
    }
    return CAIRN_OK;
nomem:
    stop_free(s);
    return cairn_err_set(err, CAIRN_ERR_NOMEM, "stop: cannot allocate");
}

void stop_free(struct stop_state *s)
{
    if (s->stream && s->detok && s->detok->stream_free) s->detok->stream_free(s->stream);
    for (int i = 0; i < s->n_stop; i++) free(s->stops ? s->stops[i] : NULL);
    free(s->stops);
    free(s->stop_lens);
    free(s->ids);
    free(s->pending);
    free(s->out);
    memset(s, 0, sizeof(*s));
}

static int stop_append(struct stop_state *s, const char *t, size_t n)
{
    if (!n) return CAIRN_OK;
    if (stop_reserve(&s->pending, &s->cap_pending, s->n_pending + n)) return CAIRN_ERR_NOMEM;
    memcpy(s->pending + s->n_pending, t, n);
    s->n_pending += n;
    return CAIRN_OK;
}

/* Appends pending[0, n) to out and drops pending[0, n + drop). */
static int stop_release(struct stop_state *s, size_t n, size_t drop)
{
    if (stop_reserve(&s->out, &s->cap_out, s->n_out + n + 1)) return CAIRN_ERR_NOMEM;
    memcpy(s->out + s->n_out, s->pending, n);
    s->n_out += n;
    s->out[s->n_out] = 0;
    size_t gone = n + drop;
    memmove(s->pending, s->pending + gone, s->n_pending - gone);
    s->n_pending -= gone;
    return CAIRN_OK;
}

/* Looks for a stop string in pending and releases what can be released. final: release all. */
static int stop_scan(struct stop_state *s, int final)
{
    size_t best = (size_t)-1;
    int which = -1;
    for (int i = 0; i < s->n_stop; i++) {
        size_t L = s->stop_lens[i];
        if (L == 0 || L > s->n_pending) continue;
        const char *p = memmem(s->pending, s->n_pending, s->stops[i], L);
        if (p && (size_t)(p - s->pending) < best) {
            best = (size_t)(p - s->pending);
            which = i;
        }
    }
    if (which >= 0) {
        s->matched = which;
        int rc = stop_release(s, best, s->n_pending - best);
        return rc ? rc : STOP_STRING;
    }
    size_t hold = 0;
    if (!final) {
        for (int i = 0; i < s->n_stop; i++) {
            size_t L = s->stop_lens[i];
            if (L == 0) continue;
            size_t m = L - 1 < s->n_pending ? L - 1 : s->n_pending;
            for (size_t k = m; k > hold; k--) {
                if (memcmp(s->pending + s->n_pending - k, s->stops[i], k) == 0) {
                    hold = k;
                    break;
                }
            }
        }
    }
    int rc = stop_release(s, s->n_pending - hold, 0);
    return rc ? rc : STOP_CONTINUE;
}

static int stop_finish_impl(struct stop_state *s)
{
    if (s->done) return STOP_CONTINUE;
    s->done = 1;
    if (!s->detok) return STOP_CONTINUE;
    const char *t = NULL;
    size_t n = 0;
    int rc = s->detok->stream_flush ? s->detok->stream_flush(s->stream, &t, &n) : 0;
    if (rc) return rc < 0 ? rc : CAIRN_ERR_INTERNAL;
    if ((rc = stop_append(s, t, n))) return rc;
    return stop_scan(s, 1);
}

static int stop_feed_impl(struct stop_state *s, int32_t token)
{
    if (s->done) return STOP_CONTINUE;
    for (int i = 0; i < s->n_ids; i++) {
        if (s->ids[i] == token) {
            s->stop_token = token;
            int rc = stop_finish_impl(s);
            if (rc < 0) return rc;
            return rc == STOP_STRING ? STOP_STRING : STOP_TOKEN;
        }
    }
    if (!s->detok) return STOP_CONTINUE;
    const char *t = NULL;
    size_t n = 0;
    int rc = s->detok->stream_feed(s->stream, token, &t, &n);
    if (rc) return rc < 0 ? rc : CAIRN_ERR_INTERNAL;
    if ((rc = stop_append(s, t, n))) return rc;
    rc = stop_scan(s, 0);
    if (rc == STOP_STRING) s->done = 1;
    return rc;
}

static void stop_out_reset(struct stop_state *s)
{
    s->n_out = 0;
    if (s->out) s->out[0] = 0;
}

int stop_feed(struct stop_state *s, int32_t token, const char **text, size_t *len)
{
    stop_out_reset(s);
    int rc = stop_feed_impl(s, token);
    *text = s->out ? s->out : "";
    *len = s->n_out;
    return rc;
}

int stop_finish(struct stop_state *s, const char **text, size_t *len)
{
    stop_out_reset(s);
    int rc = stop_finish_impl(s);
    *text = s->out ? s->out : "";
    *len = s->n_out;
    return rc;
}

int stop_feed_final(struct stop_state *s, int32_t token, const char **text, size_t *len)
{
    stop_out_reset(s);
    int rc = stop_feed_impl(s, token);
    if (rc == STOP_CONTINUE) rc = stop_finish_impl(s);
    *text = s->out ? s->out : "";
    *len = s->n_out;
    return rc;
}

const char *stop_matched(const struct stop_state *s)
{
    return s->matched >= 0 ? s->stops[s->matched] : NULL;
}
