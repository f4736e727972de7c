/* Helpers for the engine oracle tests: a minimal reader of the oracle's expected.safetensors
 * (case tokens and margins) and an engine with f32 KV. */
#ifndef CAIRN_TEST_ENGINE_ORACLE_UTIL_H
#define CAIRN_TEST_ENGINE_ORACLE_UTIL_H

#include <jansson.h>

#include "engine/engine.h"
#include "engine_testutil.h"
#include "model/model.h"
#include "test_backend.h"
#include "testlib.h"

#define MAX_CASES 8
#define MARGIN_MIN 0.01f /* logit margin well above the f32-vs-f64 logit error (~2e-3): the
                         * greedy token is meaningful */

struct oracle_case {
    int32_t tokens[1024];
    float margins[1024];
    int total_len, prompt_len;
};

struct oracle {
    struct oracle_case cases[MAX_CASES];
    int n_cases;
};

/* Minimal reader of expected.safetensors: case{i}.tokens (I32), case{i}.margins (F32). */
static inline int oracle_read(const char *path, struct oracle *o)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t hlen = 0;
    int ok = 0;
    char *hdr = NULL;
    uint8_t *data = NULL;
    json_t *root = NULL;
    if (fread(&hlen, 8, 1, f) != 1 || hlen > (1u << 24)) goto out;
    hdr = calloc(1, hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) goto out;
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    size_t n_data = (size_t)end - 8 - hlen;
    data = malloc(n_data);
    fseek(f, (long)(8 + hlen), SEEK_SET);
    if (!data || fread(data, 1, n_data, f) != n_data) goto out;
    root = json_loads(hdr, 0, NULL);
    if (!root) goto out;
    json_t *meta = json_object_get(root, "__metadata__");
    json_t *cases = json_loads(json_string_value(json_object_get(meta, "cases")), 0, NULL);
    if (!cases) goto out;
    o->n_cases = 0;
    for (size_t i = 0; i < json_array_size(cases) && i < MAX_CASES; i++) {
        json_t *c = json_array_get(cases, i);
        struct oracle_case *oc = &o->cases[o->n_cases];
        oc->prompt_len = (int)json_integer_value(json_object_get(c, "prompt_len"));
        oc->total_len = (int)json_integer_value(json_object_get(c, "total_len"));
        if (oc->total_len > 1024) continue;
        char name[64];
        snprintf(name, sizeof(name), "case%zu.tokens", i);
        json_t *t = json_object_get(root, name);
        snprintf(name, sizeof(name), "case%zu.margins", i);
        json_t *m = json_object_get(root, name);
        if (!t || !m) continue;
        size_t t0 = (size_t)json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
        size_t m0 = (size_t)json_integer_value(json_array_get(json_object_get(m, "data_offsets"), 0));
        memcpy(oc->tokens, data + t0, (size_t)oc->total_len * 4);
        memcpy(oc->margins, data + m0, (size_t)oc->total_len * 4);
        o->n_cases++;
    }
    json_decref(cases);
    ok = o->n_cases > 0;
out:
    json_decref(root);
    free(hdr);
    free(data);
    fclose(f);
    return ok;
}

/* Reads the oracle cases of tests/data/oracle/models/<name> into *o and loads the model on the
 * CPU test backend; NULL (a failed check recorded) when either fails. */
static inline struct model *oracle_open(const char *name, struct oracle *o)
{
    char dir[1024], rel[256], exp[1100];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    test_src_path(rel, dir, sizeof(dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", dir);
    if (!oracle_read(exp, o)) {
        CHECK_MSG(0, "%s: cannot read %s", name, exp);
        return NULL;
    }
    struct model *m = NULL;
    struct cairn_err err = {0};
    int rc = model_load(dir, test_cpu_be(), &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    return rc == CAIRN_OK ? m : NULL;
}

/* Number of generated tokens that must equal the oracle: up to the first low-margin position. */
static inline int oracle_n_trusted(const struct oracle_case *c)
{
    int n = 0;
    for (int p = c->prompt_len - 1; p < c->total_len - 1; p++) {
        if (c->margins[p] < MARGIN_MIN) break;
        n++;
    }
    return n;
}

/* The oracle tests' engine options: f32 KV, 256-token steps; callers may adjust before create. */
static inline void oracle_engine_opts(struct engine_opts *o, int block_size, uint64_t kv_bytes, int max_running)
{
    memset(o, 0, sizeof(*o));
    engine_opts_default(o);
    o->kv_dtype = DTYPE_F32;
    o->block_size = block_size;
    o->kv_bytes = kv_bytes;
    o->max_running = max_running;
    o->max_batch_tokens = 256;
}

static inline struct engine *oracle_engine_create(struct model *m, const struct engine_opts *o)
{
    struct engine *e = NULL;
    struct cairn_err err = {0};
    int rc = engine_create(m, o, &e, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    return e;
}

static inline struct engine *oracle_engine(struct model *m, int block_size, uint64_t kv_bytes, int max_running)
{
    struct engine_opts o;
    oracle_engine_opts(&o, block_size, kv_bytes, max_running);
    return oracle_engine_create(m, &o);
}

static inline int same_tokens(const struct collect *a, const struct collect *b)
{
    return a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens) == 0;
}

#endif
