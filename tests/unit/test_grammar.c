/* grammar room: regexes and GBNF grammars against PCRE2 (an independent matcher: the strings our
 * matcher generates must match there, and mutated strings must get the same verdict from both),
 * token masks against a brute-force reference (every token's bytes tried through the matcher),
 * rollback, and the compilers' errors. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "grammar/grammar.h"
#include "test_grammar_util.h"
#include "testlib.h"

static pcre2_code *pcre_compile_full(const char *pat)
{
    char buf[4096];
    snprintf(buf, sizeof(buf), "^(?:%s)$", pat);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
    if (!c) fprintf(stderr, "pcre2 cannot compile %s\n", buf);
    return c;
}

static int pcre_full(pcre2_code *c, const char *s, size_t n)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static int ours_full(struct grammar *g, const struct tg_vocab *tv, const char *s, size_t n)
{
    struct grammar_matcher *m;
    if (grammar_matcher_create(g, tv->v, &m, NULL)) return -1;
    int ok = grammar_matcher_accept_bytes(m, (const uint8_t *)s, n) == 0 && grammar_matcher_accepting(m);
    grammar_matcher_free(m);
    return ok;
}

/* Generated strings match the reference; mutations get the same verdict. */
static void check_against_pcre(struct grammar *g, pcre2_code *pc, const struct tg_vocab *tv, const char *name)
{
    static const char alphabet[] = "aZ09_-.:@\"\\ \n{}[],()xyz\xc3\xa9\xe6\x97\xa5";
    int n_gen = 0, n_agree = 0, n_mut = 0, n_pos_mut = 0;
    for (int k = 0; k < 40; k++) {
        struct grammar_matcher *m;
        if (grammar_matcher_create(g, tv->v, &m, NULL)) break;
        char out[512];
        size_t n;
        int ended = tg_walk_n(m, tv, 60, 0.25, out, sizeof(out), &n, 0, NULL);
        grammar_matcher_free(m);
        if (!ended) continue;
        n_gen++;
        CHECK_MSG(pcre_full(pc, out, n), "%s: generated '%.*s' does not match PCRE2", name, (int)n, out);
        for (int j = 0; j < 8; j++) {
            char mut[600];
            size_t mn = n;
            memcpy(mut, out, n);
            int op = (int)(tg_rand() % 3);
            size_t at = mn ? tg_rand() % (uint32_t)(mn + 1) : 0;
            char c = alphabet[tg_rand() % (sizeof(alphabet) - 1)];
            if (op == 0 && at < mn) mut[at] = c;
            else if (op == 1) {
                memmove(mut + at + 1, mut + at, mn - at);
                mut[at] = c;
                mn++;
            } else if (at < mn) {
                memmove(mut + at, mut + at + 1, mn - at - 1);
                mn--;
            }
            int want = pcre_full(pc, mut, mn), got = ours_full(g, tv, mut, mn);
            n_mut++;
            n_pos_mut += want;
            n_agree += want == got;
            if (want != got) fprintf(stderr, "%s: '%.*s' pcre2 %d ours %d\n", name, (int)mn, mut, want, got);
        }
    }
    CHECK_MSG(n_gen >= 10, "%s: only %d walks ended", name, n_gen);
    CHECK_MSG(n_agree == n_mut, "%s: %d of %d mutations agree", name, n_agree, n_mut);
    (void)n_pos_mut;
}

