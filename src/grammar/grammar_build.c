/* The grammar builder: states and edges, fragments, codepoint ranges as UTF-8 byte paths, and
 * gram_b_finish (epsilon removal, left-recursion check, packing). See grammar_int.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

void gram_b_init(struct gram_builder *b, struct cairn_err *err)
{
    memset(b, 0, sizeof(*b));
    b->err = err;
}

void gram_b_free(struct gram_builder *b)
{
    for (int i = 0; i < b->n_st; i++) free(b->st[i].e);
    free(b->st);
    free(b->rule_start);
    free(b->rule_end);
    memset(b, 0, sizeof(*b));
}

int gram_b_fail(struct gram_builder *b, int status, const char *fmt, ...)
{
    if (b->failed) return b->fail_status;
    b->failed = 1;
    b->fail_status = status;
    if (b->err) {
        char msg[sizeof(b->err->msg)];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        cairn_err_set(b->err, status, "%s", msg);
    }
    return status;
}

int gram_b_reparse(struct gram_builder *b, size_t len)
{
    if (b->failed) return b->fail_status;
    b->reparsed += len;
    if (b->reparsed > GRAM_MAX_REPARSE)
        return gram_b_fail(b, CAIRN_ERR_LIMIT, "grammar: repeat counts expand the pattern past %d bytes (nested {m,n}?)",
                           GRAM_MAX_REPARSE);
    return 0;
}

int32_t gram_b_state(struct gram_builder *b)
{
    if (b->failed) return 0;
    if (b->n_st >= GRAM_MAX_STATES) {
        gram_b_fail(b, CAIRN_ERR_LIMIT, "grammar: more than %d states (bounds too large?)", GRAM_MAX_STATES);
        return 0;
    }
    if (b->n_st == b->cap_st) {
        int cap = b->cap_st ? b->cap_st * 2 : 256;
        struct gram_bstate *p = realloc(b->st, (size_t)cap * sizeof(*p));
        if (!p) {
            gram_b_fail(b, CAIRN_ERR_NOMEM, "grammar: out of memory");
            return 0;
        }
        b->st = p;
        b->cap_st = cap;
    }
    memset(&b->st[b->n_st], 0, sizeof(b->st[0]));
    return b->n_st++;
}

static void gram_b_edge(struct gram_builder *b, int32_t from, struct gram_bedge e)
{
    if (b->failed) return;
    struct gram_bstate *s = &b->st[from];
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 2;
        struct gram_bedge *p = realloc(s->e, (size_t)cap * sizeof(*p));
        if (!p) {
            gram_b_fail(b, CAIRN_ERR_NOMEM, "grammar: out of memory");
            return;
        }
        s->e = p;
        s->cap = cap;
    }
    s->e[s->n++] = e;
}

void gram_b_eps(struct gram_builder *b, int32_t from, int32_t to)
{
    gram_b_edge(b, from, (struct gram_bedge){.kind = GRAM_EDGE_EPS, .to = to});
}

void gram_b_byte(struct gram_builder *b, int32_t from, int32_t to, uint8_t lo, uint8_t hi)
{
    gram_b_edge(b, from, (struct gram_bedge){.kind = GRAM_EDGE_BYTE, .lo = lo, .hi = hi, .to = to});
}

void gram_b_call(struct gram_builder *b, int32_t from, int32_t to, int32_t rule)
{
    gram_b_edge(b, from, (struct gram_bedge){.kind = GRAM_EDGE_CALL, .rule = rule, .to = to});
}

int32_t gram_b_rule(struct gram_builder *b)
{
    if (b->failed) return 0;
    if (b->n_rules >= GRAM_MAX_RULES) {
        gram_b_fail(b, CAIRN_ERR_LIMIT, "grammar: more than %d rules", GRAM_MAX_RULES);
        return 0;
    }
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 16;
        int32_t *s = realloc(b->rule_start, (size_t)cap * sizeof(int32_t));
        if (s) b->rule_start = s;
        int32_t *e = realloc(b->rule_end, (size_t)cap * sizeof(int32_t));
        if (e) b->rule_end = e;
        if (!s || !e) {
            gram_b_fail(b, CAIRN_ERR_NOMEM, "grammar: out of memory");
            return 0;
        }
        b->cap_rules = cap;
    }
    int32_t s = gram_b_state(b), e = gram_b_state(b);
    if (b->failed) return 0;
    b->rule_start[b->n_rules] = s;
    b->rule_end[b->n_rules] = e;
    return b->n_rules++;
}

void gram_b_rule_body(struct gram_builder *b, int32_t r, struct gram_frag body)
{
    if (b->failed) return;
    gram_b_eps(b, b->rule_start[r], body.s);
    gram_b_eps(b, body.e, b->rule_end[r]);
}

/* ---- fragments ---- */

