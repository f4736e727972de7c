/* tmpl built-ins: attribute and item access (jinja2 sandbox rules: dict/str/list methods, then
 * keys; mutating methods are unsafe and not callable), slicing by code points, Python str /
 * dict / list methods, jinja2 filters and tests, and the globals range, namespace, dict,
 * raise_exception, strftime_now. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/tmpl_int.h"

#define TV_LISTV(x_) ((struct tv){.t = TV_LIST, .u.l = (x_)})
#define TV_DICTV(x_) ((struct tv){.t = TV_DICT, .u.d = (x_)})


static int tb_streq(struct tv v, const char *s)
{
    return v.t == TV_STR && v.u.s.n == strlen(s) && !memcmp(v.u.s.p, s, v.u.s.n);
}

static void tb_undef_fail(struct trender *r, struct tv v)
{
    if (v.u.s.n) tmpl_fail(r, CAIRN_ERR_INVALID, "%.*s", (int)v.u.s.n, v.u.s.p);
    tmpl_fail(r, CAIRN_ERR_INVALID, "value is undefined");
}

static struct tv tb_need_str(struct trender *r, struct tv v, const char *what)
{
    if (v.t != TV_STR)
        tmpl_fail(r, CAIRN_ERR_INVALID, "%s must be str, not %s", what, tv_type_name(v));
    return v;
}

static int64_t tb_need_int(struct trender *r, struct tv v, const char *what)
{
    if (v.t == TV_INT) return v.u.i;
    if (v.t == TV_BOOL) return v.u.b;
    tmpl_fail(r, CAIRN_ERR_INVALID, "%s must be an integer, not %s", what, tv_type_name(v));
}

/* byte offsets of each code point (n_cp + 1 entries) */
static size_t *tb_offsets(struct trender *r, struct tv s, size_t *n_cp)
{
    tmpl_step_bytes(r, s.u.s.n);
    size_t n = tutf8_len(s.u.s.p, s.u.s.n);
    size_t *off = tr_alloc(r, (n + 1) * sizeof(size_t));
    size_t i = 0;
    for (size_t k = 0; k < n; k++) {
        off[k] = i;
        tutf8_next(s.u.s.p, s.u.s.n, &i);
    }
    off[n] = s.u.s.n;
    *n_cp = n;
    return off;
}

static struct tv tb_list_of(struct trender *r, size_t n)
{
    return TV_LISTV(tv_list_new(r, n));
}

/* ---- item access and slicing ---- */

struct tv tmpl_slice(struct trender *r, struct tv obj, struct tv start, struct tv stop, struct tv step)
{
    int64_t st = step.t == TV_NONE ? 1 : tb_need_int(r, step, "slice step");
    if (st == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "slice step cannot be zero");
    size_t n_cp = 0, *off = NULL;
    int64_t len;
    if (obj.t == TV_STR) {
        off = tb_offsets(r, obj, &n_cp);
        len = (int64_t)n_cp;
    } else if (obj.t == TV_LIST) {
        if (obj.u.l->kind != TL_PLAIN && obj.u.l->kind != TL_RANGE)
            tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not subscriptable", tv_type_name(obj));
        len = (int64_t)obj.u.l->n;
    } else {
        tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not subscriptable", tv_type_name(obj));
    }
    int64_t a, b;
    if (st > 0) {
        a = start.t == TV_NONE ? 0 : tb_need_int(r, start, "slice index");
        b = stop.t == TV_NONE ? len : tb_need_int(r, stop, "slice index");
        if (a < 0) a = a + len < 0 ? 0 : a + len;
        if (b < 0) b = b + len < 0 ? 0 : b + len;
        if (a > len) a = len;
        if (b > len) b = len;
    } else {
        a = start.t == TV_NONE ? len - 1 : tb_need_int(r, start, "slice index");
        b = stop.t == TV_NONE ? -1 : tb_need_int(r, stop, "slice index");
        if (start.t != TV_NONE && a < 0) a = a + len < 0 ? -1 : a + len;
        if (stop.t != TV_NONE && b < 0) b = b + len < 0 ? -1 : b + len;
        if (a >= len) a = len - 1;
        if (b >= len) b = len - 1;
    }
    size_t count = 0;
    if (st > 0 && b > a) count = (size_t)((uint64_t)(b - a - 1) / (uint64_t)st + 1);
    if (st < 0 && a > b) {
        uint64_t ust = st == INT64_MIN ? (uint64_t)INT64_MAX + 1 : (uint64_t)-st;
        count = (size_t)((uint64_t)(a - b - 1) / ust + 1);
    }
    if (obj.t == TV_LIST) {
        struct tv_list *l = tv_list_new(r, count);
        l->is_tuple = obj.u.l->is_tuple;
        for (size_t k = 0; k < count; k++) l->items[k] = obj.u.l->items[a + (int64_t)k * st];
        return TV_LISTV(l);
    }
    if (st == 1) return tv_str(obj.u.s.p + off[a], count ? off[b] - off[a] : 0);
    struct tbuf buf = {0};
    for (size_t k = 0; k < count; k++) {
        int64_t i = a + (int64_t)k * st;
        tbuf_put(r, &buf, obj.u.s.p + off[i], off[i + 1] - off[i]);
    }
    return tbuf_to_str(r, &buf);
}

static const char *const tb_str_methods[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "upper",
    "lower", "title", "capitalize", "find", "rfind", "index", "rindex", "count", "format", "join",
    "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "center",
    "ljust", "rjust", "zfill", "swapcase", "partition", "rpartition", "casefold", "isnumeric",
    "isdecimal", "removeprefix", "removesuffix", NULL};
static const char *const tb_dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const tb_dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const tb_list_methods[] = {"index", "count", "copy", NULL};
static const char *const tb_list_unsafe[] = {"append", "extend", "insert", "pop", "remove",
                                             "reverse", "sort", "clear", NULL};

static int tb_in(const char *const *list, const char *name)
{
    for (; *list; list++)
        if (!strcmp(*list, name)) return 1;
    return 0;
}

static struct tv tb_method(struct trender *r, struct tv self, const char *name)
{
    struct tv_method *m = tr_alloc(r, sizeof(*m));
    m->self = self;
    m->name = name;
    return (struct tv){.t = TV_METHOD, .u.meth = m};
}

/* Python getattr(obj, name) only; returns 0 when there is no such attribute. */
static int tb_pyattr(struct trender *r, struct tv obj, const char *name, struct tv *out)
{
    switch (obj.t) {
    case TV_STR:
        if (tb_in(tb_str_methods, name)) {
            *out = tb_method(r, obj, name);
            return 1;
        }
        return 0;
    case TV_DICT:
        if (tb_in(tb_dict_methods, name)) {
            *out = tb_method(r, obj, name);
            return 1;
        }
        if (tb_in(tb_dict_unsafe, name)) {
            *out = tv_undef(tr_printf(r, "access to attribute '%s' of 'dict' object is unsafe.", name));
            return 1;
        }
        return 0;
    case TV_LIST:
        if (obj.u.l->kind == TL_RANGE && (!strcmp(name, "index") || !strcmp(name, "count"))) {
            *out = tb_method(r, obj, name);
            return 1;
        }
        if (obj.u.l->kind != TL_PLAIN) return 0;
        if (tb_in(tb_list_methods, name)) {
            *out = tb_method(r, obj, name);
            return 1;
        }
        if (tb_in(tb_list_unsafe, name)) {
            *out = tv_undef(tr_printf(r, "access to attribute '%s' of '%s' object is unsafe.", name,
                                      tv_type_name(obj)));
            return 1;
        }
        return 0;
    default: return 0;
    }
}

struct tv tmpl_getattr(struct trender *r, struct tv obj, const char *name)
{
    struct tv v;
    if (obj.t == TV_LOOP) return tmpl_loop_attr(r, obj.u.loop, name);
    if (obj.t == TV_NS) {
        if (tv_dict_get_str(obj.u.d, name, &v)) return v;
        return tv_undef(tr_printf(r, "'Namespace object' has no attribute '%s'", name));
    }
    if (name[0] == '_')
        return tv_undef(tr_printf(r, "access to attribute '%s' of '%s' object is unsafe.", name, tv_type_name(obj)));
    if (tb_pyattr(r, obj, name, &v)) return v;
    if (obj.t == TV_DICT && tv_dict_get_str(obj.u.d, name, &v)) return v;
    return tv_undef(tr_printf(r, "'%s object' has no attribute '%s'", tv_type_name(obj), name));
}

struct tv tmpl_getitem(struct trender *r, struct tv obj, struct tv key)
{
    struct tv v;
    switch (obj.t) {
    case TV_DICT:
    case TV_NS:
        if (tv_dict_get(obj.u.d, key, &v)) return v;
        break;
    case TV_LIST:
        if (obj.u.l->kind != TL_PLAIN && obj.u.l->kind != TL_RANGE) break;
        if (key.t == TV_INT || key.t == TV_BOOL) {
            int64_t i = key.t == TV_INT ? key.u.i : key.u.b, n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj.u.l->items[i];
            return tv_undef(tr_printf(r, "%s object has no element %lld", tv_type_name(obj),
                                      (long long)(key.t == TV_INT ? key.u.i : key.u.b)));
        }
        break;
    case TV_STR:
        if (key.t == TV_INT || key.t == TV_BOOL) {
            size_t n;
            size_t *off = tb_offsets(r, obj, &n);
            int64_t i = key.t == TV_INT ? key.u.i : key.u.b;
            if (i < 0) i += (int64_t)n;
            if (i >= 0 && i < (int64_t)n) return tv_str(obj.u.s.p + off[i], off[i + 1] - off[i]);
            return tv_undef(tr_printf(r, "str object has no element %lld", (long long)i));
        }
        break;
    case TV_LOOP:
        if (key.t == TV_STR) return tmpl_getattr(r, obj, tv_str_copy(r, key.u.s.p, key.u.s.n).u.s.p);
        break;
    default: break;
    }
    if (key.t == TV_STR && obj.t != TV_NS) {
        const char *name = tv_str_copy(r, key.u.s.p, key.u.s.n).u.s.p;
        if (name[0] != '_' && tb_pyattr(r, obj, name, &v)) return v;
        return tv_undef(tr_printf(r, "'%s object' has no attribute '%s'", tv_type_name(obj), name));
    }
    struct tbuf kb = {0};
    tv_repr_append(r, &kb, key);
    return tv_undef(tr_printf(r, "'%s object' has no attribute %.*s", tv_type_name(obj),
                              (int)CAIRN_MIN(kb.n, 100), kb.p ? kb.p : ""));
}

/* ---- string helpers ---- */

static int tb_in_chars(uint32_t cp, struct tv chars)
{
    size_t i = 0;
    while (i < chars.u.s.n)
        if (tutf8_next(chars.u.s.p, chars.u.s.n, &i) == cp) return 1;
    return 0;
}

