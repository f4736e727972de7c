/* grammar room, lazy grammars (tool_choice auto) and parallel calls: masks in free text and
 * inside the envelope against the brute-force reference (every token's bytes tried), calls
 * checked by jansson (an independent parser) after walks that write free text and calls, the
 * trigger split across tokens, rollback across the trigger, REPEAT / single call, AT_START, the
 * arm string, "no mask needed" in free text, and the many-calls envelope of a forced turn. */
#include <jansson.h>

#include "grammar/grammar.h"
#include "test_grammar_util.h"
#include "testlib.h"

#define SCHEMA "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}}," \
               "\"required\":[\"x\"],\"additionalProperties\":false}"

static struct grammar *lazy_grammar(unsigned flags, const char *arm, int json_form)
{
    json_t *js = json_loads(SCHEMA, 0, NULL);
    struct grammar *g = NULL;
    struct cairn_err err = {0};
    struct grammar_calls c = {.open = json_form ? "" : "<tool_call>\n", .close = json_form ? "" : "\n</tool_call>",
                              .sep = "; ?", .many = json_form};
    CHECK_MSG(grammar_from_json_schema_calls(js, &c, &g, &err) == CAIRN_OK, "%s", err.msg);
    json_decref(js);
    CHECK_MSG(grammar_set_trigger(g, arm, json_form ? "{" : "<tool_call>", flags, &err) == CAIRN_OK, "%s", err.msg);
    return g;
}

static int accept_str(struct grammar_matcher *m, const char *s)
{
    return grammar_matcher_accept_bytes(m, (const uint8_t *)s, strlen(s));
}

/* Every "<tool_call>" in text opens "\n{json}\n</tool_call>" with 0 <= x <= 99 (jansson says);
 * returns the number of calls, -1 if one is malformed. A last call may be cut (allow_cut). */
static int check_calls(const char *text, int allow_cut)
{
    int n = 0;
    const char *p = text;
    while ((p = strstr(p, "<tool_call>"))) {
        p += strlen("<tool_call>");
        const char *e = strstr(p, "</tool_call>");
        if (!e) return allow_cut ? n : -1;
        if (p[0] != '\n' || e[-1] != '\n') return -1;
        json_t *o = json_loadb(p + 1, (size_t)(e - p - 2), 0, NULL);
        json_t *x = json_object_get(o, "x");
        int ok = json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) <= 99 && json_object_size(o) == 1;
        json_decref(o);
        if (!ok) return -1;
        n++;
        p = e;
    }
    return n;
}

/* Walks with the trigger picked often; masks checked against brute force on some steps. */
static void walk_lazy(struct grammar *g, const struct tg_vocab *tv, int32_t trig_tok, int repeat)
{
    int brute_ok = 1, n_calls = 0;
    size_t words = ((size_t)tv->n + 31) / 32;
    uint32_t *mask = malloc(words * 4);
    int32_t *allowed = malloc((size_t)tv->n * sizeof(int32_t));
    for (int k = 0; k < 24; k++) {
        struct grammar_matcher *m;
        CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == CAIRN_OK);
        char out[8192];
        size_t n = 0;
        out[0] = 0;
        for (int step = 0; step < 120; step++) {
            int un = grammar_matcher_unconstrained(m);
            CHECK(un >= 0);
            int cnt = grammar_matcher_fill_mask(m, mask);
            if (cnt <= 0) break;
            if (un) CHECK_MSG(cnt == tv->n, "no mask needed, but %d of %d allowed", cnt, tv->n);
            if (step % 5 == 0 && !tg_mask_matches_brute(m, tv, mask)) brute_ok = 0;
            int na = 0;
            for (int i = 0; i < tv->n - 1; i++)
                if (tg_bit(mask, i)) allowed[na++] = i;
            int32_t t;
            if (tg_bit(mask, tv->n - 1) && (na == 0 || tg_rand() % 100 < 3)) t = tv->n - 1;
            else if (na == 0) break;
            else if (tg_bit(mask, trig_tok) && tg_rand() % 100 < 15) t = trig_tok;
            else t = allowed[tg_rand() % (uint32_t)na];
            CHECK(grammar_matcher_accept_token(m, t) == CAIRN_OK);
            if (t == tv->n - 1) break;
            if (n + tv->lens[t] + 1 < sizeof(out)) {
                memcpy(out + n, tv->bytes[t], tv->lens[t]);
                n += tv->lens[t];
                out[n] = 0;
            }
        }
        /* NULs in free text would hide the rest from strstr: they are free text anyway */
        for (size_t i = 0; i < n; i++)
            if (!out[i]) out[i] = ' ';
        int c = check_calls(out, 1);
        CHECK_MSG(c >= 0, "malformed call in '%s'", out);
        if (!repeat) CHECK_MSG(c <= 1, "%d calls without REPEAT in '%s'", c, out);
        n_calls += c > 0 ? c : 0;
        grammar_matcher_free(m);
    }
    CHECK_MSG(brute_ok, "lazy masks differ from brute force (repeat %d)", repeat);
    CHECK_MSG(n_calls >= 5, "only %d complete calls in the walks", n_calls);
    free(mask);
    free(allowed);
}

