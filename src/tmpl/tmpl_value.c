/* tmpl values: constructors, dicts, JSON in and out (json.dumps as transformers' tojson), and
 * Python semantics for truthiness, equality, ordering, str() and repr(). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tmpl/tmpl_int.h"

struct tv tv_none(void) { return (struct tv){.t = TV_NONE}; }
struct tv tv_bool(int b) { return (struct tv){.t = TV_BOOL, .u.b = !!b}; }
struct tv tv_int(int64_t i) { return (struct tv){.t = TV_INT, .u.i = i}; }
struct tv tv_float(double f) { return (struct tv){.t = TV_FLOAT, .u.f = f}; }

struct tv tv_str(const char *p, size_t n)
{
    struct tv v = {.t = TV_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

struct tv tv_cstr(const char *p) { return tv_str(p, strlen(p)); }

struct tv tv_undef(const char *hint)
{
    struct tv v = {.t = TV_UNDEF};
    v.u.s.p = hint;
    v.u.s.n = hint ? strlen(hint) : 0;
    return v;
}

void *tr_alloc(struct trender *r, size_t n)
{
    void *p = tarena_alloc(&r->arena, n);
    if (!p)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template used too much memory (limit %zu bytes)",
                  r->lim.max_memory_bytes);
    return p;
}

struct tv tv_str_copy(struct trender *r, const char *p, size_t n)
{
    char *c = tr_alloc(r, n + 1);
    memcpy(c, p, n);
    return tv_str(c, n);
}

struct tv_list *tv_list_new(struct trender *r, size_t n)
{
    if (n > SIZE_MAX / sizeof(struct tv) / 2)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "list too large");
    struct tv_list *l = tr_alloc(r, sizeof(*l));
    l->n = n;
    l->items = n ? tr_alloc(r, n * sizeof(struct tv)) : NULL;
    return l;
}

struct tv_dict *tv_dict_new(struct trender *r, size_t cap)
{
    struct tv_dict *d = tr_alloc(r, sizeof(*d));
    if (cap) {
        if (cap > SIZE_MAX / sizeof(struct tv_kv) / 2) tmpl_fail(r, CAIRN_ERR_LIMIT, "dict too large");
        d->items = tr_alloc(r, cap * sizeof(struct tv_kv));
        d->cap = cap;
    }
    return d;
}

static uint64_t tv_hash(struct tv k)
{
    switch (k.t) {
    case TV_STR: {
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < k.u.s.n; i++) h = (h ^ (unsigned char)k.u.s.p[i]) * 1099511628211ull;
        return h;
    }
    case TV_BOOL: return (uint64_t)k.u.b * 0x9E3779B97F4A7C15ull;
    case TV_INT: return (uint64_t)k.u.i * 0x9E3779B97F4A7C15ull;
    case TV_FLOAT:
        if (k.u.f == floor(k.u.f) && fabs(k.u.f) < 9e18) return (uint64_t)(int64_t)k.u.f * 0x9E3779B97F4A7C15ull;
        return 7;
    default: return 0;
    }
}

static void tv_dict_reindex(struct trender *r, struct tv_dict *d)
{
    size_t cap = 16;
    while (cap < d->n * 2 + 2) cap *= 2;
    d->index = tr_alloc(r, cap * sizeof(uint32_t));
    d->index_cap = cap;
    for (size_t i = 0; i < d->n; i++) {
        size_t s = tv_hash(d->items[i].key) & (cap - 1);
        while (d->index[s]) s = (s + 1) & (cap - 1);
        d->index[s] = (uint32_t)(i + 1);
    }
}

static long tv_dict_find(const struct tv_dict *d, struct tv key)
{
    if (d->index) {
        size_t s = tv_hash(key) & (d->index_cap - 1);
        while (d->index[s]) {
            size_t i = d->index[s] - 1;
            if (tv_equal(d->items[i].key, key)) return (long)i;
            s = (s + 1) & (d->index_cap - 1);
        }
        return -1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(d->items[i].key, key)) return (long)i;
    return -1;
}

void tv_dict_set(struct trender *r, struct tv_dict *d, struct tv key, struct tv val)
{
    long i = tv_dict_find(d, key);
    if (i >= 0) {
        d->items[i].val = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct tv_kv *items = tr_alloc(r, cap * sizeof(*items));
        if (d->n) memcpy(items, d->items, d->n * sizeof(*items));
        d->items = items;
        d->cap = cap;
    }
    if (d->n >= UINT32_MAX - 1) tmpl_fail(r, CAIRN_ERR_LIMIT, "dict too large");
    d->items[d->n].key = key;
    d->items[d->n].val = val;
    d->n++;
    if (d->index && d->n * 2 + 2 <= d->index_cap) {
        size_t s = tv_hash(key) & (d->index_cap - 1);
        while (d->index[s]) s = (s + 1) & (d->index_cap - 1);
        d->index[s] = (uint32_t)d->n;
    } else if (d->n > 8) {
        tv_dict_reindex(r, d);
    }
}

int tv_dict_get(const struct tv_dict *d, struct tv key, struct tv *out)
{
    long i = tv_dict_find(d, key);
    if (i < 0) return 0;
    *out = d->items[i].val;
    return 1;
}

int tv_dict_get_str(const struct tv_dict *d, const char *key, struct tv *out)
{
    return tv_dict_get(d, tv_cstr(key), out);
}

struct tv tv_from_json(struct trender *r, json_t *j)
{
    tmpl_step(r);
    if (++r->depth > 4096) tmpl_fail(r, CAIRN_ERR_LIMIT, "context JSON nested too deeply");
    struct tv v;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct tv_dict *d = tv_dict_new(r, json_object_size(j));
        const char *k;
        json_t *jv;
        json_object_foreach(j, k, jv) {
            tv_dict_set(r, d, tv_cstr(k), tv_from_json(r, jv));
        }
        v = (struct tv){.t = TV_DICT, .u.d = d};
        break;
    }
    case JSON_ARRAY: {
        struct tv_list *l = tv_list_new(r, json_array_size(j));
        for (size_t i = 0; i < l->n; i++) l->items[i] = tv_from_json(r, json_array_get(j, i));
        v = (struct tv){.t = TV_LIST, .u.l = l};
        break;
    }
    case JSON_STRING: v = tv_str(json_string_value(j), json_string_length(j)); break;
    case JSON_INTEGER: v = tv_int(json_integer_value(j)); break;
    case JSON_REAL: v = tv_float(json_real_value(j)); break;
    case JSON_TRUE: v = tv_bool(1); break;
    case JSON_FALSE: v = tv_bool(0); break;
    default: v = tv_none(); break;
    }
    r->depth--;
    return v;
}

int tv_truthy(struct tv v)
{
    switch (v.t) {
    case TV_UNDEF:
    case TV_NONE: return 0;
    case TV_BOOL: return v.u.b;
    case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0;
    case TV_STR: return v.u.s.n != 0;
    case TV_LIST: return v.u.l->kind == TL_GEN ? 1 : v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int tv_is_num(struct tv v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }

static double tv_num(struct tv v)
{
    return v.t == TV_FLOAT ? v.u.f : v.t == TV_INT ? (double)v.u.i : (double)v.u.b;
}

static int tv_num_cmp(struct tv a, struct tv b)
{
    if (a.t != TV_FLOAT && b.t != TV_FLOAT) {
        int64_t x = a.t == TV_INT ? a.u.i : a.u.b, y = b.t == TV_INT ? b.u.i : b.u.b;
        return x < y ? -1 : x > y;
    }
    double x = tv_num(a), y = tv_num(b);
    if (x != x || y != y) return 2; /* unordered */
    return x < y ? -1 : x > y;
}