struct gram_frag gram_f_empty(struct gram_builder *b)
{
    int32_t s = gram_b_state(b);
    return (struct gram_frag){s, s};
}

struct gram_frag gram_f_range(struct gram_builder *b, uint8_t lo, uint8_t hi)
{
    int32_t s = gram_b_state(b), e = gram_b_state(b);
    gram_b_byte(b, s, e, lo, hi);
    return (struct gram_frag){s, e};
}

struct gram_frag gram_f_bytes(struct gram_builder *b, const void *p, size_t n)
{
    const uint8_t *u = p;
    int32_t s = gram_b_state(b), cur = s;
    for (size_t i = 0; i < n && !b->failed; i++) {
        int32_t nx = gram_b_state(b);
        gram_b_byte(b, cur, nx, u[i], u[i]);
        cur = nx;
    }
    return (struct gram_frag){s, cur};
}

struct gram_frag gram_f_call(struct gram_builder *b, int32_t rule)
{
    int32_t s = gram_b_state(b), e = gram_b_state(b);
    gram_b_call(b, s, e, rule);
    return (struct gram_frag){s, e};
}

struct gram_frag gram_f_seq(struct gram_builder *b, struct gram_frag x, struct gram_frag y)
{
    gram_b_eps(b, x.e, y.s);
    return (struct gram_frag){x.s, y.e};
}

/* alt(alt(a, b), c) joins c to the inner pair of states instead of nesting a new one: a chain of
 * n nested pairs gives epsilon closures of up to n states each, n^2 for an n-way alternation
 * (GRAM_MAX_WORK would refuse a 3000-value enum). Only while x is an alternation nothing has
 * been joined after (no edge leaves its exit). */
struct gram_frag gram_f_alt(struct gram_builder *b, struct gram_frag x, struct gram_frag y)
{
    if (!b->failed && b->st[x.s].alt_end == x.e + 1 && b->st[x.e].n == 0) {
        gram_b_eps(b, x.s, y.s);
        gram_b_eps(b, y.e, x.e);
        return x;
    }
    int32_t s = gram_b_state(b), e = gram_b_state(b);
    gram_b_eps(b, s, x.s);
    gram_b_eps(b, s, y.s);
    gram_b_eps(b, x.e, e);
    gram_b_eps(b, y.e, e);
    if (!b->failed) b->st[s].alt_end = e + 1;
    return (struct gram_frag){s, e};
}

struct gram_frag gram_f_opt(struct gram_builder *b, struct gram_frag x)
{
    int32_t s = gram_b_state(b), e = gram_b_state(b);
    gram_b_eps(b, s, x.s);
    gram_b_eps(b, s, e);
    gram_b_eps(b, x.e, e);
    return (struct gram_frag){s, e};
}

struct gram_frag gram_f_star(struct gram_builder *b, struct gram_frag x)
{
    int32_t s = gram_b_state(b), e = gram_b_state(b);
    gram_b_eps(b, s, x.s);
    gram_b_eps(b, s, e);
    gram_b_eps(b, x.e, s);
    return (struct gram_frag){s, e};
}

/* ---- codepoints as UTF-8 ---- */

