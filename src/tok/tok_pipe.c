/* tok normalizers and pre-tokenizers, with HF tokenizers' semantics.
 *
 * Pre-tokenized state is a list of spans into a buffer; splitting stages produce new spans of
 * the same buffer, transforming stages (ByteLevel mapping, Metaspace) write the other of two
 * buffers. Empty pieces are dropped after every stage, as HF does. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok/tok_int.h"

/* ---- normalizers ---- */

static int tok_is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return 0;
    return 1;
}

/* Rust's char::is_whitespace (Unicode White_Space). */
static int tok_is_ws(uint32_t c)
{
    if (c == ' ' || (c >= 0x09 && c <= 0x0d)) return 1;
    if (c < 0x80) return 0;
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static int tok_norm_one(const struct tok_norm *nm, pcre2_match_data *md, const char *s, size_t n,
                        struct cairn_buf *out)
{
    out->n = 0;
    if (cairn_buf_reserve(out, n + 1)) return CAIRN_ERR_NOMEM;
    switch (nm->type) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: {
        if (tok_is_ascii(s, n)) return cairn_buf_put(out, s, n);
        int opt = UTF8PROC_STABLE;
        if (nm->type == TOK_NORM_NFC) opt |= UTF8PROC_COMPOSE;
        if (nm->type == TOK_NORM_NFD) opt |= UTF8PROC_DECOMPOSE;
        if (nm->type == TOK_NORM_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        if (nm->type == TOK_NORM_NFKD) opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        utf8proc_uint8_t *r = NULL;
        utf8proc_ssize_t rn = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &r,
                                           (utf8proc_option_t)opt);
        if (rn < 0) {
            free(r);
            return CAIRN_ERR_FORMAT;
        }
        int st = cairn_buf_put(out, r, (size_t)rn);
        free(r);
        return st;
    }
    case TOK_NORM_LOWERCASE:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = cairn_utf8_get(s, n, i, &cp);
            char tmp[4];
            uint32_t lc = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            if (cairn_buf_put(out, tmp, cairn_utf8_put(lc, tmp))) return CAIRN_ERR_NOMEM;
            i += l;
        }
        return CAIRN_OK;
    case TOK_NORM_STRIP_ACCENTS:
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t l = cairn_utf8_get(s, n, i, &cp);
            if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN)
                if (cairn_buf_put(out, s + i, l)) return CAIRN_ERR_NOMEM;
            i += l;
        }
        return CAIRN_OK;
    case TOK_NORM_STRIP: {
        size_t a = 0, b = n;
        if (nm->left)
            while (a < b) {
                uint32_t cp;
                size_t l = cairn_utf8_get(s, n, a, &cp);
                if (!tok_is_ws(cp)) break;
                a += l;
            }
        if (nm->right)
            while (b > a) {
                size_t k = b - 1;
                while (k > a && ((uint8_t)s[k] & 0xc0) == 0x80)
                    k--;
                uint32_t cp;
                cairn_utf8_get(s, n, k, &cp);
                if (!tok_is_ws(cp)) break;
                b = k;
            }
        return cairn_buf_put(out, s + a, b - a);
    }
    case TOK_NORM_PREPEND:
        if (n && cairn_buf_put(out, nm->content, nm->content_len)) return CAIRN_ERR_NOMEM;
        return cairn_buf_put(out, s, n);
    case TOK_NORM_REPLACE: {
        size_t i = 0;
        for (;;) {
            size_t ms, me;
            if (nm->re.code) {
                int r = tok_re_next(&nm->re, md, s, n, i, &ms, &me);
                if (r < 0) return r;
                if (!r) break;
            } else {
                if (!nm->pat_len) break;
                const char *f = memmem(s + i, n - i, nm->pat, nm->pat_len);
                if (!f) break;
                ms = (size_t)(f - s);
                me = ms + nm->pat_len;
            }
            if (cairn_buf_put(out, s + i, ms - i) || cairn_buf_put(out, nm->content, nm->content_len))
                return CAIRN_ERR_NOMEM;
            i = me;
        }
        return cairn_buf_put(out, s + i, n - i);
    }
    case TOK_NORM_SEQUENCE:
        break;
    }
    return cairn_buf_put(out, s, n);
}

