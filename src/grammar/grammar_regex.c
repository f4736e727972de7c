/* Regex -> grammar fragment (the subset in grammar.h), and grammar_from_regex.
 *
 * Recursive descent straight into builder fragments. A quantified atom is emitted once per copy
 * it needs ({2,4} is two required copies and two nested optional ones) by parsing its source
 * span again, so no syntax tree is kept. Classes are codepoint ranges, emitted as UTF-8 byte
 * paths; in JSON-string mode '"', '\' and control characters become their JSON escapes. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

#define GRAM_RE_MAX_REPEAT 10000

struct gram_cpset {
    uint32_t *lo, *hi;
    int n, cap;
};

struct gram_re {
    struct gram_builder *b;
    const char *s;
    size_t n, i;
    int json;
    int depth;
};

static int gram_re_fail(struct gram_re *r, int status, const char *what)
{
    return gram_b_fail(r->b, status, "regex: %s at offset %zu", what, r->i);
}

static void gram_cps_add(struct gram_re *r, struct gram_cpset *c, uint32_t lo, uint32_t hi)
{
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 8;
        uint32_t *a = realloc(c->lo, (size_t)cap * sizeof(uint32_t));
        if (a) c->lo = a;
        uint32_t *z = realloc(c->hi, (size_t)cap * sizeof(uint32_t));
        if (z) c->hi = z;
        if (!a || !z) {
            gram_b_fail(r->b, CAIRN_ERR_NOMEM, "regex: out of memory");
            return;
        }
        c->cap = cap;
    }
    c->lo[c->n] = lo;
    c->hi[c->n] = hi;
    c->n++;
}

static void gram_cps_free(struct gram_cpset *c)
{
    free(c->lo);
    free(c->hi);
    memset(c, 0, sizeof(*c));
}

static int gram_cps_cmp(const void *x, const void *y)
{
    const uint32_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* Replaces c by its complement over [0, 0x10FFFF]. */
static void gram_cps_negate(struct gram_re *r, struct gram_cpset *c)
{
    uint32_t(*p)[2] = malloc(((size_t)c->n + 1) * sizeof(*p));
    if (!p) {
        gram_b_fail(r->b, CAIRN_ERR_NOMEM, "regex: out of memory");
        return;
    }
    for (int i = 0; i < c->n; i++) {
        p[i][0] = c->lo[i];
        p[i][1] = c->hi[i];
    }
    qsort(p, (size_t)c->n, sizeof(*p), gram_cps_cmp);
    int n = c->n;
    c->n = 0;
    uint32_t next = 0;
    for (int i = 0; i < n; i++) {
        if (p[i][0] > next) gram_cps_add(r, c, next, p[i][0] - 1);
        if (p[i][1] + 1 > next) next = p[i][1] + 1;
    }
    if (next <= 0x10FFFF) gram_cps_add(r, c, next, 0x10FFFF);
    free(p);
}

static int gram_cps_has(const struct gram_cpset *c, uint32_t x)
{
    for (int i = 0; i < c->n; i++)
        if (c->lo[i] <= x && x <= c->hi[i]) return 1;
    return 0;
}

/* The fragment of a codepoint set (JSON-escaped where needed). */
static struct gram_frag gram_re_emit_set(struct gram_re *r, struct gram_cpset *c)
{
    struct gram_builder *b = r->b;
    if (!r->json) return gram_f_cps(b, c->lo, c->hi, c->n);
    /* plain part: the set minus [0, 0x1F], '"' and '\' */
    struct gram_cpset plain = {0};
    for (int i = 0; i < c->n; i++) {
        uint32_t lo = c->lo[i] < 0x20 ? 0x20 : c->lo[i], hi = c->hi[i];
        while (lo <= hi && !b->failed) {
            uint32_t cut = lo <= 0x22 && hi >= 0x22 ? 0x22 : lo <= 0x5C && hi >= 0x5C ? 0x5C : 0x110000;
            if (cut == 0x110000) {
                gram_cps_add(r, &plain, lo, hi);
                break;
            }
            if (cut > lo) gram_cps_add(r, &plain, lo, cut - 1);
            lo = cut + 1;
        }
    }
    struct gram_frag f = gram_f_cps(b, plain.lo, plain.hi, plain.n);
    gram_cps_free(&plain);
    static const char hex[] = "0123456789abcdef";
    for (uint32_t x = 0; x < 0x5D && !b->failed; x++) {
        if (!(x < 0x20 || x == 0x22 || x == 0x5C) || !gram_cps_has(c, x)) continue;
        char e[7];
        size_t n = 2;
        e[0] = '\\';
        switch (x) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            memcpy(e + 1, "u00", 3);
            e[4] = hex[x >> 4];
            e[5] = hex[x & 15];
            n = 6;
        }
        f = gram_f_alt(b, f, gram_f_bytes(b, e, n));
    }
    return f;
}

