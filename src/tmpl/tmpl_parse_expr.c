/* tmpl parser, lower half: the token cursor and its errors (a syntax error longjmps back to
 * tmpl_parse), node allocation, and expressions, a recursive-descent port of jinja2's (same
 * precedence: condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary <
 * postfix/filters/tests). Statements and the entry points are in tmpl_parse.c, which calls into
 * this file and never the reverse; what the two share is in tmpl_parse_int.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl/tmpl_parse_int.h"

void tmpl_parse_fail(struct tmpl_parser *P, int status, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cairn_err_set(P->err, status, "template syntax error: line %d: %s", P->t[P->i].line, msg);
    longjmp(P->jmp, 1);
}

static void *tmpl_parse_alloc(struct tmpl_parser *P, size_t n)
{
    void *p = tmpl_arena_alloc(P->a, n);
    if (!p) tmpl_parse_fail(P, CAIRN_ERR_NOMEM, "out of memory");
    return p;
}

struct tmpl_node *tmpl_parse_node(struct tmpl_parser *P, enum tmpl_node_kind k)
{
    struct tmpl_node *n = tmpl_parse_alloc(P, sizeof(*n));
    n->kind = k;
    n->line = P->t[P->i].line;
    return n;
}

const struct tmpl_token *tmpl_parse_cur(struct tmpl_parser *P) { return &P->t[P->i]; }

const struct tmpl_token *tmpl_parse_next(struct tmpl_parser *P)
{
    const struct tmpl_token *t = &P->t[P->i];
    if (t->type != TMPL_T_EOF) P->i++;
    return t;
}

int tmpl_parse_is_op(struct tmpl_parser *P, const char *op)
{
    const struct tmpl_token *t = tmpl_parse_cur(P);
    return t->type == TMPL_T_OP && strcmp(t->str, op) == 0;
}

int tmpl_parse_is_name(struct tmpl_parser *P, const char *name)
{
    const struct tmpl_token *t = tmpl_parse_cur(P);
    return t->type == TMPL_T_NAME && strcmp(t->str, name) == 0;
}

int tmpl_parse_skip_op(struct tmpl_parser *P, const char *op)
{
    if (!tmpl_parse_is_op(P, op)) return 0;
    P->i++;
    return 1;
}

int tmpl_parse_skip_name(struct tmpl_parser *P, const char *name)
{
    if (!tmpl_parse_is_name(P, name)) return 0;
    P->i++;
    return 1;
}

const char *tmpl_parse_describe(const struct tmpl_token *t)
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

void tmpl_parse_expect_op(struct tmpl_parser *P, const char *op)
{
    if (!tmpl_parse_skip_op(P, op))
        tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected '%s', got '%s'", op, tmpl_parse_describe(tmpl_parse_cur(P)));
}

const char *tmpl_parse_expect_name(struct tmpl_parser *P)
{
    const struct tmpl_token *t = tmpl_parse_cur(P);
    if (t->type != TMPL_T_NAME)
        tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected a name, got '%s'", tmpl_parse_describe(t));
    P->i++;
    return t->str;
}

void tmpl_parse_expect(struct tmpl_parser *P, enum tmpl_token_type type, const char *what)
{
    if (tmpl_parse_cur(P)->type != type)
        tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected %s, got '%s'", what, tmpl_parse_describe(tmpl_parse_cur(P)));
    P->i++;
}

void tmpl_parse_enter(struct tmpl_parser *P)
{
    if (++P->depth > TMPL_MAX_PARSE_DEPTH)
        tmpl_parse_fail(P, CAIRN_ERR_LIMIT, "template nested too deeply (limit %d)", TMPL_MAX_PARSE_DEPTH);
}

void tmpl_parse_vec_push(struct tmpl_parser *P, struct tmpl_parse_vec *v, struct tmpl_node *x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        struct tmpl_node **p = tmpl_parse_alloc(P, cap * sizeof(*p));
        if (v->n) memcpy(p, v->p, v->n * sizeof(*p));
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

static struct tmpl_node *tmpl_parse_unary(struct tmpl_parser *P, int with_filter);
static struct tmpl_node *tmpl_parse_primary(struct tmpl_parser *P);
static struct tmpl_node *tmpl_parse_postfix(struct tmpl_parser *P, struct tmpl_node *node);
static struct tmpl_node *tmpl_parse_filter_expr(struct tmpl_parser *P, struct tmpl_node *node);

int tmpl_parse_is_tuple_end(struct tmpl_parser *P, const char *const *extra)
{
    const struct tmpl_token *t = tmpl_parse_cur(P);
    if (t->type == TMPL_T_VAR_END || t->type == TMPL_T_BLOCK_END || t->type == TMPL_T_EOF) return 1;
    if (t->type == TMPL_T_OP && strcmp(t->str, ")") == 0) return 1;
    for (; extra && *extra; extra++)
        if (t->type == TMPL_T_NAME && strcmp(t->str, *extra) == 0) return 1;
    return 0;
}

/* expr or expr, expr, ... (tuple). explicit: inside parentheses (empty tuple allowed). */
struct tmpl_node *tmpl_parse_tuple(struct tmpl_parser *P, int simplified, int with_condexpr,
                                   const char *const *extra, int explicit)
{
    int line = tmpl_parse_cur(P)->line;
    struct tmpl_parse_vec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) tmpl_parse_expect_op(P, ",");
        if (tmpl_parse_is_tuple_end(P, extra)) break;
        struct tmpl_node *e;
        if (simplified) e = tmpl_parse_postfix(P, tmpl_parse_primary(P));
        else e = tmpl_parse_expression(P, with_condexpr);
        tmpl_parse_vec_push(P, &items, e);
        if (tmpl_parse_is_op(P, ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.p[0];
        if (!explicit)
            tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected an expression, got '%s'",
                        tmpl_parse_describe(tmpl_parse_cur(P)));
    }
    struct tmpl_node *n = tmpl_parse_node(P, TMPL_N_TUPLE);
    n->line = line;
    n->args = items.p;
    n->n_args = items.n;
    return n;
}

