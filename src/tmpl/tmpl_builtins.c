/* tmpl built-ins: attribute and item access (jinja2 sandbox rules: dict/str/list methods, then
 * keys; mutating methods are unsafe and not callable), slicing by code points, the globals range,
 * namespace, dict, raise_exception, strftime_now, argument binding, and the small helpers the
 * other built-in files share (tmpl_builtins_int.h). Methods, filters, tests and formatting are
 * in tmpl_methods.c, tmpl_filters.c, tmpl_tests.c and tmpl_format.c. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/tmpl_builtins_int.h"

int tmpl_bi_streq(struct tmpl_tv v, const char *s)
{
    return v.t == TMPL_TV_STR && v.u.s.n == strlen(s) && !memcmp(v.u.s.p, s, v.u.s.n);
}

void tmpl_bi_undef_fail(struct tmpl_rstate *r, struct tmpl_tv v)
{
    if (v.u.s.n) tmpl_fail(r, CAIRN_ERR_INVALID, "%.*s", (int)v.u.s.n, v.u.s.p);
    tmpl_fail(r, CAIRN_ERR_INVALID, "value is undefined");
}

struct tmpl_tv tmpl_bi_need_str(struct tmpl_rstate *r, struct tmpl_tv v, const char *what)
{
    if (v.t != TMPL_TV_STR)
        tmpl_fail(r, CAIRN_ERR_INVALID, "%s must be str, not %s", what, tmpl_tv_type_name(v));
    return v;
}

int64_t tmpl_bi_need_int(struct tmpl_rstate *r, struct tmpl_tv v, const char *what)
{
    if (v.t == TMPL_TV_INT) return v.u.i;
    if (v.t == TMPL_TV_BOOL) return v.u.b;
    tmpl_fail(r, CAIRN_ERR_INVALID, "%s must be an integer, not %s", what, tmpl_tv_type_name(v));
}

/* byte offsets of each code point (n_cp + 1 entries) */
static size_t *tmpl_bi_offsets(struct tmpl_rstate *r, struct tmpl_tv s, size_t *n_cp)
{
    tmpl_step_bytes(r, s.u.s.n);
    size_t n = cairn_utf8_count(s.u.s.p, s.u.s.n);
    size_t *off = tmpl_alloc(r, (n + 1) * sizeof(size_t));
    size_t i = 0;
    for (size_t k = 0; k < n; k++) {
        off[k] = i;
        cairn_utf8_next(s.u.s.p, s.u.s.n, &i);
    }
    off[n] = s.u.s.n;
    *n_cp = n;
    return off;
}

struct tmpl_tv tmpl_bi_list_of(struct tmpl_rstate *r, size_t n)
{
    return TMPL_TV_LISTV(tmpl_tv_list_new(r, n));
}

/* ---- item access and slicing ---- */