/* One UTF-8 codepoint from the pattern. */
static uint32_t gram_re_cp(struct gram_re *r)
{
    const uint8_t *u = (const uint8_t *)r->s;
    uint8_t c = u[r->i];
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || r->i + (size_t)n > r->n) {
        gram_re_fail(r, CAIRN_ERR_INVALID, "invalid UTF-8");
        r->i = r->n;
        return 0;
    }
    uint32_t cp = n == 1 ? c : (uint32_t)(c & (0x7F >> n));
    for (int k = 1; k < n; k++) {
        if ((u[r->i + k] & 0xC0) != 0x80) {
            gram_re_fail(r, CAIRN_ERR_INVALID, "invalid UTF-8");
            r->i = r->n;
            return 0;
        }
        cp = cp << 6 | (u[r->i + k] & 0x3F);
    }
    r->i += (size_t)n;
    return cp;
}

static int gram_re_hex(struct gram_re *r, int digits, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        if (r->i >= r->n) return gram_re_fail(r, CAIRN_ERR_INVALID, "short hex escape");
        char c = r->s[r->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return gram_re_fail(r, CAIRN_ERR_INVALID, "bad hex digit");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* After a backslash: adds what it denotes to c. Returns 0, or <0. */
static int gram_re_escape(struct gram_re *r, struct gram_cpset *c)
{
    if (r->i >= r->n) return gram_re_fail(r, CAIRN_ERR_INVALID, "trailing backslash");
    char e = r->s[r->i++];
    uint32_t v;
    struct gram_cpset t = {0};
    switch (e) {
    case 'd': case 'D':
        gram_cps_add(r, &t, '0', '9');
        break;
    case 'w': case 'W':
        gram_cps_add(r, &t, '0', '9');
        gram_cps_add(r, &t, 'A', 'Z');
        gram_cps_add(r, &t, 'a', 'z');
        gram_cps_add(r, &t, '_', '_');
        break;
    case 's': case 'S':
        gram_cps_add(r, &t, '\t', '\r'); /* \t \n \v \f \r */
        gram_cps_add(r, &t, ' ', ' ');
        break;
    case 'n': gram_cps_add(r, c, '\n', '\n'); return 0;
    case 't': gram_cps_add(r, c, '\t', '\t'); return 0;
    case 'r': gram_cps_add(r, c, '\r', '\r'); return 0;
    case 'f': gram_cps_add(r, c, '\f', '\f'); return 0;
    case 'v': gram_cps_add(r, c, '\v', '\v'); return 0;
    case '0': gram_cps_add(r, c, 0, 0); return 0;
    case 'x':
        if (gram_re_hex(r, 2, &v)) return -1;
        gram_cps_add(r, c, v, v);
        return 0;
    case 'u':
        if (gram_re_hex(r, 4, &v)) return -1;
        gram_cps_add(r, c, v, v);
        return 0;
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9'))
            return gram_re_fail(r, CAIRN_ERR_UNSUPPORTED, "unsupported escape (backreference, \\b, \\p ...)");
        r->i--;
        v = gram_re_cp(r);
        gram_cps_add(r, c, v, v);
        return 0;
    }
    if (e >= 'A' && e <= 'Z') gram_cps_negate(r, &t);
    for (int k = 0; k < t.n; k++) gram_cps_add(r, c, t.lo[k], t.hi[k]);
    gram_cps_free(&t);
    return 0;
}

static int gram_re_class(struct gram_re *r, struct gram_cpset *c)
{
    int neg = 0;
    if (r->i < r->n && r->s[r->i] == '^') {
        neg = 1;
        r->i++;
    }
    int first = 1;
    while (r->i < r->n && (r->s[r->i] != ']' || first) && !r->b->failed) {
        first = 0;
        uint32_t lo;
        if (r->s[r->i] == '\\') {
            r->i++;
            struct gram_cpset one = {0};
            if (gram_re_escape(r, &one)) {
                gram_cps_free(&one);
                return -1;
            }
            if (one.n != 1 || one.lo[0] != one.hi[0]) { /* a class escape like \d */
                for (int k = 0; k < one.n; k++) gram_cps_add(r, c, one.lo[k], one.hi[k]);
                gram_cps_free(&one);
                continue;
            }
            lo = one.lo[0];
            gram_cps_free(&one);
        } else if (r->s[r->i] == '[' && r->i + 1 < r->n && r->s[r->i + 1] == ':') {
            return gram_re_fail(r, CAIRN_ERR_UNSUPPORTED, "POSIX classes are not supported");
        } else {
            lo = gram_re_cp(r);
        }
        uint32_t hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (r->s[r->i] == '\\') {
                r->i++;
                struct gram_cpset one = {0};
                if (gram_re_escape(r, &one)) {
                    gram_cps_free(&one);
                    return -1;
                }
                int ok = one.n == 1 && one.lo[0] == one.hi[0];
                hi = ok ? one.lo[0] : 0;
                gram_cps_free(&one);
                if (!ok) return gram_re_fail(r, CAIRN_ERR_INVALID, "bad class range");
            } else {
                hi = gram_re_cp(r);
            }
            if (hi < lo) return gram_re_fail(r, CAIRN_ERR_INVALID, "class range out of order");
        }
        gram_cps_add(r, c, lo, hi);
    }
    if (r->i >= r->n) return gram_re_fail(r, CAIRN_ERR_INVALID, "unterminated class");
    r->i++; /* ] */
    if (neg) gram_cps_negate(r, c);
    return 0;
}

static int gram_re_alt(struct gram_re *r, struct gram_frag *out);

/* One atom at r->i. */
static int gram_re_atom(struct gram_re *r, struct gram_frag *out)
{
    struct gram_builder *b = r->b;
    char c = r->s[r->i];
    struct gram_cpset set = {0};
    int rc = 0;
    if (c == '(') {
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':') r->i += 2;
            else return gram_re_fail(r, CAIRN_ERR_UNSUPPORTED, "lookaround, named groups and flags are not supported");
        }
        if (++r->depth > 200) return gram_re_fail(r, CAIRN_ERR_LIMIT, "groups nested too deep");
        rc = gram_re_alt(r, out);
        r->depth--;
        if (rc) return rc;
        if (r->i >= r->n || r->s[r->i] != ')') return gram_re_fail(r, CAIRN_ERR_INVALID, "missing ')'");
        r->i++;
        return 0;
    }
    if (c == '[') {
        r->i++;
        rc = gram_re_class(r, &set);
    } else if (c == '.') {
        r->i++;
        gram_cps_add(r, &set, '\n', '\n');
        gram_cps_negate(r, &set);
    } else if (c == '\\') {
        r->i++;
        rc = gram_re_escape(r, &set);
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return gram_re_fail(r, CAIRN_ERR_INVALID, "quantifier without an atom");
    } else if (c == '^' || c == '$') {
        return gram_re_fail(r, CAIRN_ERR_UNSUPPORTED, "anchors inside the pattern are not supported");
    } else {
        uint32_t cp = gram_re_cp(r);
        gram_cps_add(r, &set, cp, cp);
    }
    if (!rc && !b->failed) *out = gram_re_emit_set(r, &set);
    gram_cps_free(&set);
    return rc ? rc : b->failed ? b->fail_status : 0;
}

