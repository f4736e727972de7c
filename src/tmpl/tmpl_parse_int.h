/* Internals of the tmpl parser shared by tmpl_parse_expr.c (the token cursor, errors, node
 * allocation, expressions) and tmpl_parse.c (statements, bodies, the tree check, tmpl_parse and
 * tmpl_compile). Not for other files.
 *
 * Errors do not return: tmpl_parse_fail sets P->err and longjmps to P->jmp, set by tmpl_parse;
 * nodes live in P->a, the arena of the compiled template. */
#ifndef CAIRN_TMPL_TMPL_PARSE_INT_H
#define CAIRN_TMPL_TMPL_PARSE_INT_H

#include "tmpl/tmpl_int.h"

struct tmpl_parser {
    struct tmpl_arena *a;
    const struct tmpl_token *t;
    size_t n, i;
    int depth;
    int loop_depth; /* for bodies we are in (macro / call bodies reset it): break/continue */
    struct cairn_err *err;
    jmp_buf jmp;
};

/* growable node vectors (in the arena) */
struct tmpl_parse_vec {
    struct tmpl_node **p;
    size_t n, cap;
};

/* "template syntax error: line N: ..." into P->err, then longjmp. */
void tmpl_parse_fail(struct tmpl_parser *P, int status, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* A zeroed node of kind k at the current token's line. */
struct tmpl_node *tmpl_parse_node(struct tmpl_parser *P, enum tmpl_node_kind k);
void tmpl_parse_vec_push(struct tmpl_parser *P, struct tmpl_parse_vec *v, struct tmpl_node *x);

/* The token cursor: cur peeks, next consumes (never past EOF); is_* test the current token,
 * skip_* consume it when it matches, expect_* fail unless it matches. */
const struct tmpl_token *tmpl_parse_cur(struct tmpl_parser *P);
const struct tmpl_token *tmpl_parse_next(struct tmpl_parser *P);
int tmpl_parse_is_op(struct tmpl_parser *P, const char *op);
int tmpl_parse_is_name(struct tmpl_parser *P, const char *name);
int tmpl_parse_skip_op(struct tmpl_parser *P, const char *op);
int tmpl_parse_skip_name(struct tmpl_parser *P, const char *name);
void tmpl_parse_expect_op(struct tmpl_parser *P, const char *op);
const char *tmpl_parse_expect_name(struct tmpl_parser *P);
void tmpl_parse_expect(struct tmpl_parser *P, enum tmpl_token_type type, const char *what);
/* A token as error messages name it. */
const char *tmpl_parse_describe(const struct tmpl_token *t);
/* One more level of nesting: fails past TMPL_MAX_PARSE_DEPTH (the caller undoes P->depth). */
void tmpl_parse_enter(struct tmpl_parser *P);

/* Expressions. with_condexpr: `a if b else c` allowed. */
struct tmpl_node *tmpl_parse_expression(struct tmpl_parser *P, int with_condexpr);
/* The current token ends a tuple: end of a tag, ')', or one of the names in extra (NULL-ended). */
int tmpl_parse_is_tuple_end(struct tmpl_parser *P, const char *const *extra);
/* expr or expr, expr, ... (tuple). explicit: inside parentheses (empty tuple allowed). */
struct tmpl_node *tmpl_parse_tuple(struct tmpl_parser *P, int simplified, int with_condexpr,
                                   const char *const *extra, int explicit);
/* The filters applied to node ({% filter %} blocks: start_inline 1, the first without a '|'). */
struct tmpl_node *tmpl_parse_filter(struct tmpl_parser *P, struct tmpl_node *node, int start_inline);

#endif