struct tmpl_tv tmpl_slice(struct tmpl_rstate *r, struct tmpl_tv obj, struct tmpl_tv start, struct tmpl_tv stop, struct tmpl_tv step)
{
    int64_t st = step.t == TMPL_TV_NONE ? 1 : tmpl_bi_need_int(r, step, "slice step");
    if (st == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "slice step cannot be zero");
    size_t n_cp = 0, *off = NULL;
    int64_t len;
    if (obj.t == TMPL_TV_STR) {
        off = tmpl_bi_offsets(r, obj, &n_cp);
        len = (int64_t)n_cp;
    } else if (obj.t == TMPL_TV_LIST) {
        if (obj.u.l->kind != TMPL_TL_PLAIN && obj.u.l->kind != TMPL_TL_RANGE)
            tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not subscriptable", tmpl_tv_type_name(obj));
        len = (int64_t)obj.u.l->n;
    } else {
        tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not subscriptable", tmpl_tv_type_name(obj));
    }
    int64_t a, b;
    if (st > 0) {
        a = start.t == TMPL_TV_NONE ? 0 : tmpl_bi_need_int(r, start, "slice index");
        b = stop.t == TMPL_TV_NONE ? len : tmpl_bi_need_int(r, stop, "slice index");
        if (a < 0) a = a + len < 0 ? 0 : a + len;
        if (b < 0) b = b + len < 0 ? 0 : b + len;
        if (a > len) a = len;
        if (b > len) b = len;
    } else {
        a = start.t == TMPL_TV_NONE ? len - 1 : tmpl_bi_need_int(r, start, "slice index");
        b = stop.t == TMPL_TV_NONE ? -1 : tmpl_bi_need_int(r, stop, "slice index");
        if (start.t != TMPL_TV_NONE && a < 0) a = a + len < 0 ? -1 : a + len;
        if (stop.t != TMPL_TV_NONE && b < 0) b = b + len < 0 ? -1 : b + len;
        if (a >= len) a = len - 1;
        if (b >= len) b = len - 1;
    }
    size_t count = 0;
    if (st > 0 && b > a) count = (size_t)((uint64_t)(b - a - 1) / (uint64_t)st + 1);
    if (st < 0 && a > b) {
        uint64_t ust = st == INT64_MIN ? (uint64_t)INT64_MAX + 1 : (uint64_t)-st;
        count = (size_t)((uint64_t)(a - b - 1) / ust + 1);
    }
    if (obj.t == TMPL_TV_LIST) {
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, count);
        l->is_tuple = obj.u.l->is_tuple;
        for (size_t k = 0; k < count; k++) l->items[k] = obj.u.l->items[a + (int64_t)k * st];
        return TMPL_TV_LISTV(l);
    }
    if (st == 1) return tmpl_tv_str(obj.u.s.p + off[a], count ? off[b] - off[a] : 0);
    struct tmpl_buf buf = {0};
    for (size_t k = 0; k < count; k++) {
        int64_t i = a + (int64_t)k * st;
        tmpl_buf_put(r, &buf, obj.u.s.p + off[i], off[i + 1] - off[i]);
    }
    return tmpl_buf_to_str(r, &buf);
}

static const char *const tmpl_bi_str_methods[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "upper",
    "lower", "title", "capitalize", "find", "rfind", "index", "rindex", "count", "format", "join",
    "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "center",
    "ljust", "rjust", "zfill", "swapcase", "partition", "rpartition", "casefold", "isnumeric",
    "isdecimal", "removeprefix", "removesuffix", NULL};
static const char *const tmpl_bi_dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const tmpl_bi_dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const tmpl_bi_list_methods[] = {"index", "count", "copy", NULL};
static const char *const tmpl_bi_list_unsafe[] = {"append", "extend", "insert", "pop", "remove",
                                             "reverse", "sort", "clear", NULL};

int tmpl_bi_in(const char *const *list, const char *name)
{
    for (; *list; list++)
        if (!strcmp(*list, name)) return 1;
    return 0;
}

static struct tmpl_tv tmpl_bi_method(struct tmpl_rstate *r, struct tmpl_tv self, const char *name)
{
    struct tmpl_tv_method *m = tmpl_alloc(r, sizeof(*m));
    m->self = self;
    m->name = name;
    return (struct tmpl_tv){.t = TMPL_TV_METHOD, .u.meth = m};
}

/* Python getattr(obj, name) only; returns 0 when there is no such attribute. */
int tmpl_bi_pyattr(struct tmpl_rstate *r, struct tmpl_tv obj, const char *name, struct tmpl_tv *out)
{
    switch (obj.t) {
    case TMPL_TV_STR:
        if (tmpl_bi_in(tmpl_bi_str_methods, name)) {
            *out = tmpl_bi_method(r, obj, name);
            return 1;
        }
        return 0;
    case TMPL_TV_DICT:
        if (tmpl_bi_in(tmpl_bi_dict_methods, name)) {
            *out = tmpl_bi_method(r, obj, name);
            return 1;
        }
        if (tmpl_bi_in(tmpl_bi_dict_unsafe, name)) {
            *out = tmpl_tv_undef(tmpl_printf(r, "access to attribute '%s' of 'dict' object is unsafe.", name));
            return 1;
        }
        return 0;
    case TMPL_TV_LIST:
        if (obj.u.l->kind == TMPL_TL_RANGE && (!strcmp(name, "index") || !strcmp(name, "count"))) {
            *out = tmpl_bi_method(r, obj, name);
            return 1;
        }
        if (obj.u.l->kind != TMPL_TL_PLAIN) return 0;
        if (tmpl_bi_in(tmpl_bi_list_methods, name)) {
            *out = tmpl_bi_method(r, obj, name);
            return 1;
        }
        if (tmpl_bi_in(tmpl_bi_list_unsafe, name)) {
            *out = tmpl_tv_undef(tmpl_printf(r, "access to attribute '%s' of '%s' object is unsafe.", name,
                                      tmpl_tv_type_name(obj)));
            return 1;
        }
        return 0;
    default: return 0;
    }
}