int tok_norm_apply(const struct tok_norm *nm, pcre2_match_data *md, const char *s, size_t n,
                   struct cairn_buf *out, struct cairn_buf *tmp)
{
    if (nm->type != TOK_NORM_SEQUENCE) return tok_norm_one(nm, md, s, n, out);
    out->n = 0;
    if (cairn_buf_put(out, s, n)) return CAIRN_ERR_NOMEM;
    for (int k = 0; k < nm->n_kids; k++) {
        int st;
        if (nm->kids[k].type == TOK_NORM_SEQUENCE) {
            struct cairn_buf t2 = {0};
            st = tok_norm_apply(&nm->kids[k], md, out->p, out->n, tmp, &t2);
            cairn_buf_free(&t2);
        } else {
            st = tok_norm_apply(&nm->kids[k], md, out->p, out->n, tmp, NULL);
        }
        if (st) return st;
        struct cairn_buf x = *out;
        *out = *tmp;
        *tmp = x;
    }
    return CAIRN_OK;
}

void tok_norm_free(struct tok_norm *nm)
{
    if (!nm) return;
    for (int k = 0; k < nm->n_kids; k++)
        tok_norm_free(&nm->kids[k]);
    free(nm->kids);
    free(nm->pat);
    free(nm->content);
    tok_re_free(&nm->re);
}

void tok_pretok_free(struct tok_pretok *p)
{
    if (!p) return;
    for (int k = 0; k < p->n_kids; k++)
        tok_pretok_free(&p->kids[k]);
    free(p->kids);
    free(p->lit);
    tok_re_free(&p->re);
}

/* ---- pre-tokenizers ---- */

/* A piece cut into alternating (match / no match) ranges. */
struct tok_cut {
    size_t a, b;
    int m;
};

struct tok_cuts {
    struct tok_cut *v;
    size_t n, cap;
};

static int tok_cuts_push(struct tok_cuts *c, size_t a, size_t b, int m)
{
    if (a == b) return CAIRN_OK;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        struct tok_cut *v = realloc(c->v, cap * sizeof(*v));
        if (!v) return CAIRN_ERR_NOMEM;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = (struct tok_cut){a, b, m};
    return CAIRN_OK;
}

static int tok_is_punct(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2f) || (cp >= 0x3a && cp <= 0x40) ||
               (cp >= 0x5b && cp <= 0x60) || (cp >= 0x7b && cp <= 0x7e);
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* Finds the match ranges of stage p in s[0..n) (offsets relative to s). */
static int tok_find(const struct tok_pretok *p, pcre2_match_data *md, const char *s, size_t n,
                    struct tok_cuts *c, int invert)
{
    size_t prev = 0, i = 0;
    c->n = 0;
    int st = CAIRN_OK;
    for (;;) {
        size_t ms, me;
        if (p->type == TOK_PRE_SPLIT && !p->re.code) {
            if (!p->lit_len) break;
            const char *f = i <= n ? memmem(s + i, n - i, p->lit, p->lit_len) : NULL;
            if (!f) break;
            ms = (size_t)(f - s);
            me = ms + p->lit_len;
        } else if (p->re.code) {
            int r = tok_re_next(&p->re, md, s, n, i, &ms, &me);
            if (r < 0) return r;
            if (!r) break;
        } else {
            /* per-character predicates: each char is its own match */
            ms = n;
            while (i < n) {
                uint32_t cp;
                size_t l = cairn_utf8_get(s, n, i, &cp);
                int hit = p->type == TOK_PRE_DIGITS        ? (cp >= '0' && cp <= '9')
                          : p->type == TOK_PRE_PUNCTUATION ? tok_is_punct(cp)
                                                           : tok_is_ws(cp);
                if (hit) {
                    ms = i;
                    me = i + l;
                    break;
                }
                i += l;
            }
            if (ms == n) break;
        }
        if ((st = tok_cuts_push(c, prev, ms, invert))) return st;
        if ((st = tok_cuts_push(c, ms, me, !invert))) return st;
        prev = i = me;
    }
    return tok_cuts_push(c, prev, n, invert);
}

