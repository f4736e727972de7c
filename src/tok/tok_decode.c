/* tok decoding: the decoder pipeline (ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
 * Sequence) over a list of token strings, whole-sequence decode, and the streaming detokenizer.
 *
 * DESIGN (stream): the stream keeps a window of ids not yet "settled" and decodes only that
 * window on each feed, with flags saying whether the window starts the sequence (Metaspace's
 * and Strip-after-Fuse's first-token rules) and whether it ends it (Strip's stop). It emits the
 * part of the window's text that can no longer change: trailing U+FFFD (an unfinished UTF-8
 * sequence), a trailing open byte-fallback group, and a strippable tail are held back. When
 * everything is emitted the window is emptied. Buffers are reused, so once warm a feed does
 * not allocate. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_int.h"

#define TOK_FFFD "\xef\xbf\xbd"

void tok_dec_free(struct tok_dec *d)
{
    if (!d) return;
    for (int k = 0; k < d->n_kids; k++)
        tok_dec_free(&d->kids[k]);
    free(d->kids);
    free(d->pat);
    free(d->content);
    tok_re_free(&d->re);
}

void tok_dec_work_free(struct tok_dec_work *w)
{
    for (int i = 0; i < 2; i++) {
        cairn_buf_free(&w->buf[i]);
        free(w->sp[i].v);
        free(w->first[i]);
    }
    cairn_buf_free(&w->bytes);
    if (w->md) pcre2_match_data_free(w->md);
    memset(w, 0, sizeof(*w));
}

/* State of the token list between stages. */
struct tok_dec_state {
    struct tok_dec_work *w;
    int cur;
    int fused;  /* a Fuse ran: the one token spans the window */
    int at_end; /* the window ends the sequence */
};

static int tok_first_reserve(struct tok_dec_work *w, int i, size_t n)
{
    if (n <= w->first_cap[i]) return CAIRN_OK;
    size_t cap = w->first_cap[i] ? w->first_cap[i] : 64;
    while (cap < n)
        cap *= 2;
    TOK_COUNT_GROW();
    uint8_t *p = realloc(w->first[i], cap);
    if (!p) return CAIRN_ERR_NOMEM;
    w->first[i] = p;
    w->first_cap[i] = cap;
    return CAIRN_OK;
}

/* Begins writing the other list; returns its index. */
static int tok_dec_begin(struct tok_dec_state *s)
{
    int o = 1 - s->cur;
    s->w->buf[o].n = 0;
    s->w->sp[o].n = 0;
    return cairn_buf_reserve(&s->w->buf[o], 1) ? -1 : o; /* p is never NULL below */
}

static int tok_dec_emit(struct tok_dec_state *s, int o, const char *p, size_t n, int first)
{
    struct tok_dec_work *w = s->w;
    size_t at = w->buf[o].n;
    if (cairn_buf_put(&w->buf[o], p, n)) return CAIRN_ERR_NOMEM;
    if (tok_first_reserve(w, o, w->sp[o].n + 1)) return CAIRN_ERR_NOMEM;
    w->first[o][w->sp[o].n] = (uint8_t)first;
    return tok_spans_push(&w->sp[o], at, n);
}

/* Closes a token whose bytes were already written to buf[o] from `at` on. */
static int tok_dec_close(struct tok_dec_state *s, int o, size_t at, int first)
{
    struct tok_dec_work *w = s->w;
    if (tok_first_reserve(w, o, w->sp[o].n + 1)) return CAIRN_ERR_NOMEM;
    w->first[o][w->sp[o].n] = (uint8_t)first;
    return tok_spans_push(&w->sp[o], at, w->buf[o].n - at);
}