static int gram_utf8_enc(uint32_t c, uint8_t *o)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* Adds the byte paths of [lo, hi] (same encoded length after splitting) between s and e. */
static void gram_utf8_range(struct gram_builder *b, int32_t s, int32_t e, uint32_t lo, uint32_t hi)
{
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            gram_utf8_range(b, s, e, lo, bounds[i]);
            gram_utf8_range(b, s, e, bounds[i] + 1, hi);
            return;
        }
    uint8_t a[4], z[4];
    int n = gram_utf8_enc(lo, a);
    gram_utf8_enc(hi, z);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                gram_utf8_range(b, s, e, lo, lo | m);
                gram_utf8_range(b, s, e, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                gram_utf8_range(b, s, e, lo, (hi & ~m) - 1);
                gram_utf8_range(b, s, e, hi & ~m, hi);
                return;
            }
        }
    }
    int32_t cur = s;
    for (int i = 0; i < n && !b->failed; i++) {
        int32_t nx = i == n - 1 ? e : gram_b_state(b);
        gram_b_byte(b, cur, nx, a[i], z[i]);
        cur = nx;
    }
}

static int gram_cmp_u32pair(const void *x, const void *y)
{
    const uint32_t *a = x, *c = y;
    return a[0] < c[0] ? -1 : a[0] > c[0];
}

struct gram_frag gram_f_cps(struct gram_builder *b, const uint32_t *lo, const uint32_t *hi, int n)
{
    int32_t s = gram_b_state(b), e = gram_b_state(b);
    if (b->failed || n <= 0) return (struct gram_frag){s, e}; /* empty class: matches nothing */
    uint32_t(*r)[2] = malloc((size_t)n * 2 * sizeof(uint32_t) * 2);
    if (!r) {
        gram_b_fail(b, CAIRN_ERR_NOMEM, "grammar: out of memory");
        return (struct gram_frag){s, e};
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t a = lo[i], z = hi[i] > 0x10FFFF ? 0x10FFFF : hi[i];
        if (a > z) continue;
        /* drop the surrogates, which are not characters */
        if (a < 0xD800 && z >= 0xD800) {
            if (z > 0xDFFF) {
                r[m][0] = 0xE000;
                r[m][1] = z;
                m++;
            }
            z = 0xD7FF;
        } else if (a >= 0xD800 && a <= 0xDFFF) {
            if (z <= 0xDFFF) continue;
            a = 0xE000;
        }
        r[m][0] = a;
        r[m][1] = z;
        m++;
    }
    qsort(r, (size_t)m, sizeof(r[0]), gram_cmp_u32pair);
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k && r[i][0] <= r[k - 1][1] + 1) {
            if (r[i][1] > r[k - 1][1]) r[k - 1][1] = r[i][1];
        } else {
            r[k][0] = r[i][0];
            r[k][1] = r[i][1];
            k++;
        }
    }
    for (int i = 0; i < k && !b->failed; i++) gram_utf8_range(b, s, e, r[i][0], r[i][1]);
    free(r);
    return (struct gram_frag){s, e};
}

/* ---- finish ---- */

struct gram_fin {
    struct gram_builder *b;
    int32_t *stack, *mark; /* closure DFS */
    int32_t stamp;
    int32_t *clo;          /* closure members */
    int n_clo;
    long work;             /* closure members and edges copied so far, up to GRAM_MAX_WORK */
};

/* Returns 0, or -1 once the closures of all states so far have more than GRAM_MAX_WORK members:
 * a run of n nullable parts (a?a?a?... or (a?){n}) has closures of n states each, n^2 in all. */
static int gram_closure(struct gram_fin *f, int32_t s)
{
    struct gram_builder *b = f->b;
    f->stamp++;
    f->n_clo = 0;
    int sp = 0;
    f->stack[sp++] = s;
    f->mark[s] = f->stamp;
    while (sp) {
        int32_t x = f->stack[--sp];
        f->clo[f->n_clo++] = x;
        if (++f->work > GRAM_MAX_WORK) return -1;
        const struct gram_bstate *st = &b->st[x];
        for (int i = 0; i < st->n; i++)
            if (st->e[i].kind == GRAM_EDGE_EPS && f->mark[st->e[i].to] != f->stamp) {
                f->mark[st->e[i].to] = f->stamp;
                f->stack[sp++] = st->e[i].to;
            }
    }
    return 0;
}

