/* grammar room: the compilers' work limits (fuzz_grammar_parse found both blow-ups). A client's
 * regex, GBNF or schema pattern must not buy unbounded CPU: n nullable parts in a row ((a?){n})
 * give epsilon closures of n states each, n^2 in gram_b_finish (about 20 s for n = 2000 before
 * the limit); nested or long quantified atoms are parsed once per copy ([500 bytes]{10000} is
 * 5 MB of parsing that creates few states). Past GRAM_MAX_WORK / GRAM_MAX_REPARSE the compile
 * fails with CAIRN_ERR_LIMIT and says why; grammars below the limits still compile and match.
 * GBNF rule names are hashed (a grammar of n rules was n^2 compares): many names still resolve,
 * and a duplicate or a missing one among them is still found; an n-way alternation is one flat
 * pair of states (nested pairs cost n^2 closure members: 5000 ways failed GRAM_MAX_WORK). */
#include <jansson.h>

#include "grammar/grammar.h"
#include "grammar/grammar_int.h"
#include "test_grammar_util.h"
#include "testlib.h"

/* A compiled grammar accepts s exactly (the matcher, byte by byte). */
static int tl_full(struct grammar *g, const struct tg_vocab *tv, const char *s, size_t n)
{
    struct grammar_matcher *m;
    if (grammar_matcher_create(g, tv->v, &m, NULL)) return -1;
    int ok = grammar_matcher_accept_bytes(m, (const uint8_t *)s, n) == 0 && grammar_matcher_accepting(m);
    grammar_matcher_free(m);
    return ok;
}

/* Patterns are built here (they are large): "(a?){n}" and "[aaa...]{n}" and their GBNF forms. */
static char *tl_opt_run(int gbnf, int n)
{
    char *s = malloc(64);
    snprintf(s, 64, gbnf ? "root ::= (\"a\"?){%d}" : "(a?){%d}", n);
    return s;
}

static char *tl_long_class(int gbnf, int width, int n)
{
    char *s = malloc((size_t)width + 64);
    int w = snprintf(s, 64, "%s[", gbnf ? "root ::= " : "");
    memset(s + w, 'a', (size_t)width);
    snprintf(s + w + width, 64, "]{%d}", n);
    return s;
}

static int tl_compile(int gbnf, const char *pat, struct grammar **g, struct cairn_err *err)
{
    *err = (struct cairn_err){0};
    return gbnf ? grammar_from_gbnf(pat, strlen(pat), g, err) : grammar_from_regex(pat, strlen(pat), g, err);
}

static void test_nullable_runs(const struct tg_vocab *tv)
{
    for (int gbnf = 0; gbnf < 2; gbnf++) {
        /* below the limit (~30 n^2 closure members and edges; 280 is past it): compiles, and
         * means what it says */
        char *pat = tl_opt_run(gbnf, 150);
        struct grammar *g = NULL;
        struct cairn_err err;
        int rc = tl_compile(gbnf, pat, &g, &err);
        CHECK_MSG(rc == CAIRN_OK, "%s: %s", pat, err.msg);
        char as[152];
        memset(as, 'a', sizeof(as));
        if (g) {
            CHECK_EQ_INT(tl_full(g, tv, as, 0), 1);
            CHECK_EQ_INT(tl_full(g, tv, as, 150), 1);
            CHECK_EQ_INT(tl_full(g, tv, as, 151), 0);
        }
        grammar_free(g);
        free(pat);
        /* (a?){2000}: 2000 closures of up to 2000 states, past GRAM_MAX_WORK */
        pat = tl_opt_run(gbnf, 2000);
        g = NULL;
        rc = tl_compile(gbnf, pat, &g, &err);
        CHECK_MSG(rc == CAIRN_ERR_LIMIT && g == NULL, "%s: rc %d", pat, rc);
        CHECK_MSG(strstr(err.msg, "after removing the epsilons") != NULL, "%s: '%s'", pat, err.msg);
        grammar_free(g);
        free(pat);
    }
}

static void test_reparse(const struct tg_vocab *tv)
{
    for (int gbnf = 0; gbnf < 2; gbnf++) {
        /* 500-byte class {1000}: 0.5 MB parsed again, fine; {10000}: 5 MB, past GRAM_MAX_REPARSE */
        char *pat = tl_long_class(gbnf, 500, 1000);
        struct grammar *g = NULL;
        struct cairn_err err;
        int rc = tl_compile(gbnf, pat, &g, &err);
        CHECK_MSG(rc == CAIRN_OK, "class{1000}: %s", err.msg);
        char as[1001];
        memset(as, 'a', sizeof(as));
        if (g) {
            CHECK_EQ_INT(tl_full(g, tv, as, 1000), 1);
            CHECK_EQ_INT(tl_full(g, tv, as, 999), 0);
        }
        grammar_free(g);
        free(pat);
        pat = tl_long_class(gbnf, 500, 10000);
        g = NULL;
        rc = tl_compile(gbnf, pat, &g, &err);
        CHECK_MSG(rc == CAIRN_ERR_LIMIT && g == NULL, "class{10000}: rc %d", rc);
        CHECK_MSG(strstr(err.msg, "repeat counts expand") != NULL, "class{10000}: '%s'", err.msg);
        grammar_free(g);
        free(pat);
        /* nested repeats multiply: each of the 1000 outer copies parses the inner 100 again
         * (10 MB in all, for only ~300 k states: GRAM_MAX_STATES would not stop it) */
        char *inner = tl_long_class(0, 100, 100);
        pat = malloc(strlen(inner) + 64);
        snprintf(pat, strlen(inner) + 64, "%s(%s){1000}", gbnf ? "root ::= " : "", inner);
        g = NULL;
        rc = tl_compile(gbnf, pat, &g, &err);
        CHECK_MSG(rc == CAIRN_ERR_LIMIT && g == NULL, "nested: rc %d", rc);
        CHECK_MSG(strstr(err.msg, "repeat counts expand") != NULL, "nested: '%s'", err.msg);
        grammar_free(g);
        free(inner);
        free(pat);
    }
}