struct tmpl_tv tmpl_getattr(struct tmpl_rstate *r, struct tmpl_tv obj, const char *name)
{
    struct tmpl_tv v;
    if (obj.t == TMPL_TV_LOOP) return tmpl_loop_attr(r, obj.u.loop, name);
    if (obj.t == TMPL_TV_NS) {
        if (tmpl_tv_dict_get_str(obj.u.d, name, &v)) return v;
        return tmpl_tv_undef(tmpl_printf(r, "'Namespace object' has no attribute '%s'", name));
    }
    if (name[0] == '_')
        return tmpl_tv_undef(tmpl_printf(r, "access to attribute '%s' of '%s' object is unsafe.", name, tmpl_tv_type_name(obj)));
    if (tmpl_bi_pyattr(r, obj, name, &v)) return v;
    if (obj.t == TMPL_TV_DICT && tmpl_tv_dict_get_str(obj.u.d, name, &v)) return v;
    return tmpl_tv_undef(tmpl_printf(r, "'%s object' has no attribute '%s'", tmpl_tv_type_name(obj), name));
}

struct tmpl_tv tmpl_getitem(struct tmpl_rstate *r, struct tmpl_tv obj, struct tmpl_tv key)
{
    struct tmpl_tv v;
    switch (obj.t) {
    case TMPL_TV_DICT:
    case TMPL_TV_NS:
        if (tmpl_tv_dict_get(obj.u.d, key, &v)) return v;
        break;
    case TMPL_TV_LIST:
        if (obj.u.l->kind != TMPL_TL_PLAIN && obj.u.l->kind != TMPL_TL_RANGE) break;
        if (key.t == TMPL_TV_INT || key.t == TMPL_TV_BOOL) {
            int64_t i = key.t == TMPL_TV_INT ? key.u.i : key.u.b, n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj.u.l->items[i];
            return tmpl_tv_undef(tmpl_printf(r, "%s object has no element %lld", tmpl_tv_type_name(obj),
                                      (long long)(key.t == TMPL_TV_INT ? key.u.i : key.u.b)));
        }
        break;
    case TMPL_TV_STR:
        if (key.t == TMPL_TV_INT || key.t == TMPL_TV_BOOL) {
            size_t n;
            size_t *off = tmpl_bi_offsets(r, obj, &n);
            int64_t i = key.t == TMPL_TV_INT ? key.u.i : key.u.b;
            if (i < 0) i += (int64_t)n;
            if (i >= 0 && i < (int64_t)n) return tmpl_tv_str(obj.u.s.p + off[i], off[i + 1] - off[i]);
            return tmpl_tv_undef(tmpl_printf(r, "str object has no element %lld", (long long)i));
        }
        break;
    case TMPL_TV_LOOP:
        if (key.t == TMPL_TV_STR) return tmpl_getattr(r, obj, tmpl_tv_str_copy(r, key.u.s.p, key.u.s.n).u.s.p);
        break;
    default: break;
    }
    if (key.t == TMPL_TV_STR && obj.t != TMPL_TV_NS) {
        const char *name = tmpl_tv_str_copy(r, key.u.s.p, key.u.s.n).u.s.p;
        if (name[0] != '_' && tmpl_bi_pyattr(r, obj, name, &v)) return v;
        return tmpl_tv_undef(tmpl_printf(r, "'%s object' has no attribute '%s'", tmpl_tv_type_name(obj), name));
    }
    struct tmpl_buf kb = {0};
    tmpl_tv_repr_append(r, &kb, key);
    return tmpl_tv_undef(tmpl_printf(r, "'%s object' has no attribute %.*s", tmpl_tv_type_name(obj),
                              (int)CAIRN_MIN(kb.n, 100), kb.p ? kb.p : ""));
}

/* ---- filter names (the `filter` test asks them too) ---- */

static const char *const tmpl_bi_filter_names[] = {
    "tojson", "trim", "length", "count", "items", "list", "join", "default", "d", "first", "last",
    "selectattr", "rejectattr", "select", "reject", "map", "upper", "lower", "capitalize", "title",
    "replace", "safe", "string", "int", "float", "abs", "round", "unique", "sort", "reverse",
    "dictsort", "indent", "wordcount", "center", "sum", "min", "max", "attr", "format", "e",
    "escape", "forceescape", "batch", "tuple", "truncate", NULL};