static void test_hermes(const struct tg_vocab *tv, int32_t trig_tok, int32_t bad_tok, int32_t tail_tok)
{
    size_t words = ((size_t)tv->n + 31) / 32;
    uint32_t *a = malloc(words * 4), *b = malloc(words * 4);
    for (int repeat = 0; repeat < 2; repeat++) {
        struct grammar *g = lazy_grammar(repeat ? GRAMMAR_LAZY_REPEAT : 0, NULL, 0);
        walk_lazy(g, tv, trig_tok, repeat);
        struct grammar_matcher *m;
        CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == CAIRN_OK);
        /* free text: anything; the tokens that complete the trigger with a wrong byte after it
         * ("_call>!" after "<tool", and "<tool_call>x") are the ones held back */
        CHECK(accept_str(m, "Let me check. {\"x\": 1000} <tool") == CAIRN_OK);
        CHECK(grammar_matcher_accepting(m) == 1);
        CHECK(grammar_matcher_unconstrained(m) == 0); /* "<tool" + "_call>!" must be masked */
        CHECK(grammar_matcher_fill_mask(m, a) == tv->n - 2 && !tg_bit(a, tail_tok) && !tg_bit(a, bad_tok) &&
              tg_bit(a, tv->n - 1));
        CHECK(grammar_matcher_rollback(m, 1) == CAIRN_OK);
        CHECK(accept_str(m, "Let me look") == CAIRN_OK);
        int un = grammar_matcher_unconstrained(m);
        CHECK(un == 0); /* "<tool_call>x" exists in the vocabulary: from a plain state it is masked */
        CHECK(grammar_matcher_fill_mask(m, a) == tv->n - 1 && !tg_bit(a, bad_tok) && tg_bit(a, trig_tok));
        /* the trigger split over byte runs, then the envelope is enforced */
        CHECK(accept_str(m, " <tool") == CAIRN_OK);
        CHECK(accept_str(m, "_call>\n{\"x\"") == CAIRN_OK);
        CHECK(grammar_matcher_accepting(m) == 0);
        CHECK(grammar_matcher_try_bytes(m, (const uint8_t *)": \"s\"", 5) == 0);
        CHECK(grammar_matcher_try_bytes(m, (const uint8_t *)": 100", 5) == 0);
        CHECK(grammar_matcher_fill_mask(m, b) < tv->n / 2 && !tg_bit(b, tv->n - 1));
        CHECK(tg_mask_matches_brute(m, tv, b));
        /* rollback across the trigger gives the free state's mask back */
        CHECK(grammar_matcher_rollback(m, 2) == CAIRN_OK);
        CHECK(grammar_matcher_fill_mask(m, b) == tv->n - 1 && memcmp(a, b, words * 4) == 0);
        CHECK(accept_str(m, "<tool_call>\n{\"x\": 42}\n</tool_call>") == CAIRN_OK);
        CHECK(grammar_matcher_accepting(m) == 1);
        if (repeat) { /* free again: text and a second call */
            CHECK(grammar_matcher_finished(m) == 0);
            CHECK(accept_str(m, "\nand <tool_call>\n{\"x\": 7}\n</tool_call> done") == CAIRN_OK);
            CHECK(accept_str(m, "<tool_call>{") == CAIRN_ERR_INVALID);
        } else { /* one call: only eos follows */
            CHECK(grammar_matcher_finished(m) == 1);
            CHECK(grammar_matcher_fill_mask(m, b) == 1 && tg_bit(b, tv->n - 1));
            CHECK(accept_str(m, " more") == CAIRN_ERR_INVALID);
        }
        CHECK(grammar_matcher_accept_token(m, tv->n - 1) == CAIRN_OK);
        grammar_matcher_free(m);
        grammar_free(g);
    }
    free(a);
    free(b);
}