static void tmpl_parse_call_args(struct tmpl_parser *P, struct tmpl_node *n)
{
    tmpl_parse_expect_op(P, "(");
    struct tmpl_parse_vec args = {0}, kwv = {0};
    const char **kwn = NULL;
    size_t kw_cap = 0;
    while (!tmpl_parse_is_op(P, ")")) {
        if (args.n || kwv.n) {
            tmpl_parse_expect_op(P, ",");
            if (tmpl_parse_is_op(P, ")")) break;
        }
        if (tmpl_parse_is_op(P, "*") || tmpl_parse_is_op(P, "**"))
            tmpl_parse_fail(P, CAIRN_ERR_UNSUPPORTED, "*args / **kwargs in calls are not supported");
        const struct tmpl_token *t = tmpl_parse_cur(P);
        if (t->type == TMPL_T_NAME && P->t[P->i + 1].type == TMPL_T_OP && strcmp(P->t[P->i + 1].str, "=") == 0) {
            P->i += 2;
            if (kwv.n == kw_cap) {
                size_t cap = kw_cap ? kw_cap * 2 : 4;
                const char **k2 = tmpl_parse_alloc(P, cap * sizeof(*k2));
                if (kwv.n) memcpy(k2, kwn, kwv.n * sizeof(*k2));
                kwn = k2;
                kw_cap = cap;
            }
            kwn[kwv.n] = t->str;
            tmpl_parse_vec_push(P, &kwv, tmpl_parse_expression(P, 1));
        } else {
            if (kwv.n) tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "positional argument after keyword argument");
            tmpl_parse_vec_push(P, &args, tmpl_parse_expression(P, 1));
        }
    }
    tmpl_parse_expect_op(P, ")");
    n->args = args.p;
    n->n_args = args.n;
    n->args2 = kwv.p;
    n->kwnames = kwn;
    n->n_kw = kwv.n;
}

