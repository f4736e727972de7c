/* JSON Schema -> grammar (the subset and output form in grammar.h).
 *
 * Every schema node becomes a rule, memoized by node pointer, so $ref (recursion included) and
 * repeated sub-schemas are calls. Objects: properties in declared order; with optional ones,
 * rules S_i ("nothing written yet, properties i.. left") and R_i ("something written") keep the
 * commas right in O(n) states. Numbers with bounds: integer parts from a decimal range
 * automaton; fractions only where the whole interval [I, I+1) stays inside the bounds (a subset
 * of the allowed numbers, never a value outside them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

#define GS_MAX_ITEMS 4096   /* minItems / maxItems / minLength / maxLength unrolled up to this */
#define GS_MAX_DIGITS 16    /* digits of an integer part or a fraction, 3 of an exponent: past a
                             * double's precision anyway, and a model can't write digits forever */

struct gs_memo {
    const json_t *node;
    int32_t rule;
};

struct gs {
    struct gram_builder *b;
    const json_t *root;
    struct gs_memo *memo;
    int n_memo, cap_memo;
    int32_t r_char, r_any;  /* shared rules, -1 until needed */
    char path[256];         /* where we are, for errors */
    int depth;
};

static int gs_fail(struct gs *s, int status, const char *fmt, const char *arg)
{
    char msg[300];
    snprintf(msg, sizeof(msg), fmt, arg);
    return gram_b_fail(s->b, status, "%s at %s", msg, s->path[0] ? s->path : "/");
}

static int32_t gs_rule(struct gs *s, const json_t *node, const char *seg);

/* ---- small fragments ---- */

static struct gram_frag gs_lit(struct gs *s, const char *t) { return gram_f_bytes(s->b, t, strlen(t)); }

static struct gram_frag gs_ws(struct gs *s) { return gram_f_opt(s->b, gram_f_range(s->b, ' ', ' ')); }

/* x repeated lo..hi times (hi < 0: unbounded); emit() makes a fresh copy each time. */
static struct gram_frag gs_rep(struct gs *s, struct gram_frag (*emit)(struct gs *, void *), void *ctx, long lo, long hi)
{
    struct gram_builder *b = s->b;
    struct gram_frag res = gram_f_empty(b);
    for (long k = 0; k < lo && !b->failed; k++) res = gram_f_seq(b, res, emit(s, ctx));
    if (hi < 0) return gram_f_seq(b, res, gram_f_star(b, emit(s, ctx)));
    if (hi > lo) {
        int32_t end = gram_b_state(b), cur = res.e;
        for (long k = lo; k < hi && !b->failed; k++) {
            struct gram_frag c = emit(s, ctx);
            gram_b_eps(b, cur, end);
            gram_b_eps(b, cur, c.s);
            cur = c.e;
        }
        gram_b_eps(b, cur, end);
        res.e = end;
    }
    return res;
}

/* A JSON value as its compact text (enum / const). */
static struct gram_frag gs_json_lit(struct gs *s, const json_t *v)
{
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t) {
        gram_b_fail(s->b, CAIRN_ERR_NOMEM, "json schema: out of memory");
        return gram_f_empty(s->b);
    }
    struct gram_frag f = gs_lit(s, t);
    free(t);
    return f;
}

static int32_t gs_char_rule(struct gs *s)
{
    if (s->r_char >= 0) return s->r_char;
    struct gram_builder *b = s->b;
    int32_t r = gram_b_rule(b);
    s->r_char = r;
    uint32_t lo[3] = {0x20, 0x23, 0x5D}, hi[3] = {0x21, 0x5B, 0x10FFFF};
    struct gram_frag plain = gram_f_cps(b, lo, hi, 3);
    struct gram_frag esc = gram_f_range(b, '\\', '\\');
    int32_t e2 = gram_b_state(b);
    const char *simple = "\"\\/bfnrt";
    for (const char *p = simple; *p; p++) gram_b_byte(b, esc.e, e2, (uint8_t)*p, (uint8_t)*p);
    int32_t u = gram_b_state(b);
    gram_b_byte(b, esc.e, u, 'u', 'u');
    for (int k = 0; k < 4; k++) {
        int32_t nx = k == 3 ? e2 : gram_b_state(b);
        gram_b_byte(b, u, nx, '0', '9');
        gram_b_byte(b, u, nx, 'a', 'f');
        gram_b_byte(b, u, nx, 'A', 'F');
        u = nx;
    }
    esc.e = e2;
    gram_b_rule_body(b, r, gram_f_alt(b, plain, esc));
    return r;
}

static struct gram_frag gs_emit_char(struct gs *s, void *ctx)
{
    (void)ctx;
    return gram_f_call(s->b, gs_char_rule(s));
}

static struct gram_frag gs_string_plain(struct gs *s, long min_len, long max_len)
{
    struct gram_builder *b = s->b;
    struct gram_frag f = gs_lit(s, "\"");
    f = gram_f_seq(b, f, gs_rep(s, gs_emit_char, NULL, min_len, max_len));
    return gram_f_seq(b, f, gs_lit(s, "\""));
}

/* ---- numbers ---- */

/* Decimal strings (no leading zeros) of the values in [x, y], both with L digits. */
static struct gram_frag gs_digits_same(struct gs *s, const char *x, const char *y, int L)
{
    struct gram_builder *b = s->b;
    if (L == 1) return gram_f_range(b, (uint8_t)x[0], (uint8_t)y[0]);
    int rest_min = 1, rest_max = 1;
    for (int i = 1; i < L; i++) {
        rest_min &= x[i] == '0';
        rest_max &= y[i] == '9';
    }
    struct gram_frag f;
    if (rest_min && rest_max) {
        f = gram_f_range(b, (uint8_t)x[0], (uint8_t)y[0]);
        for (int i = 1; i < L; i++) f = gram_f_seq(b, f, gram_f_range(b, '0', '9'));
        return f;
    }
    if (x[0] == y[0]) return gram_f_seq(b, gram_f_range(b, (uint8_t)x[0], (uint8_t)x[0]), gs_digits_same(s, x + 1, y + 1, L - 1));
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)L - 1);
    memset(zeros, '0', (size_t)L - 1);
    f = gram_f_seq(b, gram_f_range(b, (uint8_t)x[0], (uint8_t)x[0]), gs_digits_same(s, x + 1, nines, L - 1));
    if (x[0] + 1 <= y[0] - 1) {
        struct gram_frag m = gram_f_range(b, (uint8_t)(x[0] + 1), (uint8_t)(y[0] - 1));
        for (int i = 1; i < L; i++) m = gram_f_seq(b, m, gram_f_range(b, '0', '9'));
        f = gram_f_alt(b, f, m);
    }
    return gram_f_alt(b, f, gram_f_seq(b, gram_f_range(b, (uint8_t)y[0], (uint8_t)y[0]), gs_digits_same(s, zeros, y + 1, L - 1)));
}

static struct gram_frag gs_emit_digit(struct gs *s, void *ctx)
{
    (void)ctx;
    return gram_f_range(s->b, '0', '9');
}

static struct gram_frag gs_digits(struct gs *s, long lo, long hi) { return gs_rep(s, gs_emit_digit, NULL, lo, hi); }

