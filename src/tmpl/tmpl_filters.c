/* tmpl filters: jinja2's filters (tmpl.h lists them), with sorting and attribute-path helpers. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/tmpl_builtins_int.h"

/* ---- sorting helpers ---- */

struct tmpl_bi_sort_ctx {
    struct tmpl_rstate *r;
    int case_sensitive;
    int reverse;
};

struct tmpl_bi_sort_item {
    struct tmpl_tv key;
    struct tmpl_tv val;
    size_t idx;
};

static struct tmpl_tv tmpl_bi_fold(struct tmpl_rstate *r, struct tmpl_tv v, int case_sensitive)
{
    if (!case_sensitive && v.t == TMPL_TV_STR) return tmpl_bi_map_case(r, v, 0);
    return v;
}

static void tmpl_bi_sort(struct tmpl_rstate *r, struct tmpl_bi_sort_item *items, size_t n, int reverse)
{
    /* stable merge sort with tmpl_tv_compare (can fail: no qsort + longjmp through libc) */
    if (n < 2) return;
    struct tmpl_bi_sort_item *tmp = tmpl_alloc(r, n * sizeof(*tmp));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = CAIRN_MIN(lo + w, n), hi = CAIRN_MIN(lo + 2 * w, n);
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                tmpl_step(r);
                int c = tmpl_tv_compare(r, items[i].key, items[j].key);
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
static struct tmpl_tv tmpl_bi_attr_path(struct tmpl_rstate *r, struct tmpl_tv v, struct tmpl_tv attr)
{
    if (attr.t == TMPL_TV_INT) return v.t == TMPL_TV_UNDEF ? v : tmpl_getitem(r, v, attr);
    tmpl_bi_need_str(r, attr, "attribute");
    const char *p = attr.u.s.p, *end = p + attr.u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        struct tmpl_tv key = tmpl_tv_str(p, (size_t)(dot - p));
        if (v.t == TMPL_TV_UNDEF) return v;
        int all_digits = key.u.s.n > 0;
        for (size_t i = 0; i < key.u.s.n; i++)
            if (key.u.s.p[i] < '0' || key.u.s.p[i] > '9') all_digits = 0;
        if (all_digits) v = tmpl_getitem(r, v, tmpl_tv_int(strtoll(tmpl_printf(r, "%.*s", (int)key.u.s.n, key.u.s.p), NULL, 10)));
        else v = tmpl_getitem(r, v, key);
        p = dot + 1;
    }
    return v;
}

/* ---- filters ---- */

static struct tmpl_tv tmpl_bi_html_escape(struct tmpl_rstate *r, struct tmpl_tv s)
{
    struct tmpl_buf b = {0};
    tmpl_buf_put(r, &b, "", 0);
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        if (c == '&') tmpl_buf_puts(r, &b, "&amp;");
        else if (c == '<') tmpl_buf_puts(r, &b, "&lt;");
        else if (c == '>') tmpl_buf_puts(r, &b, "&gt;");
        else if (c == '"') tmpl_buf_puts(r, &b, "&#34;");
        else if (c == '\'') tmpl_buf_puts(r, &b, "&#39;");
        else tmpl_buf_putc(r, &b, c);
    }
    return tmpl_buf_to_str(r, &b);
}

static int tmpl_bi_parse_int(struct tmpl_tv s, int base, int64_t *out)
{
    char buf[80];
    struct tmpl_tv t = tmpl_bi_strip(s, tmpl_tv_none(), 1, 1);
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

static int tmpl_bi_parse_float(struct tmpl_tv s, double *out)
{
    char buf[80];
    struct tmpl_tv t = tmpl_bi_strip(s, tmpl_tv_none(), 1, 1);
    if (t.u.s.n == 0 || t.u.s.n >= sizeof(buf)) return 0;
    memcpy(buf, t.u.s.p, t.u.s.n);
    buf[t.u.s.n] = 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end) return 0;
    *out = d;
    return 1;
}

