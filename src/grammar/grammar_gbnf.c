/* GBNF (llama.cpp's grammar text) -> grammar. `root` is the start rule (builder rule 0); names
 * may be used before they are defined; a quantified item is emitted once per copy by parsing its
 * span again (as the regex compiler does). Classes use the regex class syntax. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

#define GG_MAX_REPEAT 10000

struct gg_name {
    char *name;
    int32_t rule;
    int defined;
    size_t len;
};

struct gg {
    struct gram_builder *b;
    const char *s;
    size_t n, i;
    struct gg_name *names;
    int n_names, cap_names;
    int32_t *slot;     /* open addressing over names: index + 1, 0 = empty; n_slot a power of 2 */
    int n_slot;
    int depth;
};

static int gg_fail(struct gg *g, int status, const char *what)
{
    return gram_b_fail(g->b, status, "gbnf: %s at offset %zu", what, g->i);
}

static int gg_is_name(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static void gg_skip(struct gg *g)
{
    while (g->i < g->n) {
        char c = g->s[g->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') g->i++;
        else if (c == '#') {
            while (g->i < g->n && g->s[g->i] != '\n') g->i++;
        } else
            break;
    }
}

static uint32_t gg_hash(const char *s, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* Doubles the name index (load <= 1/2). Returns 0, or -1 out of memory. */
static int gg_index_grow(struct gg *g)
{
    int n = g->n_slot ? g->n_slot * 2 : 64;
    int32_t *slot = calloc((size_t)n, sizeof(int32_t));
    if (!slot) return -1;
    for (int k = 0; k < g->n_names; k++) {
        uint32_t at = gg_hash(g->names[k].name, g->names[k].len) & (uint32_t)(n - 1);
        while (slot[at]) at = (at + 1) & (uint32_t)(n - 1);
        slot[at] = k + 1;
    }
    free(g->slot);
    g->slot = slot;
    g->n_slot = n;
    return 0;
}

/* Rule id for name s[0..len), created on first use. Hashed: a grammar of n rules was n^2
 * string compares (20 k rules, 15 s under ASan). */
static int32_t gg_rule(struct gg *g, const char *s, size_t len, int define)
{
    if ((g->n_names + 1) * 2 > g->n_slot && gg_index_grow(g)) {
        gram_b_fail(g->b, CAIRN_ERR_NOMEM, "gbnf: out of memory");
        return 0;
    }
    uint32_t at = gg_hash(s, len) & (uint32_t)(g->n_slot - 1);
    for (; g->slot[at]; at = (at + 1) & (uint32_t)(g->n_slot - 1)) {
        struct gg_name *nm = &g->names[g->slot[at] - 1];
        if (nm->len == len && !memcmp(nm->name, s, len)) {
            if (define && nm->defined) {
                gg_fail(g, CAIRN_ERR_INVALID, "rule defined twice");
                return 0;
            }
            if (define) nm->defined = 1;
            return nm->rule;
        }
    }
    if (g->n_names == g->cap_names) {
        int cap = g->cap_names ? g->cap_names * 2 : 16;
        struct gg_name *p = realloc(g->names, (size_t)cap * sizeof(*p));
        if (!p) {
            gram_b_fail(g->b, CAIRN_ERR_NOMEM, "gbnf: out of memory");
            return 0;
        }
        g->names = p;
        g->cap_names = cap;
    }
    char *nm = strndup(s, len);
    if (!nm) {
        gram_b_fail(g->b, CAIRN_ERR_NOMEM, "gbnf: out of memory");
        return 0;
    }
    int32_t r = gram_b_rule(g->b);
    g->slot[at] = g->n_names + 1;
    g->names[g->n_names++] = (struct gg_name){nm, r, define, len};
    return r;
}

/* 1 if a `name ::=` starts at the cursor (a new rule). */
static int gg_at_rule_start(struct gg *g)
{
    size_t j = g->i;
    while (j < g->n && gg_is_name(g->s[j])) j++;
    if (j == g->i) return 0;
    while (j < g->n && (g->s[j] == ' ' || g->s[j] == '\t' || g->s[j] == '\n' || g->s[j] == '\r')) j++;
    return j + 3 <= g->n && !memcmp(g->s + j, "::=", 3);
}

static int gg_hex(struct gg *g, int digits, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < digits; k++) {
        if (g->i >= g->n) return gg_fail(g, CAIRN_ERR_INVALID, "short escape");
        char c = g->s[g->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return gg_fail(g, CAIRN_ERR_INVALID, "bad hex digit");
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

static int gg_literal(struct gg *g, struct gram_frag *out)
{
    struct gram_builder *b = g->b;
    struct gram_frag f = gram_f_empty(b);
    g->i++; /* " */
    while (g->i < g->n && g->s[g->i] != '"' && !b->failed) {
        char c = g->s[g->i++];
        if (c != '\\') {
            f = gram_f_seq(b, f, gram_f_bytes(b, &c, 1));
            continue;
        }
        if (g->i >= g->n) return gg_fail(g, CAIRN_ERR_INVALID, "trailing backslash");
        char e = g->s[g->i++];
        uint32_t v;
        switch (e) {
        case 'n': v = '\n'; break;
        case 't': v = '\t'; break;
        case 'r': v = '\r'; break;
        case 'x': if (gg_hex(g, 2, &v)) return -1; break;
        case 'u': if (gg_hex(g, 4, &v)) return -1; break;
        case 'U': if (gg_hex(g, 8, &v)) return -1; break;
        default: v = (uint8_t)e;
        }
        uint32_t lo = v, hi = v;
        if (e == 'x') {
            uint8_t byte = (uint8_t)v;
            f = gram_f_seq(b, f, gram_f_bytes(b, &byte, 1));
        } else {
            f = gram_f_seq(b, f, gram_f_cps(b, &lo, &hi, 1));
        }
    }
    if (g->i >= g->n) return gg_fail(g, CAIRN_ERR_INVALID, "unterminated literal");
    g->i++;
    *out = f;
    return b->failed ? b->fail_status : 0;
}

static int gg_alts(struct gg *g, struct gram_frag *out);

static int gg_item(struct gg *g, struct gram_frag *out)
{
    struct gram_builder *b = g->b;
    char c = g->s[g->i];
    if (c == '"') return gg_literal(g, out);
    if (c == '[') {
        g->i++;
        return gram_regex_class(b, g->s, g->n, &g->i, out);
    }
    if (c == '.') {
        g->i++;
        uint32_t lo = 0, hi = 0x10FFFF;
        *out = gram_f_cps(b, &lo, &hi, 1);
        return b->failed ? b->fail_status : 0;
    }
    if (c == '(') {
        g->i++;
        if (++g->depth > 200) return gg_fail(g, CAIRN_ERR_LIMIT, "groups nested too deep");
        int rc = gg_alts(g, out);
        g->depth--;
        if (rc) return rc;
        gg_skip(g);
        if (g->i >= g->n || g->s[g->i] != ')') return gg_fail(g, CAIRN_ERR_INVALID, "missing ')'");
        g->i++;
        return 0;
    }
    if (gg_is_name(c)) {
        size_t j = g->i;
        while (g->i < g->n && gg_is_name(g->s[g->i])) g->i++;
        *out = gram_f_call(b, gg_rule(g, g->s + j, g->i - j, 0));
        return b->failed ? b->fail_status : 0;
    }
    return gg_fail(g, CAIRN_ERR_INVALID, "unexpected character");
}

static int gg_num(struct gg *g, long *v)
{
    gg_skip(g);
    if (g->i >= g->n || g->s[g->i] < '0' || g->s[g->i] > '9') return gg_fail(g, CAIRN_ERR_INVALID, "expected a number");
    long x = 0;
    while (g->i < g->n && g->s[g->i] >= '0' && g->s[g->i] <= '9') {
        x = x * 10 + (g->s[g->i++] - '0');
        if (x > GG_MAX_REPEAT) return gg_fail(g, CAIRN_ERR_LIMIT, "repeat count too large");
    }
    *v = x;
    return 0;
}

static int gg_piece(struct gg *g, struct gram_frag *out)
{
    struct gram_builder *b = g->b;
    size_t a0 = g->i;
    struct gram_frag x;
    int rc = gg_item(g, &x);
    if (rc) return rc;
    if (g->i >= g->n) {
        *out = x;
        return 0;
    }
    char q = g->s[g->i];
    long lo, hi;
    if (q == '*') lo = 0, hi = -1;
    else if (q == '+') lo = 1, hi = -1;
    else if (q == '?') lo = 0, hi = 1;
    else if (q == '{') {
        g->i++;
        if (gg_num(g, &lo)) return -1;
        gg_skip(g);
        hi = lo;
        if (g->i < g->n && g->s[g->i] == ',') {
            g->i++;
            gg_skip(g);
            hi = -1;
            if (g->i < g->n && g->s[g->i] != '}' && gg_num(g, &hi)) return -1;
            gg_skip(g);
        }
        if (g->i >= g->n || g->s[g->i] != '}') return gg_fail(g, CAIRN_ERR_INVALID, "bad {m,n}");
        if (hi >= 0 && hi < lo) return gg_fail(g, CAIRN_ERR_INVALID, "{m,n} with n < m");
    } else {
        *out = x;
        return 0;
    }
    g->i++;
    size_t after = g->i;
    int used = 0;
    struct gram_frag c, res = gram_f_empty(b);
#define GG_COPY()                                                                                  \
    do {                                                                                           \
        if (!used) {                                                                               \
            c = x;                                                                                 \
            used = 1;                                                                              \
        } else {                                                                                   \
            if ((rc = gram_b_reparse(b, after - a0))) return rc;                                   \
            g->i = a0;                                                                             \
            if ((rc = gg_item(g, &c))) return rc;                                                  \
        }                                                                                          \
    } while (0)
    for (long k = 0; k < lo && !b->failed; k++) {
        GG_COPY();
        res = gram_f_seq(b, res, c);
    }
    if (hi < 0) {
        GG_COPY();
        res = gram_f_seq(b, res, gram_f_star(b, c));
    } else if (hi > lo) {
        int32_t end = gram_b_state(b), cur = res.e;
        for (long k = lo; k < hi && !b->failed; k++) {
            GG_COPY();
            gram_b_eps(b, cur, end);
            gram_b_eps(b, cur, c.s);
            cur = c.e;
        }
        gram_b_eps(b, cur, end);
        res.e = end;
    }
#undef GG_COPY
    g->i = after;
    *out = res;
    return b->failed ? b->fail_status : 0;
}

static int gg_seq(struct gg *g, struct gram_frag *out)
{
    struct gram_frag f = gram_f_empty(g->b);
    for (;;) {
        gg_skip(g);
        if (g->i >= g->n || g->s[g->i] == '|' || g->s[g->i] == ')' || gg_at_rule_start(g)) break;
        struct gram_frag p;
        int rc = gg_piece(g, &p);
        if (rc) return rc;
        f = gram_f_seq(g->b, f, p);
    }
    *out = f;
    return g->b->failed ? g->b->fail_status : 0;
}

static int gg_alts(struct gg *g, struct gram_frag *out)
{
    struct gram_frag f;
    int rc = gg_seq(g, &f);
    while (!rc && g->i < g->n && g->s[g->i] == '|') {
        g->i++;
        struct gram_frag h;
        rc = gg_seq(g, &h);
        if (!rc) f = gram_f_alt(g->b, f, h);
    }
    *out = f;
    return rc;
}

int grammar_from_gbnf(const char *text, size_t len, struct grammar **out, struct cairn_err *err)
{
    struct gram_builder b;
    gram_b_init(&b, err);
    *out = NULL;
    struct gg g = {.b = &b, .s = text, .n = len};
    gg_rule(&g, "root", 4, 0); /* rule 0 */
    int rc = 0;
    for (;;) {
        gg_skip(&g);
        if (g.i >= g.n || b.failed) break;
        if (!gg_at_rule_start(&g)) {
            rc = gg_fail(&g, CAIRN_ERR_INVALID, "expected 'name ::='");
            break;
        }
        size_t j = g.i;
        while (g.i < g.n && gg_is_name(g.s[g.i])) g.i++;
        int32_t r = gg_rule(&g, g.s + j, g.i - j, 1);
        gg_skip(&g);
        g.i += 3; /* ::= */
        struct gram_frag body;
        if ((rc = gg_alts(&g, &body))) break;
        gram_b_rule_body(&b, r, body);
        gg_skip(&g);
        if (g.i < g.n && g.s[g.i] == ')') {
            rc = gg_fail(&g, CAIRN_ERR_INVALID, "unbalanced ')'");
            break;
        }
    }
    for (int k = 0; k < g.n_names && !rc && !b.failed; k++)
        if (!g.names[k].defined) {
            char msg[160];
            snprintf(msg, sizeof(msg), "rule '%.100s' is used but not defined", g.names[k].name);
            rc = gram_b_fail(&b, CAIRN_ERR_INVALID, "gbnf: %s", msg);
        }
    if (!rc) rc = gram_b_finish(&b, out);
    for (int k = 0; k < g.n_names; k++) free(g.names[k].name);
    free(g.names);
    free(g.slot);
    gram_b_free(&b);
    return rc;
}