/* The lowest and highest L-digit magnitudes within [xa, xc] (decimal strings of la and lc
 * digits; c_inf: no upper bound), as digit strings of length L (hi not terminated). */
static void gs_len_bounds(const char *xa, int la, const char *xc, int lc, int c_inf, int L, char *lo, char *hi)
{
    if (L == la) memcpy(lo, xa, (size_t)la + 1);
    else {
        lo[0] = '1';
        memset(lo + 1, '0', (size_t)L - 1);
    }
    if (L == lc && !c_inf) memcpy(hi, xc, (size_t)lc + 1);
    else memset(hi, '9', (size_t)L);
}

/* Magnitudes in [a, c] (c_inf: unbounded above), as decimal text. a <= c. */
static struct gram_frag gs_uint_range(struct gs *s, unsigned long long a, unsigned long long c, int c_inf)
{
    struct gram_builder *b = s->b;
    char xa[24], xc[24];
    int la = snprintf(xa, sizeof(xa), "%llu", a);
    int lc = c_inf ? la : snprintf(xc, sizeof(xc), "%llu", c);
    struct gram_frag f = {-1, -1};
    for (int L = la; L <= lc && !b->failed; L++) {
        char lo[24], hi[24];
        gs_len_bounds(xa, la, xc, lc, c_inf, L, lo, hi);
        struct gram_frag g = gs_digits_same(s, lo, hi, L);
        f = f.s < 0 ? g : gram_f_alt(b, f, g);
    }
    if (c_inf && la < GS_MAX_DIGITS) { /* any longer number, up to GS_MAX_DIGITS digits */
        struct gram_frag g = gram_f_range(b, '1', '9');
        for (int i = 0; i < la; i++) g = gram_f_seq(b, g, gram_f_range(b, '0', '9'));
        g = gram_f_seq(b, g, gs_digits(s, 0, GS_MAX_DIGITS - 1 - la));
        f = gram_f_alt(b, f, g);
    }
    return f;
}

/* Magnitudes in [a, c] (c_inf: up to GS_MAX_DIGITS digits) that are multiples of m: per length
 * L, a digit automaton over (position, still equal to the lower / upper bound's digits, value
 * mod m), states made as they are reached; the multiples end at residue 0. Only states from
 * which residue 0 can still be reached get edges (a live table, filled backwards), so the model
 * is never led into digits that no multiple continues. */
static struct gram_frag gs_uint_range_mod(struct gs *s, unsigned long long a, unsigned long long c, int c_inf, int m)
{
    struct gram_builder *b = s->b;
    char xa[24], xc[24];
    int la = snprintf(xa, sizeof(xa), "%llu", a);
    int lc = c_inf ? GS_MAX_DIGITS : snprintf(xc, sizeof(xc), "%llu", c);
    int32_t start = gram_b_state(b), end = gram_b_state(b);
    int32_t *st = malloc((size_t)(GS_MAX_DIGITS + 2) * 4 * (size_t)m * sizeof(int32_t));
    uint8_t *live = malloc((size_t)(GS_MAX_DIGITS + 2) * 4 * (size_t)m);
    if (!st || !live) {
        free(st);
        free(live);
        gram_b_fail(b, CAIRN_ERR_NOMEM, "json schema: out of memory");
        return (struct gram_frag){start, end};
    }
    for (int L = la; L <= lc && !b->failed; L++) {
        char lo[24], hi[24];
        gs_len_bounds(xa, la, xc, lc, c_inf, L, lo, hi);
        size_t n_st = (size_t)(L + 1) * 4 * (size_t)m;
        for (size_t k = 0; k < n_st; k++) st[k] = -1;
#define GS_MOD_IX(i, tl, th, r) ((((size_t)(i) * 4) + (size_t)(tl) * 2 + (size_t)(th)) * (size_t)m + (size_t)(r))
#define GS_MOD_AT(i, tl, th, r) st[GS_MOD_IX(i, tl, th, r)]
        memset(live, 0, n_st);
        for (int k = 0; k < 4; k++) live[GS_MOD_IX(L, k >> 1, k & 1, 0)] = 1;
        for (int i = L - 1; i >= 0; i--)
            for (int k = 0; k < 4; k++)
                for (int r = 0; r < m; r++) {
                    int tl = k >> 1, th = k & 1;
                    char d0 = tl ? lo[i] : '0', d1 = th ? hi[i] : '9';
                    for (char d = d0; d <= d1 && !live[GS_MOD_IX(i, tl, th, r)]; d++)
                        live[GS_MOD_IX(i, tl, th, r)] = live[GS_MOD_IX(i + 1, tl && d == lo[i], th && d == hi[i], (r * 10 + (d - '0')) % m)];
                }
        if (!live[GS_MOD_IX(0, 1, 1, 0)]) continue; /* no multiple of this length */
        GS_MOD_AT(0, 1, 1, 0) = gram_b_state(b);
        gram_b_eps(b, start, GS_MOD_AT(0, 1, 1, 0));
        for (int i = 0; i < L && !b->failed; i++)
            for (int tl = 0; tl < 2; tl++)
                for (int th = 0; th < 2; th++)
                    for (int r = 0; r < m && !b->failed; r++) {
                        int32_t from = GS_MOD_AT(i, tl, th, r);
                        if (from < 0) continue;
                        char d0 = tl ? lo[i] : '0', d1 = th ? hi[i] : '9';
                        for (char d = d0; d <= d1 && !b->failed; d++) {
                            int ntl = tl && d == lo[i], nth = th && d == hi[i], nr = (r * 10 + (d - '0')) % m;
                            if (!live[GS_MOD_IX(i + 1, ntl, nth, nr)]) continue;
                            int32_t *to = &GS_MOD_AT(i + 1, ntl, nth, nr);
                            if (*to < 0) *to = gram_b_state(b);
                            gram_b_byte(b, from, *to, (uint8_t)d, (uint8_t)d);
                        }
                    }
        for (int tl = 0; tl < 2; tl++)
            for (int th = 0; th < 2; th++)
                if (GS_MOD_AT(L, tl, th, 0) >= 0) gram_b_eps(b, GS_MOD_AT(L, tl, th, 0), end);
#undef GS_MOD_AT
#undef GS_MOD_IX
    }
    free(st);
    free(live);
    return (struct gram_frag){start, end};
}

#define GS_BIG 1e17 /* bounds beyond this count as none */

/* Integers in [lo, hi] (has_*: bound present) that are multiples of m (1: all), as JSON text. */
static struct gram_frag gs_int_range(struct gs *s, int has_lo, long long lo, int has_hi, long long hi, int m)
{
    struct gram_builder *b = s->b;
    struct gram_frag f = {-1, -1};
    if (!has_hi || hi >= 0) { /* non-negative part */
        unsigned long long a = has_lo && lo > 0 ? (unsigned long long)lo : 0;
        f = m > 1 ? gs_uint_range_mod(s, a, has_hi ? (unsigned long long)hi : 0, !has_hi, m)
                  : gs_uint_range(s, a, has_hi ? (unsigned long long)hi : 0, !has_hi);
    }
    if (!has_lo || lo < 0) { /* negative part: magnitudes [max(1, -hi), -lo] */
        unsigned long long a = has_hi && hi < -1 ? (unsigned long long)(-hi) : 1;
        unsigned long long c = has_lo ? (unsigned long long)(-lo) : 0;
        struct gram_frag mag = m > 1 ? gs_uint_range_mod(s, a, c, !has_lo, m) : gs_uint_range(s, a, c, !has_lo);
        struct gram_frag g = gram_f_seq(b, gs_lit(s, "-"), mag);
        f = f.s < 0 ? g : gram_f_alt(b, f, g);
    }
    return f;
}