static int64_t tmpl_bi_len(struct tmpl_rstate *r, struct tmpl_tv v)
{
    switch (v.t) {
    case TMPL_TV_STR: return (int64_t)cairn_utf8_count(v.u.s.p, v.u.s.n);
    case TMPL_TV_LIST:
        if (v.u.l->kind == TMPL_TL_GEN) tmpl_fail(r, CAIRN_ERR_INVALID, "object of type 'generator' has no len()");
        return (int64_t)v.u.l->n;
    case TMPL_TV_DICT:
    case TMPL_TV_NS: return (int64_t)v.u.d->n;
    case TMPL_TV_UNDEF: return 0;
    default: tmpl_fail(r, CAIRN_ERR_INVALID, "object of type '%s' has no len()", tmpl_tv_type_name(v));
    }
}

static struct tmpl_tv tmpl_bi_select(struct tmpl_rstate *r, struct tmpl_tv seq, struct tmpl_args *a, int by_attr, int keep)
{
    /* jinja2 only iterates truthy values: False|select gives [] */
    struct tmpl_tv_list *l = tmpl_tv_truthy(seq) ? tmpl_tv_iter_list(r, seq) : tmpl_tv_list_new(r, 0);
    struct tmpl_tv attr = tmpl_tv_none();
    size_t first_test = 0;
    if (by_attr) {
        if (!tmpl_args_get(a, 0, NULL, &attr)) tmpl_fail(r, CAIRN_ERR_INVALID, "missing attribute for selectattr");
        first_test = 1;
    }
    struct tmpl_tv test;
    int has_test = tmpl_args_get(a, first_test, NULL, &test);
    const char *tname = NULL;
    if (has_test) tname = tmpl_tv_str_copy(r, tmpl_bi_need_str(r, test, "test name").u.s.p, test.u.s.n).u.s.p;
    struct tmpl_args ta = {0};
    if (a->n_pos > first_test + 1) {
        ta.pos = a->pos + first_test + 1;
        ta.n_pos = a->n_pos - first_test - 1;
    }
    struct tmpl_tv_list *out = tmpl_tv_list_new(r, l->n);
    out->n = 0;
    for (size_t i = 0; i < l->n; i++) {
        tmpl_step(r);
        struct tmpl_tv v = by_attr ? tmpl_bi_attr_path(r, l->items[i], attr) : l->items[i];
        int ok = has_test ? tmpl_test_apply(r, tname, v, &ta, 0) : tmpl_tv_truthy(v);
        if (ok == keep) out->items[out->n++] = l->items[i];
    }
    out->kind = TMPL_TL_GEN;
    return TMPL_TV_LISTV(out);
}