int tmpl_filter_exists(const char *name) { return tmpl_bi_in(tmpl_bi_filter_names, name); }

/* ---- global functions ---- */

enum { TB_RANGE, TB_NAMESPACE, TB_DICT, TB_RAISE, TB_STRFTIME, TB_N };
static const char *const tmpl_bi_builtin_names[TB_N] = {"range", "namespace", "dict", "raise_exception",
                                                   "strftime_now"};

int tmpl_builtin_lookup(const char *name)
{
    for (int i = 0; i < TB_N; i++)
        if (!strcmp(tmpl_bi_builtin_names[i], name)) return i;
    return -1;
}

struct tmpl_tv tmpl_builtin_call(struct tmpl_rstate *r, int id, struct tmpl_args *a)
{
    tmpl_step(r);
    switch (id) {
    case TB_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (a->n_pos == 1) {
            stop = tmpl_bi_need_int(r, a->pos[0], "range");
        } else if (a->n_pos == 2 || a->n_pos == 3) {
            start = tmpl_bi_need_int(r, a->pos[0], "range");
            stop = tmpl_bi_need_int(r, a->pos[1], "range");
            if (a->n_pos == 3) step = tmpl_bi_need_int(r, a->pos[2], "range");
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
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, cnt);
        l->kind = TMPL_TL_RANGE;
        l->rng[0] = start;
        l->rng[1] = stop;
        l->rng[2] = step;
        for (size_t i = 0; i < cnt; i++) {
            int64_t off, val;
            if (__builtin_mul_overflow((int64_t)i, step, &off) || __builtin_add_overflow(start, off, &val))
                tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "range: integer overflow");
            l->items[i] = tmpl_tv_int(val);
        }
        return TMPL_TV_LISTV(l);
    }
    case TB_NAMESPACE:
    case TB_DICT: {
        struct tmpl_tv_dict *d = tmpl_tv_dict_new(r, 0);
        for (size_t i = 0; i < a->n_pos; i++) {
            struct tmpl_tv p = a->pos[i];
            if (p.t == TMPL_TV_DICT || p.t == TMPL_TV_NS) {
                for (size_t k = 0; k < p.u.d->n; k++) tmpl_tv_dict_set(r, d, p.u.d->items[k].key, p.u.d->items[k].val);
            } else {
                tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "%s() positional arguments must be mappings",
                          tmpl_bi_builtin_names[id]);
            }
        }
        for (size_t i = 0; i < a->n_kw; i++) tmpl_tv_dict_set(r, d, tmpl_tv_cstr(a->kwnames[i]), a->kw[i]);
        return (struct tmpl_tv){.t = id == TB_NAMESPACE ? TMPL_TV_NS : TMPL_TV_DICT, .u.d = d};
    }
    case TB_RAISE: {
        struct tmpl_tv m = tmpl_tv_to_str(r, a->n_pos ? a->pos[0] : tmpl_tv_str("", 0));
        tmpl_fail(r, CAIRN_ERR_INVALID, "%.*s", (int)CAIRN_MIN(m.u.s.n, 500), m.u.s.p);
    }
    case TB_STRFTIME: {
        struct tmpl_tv f = tmpl_bi_need_str(r, a->n_pos ? a->pos[0] : tmpl_tv_none(), "strftime_now format");
        const char *fmt = tmpl_tv_str_copy(r, f.u.s.p, f.u.s.n).u.s.p;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[512];
        size_t n = f.u.s.n ? strftime(buf, sizeof(buf), fmt, &tm) : 0;
        return tmpl_tv_str_copy(r, buf, n);
    }
    }
    tmpl_fail(r, CAIRN_ERR_INTERNAL, "bad builtin %d", id);
}

int tmpl_args_get(struct tmpl_args *a, size_t i, const char *name, struct tmpl_tv *out)
{
    if (i < a->n_pos) {
        *out = a->pos[i];
        return 1;
    }
    for (size_t k = 0; name && k < a->n_kw; k++)
        if (!strcmp(a->kwnames[k], name)) {
            *out = a->kw[k];
            return 1;
        }
    return 0;
}