/* Python str.strip family; chars NONE = whitespace. */
static struct tv tb_strip(struct tv s, struct tv chars, int left, int right)
{
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    int ws = chars.t != TV_STR;
    if (left)
        while (a < b) {
            size_t k = a;
            uint32_t cp = tutf8_next(p, b, &k);
            if (ws ? !tpy_isspace(cp) : !tb_in_chars(cp, chars)) break;
            a = k;
        }
    if (right)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t k = st;
            uint32_t cp = tutf8_next(p, b, &k);
            if (ws ? !tpy_isspace(cp) : !tb_in_chars(cp, chars)) break;
            b = st;
        }
    return tv_str(p + a, b - a);
}

/* ---- case mapping (tmpl_case.c has the tables) ---- */

static uint32_t *tb_decode(struct trender *r, struct tv s, size_t *n)
{
    size_t cnt = tutf8_len(s.u.s.p, s.u.s.n), i = 0;
    uint32_t *cps = tr_alloc(r, (cnt + 1) * sizeof(uint32_t));
    for (size_t k = 0; k < cnt; k++) cps[k] = tutf8_next(s.u.s.p, s.u.s.n, &i);
    *n = cnt;
    return cps;
}

enum { TC_LOWER, TC_UPPER, TC_SWAP, TC_PYTITLE, TC_CAPITALIZE, TC_JTITLE };

static int tb_jtitle_sep(uint32_t cp)
{
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tpy_isspace(cp);
}

/* Python str.lower/upper/swapcase/title/capitalize and jinja2's title filter. */
static struct tv tb_case(struct trender *r, struct tv s, int mode)
{
    size_t n;
    uint32_t *cps = tb_decode(r, s, &n);
    struct tbuf b = {0};
    tbuf_put(r, &b, "", 0);
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
        case TC_SWAP: m = tcase_is_upper(cp) ? 'l' : tcase_is_lower(cp) ? 'u' : 0; break;
        case TC_PYTITLE:
            m = prev_cased ? 'l' : 't';
            prev_cased = tcase_is_cased(cp);
            break;
        case TC_CAPITALIZE: m = i == 0 ? 't' : 'l'; break;
        case TC_JTITLE:
            if (tb_jtitle_sep(cp)) {
                m = 0;
                word_start = i + 1;
            } else if (i == word_start) {
                m = 'u';
            } else {
                size_t e = i;
                while (e < n && !tb_jtitle_sep(cps[e])) e++;
                ctx = cps + word_start + 1;
                ctx_n = e - word_start - 1;
                ctx_i = i - word_start - 1;
                m = 'l';
            }
            break;
        }
        size_t k = 1;
        if (m) k = tcase_map(ctx, ctx_n, ctx_i, m, out);
        else out[0] = cp;
        for (size_t j = 0; j < k; j++) {
            char enc[4];
            tbuf_put(r, &b, enc, tutf8_put(out[j], enc));
        }
    }
    return tbuf_to_str(r, &b);
}

static struct tv tb_map_case(struct trender *r, struct tv s, int mode)
{
    return tb_case(r, s, mode == 0 ? TC_LOWER : mode == 1 ? TC_UPPER : TC_SWAP);
}

static struct tv tb_pytitle(struct trender *r, struct tv s) { return tb_case(r, s, TC_PYTITLE); }
static struct tv tb_capitalize(struct trender *r, struct tv s) { return tb_case(r, s, TC_CAPITALIZE); }
static struct tv tb_jtitle(struct trender *r, struct tv s) { return tb_case(r, s, TC_JTITLE); }

static struct tv tb_replace(struct trender *r, struct tv s, struct tv old, struct tv new_, int64_t count)
{
    struct tbuf b = {0};
    tbuf_put(r, &b, "", 0);
    if (old.u.s.n == 0) {
        size_t i = 0;
        int64_t done = 0;
        while (1) {
            if (count < 0 || done < count) {
                tbuf_put(r, &b, new_.u.s.p, new_.u.s.n);
                done++;
            }
            if (i >= s.u.s.n) break;
            size_t st = i;
            tutf8_next(s.u.s.p, s.u.s.n, &i);
            tbuf_put(r, &b, s.u.s.p + st, i - st);
        }
        return tbuf_to_str(r, &b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i <= s.u.s.n) {
        const char *hit = (count < 0 || done < count)
                              ? memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n) : NULL;
        if (!hit) {
            tbuf_put(r, &b, s.u.s.p + i, s.u.s.n - i);
            break;
        }
        size_t h = (size_t)(hit - s.u.s.p);
        tbuf_put(r, &b, s.u.s.p + i, h - i);
        tbuf_put(r, &b, new_.u.s.p, new_.u.s.n);
        i = h + old.u.s.n;
        done++;
        tmpl_step(r);
    }
    return tbuf_to_str(r, &b);
}

static struct tv tb_split(struct trender *r, struct tv s, struct tv sep, int64_t maxsplit, int from_right)
{
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    /* collect into a growing arena list */
    size_t cap = 8, cnt = 0;
    struct tv *items = tr_alloc(r, cap * sizeof(*items));
#define PUSH(v)                                                                                    \
    do {                                                                                           \
        if (cnt == cap) {                                                                          \
            struct tv *ni = tr_alloc(r, cap * 2 * sizeof(*ni));                                    \
            memcpy(ni, items, cnt * sizeof(*ni));                                                  \
            items = ni;                                                                            \
            cap *= 2;                                                                              \
        }                                                                                          \
        items[cnt++] = (v);                                                                        \
        tmpl_step(r);                                                                              \
    } while (0)
    if (sep.t == TV_STR) {
        if (sep.u.s.n == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "empty separator");
        if (!from_right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
                if (!hit) {
                    PUSH(tv_str(p + i, n - i));
                    break;
                }
                PUSH(tv_str(p + i, (size_t)(hit - p) - i));
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
                    PUSH(tv_str(p, end));
                    break;
                }
                PUSH(tv_str(p + found + sep.u.s.n, end - (size_t)found - sep.u.s.n));
                end = (size_t)found;
                done++;
            }
            for (size_t k = 0; k < cnt / 2; k++) {
                struct tv t = items[k];
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
                    if (!tpy_isspace(tutf8_next(p, n, &k))) break;
                    i = k;
                }
                if (i >= n) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    PUSH(tv_str(p + i, n - i));
                    break;
                }
                size_t st = i;
                while (i < n) {
                    size_t k = i;
                    if (tpy_isspace(tutf8_next(p, n, &k))) break;
                    i = k;
                }
                PUSH(tv_str(p + st, i - st));
                done++;
            }
        } else {
            struct tv rest = tb_strip(s, tv_none(), 0, 1);
            size_t end = rest.u.s.n;
            int64_t done = 0;
            while (end > 0) {
                if (maxsplit >= 0 && done >= maxsplit) {
                    PUSH(tv_str(p, end));
                    break;
                }
                size_t st = end;
                while (st > 0) {
                    size_t b0 = st - 1;
                    while (b0 > 0 && ((unsigned char)p[b0] & 0xC0) == 0x80) b0--;
                    size_t k = b0;
                    if (tpy_isspace(tutf8_next(p, end, &k))) break;
                    st = b0;
                }
                PUSH(tv_str(p + st, end - st));
                done++;
                end = st;
                while (end > 0) {
                    size_t b0 = end - 1;
                    while (b0 > 0 && ((unsigned char)p[b0] & 0xC0) == 0x80) b0--;
                    size_t k = b0;
                    if (!tpy_isspace(tutf8_next(p, end, &k))) break;
                    end = b0;
                }
            }
            for (size_t k = 0; k < cnt / 2; k++) {
                struct tv t = items[k];
                items[k] = items[cnt - 1 - k];
                items[cnt - 1 - k] = t;
            }
        }
    }
#undef PUSH
    struct tv_list *l = tr_alloc(r, sizeof(*l));
    l->n = cnt;
    l->items = items;
    return TV_LISTV(l);
}

static int64_t tb_cp_index(struct tv s, size_t byte_off) { return (int64_t)tutf8_len(s.u.s.p, byte_off); }

static int tb_affix(struct tv s, struct tv a, int end)
{
    if (a.u.s.n > s.u.s.n) return 0;
    return !memcmp(s.u.s.p + (end ? s.u.s.n - a.u.s.n : 0), a.u.s.p, a.u.s.n);
}

static struct tv tb_pad(struct trender *r, struct tv s, int64_t width, struct tv fill, int mode)
{
    size_t len = tutf8_len(s.u.s.p, s.u.s.n);
    if (width <= (int64_t)len) return s;
    if (width > (int64_t)r->lim.max_output_bytes) tmpl_fail(r, CAIRN_ERR_LIMIT, "padding too large");
    size_t total = (size_t)width - len, left;
    if (mode == 0) left = total / 2 + (total & (size_t)width & 1); /* Python center */
    else if (mode == 1) left = 0;
    else left = total;
    struct tbuf b = {0};
    for (size_t i = 0; i < left; i++) tbuf_put(r, &b, fill.u.s.p, fill.u.s.n);
    tbuf_put(r, &b, s.u.s.p, s.u.s.n);
    for (size_t i = left; i < total; i++) tbuf_put(r, &b, fill.u.s.p, fill.u.s.n);
    return tbuf_to_str(r, &b);
}

/* ---- Python formatting: format-spec mini-language (str.format) and printf-style (%) ---- */

struct tb_spec {
    uint32_t fill;
    char align;   /* 0, '<', '>', '^', '=' */
    char sign;    /* 0, '+', '-', ' ' */
    int alt;      /* '#' */
    int zero;     /* '0' before width */
    int64_t width;
    char group;   /* 0, ',', '_' */
    int64_t prec; /* -1 = none */
    char type;    /* 0 or the type letter */
};

static void tb_group(char *digits, size_t cap, char sep)
{
    /* inserts sep every 3 digits of the integer part (digits: [0-9]+ [. ...]) */
    char tmp[512];
    size_t n = strcspn(digits, ".eE%"), len = strlen(digits), o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0 && o < sizeof(tmp) - 1) tmp[o++] = sep;
        if (o < sizeof(tmp) - 1) tmp[o++] = digits[i];
    }
    for (size_t i = n; i < len && o < sizeof(tmp) - 1; i++) tmp[o++] = digits[i];
    tmp[o] = 0;
    snprintf(digits, cap, "%s", tmp);
}