/* Reads the numeric bounds of node: inclusive integer bounds ilo/ihi and the raw ones. */
struct gs_bounds {
    int has_lo, has_hi, lo_ex, hi_ex;
    double lo, hi;
};

static int gs_get_bounds(struct gs *s, const json_t *node, struct gs_bounds *bd)
{
    memset(bd, 0, sizeof(*bd));
    const json_t *v;
    if ((v = json_object_get(node, "minimum"))) {
        if (!json_is_number(v)) return gs_fail(s, CAIRN_ERR_INVALID, "'%s' must be a number", "minimum");
        bd->has_lo = 1;
        bd->lo = json_number_value(v);
    }
    if ((v = json_object_get(node, "exclusiveMinimum"))) {
        if (!json_is_number(v)) return gs_fail(s, CAIRN_ERR_UNSUPPORTED, "'%s' must be a number (draft 6+)", "exclusiveMinimum");
        double x = json_number_value(v);
        if (!bd->has_lo || x >= bd->lo) {
            bd->has_lo = 1;
            bd->lo = x;
            bd->lo_ex = 1;
        }
    }
    if ((v = json_object_get(node, "maximum"))) {
        if (!json_is_number(v)) return gs_fail(s, CAIRN_ERR_INVALID, "'%s' must be a number", "maximum");
        bd->has_hi = 1;
        bd->hi = json_number_value(v);
    }
    if ((v = json_object_get(node, "exclusiveMaximum"))) {
        if (!json_is_number(v)) return gs_fail(s, CAIRN_ERR_UNSUPPORTED, "'%s' must be a number (draft 6+)", "exclusiveMaximum");
        double x = json_number_value(v);
        if (!bd->has_hi || x <= bd->hi) {
            bd->has_hi = 1;
            bd->hi = x;
            bd->hi_ex = 1;
        }
    }
    /* a bound out beyond GS_BIG on its own side is no bound; on the other side nothing fits */
    if (bd->has_lo && bd->lo < -GS_BIG) bd->has_lo = 0;
    if (bd->has_hi && bd->hi > GS_BIG) bd->has_hi = 0;
    if ((bd->has_lo && bd->lo > GS_BIG) || (bd->has_hi && bd->hi < -GS_BIG))
        return gs_fail(s, CAIRN_ERR_UNSUPPORTED, "%s", "numeric bounds beyond 1e17");
    return 0;
}

/* Inclusive integer bounds from (possibly exclusive, fractional) ones. */
static void gs_int_bounds(const struct gs_bounds *bd, long long *ilo, long long *ihi)
{
    *ilo = bd->has_lo ? (bd->lo_ex ? (long long)floor(bd->lo) + 1 : (long long)ceil(bd->lo)) : 0;
    *ihi = bd->has_hi ? (bd->hi_ex ? (long long)ceil(bd->hi) - 1 : (long long)floor(bd->hi)) : 0;
}

static struct gram_frag gs_frac(struct gs *s) { return gram_f_seq(s->b, gs_lit(s, "."), gs_digits(s, 1, GS_MAX_DIGITS)); }

/* multipleOf: *m = the integer step (1 when absent); a fraction or a large one is an error. */
static int gs_get_multiple(struct gs *s, const json_t *node, int *m)
{
    *m = 1;
    const json_t *v = json_object_get(node, "multipleOf");
    if (!v) return 0;
    if (!json_is_number(v) || json_number_value(v) <= 0)
        return gs_fail(s, CAIRN_ERR_INVALID, "'%s' must be a number > 0", "multipleOf");
    double x = json_number_value(v);
    if (x != floor(x)) return gs_fail(s, CAIRN_ERR_UNSUPPORTED, "'%s' that is not an integer", "multipleOf");
    if (x > 100) return gs_fail(s, CAIRN_ERR_UNSUPPORTED, "'%s' above 100", "multipleOf");
    *m = (int)x;
    return 0;
}

static struct gram_frag gs_number(struct gs *s, const json_t *node, int integer)
{
    struct gram_builder *b = s->b;
    struct gs_bounds bd;
    int mult = 1;
    if (gs_get_bounds(s, node, &bd) || gs_get_multiple(s, node, &mult)) return gram_f_empty(b);
    if (json_object_get(node, "multipleOf")) integer = 1; /* an integer step: only integers are multiples we write */
    long long ilo, ihi;
    gs_int_bounds(&bd, &ilo, &ihi);
    if (bd.has_lo && bd.has_hi && ilo > ihi && integer) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "no integer satisfies the bounds");
        return gram_f_empty(b);
    }
    if (!bd.has_lo && !bd.has_hi) {
        struct gram_frag f = gs_int_range(s, 0, 0, 0, 0, mult);
        if (integer) return f;
        f = gram_f_seq(b, f, gram_f_opt(b, gs_frac(s)));
        struct gram_frag e = gram_f_alt(b, gs_lit(s, "e"), gs_lit(s, "E"));
        e = gram_f_seq(b, e, gram_f_opt(b, gram_f_alt(b, gs_lit(s, "+"), gs_lit(s, "-"))));
        e = gram_f_seq(b, e, gs_digits(s, 1, 3));
        return gram_f_seq(b, f, gram_f_opt(b, e));
    }
    struct gram_frag f = {-1, -1};
    if (!(bd.has_lo && bd.has_hi && ilo > ihi)) f = gs_int_range(s, bd.has_lo, ilo, bd.has_hi, ihi, mult);
    if (!integer) {
        /* I.F for I >= 0: I in [max(0, ilo), floor(hi) - 1] */
        long long a = bd.has_lo && ilo > 0 ? ilo : 0;
        long long c = bd.has_hi ? (long long)floor(bd.hi) - 1 : 0;
        if (!bd.has_hi || c >= a) {
            struct gram_frag g = gram_f_seq(b, gs_uint_range(s, (unsigned long long)a, (unsigned long long)c, !bd.has_hi), gs_frac(s));
            f = f.s < 0 ? g : gram_f_alt(b, f, g);
        }
        /* -I.F for I >= 0: I >= -hi (> -hi when exclusive), I <= floor(-lo) - 1 */
        long long na = 0;
        if (bd.has_hi) na = bd.hi_ex ? (long long)floor(-bd.hi) + 1 : (long long)ceil(-bd.hi);
        if (na < 0) na = 0;
        long long nc = bd.has_lo ? (long long)floor(-bd.lo) - 1 : 0;
        if (!bd.has_lo || nc >= na) {
            struct gram_frag g = gs_uint_range(s, (unsigned long long)na, (unsigned long long)nc, !bd.has_lo);
            g = gram_f_seq(b, gs_lit(s, "-"), gram_f_seq(b, g, gs_frac(s)));
            f = f.s < 0 ? g : gram_f_alt(b, f, g);
        }
    }
    if (f.s < 0) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "no number satisfies the bounds");
        return gram_f_empty(b);
    }
    return f;
}

