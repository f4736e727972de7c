/* tmpl string operations shared by methods and filters: strip, Python/jinja2 case mapping
 * (tables in tmpl_case.c), replace, split, prefix/suffix tests and padding. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/tmpl_builtins_int.h"

/* ---- string helpers ---- */

static int tmpl_bi_in_chars(uint32_t cp, struct tmpl_tv chars)
{
    size_t i = 0;
    while (i < chars.u.s.n)
        if (cairn_utf8_next(chars.u.s.p, chars.u.s.n, &i) == cp) return 1;
    return 0;
}

/* Python str.strip family; chars NONE = whitespace. */
struct tmpl_tv tmpl_bi_strip(struct tmpl_tv s, struct tmpl_tv chars, int left, int right)
{
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    int ws = chars.t != TMPL_TV_STR;
    if (left)
        while (a < b) {
            size_t k = a;
            uint32_t cp = cairn_utf8_next(p, b, &k);
            if (ws ? !tmpl_py_isspace(cp) : !tmpl_bi_in_chars(cp, chars)) break;
            a = k;
        }
    if (right)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t k = st;
            uint32_t cp = cairn_utf8_next(p, b, &k);
            if (ws ? !tmpl_py_isspace(cp) : !tmpl_bi_in_chars(cp, chars)) break;
            b = st;
        }
    return tmpl_tv_str(p + a, b - a);
}

/* ---- case mapping (tmpl_case.c has the tables) ---- */

static uint32_t *tmpl_bi_decode(struct tmpl_rstate *r, struct tmpl_tv s, size_t *n)
{
    size_t cnt = cairn_utf8_count(s.u.s.p, s.u.s.n), i = 0;
    uint32_t *cps = tmpl_alloc(r, (cnt + 1) * sizeof(uint32_t));
    for (size_t k = 0; k < cnt; k++) cps[k] = cairn_utf8_next(s.u.s.p, s.u.s.n, &i);
    *n = cnt;
    return cps;
}

enum { TC_LOWER, TC_UPPER, TC_SWAP, TC_PYTITLE, TC_CAPITALIZE, TC_JTITLE };

static int tmpl_bi_jtitle_sep(uint32_t cp)
{
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tmpl_py_isspace(cp);
}

/* Python str.lower/upper/swapcase/title/capitalize and jinja2's title filter. */
static struct tmpl_tv tmpl_bi_case(struct tmpl_rstate *r, struct tmpl_tv s, int mode)
{
    size_t n;
    uint32_t *cps = tmpl_bi_decode(r, s, &n);
    struct tmpl_buf b = {0};
    tmpl_buf_put(r, &b, "", 0);
    int prev_cased = 0;
    size_t word_start = 0; /* TC_JTITLE: lowercase context starts after a word's first char */
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i], out[3];
        char m = 0;
        const uint32_t *ctx = cps;
        size_t ctx_n = n, ctx_i = i;
        switch (mode) {
        case TC_LOWER: m = 'l'; break;
        case TC_UPPER: m = 'u'; break;
        case TC_SWAP: m = tmpl_case_is_upper(cp) ? 'l' : tmpl_case_is_lower(cp) ? 'u' : 0; break;
        case TC_PYTITLE:
            m = prev_cased ? 'l' : 't';
            prev_cased = tmpl_case_is_cased(cp);
            break;
        case TC_CAPITALIZE: m = i == 0 ? 't' : 'l'; break;
        case TC_JTITLE:
            if (tmpl_bi_jtitle_sep(cp)) {
                m = 0;
                word_start = i + 1;
            } else if (i == word_start) {
                m = 'u';
            } else {
                size_t e = i;
                while (e < n && !tmpl_bi_jtitle_sep(cps[e])) e++;
                ctx = cps + word_start + 1;
                ctx_n = e - word_start - 1;
                ctx_i = i - word_start - 1;
                m = 'l';
            }
            break;
        }
        size_t k = 1;
        if (m) k = tmpl_case_map(ctx, ctx_n, ctx_i, m, out);
        else out[0] = cp;
        for (size_t j = 0; j < k; j++) {
            char enc[4];
            tmpl_buf_put(r, &b, enc, cairn_utf8_put(out[j], enc));
        }
    }
    return tmpl_buf_to_str(r, &b);
}