/* Formats one value (Python format(v, spec) for str / int / float; pct = printf-style rules). */
static void tb_format_value(struct trender *r, struct tbuf *b, struct tv v, struct tb_spec *sp, int pct)
{
    char body[512] = "", prefix[4] = "";
    const char *text = body;
    size_t text_n;
    int neg = 0, numeric = 0;
    char type = sp->type;
    int is_int = v.t == TV_INT || v.t == TV_BOOL, is_float = v.t == TV_FLOAT;
    if (sp->prec > 200) tmpl_fail(r, CAIRN_ERR_LIMIT, "format precision too large");
    if (sp->width > (int64_t)r->lim.max_output_bytes) tmpl_fail(r, CAIRN_ERR_LIMIT, "format width too large");
    if (!pct && v.t != TV_STR && !is_int && !is_float)
        tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported format string passed to %s.__format__", tv_type_name(v));
    if (!pct && type == 's' && (is_int || is_float))
        tmpl_fail(r, CAIRN_ERR_INVALID, "Unknown format code 's' for object of type '%s'", tv_type_name(v));
    if (type == 's' || type == 'r' || (type == 0 && !is_int && !is_float)) {
        if (!pct && (sp->sign || sp->group || sp->align == '='))
            tmpl_fail(r, CAIRN_ERR_INVALID, "invalid format specifier for a string");
        if (!pct && sp->zero && !sp->align) {
            sp->fill = sp->fill ? sp->fill : '0';
            sp->align = '<';
        }
        struct tv sv;
        if (type == 'r') {
            struct tbuf rb = {0};
            tv_repr_append(r, &rb, v);
            sv = tbuf_to_str(r, &rb);
        } else {
            sv = tv_to_str(r, v);
        }
        if (sp->prec >= 0) sv = tmpl_slice(r, sv, tv_none(), tv_int(sp->prec), tv_none());
        text = sv.u.s.p;
        text_n = sv.u.s.n;
    } else if (is_int && (type == 0 || strchr("dinxXobc", type))) {
        if (!pct && sp->prec >= 0) tmpl_fail(r, CAIRN_ERR_INVALID, "Precision not allowed in integer format specifier");
        int64_t x = v.t == TV_INT ? v.u.i : v.u.b;
        uint64_t mag = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        neg = x < 0;
        numeric = 1;
        if (type == 'c') {
            if (x < 0 || x > 0x10FFFF || (x >= 0xD800 && x <= 0xDFFF)) tmpl_fail(r, CAIRN_ERR_INVALID, "%%c arg not in range");
            text_n = tutf8_put((uint32_t)x, body);
            body[text_n] = 0;
            neg = 0;
            numeric = 0;
        } else if (type == 'x' || type == 'X' || type == 'o' || type == 'b') {
            int base = type == 'o' ? 8 : type == 'b' ? 2 : 16;
            char tmp[80];
            size_t k = 0;
            do {
                unsigned d = (unsigned)(mag % (unsigned)base);
                tmp[k++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
                mag /= (unsigned)base;
            } while (mag);
            for (size_t i = 0; i < k; i++) body[i] = tmp[k - 1 - i];
            body[k] = 0;
            if (sp->alt) snprintf(prefix, sizeof(prefix), "0%c", type == 'o' ? 'o' : type == 'b' ? 'b' : type);
        } else {
            snprintf(body, sizeof(body), "%llu", (unsigned long long)mag);
            if (pct && sp->prec > 0) { /* %.3d zero-pads the digits */
                size_t len = strlen(body);
                if ((int64_t)len < sp->prec) { /* prec <= 200, len <= 20: fits */
                    size_t z = (size_t)sp->prec - len;
                    memmove(body + z, body, len + 1);
                    memset(body, '0', z);
                }
            }
            if (sp->group) tb_group(body, sizeof(body), sp->group);
        }
        if (type != 'c') text_n = strlen(body);
    } else if ((is_int || is_float) && (type == 0 || strchr("eEfFgG%n", type))) {
        double x = is_float ? v.u.f : (double)(v.t == TV_INT ? v.u.i : v.u.b);
        numeric = 1;
        neg = signbit(x) != 0 && !isnan(x);
        double ax = fabs(x);
        int p = sp->prec >= 0 ? (int)sp->prec : 6;
        if (type == 0 && sp->prec < 0) {
            tv_float_repr(ax, body, sizeof(body));
        } else if (type == 0 || type == 'g' || type == 'G' || type == 'n') {
            snprintf(body, sizeof(body), type == 'G' ? "%.*G" : "%.*g", p ? p : 1, ax);
        } else if (type == '%') {
            snprintf(body, sizeof(body), "%.*f%%", p, ax * 100);
        } else {
            char f[16] = {'%', '.', '*', type, 0};
            snprintf(body, sizeof(body), f, p, ax);
        }
        if (isinf(x) || isnan(x)) snprintf(body, sizeof(body), "%s", isnan(x) ? (type == 'F' || type == 'E' || type == 'G' ? "NAN" : "nan") : (type == 'F' || type == 'E' || type == 'G' ? "INF" : "inf"));
        if (sp->alt && !strchr(body, '.') && !strchr(body, 'e') && isfinite(x)) strncat(body, ".", sizeof(body) - strlen(body) - 1);
        if (sp->group) tb_group(body, sizeof(body), sp->group);
        text_n = strlen(body);
    } else {
        tmpl_fail(r, CAIRN_ERR_INVALID, "Unknown format code '%c' for object of type '%s'", type ? type : '?', tv_type_name(v));
    }
    if (numeric && sp->group && sp->zero && !sp->align)
        tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "zero padding with a thousands separator is not supported");
    char signc = 0;
    if (numeric) {
        if (neg) signc = '-';
        else if (sp->sign == '+' || sp->sign == ' ') signc = sp->sign;
    }
    char align = sp->align;
    uint32_t fill = sp->fill ? sp->fill : ' ';
    if (sp->zero && numeric && !align) {
        align = '=';
        fill = '0';
    }
    if (!align) align = (numeric && !pct) || pct ? '>' : '<';
    if (!numeric && !pct && !sp->align) align = '<';
    size_t len = tutf8_len(text, text_n) + (signc ? 1 : 0) + strlen(prefix);
    size_t pad = sp->width > (int64_t)len ? (size_t)sp->width - len : 0, left = 0, right = 0;
    if (align == '<') right = pad;
    else if (align == '^') left = pad / 2, right = pad - pad / 2;
    else left = pad;
    char fenc[4];
    size_t fl = tutf8_put(fill, fenc);
    if (align != '=')
        for (size_t i = 0; i < left; i++) tbuf_put(r, b, fenc, fl);
    if (signc) tbuf_putc(r, b, signc);
    tbuf_puts(r, b, prefix);
    if (align == '=')
        for (size_t i = 0; i < left; i++) tbuf_put(r, b, fenc, fl);
    tbuf_put(r, b, text, text_n);
    for (size_t i = 0; i < right; i++) tbuf_put(r, b, fenc, fl);
}

static int64_t tb_parse_num(const char *p, size_t n, size_t *i)
{
    int64_t v = 0;
    while (*i < n && p[*i] >= '0' && p[*i] <= '9') {
        if (v < 100000000) v = v * 10 + (p[*i] - '0');
        (*i)++;
    }
    return v;
}

/* Parses a str.format spec ([[fill]align][sign][z][#][0][width][,_][.prec][type]). */
static void tb_parse_spec(struct trender *r, const char *p, size_t n, struct tb_spec *sp)
{
    memset(sp, 0, sizeof(*sp));
    sp->prec = -1;
    size_t i = 0;
    if (n) {
        size_t k = 0;
        uint32_t first = tutf8_next(p, n, &k);
        if (k < n && strchr("<>=^", p[k])) {
            sp->fill = first;
            sp->align = p[k];
            i = k + 1;
        } else if (strchr("<>=^", p[0])) {
            sp->align = p[0];
            i = 1;
        }
    }
    if (i < n && (p[i] == '+' || p[i] == '-' || p[i] == ' ')) sp->sign = p[i++];
    if (i < n && p[i] == 'z') i++;
    if (i < n && p[i] == '#') sp->alt = 1, i++;
    if (i < n && p[i] == '0') sp->zero = 1, i++;
    sp->width = tb_parse_num(p, n, &i);
    if (i < n && (p[i] == ',' || p[i] == '_')) sp->group = p[i++];
    if (i < n && p[i] == '.') {
        i++;
        if (i >= n || p[i] < '0' || p[i] > '9') tmpl_fail(r, CAIRN_ERR_INVALID, "Format specifier missing precision");
        sp->prec = tb_parse_num(p, n, &i);
    }
    if (i < n && strchr("sdnxXobceEfFgG%", p[i])) sp->type = p[i++];
    if (i != n) tmpl_fail(r, CAIRN_ERR_INVALID, "Invalid format specifier '%.*s'", (int)n, p);
}

/* str.format: {} {0} {name} {x.attr} {x[0]}, !r / !s conversions, format specs; {{ }}. */
static struct tv tb_format(struct trender *r, struct tv fmt, struct targs *a)
{
    struct tbuf b = {0};
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n, auto_i = 0;
    tbuf_put(r, &b, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
            tbuf_putc(r, &b, '{');
            i++;
        } else if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
            tbuf_putc(r, &b, '}');
            i++;
        } else if (p[i] == '{') {
            const char *e = memchr(p + i, '}', n - i);
            if (!e) tmpl_fail(r, CAIRN_ERR_INVALID, "Single '{' encountered in format string");
            const char *f = p + i + 1;
            size_t fl = (size_t)(e - f);
            if (memchr(f, '{', fl)) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "nested format fields are not supported");
            const char *colon = memchr(f, ':', fl);
            size_t head = colon ? (size_t)(colon - f) : fl;
            const char *bang = memchr(f, '!', head);
            char conv = 0;
            if (bang) {
                if ((size_t)(bang - f) + 2 != head || (bang[1] != 'r' && bang[1] != 's' && bang[1] != 'a'))
                    tmpl_fail(r, CAIRN_ERR_INVALID, "bad conversion in format string");
                conv = bang[1];
                head = (size_t)(bang - f);
            }
            /* field name: arg_name ('.' attr | '[' key ']')* */
            size_t k = 0;
            while (k < head && f[k] != '.' && f[k] != '[') k++;
            struct tv v;
            if (k == 0) {
                if (auto_i >= a->n_pos) tmpl_fail(r, CAIRN_ERR_INVALID, "Replacement index %zu out of range", auto_i);
                v = a->pos[auto_i++];
            } else if (f[0] >= '0' && f[0] <= '9') {
                size_t j = 0;
                int64_t idx = tb_parse_num(f, k, &j);
                if (j != k || idx >= (int64_t)a->n_pos) tmpl_fail(r, CAIRN_ERR_INVALID, "Replacement index out of range");
                v = a->pos[idx];
            } else {
                int found = 0;
                for (size_t q = 0; q < a->n_kw; q++)
                    if (strlen(a->kwnames[q]) == k && !memcmp(a->kwnames[q], f, k)) {
                        v = a->kw[q];
                        found = 1;
                    }
                if (!found) tmpl_fail(r, CAIRN_ERR_INVALID, "KeyError: '%.*s'", (int)k, f);
            }
            while (k < head) {
                if (f[k] == '.') {
                    size_t st = ++k;
                    while (k < head && f[k] != '.' && f[k] != '[') k++;
                    v = tmpl_getattr(r, v, tr_printf(r, "%.*s", (int)(k - st), f + st));
                } else {
                    const char *close = memchr(f + k, ']', head - k);
                    if (!close) tmpl_fail(r, CAIRN_ERR_INVALID, "Missing ']' in format string");
                    size_t st = k + 1, en = (size_t)(close - f), j = st;
                    int64_t idx = tb_parse_num(f, en, &j);
                    v = (j == en && en > st) ? tmpl_getitem(r, v, tv_int(idx)) : tmpl_getitem(r, v, tv_str(f + st, en - st));
                    k = en + 1;
                }
                if (v.t == TV_UNDEF) tb_undef_fail(r, v);
            }
            struct tb_spec sp;
            tb_parse_spec(r, colon ? colon + 1 : "", colon ? (size_t)(e - colon - 1) : 0, &sp);
            if (conv == 'r' || conv == 'a') {
                struct tbuf rb = {0};
                tv_repr_append(r, &rb, v);
                v = tbuf_to_str(r, &rb);
            } else if (conv == 's') {
                v = tv_to_str(r, v);
            }
            if (!colon || e == colon + 1) tv_str_append(r, &b, v); /* empty spec: str(v) */
            else tb_format_value(r, &b, v, &sp, 0);
            i = (size_t)(e - p);
        } else if (p[i] == '}') {
            tmpl_fail(r, CAIRN_ERR_INVALID, "Single '}' encountered in format string");
        } else {
            tbuf_putc(r, &b, p[i]);
        }
    }
    return tbuf_to_str(r, &b);
}