static int gram_cmp_edge(const void *x, const void *y)
{
    const struct gram_edge *a = x, *c = y;
    if (a->lo != c->lo) return a->lo < c->lo ? -1 : 1;
    if (a->hi != c->hi) return a->hi < c->hi ? -1 : 1;
    return a->to < c->to ? -1 : a->to > c->to;
}

static int gram_cmp_call(const void *x, const void *y)
{
    const struct gram_call *a = x, *c = y;
    if (a->rule != c->rule) return a->rule < c->rule ? -1 : 1;
    return a->ret < c->ret ? -1 : a->ret > c->ret;
}

void grammar_free(struct grammar *g)
{
    if (!g) return;
    if (__atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    free(g->be_off);
    free(g->be);
    free(g->ce_off);
    free(g->ce);
    free(g->final);
    free(g->rule_start);
    free(g->lazy);
    free(g);
}

struct grammar *grammar_retain(struct grammar *g)
{
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
    return g;
}

int grammar_n_states(const struct grammar *g) { return g->n_states; }

/* Left recursion: a rule that can reach a call of itself without consuming a byte would push
 * frames forever. nullable(r): the rule can end without a byte. Then, from each rule's start,
 * follow calls (and past nullable ones) without bytes; reaching the rule itself is an error. */
static int gram_check_left(struct grammar *g, struct cairn_err *err)
{
    int R = g->n_rules, S = g->n_states;
    int rc = CAIRN_OK;
    uint8_t *nullable = calloc((size_t)R, 1);
    int32_t *stack = malloc((size_t)S * sizeof(int32_t));
    int32_t *mark = calloc((size_t)S, sizeof(int32_t));
    if (!nullable || !stack || !mark) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar: out of memory");
        goto cleanup;
    }
    /* fixpoint: r nullable if some byte-free path of (nullable calls) leads start -> final */
    int32_t stamp = 0;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < R; r++) {
            if (nullable[r]) continue;
            stamp++;
            int sp = 0;
            stack[sp++] = g->rule_start[r];
            mark[g->rule_start[r]] = stamp;
            while (sp && !nullable[r]) {
                int32_t x = stack[--sp];
                if (g->final[x]) {
                    nullable[r] = 1;
                    changed = 1;
                    break;
                }
                for (int i = g->ce_off[x]; i < g->ce_off[x + 1]; i++)
                    if (nullable[g->ce[i].rule] && mark[g->ce[i].ret] != stamp) {
                        mark[g->ce[i].ret] = stamp;
                        stack[sp++] = g->ce[i].ret;
                    }
            }
        }
    }
    /* rule graph of left calls, DFS per rule */
    for (int r = 0; r < R && !rc; r++) {
        stamp++;
        int sp = 0;
        stack[sp++] = g->rule_start[r];
        mark[g->rule_start[r]] = stamp;
        while (sp && !rc) {
            int32_t x = stack[--sp];
            for (int i = g->ce_off[x]; i < g->ce_off[x + 1]; i++) {
                int32_t q = g->ce[i].rule;
                if (q == r) {
                    rc = cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                                       "grammar: rule %d is left-recursive (it can call itself before any byte)", r);
                    break;
                }
                int32_t to[2] = {g->rule_start[q], nullable[q] ? g->ce[i].ret : -1};
                for (int k = 0; k < 2; k++)
                    if (to[k] >= 0 && mark[to[k]] != stamp) {
                        mark[to[k]] = stamp;
                        stack[sp++] = to[k];
                    }
            }
        }
    }
cleanup:
    free(nullable);
    free(stack);
    free(mark);
    return rc;
}