struct tmpl_tv tmpl_bi_map_case(struct tmpl_rstate *r, struct tmpl_tv s, int mode)
{
    return tmpl_bi_case(r, s, mode == 0 ? TC_LOWER : mode == 1 ? TC_UPPER : TC_SWAP);
}

struct tmpl_tv tmpl_bi_pytitle(struct tmpl_rstate *r, struct tmpl_tv s) { return tmpl_bi_case(r, s, TC_PYTITLE); }
struct tmpl_tv tmpl_bi_capitalize(struct tmpl_rstate *r, struct tmpl_tv s) { return tmpl_bi_case(r, s, TC_CAPITALIZE); }
struct tmpl_tv tmpl_bi_jtitle(struct tmpl_rstate *r, struct tmpl_tv s) { return tmpl_bi_case(r, s, TC_JTITLE); }

struct tmpl_tv tmpl_bi_replace(struct tmpl_rstate *r, struct tmpl_tv s, struct tmpl_tv old, struct tmpl_tv new_, int64_t count)
{
    struct tmpl_buf b = {0};
    tmpl_buf_put(r, &b, "", 0);
    if (old.u.s.n == 0) {
        size_t i = 0;
        int64_t done = 0;
        while (1) {
            if (count < 0 || done < count) {
                tmpl_buf_put(r, &b, new_.u.s.p, new_.u.s.n);
                done++;
            }
            if (i >= s.u.s.n) break;
            size_t st = i;
            cairn_utf8_next(s.u.s.p, s.u.s.n, &i);
            tmpl_buf_put(r, &b, s.u.s.p + st, i - st);
        }
        return tmpl_buf_to_str(r, &b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s.u.s.n) {
        const char *hit = (count < 0 || done < count)
                              ? memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n) : NULL;
        if (!hit) {
            tmpl_buf_put(r, &b, s.u.s.p + i, s.u.s.n - i);
            break;
        }
        size_t h = (size_t)(hit - s.u.s.p);
        tmpl_buf_put(r, &b, s.u.s.p + i, h - i);
        tmpl_buf_put(r, &b, new_.u.s.p, new_.u.s.n);
        i = h + old.u.s.n;
        done++;
        tmpl_step(r);
    }
    return tmpl_buf_to_str(r, &b);
}