/* ---- strings ---- */

static const struct {
    const char *name, *re;
} gs_formats[] = {
    {"date", "[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"date-time", "[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
                  "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"email", "[a-zA-Z0-9_+-]{1,32}(\\.[a-zA-Z0-9_+-]{1,32}){0,3}@[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?"
              "(\\.[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?){1,3}"},
};

static int gs_get_len(struct gs *s, const json_t *node, const char *key, long *out)
{
    const json_t *v = json_object_get(node, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return gs_fail(s, CAIRN_ERR_INVALID, "'%s' must be a non-negative integer", key);
    if (json_integer_value(v) > GS_MAX_ITEMS) return gs_fail(s, CAIRN_ERR_LIMIT, "'%s' is too large (at most 4096 here)", key);
    *out = (long)json_integer_value(v);
    return 0;
}

static struct gram_frag gs_string(struct gs *s, const json_t *node)
{
    struct gram_builder *b = s->b;
    const json_t *fmt = json_object_get(node, "format"), *pat = json_object_get(node, "pattern");
    long mn = 0, mx = -1;
    if (gs_get_len(s, node, "minLength", &mn) || gs_get_len(s, node, "maxLength", &mx)) return gram_f_empty(b);
    if (mx >= 0 && mx < mn) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "maxLength < minLength");
        return gram_f_empty(b);
    }
    const char *re = NULL;
    if (fmt) {
        const char *name = json_string_value(fmt);
        if (!name) {
            gs_fail(s, CAIRN_ERR_INVALID, "%s", "'format' must be a string");
            return gram_f_empty(b);
        }
        for (size_t i = 0; i < CAIRN_ARRAY_LEN(gs_formats) && !re; i++)
            if (!strcmp(name, gs_formats[i].name)) re = gs_formats[i].re;
        if (!re) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "unsupported string format '%s'", name);
            return gram_f_empty(b);
        }
    }
    if (pat) {
        if (re) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "%s", "'pattern' together with 'format'");
            return gram_f_empty(b);
        }
        if (!(re = json_string_value(pat))) {
            gs_fail(s, CAIRN_ERR_INVALID, "%s", "'pattern' must be a string");
            return gram_f_empty(b);
        }
    }
    if (!re) return gs_string_plain(s, mn, mx);
    if (mn || mx >= 0) {
        gs_fail(s, CAIRN_ERR_UNSUPPORTED, "%s", "minLength/maxLength together with 'pattern' or 'format'");
        return gram_f_empty(b);
    }
    struct gram_frag body;
    if (gram_regex_emit(b, re, strlen(re), 1, &body)) {
        /* the regex error is already recorded; add where it was */
        return gram_f_empty(b);
    }
    return gram_f_seq(b, gs_lit(s, "\""), gram_f_seq(b, body, gs_lit(s, "\"")));
}

/* ---- any value ---- */

static int32_t gs_any_rule(struct gs *s)
{
    if (s->r_any >= 0) return s->r_any;
    struct gram_builder *b = s->b;
    int32_t r = gram_b_rule(b);
    s->r_any = r;
    struct gram_frag str = gs_string_plain(s, 0, -1);
    /* object */
    struct gram_frag kv = gram_f_seq(b, gs_string_plain(s, 0, -1), gram_f_seq(b, gs_lit(s, ":"), gram_f_seq(b, gs_ws(s), gram_f_call(b, r))));
    struct gram_frag kv2 = gram_f_seq(b, gs_string_plain(s, 0, -1), gram_f_seq(b, gs_lit(s, ":"), gram_f_seq(b, gs_ws(s), gram_f_call(b, r))));
    struct gram_frag more = gram_f_star(b, gram_f_seq(b, gs_lit(s, ","), gram_f_seq(b, gs_ws(s), kv2)));
    struct gram_frag obj = gram_f_seq(b, gs_lit(s, "{"), gram_f_seq(b, gram_f_opt(b, gram_f_seq(b, kv, more)), gs_lit(s, "}")));
    /* array */
    struct gram_frag more_a = gram_f_star(b, gram_f_seq(b, gs_lit(s, ","), gram_f_seq(b, gs_ws(s), gram_f_call(b, r))));
    struct gram_frag arr = gram_f_seq(b, gs_lit(s, "["), gram_f_seq(b, gram_f_opt(b, gram_f_seq(b, gram_f_call(b, r), more_a)), gs_lit(s, "]")));
    struct gram_frag num = gs_number(s, NULL, 0);
    struct gram_frag f = gram_f_alt(b, obj, arr);
    f = gram_f_alt(b, f, str);
    f = gram_f_alt(b, f, num);
    f = gram_f_alt(b, f, gs_lit(s, "true"));
    f = gram_f_alt(b, f, gs_lit(s, "false"));
    f = gram_f_alt(b, f, gs_lit(s, "null"));
    gram_b_rule_body(b, r, f);
    return r;
}

/* ---- objects and arrays ---- */

struct gs_arr_ctx {
    int32_t item;
};

static struct gram_frag gs_emit_more_item(struct gs *s, void *ctx)
{
    struct gs_arr_ctx *c = ctx;
    return gram_f_seq(s->b, gs_lit(s, ","), gram_f_seq(s->b, gs_ws(s), gram_f_call(s->b, c->item)));
}

/* prefixItems: element i < P has its own schema, the rest `items` (none with items: false). */
static struct gram_frag gs_array_prefix(struct gs *s, const json_t *pre, const json_t *items, long mn, long mx)
{
    struct gram_builder *b = s->b;
    size_t P = json_array_size(pre);
    if (!json_is_array(pre) || P == 0 || P > GS_MAX_ITEMS) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "'prefixItems' must be a non-empty array (of at most 4096)");
        return gram_f_empty(b);
    }
    int32_t *pr = malloc(P * sizeof(int32_t));
    if (!pr) {
        gram_b_fail(b, CAIRN_ERR_NOMEM, "json schema: out of memory");
        return gram_f_empty(b);
    }
    for (size_t i = 0; i < P && !b->failed; i++) {
        char seg[40];
        snprintf(seg, sizeof(seg), "/prefixItems/%zu", i);
        pr[i] = gs_rule(s, json_array_get(pre, i), seg);
    }
    struct gs_arr_ctx c = {-1};
    if (!json_is_false(items)) c.item = items ? gs_rule(s, items, "/items") : gs_any_rule(s);
    struct gram_frag open = gs_lit(s, "[");
    int32_t end = gram_b_state(b), cur = open.e;
    for (size_t i = 0; i < P && cur >= 0 && !b->failed; i++) {
        if ((long)i >= mn) gram_b_eps(b, cur, end);
        if (mx >= 0 && (long)i >= mx) {
            cur = -1;
            break;
        }
        struct gram_frag el = gram_f_call(b, pr[i]);
        if (i) el = gram_f_seq(b, gram_f_seq(b, gs_lit(s, ","), gs_ws(s)), el);
        gram_b_eps(b, cur, el.s);
        cur = el.e;
    }
    free(pr);
    if (cur >= 0) {
        if (c.item < 0) {
            if ((long)P < mn) gs_fail(s, CAIRN_ERR_INVALID, "%s", "minItems beyond prefixItems with items: false");
            gram_b_eps(b, cur, end);
        } else {
            long lo = mn > (long)P ? mn - (long)P : 0, hi = mx < 0 ? -1 : mx - (long)P;
            struct gram_frag tail = gs_rep(s, gs_emit_more_item, &c, lo, hi);
            gram_b_eps(b, cur, tail.s);
            gram_b_eps(b, tail.e, end);
        }
    }
    return gram_f_seq(b, (struct gram_frag){open.s, end}, gs_lit(s, "]"));
}