static int tok_dec_stage(const struct tok_dec *d, struct tok_dec_state *s)
{
    struct tok_dec_work *w = s->w;
    int st = CAIRN_OK;
    if (d->type == TOK_DEC_SEQUENCE) {
        for (int k = 0; k < d->n_kids && !st; k++)
            st = tok_dec_stage(&d->kids[k], s);
        return st;
    }
    int c = s->cur, o = tok_dec_begin(s);
    if (o < 0) return CAIRN_ERR_NOMEM;
    const struct cairn_buf *ib = &w->buf[c];
    const struct tok_spans *is = &w->sp[c];
    const uint8_t *fi = w->first[c];
    switch (d->type) {
    case TOK_DEC_SEQUENCE:
        break;
    case TOK_DEC_REPLACE:
        for (size_t k = 0; k < is->n && !st; k++) {
            const char *p = ib->p + is->v[k].off;
            size_t n = is->v[k].len, i = 0, at = w->buf[o].n;
            for (;;) {
                size_t ms, me;
                if (d->re.code) {
                    int r = tok_re_next(&d->re, w->md, p, n, i, &ms, &me);
                    if (r < 0) return r;
                    if (!r) break;
                } else {
                    const char *f = d->pat_len ? memmem(p + i, n - i, d->pat, d->pat_len) : NULL;
                    if (!f) break;
                    ms = (size_t)(f - p);
                    me = ms + d->pat_len;
                }
                if (cairn_buf_put(&w->buf[o], p + i, ms - i) ||
                    cairn_buf_put(&w->buf[o], d->content, d->content_len))
                    return CAIRN_ERR_NOMEM;
                i = me;
            }
            if (cairn_buf_put(&w->buf[o], p + i, n - i)) return CAIRN_ERR_NOMEM;
            st = tok_dec_close(s, o, at, fi[k]);
        }
        break;
    case TOK_DEC_BYTEFALLBACK: {
        struct cairn_buf *g = &w->bytes;
        size_t k = 0;
        while (k < is->n && !st) {
            const char *p = ib->p + is->v[k].off;
            int b = tok_byte_piece(p, is->v[k].len);
            if (b < 0) {
                st = tok_dec_emit(s, o, p, is->v[k].len, fi[k]);
                k++;
                continue;
            }
            size_t g0 = k;
            g->n = 0;
            while (k < is->n && (b = tok_byte_piece(ib->p + is->v[k].off, is->v[k].len)) >= 0) {
                char ch = (char)b;
                if (cairn_buf_put(g, &ch, 1)) return CAIRN_ERR_NOMEM;
                k++;
            }
            if (cairn_utf8_valid(g->p, g->n)) {
                st = tok_dec_emit(s, o, g->p, g->n, fi[g0]);
            } else {
                for (size_t q = g0; q < k && !st; q++)
                    st = tok_dec_emit(s, o, TOK_FFFD, 3, fi[q]);
            }
        }
        break;
    }
    case TOK_DEC_FUSE: {
        size_t at = w->buf[o].n;
        for (size_t k = 0; k < is->n; k++)
            if (cairn_buf_put(&w->buf[o], ib->p + is->v[k].off, is->v[k].len)) return CAIRN_ERR_NOMEM;
        if (is->n) st = tok_dec_close(s, o, at, fi[0]);
        s->fused = 1;
        break;
    }
    case TOK_DEC_STRIP:
        for (size_t k = 0; k < is->n && !st; k++) {
            const char *p = ib->p + is->v[k].off;
            size_t a = 0, z = is->v[k].len, cl = d->content_len;
            if (!s->fused || fi[k])
                for (int q = 0; q < d->start && z - a >= cl && !memcmp(p + a, d->content, cl); q++)
                    a += cl;
            if (!s->fused || s->at_end)
                for (int q = 0; q < d->stop && z - a >= cl && !memcmp(p + z - cl, d->content, cl);
                     q++)
                    z -= cl;
            st = tok_dec_emit(s, o, p + a, z - a, fi[k]);
        }
        break;
    case TOK_DEC_METASPACE:
        for (size_t k = 0; k < is->n && !st; k++) {
            const char *p = ib->p + is->v[k].off;
            size_t n = is->v[k].len, at = w->buf[o].n;
            for (size_t i = 0; i < n;) {
                if (n - i >= d->repl_len && !memcmp(p + i, d->repl, d->repl_len)) {
                    if (!(fi[k] && d->strip_first) && cairn_buf_put(&w->buf[o], " ", 1))
                        return CAIRN_ERR_NOMEM;
                    i += d->repl_len;
                } else {
                    if (cairn_buf_put(&w->buf[o], p + i, 1)) return CAIRN_ERR_NOMEM;
                    i++;
                }
            }
            st = tok_dec_close(s, o, at, fi[k]);
        }
        break;
    case TOK_DEC_BYTELEVEL: {
        struct cairn_buf *g = &w->bytes;
        g->n = 0;
        for (size_t k = 0; k < is->n; k++) {
            const char *p = ib->p + is->v[k].off;
            size_t n = is->v[k].len, at = g->n;
            int ok = 1;
            if (cairn_buf_reserve(g, n + 1)) return CAIRN_ERR_NOMEM;
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                size_t l = cairn_utf8_get(p, n, i, &cp);
                int b = tok_cp_to_byte(cp);
                if (b < 0) {
                    ok = 0;
                    break;
                }
                g->p[g->n++] = (char)b;
                i += l;
            }
            if (!ok) {
                g->n = at;
                if (cairn_buf_put(g, p, n)) return CAIRN_ERR_NOMEM;
            }
        }
        size_t at = w->buf[o].n;
        if (cairn_utf8_lossy(&w->buf[o], g->p ? g->p : "", g->n)) return CAIRN_ERR_NOMEM;
        w->tail_open = cairn_utf8_tail_open(g->p ? g->p : "", g->n);
        if (is->n) st = tok_dec_close(s, o, at, fi[0]);
        break;
    }
    }
    s->cur = o;
    return st;
}