struct tmpl_tv tmpl_bi_split(struct tmpl_rstate *r, struct tmpl_tv s, struct tmpl_tv sep, int64_t maxsplit, int from_right)
{
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    /* collect into a growing arena list */
    size_t cap = 8, cnt = 0;
    struct tmpl_tv *items = tmpl_alloc(r, cap * sizeof(*items));
#define PUSH(v)                                                                                    \
    do {                                                                                           \
        if (cnt == cap) {                                                                          \
            struct tmpl_tv *ni = tmpl_alloc(r, cap * 2 * sizeof(*ni));                                    \
            memcpy(ni, items, cnt * sizeof(*ni));                                                  \
            items = ni;                                                                            \
            cap *= 2;                                                                              \
        }                                                                                          \
        items[cnt++] = (v);                                                                        \
        tmpl_step(r);                                                                              \
    } while (0)
    if (sep.t == TMPL_TV_STR) {
        if (sep.u.s.n == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "empty separator");
        if (!from_right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
                if (!hit) {
                    PUSH(tmpl_tv_str(p + i, n - i));
                    break;
                }
                PUSH(tmpl_tv_str(p + i, (size_t)(hit - p) - i));
                i = (size_t)(hit - p) + sep.u.s.n;
                done++;
            }
        } else {
            size_t end = n;
            int64_t done = 0;
            for (;;) {
                long found = -1;
                if ((maxsplit < 0 || done < maxsplit) && end >= sep.u.s.n)
                    for (size_t k = end - sep.u.s.n + 1; k-- > 0;)
                        if (!memcmp(p + k, sep.u.s.p, sep.u.s.n)) {
                            found = (long)k;
                            break;
                        }
                if (found < 0) {
                    PUSH(tmpl_tv_str(p, end));
                    break;
                }
                PUSH(tmpl_tv_str(p + found + sep.u.s.n, end - (size_t)found - sep.u.s.n));
                end = (size_t)found;
                done++;
            }
            for (size_t k = 0; k < cnt / 2; k++) {
                struct tmpl_tv t = items[k];
                items[k] = items[cnt - 1 - k];
                items[cnt - 1 - k] = t;
            }
        }
    } else {
        /* whitespace split: runs of whitespace, no empty strings */
        if (!from_right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                while (i < n) {
                    size_t k = i;
                    if (!tmpl_py_isspace(cairn_utf8_next(p, n, &k))) break;
                    i = k;
                }
                if (i >= n) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    PUSH(tmpl_tv_str(p + i, n - i));
                    break;
                }
                size_t st = i;
                while (i < n) {
                    size_t k = i;
                    if (tmpl_py_isspace(cairn_utf8_next(p, n, &k))) break;
                    i = k;
                }
                PUSH(tmpl_tv_str(p + st, i - st));
                done++;
            }
        } else {
            struct tmpl_tv rest = tmpl_bi_strip(s, tmpl_tv_none(), 0, 1);
            size_t end = rest.u.s.n;
            int64_t done = 0;
            while (end > 0) {
                if (maxsplit >= 0 && done >= maxsplit) {
                    PUSH(tmpl_tv_str(p, end));
                    break;
                }
                size_t st = end;
                while (st > 0) {
                    size_t b0 = st - 1;
                    while (b0 > 0 && ((unsigned char)p[b0] & 0xC0) == 0x80) b0--;
                    size_t k = b0;
                    if (tmpl_py_isspace(cairn_utf8_next(p, end, &k))) break;
                    st = b0;
                }
                PUSH(tmpl_tv_str(p + st, end - st));
                done++;
                end = st;
                while (end > 0) {
                    size_t b0 = end - 1;
                    while (b0 > 0 && ((unsigned char)p[b0] & 0xC0) == 0x80) b0--;
                    size_t k = b0;
                    if (!tmpl_py_isspace(cairn_utf8_next(p, end, &k))) break;
                    end = b0;
                }
            }
            for (size_t k = 0; k < cnt / 2; k++) {
                struct tmpl_tv t = items[k];
                items[k] = items[cnt - 1 - k];
                items[cnt - 1 - k] = t;
            }
        }
    }
#undef PUSH
    struct tmpl_tv_list *l = tmpl_alloc(r, sizeof(*l));
    l->n = cnt;
    l->items = items;
    return TMPL_TV_LISTV(l);
}

int64_t tmpl_bi_cp_index(struct tmpl_tv s, size_t byte_off) { return (int64_t)cairn_utf8_count(s.u.s.p, byte_off); }

int tmpl_bi_affix(struct tmpl_tv s, struct tmpl_tv a, int end)
{
    if (a.u.s.n > s.u.s.n) return 0;
    return !memcmp(s.u.s.p + (end ? s.u.s.n - a.u.s.n : 0), a.u.s.p, a.u.s.n);
}

struct tmpl_tv tmpl_bi_pad(struct tmpl_rstate *r, struct tmpl_tv s, int64_t width, struct tmpl_tv fill, int mode)
{
    size_t len = cairn_utf8_count(s.u.s.p, s.u.s.n);
    if (width <= (int64_t)len) return s;
    if (width > (int64_t)r->lim.max_output_bytes) tmpl_fail(r, CAIRN_ERR_LIMIT, "padding too large");
    size_t total = (size_t)width - len, left;
    if (mode == 0) left = total / 2 + (total & (size_t)width & 1); /* Python center */
    else if (mode == 1) left = 0;
    else left = total;
    struct tmpl_buf b = {0};
    for (size_t i = 0; i < left; i++) tmpl_buf_put(r, &b, fill.u.s.p, fill.u.s.n);
    tmpl_buf_put(r, &b, s.u.s.p, s.u.s.n);
    for (size_t i = left; i < total; i++) tmpl_buf_put(r, &b, fill.u.s.p, fill.u.s.n);
    return tmpl_buf_to_str(r, &b);
}
