/* JSON Schema $ref resolution and the oneOf disjointness check (part of grammar_schema.c's
 * compiler; see grammar_schema_int.h). A oneOf compiles like anyOf only when no value can match
 * two branches: their kinds of value, their listed values (const / enum), or for objects a
 * required property with disjoint listed values or one the other forbids tell them apart;
 * grammar_schema.c rejects any other oneOf. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_schema_int.h"

const json_t *gram_schema_resolve(struct gs *s, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const json_t *cur = s->root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof(seg)) {
            if (p[0] == '~' && p[1] == '1') {
                seg[n++] = '/';
                p += 2;
            } else if (p[0] == '~' && p[1] == '0') {
                seg[n++] = '~';
                p += 2;
            } else
                seg[n++] = *p++;
        }
        seg[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, seg);
        else if (json_is_array(cur)) {
            char *end;
            long idx = strtol(seg, &end, 10);
            cur = *end || idx < 0 ? NULL : json_array_get(cur, (size_t)idx);
        } else
            cur = NULL;
    }
    return *p ? NULL : cur;
}

/* ---- oneOf: provably disjoint branches ---- */

enum { GS_K_NULL = 1, GS_K_BOOL = 2, GS_K_OBJ = 4, GS_K_ARR = 8, GS_K_STR = 16, GS_K_INT = 32, GS_K_FRAC = 64, GS_K_ALL = 127 };

static int gs_kind_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return GS_K_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return GS_K_BOOL;
    case JSON_OBJECT: return GS_K_OBJ;
    case JSON_ARRAY: return GS_K_ARR;
    case JSON_STRING: return GS_K_STR;
    case JSON_INTEGER: return GS_K_INT;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? GS_K_INT : GS_K_FRAC;
    }
    return GS_K_ALL;
}

static int gs_kind_name(const char *t)
{
    static const struct {
        const char *n;
        int k;
    } tab[] = {{"null", GS_K_NULL}, {"boolean", GS_K_BOOL}, {"object", GS_K_OBJ}, {"array", GS_K_ARR},
               {"string", GS_K_STR}, {"integer", GS_K_INT}, {"number", GS_K_INT | GS_K_FRAC}};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(tab); i++)
        if (!strcmp(t, tab[i].n)) return tab[i].k;
    return GS_K_ALL;
}

/* Follows $ref (a few levels); NULL when it does not resolve. */
static const json_t *gs_deref(struct gs *s, const json_t *node)
{
    for (int i = 0; i < 8 && json_is_object(node); i++) {
        const char *ref = json_string_value(json_object_get(node, "$ref"));
        if (!ref) return node;
        node = gram_schema_resolve(s, ref);
    }
    return json_is_object(node) && !json_object_get(node, "$ref") ? node : NULL;
}

/* The kinds of JSON value the schema can accept (a superset). */
static int gs_kinds(struct gs *s, const json_t *node, int depth)
{
    if (depth > 8 || json_is_true(node)) return GS_K_ALL;
    if (json_is_false(node)) return 0;
    node = gs_deref(s, node);
    if (!node) return GS_K_ALL;
    int k = GS_K_ALL;
    const json_t *v = json_object_get(node, "type"), *e;
    size_t i;
    if (json_is_string(v)) k = gs_kind_name(json_string_value(v));
    else if (json_is_array(v)) {
        k = 0;
        json_array_foreach(v, i, e) k |= json_is_string(e) ? gs_kind_name(json_string_value(e)) : GS_K_ALL;
    }
    if ((v = json_object_get(node, "const"))) k &= gs_kind_of(v);
    if (json_is_array(v = json_object_get(node, "enum"))) {
        int u = 0;
        json_array_foreach(v, i, e) u |= gs_kind_of(e);
        k &= u;
    }
    const char *comb[] = {"anyOf", "oneOf", "allOf"};
    for (int c = 0; c < 3; c++)
        if (json_is_array(v = json_object_get(node, comb[c]))) {
            int u = c == 2 ? GS_K_ALL : 0;
            json_array_foreach(v, i, e) {
                int x = gs_kinds(s, e, depth + 1);
                u = c == 2 ? u & x : u | x;
            }
            k &= u;
        }
    return k;
}

/* The values the schema allows when it lists them (const / enum), else NULL. Borrowed. */
static const json_t *gs_values(struct gs *s, const json_t *node, json_t **tmp)
{
    node = gs_deref(s, node);
    if (!node) return NULL;
    const json_t *v;
    if ((v = json_object_get(node, "const"))) {
        *tmp = json_pack("[O]", v);
        return *tmp;
    }
    v = json_object_get(node, "enum");
    return json_is_array(v) ? v : NULL;
}

static int gs_same_value(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

/* 1 if the two listed value sets share no value. */
static int gs_values_disjoint(const json_t *x, const json_t *y)
{
    size_t i, j;
    const json_t *a, *c;
    json_array_foreach(x, i, a) json_array_foreach(y, j, c) if (gs_same_value(a, c)) return 0;
    return 1;
}

static int gs_requires(const json_t *node, const char *name)
{
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(node, "required"), i, r) if (json_is_string(r) && !strcmp(json_string_value(r), name)) return 1;
    return 0;
}

/* Objects of x and y can't coincide: a property both require with disjoint listed values, or
 * one x requires that y forbids (not listed, additionalProperties false). */
static int gs_objects_disjoint(struct gs *s, const json_t *x, const json_t *y)
{
    x = gs_deref(s, x);
    y = gs_deref(s, y);
    if (!x || !y) return 0;
    for (int pass = 0; pass < 2; pass++) {
        const json_t *a = pass ? y : x, *c = pass ? x : y;
        const json_t *pa = json_object_get(a, "properties"), *pc = json_object_get(c, "properties");
        const char *key;
        const json_t *sub;
        json_object_foreach((json_t *)pa, key, sub) {
            if (!gs_requires(a, key)) continue;
            const json_t *other = json_object_get(pc, key);
            if (!other) {
                if (json_is_false(json_object_get(c, "additionalProperties"))) return 1;
                continue;
            }
            if (pass || !gs_requires(c, key)) continue;
            json_t *t1 = NULL, *t2 = NULL;
            const json_t *v1 = gs_values(s, sub, &t1), *v2 = gs_values(s, other, &t2);
            int dis = v1 && v2 && gs_values_disjoint(v1, v2);
            json_decref(t1);
            json_decref(t2);
            if (dis) return 1;
        }
    }
    return 0;
}

/* 1 if no value validates against two branches of the oneOf (so anyOf means the same). */
int gram_schema_oneof_disjoint(struct gs *s, const json_t *arr)
{
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            const json_t *x = json_array_get(arr, i), *y = json_array_get(arr, j);
            int k = gs_kinds(s, x, 0) & gs_kinds(s, y, 0);
            if (!k) continue;
            json_t *t1 = NULL, *t2 = NULL;
            const json_t *v1 = gs_values(s, x, &t1), *v2 = gs_values(s, y, &t2);
            int dis = v1 && v2 && gs_values_disjoint(v1, v2);
            json_decref(t1);
            json_decref(t2);
            if (dis) continue;
            if (k == GS_K_OBJ && gs_objects_disjoint(s, x, y)) continue;
            return 0;
        }
    return 1;
}