static int gram_re_num(struct gram_re *r, long *v)
{
    if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return -1;
    long x = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
        x = x * 10 + (r->s[r->i++] - '0');
        if (x > GRAM_RE_MAX_REPEAT) return gram_re_fail(r, CAIRN_ERR_LIMIT, "repeat count too large");
    }
    *v = x;
    return 0;
}

/* An atom and its quantifiers. */
static int gram_re_piece(struct gram_re *r, struct gram_frag *out)
{
    struct gram_builder *b = r->b;
    size_t a0 = r->i;
    struct gram_frag x;
    int rc = gram_re_atom(r, &x);
    if (rc) return rc;
    while (r->i < r->n && !b->failed) {
        char q = r->s[r->i];
        long lo, hi;
        if (q == '*') lo = 0, hi = -1;
        else if (q == '+') lo = 1, hi = -1;
        else if (q == '?') lo = 0, hi = 1;
        else if (q == '{') {
            size_t save = r->i;
            r->i++;
            if (gram_re_num(r, &lo)) {
                if (b->failed) return b->fail_status;
                r->i = save; /* a literal '{' */
                break;
            }
            hi = lo;
            if (r->i < r->n && r->s[r->i] == ',') {
                r->i++;
                hi = -1;
                if (r->i < r->n && r->s[r->i] != '}' && gram_re_num(r, &hi))
                    return b->failed ? b->fail_status : gram_re_fail(r, CAIRN_ERR_INVALID, "bad {m,n}");
            }
            if (r->i >= r->n || r->s[r->i] != '}') return gram_re_fail(r, CAIRN_ERR_INVALID, "bad {m,n}");
            if (hi >= 0 && hi < lo) return gram_re_fail(r, CAIRN_ERR_INVALID, "{m,n} with n < m");
        } else
            break;
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') r->i++; /* lazy: same language */
        if (r->i < r->n && r->s[r->i] == '+')
            return gram_re_fail(r, CAIRN_ERR_UNSUPPORTED, "possessive quantifiers are not supported");
        size_t after = r->i;
        /* copies of the atom: re-parse its span */
        struct gram_frag copy[1];
#define GRAM_RE_COPY(dst)                                                                          \
    do {                                                                                           \
        if ((rc = gram_b_reparse(b, after - a0))) return rc;                                       \
        r->i = a0;                                                                                 \
        if ((rc = gram_re_atom(r, &(dst)))) return rc;                                             \
    } while (0)
        struct gram_frag res = gram_f_empty(b);
        int used = 0; /* x (the first copy) consumed */
        for (long k = 0; k < lo && !b->failed; k++) {
            if (!used) {
                copy[0] = x;
                used = 1;
            } else
                GRAM_RE_COPY(copy[0]);
            res = gram_f_seq(b, res, copy[0]);
        }
        if (hi < 0) {
            if (!used) {
                copy[0] = x;
                used = 1;
            } else
                GRAM_RE_COPY(copy[0]);
            res = gram_f_seq(b, res, gram_f_star(b, copy[0]));
        } else if (hi > lo) {
            int32_t end = gram_b_state(b), cur = gram_b_state(b);
            gram_b_eps(b, res.e, cur);
            for (long k = lo; k < hi && !b->failed; k++) {
                if (!used) {
                    copy[0] = x;
                    used = 1;
                } else
                    GRAM_RE_COPY(copy[0]);
                gram_b_eps(b, cur, end);
                gram_b_eps(b, cur, copy[0].s);
                cur = copy[0].e;
            }
            gram_b_eps(b, cur, end);
            res.e = end;
        }
#undef GRAM_RE_COPY
        r->i = after;
        x = res;
        if (r->i < r->n && memchr("*+?{", r->s[r->i], 4))
            return gram_re_fail(r, CAIRN_ERR_UNSUPPORTED, "a quantifier after a quantifier (use a group)");
        break;
    }
    *out = x;
    return b->failed ? b->fail_status : 0;
}