int tok_dec_run(const struct tok *t, struct tok_dec_work *w, const int32_t *ids, size_t n,
                int starts_seq, int at_end, struct cairn_buf *out)
{
    struct tok_dec_state s = {w, 0, 0, at_end};
    int st = CAIRN_OK;
    out->n = 0;
    w->tail_open = 0;
    if (cairn_buf_reserve(out, 1)) return CAIRN_ERR_NOMEM;
    out->p[0] = 0;
    w->buf[0].n = 0;
    w->sp[0].n = 0;
    if (cairn_buf_reserve(&w->buf[0], 1)) return CAIRN_ERR_NOMEM;
    for (size_t k = 0; k < n; k++) {
        const char *p = tok_id_to_piece(t, ids[k]);
        if (!p) continue;
        if (!t->dec && (k > 0 || !starts_seq) && (st = tok_dec_emit(&s, 0, " ", 1, 0))) return st;
        if ((st = tok_dec_emit(&s, 0, p, t->piece_len[ids[k]], starts_seq && w->sp[0].n == 0)))
            return st;
    }
    if (t->dec && (st = tok_dec_stage(t->dec, &s))) return st;
    const struct cairn_buf *b = &w->buf[s.cur];
    const struct tok_spans *sp = &w->sp[s.cur];
    for (size_t k = 0; k < sp->n; k++)
        if ((st = cairn_buf_put(out, b->p + sp->v[k].off, sp->v[k].len))) return st;
    return CAIRN_OK;
}