/* printf-style "fmt" % args: %[-+ 0#][width][.prec](s r d i u f F e E g G x X o c %) */
struct tv tmpl_str_percent(struct trender *r, struct tv fmt, struct tv arg)
{
    struct tbuf b = {0};
    size_t ai = 0;
    struct tv_list one = {.n = 1, .items = &arg}, *args = &one;
    if (arg.t == TV_LIST && arg.u.l->is_tuple) args = arg.u.l;
    /* a mapping-like argument (dict, list) is not "unconverted" when no spec consumes it */
    int mapping_like = arg.t == TV_DICT || (arg.t == TV_LIST && !arg.u.l->is_tuple);
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n;
    tbuf_put(r, &b, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            tbuf_putc(r, &b, p[i]);
            continue;
        }
        if (++i >= n) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format");
        if (p[i] == '%') {
            tbuf_putc(r, &b, '%');
            continue;
        }
        struct tb_spec sp;
        memset(&sp, 0, sizeof(sp));
        sp.prec = -1;
        struct tv keyed;
        int has_key = 0;
        if (p[i] == '(') {
            if (arg.t != TV_DICT) tmpl_fail(r, CAIRN_ERR_INVALID, "format requires a mapping");
            const char *close = memchr(p + i, ')', n - i);
            if (!close) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format key");
            if (!tv_dict_get(arg.u.d, tv_str(p + i + 1, (size_t)(close - p) - i - 1), &keyed))
                tmpl_fail(r, CAIRN_ERR_INVALID, "KeyError: '%.*s'", (int)((size_t)(close - p) - i - 1), p + i + 1);
            has_key = 1;
            i = (size_t)(close - p) + 1;
            if (i >= n) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format");
        }
        for (; i < n && strchr("-+ 0#", p[i]); i++) {
            if (p[i] == '-') sp.align = '<';
            else if (p[i] == '0') sp.zero = 1;
            else if (p[i] == '#') sp.alt = 1;
            else if (sp.sign != '+') sp.sign = p[i];
        }
        if (i < n && p[i] == '*') tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "'*' width is not supported");
        sp.width = tb_parse_num(p, n, &i);
        if (i < n && p[i] == '.') {
            i++;
            sp.prec = tb_parse_num(p, n, &i);
        }
        while (i < n && (p[i] == 'h' || p[i] == 'l' || p[i] == 'L')) i++;
        if (i >= n) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format");
        char c = p[i];
        if (!strchr("srdiufFeEgGxXoca", c)) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "unsupported format character '%c'", c);
        struct tv v;
        if (has_key) {
            v = keyed;
        } else {
            if (ai >= args->n) tmpl_fail(r, CAIRN_ERR_INVALID, "not enough arguments for format string");
            v = args->items[ai++];
        }
        if (c == 'i' || c == 'u') c = 'd';
        if (c == 'a') c = 'r';
        if (strchr("dxXoc", c) && v.t == TV_FLOAT) {
            if (c != 'd') tmpl_fail(r, CAIRN_ERR_INVALID, "%%%c format: an integer is required, not float", c);
            if (!isfinite(v.u.f) || fabs(v.u.f) > 9.2e18) tmpl_fail(r, CAIRN_ERR_INVALID, "cannot convert float to integer");
            v = tv_int((int64_t)v.u.f);
        }
        if (strchr("dxXoc", c) && v.t != TV_INT && v.t != TV_BOOL)
            tmpl_fail(r, CAIRN_ERR_INVALID, "%%%c format: a real number is required, not %s", c, tv_type_name(v));
        if (strchr("fFeEgG", c) && v.t != TV_INT && v.t != TV_BOOL && v.t != TV_FLOAT)
            tmpl_fail(r, CAIRN_ERR_INVALID, "must be real number, not %s", tv_type_name(v));
        if (c == 'o' && sp.alt) sp.alt = 1;
        if (c == 's' || c == 'r') sp.zero = 0;
        sp.type = c;
        tb_format_value(r, &b, v, &sp, 1);
    }
    if (ai < args->n && !(mapping_like && ai == 0))
        tmpl_fail(r, CAIRN_ERR_INVALID, "not all arguments converted during string formatting");
    return tbuf_to_str(r, &b);
}

/* ---- methods ---- */

static struct tv tb_arg(struct targs *a, size_t i, const char *name, struct tv def)
{
    struct tv v;
    return targs_get(a, i, name, &v) ? v : def;
}

static struct tv tb_items_list(struct trender *r, struct tv_dict *d)
{
    struct tv_list *l = tv_list_new(r, d->n);
    for (size_t i = 0; i < d->n; i++) {
        struct tv_list *t = tv_list_new(r, 2);
        t->is_tuple = 1;
        t->items[0] = d->items[i].key;
        t->items[1] = d->items[i].val;
        l->items[i] = TV_LISTV(t);
    }
    return TV_LISTV(l);
}

static int tb_is_digit_cp(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND;
}

