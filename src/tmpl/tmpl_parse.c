/* tmpl parser: tokens -> AST (struct tmpl_node), a recursive-descent port of jinja2's parser.
 * This file: statements and bodies, the post-pass tree check, tmpl_parse and tmpl_compile; the
 * token cursor and expressions are in tmpl_parse_expr.c (shared state: tmpl_parse_int.h).
 * Nesting is bounded by TMPL_MAX_PARSE_DEPTH while parsing and TMPL_MAX_TREE_DEPTH after. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl/tmpl_parse_int.h"

/* ---- statements ---- */

static struct tmpl_node *tmpl_parse_body(struct tmpl_parser *P, const char *const *end_tokens);

/* name | name, name | (name, name) ; with_namespace allows ns.attr */
static void tmpl_parse_assign_target(struct tmpl_parser *P, struct tmpl_node *stmt, int with_namespace,
                                     const char *const *extra)
{
    struct tmpl_parse_vec targets = {0};
    if (with_namespace && P->t[P->i].type == TMPL_T_NAME && P->t[P->i + 1].type == TMPL_T_OP &&
        !strcmp(P->t[P->i + 1].str, ".")) {
        struct tmpl_node *g = tmpl_parse_node(P, TMPL_N_GETATTR);
        struct tmpl_node *nm = tmpl_parse_node(P, TMPL_N_NAME);
        nm->str = tmpl_parse_expect_name(P);
        P->i++;
        g->a = nm;
        g->str = tmpl_parse_expect_name(P);
        tmpl_parse_vec_push(P, &targets, g);
    } else {
        int paren = tmpl_parse_skip_op(P, "(");
        for (;;) {
            struct tmpl_node *nm = tmpl_parse_node(P, TMPL_N_NAME);
            nm->str = tmpl_parse_expect_name(P);
            tmpl_parse_vec_push(P, &targets, nm);
            if (!tmpl_parse_skip_op(P, ",")) break;
            if (paren && tmpl_parse_is_op(P, ")")) break;
            if (tmpl_parse_is_tuple_end(P, extra) || tmpl_parse_is_op(P, "=")) break;
        }
        if (paren) tmpl_parse_expect_op(P, ")");
    }
    stmt->args = targets.p;
    stmt->n_args = targets.n;
}

/* Bits of TMPL_USES_* for names mentioned anywhere under n. */
static int tmpl_parse_uses(const struct tmpl_node *n)
{
    if (!n) return 0;
    int u = 0;
    if (n->kind == TMPL_N_NAME && n->str) {
        if (!strcmp(n->str, "caller")) u |= TMPL_USES_CALLER;
        else if (!strcmp(n->str, "kwargs")) u |= TMPL_USES_KWARGS;
        else if (!strcmp(n->str, "varargs")) u |= TMPL_USES_VARARGS;
    }
    u |= tmpl_parse_uses(n->a) | tmpl_parse_uses(n->b) | tmpl_parse_uses(n->c) | tmpl_parse_uses(n->d);
    for (size_t i = 0; i < n->n_args; i++) u |= tmpl_parse_uses(n->args[i]);
    size_t n2 = n->kind == TMPL_N_DICT ? n->n_args : n->kind == TMPL_N_WITH ? n->n_args : n->n_kw;
    if (n->kind == TMPL_N_MACRO || n->kind == TMPL_N_CALLBLOCK) n2 = n->n_args;
    for (size_t i = 0; n->args2 && i < n2; i++) u |= tmpl_parse_uses(n->args2[i]);
    return u;
}

static void tmpl_parse_macro_sig(struct tmpl_parser *P, struct tmpl_node *n)
{
    struct tmpl_parse_vec params = {0}, defs = {0};
    tmpl_parse_expect_op(P, "(");
    while (!tmpl_parse_is_op(P, ")")) {
        if (params.n) tmpl_parse_expect_op(P, ",");
        struct tmpl_node *nm = tmpl_parse_node(P, TMPL_N_NAME);
        nm->str = tmpl_parse_expect_name(P);
        tmpl_parse_vec_push(P, &params, nm);
        if (tmpl_parse_skip_op(P, "=")) tmpl_parse_vec_push(P, &defs, tmpl_parse_expression(P, 1));
        else if (defs.n) tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "non-default argument follows default argument");
        else tmpl_parse_vec_push(P, &defs, NULL);
    }
    tmpl_parse_expect_op(P, ")");
    n->args = params.p;
    n->args2 = defs.p;
    n->n_args = params.n;
}