static struct gram_frag gs_array(struct gs *s, const json_t *node)
{
    struct gram_builder *b = s->b;
    const json_t *items = json_object_get(node, "items");
    long mn = 0, mx = -1;
    if (gs_get_len(s, node, "minItems", &mn) || gs_get_len(s, node, "maxItems", &mx)) return gram_f_empty(b);
    if (mx >= 0 && mx < mn) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "maxItems < minItems");
        return gram_f_empty(b);
    }
    const json_t *pre = json_object_get(node, "prefixItems");
    if (pre) return gs_array_prefix(s, pre, items, mn, mx);
    struct gs_arr_ctx c = {items ? gs_rule(s, items, "/items") : gs_any_rule(s)};
    if (b->failed) return gram_f_empty(b);
    struct gram_frag inner = {-1, -1};
    if (mx != 0) {
        inner = gram_f_call(b, c.item);
        inner = gram_f_seq(b, inner, gs_rep(s, gs_emit_more_item, &c, mn > 0 ? mn - 1 : 0, mx < 0 ? -1 : mx - 1));
        if (mn == 0) inner = gram_f_opt(b, inner);
    } else {
        inner = gram_f_empty(b);
    }
    return gram_f_seq(b, gs_lit(s, "["), gram_f_seq(b, inner, gs_lit(s, "]")));
}

static struct gram_frag gs_key_value(struct gs *s, const char *key, int32_t value_rule)
{
    struct gram_builder *b = s->b;
    json_t *k = json_string(key);
    struct gram_frag f = k ? gs_json_lit(s, k) : gram_f_empty(b);
    json_decref(k);
    f = gram_f_seq(b, f, gs_lit(s, ":"));
    f = gram_f_seq(b, f, gs_ws(s));
    return gram_f_seq(b, f, gram_f_call(b, value_rule));
}

/* Properties in declared order with lo..hi of them present (only the listed ones are ever
 * written, so the count is exact): S[j] nothing written yet, properties j.. left; R[j][c]: c
 * written. Only rules that can still meet the bounds are entered (GS_LIVE_*), so the model is
 * never led into an object it cannot close. */
static struct gram_frag gs_object_counted(struct gs *s, const json_t *props, const json_t *req, long lo, long hi)
{
    struct gram_builder *b = s->b;
    size_t n = json_object_size(props), n_req = json_array_size(req);
    if (lo > hi || (long)n_req > hi) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "no object of the listed properties satisfies minProperties / maxProperties / required");
        return gram_f_empty(b);
    }
    if ((n + 1) * (size_t)(hi + 1) > 20000) {
        gs_fail(s, CAIRN_ERR_LIMIT, "%s", "minProperties / maxProperties over too many properties");
        return gram_f_empty(b);
    }
    size_t W = (size_t)hi + 1;
    int32_t *val = malloc(n * sizeof(int32_t)), *S = malloc((n + 1) * sizeof(int32_t));
    int32_t *R = malloc((n + 1) * W * sizeof(int32_t));
    int *required = calloc(n, sizeof(int)), *req_after = calloc(n + 1, sizeof(int));
    const char **names = malloc(n * sizeof(char *));
    struct gram_frag out = gram_f_empty(b);
    if (!val || !S || !R || !required || !req_after || !names) {
        gram_b_fail(b, CAIRN_ERR_NOMEM, "json schema: out of memory");
        goto cleanup;
    }
    const char *key;
    const json_t *sub, *rq;
    size_t k = 0, i;
    json_object_foreach((json_t *)props, key, sub) {
        char seg[128];
        snprintf(seg, sizeof(seg), "/properties/%.100s", key);
        names[k] = key;
        val[k] = gs_rule(s, sub, seg);
        if (b->failed) goto cleanup;
        json_array_foreach(req, i, rq)
            if (!strcmp(json_string_value(rq), key)) required[k] = 1;
        k++;
    }
    for (size_t j = n; j-- > 0;) req_after[j] = req_after[j + 1] + required[j];
    for (size_t j = 0; j <= n; j++) {
        S[j] = gram_b_rule(b);
        for (size_t c = 1; c < W; c++) R[j * W + c] = gram_b_rule(b);
    }
    if (b->failed) goto cleanup;
    /* nothing matches: a branch that can no longer meet the bounds */
#define GS_NONE() gram_f_cps(b, NULL, NULL, 0)
#define GS_LIVE_R(j, c) ((long)(c) + (long)(n - (j)) >= lo && (long)(c) + req_after[j] <= hi)
#define GS_LIVE_S(j) GS_LIVE_R(j, 0)
    gram_b_rule_body(b, S[n], lo == 0 ? gram_f_empty(b) : GS_NONE());
    for (size_t c = 1; c < W; c++) gram_b_rule_body(b, R[n * W + c], (long)c >= lo ? gram_f_empty(b) : GS_NONE());
    for (size_t jj = n; jj-- > 0;) {
        struct gram_frag f = W > 1 && GS_LIVE_R(jj + 1, 1)
                                 ? gram_f_seq(b, gs_key_value(s, names[jj], val[jj]), gram_f_call(b, R[(jj + 1) * W + 1]))
                                 : GS_NONE();
        if (!required[jj] && GS_LIVE_S(jj + 1)) f = gram_f_alt(b, f, gram_f_call(b, S[jj + 1]));
        gram_b_rule_body(b, S[jj], f);
        for (size_t c = 1; c < W; c++) {
            struct gram_frag g = GS_NONE();
            if (c + 1 < W && GS_LIVE_R(jj + 1, c + 1))
                g = gram_f_seq(b, gs_lit(s, ","), gram_f_seq(b, gs_ws(s), gram_f_seq(b, gs_key_value(s, names[jj], val[jj]),
                                                                                  gram_f_call(b, R[(jj + 1) * W + c + 1]))));
            if (!required[jj] && GS_LIVE_R(jj + 1, c)) g = gram_f_alt(b, g, gram_f_call(b, R[(jj + 1) * W + c]));
            gram_b_rule_body(b, R[jj * W + c], g);
        }
    }
#undef GS_LIVE_S
#undef GS_LIVE_R
#undef GS_NONE
    out = gram_f_seq(b, gs_lit(s, "{"), gram_f_seq(b, gram_f_call(b, S[0]), gs_lit(s, "}")));