/* dotted name for filters and tests (a.b) */
static const char *tmpl_parse_dotted(struct tmpl_parser *P)
{
    const char *name = tmpl_parse_expect_name(P);
    while (tmpl_parse_is_op(P, ".")) {
        P->i++;
        const char *part = tmpl_parse_expect_name(P);
        size_t l1 = strlen(name), l2 = strlen(part);
        char *c = tmpl_parse_alloc(P, l1 + l2 + 2);
        memcpy(c, name, l1);
        c[l1] = '.';
        memcpy(c + l1 + 1, part, l2);
        name = c;
    }
    return name;
}

struct tmpl_node *tmpl_parse_filter(struct tmpl_parser *P, struct tmpl_node *node, int start_inline)
{
    while (tmpl_parse_is_op(P, "|") || start_inline) {
        if (!start_inline) P->i++;
        start_inline = 0;
        struct tmpl_node *f = tmpl_parse_node(P, TMPL_N_FILTER);
        f->str = tmpl_parse_dotted(P);
        f->a = node;
        if (tmpl_parse_is_op(P, "(")) tmpl_parse_call_args(P, f);
        node = f;
    }
    return node;
}

static struct tmpl_node *tmpl_parse_test(struct tmpl_parser *P, struct tmpl_node *node)
{
    P->i++; /* is */
    struct tmpl_node *t = tmpl_parse_node(P, TMPL_N_TEST);
    t->op = tmpl_parse_skip_name(P, "not");
    t->str = tmpl_parse_dotted(P);
    t->a = node;
    const struct tmpl_token *c = tmpl_parse_cur(P);
    if (tmpl_parse_is_op(P, "(")) {
        tmpl_parse_call_args(P, t);
    } else if ((c->type == TMPL_T_NAME || c->type == TMPL_T_STRING || c->type == TMPL_T_INT || c->type == TMPL_T_FLOAT ||
                tmpl_parse_is_op(P, "[") || tmpl_parse_is_op(P, "{")) &&
               !(c->type == TMPL_T_NAME && (!strcmp(c->str, "else") || !strcmp(c->str, "or") ||
                                       !strcmp(c->str, "and")))) {
        if (c->type == TMPL_T_NAME && !strcmp(c->str, "is"))
            tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "You cannot chain multiple tests with is");
        struct tmpl_node *arg = tmpl_parse_postfix(P, tmpl_parse_primary(P));
        t->args = tmpl_parse_alloc(P, sizeof(*t->args));
        t->args[0] = arg;
        t->n_args = 1;
    }
    return t;
}

static struct tmpl_node *tmpl_parse_filter_expr(struct tmpl_parser *P, struct tmpl_node *node)
{
    for (;;) {
        if (tmpl_parse_is_op(P, "|")) {
            node = tmpl_parse_filter(P, node, 0);
        } else if (tmpl_parse_is_name(P, "is")) {
            node = tmpl_parse_test(P, node);
        } else if (tmpl_parse_is_op(P, "(")) {
            struct tmpl_node *c = tmpl_parse_node(P, TMPL_N_CALL);
            c->a = node;
            tmpl_parse_call_args(P, c);
            node = c;
        } else {
            return node;
        }
    }
}

static struct tmpl_node *tmpl_parse_subscribed(struct tmpl_parser *P)
{
    struct tmpl_node *parts[3] = {NULL, NULL, NULL};
    if (tmpl_parse_is_op(P, ":")) {
        P->i++;
    } else {
        struct tmpl_node *e = tmpl_parse_expression(P, 1);
        if (!tmpl_parse_is_op(P, ":")) return e;
        P->i++;
        parts[0] = e;
    }
    if (!tmpl_parse_is_op(P, "]") && !tmpl_parse_is_op(P, ",") && !tmpl_parse_is_op(P, ":"))
        parts[1] = tmpl_parse_expression(P, 1);
    if (tmpl_parse_skip_op(P, ":")) {
        if (!tmpl_parse_is_op(P, "]") && !tmpl_parse_is_op(P, ",")) parts[2] = tmpl_parse_expression(P, 1);
    }
    struct tmpl_node *s = tmpl_parse_node(P, TMPL_N_SLICE);
    s->b = parts[0];
    s->c = parts[1];
    s->d = parts[2];
    return s;
}

