/* tmpl values: constructors, dicts, JSON in and out (json.dumps as transformers' tojson), and
 * Python semantics for truthiness, equality, ordering, str() and repr(). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tmpl/tmpl_int.h"

struct tmpl_tv tmpl_tv_none(void) { return (struct tmpl_tv){.t = TMPL_TV_NONE}; }
struct tmpl_tv tmpl_tv_bool(int b) { return (struct tmpl_tv){.t = TMPL_TV_BOOL, .u.b = !!b}; }
struct tmpl_tv tmpl_tv_int(int64_t i) { return (struct tmpl_tv){.t = TMPL_TV_INT, .u.i = i}; }
struct tmpl_tv tmpl_tv_float(double f) { return (struct tmpl_tv){.t = TMPL_TV_FLOAT, .u.f = f}; }

struct tmpl_tv tmpl_tv_str(const char *p, size_t n)
{
    struct tmpl_tv v = {.t = TMPL_TV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

struct tmpl_tv tmpl_tv_cstr(const char *p) { return tmpl_tv_str(p, strlen(p)); }

struct tmpl_tv tmpl_tv_undef(const char *hint)
{
    struct tmpl_tv v = {.t = TMPL_TV_UNDEF};
    v.u.s.p = hint;
    v.u.s.n = hint ? strlen(hint) : 0;
    return v;
}

struct tmpl_tv tmpl_tv_str_copy(struct tmpl_rstate *r, const char *p, size_t n)
{
    char *c = tmpl_alloc(r, n + 1);
    memcpy(c, p, n);
    return tmpl_tv_str(c, n);
}

struct tmpl_tv_list *tmpl_tv_list_new(struct tmpl_rstate *r, size_t n)
{
    if (n > SIZE_MAX / sizeof(struct tmpl_tv) / 2)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "list too large");
    struct tmpl_tv_list *l = tmpl_alloc(r, sizeof(*l));
    l->n = n;
    l->items = n ? tmpl_alloc(r, n * sizeof(struct tmpl_tv)) : NULL;
    return l;
}

struct tmpl_tv_dict *tmpl_tv_dict_new(struct tmpl_rstate *r, size_t cap)
{
    struct tmpl_tv_dict *d = tmpl_alloc(r, sizeof(*d));
    if (cap) {
        if (cap > SIZE_MAX / sizeof(struct tmpl_tv_kv) / 2) tmpl_fail(r, CAIRN_ERR_LIMIT, "dict too large");
        d->items = tmpl_alloc(r, cap * sizeof(struct tmpl_tv_kv));
        d->cap = cap;
    }
    return d;
}

static uint64_t tmpl_tv_hash(struct tmpl_tv k)
{
    switch (k.t) {
    case TMPL_TV_STR: {
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < k.u.s.n; i++) h = (h ^ (unsigned char)k.u.s.p[i]) * 1099511628211ull;
        return h;
    }
    case TMPL_TV_BOOL: return (uint64_t)k.u.b * 0x9E3779B97F4A7C15ull;
    case TMPL_TV_INT: return (uint64_t)k.u.i * 0x9E3779B97F4A7C15ull;
    case TMPL_TV_FLOAT:
        if (k.u.f == floor(k.u.f) && fabs(k.u.f) < 9e18) return (uint64_t)(int64_t)k.u.f * 0x9E3779B97F4A7C15ull;
        return 7;
    default: return 0;
    }
}

static void tmpl_tv_dict_reindex(struct tmpl_rstate *r, struct tmpl_tv_dict *d)
{
    size_t cap = 16;
    while (cap < d->n * 2 + 2) cap *= 2;
    d->index = tmpl_alloc(r, cap * sizeof(uint32_t));
    d->index_cap = cap;
    for (size_t i = 0; i < d->n; i++) {
        size_t s = tmpl_tv_hash(d->items[i].key) & (cap - 1);
        while (d->index[s]) s = (s + 1) & (cap - 1);
        d->index[s] = (uint32_t)(i + 1);
    }
}

static long tmpl_tv_dict_find(const struct tmpl_tv_dict *d, struct tmpl_tv key)
{
    if (d->index) {
        size_t s = tmpl_tv_hash(key) & (d->index_cap - 1);
        while (d->index[s]) {
            size_t i = d->index[s] - 1;
            if (tmpl_tv_equal(d->items[i].key, key)) return (long)i;
            s = (s + 1) & (d->index_cap - 1);
        }
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (tmpl_tv_equal(d->items[i].key, key)) return (long)i;
    return -1;
}

void tmpl_tv_dict_set(struct tmpl_rstate *r, struct tmpl_tv_dict *d, struct tmpl_tv key, struct tmpl_tv val)
{
    long i = tmpl_tv_dict_find(d, key);
    if (i >= 0) {
        d->items[i].val = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct tmpl_tv_kv *items = tmpl_alloc(r, cap * sizeof(*items));
        if (d->n) memcpy(items, d->items, d->n * sizeof(*items));
        d->items = items;
        d->cap = cap;
    }
    if (d->n >= UINT32_MAX - 1) tmpl_fail(r, CAIRN_ERR_LIMIT, "dict too large");
    d->items[d->n].key = key;
    d->items[d->n].val = val;
    d->n++;
    if (d->index && d->n * 2 + 2 <= d->index_cap) {
        size_t s = tmpl_tv_hash(key) & (d->index_cap - 1);
        while (d->index[s]) s = (s + 1) & (d->index_cap - 1);
        d->index[s] = (uint32_t)d->n;
    } else if (d->n > 8) {
        tmpl_tv_dict_reindex(r, d);
    }
}

int tmpl_tv_dict_get(const struct tmpl_tv_dict *d, struct tmpl_tv key, struct tmpl_tv *out)
{
    long i = tmpl_tv_dict_find(d, key);
    if (i < 0) return 0;
    *out = d->items[i].val;
    return 1;
}

int tmpl_tv_dict_get_str(const struct tmpl_tv_dict *d, const char *key, struct tmpl_tv *out)
{
    return tmpl_tv_dict_get(d, tmpl_tv_cstr(key), out);
}

struct tmpl_tv tmpl_tv_from_json(struct tmpl_rstate *r, json_t *j)
{
    tmpl_step(r);
    if (++r->depth > 4096) tmpl_fail(r, CAIRN_ERR_LIMIT, "context JSON nested too deeply");
    struct tmpl_tv v;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct tmpl_tv_dict *d = tmpl_tv_dict_new(r, json_object_size(j));
        const char *k;
        json_t *jv;
        json_object_foreach(j, k, jv) {
            struct tmpl_tv key = tmpl_tv_cstr(k);
            key.taint = TMPL_TAINT_ALL; /* context keys are data too */
            tmpl_tv_dict_set(r, d, key, tmpl_tv_from_json(r, jv));
        }
        v = (struct tmpl_tv){.t = TMPL_TV_DICT, .u.d = d};
        break;
    }
    case JSON_ARRAY: {
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, json_array_size(j));
        for (size_t i = 0; i < l->n; i++) l->items[i] = tmpl_tv_from_json(r, json_array_get(j, i));
        v = (struct tmpl_tv){.t = TMPL_TV_LIST, .u.l = l};
        break;
    }
    case JSON_STRING:
        v = tmpl_tv_str(json_string_value(j), json_string_length(j));
        v.taint = TMPL_TAINT_ALL;
        break;
    case JSON_INTEGER: v = tmpl_tv_int(json_integer_value(j)); break;
    case JSON_REAL: v = tmpl_tv_float(json_real_value(j)); break;
    case JSON_TRUE: v = tmpl_tv_bool(1); break;
    case JSON_FALSE: v = tmpl_tv_bool(0); break;
    default: v = tmpl_tv_none(); break;
    }
    r->depth--;
    return v;
}