/* Applies a split behaviour to cuts of the piece at `off`, pushing spans into out. */
static int tok_behave(const struct tok_cuts *c, enum tok_split_behavior b, size_t off,
                      struct tok_spans *out)
{
    size_t base = out->n;
    int prev_m = 0;
    switch (b) {
    case TOK_SPLIT_REMOVED:
        for (size_t k = 0; k < c->n; k++)
            if (!c->v[k].m && tok_spans_push(out, off + c->v[k].a, c->v[k].b - c->v[k].a))
                return CAIRN_ERR_NOMEM;
        return CAIRN_OK;
    case TOK_SPLIT_ISOLATED:
        for (size_t k = 0; k < c->n; k++)
            if (tok_spans_push(out, off + c->v[k].a, c->v[k].b - c->v[k].a)) return CAIRN_ERR_NOMEM;
        return CAIRN_OK;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t k = 0; k < c->n; k++) {
            if (c->v[k].m && !prev_m && out->n > base)
                out->v[out->n - 1].len = off + c->v[k].b - out->v[out->n - 1].off;
            else if (tok_spans_push(out, off + c->v[k].a, c->v[k].b - c->v[k].a))
                return CAIRN_ERR_NOMEM;
            prev_m = c->v[k].m;
        }
        return CAIRN_OK;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t k = 0; k < c->n; k++) {
            if (c->v[k].m == prev_m && out->n > base)
                out->v[out->n - 1].len = off + c->v[k].b - out->v[out->n - 1].off;
            else if (tok_spans_push(out, off + c->v[k].a, c->v[k].b - c->v[k].a))
                return CAIRN_ERR_NOMEM;
            prev_m = c->v[k].m;
        }
        return CAIRN_OK;
    case TOK_SPLIT_MERGED_NEXT:
        /* walk backwards, merging a match into the span after it */
        for (size_t kk = c->n; kk-- > 0;) {
            if (c->v[kk].m && !prev_m && out->n > base) {
                struct tok_span *l = &out->v[out->n - 1];
                l->len += l->off - (off + c->v[kk].a);
                l->off = off + c->v[kk].a;
            } else if (tok_spans_push(out, off + c->v[kk].a, c->v[kk].b - c->v[kk].a)) {
                return CAIRN_ERR_NOMEM;
            }
            prev_m = c->v[kk].m;
        }
        for (size_t a = base, z = out->n; a + 1 < z; a++, z--) {
            struct tok_span t = out->v[a];
            out->v[a] = out->v[z - 1];
            out->v[z - 1] = t;
        }
        return CAIRN_OK;
    }
    return CAIRN_OK;
}

static int tok_split_stage(const struct tok_pretok *p, struct tok_pre_work *w, int cur,
                           enum tok_split_behavior b, int invert)
{
    struct tok_cuts c = {0};
    const struct cairn_buf *buf = &w->buf[cur];
    struct tok_spans *in = &w->sp[cur];
    w->tmp.n = 0;
    int st = CAIRN_OK;
    for (size_t k = 0; k < in->n && !st; k++) {
        st = tok_find(p, w->md, buf->p + in->v[k].off, in->v[k].len, &c, invert);
        if (!st) st = tok_behave(&c, b, in->v[k].off, &w->tmp);
    }
    free(c.v);
    struct tok_spans x = *in;
    *in = w->tmp;
    w->tmp = x;
    return st;
}

