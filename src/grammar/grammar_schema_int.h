/* JSON Schema -> grammar internals, shared by grammar_schema.c (dispatch, strings, objects,
 * arrays, the entry points), grammar_schema_num.c (integer and number ranges) and
 * grammar_schema_oneof.c ($ref resolution, the oneOf disjointness check). Not for other files.
 *
 * The small fragment helpers are static inline here so the two leaf files depend on this header
 * only, never back on grammar_schema.c. The functions the leaves export are gram_schema_*
 * (the room's internal prefix); the helpers here keep grammar_schema.c's gs_ prefix. */
#ifndef CAIRN_GRAMMAR_GRAMMAR_SCHEMA_INT_H
#define CAIRN_GRAMMAR_GRAMMAR_SCHEMA_INT_H

#include <stdio.h>
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

static inline int gs_fail(struct gs *s, int status, const char *fmt, const char *arg)
{
    char msg[300];
    snprintf(msg, sizeof(msg), fmt, arg);
    return gram_b_fail(s->b, status, "%s at %s", msg, s->path[0] ? s->path : "/");
}

/* ---- small fragments ---- */

static inline struct gram_frag gs_lit(struct gs *s, const char *t) { return gram_f_bytes(s->b, t, strlen(t)); }

static inline struct gram_frag gs_ws(struct gs *s) { return gram_f_opt(s->b, gram_f_range(s->b, ' ', ' ')); }

/* x repeated lo..hi times (hi < 0: unbounded); emit() makes a fresh copy each time. */
static inline struct gram_frag gs_rep(struct gs *s, struct gram_frag (*emit)(struct gs *, void *), void *ctx,
                                      long lo, long hi)
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

/* grammar_schema_num.c: a JSON integer (integer = 1) or number within node's bounds
 * (minimum, maximum, exclusive ones) and multipleOf; node NULL: any number. */
struct gram_frag gram_schema_number(struct gs *s, const json_t *node, int integer);

/* grammar_schema_oneof.c */
/* The node a local $ref ("#/a/b", JSON-pointer escapes) names, or NULL. */
const json_t *gram_schema_resolve(struct gs *s, const char *ref);
/* 1 if no value validates against two branches of the oneOf (so anyOf means the same). */
int gram_schema_oneof_disjoint(struct gs *s, const json_t *arr);

#endif