int tmpl_tv_truthy(struct tmpl_tv v)
{
    switch (v.t) {
    case TMPL_TV_UNDEF:
    case TMPL_TV_NONE: return 0;
    case TMPL_TV_BOOL: return v.u.b;
    case TMPL_TV_INT: return v.u.i != 0;
    case TMPL_TV_FLOAT: return v.u.f != 0;
    case TMPL_TV_STR: return v.u.s.n != 0;
    case TMPL_TV_LIST: return v.u.l->kind == TMPL_TL_GEN ? 1 : v.u.l->n != 0;
    case TMPL_TV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int tmpl_tv_is_num(struct tmpl_tv v) { return v.t == TMPL_TV_BOOL || v.t == TMPL_TV_INT || v.t == TMPL_TV_FLOAT; }

static double tmpl_tv_num(struct tmpl_tv v)
{
    return v.t == TMPL_TV_FLOAT ? v.u.f : v.t == TMPL_TV_INT ? (double)v.u.i : (double)v.u.b;
}

static int tmpl_tv_num_cmp(struct tmpl_tv a, struct tmpl_tv b)
{
    if (a.t != TMPL_TV_FLOAT && b.t != TMPL_TV_FLOAT) {
        int64_t x = a.t == TMPL_TV_INT ? a.u.i : a.u.b, y = b.t == TMPL_TV_INT ? b.u.i : b.u.b;
        return x < y ? -1 : x > y;
    }
    double x = tmpl_tv_num(a), y = tmpl_tv_num(b);
    if (x != x || y != y) return 2; /* unordered */
    return x < y ? -1 : x > y;
}

/* Recursion is bounded: structures nested deeper than 256 levels compare unequal. */
static int tmpl_tv_equal_d(struct tmpl_tv a, struct tmpl_tv b, int depth)
{
    if (depth > 256) return 0;
    if (tmpl_tv_is_num(a) && tmpl_tv_is_num(b)) return tmpl_tv_num_cmp(a, b) == 0;
    if (a.t != b.t) return 0;
    switch (a.t) {
    case TMPL_TV_UNDEF:
    case TMPL_TV_NONE: return 1;
    case TMPL_TV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case TMPL_TV_LIST:
        if (a.u.l->kind != b.u.l->kind) return 0;
        if (a.u.l->kind == TMPL_TL_GEN) return a.u.l == b.u.l;
        if (a.u.l->is_tuple != b.u.l->is_tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tmpl_tv_equal_d(a.u.l->items[i], b.u.l->items[i], depth + 1)) return 0;
        return 1;
    case TMPL_TV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct tmpl_tv v;
            if (!tmpl_tv_dict_get(b.u.d, a.u.d->items[i].key, &v) || !tmpl_tv_equal_d(v, a.u.d->items[i].val, depth + 1)) return 0;
        }
        return 1;
    case TMPL_TV_NS: return a.u.d == b.u.d;
    case TMPL_TV_MACRO: return a.u.m == b.u.m;
    case TMPL_TV_BUILTIN: return a.u.builtin == b.u.builtin;
    case TMPL_TV_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

int tmpl_tv_equal(struct tmpl_tv a, struct tmpl_tv b) { return tmpl_tv_equal_d(a, b, 0); }

const char *tmpl_tv_type_name(struct tmpl_tv v)
{
    switch (v.t) {
    case TMPL_TV_UNDEF: return "Undefined";
    case TMPL_TV_NONE: return "NoneType";
    case TMPL_TV_BOOL: return "bool";
    case TMPL_TV_INT: return "int";
    case TMPL_TV_FLOAT: return "float";
    case TMPL_TV_STR: return "str";
    case TMPL_TV_LIST: {
        static const char *const kinds[] = {"list", "dict_items", "dict_keys", "dict_values", "range", "generator"};
        return v.u.l->kind == TMPL_TL_PLAIN ? (v.u.l->is_tuple ? "tuple" : "list") : kinds[v.u.l->kind];
    }
    case TMPL_TV_DICT: return "dict";
    case TMPL_TV_NS: return "Namespace";
    case TMPL_TV_MACRO: return "Macro";
    case TMPL_TV_BUILTIN: return "function";
    case TMPL_TV_METHOD: return "method";
    case TMPL_TV_LOOP: return "LoopContext";
    case TMPL_TV_CYCLER: return "method";
    }
    return "object";
}

int tmpl_tv_compare(struct tmpl_rstate *r, struct tmpl_tv a, struct tmpl_tv b)
{
    if (tmpl_tv_is_num(a) && tmpl_tv_is_num(b)) {
        int c = tmpl_tv_num_cmp(a, b);
        return c == 2 ? 3 : c; /* NaN: every ordering is false; caller treats 3 as "unordered" */
    }
    if (a.t == TMPL_TV_STR && b.t == TMPL_TV_STR) {
        size_t n = CAIRN_MIN(a.u.s.n, b.u.s.n);
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        if (c) return c < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == TMPL_TV_LIST && b.t == TMPL_TV_LIST && a.u.l->is_tuple == b.u.l->is_tuple && a.u.l->kind == TMPL_TL_PLAIN &&
        b.u.l->kind == TMPL_TL_PLAIN) {
        size_t n = CAIRN_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < n; i++) {
            if (tmpl_tv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            if (++r->depth > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply");
            int c = tmpl_tv_compare(r, a.u.l->items[i], b.u.l->items[i]);
            r->depth--;
            return c;
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    tmpl_fail(r, CAIRN_ERR_INVALID, "'<' not supported between instances of '%s' and '%s'",
              tmpl_tv_type_name(a), tmpl_tv_type_name(b));
}

/* ---- buffers ---- */


struct tmpl_tv tmpl_buf_to_str(struct tmpl_rstate *r, struct tmpl_buf *b)
{
    if (!b->n) return tmpl_tv_str("", 0);
    struct tmpl_tv s = tmpl_tv_str(b->p, b->n); /* arena buffers are never reused after this */
    s.taint = tmpl_buf_taint(r, b);
    return s;
}

/* ---- printing ---- */

/* Python float repr: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16. */
void tmpl_tv_float_repr(double f, char *out, size_t n)
{
    if (isnan(f)) {
        snprintf(out, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, n, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d.ddde[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *p = tmp;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out;
    size_t left = n;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (left > 1) {                                                                            \
            *o++ = (c);                                                                            \
            left--;                                                                                \
        }                                                                                          \
    } while (0)
    if (neg) PUT('-');
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) PUT(i < (int)nd ? digits[i] : '0');
            PUT('.');
            if ((int)nd > e + 1)
                for (size_t i = (size_t)e + 1; i < nd; i++) PUT(digits[i]);
            else
                PUT('0');
        } else {
            PUT('0');
            PUT('.');
            for (int i = 0; i < -e - 1; i++) PUT('0');
            for (size_t i = 0; i < nd; i++) PUT(digits[i]);
        }
        *o = 0;
    } else {
        PUT(digits[0]);
        if (nd > 1) {
            PUT('.');
            for (size_t i = 1; i < nd; i++) PUT(digits[i]);
        }
        *o = 0;
        snprintf(o, left, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
#undef PUT
}

static int tmpl_tv_py_printable(uint32_t cp)
{
    if (cp < 0x20 || cp == 0x7F) return 0;
    if (cp < 0x7F) return 1;
    if (cp == ' ') return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    switch (c) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

static void tmpl_tv_repr_str(struct tmpl_rstate *r, struct tmpl_buf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    tmpl_buf_putc(r, b, q);
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t cp = cairn_utf8_next(s, n, &i);
        char esc[16];
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            tmpl_buf_put(r, b, esc, 2);
        } else if (cp == '\t') {
            tmpl_buf_put(r, b, "\\t", 2);
        } else if (cp == '\n') {
            tmpl_buf_put(r, b, "\\n", 2);
        } else if (cp == '\r') {
            tmpl_buf_put(r, b, "\\r", 2);
        } else if (tmpl_tv_py_printable(cp)) {
            tmpl_buf_put(r, b, s + st, i - st);
        } else {
            if (cp < 0x100) snprintf(esc, sizeof(esc), "\\x%02x", cp);
            else if (cp < 0x10000) snprintf(esc, sizeof(esc), "\\u%04x", cp);
            else snprintf(esc, sizeof(esc), "\\U%08x", cp);
            tmpl_buf_puts(r, b, esc);
        }
    }
    tmpl_buf_putc(r, b, q);
}

static void tmpl_tv_print(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v, int repr)
{
    char num[64];
    tmpl_step(r);
    switch (v.t) {
    case TMPL_TV_UNDEF:
        if (repr) tmpl_buf_puts(r, b, "Undefined");
        return;
    case TMPL_TV_NONE: tmpl_buf_puts(r, b, "None"); return;
    case TMPL_TV_BOOL: tmpl_buf_puts(r, b, v.u.b ? "True" : "False"); return;
    case TMPL_TV_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v.u.i);
        tmpl_buf_puts(r, b, num);
        return;
    case TMPL_TV_FLOAT:
        tmpl_tv_float_repr(v.u.f, num, sizeof(num));
        tmpl_buf_puts(r, b, num);
        return;
    case TMPL_TV_STR:
        if (repr) tmpl_tv_repr_str(r, b, v.u.s.p, v.u.s.n);
        else tmpl_buf_put(r, b, v.u.s.p, v.u.s.n);
        return;
    case TMPL_TV_LIST: {
        if (v.u.l->kind == TMPL_TL_GEN) {
            tmpl_buf_puts(r, b, "<generator object>");
            return;
        }
        if (v.u.l->kind == TMPL_TL_RANGE) {
            tmpl_buf_puts(r, b, "range(");
            tmpl_tv_print(r, b, tmpl_tv_int(v.u.l->rng[0]), 1);
            tmpl_buf_puts(r, b, ", ");
            tmpl_tv_print(r, b, tmpl_tv_int(v.u.l->rng[1]), 1);
            if (v.u.l->rng[2] != 1) {
                tmpl_buf_puts(r, b, ", ");
                tmpl_tv_print(r, b, tmpl_tv_int(v.u.l->rng[2]), 1);
            }
            tmpl_buf_putc(r, b, ')');
            return;
        }
        if (v.u.l->kind != TMPL_TL_PLAIN) {
            tmpl_buf_puts(r, b, tmpl_tv_type_name(v));
            tmpl_buf_putc(r, b, '(');
        }
        if (++r->depth > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply");
        tmpl_buf_putc(r, b, v.u.l->is_tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tmpl_buf_put(r, b, ", ", 2);
            tmpl_tv_print(r, b, v.u.l->items[i], 1);
        }
        if (v.u.l->is_tuple && v.u.l->n == 1) tmpl_buf_putc(r, b, ',');
        tmpl_buf_putc(r, b, v.u.l->is_tuple ? ')' : ']');
        if (v.u.l->kind != TMPL_TL_PLAIN) tmpl_buf_putc(r, b, ')');
        r->depth--;
        return;
    }
    case TMPL_TV_NS:
        tmpl_buf_puts(r, b, "<Namespace ");
        /* fall through */
    case TMPL_TV_DICT: {
        if (++r->depth > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply");
        tmpl_buf_putc(r, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) tmpl_buf_put(r, b, ", ", 2);
            tmpl_tv_print(r, b, v.u.d->items[i].key, 1);
            tmpl_buf_put(r, b, ": ", 2);
            tmpl_tv_print(r, b, v.u.d->items[i].val, 1);
        }
        tmpl_buf_putc(r, b, '}');
        if (v.t == TMPL_TV_NS) tmpl_buf_putc(r, b, '>');
        r->depth--;
        return;
    }
    case TMPL_TV_MACRO: tmpl_buf_puts(r, b, "<Macro>"); return;
    case TMPL_TV_BUILTIN: tmpl_buf_puts(r, b, "<built-in function>"); return;
    case TMPL_TV_METHOD:
    case TMPL_TV_CYCLER: tmpl_buf_puts(r, b, "<built-in method>"); return;
    case TMPL_TV_LOOP: tmpl_buf_puts(r, b, "<LoopContext>"); return;
    }
}

void tmpl_tv_str_append(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v)
{
    if (v.t == TMPL_TV_STR) {
        tmpl_buf_put_str(r, b, v);
        return;
    }
    size_t off = b->n;
    tmpl_tv_print(r, b, v, 0);
    if (tmpl_tv_tainted(v)) tmpl_buf_mark(r, b, off, b->n - off); /* str() of a container of data */
}
void tmpl_tv_repr_append(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v) { tmpl_tv_print(r, b, v, 1); }

struct tmpl_tv tmpl_tv_to_str(struct tmpl_rstate *r, struct tmpl_tv v)
{
    if (v.t == TMPL_TV_STR) return v;
    if (v.t == TMPL_TV_UNDEF) return tmpl_tv_str("", 0);
    struct tmpl_buf b = {0};
    tmpl_tv_str_append(r, &b, v);
    return tmpl_buf_to_str(r, &b);
}

/* ---- JSON (json.dumps) ---- */

static void tmpl_tv_json_str(struct tmpl_rstate *r, struct tmpl_buf *b, const char *s, size_t n, int ensure_ascii)
{
    tmpl_buf_putc(r, b, '"');
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(tmp, sizeof(tmp), "\\u%04x", c);
            esc = tmp;
        } else if (c >= 0x80 && ensure_ascii) {
            size_t k = i;
            uint32_t cp = cairn_utf8_next(s, n, &k);
            tmpl_buf_put(r, b, s + run, i - run);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof(tmp), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(tmp, sizeof(tmp), "\\u%04x", cp);
            }
            tmpl_buf_puts(r, b, tmp);
            i = run = k;
            continue;
        }
        if (esc) {
            tmpl_buf_put(r, b, s + run, i - run);
            tmpl_buf_puts(r, b, esc);
            run = i + 1;
        }
        i++;
    }
    tmpl_buf_put(r, b, s + run, n - run);
    tmpl_buf_putc(r, b, '"');
}

static void tmpl_tv_json_newline(struct tmpl_rstate *r, struct tmpl_buf *b, int indent, int level)
{
    tmpl_buf_putc(r, b, '\n');
    for (int i = 0; i < indent * level; i++) tmpl_buf_putc(r, b, ' ');
}

static int tmpl_tv_json_key_cmp(const void *x, const void *y)
{
    const struct tmpl_tv_kv *a = *(const struct tmpl_tv_kv *const *)x, *b = *(const struct tmpl_tv_kv *const *)y;
    size_t n = CAIRN_MIN(a->key.u.s.n, b->key.u.s.n);
    int c = memcmp(a->key.u.s.p, b->key.u.s.p, n);
    if (c) return c;
    return a->key.u.s.n < b->key.u.s.n ? -1 : a->key.u.s.n > b->key.u.s.n;
}

void tmpl_tv_tojson_append(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v, int ensure_ascii, int indent,
                      const char *item_sep, const char *key_sep, int sort_keys, int level)
{
    char num[64];
    tmpl_step(r);
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    switch (v.t) {
    case TMPL_TV_NONE: tmpl_buf_puts(r, b, "null"); return;
    case TMPL_TV_BOOL: tmpl_buf_puts(r, b, v.u.b ? "true" : "false"); return;
    case TMPL_TV_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v.u.i);
        tmpl_buf_puts(r, b, num);
        return;
    case TMPL_TV_FLOAT:
        if (isnan(v.u.f)) tmpl_buf_puts(r, b, "NaN");
        else if (isinf(v.u.f)) tmpl_buf_puts(r, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            tmpl_tv_float_repr(v.u.f, num, sizeof(num));
            tmpl_buf_puts(r, b, num);
        }
        return;
    case TMPL_TV_STR: tmpl_tv_json_str(r, b, v.u.s.p, v.u.s.n, ensure_ascii); return;
    case TMPL_TV_LIST: {
        if (v.u.l->kind != TMPL_TL_PLAIN) break; /* generators, views, range: not JSON serializable */
        if (level > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply for tojson");
        if (v.u.l->n == 0) {
            tmpl_buf_puts(r, b, "[]");
            return;
        }
        tmpl_buf_putc(r, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tmpl_buf_puts(r, b, item_sep);
            if (indent >= 0) tmpl_tv_json_newline(r, b, indent, level + 1);
            tmpl_tv_tojson_append(r, b, v.u.l->items[i], ensure_ascii, indent, item_sep, key_sep,
                             sort_keys, level + 1);
        }
        if (indent >= 0) tmpl_tv_json_newline(r, b, indent, level);
        tmpl_buf_putc(r, b, ']');
        return;
    }
    case TMPL_TV_DICT:
    case TMPL_TV_NS: {
        if (v.t == TMPL_TV_NS) break;
        if (level > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply for tojson");
        struct tmpl_tv_dict *d = v.u.d;
        if (d->n == 0) {
            tmpl_buf_puts(r, b, "{}");
            return;
        }
        /* keys must be str (or become str, as json.dumps does for numbers/bools/None) */
        struct tmpl_tv_kv **order = tmpl_alloc(r, d->n * sizeof(*order));
        struct tmpl_tv_kv *conv = tmpl_alloc(r, d->n * sizeof(*conv));
        for (size_t i = 0; i < d->n; i++) {
            conv[i] = d->items[i];
            struct tmpl_tv k = d->items[i].key;
            if (k.t == TMPL_TV_STR) {
            } else if (k.t == TMPL_TV_INT || k.t == TMPL_TV_FLOAT) {
                struct tmpl_buf kb = {0};
                if (k.t == TMPL_TV_FLOAT) tmpl_tv_tojson_append(r, &kb, k, 0, -1, NULL, NULL, 0, 0);
                else tmpl_tv_str_append(r, &kb, k);
                conv[i].key = tmpl_buf_to_str(r, &kb);
            } else if (k.t == TMPL_TV_BOOL) {
                conv[i].key = tmpl_tv_cstr(k.u.b ? "true" : "false");
            } else if (k.t == TMPL_TV_NONE) {
                conv[i].key = tmpl_tv_cstr("null");
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "keys must be str, int, float, bool or None, not %s",
                          tmpl_tv_type_name(k));
            }
            order[i] = &conv[i];
        }
        if (sort_keys) qsort(order, d->n, sizeof(*order), tmpl_tv_json_key_cmp);
        tmpl_buf_putc(r, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) tmpl_buf_puts(r, b, item_sep);
            if (indent >= 0) tmpl_tv_json_newline(r, b, indent, level + 1);
            tmpl_tv_json_str(r, b, order[i]->key.u.s.p, order[i]->key.u.s.n, ensure_ascii);
            tmpl_buf_puts(r, b, key_sep);
            tmpl_tv_tojson_append(r, b, order[i]->val, ensure_ascii, indent, item_sep, key_sep,
                             sort_keys, level + 1);
        }
        if (indent >= 0) tmpl_tv_json_newline(r, b, indent, level);
        tmpl_buf_putc(r, b, '}');
        return;
    }
    default:
        break;
    }
    tmpl_fail(r, CAIRN_ERR_INVALID, "Object of type %s is not JSON serializable", tmpl_tv_type_name(v));
}

struct tmpl_tv_list *tmpl_tv_iter_list(struct tmpl_rstate *r, struct tmpl_tv v)
{
    switch (v.t) {
    case TMPL_TV_LIST: {
        struct tmpl_tv_list *l = v.u.l;
        if (l->kind != TMPL_TL_GEN) return l;
        /* a generator: hand out what is left and mark it consumed */
        struct tmpl_tv_list *rest = tmpl_alloc(r, sizeof(*rest));
        rest->n = l->n - l->pos;
        rest->items = l->items ? l->items + l->pos : NULL;
        l->pos = l->n;
        return rest;
    }
    case TMPL_TV_UNDEF: return tmpl_tv_list_new(r, 0);
    case TMPL_TV_DICT:
    case TMPL_TV_NS: {
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, v.u.d->n);
        for (size_t i = 0; i < l->n; i++) l->items[i] = v.u.d->items[i].key;
        return l;
    }
    case TMPL_TV_STR: {
        size_t n = cairn_utf8_count(v.u.s.p, v.u.s.n);
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, n);
        size_t i = 0;
        for (size_t k = 0; k < n; k++) {
            size_t st = i;
            cairn_utf8_next(v.u.s.p, v.u.s.n, &i);
            l->items[k] = tmpl_tv_str(v.u.s.p + st, i - st);
            if (v.taint) l->items[k].taint = TMPL_TAINT_ALL;
        }
        return l;
    }
    default:
        tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not iterable", tmpl_tv_type_name(v));
    }
}