/* root ::= r0 | r1 | ... with rK ::= "<K>;" and n rules; extra is appended verbatim. */
static char *tl_many_rules(int n, const char *extra)
{
    size_t cap = (size_t)n * 40 + strlen(extra) + 64, w = 0;
    char *s = malloc(cap);
    w += (size_t)snprintf(s + w, cap - w, "root ::= r0");
    for (int k = 1; k < n; k++) w += (size_t)snprintf(s + w, cap - w, " | r%d", k);
    for (int k = n - 1; k >= 0; k--) w += (size_t)snprintf(s + w, cap - w, "\nr%d ::= \"%d;\"", k, k);
    snprintf(s + w, cap - w, "\n%s", extra);
    return s;
}

static void test_many_names(const struct tg_vocab *tv)
{
    char *src = tl_many_rules(5000, "");
    struct grammar *g = NULL;
    struct cairn_err err = {0};
    CHECK_MSG(grammar_from_gbnf(src, strlen(src), &g, &err) == CAIRN_OK, "5000 rules: %s", err.msg);
    if (g) {
        CHECK_EQ_INT(tl_full(g, tv, "0;", 2), 1);
        CHECK_EQ_INT(tl_full(g, tv, "4999;", 5), 1);
        CHECK_EQ_INT(tl_full(g, tv, "2718;", 5), 1);
        CHECK_EQ_INT(tl_full(g, tv, "5000;", 5), 0);
        CHECK_EQ_INT(tl_full(g, tv, "27;18;", 6), 0);
    }
    grammar_free(g);
    free(src);
    /* the same n-way alternation as a regex: flat, so far below GRAM_MAX_WORK */
    char *re = malloc(5000 * 8);
    size_t w = 0;
    for (int k = 0; k < 5000; k++) w += (size_t)snprintf(re + w, 5000 * 8 - w, "%sv%d", k ? "|" : "", k);
    g = NULL;
    CHECK_MSG(grammar_from_regex(re, w, &g, &err) == CAIRN_OK, "5000 alternatives: %s", err.msg);
    if (g) {
        CHECK_EQ_INT(tl_full(g, tv, "v4321", 5), 1);
        CHECK_EQ_INT(tl_full(g, tv, "v5000", 5), 0);
    }
    grammar_free(g);
    free(re);
    src = tl_many_rules(5000, "r3999 ::= \"x\"");
    g = NULL;
    CHECK_EQ_INT(grammar_from_gbnf(src, strlen(src), &g, &err), CAIRN_ERR_INVALID);
    CHECK_MSG(g == NULL && strstr(err.msg, "defined twice"), "'%s'", err.msg);
    free(src);
    src = tl_many_rules(5000, "r17 ::= r5000");
    src[strstr(src, "\nr17 ::=") - src + 1] = 'q'; /* rename the first r17, so r17 stays defined once */
    g = NULL;
    CHECK_EQ_INT(grammar_from_gbnf(src, strlen(src), &g, &err), CAIRN_ERR_INVALID);
    CHECK_MSG(g == NULL && strstr(err.msg, "'r5000' is used but not defined"), "'%s'", err.msg);
    free(src);
}

/* The limits hold through a JSON schema's pattern, and the largest ordinary schemas still fit. */
static void test_schema(void)
{
    json_error_t je;
    json_t *js = json_loads("{\"type\":\"string\",\"pattern\":\"^(a?){2000}$\"}", 0, &je);
    struct grammar *g = NULL;
    struct cairn_err err = {0};
    int rc = grammar_from_json_schema(js, &g, &err);
    CHECK_EQ_INT(rc, CAIRN_ERR_LIMIT);
    CHECK(g == NULL && err.msg[0]);
    grammar_free(g);
    json_decref(js);
    /* eight strings of maxLength 4096 (GS_MAX_ITEMS, the schema compiler's own bound) */
    json_t *props = json_object(), *req = json_array();
    for (char k = 'a'; k < 'i'; k++) {
        char name[2] = {k, 0};
        json_object_set_new(props, name, json_pack("{s:s,s:i}", "type", "string", "maxLength", 4096));
        json_array_append_new(req, json_string(name));
    }
    js = json_pack("{s:s,s:o,s:o}", "type", "object", "properties", props, "required", req);
    g = NULL;
    CHECK_MSG(grammar_from_json_schema(js, &g, &err) == CAIRN_OK, "8 x maxLength 4096: %s", err.msg);
    grammar_free(g);
    json_decref(js);
}

int main(void)
{
    struct tg_vocab tv;
    CHECK(tg_vocab_make(&tv, 300) == 0);
    test_nullable_runs(&tv);
    test_reparse(&tv);
    test_many_names(&tv);
    test_schema();
    tg_vocab_free(&tv);
    return test_summary("test_grammar_limits");
}