/* Recursion is bounded: structures nested deeper than 256 levels compare unequal. */
static int tv_equal_d(struct tv a, struct tv b, int depth)
{
    if (depth > 256) return 0;
    if (tv_is_num(a) && tv_is_num(b)) return tv_num_cmp(a, b) == 0;
    if (a.t != b.t) return 0;
    switch (a.t) {
    case TV_UNDEF:
    case TV_NONE: return 1;
    case TV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case TV_LIST:
        if (a.u.l->kind != b.u.l->kind) return 0;
        if (a.u.l->kind == TL_GEN) return a.u.l == b.u.l;
        if (a.u.l->is_tuple != b.u.l->is_tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tv_equal_d(a.u.l->items[i], b.u.l->items[i], depth + 1)) return 0;
        return 1;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct tv v;
            if (!tv_dict_get(b.u.d, a.u.d->items[i].key, &v) || !tv_equal_d(v, a.u.d->items[i].val, depth + 1)) return 0;
        }
        return 1;
    case TV_NS: return a.u.d == b.u.d;
    case TV_MACRO: return a.u.m == b.u.m;
    case TV_BUILTIN: return a.u.builtin == b.u.builtin;
    case TV_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

int tv_equal(struct tv a, struct tv b) { return tv_equal_d(a, b, 0); }

const char *tv_type_name(struct tv v)
{
    switch (v.t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: {
        static const char *const kinds[] = {"list", "dict_items", "dict_keys", "dict_values", "range", "generator"};
        return v.u.l->kind == TL_PLAIN ? (v.u.l->is_tuple ? "tuple" : "list") : kinds[v.u.l->kind];
    }
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_MACRO: return "Macro";
    case TV_BUILTIN: return "function";
    case TV_METHOD: return "method";
    case TV_LOOP: return "LoopContext";
    case TV_CYCLER: return "method";
    }
    return "object";
}

int tv_compare(struct trender *r, struct tv a, struct tv b)
{
    if (tv_is_num(a) && tv_is_num(b)) {
        int c = tv_num_cmp(a, b);
        return c == 2 ? 3 : c; /* NaN: every ordering is false; caller treats 3 as "unordered" */
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t n = CAIRN_MIN(a.u.s.n, b.u.s.n);
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        if (c) return c < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == TV_LIST && b.t == TV_LIST && a.u.l->is_tuple == b.u.l->is_tuple && a.u.l->kind == TL_PLAIN &&
        b.u.l->kind == TL_PLAIN) {
        size_t n = CAIRN_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < n; i++) {
            if (tv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            if (++r->depth > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply");
            int c = tv_compare(r, a.u.l->items[i], b.u.l->items[i]);
            r->depth--;
            return c;
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    tmpl_fail(r, CAIRN_ERR_INVALID, "'<' not supported between instances of '%s' and '%s'",
              tv_type_name(a), tv_type_name(b));
}

/* ---- buffers ---- */

void tbuf_put(struct trender *r, struct tbuf *b, const char *p, size_t n)
{
    if (n == 0) return;
    if (n >= 1024) tmpl_step_bytes(r, n);
    if (b->n + n > r->lim.max_output_bytes || b->n + n < b->n)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template output too large (limit %zu bytes)",
                  r->lim.max_output_bytes);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *np;
        if (b == &r->main_out) {
            np = realloc(b->p, cap);
            if (!np) tmpl_fail(r, CAIRN_ERR_NOMEM, "out of memory");
        } else {
            np = tr_alloc(r, cap);
            if (b->n) memcpy(np, b->p, b->n);
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tbuf_putc(struct trender *r, struct tbuf *b, char c) { tbuf_put(r, b, &c, 1); }
void tbuf_puts(struct trender *r, struct tbuf *b, const char *s) { tbuf_put(r, b, s, strlen(s)); }

struct tv tbuf_to_str(struct trender *r, struct tbuf *b)
{
    if (!b->n) return tv_str("", 0);
    return tv_str(b->p, b->n); /* arena buffers are never reused after this */
}

/* ---- printing ---- */

/* Python float repr: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16. */
void tv_float_repr(double f, char *out, size_t n)
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

static int tv_py_printable(uint32_t cp)
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

static void tv_repr_str(struct trender *r, struct tbuf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    tbuf_putc(r, b, q);
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t cp = tutf8_next(s, n, &i);
        char esc[16];
        if (cp == (uint32_t)q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            tbuf_put(r, b, esc, 2);
        } else if (cp == '\t') {
            tbuf_put(r, b, "\\t", 2);
        } else if (cp == '\n') {
            tbuf_put(r, b, "\\n", 2);
        } else if (cp == '\r') {
            tbuf_put(r, b, "\\r", 2);
        } else if (tv_py_printable(cp)) {
            tbuf_put(r, b, s + st, i - st);
        } else {
            if (cp < 0x100) snprintf(esc, sizeof(esc), "\\x%02x", cp);
            else if (cp < 0x10000) snprintf(esc, sizeof(esc), "\\u%04x", cp);
            else snprintf(esc, sizeof(esc), "\\U%08x", cp);
            tbuf_puts(r, b, esc);
        }
    }
    tbuf_putc(r, b, q);
}

static void tv_print(struct trender *r, struct tbuf *b, struct tv v, int repr)
{
    char num[64];
    tmpl_step(r);
    switch (v.t) {
    case TV_UNDEF:
        if (repr) tbuf_puts(r, b, "Undefined");
        return;
    case TV_NONE: tbuf_puts(r, b, "None"); return;
    case TV_BOOL: tbuf_puts(r, b, v.u.b ? "True" : "False"); return;
    case TV_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v.u.i);
        tbuf_puts(r, b, num);
        return;
    case TV_FLOAT:
        tv_float_repr(v.u.f, num, sizeof(num));
        tbuf_puts(r, b, num);
        return;
    case TV_STR:
        if (repr) tv_repr_str(r, b, v.u.s.p, v.u.s.n);
        else tbuf_put(r, b, v.u.s.p, v.u.s.n);
        return;
    case TV_LIST: {
        if (v.u.l->kind == TL_GEN) {
            tbuf_puts(r, b, "<generator object>");
            return;
        }
        if (v.u.l->kind == TL_RANGE) {
            tbuf_puts(r, b, "range(");
            tv_print(r, b, tv_int(v.u.l->rng[0]), 1);
            tbuf_puts(r, b, ", ");
            tv_print(r, b, tv_int(v.u.l->rng[1]), 1);
            if (v.u.l->rng[2] != 1) {
                tbuf_puts(r, b, ", ");
                tv_print(r, b, tv_int(v.u.l->rng[2]), 1);
            }
            tbuf_putc(r, b, ')');
            return;
        }
        if (v.u.l->kind != TL_PLAIN) {
            tbuf_puts(r, b, tv_type_name(v));
            tbuf_putc(r, b, '(');
        }
        if (++r->depth > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply");
        tbuf_putc(r, b, v.u.l->is_tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tbuf_put(r, b, ", ", 2);
            tv_print(r, b, v.u.l->items[i], 1);
        }
        if (v.u.l->is_tuple && v.u.l->n == 1) tbuf_putc(r, b, ',');
        tbuf_putc(r, b, v.u.l->is_tuple ? ')' : ']');
        if (v.u.l->kind != TL_PLAIN) tbuf_putc(r, b, ')');
        r->depth--;
        return;
    }
    case TV_NS:
        tbuf_puts(r, b, "<Namespace ");
        /* fall through */
    case TV_DICT: {
        if (++r->depth > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply");
        tbuf_putc(r, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) tbuf_put(r, b, ", ", 2);
            tv_print(r, b, v.u.d->items[i].key, 1);
            tbuf_put(r, b, ": ", 2);
            tv_print(r, b, v.u.d->items[i].val, 1);
        }
        tbuf_putc(r, b, '}');
        if (v.t == TV_NS) tbuf_putc(r, b, '>');
        r->depth--;
        return;
    }
    case TV_MACRO: tbuf_puts(r, b, "<Macro>"); return;
    case TV_BUILTIN: tbuf_puts(r, b, "<built-in function>"); return;
    case TV_METHOD:
    case TV_CYCLER: tbuf_puts(r, b, "<built-in method>"); return;
    case TV_LOOP: tbuf_puts(r, b, "<LoopContext>"); return;
    }
}

void tv_str_append(struct trender *r, struct tbuf *b, struct tv v) { tv_print(r, b, v, 0); }
void tv_repr_append(struct trender *r, struct tbuf *b, struct tv v) { tv_print(r, b, v, 1); }

struct tv tv_to_str(struct trender *r, struct tv v)
{
    if (v.t == TV_STR) return v;
    if (v.t == TV_UNDEF) return tv_str("", 0);
    struct tbuf b = {0};
    tv_str_append(r, &b, v);
    return tbuf_to_str(r, &b);
}

/* ---- JSON (json.dumps) ---- */

static void tv_json_str(struct trender *r, struct tbuf *b, const char *s, size_t n, int ensure_ascii)
{
    tbuf_putc(r, b, '"');
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
            uint32_t cp = tutf8_next(s, n, &k);
            tbuf_put(r, b, s + run, i - run);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof(tmp), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(tmp, sizeof(tmp), "\\u%04x", cp);
            }
            tbuf_puts(r, b, tmp);
            i = run = k;
            continue;
        }
        if (esc) {
            tbuf_put(r, b, s + run, i - run);
            tbuf_puts(r, b, esc);
            run = i + 1;
        }
        i++;
    }
    tbuf_put(r, b, s + run, n - run);
    tbuf_putc(r, b, '"');
}

static void tv_json_newline(struct trender *r, struct tbuf *b, int indent, int level)
{
    tbuf_putc(r, b, '\n');
    for (int i = 0; i < indent * level; i++) tbuf_putc(r, b, ' ');
}

static int tv_json_key_cmp(const void *x, const void *y)
{
    const struct tv_kv *a = *(const struct tv_kv *const *)x, *b = *(const struct tv_kv *const *)y;
    size_t n = CAIRN_MIN(a->key.u.s.n, b->key.u.s.n);
    int c = memcmp(a->key.u.s.p, b->key.u.s.p, n);
    if (c) return c;
    return a->key.u.s.n < b->key.u.s.n ? -1 : a->key.u.s.n > b->key.u.s.n;
}

void tv_tojson_append(struct trender *r, struct tbuf *b, struct tv v, int ensure_ascii, int indent,
                      const char *item_sep, const char *key_sep, int sort_keys, int level)
{
    char num[64];
    tmpl_step(r);
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    switch (v.t) {
    case TV_NONE: tbuf_puts(r, b, "null"); return;
    case TV_BOOL: tbuf_puts(r, b, v.u.b ? "true" : "false"); return;
    case TV_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v.u.i);
        tbuf_puts(r, b, num);
        return;
    case TV_FLOAT:
        if (isnan(v.u.f)) tbuf_puts(r, b, "NaN");
        else if (isinf(v.u.f)) tbuf_puts(r, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            tv_float_repr(v.u.f, num, sizeof(num));
            tbuf_puts(r, b, num);
        }
        return;
    case TV_STR: tv_json_str(r, b, v.u.s.p, v.u.s.n, ensure_ascii); return;
    case TV_LIST: {
        if (v.u.l->kind != TL_PLAIN) break; /* generators, views, range: not JSON serializable */
        if (level > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply for tojson");
        if (v.u.l->n == 0) {
            tbuf_puts(r, b, "[]");
            return;
        }
        tbuf_putc(r, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) tbuf_puts(r, b, item_sep);
            if (indent >= 0) tv_json_newline(r, b, indent, level + 1);
            tv_tojson_append(r, b, v.u.l->items[i], ensure_ascii, indent, item_sep, key_sep,
                             sort_keys, level + 1);
        }
        if (indent >= 0) tv_json_newline(r, b, indent, level);
        tbuf_putc(r, b, ']');
        return;
    }
    case TV_DICT:
    case TV_NS: {
        if (v.t == TV_NS) break;
        if (level > 512) tmpl_fail(r, CAIRN_ERR_LIMIT, "value nested too deeply for tojson");
        struct tv_dict *d = v.u.d;
        if (d->n == 0) {
            tbuf_puts(r, b, "{}");
            return;
        }
        /* keys must be str (or become str, as json.dumps does for numbers/bools/None) */
        struct tv_kv **order = tr_alloc(r, d->n * sizeof(*order));
        struct tv_kv *conv = tr_alloc(r, d->n * sizeof(*conv));
        for (size_t i = 0; i < d->n; i++) {
            conv[i] = d->items[i];
            struct tv k = d->items[i].key;
            if (k.t == TV_STR) {
            } else if (k.t == TV_INT || k.t == TV_FLOAT) {
                struct tbuf kb = {0};
                if (k.t == TV_FLOAT) tv_tojson_append(r, &kb, k, 0, -1, NULL, NULL, 0, 0);
                else tv_str_append(r, &kb, k);
                conv[i].key = tbuf_to_str(r, &kb);
            } else if (k.t == TV_BOOL) {
                conv[i].key = tv_cstr(k.u.b ? "true" : "false");
            } else if (k.t == TV_NONE) {
                conv[i].key = tv_cstr("null");
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "keys must be str, int, float, bool or None, not %s",
                          tv_type_name(k));
            }
            order[i] = &conv[i];
        }
        if (sort_keys) qsort(order, d->n, sizeof(*order), tv_json_key_cmp);
        tbuf_putc(r, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) tbuf_puts(r, b, item_sep);
            if (indent >= 0) tv_json_newline(r, b, indent, level + 1);
            tv_json_str(r, b, order[i]->key.u.s.p, order[i]->key.u.s.n, ensure_ascii);
            tbuf_puts(r, b, key_sep);
            tv_tojson_append(r, b, order[i]->val, ensure_ascii, indent, item_sep, key_sep,
                             sort_keys, level + 1);
        }
        if (indent >= 0) tv_json_newline(r, b, indent, level);
        tbuf_putc(r, b, '}');
        return;
    }
    default:
        break;
    }
    tmpl_fail(r, CAIRN_ERR_INVALID, "Object of type %s is not JSON serializable", tv_type_name(v));
}