static int tb_is_alpha_cp(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

static struct tv tb_str_pred(struct tv s, const char *name)
{
    size_t i = 0;
    int any = 0, cased = 0;
    if (s.u.s.n == 0) return tv_bool(0);
    while (i < s.u.s.n) {
        uint32_t cp = tutf8_next(s.u.s.p, s.u.s.n, &i);
        any = 1;
        int ok;
        if (!strcmp(name, "isdigit") || !strcmp(name, "isnumeric") || !strcmp(name, "isdecimal")) ok = tb_is_digit_cp(cp);
        else if (!strcmp(name, "isalpha")) ok = tb_is_alpha_cp(cp);
        else if (!strcmp(name, "isalnum")) ok = tb_is_alpha_cp(cp) || tb_is_digit_cp(cp);
        else if (!strcmp(name, "isspace")) ok = tpy_isspace(cp);
        else if (!strcmp(name, "isupper")) {
            if (tcase_is_upper(cp)) cased = 1;
            ok = !tcase_is_lower(cp) && !tcase_is_title(cp);
        } else {
            if (tcase_is_lower(cp)) cased = 1;
            ok = !tcase_is_upper(cp) && !tcase_is_title(cp);
        }
        if (!ok) return tv_bool(0);
    }
    if (!strcmp(name, "isupper") || !strcmp(name, "islower")) return tv_bool(cased);
    return tv_bool(any);
}

struct tv tmpl_method_call(struct trender *r, struct tv_method *m, struct targs *a)
{
    struct tv s = m->self;
    const char *name = m->name;
    tmpl_step_bytes(r, s.t == TV_STR ? s.u.s.n : 0);
    if (s.t == TV_DICT) {
        if (!strcmp(name, "items")) {
            struct tv it = tb_items_list(r, s.u.d);
            it.u.l->kind = TL_ITEMS;
            return it;
        }
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            struct tv_list *l = tv_list_new(r, s.u.d->n);
            l->kind = name[0] == 'k' ? TL_KEYS : TL_VALUES;
            for (size_t i = 0; i < l->n; i++)
                l->items[i] = name[0] == 'k' ? s.u.d->items[i].key : s.u.d->items[i].val;
            return TV_LISTV(l);
        }
        if (!strcmp(name, "get")) {
            struct tv k, v;
            if (!targs_get(a, 0, NULL, &k)) tmpl_fail(r, CAIRN_ERR_INVALID, "get expected at least 1 argument");
            if (tv_dict_get(s.u.d, k, &v)) return v;
            return tb_arg(a, 1, NULL, tv_none());
        }
        if (!strcmp(name, "copy")) return s;
    }
    if (s.t == TV_LIST) {
        if (!strcmp(name, "copy")) return s;
        struct tv x;
        if (!targs_get(a, 0, NULL, &x)) tmpl_fail(r, CAIRN_ERR_INVALID, "%s expected 1 argument", name);
        int64_t cnt = 0;
        for (size_t i = 0; i < s.u.l->n; i++)
            if (tv_equal(s.u.l->items[i], x)) {
                if (!strcmp(name, "index")) return tv_int((int64_t)i);
                cnt++;
            }
        if (!strcmp(name, "index")) tmpl_fail(r, CAIRN_ERR_INVALID, "value is not in list");
        return tv_int(cnt);
    }
    if (s.t != TV_STR) tmpl_fail(r, CAIRN_ERR_INVALID, "unknown method %s", name);
    struct tv x;
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!targs_get(a, 0, NULL, &x)) tmpl_fail(r, CAIRN_ERR_INVALID, "%s takes at least 1 argument", name);
        int end = name[0] == 'e';
        if (x.t == TV_LIST && x.u.l->is_tuple) {
            for (size_t i = 0; i < x.u.l->n; i++)
                if (tb_affix(s, tb_need_str(r, x.u.l->items[i], name), end)) return tv_bool(1);
            return tv_bool(0);
        }
        return tv_bool(tb_affix(s, tb_need_str(r, x, name), end));
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        struct tv sep = tb_arg(a, 0, "sep", tv_none());
        if (sep.t != TV_NONE) tb_need_str(r, sep, "separator");
        int64_t maxsplit = tb_need_int(r, tb_arg(a, 1, "maxsplit", tv_int(-1)), "maxsplit");
        return tb_split(r, s, sep, maxsplit, name[0] == 'r');
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        struct tv chars = tb_arg(a, 0, NULL, tv_none());
        if (chars.t != TV_NONE) tb_need_str(r, chars, "strip arg");
        return tb_strip(s, chars, name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "replace")) {
        struct tv o = tb_need_str(r, tb_arg(a, 0, NULL, tv_none()), "replace arg 1");
        struct tv nw = tb_need_str(r, tb_arg(a, 1, NULL, tv_none()), "replace arg 2");
        int64_t count = tb_need_int(r, tb_arg(a, 2, "count", tv_int(-1)), "count");
        return tb_replace(r, s, o, nw, count);
    }
    if (!strcmp(name, "upper")) return tb_map_case(r, s, 1);
    if (!strcmp(name, "lower") || !strcmp(name, "casefold")) return tb_map_case(r, s, 0);
    if (!strcmp(name, "swapcase")) return tb_map_case(r, s, 2);
    if (!strcmp(name, "title")) return tb_pytitle(r, s);
    if (!strcmp(name, "capitalize")) return tb_capitalize(r, s);
    if (!strcmp(name, "find") || !strcmp(name, "index") || !strcmp(name, "rfind") || !strcmp(name, "rindex")) {
        struct tv sub = tb_need_str(r, tb_arg(a, 0, NULL, tv_none()), name);
        long found = -1;
        if (name[0] != 'r') {
            const char *h = sub.u.s.n ? memmem(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n) : s.u.s.p;
            if (h) found = (long)(h - s.u.s.p);
        } else if (sub.u.s.n <= s.u.s.n) {
            for (size_t k = s.u.s.n - sub.u.s.n + 1; k-- > 0;)
                if (!memcmp(s.u.s.p + k, sub.u.s.p, sub.u.s.n)) {
                    found = (long)k;
                    break;
                }
        }
        if (found < 0) {
            if (strstr(name, "index")) tmpl_fail(r, CAIRN_ERR_INVALID, "substring not found");
            return tv_int(-1);
        }
        return tv_int(tb_cp_index(s, (size_t)found));
    }
    if (!strcmp(name, "count")) {
        struct tv sub = tb_need_str(r, tb_arg(a, 0, NULL, tv_none()), name);
        if (sub.u.s.n == 0) return tv_int((int64_t)tutf8_len(s.u.s.p, s.u.s.n) + 1);
        int64_t c = 0;
        size_t i = 0;
        const char *h;
        while ((h = memmem(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n)) != NULL) {
            c++;
            i = (size_t)(h - s.u.s.p) + sub.u.s.n;
        }
        return tv_int(c);
    }
    if (!strcmp(name, "format")) return tb_format(r, s, a);
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        struct tv x2 = tb_need_str(r, tb_arg(a, 0, NULL, tv_none()), name);
        int end = name[6] == 's';
        if (!tb_affix(s, x2, end)) return s;
        return tv_str(s.u.s.p + (end ? 0 : x2.u.s.n), s.u.s.n - x2.u.s.n);
    }
    if (!strcmp(name, "join")) {
        struct tv_list *l = tv_iter_list(r, tb_arg(a, 0, NULL, tv_undef(NULL)));
        struct tbuf b = {0};
        tbuf_put(r, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i) tbuf_put(r, &b, s.u.s.p, s.u.s.n);
            struct tv it = tb_need_str(r, l->items[i], "sequence item");
            tbuf_put(r, &b, it.u.s.p, it.u.s.n);
        }
        return tbuf_to_str(r, &b);
    }
    if (!strcmp(name, "splitlines")) {
        struct tv_list *l = tv_list_new(r, s.u.s.n + 1);
        l->n = 0;
        size_t st = 0, i = 0;
        while (i < s.u.s.n) {
            size_t cst = i;
            uint32_t cp = tutf8_next(s.u.s.p, s.u.s.n, &i);
            if (cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
                cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
                l->items[l->n++] = tv_str(s.u.s.p + st, cst - st);
                if (cp == '\r' && i < s.u.s.n && s.u.s.p[i] == '\n') i++;
                st = i;
            }
        }
        if (st < s.u.s.n) l->items[l->n++] = tv_str(s.u.s.p + st, s.u.s.n - st);
        return TV_LISTV(l);
    }
    if (!strncmp(name, "is", 2)) return tb_str_pred(s, name);
    if (!strcmp(name, "center") || !strcmp(name, "ljust") || !strcmp(name, "rjust")) {
        int64_t w = tb_need_int(r, tb_arg(a, 0, NULL, tv_none()), "width");
        struct tv fill = tb_need_str(r, tb_arg(a, 1, NULL, tv_cstr(" ")), "fillchar");
        return tb_pad(r, s, w, fill, name[0] == 'c' ? 0 : name[0] == 'l' ? 1 : 2);
    }
    if (!strcmp(name, "zfill")) {
        int64_t w = tb_need_int(r, tb_arg(a, 0, NULL, tv_none()), "width");
        return tb_pad(r, s, w, tv_cstr("0"), 2);
    }
    if (!strcmp(name, "partition") || !strcmp(name, "rpartition")) {
        struct tv sep = tb_need_str(r, tb_arg(a, 0, NULL, tv_none()), "sep");
        if (!sep.u.s.n) tmpl_fail(r, CAIRN_ERR_INVALID, "empty separator");
        struct tv_list *t = tv_list_new(r, 3);
        t->is_tuple = 1;
        struct tv parts = tb_split(r, s, sep, 1, name[0] == 'r');
        if (parts.u.l->n == 2) {
            t->items[0] = parts.u.l->items[0];
            t->items[1] = sep;
            t->items[2] = parts.u.l->items[1];
        } else if (name[0] == 'r') {
            t->items[0] = tv_str("", 0);
            t->items[1] = tv_str("", 0);
            t->items[2] = s;
        } else {
            t->items[0] = s;
            t->items[1] = tv_str("", 0);
            t->items[2] = tv_str("", 0);
        }
        return TV_LISTV(t);
    }
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "str.%s is not supported", name);
}

/* ---- sorting helpers ---- */

struct tb_sort_ctx {
    struct trender *r;
    int case_sensitive;
    int reverse;
};

struct tb_sort_item {
    struct tv key;
    struct tv val;
    size_t idx;
};

static struct tv tb_fold(struct trender *r, struct tv v, int case_sensitive)
{
    if (!case_sensitive && v.t == TV_STR) return tb_map_case(r, v, 0);
    return v;
}

static void tb_sort(struct trender *r, struct tb_sort_item *items, size_t n, int reverse)
{
    /* stable merge sort with tv_compare (can fail: no qsort + longjmp through libc) */
    if (n < 2) return;
    struct tb_sort_item *tmp = tr_alloc(r, n * sizeof(*tmp));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = CAIRN_MIN(lo + w, n), hi = CAIRN_MIN(lo + 2 * w, n);
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                tmpl_step(r);
                int c = tv_compare(r, items[i].key, items[j].key);
                if (c == 3) c = 0;
                if (reverse) c = -c;
                if (c <= 0) tmp[k++] = items[i++];
                else tmp[k++] = items[j++];
            }
            while (i < mid) tmp[k++] = items[i++];
            while (j < hi) tmp[k++] = items[j++];
        }
        memcpy(items, tmp, n * sizeof(*tmp));
    }
}

/* attribute lookup for sort/map/selectattr: "a.b" dotted, ints index lists */
static struct tv tb_attr_path(struct trender *r, struct tv v, struct tv attr)
{
    if (attr.t == TV_INT) return v.t == TV_UNDEF ? v : tmpl_getitem(r, v, attr);
    tb_need_str(r, attr, "attribute");
    const char *p = attr.u.s.p, *end = p + attr.u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        struct tv key = tv_str(p, (size_t)(dot - p));
        if (v.t == TV_UNDEF) return v;
        int all_digits = key.u.s.n > 0;
        for (size_t i = 0; i < key.u.s.n; i++)
            if (key.u.s.p[i] < '0' || key.u.s.p[i] > '9') all_digits = 0;
        if (all_digits) v = tmpl_getitem(r, v, tv_int(strtoll(tr_printf(r, "%.*s", (int)key.u.s.n, key.u.s.p), NULL, 10)));
        else v = tmpl_getitem(r, v, key);
        p = dot + 1;
    }
    return v;
}

/* ---- filters ---- */

static struct tv tb_html_escape(struct trender *r, struct tv s)
{
    struct tbuf b = {0};
    tbuf_put(r, &b, "", 0);
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        if (c == '&') tbuf_puts(r, &b, "&amp;");
        else if (c == '<') tbuf_puts(r, &b, "&lt;");
        else if (c == '>') tbuf_puts(r, &b, "&gt;");
        else if (c == '"') tbuf_puts(r, &b, "&#34;");
        else if (c == '\'') tbuf_puts(r, &b, "&#39;");
        else tbuf_putc(r, &b, c);
    }
    return tbuf_to_str(r, &b);
}

static int tb_parse_int(struct tv s, int base, int64_t *out)
{
    char buf[80];
    struct tv t = tb_strip(s, tv_none(), 1, 1);
    if (t.u.s.n == 0 || t.u.s.n >= sizeof(buf)) return 0;
    size_t k = 0;
    for (size_t i = 0; i < t.u.s.n; i++)
        if (t.u.s.p[i] != '_') buf[k++] = t.u.s.p[i];
    buf[k] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, base);
    if (*end || errno) return 0;
    *out = v;
    return 1;
}

static int tb_parse_float(struct tv s, double *out)
{
    char buf[80];
    struct tv t = tb_strip(s, tv_none(), 1, 1);
    if (t.u.s.n == 0 || t.u.s.n >= sizeof(buf)) return 0;
    memcpy(buf, t.u.s.p, t.u.s.n);
    buf[t.u.s.n] = 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end) return 0;
    *out = d;
    return 1;
}

static int64_t tb_len(struct trender *r, struct tv v)
{
    switch (v.t) {
    case TV_STR: return (int64_t)tutf8_len(v.u.s.p, v.u.s.n);
    case TV_LIST:
        if (v.u.l->kind == TL_GEN) tmpl_fail(r, CAIRN_ERR_INVALID, "object of type 'generator' has no len()");
        return (int64_t)v.u.l->n;
    case TV_DICT:
    case TV_NS: return (int64_t)v.u.d->n;
    case TV_UNDEF: return 0;
    default: tmpl_fail(r, CAIRN_ERR_INVALID, "object of type '%s' has no len()", tv_type_name(v));
    }
}

static struct tv tb_select(struct trender *r, struct tv seq, struct targs *a, int by_attr, int keep)
{
    /* jinja2 only iterates truthy values: False|select gives [] */
    struct tv_list *l = tv_truthy(seq) ? tv_iter_list(r, seq) : tv_list_new(r, 0);
    struct tv attr = tv_none();
    size_t first_test = 0;
    if (by_attr) {
        if (!targs_get(a, 0, NULL, &attr)) tmpl_fail(r, CAIRN_ERR_INVALID, "missing attribute for selectattr");
        first_test = 1;
    }
    struct tv test;
    int has_test = targs_get(a, first_test, NULL, &test);
    const char *tname = NULL;
    if (has_test) tname = tv_str_copy(r, tb_need_str(r, test, "test name").u.s.p, test.u.s.n).u.s.p;
    struct targs ta = {0};
    if (a->n_pos > first_test + 1) {
        ta.pos = a->pos + first_test + 1;
        ta.n_pos = a->n_pos - first_test - 1;
    }
    struct tv_list *out = tv_list_new(r, l->n);
    out->n = 0;
    for (size_t i = 0; i < l->n; i++) {
        tmpl_step(r);
        struct tv v = by_attr ? tb_attr_path(r, l->items[i], attr) : l->items[i];
        int ok = has_test ? tmpl_test_apply(r, tname, v, &ta, 0) : tv_truthy(v);
        if (ok == keep) out->items[out->n++] = l->items[i];
    }
    out->kind = TL_GEN;
    return TV_LISTV(out);
}