static void test_regex(const struct tg_vocab *tv)
{
    static const char *pats[] = {
        "abc",
        "a|b|cd",
        "[a-z]+",
        "[^\\n\"]{1,5}",
        "\\d{3}-\\d{4}",
        "(ab|c)*d",
        "x?y+z*",
        "[0-9a-f]{8}-[0-9a-f]{4}",
        "\\w+@\\w+\\.(com|org)",
        ".{2,4}",
        "é+|日本",
        "[\\u00e0-\\u00ff]{1,3}",
        "(?:a|b){2}(?:c|d){0,2}",
        "\\s?\\S{1,3}",
        "^-?(0|[1-9][0-9]*)(\\.[0-9]+)?$",
        "[^a-z]{2}",
        "((a|b)c){1,3}",
        "\\x41\\.\\*\\{",
    };
    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_regex(pats[i], strlen(pats[i]), &g, &err);
        CHECK_MSG(rc == 0, "regex %s: %s", pats[i], err.msg);
        /* PCRE2 writes \uHHHH as \x{HHHH} */
        char ref[256];
        size_t w = 0;
        for (const char *p = pats[i]; *p && w + 8 < sizeof(ref); p++) {
            if (p[0] == '\\' && p[1] == 'u') {
                w += (size_t)snprintf(ref + w, sizeof(ref) - w, "\\x{%.4s}", p + 2);
                p += 5;
            } else if (p[0] == '\\' && p[1]) {
                ref[w++] = *p++;
                ref[w++] = *p;
            } else
                ref[w++] = *p;
        }
        ref[w] = 0;
        pcre2_code *pc = pcre_compile_full(ref);
        CHECK(pc != NULL);
        if (!rc && pc) check_against_pcre(g, pc, tv, pats[i]);
        pcre2_code_free(pc);
        grammar_free(g);
    }
    /* unsupported constructs are named */
    static const char *bad[] = {"(?=a)", "a\\1", "(?<n>a)", "a**", "[a", "(a", "a{3,1}", "\\p{L}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_regex(bad[i], strlen(bad[i]), &g, &err);
        CHECK_MSG(rc < 0 && g == NULL && strstr(err.msg, "regex:"), "bad regex %s accepted (%s)", bad[i], err.msg);
    }
}

static void test_gbnf(const struct tg_vocab *tv)
{
    static const struct {
        const char *gbnf, *pcre;
    } cases[] = {
        {"root ::= \"a\" | \"bc\"", "a|bc"},
        {"root ::= item (\",\" item)*\nitem ::= [0-9]+ # numbers\n", "[0-9]+(,[0-9]+)*"},
        {"root ::= \"(\" root* \")\"", "(\\((?1)*\\))"},
        {"root ::= list\nlist ::= \"[\" (val (\",\" val)*)? \"]\"\nval ::= [a-c] | list", "(\\[(?:(?:[a-c]|(?1))(?:,(?:[a-c]|(?1)))*)?\\])"},
        {"root ::= [a-z]{2,3} \"-\"? \"x\"{1,}", "[a-z]{2,3}-?x+"},
        {"root ::= \"\\u00e9\" [^a-z\\n]", "\\x{e9}[^a-z\\n]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_gbnf(cases[i].gbnf, strlen(cases[i].gbnf), &g, &err);
        CHECK_MSG(rc == 0, "gbnf %s: %s", cases[i].gbnf, err.msg);
        pcre2_code *pc = pcre_compile_full(cases[i].pcre);
        CHECK(pc != NULL);
        if (!rc && pc) check_against_pcre(g, pc, tv, cases[i].gbnf);
        pcre2_code_free(pc);
        grammar_free(g);
    }
    static const char *bad[] = {"root ::= a", "root ::= root \"x\"", "root ::= \"x", "x ::= \"a\"\nx ::= \"b\"\nroot ::= x",
                                "root ::= (\"a\"", "junk"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_gbnf(bad[i], strlen(bad[i]), &g, &err);
        CHECK_MSG(rc < 0 && g == NULL && err.msg[0], "bad gbnf accepted: %s", bad[i]);
    }
}

/* Masks equal the brute-force reference along random walks, for schemas with every construct. */
static void test_masks_and_rollback(const struct tg_vocab *tv)
{
    static const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"tag\":{\"enum\":[\"a\",\"é\",null,3]}},\"required\":[\"name\"],\"additionalProperties\":false}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\",\"exclusiveMinimum\":-2.5,\"maximum\":7},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}},\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/n\"}",
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"format\":\"date\"},{\"type\":\"boolean\"},{\"type\":\"null\"}]},\"minItems\":1,\"maxItems\":3}",
        "{\"type\":\"object\"}",
    };
    for (size_t i = 0; i < sizeof(schemas) / sizeof(schemas[0]); i++) {
        json_error_t je;
        json_t *js = json_loads(schemas[i], 0, &je);
        CHECK(js != NULL);
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_json_schema(js, &g, &err);
        CHECK_MSG(rc == 0, "schema %zu: %s", i, err.msg);
        json_decref(js);
        if (rc) continue;
        int brute_ok = 1, n_valid = 0, n_ended = 0;
        for (int k = 0; k < 12; k++) {
            struct grammar_matcher *m;
            CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == 0);
            char out[4096];
            int ended = tg_walk(m, tv, 80, 0.5, out, sizeof(out), k < 3, &brute_ok);
            if (ended) {
                n_ended++;
                json_t *o = json_loads(out, JSON_DECODE_ANY, &je);
                /* jansson refuses numbers beyond a double (1e999), which JSON allows */
                n_valid += o != NULL || strstr(je.text, "overflow") != NULL;
                if (!o) fprintf(stderr, "schema %zu: not JSON: %s\n", i, out);
                json_decref(o);
            }
            /* rollback: undo some steps, the mask is the one seen there before */
            int n = grammar_matcher_n_steps(m);
            if (n >= 4) {
                CHECK(grammar_matcher_rollback(m, n) == 0);
                size_t words = ((size_t)tv->n + 31) / 32;
                uint32_t *a = malloc(words * 4), *b = malloc(words * 4);
                grammar_matcher_fill_mask(m, a);
                /* replay two allowed tokens, roll back two, compare */
                for (int r = 0; r < 2; r++) {
                    grammar_matcher_fill_mask(m, b);
                    for (int t = 0; t < tv->n - 1; t++)
                        if (tg_bit(b, t)) {
                            CHECK(grammar_matcher_accept_token(m, t) == 0);
                            break;
                        }
                }
                CHECK(grammar_matcher_rollback(m, 2) == 0);
                grammar_matcher_fill_mask(m, b);
                CHECK(memcmp(a, b, words * 4) == 0);
                CHECK(grammar_matcher_rollback(m, 1) == CAIRN_ERR_INVALID);
                free(a);
                free(b);
            }
            grammar_matcher_free(m);
        }
        CHECK_MSG(brute_ok, "schema %zu: mask differs from brute force", i);
        CHECK_MSG(n_ended >= 3 && n_valid == n_ended, "schema %zu: %d ended, %d valid JSON", i, n_ended, n_valid);
        grammar_free(g);
    }
}