cleanup:
    free(val);
    free(S);
    free(R);
    free(required);
    free(req_after);
    free(names);
    return out;
}

static struct gram_frag gs_object(struct gs *s, const json_t *node)
{
    struct gram_builder *b = s->b;
    const json_t *props = json_object_get(node, "properties"), *req = json_object_get(node, "required");
    const json_t *addl = json_object_get(node, "additionalProperties");
    if (props && !json_is_object(props)) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "'properties' must be an object");
        return gram_f_empty(b);
    }
    if (req && !json_is_array(req)) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "'required' must be an array");
        return gram_f_empty(b);
    }
    size_t n = props ? json_object_size(props) : 0;
    size_t i;
    const json_t *rq;
    json_array_foreach(req, i, rq) {
        const char *name = json_string_value(rq);
        if (!name) {
            gs_fail(s, CAIRN_ERR_INVALID, "%s", "'required' entries must be strings");
            return gram_f_empty(b);
        }
        if (!props || !json_object_get(props, name)) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "required property '%s' is not in 'properties'", name);
            return gram_f_empty(b);
        }
    }
    long pmin = 0, pmax = -1;
    if (gs_get_len(s, node, "minProperties", &pmin) || gs_get_len(s, node, "maxProperties", &pmax)) return gram_f_empty(b);
    int counted = pmin > 0 || pmax >= 0;
    if (counted && n == 0) {
        if (json_is_false(addl) && pmin == 0) return gs_lit(s, "{}");
        gs_fail(s, CAIRN_ERR_UNSUPPORTED, "%s", "minProperties / maxProperties on an object without listed 'properties'");
        return gram_f_empty(b);
    }
    if (counted) return gs_object_counted(s, props, req, pmin, pmax < 0 || pmax > (long)n ? (long)n : pmax);
    if (n == 0 && !json_is_false(addl)) { /* a map: string keys to (additionalProperties or any) */
        int32_t val = json_is_object(addl) ? gs_rule(s, addl, "/additionalProperties") : gs_any_rule(s);
        struct gram_frag kv = gram_f_seq(b, gs_string_plain(s, 0, -1), gram_f_seq(b, gs_lit(s, ":"), gram_f_seq(b, gs_ws(s), gram_f_call(b, val))));
        struct gram_frag kv2 = gram_f_seq(b, gs_string_plain(s, 0, -1), gram_f_seq(b, gs_lit(s, ":"), gram_f_seq(b, gs_ws(s), gram_f_call(b, val))));
        struct gram_frag more = gram_f_star(b, gram_f_seq(b, gs_lit(s, ","), gram_f_seq(b, gs_ws(s), kv2)));
        return gram_f_seq(b, gs_lit(s, "{"), gram_f_seq(b, gram_f_opt(b, gram_f_seq(b, kv, more)), gs_lit(s, "}")));
    }
    if (n == 0) return gs_lit(s, "{}");
    if (n > 1000) {
        gs_fail(s, CAIRN_ERR_LIMIT, "%s", "more than 1000 properties");
        return gram_f_empty(b);
    }
    /* value rules in declared order (jansson iterates objects in insertion order) */
    int32_t *val = malloc(n * sizeof(int32_t));
    int *required = calloc(n, sizeof(int));
    const char **names = malloc(n * sizeof(char *));
    int32_t *S = malloc((n + 1) * sizeof(int32_t)), *R = malloc((n + 1) * sizeof(int32_t));
    struct gram_frag out = gram_f_empty(b);
    if (!val || !required || !names || !S || !R) {
        gram_b_fail(b, CAIRN_ERR_NOMEM, "json schema: out of memory");
        goto cleanup;
    }
    const char *key;
    const json_t *sub;
    size_t k = 0;
    json_object_foreach((json_t *)props, key, sub) {
        char seg[128];
        snprintf(seg, sizeof(seg), "/properties/%.100s", key);
        names[k] = key;
        val[k] = gs_rule(s, sub, seg);
        if (b->failed) goto cleanup;
        json_array_foreach(req, i, rq)
            if (!strcmp(json_string_value(rq), key)) required[k] = 1;
        k++;
    }
    for (size_t j = 0; j <= n; j++) {
        S[j] = gram_b_rule(b);
        R[j] = gram_b_rule(b);
    }
    if (b->failed) goto cleanup;
    gram_b_rule_body(b, S[n], gram_f_empty(b));
    gram_b_rule_body(b, R[n], gram_f_empty(b));
    for (size_t jj = n; jj-- > 0;) {
        struct gram_frag kv = gram_f_seq(b, gs_key_value(s, names[jj], val[jj]), gram_f_call(b, R[jj + 1]));
        struct gram_frag skv = gram_f_seq(b, gs_lit(s, ","), gram_f_seq(b, gs_ws(s), gram_f_seq(b, gs_key_value(s, names[jj], val[jj]), gram_f_call(b, R[jj + 1]))));
        if (!required[jj]) {
            kv = gram_f_alt(b, kv, gram_f_call(b, S[jj + 1]));
            skv = gram_f_alt(b, skv, gram_f_call(b, R[jj + 1]));
        }
        gram_b_rule_body(b, S[jj], kv);
        gram_b_rule_body(b, R[jj], skv);
    }
    out = gram_f_seq(b, gs_lit(s, "{"), gram_f_seq(b, gram_f_call(b, S[0]), gs_lit(s, "}")));
cleanup:
    free(val);
    free(required);
    free(names);
    free(S);
    free(R);
    return out;
}

/* ---- dispatch ---- */

static const char *const gs_known[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
    "pattern", "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "anyOf", "allOf", "$ref", "$defs", "definitions", "minProperties", "maxProperties", "prefixItems", "oneOf",
    "multipleOf",
    /* annotations, ignored */
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "strict", "name",
};

static const json_t *gs_resolve(struct gs *s, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const json_t *cur = s->root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof(seg)) {
            if (p[0] == '~' && p[1] == '1') {
                seg[n++] = '/';
                p += 2;
            } else if (p[0] == '~' && p[1] == '0') {
                seg[n++] = '~';
                p += 2;
            } else
                seg[n++] = *p++;
        }
        seg[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, seg);
        else if (json_is_array(cur)) {
            char *end;
            long idx = strtol(seg, &end, 10);
            cur = *end || idx < 0 ? NULL : json_array_get(cur, (size_t)idx);
        } else
            cur = NULL;
    }
    return *p ? NULL : cur;
}

/* ---- oneOf: provably disjoint branches ---- */

enum { GS_K_NULL = 1, GS_K_BOOL = 2, GS_K_OBJ = 4, GS_K_ARR = 8, GS_K_STR = 16, GS_K_INT = 32, GS_K_FRAC = 64, GS_K_ALL = 127 };

static int gs_kind_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return GS_K_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return GS_K_BOOL;
    case JSON_OBJECT: return GS_K_OBJ;
    case JSON_ARRAY: return GS_K_ARR;
    case JSON_STRING: return GS_K_STR;
    case JSON_INTEGER: return GS_K_INT;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? GS_K_INT : GS_K_FRAC;
    }
    return GS_K_ALL;
}