static int tmpl_parse_at_end_tag(struct tmpl_parser *P, const char *const *end_tokens)
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
static const char *tmpl_parse_end_name(struct tmpl_parser *P, const char *const *end_tokens, const char *what)
{
    if (!tmpl_parse_at_end_tag(P, end_tokens))
        tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "unexpected end of template: '%s' not closed", what);
    P->i++;
    return tmpl_parse_next(P)->str;
}

static struct tmpl_node *tmpl_parse_statement(struct tmpl_parser *P)
{
    tmpl_parse_enter(P);
    const struct tmpl_token *t = tmpl_parse_cur(P);
    if (t->type != TMPL_T_NAME) tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "tag name expected");
    const char *tag = t->str;
    struct tmpl_node *n = NULL;
    P->i++;
    if (!strcmp(tag, "if")) {
        n = tmpl_parse_node(P, TMPL_N_IF);
        struct tmpl_node *cur = n;
        for (;;) {
            cur->a = tmpl_parse_tuple(P, 0, 0, NULL, 0);
            tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            cur->b = tmpl_parse_body(P, ends);
            const char *e = tmpl_parse_end_name(P, ends, "if");
            if (!strcmp(e, "elif")) {
                struct tmpl_node *nx = tmpl_parse_node(P, TMPL_N_IF);
                cur->c = nx;
                cur = nx;
                continue;
            }
            if (!strcmp(e, "else")) {
                tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
                static const char *const ends2[] = {"endif", NULL};
                cur->c = tmpl_parse_body(P, ends2);
                tmpl_parse_end_name(P, ends2, "if");
            }
            break;
        }
    } else if (!strcmp(tag, "for")) {
        n = tmpl_parse_node(P, TMPL_N_FOR);
        static const char *const in_end[] = {"in", NULL};
        tmpl_parse_assign_target(P, n, 0, in_end);
        if (!tmpl_parse_skip_name(P, "in")) tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected 'in'");
        static const char *const rec_end[] = {"recursive", NULL};
        n->a = tmpl_parse_tuple(P, 0, 0, rec_end, 0);
        if (tmpl_parse_skip_name(P, "if")) n->d = tmpl_parse_expression(P, 1);
        if (tmpl_parse_is_name(P, "recursive"))
            tmpl_parse_fail(P, CAIRN_ERR_UNSUPPORTED, "recursive for loops are not supported");
        tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endfor", "else", NULL};
        P->loop_depth++;
        n->b = tmpl_parse_body(P, ends);
        P->loop_depth--;
        const char *e = tmpl_parse_end_name(P, ends, "for");
        if (!strcmp(e, "else")) {
            tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
            static const char *const ends2[] = {"endfor", NULL};
            n->c = tmpl_parse_body(P, ends2);
            tmpl_parse_end_name(P, ends2, "for");
        }
    } else if (!strcmp(tag, "set")) {
        n = tmpl_parse_node(P, TMPL_N_SET);
        tmpl_parse_assign_target(P, n, 1, NULL);
        if (tmpl_parse_skip_op(P, "=")) {
            n->a = tmpl_parse_tuple(P, 0, 1, NULL, 0);
        } else {
            n->kind = TMPL_N_SETBLOCK;
            if (tmpl_parse_is_op(P, "|")) n->a = tmpl_parse_filter(P, NULL, 0);
            tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
            static const char *const ends[] = {"endset", NULL};
            n->b = tmpl_parse_body(P, ends);
            tmpl_parse_end_name(P, ends, "set");
        }
    } else if (!strcmp(tag, "macro")) {
        n = tmpl_parse_node(P, TMPL_N_MACRO);
        n->str = tmpl_parse_expect_name(P);
        tmpl_parse_macro_sig(P, n);
        tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endmacro", NULL};
        int saved_loops = P->loop_depth;
        P->loop_depth = 0;
        n->b = tmpl_parse_body(P, ends);
        P->loop_depth = saved_loops;
        tmpl_parse_end_name(P, ends, "macro");
        if (tmpl_parse_cur(P)->type == TMPL_T_NAME) P->i++; /* {% endmacro name %} */
    } else if (!strcmp(tag, "call")) {
        n = tmpl_parse_node(P, TMPL_N_CALLBLOCK);
        if (tmpl_parse_is_op(P, "(")) tmpl_parse_macro_sig(P, n);
        n->a = tmpl_parse_expression(P, 1);
        if (n->a->kind != TMPL_N_CALL) tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "expected call");
        tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endcall", NULL};
        int saved_loops = P->loop_depth;
        P->loop_depth = 0;
        n->b = tmpl_parse_body(P, ends);
        P->loop_depth = saved_loops;
        tmpl_parse_end_name(P, ends, "call");
    } else if (!strcmp(tag, "filter")) {
        n = tmpl_parse_node(P, TMPL_N_FILTERBLOCK);
        n->a = tmpl_parse_filter(P, NULL, 1);
        tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endfilter", NULL};
        n->b = tmpl_parse_body(P, ends);
        tmpl_parse_end_name(P, ends, "filter");
    } else if (!strcmp(tag, "with")) {
        n = tmpl_parse_node(P, TMPL_N_WITH);
        struct tmpl_parse_vec targets = {0}, vals = {0};
        while (tmpl_parse_cur(P)->type != TMPL_T_BLOCK_END) {
            if (targets.n) tmpl_parse_expect_op(P, ",");
            struct tmpl_node *nm = tmpl_parse_node(P, TMPL_N_NAME);
            nm->str = tmpl_parse_expect_name(P);
            tmpl_parse_vec_push(P, &targets, nm);
            tmpl_parse_expect_op(P, "=");
            tmpl_parse_vec_push(P, &vals, tmpl_parse_expression(P, 1));
        }
        n->args = targets.p;
        n->n_args = targets.n;
        n->args2 = vals.p;
        tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endwith", NULL};
        n->b = tmpl_parse_body(P, ends);
        tmpl_parse_end_name(P, ends, "with");
    } else if (!strcmp(tag, "generation")) {
        tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
        static const char *const ends[] = {"endgeneration", NULL};
        n = tmpl_parse_body(P, ends);
        tmpl_parse_end_name(P, ends, "generation");
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!P->loop_depth) {
            P->i--;
            tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "'%s' outside of a loop", tag);
        }
        n = tmpl_parse_node(P, tag[0] == 'b' ? TMPL_N_BREAK : TMPL_N_CONTINUE);
    } else {
        P->i--;
        tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "encountered unknown tag '%s'", tag);
    }
    tmpl_parse_expect(P, TMPL_T_BLOCK_END, "end of statement block");
    P->depth--;
    return n;
}