int tmpl_filter_exists(const char *name);

static const char *const tb_filter_names[] = {
    "tojson", "trim", "length", "count", "items", "list", "join", "default", "d", "first", "last",
    "selectattr", "rejectattr", "select", "reject", "map", "upper", "lower", "capitalize", "title",
    "replace", "safe", "string", "int", "float", "abs", "round", "unique", "sort", "reverse",
    "dictsort", "indent", "wordcount", "center", "sum", "min", "max", "attr", "format", "e",
    "escape", "forceescape", "batch", "tuple", "truncate", NULL};

int tmpl_filter_exists(const char *name) { return tb_in(tb_filter_names, name); }

struct tv tmpl_filter_apply(struct trender *r, const char *name, struct tv v, struct targs *a, int line)
{
    tmpl_step_bytes(r, v.t == TV_STR ? v.u.s.n : 0);
    if (!strcmp(name, "tojson")) {
        struct tv ea = tb_arg(a, 0, "ensure_ascii", tv_bool(0));
        struct tv ind = tb_arg(a, 1, "indent", tv_none());
        struct tv seps = tb_arg(a, 2, "separators", tv_none());
        struct tv sk = tb_arg(a, 3, "sort_keys", tv_bool(0));
        int indent = -1;
        if (ind.t == TV_INT) indent = ind.u.i < 0 ? 0 : (int)CAIRN_MIN(ind.u.i, 64);
        else if (ind.t != TV_NONE) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "tojson: indent must be an integer");
        const char *isep = NULL, *ksep = NULL;
        if (seps.t == TV_LIST && seps.u.l->n == 2) {
            struct tv s0 = tb_need_str(r, seps.u.l->items[0], "separator");
            struct tv s1 = tb_need_str(r, seps.u.l->items[1], "separator");
            isep = tv_str_copy(r, s0.u.s.p, s0.u.s.n).u.s.p;
            ksep = tv_str_copy(r, s1.u.s.p, s1.u.s.n).u.s.p;
        } else if (seps.t != TV_NONE) {
            tmpl_fail(r, CAIRN_ERR_INVALID, "tojson: separators must be a pair");
        }
        struct tbuf b = {0};
        tbuf_put(r, &b, "", 0);
        if (v.t == TV_UNDEF) tmpl_fail(r, CAIRN_ERR_INVALID, "Object of type Undefined is not JSON serializable");
        tv_tojson_append(r, &b, v, tv_truthy(ea), indent, isep, ksep, tv_truthy(sk), 0);
        return tbuf_to_str(r, &b);
    }
    if (!strcmp(name, "safe") || !strcmp(name, "string")) return tv_to_str(r, v);
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape"))
        return tb_html_escape(r, tv_to_str(r, v));
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct tv def = tb_arg(a, 0, "default_value", tv_str("", 0));
        struct tv boolean = tb_arg(a, 1, "boolean", tv_bool(0));
        if (v.t == TV_UNDEF || (tv_truthy(boolean) && !tv_truthy(v))) return def;
        return v;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) return tv_int(tb_len(r, v));
    if (!strcmp(name, "trim")) {
        struct tv chars = tb_arg(a, 0, "chars", tv_none());
        return tb_strip(tv_to_str(r, v), chars, 1, 1);
    }
    if (!strcmp(name, "upper")) return tb_map_case(r, tv_to_str(r, v), 1);
    if (!strcmp(name, "lower")) return tb_map_case(r, tv_to_str(r, v), 0);
    if (!strcmp(name, "capitalize")) return tb_capitalize(r, tv_to_str(r, v));
    if (!strcmp(name, "title")) return tb_jtitle(r, tv_to_str(r, v));
    if (!strcmp(name, "replace")) {
        struct tv s = tv_to_str(r, v);
        struct tv o = tv_to_str(r, tb_arg(a, 0, "old", tv_none()));
        struct tv nw = tv_to_str(r, tb_arg(a, 1, "new", tv_none()));
        struct tv cnt = tb_arg(a, 2, "count", tv_none());
        return tb_replace(r, s, o, nw, cnt.t == TV_NONE ? -1 : tb_need_int(r, cnt, "count"));
    }
    if (!strcmp(name, "items")) {
        if (v.t == TV_UNDEF) return tb_list_of(r, 0);
        if (v.t != TV_DICT && v.t != TV_NS) tmpl_fail(r, CAIRN_ERR_INVALID, "Can only get item pairs from a mapping.");
        struct tv it = tb_items_list(r, v.u.d);
        it.u.l->kind = TL_GEN;
        return it;
    }
    if (!strcmp(name, "list") || !strcmp(name, "tuple")) {
        struct tv_list *l = tv_iter_list(r, v);
        struct tv_list *c = tv_list_new(r, l->n);
        if (l->n) memcpy(c->items, l->items, l->n * sizeof(struct tv));
        c->is_tuple = name[0] == 't';
        return TV_LISTV(c);
    }
    if (!strcmp(name, "join")) {
        struct tv sep = tv_to_str(r, tb_arg(a, 0, "d", tv_str("", 0)));
        struct tv attr = tb_arg(a, 1, "attribute", tv_none());
        struct tv_list *l = tv_iter_list(r, v);
        struct tbuf b = {0};
        tbuf_put(r, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i) tbuf_put(r, &b, sep.u.s.p, sep.u.s.n);
            struct tv it = attr.t == TV_NONE ? l->items[i] : tb_attr_path(r, l->items[i], attr);
            tv_str_append(r, &b, it);
        }
        return tbuf_to_str(r, &b);
    }
    if (!strcmp(name, "first") && v.t == TV_LIST && v.u.l->kind == TL_GEN) {
        if (v.u.l->pos >= v.u.l->n) return tv_undef("No first item, sequence was empty.");
        return v.u.l->items[v.u.l->pos++]; /* next(): consumes one */
    }
    if (!strcmp(name, "last") && v.t == TV_LIST && v.u.l->kind == TL_GEN)
        tmpl_fail(r, CAIRN_ERR_INVALID, "'generator' object is not reversible");
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct tv_list *l = tv_iter_list(r, v);
        if (!l->n) return tv_undef(tr_printf(r, "No %s item, sequence was empty.", name));
        return name[0] == 'f' ? l->items[0] : l->items[l->n - 1];
    }
    if (!strcmp(name, "selectattr")) return tb_select(r, v, a, 1, 1);
    if (!strcmp(name, "rejectattr")) return tb_select(r, v, a, 1, 0);
    if (!strcmp(name, "select")) return tb_select(r, v, a, 0, 1);
    if (!strcmp(name, "reject")) return tb_select(r, v, a, 0, 0);
    if (!strcmp(name, "map")) {
        struct tv_list *l = tv_truthy(v) ? tv_iter_list(r, v) : tv_list_new(r, 0);
        struct tv_list *out = tv_list_new(r, l->n);
        struct tv attr, fname;
        if (targs_get(a, (size_t)-1, "attribute", &attr)) {
            struct tv def = tb_arg(a, (size_t)-1, "default", tv_undef(NULL));
            for (size_t i = 0; i < l->n; i++) {
                tmpl_step(r);
                struct tv x = tb_attr_path(r, l->items[i], attr);
                out->items[i] = (x.t == TV_UNDEF && def.t != TV_UNDEF) ? def : x;
            }
            out->kind = TL_GEN;
            return TV_LISTV(out);
        }
        if (!targs_get(a, 0, NULL, &fname)) tmpl_fail(r, CAIRN_ERR_INVALID, "map requires a filter or attribute");
        const char *fn = tv_str_copy(r, tb_need_str(r, fname, "filter name").u.s.p, fname.u.s.n).u.s.p;
        struct targs fa = {.pos = a->pos + 1, .n_pos = a->n_pos - 1, .kwnames = a->kwnames, .kw = a->kw, .n_kw = a->n_kw};
        for (size_t i = 0; i < l->n; i++) out->items[i] = tmpl_filter_apply(r, fn, l->items[i], &fa, line);
        out->kind = TL_GEN;
        return TV_LISTV(out);
    }
    if ((!strcmp(name, "int") || !strcmp(name, "float")) && v.t == TV_UNDEF) tb_undef_fail(r, v);
    if (!strcmp(name, "int")) {
        struct tv def = tb_arg(a, 0, "default", tv_int(0));
        int64_t base = tb_need_int(r, tb_arg(a, 1, "base", tv_int(10)), "base");
        int64_t iv;
        double d;
        if (v.t == TV_INT) return v;
        if (v.t == TV_BOOL) return tv_int(v.u.b);
        if (v.t == TV_FLOAT) return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? tv_int((int64_t)v.u.f) : def;
        if (v.t == TV_STR) {
            if (tb_parse_int(v, (int)base, &iv)) return tv_int(iv);
            if (tb_parse_float(v, &d) && isfinite(d) && fabs(d) < 9.2e18) return tv_int((int64_t)d);
        }
        return def;
    }
    if (!strcmp(name, "float")) {
        struct tv def = tb_arg(a, 0, "default", tv_float(0.0));
        double d;
        if (v.t == TV_FLOAT) return v;
        if (v.t == TV_INT) return tv_float((double)v.u.i);
        if (v.t == TV_BOOL) return tv_float(v.u.b);
        if (v.t == TV_STR && tb_parse_float(v, &d)) return tv_float(d);
        return def;
    }
    if (!strcmp(name, "abs")) {
        if (v.t == TV_INT) {
            if (v.u.i == INT64_MIN) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == TV_BOOL) return tv_int(v.u.b);
        if (v.t == TV_FLOAT) return tv_float(fabs(v.u.f));
        tmpl_fail(r, CAIRN_ERR_INVALID, "bad operand type for abs(): '%s'", tv_type_name(v));
    }
    if (!strcmp(name, "round")) {
        int64_t prec = tb_need_int(r, tb_arg(a, 0, "precision", tv_int(0)), "precision");
        struct tv method = tb_arg(a, 1, "method", tv_cstr("common"));
        if (v.t != TV_INT && v.t != TV_FLOAT && v.t != TV_BOOL)
            tmpl_fail(r, CAIRN_ERR_INVALID, "round: a number is required, not %s", tv_type_name(v));
        double x = v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : v.u.b;
        double m = pow(10.0, (double)prec);
        double y;
        if (tb_streq(method, "floor")) y = floor(x * m) / m;
        else if (tb_streq(method, "ceil")) y = ceil(x * m) / m;
        else if (tb_streq(method, "common")) {
            if (v.t != TV_FLOAT && prec >= 0) return tv_int(v.t == TV_INT ? v.u.i : v.u.b);
            y = nearbyint(x * m) / m;
        }
        else tmpl_fail(r, CAIRN_ERR_INVALID, "method must be common, ceil or floor");
        return tv_float(y);
    }
    if (!strcmp(name, "unique")) {
        int cs = tv_truthy(tb_arg(a, 0, "case_sensitive", tv_bool(0)));
        struct tv attr = tb_arg(a, 1, "attribute", tv_none());
        struct tv_list *l = tv_iter_list(r, v);
        struct tv_list *out = tv_list_new(r, l->n);
        struct tv_dict *seen = tv_dict_new(r, 0);
        out->n = 0;
        for (size_t i = 0; i < l->n; i++) {
            struct tv k = attr.t == TV_NONE ? l->items[i] : tb_attr_path(r, l->items[i], attr);
            k = tb_fold(r, k, cs);
            if (tv_unhashable(k))
                tmpl_fail(r, CAIRN_ERR_INVALID, "unhashable type: '%s'", tv_type_name(k));
            struct tv dummy;
            if (tv_dict_get(seen, k, &dummy)) continue;
            tv_dict_set(r, seen, k, tv_none());
            out->items[out->n++] = l->items[i];
        }
        out->kind = TL_GEN;
        return TV_LISTV(out);
    }
    if (!strcmp(name, "sort")) {
        int rev = tv_truthy(tb_arg(a, 0, "reverse", tv_bool(0)));
        int cs = tv_truthy(tb_arg(a, 1, "case_sensitive", tv_bool(0)));
        struct tv attr = tb_arg(a, 2, "attribute", tv_none());
        struct tv_list *l = tv_iter_list(r, v);
        struct tb_sort_item *it = tr_alloc(r, (l->n + 1) * sizeof(*it));
        for (size_t i = 0; i < l->n; i++) {
            struct tv k = attr.t == TV_NONE ? l->items[i] : tb_attr_path(r, l->items[i], attr);
            it[i].key = tb_fold(r, k, cs);
            it[i].val = l->items[i];
        }
        tb_sort(r, it, l->n, rev);
        struct tv_list *out = tv_list_new(r, l->n);
        for (size_t i = 0; i < l->n; i++) out->items[i] = it[i].val;
        return TV_LISTV(out);
    }
    if (!strcmp(name, "dictsort")) {
        int cs = tv_truthy(tb_arg(a, 0, "case_sensitive", tv_bool(0)));
        struct tv by = tb_arg(a, 1, "by", tv_cstr("key"));
        int rev = tv_truthy(tb_arg(a, 2, "reverse", tv_bool(0)));
        if (v.t != TV_DICT && v.t != TV_NS) tmpl_fail(r, CAIRN_ERR_INVALID, "dictsort: a mapping is required");
        struct tv items = tb_items_list(r, v.u.d);
        size_t n = items.u.l->n;
        struct tb_sort_item *it = tr_alloc(r, (n + 1) * sizeof(*it));
        int pos = tb_streq(by, "value") ? 1 : 0;
        for (size_t i = 0; i < n; i++) {
            it[i].key = tb_fold(r, items.u.l->items[i].u.l->items[pos], cs);
            it[i].val = items.u.l->items[i];
        }
        tb_sort(r, it, n, rev);
        for (size_t i = 0; i < n; i++) items.u.l->items[i] = it[i].val;
        return items;
    }
    if (!strcmp(name, "reverse")) {
        if (v.t == TV_STR) return tmpl_slice(r, v, tv_none(), tv_none(), tv_int(-1));
        struct tv_list *l = tv_iter_list(r, v);
        struct tv_list *out = tv_list_new(r, l->n);
        for (size_t i = 0; i < l->n; i++) out->items[i] = l->items[l->n - 1 - i];
        out->kind = v.t == TV_LIST && v.u.l->kind == TL_GEN ? TL_PLAIN : TL_GEN; /* reversed() iterator */
        return TV_LISTV(out);
    }
    if (!strcmp(name, "indent")) {
        struct tv width = tb_arg(a, 0, "width", tv_int(4));
        int first = tv_truthy(tb_arg(a, 1, "first", tv_bool(0)));
        int blank = tv_truthy(tb_arg(a, 2, "blank", tv_bool(0)));
        struct tv ind;
        if (width.t == TV_STR) ind = width;
        else {
            int64_t w = tb_need_int(r, width, "width");
            if (w < 0) w = 0;
            if (w > 4096) tmpl_fail(r, CAIRN_ERR_LIMIT, "indent width too large");
            char *sp = tr_alloc(r, (size_t)w + 1);
            memset(sp, ' ', (size_t)w);
            ind = tv_str(sp, (size_t)w);
        }
        if (v.t != TV_STR) tmpl_fail(r, CAIRN_ERR_INVALID, "indent: expected a string, not %s", tv_type_name(v));
        struct tv s = v;
        struct tbuf sb = {0};
        tbuf_put(r, &sb, s.u.s.p, s.u.s.n);
        tbuf_putc(r, &sb, '\n');
        struct tv_method m = {.self = tbuf_to_str(r, &sb), .name = "splitlines"};
        struct targs none = {0};
        struct tv lines = tmpl_method_call(r, &m, &none);
        struct tbuf b = {0};
        tbuf_put(r, &b, "", 0);
        if (first) tbuf_put(r, &b, ind.u.s.p, ind.u.s.n);
        for (size_t i = 0; i < lines.u.l->n; i++) {
            struct tv ln = lines.u.l->items[i];
            if (i) {
                tbuf_putc(r, &b, '\n');
                if (blank || ln.u.s.n) tbuf_put(r, &b, ind.u.s.p, ind.u.s.n);
            }
            tbuf_put(r, &b, ln.u.s.p, ln.u.s.n);
        }
        return tbuf_to_str(r, &b);
    }
    if (!strcmp(name, "wordcount")) {
        struct tv s = tv_to_str(r, v);
        int64_t c = 0;
        int in = 0;
        size_t i = 0;
        while (i < s.u.s.n) {
            uint32_t cp = tutf8_next(s.u.s.p, s.u.s.n, &i);
            int w = cp == '_' || tb_is_alpha_cp(cp) || tb_is_digit_cp(cp);
            if (w && !in) c++;
            in = w;
        }
        return tv_int(c);
    }
    if (!strcmp(name, "center")) {
        int64_t w = tb_need_int(r, tb_arg(a, 0, "width", tv_int(80)), "width");
        return tb_pad(r, tv_to_str(r, v), w, tv_cstr(" "), 0);
    }
    if (!strcmp(name, "sum")) {
        struct tv attr = tb_arg(a, 0, "attribute", tv_none());
        struct tv acc = tb_arg(a, 1, "start", tv_int(0));
        struct tv_list *l = tv_iter_list(r, v);
        for (size_t i = 0; i < l->n; i++) {
            struct tv x = attr.t == TV_NONE ? l->items[i] : tb_attr_path(r, l->items[i], attr);
            if (acc.t == TV_INT && x.t == TV_INT) {
                int64_t z;
                if (__builtin_add_overflow(acc.u.i, x.u.i, &z)) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
                acc = tv_int(z);
            } else if ((acc.t == TV_INT || acc.t == TV_FLOAT || acc.t == TV_BOOL) &&
                       (x.t == TV_INT || x.t == TV_FLOAT || x.t == TV_BOOL)) {
                double p = acc.t == TV_FLOAT ? acc.u.f : acc.t == TV_INT ? (double)acc.u.i : acc.u.b;
                double q = x.t == TV_FLOAT ? x.u.f : x.t == TV_INT ? (double)x.u.i : x.u.b;
                acc = tv_float(p + q);
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported operand type(s) for +: '%s' and '%s'",
                          tv_type_name(acc), tv_type_name(x));
            }
        }
        return acc;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        int cs = tv_truthy(tb_arg(a, 0, "case_sensitive", tv_bool(0)));
        struct tv attr = tb_arg(a, 1, "attribute", tv_none());
        struct tv_list *l = tv_iter_list(r, v);
        if (!l->n) return tv_undef(tr_printf(r, "No aggregated item, sequence was empty."));
        size_t best = 0;
        struct tv bk = tb_fold(r, attr.t == TV_NONE ? l->items[0] : tb_attr_path(r, l->items[0], attr), cs);
        for (size_t i = 1; i < l->n; i++) {
            struct tv k = tb_fold(r, attr.t == TV_NONE ? l->items[i] : tb_attr_path(r, l->items[i], attr), cs);
            int c = tv_compare(r, k, bk);
            if ((name[1] == 'i' && c < 0) || (name[1] == 'a' && c > 0 && c != 3)) {
                best = i;
                bk = k;
            }
        }
        return l->items[best];
    }
    if (!strcmp(name, "attr")) {
        struct tv nm = tb_need_str(r, tb_arg(a, 0, "name", tv_none()), "attribute name");
        if (v.t == TV_UNDEF) tb_undef_fail(r, v);
        const char *an = tv_str_copy(r, nm.u.s.p, nm.u.s.n).u.s.p;
        struct tv out;
        if (v.t == TV_NS || v.t == TV_LOOP) return tmpl_getattr(r, v, an);
        if (an[0] != '_' && tb_pyattr(r, v, an, &out)) return out;
        return tv_undef(tr_printf(r, "'%s object' has no attribute '%s'", tv_type_name(v), an));
    }
    if (!strcmp(name, "format")) {
        struct tv s = tv_to_str(r, v);
        /* jinja2: s % kwargs if kwargs else s % args (args is a tuple) */
        if (a->n_kw) {
            struct tv_dict *d = tv_dict_new(r, a->n_kw);
            for (size_t k = 0; k < a->n_kw; k++) tv_dict_set(r, d, tv_cstr(a->kwnames[k]), a->kw[k]);
            return tmpl_str_percent(r, s, TV_DICTV(d));
        }
        struct tv_list *l = tv_list_new(r, a->n_pos);
        l->is_tuple = 1;
        if (a->n_pos) memcpy(l->items, a->pos, a->n_pos * sizeof(struct tv));
        return tmpl_str_percent(r, s, TV_LISTV(l));
    }
    if (!strcmp(name, "truncate")) {
        struct tv s = tv_to_str(r, v);
        int64_t length = tb_need_int(r, tb_arg(a, 0, "length", tv_int(255)), "length");
        int kill = tv_truthy(tb_arg(a, 1, "killwords", tv_bool(0)));
        struct tv end = tb_need_str(r, tb_arg(a, 2, "end", tv_cstr("...")), "end");
        struct tv lw = tb_arg(a, 3, "leeway", tv_none());
        int64_t leeway = lw.t == TV_NONE ? 5 : tb_need_int(r, lw, "leeway");
        int64_t n = (int64_t)tutf8_len(s.u.s.p, s.u.s.n), endn = (int64_t)tutf8_len(end.u.s.p, end.u.s.n);
        if (length < endn) tmpl_fail(r, CAIRN_ERR_INVALID, "expected length >= %lld, got %lld", (long long)endn, (long long)length);
        if (leeway < 0) tmpl_fail(r, CAIRN_ERR_INVALID, "expected leeway >= 0");
        if (n <= length + leeway) return s;
        struct tv head = tmpl_slice(r, s, tv_none(), tv_int(length - endn), tv_none());
        if (!kill) {
            /* rsplit(" ", 1)[0] */
            for (size_t k = head.u.s.n; k > 0; k--)
                if (head.u.s.p[k - 1] == ' ') {
                    head.u.s.n = k - 1;
                    break;
                }
        }
        struct tbuf b = {0};
        tbuf_put(r, &b, "", 0);
        tbuf_put(r, &b, head.u.s.p, head.u.s.n);
        tbuf_put(r, &b, end.u.s.p, end.u.s.n);
        return tbuf_to_str(r, &b);
    }
    if (!strcmp(name, "batch")) {
        int64_t size = tb_need_int(r, tb_arg(a, 0, "linecount", tv_none()), "linecount");
        struct tv fill = tb_arg(a, 1, "fill_with", tv_none());
        int has_fill = targs_get(a, 1, "fill_with", &fill);
        if (size <= 0) tmpl_fail(r, CAIRN_ERR_INVALID, "batch size must be positive");
        struct tv_list *l = tv_iter_list(r, v);
        size_t nb = (l->n + (size_t)size - 1) / (size_t)size;
        struct tv_list *out = tv_list_new(r, nb);
        for (size_t b = 0; b < nb; b++) {
            size_t st = b * (size_t)size, cnt = CAIRN_MIN((size_t)size, l->n - st);
            struct tv_list *chunk = tv_list_new(r, has_fill ? (size_t)size : cnt);
            for (size_t k = 0; k < chunk->n; k++) chunk->items[k] = k < cnt ? l->items[st + k] : fill;
            out->items[b] = TV_LISTV(chunk);
        }
        out->kind = TL_GEN;
        return TV_LISTV(out);
    }
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "line %d: no filter named '%s'", line, name);
}

