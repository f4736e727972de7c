/* JSON Schema numbers -> grammar (part of grammar_schema.c's compiler; see grammar_schema_int.h).
 * Integer parts come from a decimal range automaton over the bounds, with multipleOf as a
 * remainder automaton per length; fractions only where the whole interval [I, I+1) stays inside
 * the bounds (a subset of the allowed numbers, never a value outside them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_schema_int.h"

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

struct gram_frag gram_schema_number(struct gs *s, const json_t *node, int integer)
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