static void test_at_start_and_arm(const struct tg_vocab *tv)
{
    /* Llama-3's JSON form: only a '{' first (after whitespace) is a call, then more after ';' */
    struct grammar *g = lazy_grammar(GRAMMAR_LAZY_AT_START, NULL, 1);
    struct grammar_matcher *m;
    CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == CAIRN_OK);
    CHECK(accept_str(m, " \n ") == CAIRN_OK);
    CHECK(grammar_matcher_try_bytes(m, (const uint8_t *)"{\"y\"", 4) == 0);
    CHECK(accept_str(m, "{\"x\": 5}; {\"x\":6}") == CAIRN_OK);
    CHECK(grammar_matcher_accepting(m) == 1);
    CHECK(grammar_matcher_try_bytes(m, (const uint8_t *)" text", 5) == 0);
    grammar_matcher_free(m);
    CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == CAIRN_OK);
    CHECK(accept_str(m, "Sure: {\"y\": []}") == CAIRN_OK); /* text first: free for good */
    CHECK(grammar_matcher_unconstrained(m) == 1);
    grammar_matcher_free(m);
    grammar_free(g);
    /* an arm: the envelope counts only after "</think>" */
    g = lazy_grammar(GRAMMAR_LAZY_REPEAT, "</think>", 0);
    CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == CAIRN_OK);
    CHECK(accept_str(m, "thinking about <tool_call>junk</tool_call> ...</think>\n\n") == CAIRN_OK);
    CHECK(grammar_matcher_try_bytes(m, (const uint8_t *)"<tool_call>junk", 15) == 0);
    CHECK(accept_str(m, "<tool_call>\n{\"x\": 0}\n</tool_call>") == CAIRN_OK);
    grammar_matcher_free(m);
    grammar_free(g);
    /* a grammar that does not begin with its trigger is refused */
    CHECK(grammar_from_regex("abc", 3, &g, NULL) == CAIRN_OK);
    struct cairn_err err = {0};
    CHECK(grammar_set_trigger(g, NULL, "ax", 0, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "trigger"));
    grammar_free(g);
}

/* A forced turn's envelope: one call, or several when parallel calls are allowed. */
static void test_many_calls(const struct tg_vocab *tv)
{
    json_t *js = json_loads(SCHEMA, 0, NULL);
    for (int many = 0; many < 2; many++) {
        struct grammar_calls c = {.lead = "</think>\n\n", .open = "<tool_call>\n", .close = "\n</tool_call>", .sep = "\n?",
                                  .many = many};
        struct grammar *g = NULL;
        CHECK(grammar_from_json_schema_calls(js, &c, &g, NULL) == CAIRN_OK);
        struct grammar_matcher *m;
        CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == CAIRN_OK);
        CHECK(accept_str(m, "</think>\n\n<tool_call>\n{\"x\": 1}\n</tool_call>") == CAIRN_OK);
        CHECK(grammar_matcher_accepting(m) == 1);
        const char *two = "\n<tool_call>\n{\"x\": 2}\n</tool_call><tool_call>\n{\"x\": 3}\n</tool_call>";
        CHECK_EQ_INT(grammar_matcher_try_bytes(m, (const uint8_t *)two, strlen(two)), many);
        CHECK(grammar_matcher_try_bytes(m, (const uint8_t *)"\n\n<", 3) == 0);
        grammar_matcher_free(m);
        grammar_free(g);
    }
    /* at most max_calls */
    struct grammar_calls c = {.sep = ";", .many = 1, .max_calls = 3};
    struct grammar *g = NULL;
    CHECK(grammar_from_json_schema_calls(js, &c, &g, NULL) == CAIRN_OK);
    struct grammar_matcher *m;
    CHECK(grammar_matcher_create(g, tv->v, &m, NULL) == CAIRN_OK);
    CHECK(accept_str(m, "{\"x\":1};{\"x\":2};{\"x\":3}") == CAIRN_OK);
    CHECK(grammar_matcher_finished(m) == 1);
    grammar_matcher_free(m);
    grammar_free(g);
    json_decref(js);
}

int main(void)
{
    struct tg_vocab tv;
    memset(&tv, 0, sizeof(tv));
    /* the byte vocabulary with random pieces, plus the envelope's own tokens */
    static const char *extra[] = {"<tool_call>", "<tool_call>x", "_call>!", "<tool", "_call>", "</tool_call>",
                                  "\n</tool_call>", ">\n", "\n{\"", "x\":", "</think>", "}\n"};
    int n_extra = (int)(sizeof(extra) / sizeof(extra[0]));
    struct tg_vocab base;
    CHECK(tg_vocab_make(&base, 2000) == 0);
    tv.bytes = calloc((size_t)base.n + (size_t)n_extra, sizeof(uint8_t *));
    tv.lens = calloc((size_t)base.n + (size_t)n_extra, sizeof(size_t));
    for (int i = 0; i < base.n - 1; i++) tg_vocab_add(&tv, base.bytes[i], base.lens[i]);
    int32_t first_extra = tv.n;
    for (int i = 0; i < n_extra; i++) tg_vocab_add(&tv, extra[i], strlen(extra[i]));
    tg_vocab_add(&tv, NULL, 0); /* eos last, as the helpers expect */
    int32_t eos = tv.n - 1;
    CHECK(grammar_vocab_create((const uint8_t *const *)tv.bytes, tv.lens, tv.n, &eos, 1, &tv.v, NULL) == 0);
    test_hermes(&tv, first_extra, first_extra + 1, first_extra + 2);
    test_at_start_and_arm(&tv);
    test_many_calls(&tv);
    tg_vocab_free(&base);
    tg_vocab_free(&tv);
    return test_summary("test_grammar_lazy");
}