struct tmpl_tv tmpl_filter_apply(struct tmpl_rstate *r, const char *name, struct tmpl_tv v, struct tmpl_args *a, int line)
{
    tmpl_step_bytes(r, v.t == TMPL_TV_STR ? v.u.s.n : 0);
    if (!strcmp(name, "tojson")) {
        struct tmpl_tv ea = tmpl_bi_arg(a, 0, "ensure_ascii", tmpl_tv_bool(0));
        struct tmpl_tv ind = tmpl_bi_arg(a, 1, "indent", tmpl_tv_none());
        struct tmpl_tv seps = tmpl_bi_arg(a, 2, "separators", tmpl_tv_none());
        struct tmpl_tv sk = tmpl_bi_arg(a, 3, "sort_keys", tmpl_tv_bool(0));
        int indent = -1;
        if (ind.t == TMPL_TV_INT) indent = ind.u.i < 0 ? 0 : (int)CAIRN_MIN(ind.u.i, 64);
        else if (ind.t != TMPL_TV_NONE) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "tojson: indent must be an integer");
        const char *isep = NULL, *ksep = NULL;
        if (seps.t == TMPL_TV_LIST && seps.u.l->n == 2) {
            struct tmpl_tv s0 = tmpl_bi_need_str(r, seps.u.l->items[0], "separator");
            struct tmpl_tv s1 = tmpl_bi_need_str(r, seps.u.l->items[1], "separator");
            isep = tmpl_tv_str_copy(r, s0.u.s.p, s0.u.s.n).u.s.p;
            ksep = tmpl_tv_str_copy(r, s1.u.s.p, s1.u.s.n).u.s.p;
        } else if (seps.t != TMPL_TV_NONE) {
            tmpl_fail(r, CAIRN_ERR_INVALID, "tojson: separators must be a pair");
        }
        struct tmpl_buf b = {0};
        tmpl_buf_put(r, &b, "", 0);
        if (v.t == TMPL_TV_UNDEF) tmpl_fail(r, CAIRN_ERR_INVALID, "Object of type Undefined is not JSON serializable");
        tmpl_tv_tojson_append(r, &b, v, tmpl_tv_truthy(ea), indent, isep, ksep, tmpl_tv_truthy(sk), 0);
        return tmpl_buf_to_str(r, &b);
    }
    if (!strcmp(name, "safe") || !strcmp(name, "string")) return tmpl_tv_to_str(r, v);
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape"))
        return tmpl_bi_html_escape(r, tmpl_tv_to_str(r, v));
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct tmpl_tv def = tmpl_bi_arg(a, 0, "default_value", tmpl_tv_str("", 0));
        struct tmpl_tv boolean = tmpl_bi_arg(a, 1, "boolean", tmpl_tv_bool(0));
        if (v.t == TMPL_TV_UNDEF || (tmpl_tv_truthy(boolean) && !tmpl_tv_truthy(v))) return def;
        return v;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) return tmpl_tv_int(tmpl_bi_len(r, v));
    if (!strcmp(name, "trim")) {
        struct tmpl_tv chars = tmpl_bi_arg(a, 0, "chars", tmpl_tv_none());
        return tmpl_bi_strip(tmpl_tv_to_str(r, v), chars, 1, 1);
    }
    if (!strcmp(name, "upper")) return tmpl_bi_map_case(r, tmpl_tv_to_str(r, v), 1);
    if (!strcmp(name, "lower")) return tmpl_bi_map_case(r, tmpl_tv_to_str(r, v), 0);
    if (!strcmp(name, "capitalize")) return tmpl_bi_capitalize(r, tmpl_tv_to_str(r, v));
    if (!strcmp(name, "title")) return tmpl_bi_jtitle(r, tmpl_tv_to_str(r, v));
    if (!strcmp(name, "replace")) {
        struct tmpl_tv s = tmpl_tv_to_str(r, v);
        struct tmpl_tv o = tmpl_tv_to_str(r, tmpl_bi_arg(a, 0, "old", tmpl_tv_none()));
        struct tmpl_tv nw = tmpl_tv_to_str(r, tmpl_bi_arg(a, 1, "new", tmpl_tv_none()));
        struct tmpl_tv cnt = tmpl_bi_arg(a, 2, "count", tmpl_tv_none());
        return tmpl_bi_replace(r, s, o, nw, cnt.t == TMPL_TV_NONE ? -1 : tmpl_bi_need_int(r, cnt, "count"));
    }
    if (!strcmp(name, "items")) {
        if (v.t == TMPL_TV_UNDEF) return tmpl_bi_list_of(r, 0);
        if (v.t != TMPL_TV_DICT && v.t != TMPL_TV_NS) tmpl_fail(r, CAIRN_ERR_INVALID, "Can only get item pairs from a mapping.");
        struct tmpl_tv it = tmpl_bi_items_list(r, v.u.d);
        it.u.l->kind = TMPL_TL_GEN;
        return it;
    }
    if (!strcmp(name, "list") || !strcmp(name, "tuple")) {
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        struct tmpl_tv_list *c = tmpl_tv_list_new(r, l->n);
        if (l->n) memcpy(c->items, l->items, l->n * sizeof(struct tmpl_tv));
        c->is_tuple = name[0] == 't';
        return TMPL_TV_LISTV(c);
    }
    if (!strcmp(name, "join")) {
        struct tmpl_tv sep = tmpl_tv_to_str(r, tmpl_bi_arg(a, 0, "d", tmpl_tv_str("", 0)));
        struct tmpl_tv attr = tmpl_bi_arg(a, 1, "attribute", tmpl_tv_none());
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        struct tmpl_buf b = {0};
        tmpl_buf_put(r, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i) tmpl_buf_put(r, &b, sep.u.s.p, sep.u.s.n);
            struct tmpl_tv it = attr.t == TMPL_TV_NONE ? l->items[i] : tmpl_bi_attr_path(r, l->items[i], attr);
            tmpl_tv_str_append(r, &b, it);
        }
        return tmpl_buf_to_str(r, &b);
    }
    if (!strcmp(name, "first") && v.t == TMPL_TV_LIST && v.u.l->kind == TMPL_TL_GEN) {
        if (v.u.l->pos >= v.u.l->n) return tmpl_tv_undef("No first item, sequence was empty.");
        return v.u.l->items[v.u.l->pos++]; /* next(): consumes one */
    }
    if (!strcmp(name, "last") && v.t == TMPL_TV_LIST && v.u.l->kind == TMPL_TL_GEN)
        tmpl_fail(r, CAIRN_ERR_INVALID, "'generator' object is not reversible");
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        if (!l->n) return tmpl_tv_undef(tmpl_printf(r, "No %s item, sequence was empty.", name));
        return name[0] == 'f' ? l->items[0] : l->items[l->n - 1];
    }
    if (!strcmp(name, "selectattr")) return tmpl_bi_select(r, v, a, 1, 1);
    if (!strcmp(name, "rejectattr")) return tmpl_bi_select(r, v, a, 1, 0);
    if (!strcmp(name, "select")) return tmpl_bi_select(r, v, a, 0, 1);
    if (!strcmp(name, "reject")) return tmpl_bi_select(r, v, a, 0, 0);
    if (!strcmp(name, "map")) {
        struct tmpl_tv_list *l = tmpl_tv_truthy(v) ? tmpl_tv_iter_list(r, v) : tmpl_tv_list_new(r, 0);
        struct tmpl_tv_list *out = tmpl_tv_list_new(r, l->n);
        struct tmpl_tv attr, fname;
        if (tmpl_args_get(a, (size_t)-1, "attribute", &attr)) {
            struct tmpl_tv def = tmpl_bi_arg(a, (size_t)-1, "default", tmpl_tv_undef(NULL));
            for (size_t i = 0; i < l->n; i++) {
                tmpl_step(r);
                struct tmpl_tv x = tmpl_bi_attr_path(r, l->items[i], attr);
                out->items[i] = (x.t == TMPL_TV_UNDEF && def.t != TMPL_TV_UNDEF) ? def : x;
            }
            out->kind = TMPL_TL_GEN;
            return TMPL_TV_LISTV(out);
        }
        if (!tmpl_args_get(a, 0, NULL, &fname)) tmpl_fail(r, CAIRN_ERR_INVALID, "map requires a filter or attribute");
        const char *fn = tmpl_tv_str_copy(r, tmpl_bi_need_str(r, fname, "filter name").u.s.p, fname.u.s.n).u.s.p;
        struct tmpl_args fa = {.pos = a->pos + 1, .n_pos = a->n_pos - 1, .kwnames = a->kwnames, .kw = a->kw, .n_kw = a->n_kw};
        for (size_t i = 0; i < l->n; i++) out->items[i] = tmpl_filter_apply(r, fn, l->items[i], &fa, line);
        out->kind = TMPL_TL_GEN;
        return TMPL_TV_LISTV(out);
    }
    if ((!strcmp(name, "int") || !strcmp(name, "float")) && v.t == TMPL_TV_UNDEF) tmpl_bi_undef_fail(r, v);
    if (!strcmp(name, "int")) {
        struct tmpl_tv def = tmpl_bi_arg(a, 0, "default", tmpl_tv_int(0));
        int64_t base = tmpl_bi_need_int(r, tmpl_bi_arg(a, 1, "base", tmpl_tv_int(10)), "base");
        int64_t iv;
        double d;
        if (v.t == TMPL_TV_INT) return v;
        if (v.t == TMPL_TV_BOOL) return tmpl_tv_int(v.u.b);
        if (v.t == TMPL_TV_FLOAT) return isfinite(v.u.f) && fabs(v.u.f) < 9.2e18 ? tmpl_tv_int((int64_t)v.u.f) : def;
        if (v.t == TMPL_TV_STR) {
            if (tmpl_bi_parse_int(v, (int)base, &iv)) return tmpl_tv_int(iv);
            if (tmpl_bi_parse_float(v, &d) && isfinite(d) && fabs(d) < 9.2e18) return tmpl_tv_int((int64_t)d);
        }
        return def;
    }
    if (!strcmp(name, "float")) {
        struct tmpl_tv def = tmpl_bi_arg(a, 0, "default", tmpl_tv_float(0.0));
        double d;
        if (v.t == TMPL_TV_FLOAT) return v;
        if (v.t == TMPL_TV_INT) return tmpl_tv_float((double)v.u.i);
        if (v.t == TMPL_TV_BOOL) return tmpl_tv_float(v.u.b);
        if (v.t == TMPL_TV_STR && tmpl_bi_parse_float(v, &d)) return tmpl_tv_float(d);
        return def;
    }
    if (!strcmp(name, "abs")) {
        if (v.t == TMPL_TV_INT) {
            if (v.u.i == INT64_MIN) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
            return tmpl_tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == TMPL_TV_BOOL) return tmpl_tv_int(v.u.b);
        if (v.t == TMPL_TV_FLOAT) return tmpl_tv_float(fabs(v.u.f));
        tmpl_fail(r, CAIRN_ERR_INVALID, "bad operand type for abs(): '%s'", tmpl_tv_type_name(v));
    }
    if (!strcmp(name, "round")) {
        int64_t prec = tmpl_bi_need_int(r, tmpl_bi_arg(a, 0, "precision", tmpl_tv_int(0)), "precision");
        struct tmpl_tv method = tmpl_bi_arg(a, 1, "method", tmpl_tv_cstr("common"));
        if (v.t != TMPL_TV_INT && v.t != TMPL_TV_FLOAT && v.t != TMPL_TV_BOOL)
            tmpl_fail(r, CAIRN_ERR_INVALID, "round: a number is required, not %s", tmpl_tv_type_name(v));
        double x = v.t == TMPL_TV_FLOAT ? v.u.f : v.t == TMPL_TV_INT ? (double)v.u.i : v.u.b;
        double m = pow(10.0, (double)prec);
        double y;
        if (tmpl_bi_streq(method, "floor")) y = floor(x * m) / m;
        else if (tmpl_bi_streq(method, "ceil")) y = ceil(x * m) / m;
        else if (tmpl_bi_streq(method, "common")) {
            if (v.t != TMPL_TV_FLOAT && prec >= 0) return tmpl_tv_int(v.t == TMPL_TV_INT ? v.u.i : v.u.b);
            y = nearbyint(x * m) / m;
        }
        else tmpl_fail(r, CAIRN_ERR_INVALID, "method must be common, ceil or floor");
        return tmpl_tv_float(y);
    }
    if (!strcmp(name, "unique")) {
        int cs = tmpl_tv_truthy(tmpl_bi_arg(a, 0, "case_sensitive", tmpl_tv_bool(0)));
        struct tmpl_tv attr = tmpl_bi_arg(a, 1, "attribute", tmpl_tv_none());
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        struct tmpl_tv_list *out = tmpl_tv_list_new(r, l->n);
        struct tmpl_tv_dict *seen = tmpl_tv_dict_new(r, 0);
        out->n = 0;
        for (size_t i = 0; i < l->n; i++) {
            struct tmpl_tv k = attr.t == TMPL_TV_NONE ? l->items[i] : tmpl_bi_attr_path(r, l->items[i], attr);
            k = tmpl_bi_fold(r, k, cs);
            if (tmpl_tv_unhashable(k))
                tmpl_fail(r, CAIRN_ERR_INVALID, "unhashable type: '%s'", tmpl_tv_type_name(k));
            struct tmpl_tv dummy;
            if (tmpl_tv_dict_get(seen, k, &dummy)) continue;
            tmpl_tv_dict_set(r, seen, k, tmpl_tv_none());
            out->items[out->n++] = l->items[i];
        }
        out->kind = TMPL_TL_GEN;
        return TMPL_TV_LISTV(out);
    }
    if (!strcmp(name, "sort")) {
        int rev = tmpl_tv_truthy(tmpl_bi_arg(a, 0, "reverse", tmpl_tv_bool(0)));
        int cs = tmpl_tv_truthy(tmpl_bi_arg(a, 1, "case_sensitive", tmpl_tv_bool(0)));
        struct tmpl_tv attr = tmpl_bi_arg(a, 2, "attribute", tmpl_tv_none());
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        struct tmpl_bi_sort_item *it = tmpl_alloc(r, (l->n + 1) * sizeof(*it));
        for (size_t i = 0; i < l->n; i++) {
            struct tmpl_tv k = attr.t == TMPL_TV_NONE ? l->items[i] : tmpl_bi_attr_path(r, l->items[i], attr);
            it[i].key = tmpl_bi_fold(r, k, cs);
            it[i].val = l->items[i];
        }
        tmpl_bi_sort(r, it, l->n, rev);
        struct tmpl_tv_list *out = tmpl_tv_list_new(r, l->n);
        for (size_t i = 0; i < l->n; i++) out->items[i] = it[i].val;
        return TMPL_TV_LISTV(out);
    }
    if (!strcmp(name, "dictsort")) {
        int cs = tmpl_tv_truthy(tmpl_bi_arg(a, 0, "case_sensitive", tmpl_tv_bool(0)));
        struct tmpl_tv by = tmpl_bi_arg(a, 1, "by", tmpl_tv_cstr("key"));
        int rev = tmpl_tv_truthy(tmpl_bi_arg(a, 2, "reverse", tmpl_tv_bool(0)));
        if (v.t != TMPL_TV_DICT && v.t != TMPL_TV_NS) tmpl_fail(r, CAIRN_ERR_INVALID, "dictsort: a mapping is required");
        struct tmpl_tv items = tmpl_bi_items_list(r, v.u.d);
        size_t n = items.u.l->n;
        struct tmpl_bi_sort_item *it = tmpl_alloc(r, (n + 1) * sizeof(*it));
        int pos = tmpl_bi_streq(by, "value") ? 1 : 0;
        for (size_t i = 0; i < n; i++) {
            it[i].key = tmpl_bi_fold(r, items.u.l->items[i].u.l->items[pos], cs);
            it[i].val = items.u.l->items[i];
        }
        tmpl_bi_sort(r, it, n, rev);
        for (size_t i = 0; i < n; i++) items.u.l->items[i] = it[i].val;
        return items;
    }
    if (!strcmp(name, "reverse")) {
        if (v.t == TMPL_TV_STR) return tmpl_slice(r, v, tmpl_tv_none(), tmpl_tv_none(), tmpl_tv_int(-1));
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        struct tmpl_tv_list *out = tmpl_tv_list_new(r, l->n);
        for (size_t i = 0; i < l->n; i++) out->items[i] = l->items[l->n - 1 - i];
        out->kind = v.t == TMPL_TV_LIST && v.u.l->kind == TMPL_TL_GEN ? TMPL_TL_PLAIN : TMPL_TL_GEN; /* reversed() iterator */
        return TMPL_TV_LISTV(out);
    }
    if (!strcmp(name, "indent")) {
        struct tmpl_tv width = tmpl_bi_arg(a, 0, "width", tmpl_tv_int(4));
        int first = tmpl_tv_truthy(tmpl_bi_arg(a, 1, "first", tmpl_tv_bool(0)));
        int blank = tmpl_tv_truthy(tmpl_bi_arg(a, 2, "blank", tmpl_tv_bool(0)));
        struct tmpl_tv ind;
        if (width.t == TMPL_TV_STR) ind = width;
        else {
            int64_t w = tmpl_bi_need_int(r, width, "width");
            if (w < 0) w = 0;
            if (w > 4096) tmpl_fail(r, CAIRN_ERR_LIMIT, "indent width too large");
            char *sp = tmpl_alloc(r, (size_t)w + 1);
            memset(sp, ' ', (size_t)w);
            ind = tmpl_tv_str(sp, (size_t)w);
        }
        if (v.t != TMPL_TV_STR) tmpl_fail(r, CAIRN_ERR_INVALID, "indent: expected a string, not %s", tmpl_tv_type_name(v));
        struct tmpl_tv s = v;
        struct tmpl_buf sb = {0};
        tmpl_buf_put(r, &sb, s.u.s.p, s.u.s.n);
        tmpl_buf_putc(r, &sb, '\n');
        struct tmpl_tv_method m = {.self = tmpl_buf_to_str(r, &sb), .name = "splitlines"};
        struct tmpl_args none = {0};
        struct tmpl_tv lines = tmpl_method_call(r, &m, &none);
        struct tmpl_buf b = {0};
        tmpl_buf_put(r, &b, "", 0);
        if (first) tmpl_buf_put(r, &b, ind.u.s.p, ind.u.s.n);
        for (size_t i = 0; i < lines.u.l->n; i++) {
            struct tmpl_tv ln = lines.u.l->items[i];
            if (i) {
                tmpl_buf_putc(r, &b, '\n');
                if (blank || ln.u.s.n) tmpl_buf_put(r, &b, ind.u.s.p, ind.u.s.n);
            }
            tmpl_buf_put(r, &b, ln.u.s.p, ln.u.s.n);
        }
        return tmpl_buf_to_str(r, &b);
    }
    if (!strcmp(name, "wordcount")) {
        struct tmpl_tv s = tmpl_tv_to_str(r, v);
        int64_t c = 0;
        int in = 0;
        size_t i = 0;
        while (i < s.u.s.n) {
            uint32_t cp = cairn_utf8_next(s.u.s.p, s.u.s.n, &i);
            int w = cp == '_' || tmpl_bi_is_alpha_cp(cp) || tmpl_bi_is_digit_cp(cp);
            if (w && !in) c++;
            in = w;
        }
        return tmpl_tv_int(c);
    }
    if (!strcmp(name, "center")) {
        int64_t w = tmpl_bi_need_int(r, tmpl_bi_arg(a, 0, "width", tmpl_tv_int(80)), "width");
        return tmpl_bi_pad(r, tmpl_tv_to_str(r, v), w, tmpl_tv_cstr(" "), 0);
    }
    if (!strcmp(name, "sum")) {
        struct tmpl_tv attr = tmpl_bi_arg(a, 0, "attribute", tmpl_tv_none());
        struct tmpl_tv acc = tmpl_bi_arg(a, 1, "start", tmpl_tv_int(0));
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        for (size_t i = 0; i < l->n; i++) {
            struct tmpl_tv x = attr.t == TMPL_TV_NONE ? l->items[i] : tmpl_bi_attr_path(r, l->items[i], attr);
            if (acc.t == TMPL_TV_INT && x.t == TMPL_TV_INT) {
                int64_t z;
                if (__builtin_add_overflow(acc.u.i, x.u.i, &z)) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
                acc = tmpl_tv_int(z);
            } else if ((acc.t == TMPL_TV_INT || acc.t == TMPL_TV_FLOAT || acc.t == TMPL_TV_BOOL) &&
                       (x.t == TMPL_TV_INT || x.t == TMPL_TV_FLOAT || x.t == TMPL_TV_BOOL)) {
                double p = acc.t == TMPL_TV_FLOAT ? acc.u.f : acc.t == TMPL_TV_INT ? (double)acc.u.i : acc.u.b;
                double q = x.t == TMPL_TV_FLOAT ? x.u.f : x.t == TMPL_TV_INT ? (double)x.u.i : x.u.b;
                acc = tmpl_tv_float(p + q);
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported operand type(s) for +: '%s' and '%s'",
                          tmpl_tv_type_name(acc), tmpl_tv_type_name(x));
            }
        }
        return acc;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        int cs = tmpl_tv_truthy(tmpl_bi_arg(a, 0, "case_sensitive", tmpl_tv_bool(0)));
        struct tmpl_tv attr = tmpl_bi_arg(a, 1, "attribute", tmpl_tv_none());
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        if (!l->n) return tmpl_tv_undef(tmpl_printf(r, "No aggregated item, sequence was empty."));
        size_t best = 0;
        struct tmpl_tv bk = tmpl_bi_fold(r, attr.t == TMPL_TV_NONE ? l->items[0] : tmpl_bi_attr_path(r, l->items[0], attr), cs);
        for (size_t i = 1; i < l->n; i++) {
            struct tmpl_tv k = tmpl_bi_fold(r, attr.t == TMPL_TV_NONE ? l->items[i] : tmpl_bi_attr_path(r, l->items[i], attr), cs);
            int c = tmpl_tv_compare(r, k, bk);
            if ((name[1] == 'i' && c < 0) || (name[1] == 'a' && c > 0 && c != 3)) {
                best = i;
                bk = k;
            }
        }
        return l->items[best];
    }
    if (!strcmp(name, "attr")) {
        struct tmpl_tv nm = tmpl_bi_need_str(r, tmpl_bi_arg(a, 0, "name", tmpl_tv_none()), "attribute name");
        if (v.t == TMPL_TV_UNDEF) tmpl_bi_undef_fail(r, v);
        const char *an = tmpl_tv_str_copy(r, nm.u.s.p, nm.u.s.n).u.s.p;
        struct tmpl_tv out;
        if (v.t == TMPL_TV_NS || v.t == TMPL_TV_LOOP) return tmpl_getattr(r, v, an);
        if (an[0] != '_' && tmpl_bi_pyattr(r, v, an, &out)) return out;
        return tmpl_tv_undef(tmpl_printf(r, "'%s object' has no attribute '%s'", tmpl_tv_type_name(v), an));
    }
    if (!strcmp(name, "format")) {
        struct tmpl_tv s = tmpl_tv_to_str(r, v);
        /* jinja2: s % kwargs if kwargs else s % args (args is a tuple) */
        if (a->n_kw) {
            struct tmpl_tv_dict *d = tmpl_tv_dict_new(r, a->n_kw);
            for (size_t k = 0; k < a->n_kw; k++) tmpl_tv_dict_set(r, d, tmpl_tv_cstr(a->kwnames[k]), a->kw[k]);
            return tmpl_str_percent(r, s, TMPL_TV_DICTV(d));
        }
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, a->n_pos);
        l->is_tuple = 1;
        if (a->n_pos) memcpy(l->items, a->pos, a->n_pos * sizeof(struct tmpl_tv));
        return tmpl_str_percent(r, s, TMPL_TV_LISTV(l));
    }
    if (!strcmp(name, "truncate")) {
        struct tmpl_tv s = tmpl_tv_to_str(r, v);
        int64_t length = tmpl_bi_need_int(r, tmpl_bi_arg(a, 0, "length", tmpl_tv_int(255)), "length");
        int kill = tmpl_tv_truthy(tmpl_bi_arg(a, 1, "killwords", tmpl_tv_bool(0)));
        struct tmpl_tv end = tmpl_bi_need_str(r, tmpl_bi_arg(a, 2, "end", tmpl_tv_cstr("...")), "end");
        struct tmpl_tv lw = tmpl_bi_arg(a, 3, "leeway", tmpl_tv_none());
        int64_t leeway = lw.t == TMPL_TV_NONE ? 5 : tmpl_bi_need_int(r, lw, "leeway");
        int64_t n = (int64_t)cairn_utf8_count(s.u.s.p, s.u.s.n), endn = (int64_t)cairn_utf8_count(end.u.s.p, end.u.s.n);
        if (length < endn) tmpl_fail(r, CAIRN_ERR_INVALID, "expected length >= %lld, got %lld", (long long)endn, (long long)length);
        if (leeway < 0) tmpl_fail(r, CAIRN_ERR_INVALID, "expected leeway >= 0");
        if (n <= length + leeway) return s;
        struct tmpl_tv head = tmpl_slice(r, s, tmpl_tv_none(), tmpl_tv_int(length - endn), tmpl_tv_none());
        if (!kill) {
            /* rsplit(" ", 1)[0] */
            for (size_t k = head.u.s.n; k > 0; k--)
                if (head.u.s.p[k - 1] == ' ') {
                    head.u.s.n = k - 1;
                    break;
                }
        }
        struct tmpl_buf b = {0};
        tmpl_buf_put(r, &b, "", 0);
        tmpl_buf_put(r, &b, head.u.s.p, head.u.s.n);
        tmpl_buf_put(r, &b, end.u.s.p, end.u.s.n);
        return tmpl_buf_to_str(r, &b);
    }
    if (!strcmp(name, "batch")) {
        int64_t size = tmpl_bi_need_int(r, tmpl_bi_arg(a, 0, "linecount", tmpl_tv_none()), "linecount");
        struct tmpl_tv fill = tmpl_bi_arg(a, 1, "fill_with", tmpl_tv_none());
        int has_fill = tmpl_args_get(a, 1, "fill_with", &fill);
        if (size <= 0) tmpl_fail(r, CAIRN_ERR_INVALID, "batch size must be positive");
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, v);
        size_t nb = (l->n + (size_t)size - 1) / (size_t)size;
        struct tmpl_tv_list *out = tmpl_tv_list_new(r, nb);
        for (size_t b = 0; b < nb; b++) {
            size_t st = b * (size_t)size, cnt = CAIRN_MIN((size_t)size, l->n - st);
            struct tmpl_tv_list *chunk = tmpl_tv_list_new(r, has_fill ? (size_t)size : cnt);
            for (size_t k = 0; k < chunk->n; k++) chunk->items[k] = k < cnt ? l->items[st + k] : fill;
            out->items[b] = TMPL_TV_LISTV(chunk);
        }
        out->kind = TMPL_TL_GEN;
        return TMPL_TV_LISTV(out);
    }
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "line %d: no filter named '%s'", line, name);
}