static struct tmpl_node *tmpl_parse_postfix(struct tmpl_parser *P, struct tmpl_node *node)
{
    for (;;) {
        if (tmpl_parse_is_op(P, ".")) {
            P->i++;
            const struct tmpl_token *t = tmpl_parse_next(P);
            if (t->type == TMPL_T_NAME) {
                struct tmpl_node *g = tmpl_parse_node(P, TMPL_N_GETATTR);
                g->a = node;
                g->str = t->str;
                node = g;
            } else if (t->type == TMPL_T_INT) {
                struct tmpl_node *g = tmpl_parse_node(P, TMPL_N_GETITEM);
                g->a = node;
                g->b = tmpl_parse_node(P, TMPL_N_LIT);
                g->b->lit = tmpl_tv_int(t->i);
                node = g;
            } else {
                P->i--;
                tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected name or number after '.'");
            }
        } else if (tmpl_parse_is_op(P, "[")) {
            P->i++;
            tmpl_parse_enter(P);
            struct tmpl_parse_vec items = {0};
            while (!tmpl_parse_is_op(P, "]")) {
                if (items.n) {
                    tmpl_parse_expect_op(P, ",");
                    if (tmpl_parse_is_op(P, "]")) break;
                }
                tmpl_parse_vec_push(P, &items, tmpl_parse_subscribed(P));
            }
            tmpl_parse_expect_op(P, "]");
            P->depth--;
            if (items.n == 0) tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected subscript expression");
            struct tmpl_node *key;
            if (items.n == 1) {
                key = items.p[0];
            } else {
                for (size_t k = 0; k < items.n; k++)
                    if (items.p[k]->kind == TMPL_N_SLICE)
                        tmpl_parse_fail(P, CAIRN_ERR_UNSUPPORTED, "multi-dimensional slicing is not supported");
                key = tmpl_parse_node(P, TMPL_N_TUPLE);
                key->args = items.p;
                key->n_args = items.n;
            }
            if (key->kind == TMPL_N_SLICE) {
                key->a = node;
                node = key;
            } else {
                struct tmpl_node *g = tmpl_parse_node(P, TMPL_N_GETITEM);
                g->a = node;
                g->b = key;
                node = g;
            }
        } else if (tmpl_parse_is_op(P, "(")) {
            struct tmpl_node *c = tmpl_parse_node(P, TMPL_N_CALL);
            c->a = node;
            tmpl_parse_call_args(P, c);
            node = c;
        } else {
            return node;
        }
    }
}

static struct tmpl_node *tmpl_parse_primary(struct tmpl_parser *P)
{
    tmpl_parse_enter(P);
    const struct tmpl_token *t = tmpl_parse_cur(P);
    struct tmpl_node *n = NULL;
    if (t->type == TMPL_T_NAME) {
        P->i++;
        n = tmpl_parse_node(P, TMPL_N_LIT);
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
        char *buf = tmpl_parse_alloc(P, total + 1);
        size_t o = 0;
        while (tmpl_parse_cur(P)->type == TMPL_T_STRING) {
            memcpy(buf + o, tmpl_parse_cur(P)->str, tmpl_parse_cur(P)->n);
            o += tmpl_parse_cur(P)->n;
            P->i++;
        }
        n = tmpl_parse_node(P, TMPL_N_LIT);
        n->lit = tmpl_tv_str(buf, o);
    } else if (t->type == TMPL_T_INT) {
        P->i++;
        n = tmpl_parse_node(P, TMPL_N_LIT);
        n->lit = tmpl_tv_int(t->i);
    } else if (t->type == TMPL_T_FLOAT) {
        P->i++;
        n = tmpl_parse_node(P, TMPL_N_LIT);
        n->lit = tmpl_tv_float(t->f);
    } else if (tmpl_parse_is_op(P, "(")) {
        P->i++;
        n = tmpl_parse_tuple(P, 0, 1, NULL, 1);
        tmpl_parse_expect_op(P, ")");
    } else if (tmpl_parse_is_op(P, "[")) {
        P->i++;
        struct tmpl_parse_vec items = {0};
        while (!tmpl_parse_is_op(P, "]")) {
            if (items.n) {
                tmpl_parse_expect_op(P, ",");
                if (tmpl_parse_is_op(P, "]")) break;
            }
            tmpl_parse_vec_push(P, &items, tmpl_parse_expression(P, 1));
        }
        tmpl_parse_expect_op(P, "]");
        n = tmpl_parse_node(P, TMPL_N_LIST);
        n->args = items.p;
        n->n_args = items.n;
    } else if (tmpl_parse_is_op(P, "{")) {
        P->i++;
        struct tmpl_parse_vec keys = {0}, vals = {0};
        while (!tmpl_parse_is_op(P, "}")) {
            if (keys.n) {
                tmpl_parse_expect_op(P, ",");
                if (tmpl_parse_is_op(P, "}")) break;
            }
            tmpl_parse_vec_push(P, &keys, tmpl_parse_expression(P, 1));
            tmpl_parse_expect_op(P, ":");
            tmpl_parse_vec_push(P, &vals, tmpl_parse_expression(P, 1));
        }
        tmpl_parse_expect_op(P, "}");
        n = tmpl_parse_node(P, TMPL_N_DICT);
        n->args = keys.p;
        n->args2 = vals.p;
        n->n_args = keys.n;
    } else {
        tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "unexpected '%s'", tmpl_parse_describe(t));
    }
    P->depth--;
    return n;
}