/* ---- tests ---- */

static double tb_num_arg(struct trender *r, struct tv v)
{
    if (v.t == TV_FLOAT) return v.u.f;
    return (double)tb_need_int(r, v, "number");
}

static const char *const tb_test_names[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "number", "integer", "float",
    "sequence", "boolean", "true", "false", "callable", "equalto", "eq", "==", "ne", "!=", "lt",
    "<", "le", "<=", "gt", ">", "ge", ">=", "lessthan", "greaterthan", "odd", "even",
    "divisibleby", "in", "sameas", "lower", "upper", "escaped", "filter", "test", NULL};

int tmpl_test_exists(const char *name) { return tb_in(tb_test_names, name); }

int tmpl_test_apply(struct trender *r, const char *name, struct tv v, struct targs *a, int line)
{
    tmpl_step(r);
    struct tv x;
    int has = targs_get(a, 0, NULL, &x);
    if (!strcmp(name, "defined")) return v.t != TV_UNDEF;
    if (!strcmp(name, "undefined")) return v.t == TV_UNDEF;
    if (!strcmp(name, "none")) return v.t == TV_NONE;
    if (!strcmp(name, "string")) return v.t == TV_STR;
    if (!strcmp(name, "mapping")) return v.t == TV_DICT;
    if (!strcmp(name, "iterable")) return v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT || v.t == TV_UNDEF;
    if (!strcmp(name, "sequence"))
        return v.t == TV_STR || v.t == TV_DICT || v.t == TV_UNDEF ||
               (v.t == TV_LIST && (v.u.l->kind == TL_PLAIN || v.u.l->kind == TL_RANGE));
    if (!strcmp(name, "number")) return v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL;
    if (!strcmp(name, "integer")) return v.t == TV_INT;
    if (!strcmp(name, "float")) return v.t == TV_FLOAT;
    if (!strcmp(name, "boolean")) return v.t == TV_BOOL;
    if (!strcmp(name, "true")) return v.t == TV_BOOL && v.u.b;
    if (!strcmp(name, "false")) return v.t == TV_BOOL && !v.u.b;
    if (!strcmp(name, "callable")) return v.t == TV_UNDEF || v.t == TV_MACRO || v.t == TV_BUILTIN || v.t == TV_METHOD || v.t == TV_CYCLER;
    if (!strcmp(name, "escaped")) return 0;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        struct tv s = tv_to_str(r, v);
        return tv_truthy(tb_str_pred(s, name[0] == 'l' ? "islower" : "isupper"));
    }
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (v.t != TV_STR) return 0;
        const char *n = tv_str_copy(r, v.u.s.p, v.u.s.n).u.s.p;
        return name[0] == 'f' ? tmpl_filter_exists(n) : tmpl_test_exists(n);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.t == TV_UNDEF) tb_undef_fail(r, v);
        if (v.t == TV_FLOAT) {
            double dv = name[0] == 'd' ? tb_num_arg(r, has ? x : tv_none()) : 2.0;
            if (dv == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float modulo");
            double m = fmod(v.u.f, dv);
            if (m != 0 && ((m < 0) != (dv < 0))) m += dv;
            return name[0] == 'o' ? m == 1.0 : m == 0.0;
        }
        if (v.t != TV_INT && v.t != TV_BOOL) tmpl_fail(r, CAIRN_ERR_INVALID, "%s test needs a number", name);
        int64_t i = v.t == TV_INT ? v.u.i : v.u.b;
        if (name[0] == 'o') return (i % 2 + 2) % 2 == 1;
        if (name[0] == 'e') return i % 2 == 0;
        int64_t d = tb_need_int(r, has ? x : tv_none(), "divisibleby");
        if (d == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "integer division or modulo by zero");
        if (d == -1) return 1;
        return i % d == 0;
    }
    if (!has) tmpl_fail(r, CAIRN_ERR_INVALID, "line %d: test '%s' needs an argument", line, name);
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) return tv_equal(v, x);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !tv_equal(v, x);
    if (!strcmp(name, "sameas")) {
        if (v.t != x.t) return 0;
        if (v.t == TV_NONE || v.t == TV_BOOL || v.t == TV_UNDEF) return tv_equal(v, x);
        if (v.t == TV_LIST) return v.u.l == x.u.l;
        if (v.t == TV_DICT || v.t == TV_NS) return v.u.d == x.u.d;
        return tv_equal(v, x);
    }
    if (!strcmp(name, "in")) {
        struct tv_list *l;
        if (x.t == TV_STR) {
            if (v.t != TV_STR) tmpl_fail(r, CAIRN_ERR_INVALID, "'in <string>' requires string as left operand");
            return v.u.s.n == 0 || memmem(x.u.s.p, x.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (x.t == TV_DICT || x.t == TV_NS) {
            struct tv dummy;
            return tv_dict_get(x.u.d, v, &dummy);
        }
        l = tv_iter_list(r, x);
        for (size_t i = 0; i < l->n; i++)
            if (tv_equal(l->items[i], v)) return 1;
        return 0;
    }
    int op = 0;
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan")) op = 1;
    else if (!strcmp(name, "le") || !strcmp(name, "<=")) op = 2;
    else if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan")) op = 3;
    else if (!strcmp(name, "ge") || !strcmp(name, ">=")) op = 4;
    if (op) {
        if (v.t == TV_UNDEF) tb_undef_fail(r, v);
        if (x.t == TV_UNDEF) tb_undef_fail(r, x);
        int c = tv_compare(r, v, x);
        if (c == 3) return 0;
        return op == 1 ? c < 0 : op == 2 ? c <= 0 : op == 3 ? c > 0 : c >= 0;
    }
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "line %d: no test named '%s'", line, name);
}