static int compiles_to(const char *schema, struct grammar **g)
{
    json_t *js = json_loads(schema, 0, NULL);
    struct cairn_err err = {0};
    int rc = grammar_from_json_schema(js, g, &err);
    json_decref(js);
    CHECK_MSG(rc == 0, "%s: %s", schema, err.msg);
    return rc == 0;
}

/* multipleOf against arithmetic, and min/maxProperties against the subsets' sizes. */
static void test_schema_counts(const struct tg_vocab *tv)
{
    static const struct {
        const char *schema;
        int m;
        long lo, hi; /* inclusive, LONG_MIN / LONG_MAX: none */
    } mult[] = {
        {"{\"type\":\"integer\",\"multipleOf\":3}", 3, -100000, 100000},
        {"{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":-50,\"maximum\":200}", 7, -50, 200},
        {"{\"type\":\"integer\",\"multipleOf\":7,\"minimum\":-1000000,\"maximum\":1000000}", 7, -1000000, 1000000},
        {"{\"type\":\"integer\",\"multipleOf\":25,\"minimum\":0}", 25, 0, 100000},
        {"{\"type\":\"integer\",\"multipleOf\":10,\"exclusiveMinimum\":5}", 10, 6, 100000},
        {"{\"type\":\"number\",\"multipleOf\":4,\"maximum\":-8}", 4, -100000, -8},
    };
    for (size_t i = 0; i < sizeof(mult) / sizeof(mult[0]); i++) {
        struct grammar *g = NULL;
        if (!compiles_to(mult[i].schema, &g)) continue;
        int bad = 0;
        for (long x = -320; x <= 320 && bad < 3; x++) {
            char t[32];
            snprintf(t, sizeof(t), "%ld", x);
            int want = x % mult[i].m == 0 && x >= mult[i].lo && x <= mult[i].hi;
            if (ours_full(g, tv, t, strlen(t)) != want) {
                fprintf(stderr, "%s on %s: want %d\n", mult[i].schema, t, want);
                bad++;
            }
        }
        CHECK_MSG(bad == 0, "%s", mult[i].schema);
        CHECK(ours_full(g, tv, "3.0", 3) == 0); /* integers only */
        /* no dead ends: every walk can go on until it ends */
        size_t words = ((size_t)tv->n + 31) / 32;
        uint32_t *mask = malloc(words * 4);
        for (int k = 0; k < 30; k++) {
            struct grammar_matcher *m;
            CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == 0);
            char out[256];
            if (!tg_walk(m, tv, 20, 0.05, out, sizeof(out), 0, NULL))
                CHECK_MSG(grammar_matcher_fill_mask(m, mask) > 0, "%s: dead end after '%s'", mult[i].schema, out);
            grammar_matcher_free(m);
        }
        free(mask);
        grammar_free(g);
    }
    struct grammar *g = NULL;
    const char *sch = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},"
                      "\"c\":{\"type\":\"integer\"},\"d\":{\"type\":\"integer\"}},\"required\":[\"b\"],\"minProperties\":2,"
                      "\"maxProperties\":3}";
    if (compiles_to(sch, &g)) {
        for (int set = 0; set < 16; set++) { /* every subset, in declared order */
            char t[128];
            size_t n = 0;
            int k = 0;
            n += (size_t)snprintf(t + n, sizeof(t) - n, "{");
            for (int p = 0; p < 4; p++)
                if (set >> p & 1) n += (size_t)snprintf(t + n, sizeof(t) - n, "%s\"%c\":%d", k++ ? "," : "", 'a' + p, p);
            snprintf(t + n, sizeof(t) - n, "}");
            int want = k >= 2 && k <= 3 && (set & 2);
            CHECK_MSG(ours_full(g, tv, t, strlen(t)) == want, "%s: want %d", t, want);
        }
        /* no dead ends: no walk reaches an object it cannot close */
        size_t words = ((size_t)tv->n + 31) / 32;
        uint32_t *mask = malloc(words * 4);
        for (int k = 0; k < 30; k++) {
            struct grammar_matcher *m;
            CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == 0);
            char out[1024];
            if (!tg_walk(m, tv, 60, 0.2, out, sizeof(out), 0, NULL))
                CHECK_MSG(grammar_matcher_fill_mask(m, mask) > 0, "dead end after '%s'", out);
            grammar_matcher_free(m);
        }
        free(mask);
        grammar_free(g);
    }
}

