/* JSON Schema -> grammar (the subset and output form in grammar.h).
 *
 * Every schema node becomes a rule, memoized by node pointer, so $ref (recursion included) and
 * repeated sub-schemas are calls. Objects: properties in declared order; with optional ones,
 * rules S_i ("nothing written yet, properties i.. left") and R_i ("something written") keep the
 * commas right in O(n) states. Numbers with bounds: integer parts from a decimal range
 * automaton; fractions only where the whole interval [I, I+1) stays inside the bounds (a subset
 * of the allowed numbers, never a value outside them).
 *
 * This file: dispatch, strings, any value, objects and arrays, the entry points. Numbers are in
 * grammar_schema_num.c, $ref resolution and the oneOf check in grammar_schema_oneof.c; the
 * state and the small fragments they share in grammar_schema_int.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_schema_int.h"

static int32_t gs_rule(struct gs *s, const json_t *node, const char *seg);

/* ---- small fragments (more in grammar_schema_int.h) ---- */

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
    struct gram_frag num = gram_schema_number(s, NULL, 0);
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

static struct gram_frag gs_type(struct gs *s, const json_t *node, const char *t)
{
    if (!strcmp(t, "string")) return gs_string(s, node);
    if (!strcmp(t, "integer")) return gram_schema_number(s, node, 1);
    if (!strcmp(t, "number")) return gram_schema_number(s, node, 0);
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
        const json_t *target = ref ? gram_schema_resolve(s, ref) : NULL;
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
        if (json_is_array(v) && !gram_schema_oneof_disjoint(s, v)) {
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