int tok_decode(const struct tok *t, const int32_t *ids, size_t n, int skip_special, char **out,
               size_t *len, struct cairn_err *err)
{
    struct tok_dec_work w;
    memset(&w, 0, sizeof(w));
    struct cairn_buf o = {0};
    int32_t *keep = malloc((n ? n : 1) * sizeof(int32_t));
    size_t nk = 0;
    int st = CAIRN_OK;
    *out = NULL;
    *len = 0;
    w.md = pcre2_match_data_create(4, NULL);
    if (!keep || !w.md) {
        st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t k = 0; k < n; k++) {
        if (!tok_id_to_piece(t, ids[k])) continue;
        if (skip_special && t->special[ids[k]]) continue;
        keep[nk++] = ids[k];
    }
    st = tok_dec_run(t, &w, keep, nk, 1, 1, &o);
    if (st) {
        cairn_err_set(err, st, "decode failed");
        cairn_buf_free(&o);
        goto cleanup;
    }
    if (!o.p && cairn_buf_put(&o, "", 0)) {
        st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    *out = o.p;
    *len = o.n;
cleanup:
    free(keep);
    tok_dec_work_free(&w);
    return st;
}

/* ---- streaming ---- */

struct tok_stream {
    const struct tok *t;
    int skip_special;
    struct tok_ids win;  /* ids of the unsettled window */
    int win_starts_seq;  /* nothing was decoded before the window */
    size_t emitted;      /* bytes of the window's text already returned */
    struct cairn_buf text; /* the window's decoded text */
    struct tok_dec_work w;
    int has_fallback; /* decoder has ByteFallback: an open byte group is held back */
};

static int tok_dec_has(const struct tok_dec *d, enum tok_dec_type type)
{
    if (!d) return 0;
    if (d->type == type) return 1;
    for (int k = 0; k < d->n_kids; k++)
        if (tok_dec_has(&d->kids[k], type)) return 1;
    return 0;
}

struct tok_stream *tok_stream_new(const struct tok *t, int skip_special)
{
    struct tok_stream *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    s->win_starts_seq = 1;
    s->has_fallback = tok_dec_has(t->dec, TOK_DEC_BYTEFALLBACK);
    s->w.md = pcre2_match_data_create(4, NULL);
    if (!s->w.md || cairn_buf_reserve(&s->text, 256)) {
        tok_stream_free(s);
        return NULL;
    }
    return s;
}

void tok_stream_reset(struct tok_stream *s)
{
    s->win.n = 0;
    s->win_starts_seq = 1;
    s->emitted = 0;
    s->text.n = 0;
}

void tok_stream_free(struct tok_stream *s)
{
    if (!s) return;
    free(s->win.v);
    cairn_buf_free(&s->text);
    tok_dec_work_free(&s->w);
    free(s);
}

/* Bytes of the window's text that can no longer change: all but an unfinished character's
 * U+FFFD (ByteLevel) and a tail that a Strip decoder would remove at the end of the sequence.
 * (Open byte-fallback groups were left out of the decode by the caller.) */
static size_t tok_stable_len(const struct tok *t, const struct cairn_buf *b, int tail_open)
{
    size_t n = b->n;
    if (tail_open && n >= 3 && !memcmp(b->p + n - 3, TOK_FFFD, 3)) n -= 3;
    if (t->strip_tail_len && n == b->n) {
        for (int q = 0; q < t->strip_tail_n && n >= t->strip_tail_len &&
                        !memcmp(b->p + n - t->strip_tail_len, t->strip_tail, t->strip_tail_len);
             q++)
            n -= t->strip_tail_len;
    }
    return n;
}

int tok_stream_feed(struct tok_stream *s, int32_t id, const char **text, size_t *len)
{
    const struct tok *t = s->t;
    *text = "";
    *len = 0;
    if (!tok_id_to_piece(t, id) || (s->skip_special && t->special[id])) return CAIRN_OK;
    if (tok_ids_push(&s->win, id)) return CAIRN_ERR_NOMEM;
    size_t n = s->win.n;
    if (s->has_fallback)
        while (n > 0 && t->id_byte[s->win.v[n - 1]])
            n--;
    int st = tok_dec_run(t, &s->w, s->win.v, n, s->win_starts_seq, 0, &s->text);
    if (st) return st;
    size_t stable = tok_stable_len(t, &s->text, s->w.tail_open);
    if (stable > s->emitted) {
        *text = s->text.p + s->emitted;
        *len = stable - s->emitted;
        s->emitted = stable;
    }
    if (stable == s->text.n && n == s->win.n && s->emitted == s->text.n) {
        /* settled: the next window starts after these tokens */
        s->win.n = 0;
        s->win_starts_seq = 0;
        s->emitted = 0;
    }
    return CAIRN_OK;
}

int tok_stream_flush(struct tok_stream *s, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    int st = tok_dec_run(s->t, &s->w, s->win.v, s->win.n, s->win_starts_seq, 1, &s->text);
    if (st) return st;
    if (s->text.n > s->emitted) {
        *text = s->text.p + s->emitted;
        *len = s->text.n - s->emitted;
    }
    s->win.n = 0;
    s->emitted = 0;
    s->win_starts_seq = 1;
    return CAIRN_OK;
}

/* ---- token bytes (for grammar-constrained decoding) ---- */

int tok_vocab_bytes(const struct tok *t, uint8_t **blob, const uint8_t ***bytes, size_t **lens,
                    struct cairn_err *err)
{
    size_t n = (size_t)t->n_vocab;
    struct cairn_buf all = {0}, one = {0};
    struct tok_dec_work w;
    memset(&w, 0, sizeof(w));
    size_t *off = malloc((n + 1) * sizeof(size_t));
    *blob = NULL;
    *bytes = NULL;
    *lens = malloc((n ? n : 1) * sizeof(size_t));
    w.md = pcre2_match_data_create(4, NULL);
    int bytelevel = tok_dec_has(t->dec, TOK_DEC_BYTELEVEL), st = CAIRN_OK;
    if (!off || !*lens || !w.md) goto nomem;
    for (size_t i = 0; i < n; i++) {
        int32_t id = (int32_t)i;
        const char *p = tok_id_to_piece(t, id);
        size_t pl = p ? t->piece_len[id] : 0, at = all.n;
        off[i] = at;
        if (!p || t->special[id]) continue; /* no bytes: never allowed by a grammar */
        if (t->is_added[id]) {
            st = cairn_buf_put(&all, p, pl);
        } else if (t->id_byte && t->id_byte[id]) {
            char b = (char)(t->id_byte[id] - 1);
            st = cairn_buf_put(&all, &b, 1);
        } else if (bytelevel) {
            for (size_t k = 0; k < pl && !st;) {
                uint32_t cp;
                size_t l = cairn_utf8_get(p, pl, k, &cp);
                int b = tok_cp_to_byte(cp);
                if (b < 0) { /* not a byte-level piece: its text as is */
                    all.n = at;
                    st = cairn_buf_put(&all, p, pl);
                    break;
                }
                char c = (char)b;
                st = cairn_buf_put(&all, &c, 1);
                k += l;
            }
        } else {
            /* the decoder pipeline on this one token, as a token inside a text */
            st = tok_dec_run(t, &w, &id, 1, 0, 0, &one);
            if (!st) st = cairn_buf_put(&all, one.p, one.n);
        }
        if (st) goto nomem;
    }
    off[n] = all.n;
    *bytes = malloc((n ? n : 1) * sizeof(uint8_t *));
    if (!*bytes || cairn_buf_reserve(&all, 1)) goto nomem;
    for (size_t i = 0; i < n; i++) {
        (*bytes)[i] = (const uint8_t *)all.p + off[i];
        (*lens)[i] = off[i + 1] - off[i];
    }
    *blob = (uint8_t *)all.p;
    free(off);
    cairn_buf_free(&one);
    tok_dec_work_free(&w);
    return CAIRN_OK;
nomem:
    free(off);
    free(*lens);
    free((void *)*bytes);
    *lens = NULL;
    *bytes = NULL;
    cairn_buf_free(&all);
    cairn_buf_free(&one);
    tok_dec_work_free(&w);
    return cairn_err_set(err, CAIRN_ERR_NOMEM, "tokenizer: out of memory for the token byte strings");
}