struct tv_list *tv_iter_list(struct trender *r, struct tv v)
{
    switch (v.t) {
    case TV_LIST: {
        struct tv_list *l = v.u.l;
        if (l->kind != TL_GEN) return l;
        /* a generator: hand out what is left and mark it consumed */
        struct tv_list *rest = tr_alloc(r, sizeof(*rest));
        rest->n = l->n - l->pos;
        rest->items = l->items ? l->items + l->pos : NULL;
        l->pos = l->n;
        return rest;
    }
    case TV_UNDEF: return tv_list_new(r, 0);
    case TV_DICT:
    case TV_NS: {
        struct tv_list *l = tv_list_new(r, v.u.d->n);
        for (size_t i = 0; i < l->n; i++) l->items[i] = v.u.d->items[i].key;
        return l;
    }
    case TV_STR: {
        size_t n = tutf8_len(v.u.s.p, v.u.s.n);
        struct tv_list *l = tv_list_new(r, n);
        size_t i = 0;
        for (size_t k = 0; k < n; k++) {
            size_t st = i;
            tutf8_next(v.u.s.p, v.u.s.n, &i);
            l->items[k] = tv_str(v.u.s.p + st, i - st);
        }
        return l;
    }
    default:
        tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not iterable", tv_type_name(v));
    }
}