struct tmpl_tv tmpl_loop_attr(struct tmpl_rstate *r, struct tmpl_tv_loop *l, const char *name)
{
    int64_t n = (int64_t)l->items->n, i = (int64_t)l->index0;
    if (!strcmp(name, "index")) return tmpl_tv_int(i + 1);
    if (!strcmp(name, "index0")) return tmpl_tv_int(i);
    if (!strcmp(name, "revindex")) return tmpl_tv_int(n - i);
    if (!strcmp(name, "revindex0")) return tmpl_tv_int(n - i - 1);
    if (!strcmp(name, "first")) return tmpl_tv_bool(i == 0);
    if (!strcmp(name, "last")) return tmpl_tv_bool(i == n - 1);
    if (!strcmp(name, "length")) return tmpl_tv_int(n);
    if (!strcmp(name, "depth")) return tmpl_tv_int(1);
    if (!strcmp(name, "depth0")) return tmpl_tv_int(0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? l->items->items[i - 1] : tmpl_tv_undef("there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->items->items[i + 1] : tmpl_tv_undef("there is no next item");
    if (!strcmp(name, "cycle")) return (struct tmpl_tv){.t = TMPL_TV_CYCLER, .u.loop = l};
    return tmpl_tv_undef(tmpl_printf(r, "'LoopContext object' has no attribute '%s'", name));
}