static struct tmpl_node *tmpl_parse_body(struct tmpl_parser *P, const char *const *end_tokens)
{
    tmpl_parse_enter(P);
    struct tmpl_parse_vec stmts = {0};
    struct tmpl_node *body = tmpl_parse_node(P, TMPL_N_BODY);
    for (;;) {
        const struct tmpl_token *t = tmpl_parse_cur(P);
        if (t->type == TMPL_T_EOF) {
            if (end_tokens) tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "unexpected end of template, expected '%s'", end_tokens[0]);
            break;
        }
        if (t->type == TMPL_T_DATA) {
            struct tmpl_node *d = tmpl_parse_node(P, TMPL_N_DATA);
            d->str = t->str;
            d->str_n = t->n;
            tmpl_parse_vec_push(P, &stmts, d);
            P->i++;
        } else if (t->type == TMPL_T_VAR_BEGIN) {
            P->i++;
            struct tmpl_node *o = tmpl_parse_node(P, TMPL_N_OUTPUT);
            o->a = tmpl_parse_tuple(P, 0, 1, NULL, 0);
            tmpl_parse_expect(P, TMPL_T_VAR_END, "end of print statement");
            tmpl_parse_vec_push(P, &stmts, o);
        } else if (t->type == TMPL_T_BLOCK_BEGIN) {
            if (end_tokens && tmpl_parse_at_end_tag(P, end_tokens)) break;
            P->i++;
            tmpl_parse_vec_push(P, &stmts, tmpl_parse_statement(P));
        } else {
            tmpl_parse_fail(P, CAIRN_ERR_FORMAT, "unexpected '%s'", tmpl_parse_describe(t));
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
 * tmpl_parse_uses. Everything that walks the tree recursively later relies on this bound. */
static int tmpl_parse_check_tree(struct tmpl_node *root, struct cairn_err *err)
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
        if (x->kind == TMPL_N_MACRO || x->kind == TMPL_N_CALLBLOCK) x->op = tmpl_parse_uses(x->b);
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
    struct tmpl_parser P = {.a = a, .t = toks, .n = n_toks, .err = err};
    if (setjmp(P.jmp)) return err ? err->status : CAIRN_ERR_FORMAT;
    *root = tmpl_parse_body(&P, NULL);
    return tmpl_parse_check_tree(*root, err);
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