static int gs_kind_name(const char *t)
{
    static const struct {
        const char *n;
        int k;
    } tab[] = {{"null", GS_K_NULL}, {"boolean", GS_K_BOOL}, {"object", GS_K_OBJ}, {"array", GS_K_ARR},
               {"string", GS_K_STR}, {"integer", GS_K_INT}, {"number", GS_K_INT | GS_K_FRAC}};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(tab); i++)
        if (!strcmp(t, tab[i].n)) return tab[i].k;
    return GS_K_ALL;
}

/* Follows $ref (a few levels); NULL when it does not resolve. */
static const json_t *gs_deref(struct gs *s, const json_t *node)
{
    for (int i = 0; i < 8 && json_is_object(node); i++) {
        const char *ref = json_string_value(json_object_get(node, "$ref"));
        if (!ref) return node;
        node = gs_resolve(s, ref);
    }
    return json_is_object(node) && !json_object_get(node, "$ref") ? node : NULL;
}

/* The kinds of JSON value the schema can accept (a superset). */
static int gs_kinds(struct gs *s, const json_t *node, int depth)
{
    if (depth > 8 || json_is_true(node)) return GS_K_ALL;
    if (json_is_false(node)) return 0;
    node = gs_deref(s, node);
    if (!node) return GS_K_ALL;
    int k = GS_K_ALL;
    const json_t *v = json_object_get(node, "type"), *e;
    size_t i;
    if (json_is_string(v)) k = gs_kind_name(json_string_value(v));
    else if (json_is_array(v)) {
        k = 0;
        json_array_foreach(v, i, e) k |= json_is_string(e) ? gs_kind_name(json_string_value(e)) : GS_K_ALL;
    }
    if ((v = json_object_get(node, "const"))) k &= gs_kind_of(v);
    if (json_is_array(v = json_object_get(node, "enum"))) {
        int u = 0;
        json_array_foreach(v, i, e) u |= gs_kind_of(e);
        k &= u;
    }
    const char *comb[] = {"anyOf", "oneOf", "allOf"};
    for (int c = 0; c < 3; c++)
        if (json_is_array(v = json_object_get(node, comb[c]))) {
            int u = c == 2 ? GS_K_ALL : 0;
            json_array_foreach(v, i, e) {
                int x = gs_kinds(s, e, depth + 1);
                u = c == 2 ? u & x : u | x;
            }
            k &= u;
        }
    return k;
}

/* The values the schema allows when it lists them (const / enum), else NULL. Borrowed. */
static const json_t *gs_values(struct gs *s, const json_t *node, json_t **tmp)
{
    node = gs_deref(s, node);
    if (!node) return NULL;
    const json_t *v;
    if ((v = json_object_get(node, "const"))) {
        *tmp = json_pack("[O]", v);
        return *tmp;
    }
    v = json_object_get(node, "enum");
    return json_is_array(v) ? v : NULL;
}

static int gs_same_value(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

/* 1 if the two listed value sets share no value. */
static int gs_values_disjoint(const json_t *x, const json_t *y)
{
    size_t i, j;
    const json_t *a, *c;
    json_array_foreach(x, i, a) json_array_foreach(y, j, c) if (gs_same_value(a, c)) return 0;
    return 1;
}

static int gs_requires(const json_t *node, const char *name)
{
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(node, "required"), i, r) if (json_is_string(r) && !strcmp(json_string_value(r), name)) return 1;
    return 0;
}

/* Objects of x and y can't coincide: a property both require with disjoint listed values, or
 * one x requires that y forbids (not listed, additionalProperties false). */
static int gs_objects_disjoint(struct gs *s, const json_t *x, const json_t *y)
{
    x = gs_deref(s, x);
    y = gs_deref(s, y);
    if (!x || !y) return 0;
    for (int pass = 0; pass < 2; pass++) {
        const json_t *a = pass ? y : x, *c = pass ? x : y;
        const json_t *pa = json_object_get(a, "properties"), *pc = json_object_get(c, "properties");
        const char *key;
        const json_t *sub;
        json_object_foreach((json_t *)pa, key, sub) {
            if (!gs_requires(a, key)) continue;
            const json_t *other = json_object_get(pc, key);
            if (!other) {
                if (json_is_false(json_object_get(c, "additionalProperties"))) return 1;
                continue;
            }
            if (pass || !gs_requires(c, key)) continue;
            json_t *t1 = NULL, *t2 = NULL;
            const json_t *v1 = gs_values(s, sub, &t1), *v2 = gs_values(s, other, &t2);
            int dis = v1 && v2 && gs_values_disjoint(v1, v2);
            json_decref(t1);
            json_decref(t2);
            if (dis) return 1;
        }
    }
    return 0;
}

/* 1 if no value validates against two branches of the oneOf (so anyOf means the same). */
static int gs_oneof_disjoint(struct gs *s, const json_t *arr)
{
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            const json_t *x = json_array_get(arr, i), *y = json_array_get(arr, j);
            int k = gs_kinds(s, x, 0) & gs_kinds(s, y, 0);
            if (!k) continue;
            json_t *t1 = NULL, *t2 = NULL;
            const json_t *v1 = gs_values(s, x, &t1), *v2 = gs_values(s, y, &t2);
            int dis = v1 && v2 && gs_values_disjoint(v1, v2);
            json_decref(t1);
            json_decref(t2);
            if (dis) continue;
            if (k == GS_K_OBJ && gs_objects_disjoint(s, x, y)) continue;
            return 0;
        }
    return 1;
}

static struct gram_frag gs_type(struct gs *s, const json_t *node, const char *t)
{
    if (!strcmp(t, "string")) return gs_string(s, node);
    if (!strcmp(t, "integer")) return gs_number(s, node, 1);
    if (!strcmp(t, "number")) return gs_number(s, node, 0);
    if (!strcmp(t, "boolean")) return gram_f_alt(s->b, gs_lit(s, "true"), gs_lit(s, "false"));
    if (!strcmp(t, "null")) return gs_lit(s, "null");
    if (!strcmp(t, "object")) return gs_object(s, node);
    if (!strcmp(t, "array")) return gs_array(s, node);
    gs_fail(s, CAIRN_ERR_INVALID, "unknown type '%s'", t);
    return gram_f_empty(s->b);
}