/* Specific values: what must and must not pass. */
static void test_schema_values(const struct tg_vocab *tv)
{
    static const struct {
        const char *schema, *text;
        int ok;
    } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":17}", "-5", 1},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":17}", "17", 1},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":17}", "18", 0},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":17}", "-6", 0},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":17}", "05", 0},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":10}", "10", 0},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":10}", "11", 1},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":10}", "123456789", 1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.5", 1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1", 1},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1.5", 0},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "-0.5", 0},
        {"{\"type\":\"number\"}", "-1.5e+3", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-28\"", 1},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-30\"", 0},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-13-01\"", 0},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", 1},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", "\"2024-05-01T12:30:00Z\"", 1},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\"b$\"}", "\"a\\\"b\"", 1},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"ab\"", 1},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"a\"", 0},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"日本語\"", 1},
        {"{\"enum\":[\"é\",\"日本\",1]}", "\"日本\"", 1},
        {"{\"enum\":[\"é\",\"日本\",1]}", "\"日\"", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}", "{\"b\": true}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}", "{\"a\":null,\"b\":false}", 1},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}", "{\"a\":null}", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}", "{\"b\":true,\"a\":null}", 0},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":2}", "[1, 2]", 1},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":2}", "[1]", 0},
        {"{\"type\":[\"string\",\"null\"]}", "null", 1},
        /* prefixItems, then items for the rest (or none with items: false) */
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"maxItems\":3}", "[]", 1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"maxItems\":3}", "[1]", 1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"maxItems\":3}", "[1, \"a\", true]", 1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"maxItems\":3}", "[1, \"a\", true, false]", 0},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"maxItems\":3}", "[\"a\"]", 0},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":{\"type\":\"boolean\"},\"maxItems\":3}", "[1, 2]", 0},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false,\"minItems\":1}", "[]", 0},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false,\"minItems\":1}", "[3]", 1},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false,\"minItems\":1}", "[3, 4]", 0},
        /* oneOf of provably disjoint branches is anyOf */
        {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "7", 1},
        {"{\"oneOf\":[{\"const\":\"a\"},{\"enum\":[\"b\",1]}]}", "1", 1},
        {"{\"oneOf\":[{\"const\":\"a\"},{\"enum\":[\"b\",1]}]}", "\"c\"", 0},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"p\"},\"v\":{\"type\":\"integer\"}},\"required\":[\"k\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"q\"}},\"required\":[\"k\"]}]}", "{\"k\":\"q\"}", 1},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"a\"]},{\"type\":\"object\",\"properties\":{\"b\":{}},\"additionalProperties\":false}]}", "{\"b\":1}", 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *js = json_loads(cases[i].schema, 0, NULL);
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_json_schema(js, &g, &err);
        json_decref(js);
        CHECK_MSG(rc == 0, "%s: %s", cases[i].schema, err.msg);
        if (rc) continue;
        CHECK_MSG(ours_full(g, tv, cases[i].text, strlen(cases[i].text)) == cases[i].ok, "%s on %s: want %d",
                  cases[i].schema, cases[i].text, cases[i].ok);
        grammar_free(g);
    }
    static const struct {
        const char *schema, *word;
    } bad[] = {
        {"{\"type\":\"string\",\"contentEncoding\":\"base64\"}", "contentEncoding"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":0.5}}}", "multipleOf"},
        {"{\"type\":\"integer\",\"multipleOf\":1000}", "multipleOf"},
        {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}", "oneOf"},
        {"{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", "oneOf"},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":1}}},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":2}}}]}", "oneOf"},
        {"{\"not\":{\"type\":\"string\"}}", "'not'"},
        {"{\"if\":{\"type\":\"string\"},\"then\":{}}", "'if'"},
        {"{\"type\":\"object\",\"patternProperties\":{\"a\":{}}}", "patternProperties"},
        {"{\"type\":\"object\",\"minProperties\":1}", "minProperties"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}],\"additionalItems\":false}", "additionalItems"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "hostname"},
        {"{\"$ref\":\"http://x/y\"}", "$ref"},
        {"{\"type\":\"object\",\"required\":[\"z\"],\"properties\":{}}", "'z'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *js = json_loads(bad[i].schema, 0, NULL);
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_json_schema(js, &g, &err);
        json_decref(js);
        CHECK_MSG(rc == CAIRN_ERR_UNSUPPORTED && strstr(err.msg, bad[i].word), "%s: rc %d msg %s", bad[i].schema, rc, err.msg);
        grammar_free(g);
    }
    test_schema_counts(tv);
    /* a tool-call envelope around the JSON */
    json_t *js = json_loads("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}", 0, NULL);
    struct grammar *g = NULL;
    CHECK(grammar_from_json_schema_wrapped(js, "<tool_call>\n", "\n</tool_call>", &g, NULL) == 0);
    const char *good = "<tool_call>\n{\"x\": 42}\n</tool_call>";
    CHECK(ours_full(g, tv, good, strlen(good)) == 1);
    CHECK(ours_full(g, tv, good, strlen(good) - 1) == 0);
    grammar_free(g);
    json_decref(js);
}

int main(void)
{
    struct tg_vocab tv;
    CHECK(tg_vocab_make(&tv, 3000) == 0);
    test_regex(&tv);
    test_gbnf(&tv);
    test_masks_and_rollback(&tv);
    test_schema_values(&tv);
    tg_vocab_free(&tv);
    return test_summary("test_grammar");
}
