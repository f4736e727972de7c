/* tmpl parser: tokens -> AST (struct tmpl_node), a recursive-descent port of jinja2's parser
 * (same precedence: condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary <
 * postfix/filters/tests). Nesting is bounded by TMPL_MAX_PARSE_DEPTH. Also tmpl_compile. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl/tmpl_int.h"

struct tparser {
    struct tmpl_arena *a;
    const struct tmpl_token *t;
    size_t n, i;
    int depth;
    int loop_depth; /* for bodies we are in (macro / call bodies reset it): break/continue */
    struct cairn_err *err;
    jmp_buf jmp;
};

static void tparse_fail(struct tparser *P, int status, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

static void tparse_fail(struct tparser *P, int status, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cairn_err_set(P->err, status, "template syntax error: line %d: %s", P->t[P->i].line, msg);
    longjmp(P->jmp, 1);
}

static void *tparse_alloc(struct tparser *P, size_t n)
{
    void *p = tmpl_arena_alloc(P->a, n);
    if (!p) tparse_fail(P, CAIRN_ERR_NOMEM, "out of memory");
    return p;
}

static struct tmpl_node *tparse_node(struct tparser *P, enum tmpl_node_kind k)
{
    struct tmpl_node *n = tparse_alloc(P, sizeof(*n));
    n->kind = k;
    n->line = P->t[P->i].line;
    return n;
}

static const struct tmpl_token *tparse_cur(struct tparser *P) { return &P->t[P->i]; }

static const struct tmpl_token *tparse_next(struct tparser *P)
{
    const struct tmpl_token *t = &P->t[P->i];
    if (t->type != TMPL_T_EOF) P->i++;
    return t;
}

static int tparse_is_op(struct tparser *P, const char *op)
{
    const struct tmpl_token *t = tparse_cur(P);
    return t->type == TMPL_T_OP && strcmp(t->str, op) == 0;
}

static int tparse_is_name(struct tparser *P, const char *name)
{
    const struct tmpl_token *t = tparse_cur(P);
    return t->type == TMPL_T_NAME && strcmp(t->str, name) == 0;
}

static int tparse_skip_op(struct tparser *P, const char *op)
{
    if (!tparse_is_op(P, op)) return 0;
    P->i++;
    return 1;
}

static int tparse_skip_name(struct tparser *P, const char *name)
{
    if (!tparse_is_name(P, name)) return 0;
    P->i++;
    return 1;
}

static const char *tparse_describe(const struct tmpl_token *t)
{
    switch (t->type) {
    case TMPL_T_EOF: return "end of template";
    case TMPL_T_DATA: return "template data";
    case TMPL_T_VAR_BEGIN: return "begin of print statement";
    case TMPL_T_VAR_END: return "end of print statement";
    case TMPL_T_BLOCK_BEGIN: return "begin of statement block";
    case TMPL_T_BLOCK_END: return "end of statement block";
    case TMPL_T_STRING: return "string";
    case TMPL_T_INT: return "integer";
    case TMPL_T_FLOAT: return "float";
    default: return t->str;
    }
}

static void tparse_expect_op(struct tparser *P, const char *op)
{
    if (!tparse_skip_op(P, op))
        tparse_fail(P, CAIRN_ERR_FORMAT, "expected '%s', got '%s'", op, tparse_describe(tparse_cur(P)));
}

static const char *tparse_expect_name(struct tparser *P)
{
    const struct tmpl_token *t = tparse_cur(P);
    if (t->type != TMPL_T_NAME)
        tparse_fail(P, CAIRN_ERR_FORMAT, "expected a name, got '%s'", tparse_describe(t));
    P->i++;
    return t->str;
}

static void tparse_expect(struct tparser *P, enum tmpl_token_type type, const char *what)
{
    if (tparse_cur(P)->type != type)
        tparse_fail(P, CAIRN_ERR_FORMAT, "expected %s, got '%s'", what, tparse_describe(tparse_cur(P)));
    P->i++;
}

static void tparse_enter(struct tparser *P)
{
    if (++P->depth > TMPL_MAX_PARSE_DEPTH)
        tparse_fail(P, CAIRN_ERR_LIMIT, "template nested too deeply (limit %d)", TMPL_MAX_PARSE_DEPTH);
}

/* growable node vectors */
struct tvec {
    struct tmpl_node **p;
    size_t n, cap;
};

static void tvec_push(struct tparser *P, struct tvec *v, struct tmpl_node *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        struct tmpl_node **p = tparse_alloc(P, cap * sizeof(*p));
        if (v->n) memcpy(p, v->p, v->n * sizeof(*p));
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

static struct tmpl_node *tparse_expression(struct tparser *P, int with_condexpr);
static struct tmpl_node *tparse_unary(struct tparser *P, int with_filter);
static struct tmpl_node *tparse_primary(struct tparser *P);
static struct tmpl_node *tparse_postfix(struct tparser *P, struct tmpl_node *node);
static struct tmpl_node *tparse_filter_expr(struct tparser *P, struct tmpl_node *node);

static int tparse_is_tuple_end(struct tparser *P, const char *const *extra)
{
    const struct tmpl_token *t = tparse_cur(P);
    if (t->type == TMPL_T_VAR_END || t->type == TMPL_T_BLOCK_END || t->type == TMPL_T_EOF) return 1;
    if (t->type == TMPL_T_OP && strcmp(t->str, ")") == 0) return 1;
    for (; extra && *extra; extra++)
        if (t->type == TMPL_T_NAME && strcmp(t->str, *extra) == 0) return 1;
    return 0;
}

/* expr or expr, expr, ... (tuple). explicit: inside parentheses (empty tuple allowed). */
static struct tmpl_node *tparse_tuple(struct tparser *P, int simplified, int with_condexpr,
                                  const char *const *extra, int explicit)
{
    int line = tparse_cur(P)->line;
    struct tvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) tparse_expect_op(P, ",");
        if (tparse_is_tuple_end(P, extra)) break;
        struct tmpl_node *e;
        if (simplified) e = tparse_postfix(P, tparse_primary(P));
        else e = tparse_expression(P, with_condexpr);
        tvec_push(P, &items, e);
        if (tparse_is_op(P, ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.p[0];
        if (!explicit)
            tparse_fail(P, CAIRN_ERR_FORMAT, "expected an expression, got '%s'",
                        tparse_describe(tparse_cur(P)));
    }
    struct tmpl_node *n = tparse_node(P, TMPL_N_TUPLE);
    n->line = line;
    n->args = items.p;
    n->n_args = items.n;
    return n;
}

static void tparse_call_args(struct tparser *P, struct tmpl_node *n)
{
    tparse_expect_op(P, "(");
    struct tvec args = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t kw_cap = 0;
    while (!tparse_is_op(P, ")")) {
        if (args.n || kwv.n) {
            tparse_expect_op(P, ",");
            if (tparse_is_op(P, ")")) break;
        }
        if (tparse_is_op(P, "*") || tparse_is_op(P, "**"))
            tparse_fail(P, CAIRN_ERR_UNSUPPORTED, "*args / **kwargs in calls are not supported");
        const struct tmpl_token *t = tparse_cur(P);
        if (t->type == TMPL_T_NAME && P->t[P->i + 1].type == TMPL_T_OP && strcmp(P->t[P->i + 1].str, "=") == 0) {
            P->i += 2;
            if (kwv.n == kw_cap) {
                size_t cap = kw_cap ? kw_cap * 2 : 4;
                const char **k2 = tparse_alloc(P, cap * sizeof(*k2));
                if (kwv.n) memcpy(k2, kwn, kwv.n * sizeof(*k2));
                kwn = k2;
                kw_cap = cap;
            }
            kwn[kwv.n] = t->str;
            tvec_push(P, &kwv, tparse_expression(P, 1));
        } else {
            if (kwv.n) tparse_fail(P, CAIRN_ERR_FORMAT, "positional argument after keyword argument");
            tvec_push(P, &args, tparse_expression(P, 1));
        }
    }
    tparse_expect_op(P, ")");
    n->args = args.p;
    n->n_args = args.n;
    n->args2 = kwv.p;
    n->kwnames = kwn;
    n->n_kw = kwv.n;
}

/* dotted name for filters and tests (a.b) */
static const char *tparse_dotted(struct tparser *P)
{
    const char *name = tparse_expect_name(P);
    while (tparse_is_op(P, ".")) {
        P->i++;
        const char *part = tparse_expect_name(P);
        size_t l1 = strlen(name), l2 = strlen(part);
        char *c = tparse_alloc(P, l1 + l2 + 2);
        memcpy(c, name, l1);
        c[l1] = '.';
        memcpy(c + l1 + 1, part, l2);
        name = c;
    }
    return name;
}

static struct tmpl_node *tparse_filter(struct tparser *P, struct tmpl_node *node, int start_inline)
{
    while (tparse_is_op(P, "|") || start_inline) {
        if (!start_inline) P->i++;
        start_inline = 0;
        struct tmpl_node *f = tparse_node(P, TMPL_N_FILTER);
        f->str = tparse_dotted(P);
        f->a = node;
        if (tparse_is_op(P, "(")) tparse_call_args(P, f);
        node = f;
    }
    return node;
}

static struct tmpl_node *tparse_test(struct tparser *P, struct tmpl_node *node)
{
    P->i++; /* is */
    struct tmpl_node *t = tparse_node(P, TMPL_N_TEST);
    t->op = tparse_skip_name(P, "not");
    t->str = tparse_dotted(P);
    t->a = node;
    const struct tmpl_token *c = tparse_cur(P);
    if (tparse_is_op(P, "(")) {
        tparse_call_args(P, t);
    } else if ((c->type == TMPL_T_NAME || c->type == TMPL_T_STRING || c->type == TMPL_T_INT || c->type == TMPL_T_FLOAT ||
                tparse_is_op(P, "[") || tparse_is_op(P, "{")) &&
               !(c->type == TMPL_T_NAME && (!strcmp(c->str, "else") || !strcmp(c->str, "or") ||
                                       !strcmp(c->str, "and")))) {
        if (c->type == TMPL_T_NAME && !strcmp(c->str, "is"))
            tparse_fail(P, CAIRN_ERR_FORMAT, "You cannot chain multiple tests with is");
        struct tmpl_node *arg = tparse_postfix(P, tparse_primary(P));
        t->args = tparse_alloc(P, sizeof(*t->args));
        t->args[0] = arg;
        t->n_args = 1;
    }
    return t;
}

static struct tmpl_node *tparse_filter_expr(struct tparser *P, struct tmpl_node *node)
{
    for (;;) {
        if (tparse_is_op(P, "|")) {
            node = tparse_filter(P, node, 0);
        } else if (tparse_is_name(P, "is")) {
            node = tparse_test(P, node);
        } else if (tparse_is_op(P, "(")) {
            struct tmpl_node *c = tparse_node(P, TMPL_N_CALL);
            c->a = node;
            tparse_call_args(P, c);
            node = c;
        } else {
            return node;
        }
    }
}

static struct tmpl_node *tparse_subscribed(struct tparser *P)
{
    struct tmpl_node *parts[3] = {NULL, NULL, NULL};
    if (tparse_is_op(P, ":")) {
        P->i++;
    } else {
        struct tmpl_node *e = tparse_expression(P, 1);
        if (!tparse_is_op(P, ":")) return e;
        P->i++;
        parts[0] = e;
    }
    if (!tparse_is_op(P, "]") && !tparse_is_op(P, ",") && !tparse_is_op(P, ":"))
        parts[1] = tparse_expression(P, 1);
    if (tparse_skip_op(P, ":")) {
        if (!tparse_is_op(P, "]") && !tparse_is_op(P, ",")) parts[2] = tparse_expression(P, 1);
    }
    struct tmpl_node *s = tparse_node(P, TMPL_N_SLICE);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static struct tmpl_node *tparse_postfix(struct tparser *P, struct tmpl_node *node)
{
    for (;;) {
        if (tparse_is_op(P, ".")) {
            P->i++;
            const struct tmpl_token *t = tparse_next(P);
            if (t->type == TMPL_T_NAME) {
                struct tmpl_node *g = tparse_node(P, TMPL_N_GETATTR);
                g->a = node;
                g->str = t->str;
                node = g;
            } else if (t->type == TMPL_T_INT) {
                struct tmpl_node *g = tparse_node(P, TMPL_N_GETITEM);
                g->a = node;
                g->b = tparse_node(P, TMPL_N_LIT);
                g->b->lit = tmpl_tv_int(t->i);
                node = g;
            } else {
                P->i--;
                tparse_fail(P, CAIRN_ERR_FORMAT, "expected name or number after '.'");
            }
        } else if (tparse_is_op(P, "[")) {
            P->i++;
            tparse_enter(P);
            struct tvec items = {0};
            while (!tparse_is_op(P, "]")) {
                if (items.n) {
                    tparse_expect_op(P, ",");
                    if (tparse_is_op(P, "]")) break;
                }
                tvec_push(P, &items, tparse_subscribed(P));
            }
            tparse_expect_op(P, "]");
            P->depth--;
            if (items.n == 0) tparse_fail(P, CAIRN_ERR_FORMAT, "expected subscript expression");
            struct tmpl_node *key;
            if (items.n == 1) {
                key = items.p[0];
            } else {
                for (size_t k = 0; k < items.n; k++)
                    if (items.p[k]->kind == TMPL_N_SLICE)
                        tparse_fail(P, CAIRN_ERR_UNSUPPORTED, "multi-dimensional slicing is not supported");
                key = tparse_node(P, TMPL_N_TUPLE);
                key->args = items.p;
                key->n_args = items.n;
            }
            if (key->kind == TMPL_N_SLICE) {
                key->a = node;
                node = key;
            } else {
                struct tmpl_node *g = tparse_node(P, TMPL_N_GETITEM);
                g->a = node;
                g->b = key;
                node = g;
            }
        } else if (tparse_is_op(P, "(")) {
            struct tmpl_node *c = tparse_node(P, TMPL_N_CALL);
            c->a = node;
            tparse_call_args(P, c);
            node = c;
        } else {
            return node;
        }
    }
}

static struct tmpl_node *tparse_primary(struct tparser *P)
{
    tparse_enter(P);
    const struct tmpl_token *t = tparse_cur(P);
    struct tmpl_node *n = NULL;
    if (t->type == TMPL_T_NAME) {
        P->i++;
        n = tparse_node(P, TMPL_N_LIT);
        if (!strcmp(t->str, "true") || !strcmp(t->str, "True")) n->lit = tmpl_tv_bool(1);
        else if (!strcmp(t->str, "false") || !strcmp(t->str, "False")) n->lit = tmpl_tv_bool(0);
        else if (!strcmp(t->str, "none") || !strcmp(t->str, "None")) n->lit = tmpl_tv_none();
        else {
            n->kind = TMPL_N_NAME;
            n->str = t->str;
        }
    } else if (t->type == TMPL_T_STRING) {
        /* adjacent string literals concatenate */
        size_t total = 0, k = P->i;
        while (P->t[k].type == TMPL_T_STRING) total += P->t[k++].n;
        char *buf = tparse_alloc(P, total + 1);
        size_t o = 0;
        while (tparse_cur(P)->type == TMPL_T_STRING) {
            memcpy(buf + o, tparse_cur(P)->str, tparse_cur(P)->n);
            o += tparse_cur(P)->n;
            P->i++;
        }
        n = tparse_node(P, TMPL_N_LIT);
        n->lit = tmpl_tv_str(buf, o);
    } else if (t->type == TMPL_T_INT) {
        P->i++;
        n = tparse_node(P, TMPL_N_LIT);
        n->lit = tmpl_tv_int(t->i);
    } else if (t->type == TMPL_T_FLOAT) {
        P->i++;
        n = tparse_node(P, TMPL_N_LIT);
        n->lit = tmpl_tv_float(t->f);
    } else if (tparse_is_op(P, "(")) {
        P->i++;
        n = tparse_tuple(P, 0, 1, NULL, 1);
        tparse_expect_op(P, ")");
    } else if (tparse_is_op(P, "[")) {
        P->i++;
        struct tvec items = {0};
        while (!tparse_is_op(P, "]")) {
            if (items.n) {
                tparse_expect_op(P, ",");
                if (tparse_is_op(P, "]")) break;
            }
            tvec_push(P, &items, tparse_expression(P, 1));
        }
        tparse_expect_op(P, "]");
        n = tparse_node(P, TMPL_N_LIST);
        n->args = items.p;
        n->n_args = items.n;
    } else if (tparse_is_op(P, "{")) {
        P->i++;
        struct tvec keys = {0}, vals = {0};
        while (!tparse_is_op(P, "}")) {
            if (keys.n) {
                tparse_expect_op(P, ",");
                if (tparse_is_op(P, "}")) break;
            }
            tvec_push(P, &keys, tparse_expression(P, 1));
            tparse_expect_op(P, ":");
            tvec_push(P, &vals, tparse_expression(P, 1));
        }
        tparse_expect_op(P, "}");
        n = tparse_node(P, TMPL_N_DICT);
        n->args = keys.p;
        n->args2 = vals.p;
        n->n_args = keys.n;
    } else {
        tparse_fail(P, CAIRN_ERR_FORMAT, "unexpected '%s'", tparse_describe(t));
    }
    P->depth--;
    return n;
}

static struct tmpl_node *tparse_unary(struct tparser *P, int with_filter)
{
    tparse_enter(P);
    struct tmpl_node *node;
    if (tparse_is_op(P, "-") || tparse_is_op(P, "+")) {
        int neg = tparse_is_op(P, "-");
        node = tparse_node(P, TMPL_N_UNARY);
        P->i++;
        node->op = neg ? TMPL_OP_NEG : TMPL_OP_POS;
        node->a = tparse_unary(P, 0);
    } else {
        node = tparse_primary(P);
    }
    node = tparse_postfix(P, node);
    if (with_filter) node = tparse_filter_expr(P, node);
    P->depth--;
    return node;
}

static struct tmpl_node *tparse_binary(struct tparser *P, struct tmpl_node *a, int op, struct tmpl_node *b)
{
    struct tmpl_node *n = tparse_node(P, TMPL_N_BINARY);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static struct tmpl_node *tparse_pow(struct tparser *P)
{
    struct tmpl_node *left = tparse_unary(P, 1);
    while (tparse_skip_op(P, "**")) left = tparse_binary(P, left, TMPL_OP_POW, tparse_unary(P, 1));
    return left;
}

static struct tmpl_node *tparse_math2(struct tparser *P)
{
    struct tmpl_node *left = tparse_pow(P);
    for (;;) {
        int op = tparse_is_op(P, "*") ? TMPL_OP_MUL : tparse_is_op(P, "/") ? TMPL_OP_DIV
               : tparse_is_op(P, "//") ? TMPL_OP_FLOORDIV : tparse_is_op(P, "%") ? TMPL_OP_MOD : 0;
        if (!op) return left;
        P->i++;
        left = tparse_binary(P, left, op, tparse_pow(P));
    }
}

static struct tmpl_node *tparse_concat(struct tparser *P)
{
    struct tmpl_node *left = tparse_math2(P);
    while (tparse_skip_op(P, "~")) left = tparse_binary(P, left, TMPL_OP_CONCAT, tparse_math2(P));
    return left;
}

static struct tmpl_node *tparse_math1(struct tparser *P)
{
    struct tmpl_node *left = tparse_concat(P);
    for (;;) {
        int op = tparse_is_op(P, "+") ? TMPL_OP_ADD : tparse_is_op(P, "-") ? TMPL_OP_SUB : 0;
        if (!op) return left;
        P->i++;
        left = tparse_binary(P, left, op, tparse_concat(P));
    }
}

static struct tmpl_node *tparse_compare(struct tparser *P)
{
    struct tmpl_node *expr = tparse_math1(P);
    struct tvec operands = {0};
    int ops[64];
    size_t n_ops = 0;
    for (;;) {
        int op = 0;
        const struct tmpl_token *t = tparse_cur(P);
        if (t->type == TMPL_T_OP) {
            if (!strcmp(t->str, "==")) op = TMPL_OP_EQ;
            else if (!strcmp(t->str, "!=")) op = TMPL_OP_NE;
            else if (!strcmp(t->str, "<")) op = TMPL_OP_LT;
            else if (!strcmp(t->str, "<=")) op = TMPL_OP_LE;
            else if (!strcmp(t->str, ">")) op = TMPL_OP_GT;
            else if (!strcmp(t->str, ">=")) op = TMPL_OP_GE;
            if (op) P->i++;
        } else if (tparse_is_name(P, "in")) {
            op = TMPL_OP_IN;
            P->i++;
        } else if (tparse_is_name(P, "not") && P->t[P->i + 1].type == TMPL_T_NAME &&
                   !strcmp(P->t[P->i + 1].str, "in")) {
            op = TMPL_OP_NOTIN;
            P->i += 2;
        }
        if (!op) break;
        if (n_ops == CAIRN_ARRAY_LEN(ops)) tparse_fail(P, CAIRN_ERR_LIMIT, "comparison chain too long");
        ops[n_ops++] = op;
        tvec_push(P, &operands, tparse_math1(P));
    }
    if (!n_ops) return expr;
    struct tmpl_node *n = tparse_node(P, TMPL_N_COMPARE);
    n->a = expr;
    n->args = operands.p;
    n->n_args = operands.n;
    n->ops = tparse_alloc(P, n_ops * sizeof(int));
    memcpy(n->ops, ops, n_ops * sizeof(int));
    return n;
}

static struct tmpl_node *tparse_not(struct tparser *P)
{
    if (tparse_is_name(P, "not")) {
        tparse_enter(P);
        struct tmpl_node *n = tparse_node(P, TMPL_N_UNARY);
        P->i++;
        n->op = TMPL_OP_NOT;
        n->a = tparse_not(P);
        P->depth--;
        return n;
    }
    return tparse_compare(P);
}

static struct tmpl_node *tparse_and(struct tparser *P)
{
    struct tmpl_node *left = tparse_not(P);
    while (tparse_skip_name(P, "and")) {
        struct tmpl_node *n = tparse_node(P, TMPL_N_AND);
        n->a = left;
        n->b = tparse_not(P);
        left = n;
    }
    return left;
}

static struct tmpl_node *tparse_or(struct tparser *P)
{
    struct tmpl_node *left = tparse_and(P);
    while (tparse_skip_name(P, "or")) {
        struct tmpl_node *n = tparse_node(P, TMPL_N_OR);
        n->a = left;
        n->b = tparse_and(P);
        left = n;
    }
    return left;
}

static struct tmpl_node *tparse_condexpr(struct tparser *P)
{
    tparse_enter(P);
    struct tmpl_node *expr1 = tparse_or(P);
    while (tparse_skip_name(P, "if")) {
        struct tmpl_node *n = tparse_node(P, TMPL_N_COND);
        n->a = tparse_or(P);
        n->b = expr1;
        if (tparse_skip_name(P, "else")) n->c = tparse_condexpr(P);
        expr1 = n;
    }
    P->depth--;
    return expr1;
}

static struct tmpl_node *tparse_expression(struct tparser *P, int with_condexpr)
{
    return with_condexpr ? tparse_condexpr(P) : tparse_or(P);
}

/* ---- statements ---- */

static struct tmpl_node *tparse_body(struct tparser *P, const char *const *end_tokens);

/* name | name, name | (name, name) ; with_namespace allows ns.attr */
static void tparse_assign_target(struct tparser *P, struct tmpl_node *stmt, int with_namespace,
                                 const char *const *extra)
{
    struct tvec targets = {0};
    if (with_namespace && P->t[P->i].type == TMPL_T_NAME && P->t[P->i + 1].type == TMPL_T_OP &&
        !strcmp(P->t[P->i + 1].str, ".")) {
        struct tmpl_node *g = tparse_node(P, TMPL_N_GETATTR);
        struct tmpl_node *nm = tparse_node(P, TMPL_N_NAME);
        nm->str = tparse_expect_name(P);
        P->i++;
        g->a = nm;
        g->str = tparse_expect_name(P);
        tvec_push(P, &targets, g);
    } else {
        int paren = tparse_skip_op(P, "(");
        for (;;) {
            struct tmpl_node *nm = tparse_node(P, TMPL_N_NAME);
            nm->str = tparse_expect_name(P);
            tvec_push(P, &targets, nm);
            if (!tparse_skip_op(P, ",")) break;
            if (paren && tparse_is_op(P, ")")) break;
            if (tparse_is_tuple_end(P, extra) || tparse_is_op(P, "=")) break;
        }
        if (paren) tparse_expect_op(P, ")");
    }
    stmt->args = targets.p;
    stmt->n_args = targets.n;
}

/* Bits of TMPL_USES_* for names mentioned anywhere under n. */
static int tparse_uses(const struct tmpl_node *n)
{
    if (!n) return 0;
    int u = 0;
    if (n->kind == TMPL_N_NAME && n->str) {
        if (!strcmp(n->str, "caller")) u |= TMPL_USES_CALLER;
        else if (!strcmp(n->str, "kwargs")) u |= TMPL_USES_KWARGS;
        else if (!strcmp(n->str, "varargs")) u |= TMPL_USES_VARARGS;
    }
    u |= tparse_uses(n->a) | tparse_uses(n->b) | tparse_uses(n->c) | tparse_uses(n->d);
    for (size_t i = 0; i < n->n_args; i++) u |= tparse_uses(n->args[i]);
    size_t n2 = n->kind == TMPL_N_DICT ? n->n_args : n->kind == TMPL_N_WITH ? n->n_args : n->n_kw;
    if (n->kind == TMPL_N_MACRO || n->kind == TMPL_N_CALLBLOCK) n2 = n->n_args;
    for (size_t i = 0; n->args2 && i < n2; i++) u |= tparse_uses(n->args2[i]);
    return u;
}

static void tparse_macro_sig(struct tparser *P, struct tmpl_node *n)
{
    struct tvec params = {0}, defs = {0};
    tparse_expect_op(P, "(");
    while (!tparse_is_op(P, ")")) {
        if (params.n) tparse_expect_op(P, ",");
        struct tmpl_node *nm = tparse_node(P, TMPL_N_NAME);
        nm->str = tparse_expect_name(P);
        tvec_push(P, &params, nm);
        if (tparse_skip_op(P, "=")) tvec_push(P, &defs, tparse_expression(P, 1));
        else if (defs.n) tparse_fail(P, CAIRN_ERR_FORMAT, "non-default argument follows default argument");
        else tvec_push(P, &defs, NULL);
    }
    tparse_expect_op(P, ")");
    n->args = params.p;
    n->args2 = defs.p;
    n->n_args = params.n;
}

static int tparse_at_end_tag(struct tparser *P, const char *const *end_tokens)
{
    const struct tmpl_token *t = &P->t[P->i];
    if (t->type != TMPL_T_BLOCK_BEGIN) return 0;
    const struct tmpl_token *name = &P->t[P->i + 1];
    if (name->type != TMPL_T_NAME) return 0;
    for (; end_tokens && *end_tokens; end_tokens++)
        if (!strcmp(name->str, *end_tokens)) return 1;
    return 0;
}

/* After a body: consume `{% NAME` and return which end token it was. */
static const char *tparse_end_name(struct tparser *P, const char *const *end_tokens, const char *what)
{
    if (!tparse_at_end_tag(P, end_tokens))
        tparse_fail(P, CAIRN_ERR_FORMAT, "unexpected end of template: '%s' not closed", what);
    P->i++;
    return tparse_next(P)->str;
}

static struct tmpl_node *tparse_statement(struct tparser *P)
{
    tparse_enter(P);
    const struct tmpl_token *t = tparse_cur(P);
    if (t->type != TMPL_T_NAME) tparse_fail(P, CAIRN_ERR_FORMAT, "tag name expected");
    const char *tag = t->str;
    struct tmpl_node *n = NULL;
    P->i++;
    if (!strcmp(tag, "if")) {
        n = tparse_node(P, TMPL_N_IF);
        struct tmpl_node *cur = n;
        for (;;) {
            cur->a = tparse_tuple(P, 0, 0, NULL, 0);
            tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            cur->b = tparse_body(P, ends);
            const char *e = tparse_end_name(P, ends, "if");
            if (!strcmp(e, "elif")) {
                struct tmpl_node *nx = tparse_node(P, TMPL_N_IF);
                cur->c = nx;
                cur = nx;
                continue;
            }
            if (!strcmp(e, "else")) {
                tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
                static const char *const ends2[] = {"endif", NULL};
                cur->c = tparse_body(P, ends2);
                tparse_end_name(P, ends2, "if");
            }
            break;
        }
    } else if (!strcmp(tag, "for")) {
        n = tparse_node(P, TMPL_N_FOR);
        static const char *const in_end[] = {"in", NULL};
        tparse_assign_target(P, n, 0, in_end);
        if (!tparse_skip_name(P, "in")) tparse_fail(P, CAIRN_ERR_FORMAT, "expected 'in'");
        static const char *const rec_end[] = {"recursive", NULL};
        n->a = tparse_tuple(P, 0, 0, rec_end, 0);
        if (tparse_skip_name(P, "if")) n->d = tparse_expression(P, 1);
        if (tparse_is_name(P, "recursive"))
            tparse_fail(P, CAIRN_ERR_UNSUPPORTED, "recursive for loops are not supported");
        tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endfor", "else", NULL};
        P->loop_depth++;
        n->b = tparse_body(P, ends);
        P->loop_depth--;
        const char *e = tparse_end_name(P, ends, "for");
        if (!strcmp(e, "else")) {
            tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
            static const char *const ends2[] = {"endfor", NULL};
            n->c = tparse_body(P, ends2);
            tparse_end_name(P, ends2, "for");
        }
    } else if (!strcmp(tag, "set")) {
        n = tparse_node(P, TMPL_N_SET);
        tparse_assign_target(P, n, 1, NULL);
        if (tparse_skip_op(P, "=")) {
            n->a = tparse_tuple(P, 0, 1, NULL, 0);
        } else {
            n->kind = TMPL_N_SETBLOCK;
            if (tparse_is_op(P, "|")) n->a = tparse_filter(P, NULL, 0);
            tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
            static const char *const ends[] = {"endset", NULL};
            n->b = tparse_body(P, ends);
            tparse_end_name(P, ends, "set");
        }
    } else if (!strcmp(tag, "macro")) {
        n = tparse_node(P, TMPL_N_MACRO);
        n->str = tparse_expect_name(P);
        tparse_macro_sig(P, n);
        tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endmacro", NULL};
        int saved_loops = P->loop_depth;
        P->loop_depth = 0;
        n->b = tparse_body(P, ends);
        P->loop_depth = saved_loops;
        tparse_end_name(P, ends, "macro");
        if (tparse_cur(P)->type == TMPL_T_NAME) P->i++; /* {% endmacro name %} */
    } else if (!strcmp(tag, "call")) {
        n = tparse_node(P, TMPL_N_CALLBLOCK);
        if (tparse_is_op(P, "(")) tparse_macro_sig(P, n);
        n->a = tparse_expression(P, 1);
        if (n->a->kind != TMPL_N_CALL) tparse_fail(P, CAIRN_ERR_FORMAT, "expected call");
        tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endcall", NULL};
        int saved_loops = P->loop_depth;
        P->loop_depth = 0;
        n->b = tparse_body(P, ends);
        P->loop_depth = saved_loops;
        tparse_end_name(P, ends, "call");
    } else if (!strcmp(tag, "filter")) {
        n = tparse_node(P, TMPL_N_FILTERBLOCK);
        n->a = tparse_filter(P, NULL, 1);
        tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endfilter", NULL};
        n->b = tparse_body(P, ends);
        tparse_end_name(P, ends, "filter");
    } else if (!strcmp(tag, "with")) {
        n = tparse_node(P, TMPL_N_WITH);
        struct tvec targets = {0}, vals = {0};
        while (tparse_cur(P)->type != TMPL_T_BLOCK_END) {
            if (targets.n) tparse_expect_op(P, ",");
            struct tmpl_node *nm = tparse_node(P, TMPL_N_NAME);
            nm->str = tparse_expect_name(P);
            tvec_push(P, &targets, nm);
            tparse_expect_op(P, "=");
            tvec_push(P, &vals, tparse_expression(P, 1));
        }
        n->args = targets.p;
        n->n_args = targets.n;
        n->args2 = vals.p;
        tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endwith", NULL};
        n->b = tparse_body(P, ends);
        tparse_end_name(P, ends, "with");
    } else if (!strcmp(tag, "generation")) {
        tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endgeneration", NULL};
        n = tparse_body(P, ends);
        tparse_end_name(P, ends, "generation");
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!P->loop_depth) {
            P->i--;
            tparse_fail(P, CAIRN_ERR_FORMAT, "'%s' outside of a loop", tag);
        }
        n = tparse_node(P, tag[0] == 'b' ? TMPL_N_BREAK : TMPL_N_CONTINUE);
    } else {
        P->i--;
        tparse_fail(P, CAIRN_ERR_FORMAT, "encountered unknown tag '%s'", tag);
    }
    tparse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
    P->depth--;
    return n;
}

static struct tmpl_node *tparse_body(struct tparser *P, const char *const *end_tokens)
{
    tparse_enter(P);
    struct tvec stmts = {0};
    struct tmpl_node *body = tparse_node(P, TMPL_N_BODY);
    for (;;) {
        const struct tmpl_token *t = tparse_cur(P);
        if (t->type == TMPL_T_EOF) {
            if (end_tokens) tparse_fail(P, CAIRN_ERR_FORMAT, "unexpected end of template, expected '%s'", end_tokens[0]);
            break;
        }
        if (t->type == TMPL_T_DATA) {
            struct tmpl_node *d = tparse_node(P, TMPL_N_DATA);
            d->str = t->str;
            d->str_n = t->n;
            tvec_push(P, &stmts, d);
            P->i++;
        } else if (t->type == TMPL_T_VAR_BEGIN) {
            P->i++;
            struct tmpl_node *o = tparse_node(P, TMPL_N_OUTPUT);
            o->a = tparse_tuple(P, 0, 1, NULL, 0);
            tparse_expect(P, TMPL_T_VAR_END, "end of print statement");
            tvec_push(P, &stmts, o);
        } else if (t->type == TMPL_T_BLOCK_BEGIN) {
            if (end_tokens && tparse_at_end_tag(P, end_tokens)) break;
            P->i++;
            tvec_push(P, &stmts, tparse_statement(P));
        } else {
            tparse_fail(P, CAIRN_ERR_FORMAT, "unexpected '%s'", tparse_describe(t));
        }
    }
    body->args = stmts.p;
    body->n_args = stmts.n;
    P->depth--;
    return body;
}

/* Post-pass, iterative (explicit stack): checks that the tree is at most TMPL_MAX_TREE_DEPTH
 * deep (left-associative chains like a + b + c ... or x|f|g|... parse in loops, so only this
 * bounds them), then fills the TMPL_USES_* bits of macros with the (now bounded) recursive
 * tparse_uses. Everything that walks the tree recursively later relies on this bound. */
static int tparse_check_tree(struct tmpl_node *root, struct cairn_err *err)
{
    struct item {
        struct tmpl_node *n;
        int depth;
    } *stack = NULL;
    size_t n = 0, cap = 0;
    int rc = CAIRN_OK;
#define PUSH(node, d)                                                                              \
    do {                                                                                           \
        if (node) {                                                                                \
            if (n == cap) {                                                                        \
                size_t nc = cap ? cap * 2 : 256;                                                   \
                struct item *ns = realloc(stack, nc * sizeof(*ns));                                \
                if (!ns) {                                                                         \
                    rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");                     \
                    goto done;                                                                     \
                }                                                                                  \
                stack = ns;                                                                        \
                cap = nc;                                                                          \
            }                                                                                      \
            stack[n].n = (node);                                                                   \
            stack[n].depth = (d);                                                                  \
            n++;                                                                                   \
        }                                                                                          \
    } while (0)
    PUSH(root, 1);
    while (n) {
        struct item it = stack[--n];
        struct tmpl_node *x = it.n;
        if (it.depth > TMPL_MAX_TREE_DEPTH) {
            rc = cairn_err_set(err, CAIRN_ERR_LIMIT,
                               "template syntax error: line %d: expression nested too deeply "
                               "(limit %d levels)", x->line, TMPL_MAX_TREE_DEPTH);
            goto done;
        }
        PUSH(x->a, it.depth + 1);
        PUSH(x->b, it.depth + 1);
        PUSH(x->c, it.depth + 1);
        PUSH(x->d, it.depth + 1);
        for (size_t i = 0; i < x->n_args; i++) PUSH(x->args[i], it.depth + 1);
        size_t n2 = (x->kind == TMPL_N_DICT || x->kind == TMPL_N_WITH || x->kind == TMPL_N_MACRO || x->kind == TMPL_N_CALLBLOCK)
                        ? x->n_args : x->n_kw;
        for (size_t i = 0; x->args2 && i < n2; i++) PUSH(x->args2[i], it.depth + 1);
    }
    /* second pass: macro flags */
    PUSH(root, 1);
    while (n) {
        struct tmpl_node *x = stack[--n].n;
        if (x->kind == TMPL_N_MACRO || x->kind == TMPL_N_CALLBLOCK) x->op = tparse_uses(x->b);
        PUSH(x->a, 0);
        PUSH(x->b, 0);
        PUSH(x->c, 0);
        PUSH(x->d, 0);
        for (size_t i = 0; i < x->n_args; i++) PUSH(x->args[i], 0);
        size_t n2 = (x->kind == TMPL_N_DICT || x->kind == TMPL_N_WITH || x->kind == TMPL_N_MACRO || x->kind == TMPL_N_CALLBLOCK)
                        ? x->n_args : x->n_kw;
        for (size_t i = 0; x->args2 && i < n2; i++) PUSH(x->args2[i], 0);
    }
#undef PUSH
done:
    free(stack);
    return rc;
}

int tmpl_parse(struct tmpl_arena *a, const struct tmpl_token *toks, size_t n_toks, struct tmpl_node **root,
               struct cairn_err *err)
{
    struct tparser P = {.a = a, .t = toks, .n = n_toks, .err = err};
    if (setjmp(P.jmp)) return err ? err->status : CAIRN_ERR_FORMAT;
    *root = tparse_body(&P, NULL);
    return tparse_check_tree(*root, err);
}

int tmpl_compile(const char *src, size_t len, struct tmpl **out, struct cairn_err *err)
{
    *out = NULL;
    if (len > TMPL_MAX_SOURCE_BYTES)
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "template too large (%zu bytes, limit %zu)", len,
                             TMPL_MAX_SOURCE_BYTES);
    if (!cairn_utf8_valid(src, len))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "template is not valid UTF-8");
    struct tmpl *t = calloc(1, sizeof(*t));
    if (!t) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    int rc;
    /* normalize newlines; drop one trailing newline (keep_trailing_newline=False) */
    char *norm = tmpl_arena_alloc(&t->arena, len + 1);
    if (!norm) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    struct tmpl_token *toks;
    size_t n_toks;
    rc = tmpl_lex(&t->arena, norm, n, &toks, &n_toks, err);
    if (rc) {
        if (err && rc == CAIRN_ERR_FORMAT) cairn_err_prefix(err, "template syntax error");
        goto fail;
    }
    rc = tmpl_parse(&t->arena, toks, n_toks, &t->root, err);
    if (rc) goto fail;
    *out = t;
    return CAIRN_OK;
fail:
    tmpl_free(t);
    return rc;
}

void tmpl_free(struct tmpl *t)
{
    if (!t) return;
    tmpl_arena_free_all(&t->arena);
    free(t);
}