static struct gram_frag gs_body(struct gs *s, const json_t *node)
{
    struct gram_builder *b = s->b;
    if (json_is_true(node)) return gram_f_call(b, gs_any_rule(s));
    if (!json_is_object(node)) {
        gs_fail(s, json_is_false(node) ? CAIRN_ERR_UNSUPPORTED : CAIRN_ERR_INVALID, "%s",
                json_is_false(node) ? "the schema 'false' (nothing validates)" : "a schema must be an object");
        return gram_f_empty(b);
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)node, key, v) {
        int known = 0;
        for (size_t i = 0; i < CAIRN_ARRAY_LEN(gs_known) && !known; i++) known = !strcmp(key, gs_known[i]);
        if (!known) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "unsupported JSON Schema keyword '%s'", key);
            return gram_f_empty(b);
        }
    }
    if ((v = json_object_get(node, "$ref"))) {
        const char *ref = json_string_value(v);
        const json_t *target = ref ? gs_resolve(s, ref) : NULL;
        if (!target) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "$ref '%s' does not resolve (only local refs like #/$defs/x)", ref ? ref : "?");
            return gram_f_empty(b);
        }
        return gram_f_call(b, gs_rule(s, target, "/$ref"));
    }
    if ((v = json_object_get(node, "const"))) return gs_json_lit(s, v);
    if ((v = json_object_get(node, "enum"))) {
        if (!json_is_array(v) || !json_array_size(v)) {
            gs_fail(s, CAIRN_ERR_INVALID, "%s", "'enum' must be a non-empty array");
            return gram_f_empty(b);
        }
        struct gram_frag f = {-1, -1};
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            struct gram_frag g = gs_json_lit(s, e);
            f = f.s < 0 ? g : gram_f_alt(b, f, g);
        }
        return f;
    }
    if ((v = json_object_get(node, "allOf"))) {
        if (!json_is_array(v) || json_array_size(v) != 1) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "%s", "'allOf' with more than one schema");
            return gram_f_empty(b);
        }
        return gram_f_call(b, gs_rule(s, json_array_get(v, 0), "/allOf/0"));
    }
    const char *alt = "anyOf";
    if ((v = json_object_get(node, "oneOf"))) {
        if (json_object_get(node, "anyOf")) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "%s", "'oneOf' together with 'anyOf'");
            return gram_f_empty(b);
        }
        if (json_is_array(v) && !gs_oneof_disjoint(s, v)) {
            gs_fail(s, CAIRN_ERR_UNSUPPORTED, "%s",
                    "'oneOf' whose branches may overlap (only branches of distinct types, consts or a required "
                    "const property are supported)");
            return gram_f_empty(b);
        }
        alt = "oneOf";
    } else {
        v = json_object_get(node, "anyOf");
    }
    if (v) {
        if (!json_is_array(v) || !json_array_size(v)) {
            gs_fail(s, CAIRN_ERR_INVALID, "'%s' must be a non-empty array", alt);
            return gram_f_empty(b);
        }
        struct gram_frag f = {-1, -1};
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            char seg[32];
            snprintf(seg, sizeof(seg), "/%s/%zu", alt, i);
            struct gram_frag g = gram_f_call(b, gs_rule(s, e, seg));
            f = f.s < 0 ? g : gram_f_alt(b, f, g);
        }
        return f;
    }
    const json_t *t = json_object_get(node, "type");
    if (!t) {
        if (json_object_get(node, "properties") || json_object_get(node, "additionalProperties")) return gs_object(s, node);
        if (json_object_get(node, "items")) return gs_array(s, node);
        return gram_f_call(b, gs_any_rule(s));
    }
    if (json_is_string(t)) return gs_type(s, node, json_string_value(t));
    if (!json_is_array(t) || !json_array_size(t)) {
        gs_fail(s, CAIRN_ERR_INVALID, "%s", "'type' must be a string or a non-empty array");
        return gram_f_empty(b);
    }
    struct gram_frag f = {-1, -1};
    size_t i;
    const json_t *e;
    json_array_foreach(t, i, e) {
        if (!json_is_string(e)) {
            gs_fail(s, CAIRN_ERR_INVALID, "%s", "'type' entries must be strings");
            return gram_f_empty(b);
        }
        struct gram_frag g = gs_type(s, node, json_string_value(e));
        f = f.s < 0 ? g : gram_f_alt(b, f, g);
    }
    return f;
}

static int32_t gs_rule(struct gs *s, const json_t *node, const char *seg)
{
    struct gram_builder *b = s->b;
    if (b->failed) return 0;
    for (int i = 0; i < s->n_memo; i++)
        if (s->memo[i].node == node) return s->memo[i].rule;
    if (s->n_memo == s->cap_memo) {
        int cap = s->cap_memo ? s->cap_memo * 2 : 32;
        struct gs_memo *p = realloc(s->memo, (size_t)cap * sizeof(*p));
        if (!p) {
            gram_b_fail(b, CAIRN_ERR_NOMEM, "json schema: out of memory");
            return 0;
        }
        s->memo = p;
        s->cap_memo = cap;
    }
    if (++s->depth > 200) {
        gs_fail(s, CAIRN_ERR_LIMIT, "%s", "schema nested too deep");
        return 0;
    }
    int32_t r = gram_b_rule(b);
    s->memo[s->n_memo++] = (struct gs_memo){node, r};
    size_t plen = strlen(s->path);
    snprintf(s->path + plen, sizeof(s->path) - plen, "%s", seg);
    struct gram_frag body = gs_body(s, node);
    gram_b_rule_body(b, r, body);
    s->path[plen] = 0;
    s->depth--;
    return r;
}

struct gs_call_ctx {
    const char *sep;
    int32_t call;
};

/* sep, then one more call (a fresh copy each time: gs_rep) */
static struct gram_frag gs_emit_more_call(struct gs *s, void *ctx)
{
    struct gs_call_ctx *c = ctx;
    struct gram_frag sep = gram_f_empty(s->b);
    if (c->sep && c->sep[0] && !s->b->failed) gram_regex_emit(s->b, c->sep, strlen(c->sep), 0, &sep);
    return gram_f_seq(s->b, sep, gram_f_call(s->b, c->call));
}

int grammar_from_json_schema_calls(const json_t *schema, const struct grammar_calls *c, struct grammar **out,
                                   struct cairn_err *err)
{
    *out = NULL;
    struct gram_builder b;
    gram_b_init(&b, err);
    struct gs s = {.b = &b, .root = schema, .r_char = -1, .r_any = -1};
    int32_t top = gram_b_rule(&b);
    int32_t call = gram_b_rule(&b);
    int32_t val = gs_rule(&s, schema, "");
    struct gram_frag one = gram_f_seq(&b, gs_lit(&s, c->open ? c->open : ""), gram_f_call(&b, val));
    gram_b_rule_body(&b, call, gram_f_seq(&b, one, gs_lit(&s, c->close ? c->close : "")));
    struct gram_frag f = gram_f_seq(&b, gs_lit(&s, c->lead ? c->lead : ""), gram_f_call(&b, call));
    if (c->many) {
        struct gs_call_ctx cc = {c->sep, call};
        f = gram_f_seq(&b, f, gs_rep(&s, gs_emit_more_call, &cc, 0, c->max_calls > 0 ? c->max_calls - 1 : -1));
    }
    gram_b_rule_body(&b, top, f);
    int rc = gram_b_finish(&b, out);
    if (rc && err && !strncmp(err->msg, "regex:", 6)) cairn_err_prefix(err, "json schema 'pattern'");
    free(s.memo);
    gram_b_free(&b);
    return rc;
}

int grammar_from_json_schema_wrapped(const json_t *schema, const char *prefix, const char *suffix,
                                     struct grammar **out, struct cairn_err *err)
{
    struct grammar_calls c = {.open = prefix, .close = suffix};
    return grammar_from_json_schema_calls(schema, &c, out, err);
}

int grammar_from_json_schema(const json_t *schema, struct grammar **out, struct cairn_err *err)
{
    return grammar_from_json_schema_wrapped(schema, NULL, NULL, out, err);
}