/* ---- global functions ---- */

enum { TB_RANGE, TB_NAMESPACE, TB_DICT, TB_RAISE, TB_STRFTIME, TB_N };
static const char *const tb_builtin_names[TB_N] = {"range", "namespace", "dict", "raise_exception",
                                                   "strftime_now"};

int tmpl_builtin_lookup(const char *name)
{
    for (int i = 0; i < TB_N; i++)
        if (!strcmp(tb_builtin_names[i], name)) return i;
    return -1;
}

struct tv tmpl_builtin_call(struct trender *r, int id, struct targs *a)
{
    tmpl_step(r);
    switch (id) {
    case TB_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (a->n_pos == 1) {
            stop = tb_need_int(r, a->pos[0], "range");
        } else if (a->n_pos == 2 || a->n_pos == 3) {
            start = tb_need_int(r, a->pos[0], "range");
            stop = tb_need_int(r, a->pos[1], "range");
            if (a->n_pos == 3) step = tb_need_int(r, a->pos[2], "range");
        } else {
            tmpl_fail(r, CAIRN_ERR_INVALID, "range expected 1 to 3 arguments, got %zu", a->n_pos);
        }
        if (step == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "range() arg 3 must not be zero");
        double cnt_d = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                                : ceil(((double)start - (double)stop) / (double)-step);
        if (cnt_d < 0) cnt_d = 0;
        if (cnt_d > 100000)
            tmpl_fail(r, CAIRN_ERR_LIMIT, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        size_t cnt = (size_t)cnt_d;
        struct tv_list *l = tv_list_new(r, cnt);
        l->kind = TL_RANGE;
        l->rng[0] = start;
        l->rng[1] = stop;
        l->rng[2] = step;
        for (size_t i = 0; i < cnt; i++) {
            int64_t off, val;
            if (__builtin_mul_overflow((int64_t)i, step, &off) || __builtin_add_overflow(start, off, &val))
                tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "range: integer overflow");
            l->items[i] = tv_int(val);
        }
        return TV_LISTV(l);
    }
    case TB_NAMESPACE:
    case TB_DICT: {
        struct tv_dict *d = tv_dict_new(r, 0);
        for (size_t i = 0; i < a->n_pos; i++) {
            struct tv p = a->pos[i];
            if (p.t == TV_DICT || p.t == TV_NS) {
                for (size_t k = 0; k < p.u.d->n; k++) tv_dict_set(r, d, p.u.d->items[k].key, p.u.d->items[k].val);
            } else {
                tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "%s() positional arguments must be mappings",
                          tb_builtin_names[id]);
            }
        }
        for (size_t i = 0; i < a->n_kw; i++) tv_dict_set(r, d, tv_cstr(a->kwnames[i]), a->kw[i]);
        return (struct tv){.t = id == TB_NAMESPACE ? TV_NS : TV_DICT, .u.d = d};
    }
    case TB_RAISE: {
        struct tv m = tv_to_str(r, a->n_pos ? a->pos[0] : tv_str("", 0));
        tmpl_fail(r, CAIRN_ERR_INVALID, "%.*s", (int)CAIRN_MIN(m.u.s.n, 500), m.u.s.p);
    }
    case TB_STRFTIME: {
        struct tv f = tb_need_str(r, a->n_pos ? a->pos[0] : tv_none(), "strftime_now format");
        const char *fmt = tv_str_copy(r, f.u.s.p, f.u.s.n).u.s.p;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[512];
        size_t n = f.u.s.n ? strftime(buf, sizeof(buf), fmt, &tm) : 0;
        return tv_str_copy(r, buf, n);
    }
    }
    tmpl_fail(r, CAIRN_ERR_INTERNAL, "bad builtin %d", id);
}