int gram_b_finish(struct gram_builder *b, struct grammar **out)
{
    *out = NULL;
    if (b->failed) return b->fail_status;
    if (b->n_rules == 0) return gram_b_fail(b, CAIRN_ERR_INVALID, "grammar: no rules");
    for (int r = 0; r < b->n_rules; r++) b->st[b->rule_end[r]].final = 1;
    int S = b->n_st;
    struct gram_fin f = {.b = b};
    f.stack = malloc((size_t)S * sizeof(int32_t));
    f.mark = calloc((size_t)S, sizeof(int32_t));
    f.clo = malloc((size_t)S * sizeof(int32_t));
    struct grammar *g = calloc(1, sizeof(*g));
    size_t cap_be = 64, cap_ce = 16, n_be = 0, n_ce = 0;
    int rc = CAIRN_OK;
    if (g) {
        g->refs = 1;
        g->n_states = S;
        g->n_rules = b->n_rules;
        g->be_off = malloc((size_t)(S + 1) * sizeof(int32_t));
        g->ce_off = malloc((size_t)(S + 1) * sizeof(int32_t));
        g->final = calloc((size_t)S, 1);
        g->rule_start = malloc((size_t)b->n_rules * sizeof(int32_t));
        g->be = malloc(cap_be * sizeof(*g->be));
        g->ce = malloc(cap_ce * sizeof(*g->ce));
    }
    if (!g || !f.stack || !f.mark || !f.clo || !g->be_off || !g->ce_off || !g->final || !g->rule_start ||
        !g->be || !g->ce) {
        rc = gram_b_fail(b, CAIRN_ERR_NOMEM, "grammar: out of memory");
        goto cleanup;
    }
    memcpy(g->rule_start, b->rule_start, (size_t)b->n_rules * sizeof(int32_t));
    for (int32_t s = 0; s < S; s++) {
        if (gram_closure(&f, s)) goto toolarge;
        g->be_off[s] = (int32_t)n_be;
        g->ce_off[s] = (int32_t)n_ce;
        size_t be0 = n_be, ce0 = n_ce;
        for (int k = 0; k < f.n_clo; k++) {
            const struct gram_bstate *st = &b->st[f.clo[k]];
            if (st->final) g->final[s] = 1;
            if ((f.work += st->n) > GRAM_MAX_WORK) goto toolarge;
            for (int i = 0; i < st->n; i++) {
                const struct gram_bedge *e = &st->e[i];
                if (e->kind == GRAM_EDGE_BYTE) {
                    if (n_be == cap_be) {
                        struct gram_edge *p = realloc(g->be, cap_be * 2 * sizeof(*p));
                        if (!p) goto nomem;
                        g->be = p;
                        cap_be *= 2;
                    }
                    g->be[n_be++] = (struct gram_edge){e->lo, e->hi, e->to};
                } else if (e->kind == GRAM_EDGE_CALL) {
                    if (n_ce == cap_ce) {
                        struct gram_call *p = realloc(g->ce, cap_ce * 2 * sizeof(*p));
                        if (!p) goto nomem;
                        g->ce = p;
                        cap_ce *= 2;
                    }
                    g->ce[n_ce++] = (struct gram_call){e->rule, e->to};
                }
            }
        }
        /* sorted and deduplicated, so equal states have equal edge lists */
        qsort(g->be + be0, n_be - be0, sizeof(*g->be), gram_cmp_edge);
        qsort(g->ce + ce0, n_ce - ce0, sizeof(*g->ce), gram_cmp_call);
        size_t w = be0;
        for (size_t i = be0; i < n_be; i++)
            if (w == be0 || gram_cmp_edge(&g->be[w - 1], &g->be[i])) g->be[w++] = g->be[i];
        n_be = w;
        w = ce0;
        for (size_t i = ce0; i < n_ce; i++)
            if (w == ce0 || gram_cmp_call(&g->ce[w - 1], &g->ce[i])) g->ce[w++] = g->ce[i];
        n_ce = w;
    }
    g->be_off[S] = (int32_t)n_be;
    g->ce_off[S] = (int32_t)n_ce;
    rc = gram_check_left(g, b->err);
    if (rc) {
        b->failed = 1;
        b->fail_status = rc;
    }
    goto cleanup;
toolarge:
    rc = gram_b_fail(b, CAIRN_ERR_LIMIT, "grammar: more than %d states and edges after removing the epsilons "
                     "(too many optional parts in a row?)", GRAM_MAX_WORK);
    goto cleanup;
nomem:
    rc = gram_b_fail(b, CAIRN_ERR_NOMEM, "grammar: out of memory");
cleanup:
    free(f.stack);
    free(f.mark);
    free(f.clo);
    if (rc) grammar_free(g);
    else *out = g;
    return rc;
}