static int tok_pre_apply(const struct tok_pretok *p, struct tok_pre_work *w, int *cur, int first)
{
    int st = CAIRN_OK;
    switch (p->type) {
    case TOK_PRE_SEQUENCE:
        for (int k = 0; k < p->n_kids && !st; k++)
            st = tok_pre_apply(&p->kids[k], w, cur, first);
        return st;
    case TOK_PRE_SPLIT:
        return tok_split_stage(p, w, *cur, p->behavior, p->invert);
    case TOK_PRE_DIGITS:
        return tok_split_stage(p, w, *cur,
                               p->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0);
    case TOK_PRE_PUNCTUATION:
        return tok_split_stage(p, w, *cur, p->behavior, 0);
    case TOK_PRE_WHITESPACE:
        return tok_split_stage(p, w, *cur, TOK_SPLIT_REMOVED, 1);
    case TOK_PRE_WHITESPACE_SPLIT:
        return tok_split_stage(p, w, *cur, TOK_SPLIT_REMOVED, 0);
    case TOK_PRE_BYTELEVEL: {
        int o = 1 - *cur;
        if (p->add_prefix_space) {
            struct cairn_buf *ob = &w->buf[o];
            struct tok_spans *os = &w->sp[o];
            ob->n = 0;
            os->n = 0;
            for (size_t k = 0; k < w->sp[*cur].n; k++) {
                struct tok_span sp = w->sp[*cur].v[k];
                size_t at = ob->n;
                if ((sp.len == 0 || w->buf[*cur].p[sp.off] != ' ') && cairn_buf_put(ob, " ", 1))
                    return CAIRN_ERR_NOMEM;
                if (cairn_buf_put(ob, w->buf[*cur].p + sp.off, sp.len) ||
                    tok_spans_push(os, at, ob->n - at))
                    return CAIRN_ERR_NOMEM;
            }
            *cur = o;
            o = 1 - *cur;
        }
        if (p->use_regex && (st = tok_split_stage(p, w, *cur, TOK_SPLIT_ISOLATED, 0))) return st;
        struct cairn_buf *ob = &w->buf[o];
        struct tok_spans *os = &w->sp[o];
        ob->n = 0;
        os->n = 0;
        const struct cairn_buf *ib = &w->buf[*cur];
        for (size_t k = 0; k < w->sp[*cur].n; k++) {
            struct tok_span sp = w->sp[*cur].v[k];
            if (cairn_buf_reserve(ob, sp.len * 2 + 1)) return CAIRN_ERR_NOMEM;
            size_t at = ob->n;
            for (size_t i = 0; i < sp.len; i++)
                ob->n += cairn_utf8_put(tok_byte_to_cp[(uint8_t)ib->p[sp.off + i]], ob->p + ob->n);
            if (tok_spans_push(os, at, ob->n - at)) return CAIRN_ERR_NOMEM;
        }
        *cur = o;
        return CAIRN_OK;
    }
    case TOK_PRE_METASPACE: {
        int o = 1 - *cur;
        struct cairn_buf *ob = &w->buf[o];
        struct tok_spans *os = &w->sp[o];
        ob->n = 0;
        os->n = 0;
        const struct cairn_buf *ib = &w->buf[*cur];
        for (size_t k = 0; k < w->sp[*cur].n; k++) {
            struct tok_span sp = w->sp[*cur].v[k];
            size_t at = ob->n;
            const char *s = ib->p + sp.off;
            int starts = sp.len >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0;
            if (!starts && sp.len && s[0] == ' ') starts = 1; /* becomes the replacement */
            int pre = p->prepend == TOK_PREPEND_ALWAYS ||
                      (p->prepend == TOK_PREPEND_FIRST && first && k == 0);
            if (pre && !starts && cairn_buf_put(ob, p->repl, p->repl_len)) return CAIRN_ERR_NOMEM;
            for (size_t i = 0; i < sp.len; i++) {
                int r =
                    s[i] == ' ' ? cairn_buf_put(ob, p->repl, p->repl_len) : cairn_buf_put(ob, s + i, 1);
                if (r) return r;
            }
            if (tok_spans_push(os, at, ob->n - at)) return CAIRN_ERR_NOMEM;
        }
        *cur = o;
        if (!p->split) return CAIRN_OK;
        struct tok_pretok lit = {.type = TOK_PRE_SPLIT};
        lit.lit = (char *)p->repl;
        lit.lit_len = p->repl_len;
        return tok_split_stage(&lit, w, *cur, TOK_SPLIT_MERGED_NEXT, 0);
    }
    }
    return CAIRN_OK;
}

int tok_pretok_run(const struct tok_pretok *p, struct tok_pre_work *w, const char *s, size_t n,
                   int first, const struct cairn_buf **out_buf, const struct tok_spans **out_spans)
{
    int cur = 0;
    w->buf[0].n = 0;
    w->sp[0].n = 0;
    if (cairn_buf_put(&w->buf[0], s, n)) return CAIRN_ERR_NOMEM;
    if (n && tok_spans_push(&w->sp[0], 0, n)) return CAIRN_ERR_NOMEM;
    int st = p ? tok_pre_apply(p, w, &cur, first) : CAIRN_OK;
    *out_buf = &w->buf[cur];
    *out_spans = &w->sp[cur];
    return st;
}