static struct tmpl_node *tmpl_parse_unary(struct tmpl_parser *P, int with_filter)
{
    tmpl_parse_enter(P);
    struct tmpl_node *node;
    if (tmpl_parse_is_op(P, "-") || tmpl_parse_is_op(P, "+")) {
        int neg = tmpl_parse_is_op(P, "-");
        node = tmpl_parse_node(P, TMPL_N_UNARY);
        P->i++;
        node->op = neg ? TMPL_OP_NEG : TMPL_OP_POS;
        node->a = tmpl_parse_unary(P, 0);
    } else {
        node = tmpl_parse_primary(P);
    }
    node = tmpl_parse_postfix(P, node);
    if (with_filter) node = tmpl_parse_filter_expr(P, node);
    P->depth--;
    return node;
}

static struct tmpl_node *tmpl_parse_binary(struct tmpl_parser *P, struct tmpl_node *a, int op, struct tmpl_node *b)
{
    struct tmpl_node *n = tmpl_parse_node(P, TMPL_N_BINARY);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static struct tmpl_node *tmpl_parse_pow(struct tmpl_parser *P)
{
    struct tmpl_node *left = tmpl_parse_unary(P, 1);
    while (tmpl_parse_skip_op(P, "**")) left = tmpl_parse_binary(P, left, TMPL_OP_POW, tmpl_parse_unary(P, 1));
    return left;
}

static struct tmpl_node *tmpl_parse_math2(struct tmpl_parser *P)
{
    struct tmpl_node *left = tmpl_parse_pow(P);
    for (;;) {
        int op = tmpl_parse_is_op(P, "*") ? TMPL_OP_MUL : tmpl_parse_is_op(P, "/") ? TMPL_OP_DIV
               : tmpl_parse_is_op(P, "//") ? TMPL_OP_FLOORDIV : tmpl_parse_is_op(P, "%") ? TMPL_OP_MOD : 0;
        if (!op) return left;
        P->i++;
        left = tmpl_parse_binary(P, left, op, tmpl_parse_pow(P));
    }
}

static struct tmpl_node *tmpl_parse_concat(struct tmpl_parser *P)
{
    struct tmpl_node *left = tmpl_parse_math2(P);
    while (tmpl_parse_skip_op(P, "~")) left = tmpl_parse_binary(P, left, TMPL_OP_CONCAT, tmpl_parse_math2(P));
    return left;
}

static struct tmpl_node *tmpl_parse_math1(struct tmpl_parser *P)
{
    struct tmpl_node *left = tmpl_parse_concat(P);
    for (;;) {
        int op = tmpl_parse_is_op(P, "+") ? TMPL_OP_ADD : tmpl_parse_is_op(P, "-") ? TMPL_OP_SUB : 0;
        if (!op) return left;
        P->i++;
        left = tmpl_parse_binary(P, left, op, tmpl_parse_concat(P));
    }
}

static struct tmpl_node *tmpl_parse_compare(struct tmpl_parser *P)
{
    struct tmpl_node *expr = tmpl_parse_math1(P);
    struct tmpl_parse_vec operands = {0};
    int ops[64];
    size_t n_ops = 0;
    for (;;) {
        int op = 0;
        const struct tmpl_token *t = tmpl_parse_cur(P);
        if (t->type == TMPL_T_OP) {
            if (!strcmp(t->str, "==")) op = TMPL_OP_EQ;
            else if (!strcmp(t->str, "!=")) op = TMPL_OP_NE;
            else if (!strcmp(t->str, "<")) op = TMPL_OP_LT;
            else if (!strcmp(t->str, "<=")) op = TMPL_OP_LE;
            else if (!strcmp(t->str, ">")) op = TMPL_OP_GT;
            else if (!strcmp(t->str, ">=")) op = TMPL_OP_GE;
            if (op) P->i++;
        } else if (tmpl_parse_is_name(P, "in")) {
            op = TMPL_OP_IN;
            P->i++;
        } else if (tmpl_parse_is_name(P, "not") && P->t[P->i + 1].type == TMPL_T_NAME &&
                   !strcmp(P->t[P->i + 1].str, "in")) {
            op = TMPL_OP_NOTIN;
            P->i += 2;
        }
        if (!op) break;
        if (n_ops == CAIRN_ARRAY_LEN(ops)) tmpl_parse_fail(P, CAIRN_ERR_LIMIT, "comparison chain too long");
        ops[n_ops++] = op;
        tmpl_parse_vec_push(P, &operands, tmpl_parse_math1(P));
    }
    if (!n_ops) return expr;
    struct tmpl_node *n = tmpl_parse_node(P, TMPL_N_COMPARE);
    n->a = expr;
    n->args = operands.p;
    n->n_args = operands.n;
    n->ops = tmpl_parse_alloc(P, n_ops * sizeof(int));
    memcpy(n->ops, ops, n_ops * sizeof(int));
    return n;
}

static struct tmpl_node *tmpl_parse_not(struct tmpl_parser *P)
{
    if (tmpl_parse_is_name(P, "not")) {
        tmpl_parse_enter(P);
        struct tmpl_node *n = tmpl_parse_node(P, TMPL_N_UNARY);
        P->i++;
        n->op = TMPL_OP_NOT;
        n->a = tmpl_parse_not(P);
        P->depth--;
        return n;
    }
    return tmpl_parse_compare(P);
}

static struct tmpl_node *tmpl_parse_and(struct tmpl_parser *P)
{
    struct tmpl_node *left = tmpl_parse_not(P);
    while (tmpl_parse_skip_name(P, "and")) {
        struct tmpl_node *n = tmpl_parse_node(P, TMPL_N_AND);
        n->a = left;
        n->b = tmpl_parse_not(P);
        left = n;
    }
    return left;
}

static struct tmpl_node *tmpl_parse_or(struct tmpl_parser *P)
{
    struct tmpl_node *left = tmpl_parse_and(P);
    while (tmpl_parse_skip_name(P, "or")) {
        struct tmpl_node *n = tmpl_parse_node(P, TMPL_N_OR);
        n->a = left;
        n->b = tmpl_parse_and(P);
        left = n;
    }
    return left;
}

static struct tmpl_node *tmpl_parse_condexpr(struct tmpl_parser *P)
{
    tmpl_parse_enter(P);
    struct tmpl_node *expr1 = tmpl_parse_or(P);
    while (tmpl_parse_skip_name(P, "if")) {
        struct tmpl_node *n = tmpl_parse_node(P, TMPL_N_COND);
        n->a = tmpl_parse_or(P);
        n->b = expr1;
        if (tmpl_parse_skip_name(P, "else")) n->c = tmpl_parse_condexpr(P);
        expr1 = n;
    }
    P->depth--;
    return expr1;
}

struct tmpl_node *tmpl_parse_expression(struct tmpl_parser *P, int with_condexpr)
{
    return with_condexpr ? tmpl_parse_condexpr(P) : tmpl_parse_or(P);
}