static int gram_re_seq(struct gram_re *r, struct gram_frag *out)
{
    struct gram_frag f = gram_f_empty(r->b);
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        if (r->s[r->i] == '$' && r->i + 1 == r->n && r->depth == 0) { /* trailing anchor */
            r->i++;
            break;
        }
        struct gram_frag p;
        int rc = gram_re_piece(r, &p);
        if (rc) return rc;
        f = gram_f_seq(r->b, f, p);
    }
    *out = f;
    return r->b->failed ? r->b->fail_status : 0;
}

static int gram_re_alt(struct gram_re *r, struct gram_frag *out)
{
    struct gram_frag f;
    int rc = gram_re_seq(r, &f);
    while (!rc && r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        struct gram_frag g;
        rc = gram_re_seq(r, &g);
        if (!rc) f = gram_f_alt(r->b, f, g);
    }
    *out = f;
    return rc;
}

int gram_regex_emit(struct gram_builder *b, const char *re, size_t len, int json_string, struct gram_frag *out)
{
    struct gram_re r = {.b = b, .s = re, .n = len, .json = json_string};
    if (r.n && r.s[0] == '^') r.i = 1;
    int rc = gram_re_alt(&r, out);
    if (!rc && r.i < r.n) rc = gram_re_fail(&r, CAIRN_ERR_INVALID, "unbalanced ')'");
    return rc;
}

int gram_regex_class(struct gram_builder *b, const char *s, size_t n, size_t *i, struct gram_frag *out)
{
    struct gram_re r = {.b = b, .s = s, .n = n, .i = *i};
    struct gram_cpset set = {0};
    int rc = gram_re_class(&r, &set);
    if (!rc && !b->failed) *out = gram_re_emit_set(&r, &set);
    gram_cps_free(&set);
    *i = r.i;
    return rc ? rc : b->failed ? b->fail_status : 0;
}

int grammar_from_regex(const char *re, size_t len, struct grammar **out, struct cairn_err *err)
{
    struct gram_builder b;
    gram_b_init(&b, err);
    *out = NULL;
    int32_t root = gram_b_rule(&b);
    struct gram_frag f;
    int rc = gram_regex_emit(&b, re, len, 0, &f);
    if (!rc) {
        gram_b_rule_body(&b, root, f);
        rc = gram_b_finish(&b, out);
    }
    gram_b_free(&b);
    return rc;
}
