/* tok unit tests on small hand-written tokenizer.json files: merge priority and both merge
 * formats, Split behaviours (and invert), added tokens (special, single_word, lstrip, rstrip,
 * longest match), normalizers, TemplateProcessing, Metaspace (pre-tokenizer, decoder, stream),
 * unk fusing, tokenizer_config.json / chat_template loading, and bad input. Expected ids are
 * derived by hand from HF tokenizers' documented semantics. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "testlib.h"
#include "tok/tok.h"

#define VOCAB                                                                                      \
    "\"a\":0,\"b\":1,\"c\":2,\"-\":3,\"a-\":4,\"b-\":5,\"-b\":6,\"-c\":7,\"--\":8,\"ab\":30,"      \
    "\"bc\":31,\"abc\":32,"                                                                        \
    "\" \":13,\"y\":14,\"\\u00e9\":16,\"f\":26,\"i\":25,\"h\":24,\"<unk>\":27,\"\\u2581hi\":20,"   \
    "\"\\u2581there\":21,\"\\u2581\":22,\"x\":23,\"<\":28,\">\":29"

static struct tok *load(const char *fmt, ...)
{
    char json[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(json, sizeof(json), fmt, ap);
    va_end(ap);
    struct tok *t = NULL;
    struct cairn_err err = {0};
    int st = tok_load_json(json, strlen(json), &t, &err);
    CHECK_MSG(st == 0, "load failed: %s", err.msg);
    return t;
}

/* Encodes text and compares with the expected ids (terminated by -1). */
static void expect_ids(struct tok *t, const char *text, int add_special, ...)
{
    int32_t want[64];
    int nw = 0;
    va_list ap;
    va_start(ap, add_special);
    for (int v; (v = va_arg(ap, int)) != -1;)
        want[nw++] = v;
    va_end(ap);
    int32_t *ids = NULL;
    size_t n = 0;
    struct cairn_err err = {0};
    if (!t) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(tok_encode(t, text, strlen(text), add_special, &ids, &n, &err), 0);
    int same = (int)n == nw;
    for (int i = 0; same && i < nw; i++)
        same = ids[i] == want[i];
    char got[512] = "";
    for (size_t i = 0; i < n && strlen(got) < 480; i++)
        snprintf(got + strlen(got), 16, "%d ", ids[i]);
    CHECK_MSG(same, "encode(\"%s\") = [%s]", text, got);
    free(ids);
}

static void expect_decode(struct tok *t, int skip, const char *want, int n, ...)
{
    int32_t ids[64];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        ids[i] = va_arg(ap, int);
    va_end(ap);
    char *out;
    size_t len;
    if (!t) return;
    CHECK_EQ_INT(tok_decode(t, ids, (size_t)n, skip, &out, &len, NULL), 0);
    CHECK_EQ_STR(out, want);
    free(out);
}

static void test_merges(void)
{
    /* rank decides: "b c" first leaves a + bc */
    struct tok *t = load("{\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB
                         "},\"merges\":[\"b c\",\"a b\",\"ab c\"]}}");
    expect_ids(t, "abc", 0, 0, 31, -1);
    tok_free(t);
    t = load("{\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB
             "},\"merges\":[[\"a\",\"b\"],[\"b\",\"c\"],[\"ab\",\"c\"]]}}");
    expect_ids(t, "abc", 0, 32, -1);
    expect_ids(t, "abcabc", 0, 32, 32, -1);
    expect_ids(t, "bcab", 0, 31, 30, -1);
    tok_free(t);
}

static void test_split(void)
{
    static const struct {
        const char *behavior;
        int invert;
        int ids[8];
    } cases[] = {
        {"Removed", 0, {0, 1, 2, -1}},
        {"Isolated", 0, {0, 3, 1, 3, 3, 2, -1}},
        {"MergedWithPrevious", 0, {4, 5, 3, 2, -1}},
        {"MergedWithNext", 0, {0, 6, 3, 7, -1}},
        {"Contiguous", 0, {0, 3, 1, 8, 2, -1}},
        {"Removed", 1, {3, 3, 3, -1}},
    };
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(cases); k++) {
        struct tok *t =
            load("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},"
                 "\"behavior\":\"%s\","
                 "\"invert\":%s},\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB "},\"merges\":"
                 "[\"a -\",\"b -\",\"- b\",\"- c\",\"- -\"]}}",
                 cases[k].behavior, cases[k].invert ? "true" : "false");
        int32_t *ids;
        size_t n;
        if (!t) continue;
        CHECK_EQ_INT(tok_encode(t, "a-b--c", 6, 0, &ids, &n, NULL), 0);
        size_t nw = 0;
        while (cases[k].ids[nw] != -1)
            nw++;
        int same = n == nw;
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == cases[k].ids[i];
        CHECK_MSG(same, "Split %s invert=%d", cases[k].behavior, cases[k].invert);
        free(ids);
        tok_free(t);
    }
    /* the same with a Regex pattern and the Digits pre-tokenizer */
    struct tok *t =
        load("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"-+\"},\"behavior\":"
             "\"Isolated\"},\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB
             "},\"merges\":[\"a -\",\"- -\"]}}");
    expect_ids(t, "a-b--c", 0, 0, 3, 1, 8, 2, -1);
    tok_free(t);
}

#define ADDED                                                                                      \
    "\"added_tokens\":[{\"id\":9,\"content\":\"<x>\",\"special\":true,\"normalized\":false},"      \
    "{\"id\":10,\"content\":\"yy\",\"single_word\":true,\"special\":false,\"normalized\":false},"  \
    "{\"id\":11,\"content\":\"<l>\",\"lstrip\":true,\"special\":false,\"normalized\":false},"      \
    "{\"id\":12,\"content\":\"<r>\",\"rstrip\":true,\"special\":false,\"normalized\":false},"      \
    "{\"id\":15,\"content\":\"<x>>\",\"special\":true,\"normalized\":false},"                      \
    "{\"id\":17,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"                       \
    "{\"id\":18,\"content\":\"</s>\",\"special\":true,\"normalized\":false}]"

static void test_added(void)
{
    struct tok *t = load(
        "{" ADDED
        ",\"decoder\":{\"type\":\"Fuse\"},\"post_processor\":{\"type\":\"TemplateProcessing\","
        "\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
        "\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</"
        "s>\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":"
        "{\"id\":\"<s>\",\"ids\":[17],\"tokens\":[\"<s>\"]},\"</s>\":{\"id\":\"</s>\",\"ids\":[18],"
        "\"tokens\":[\"</s>\"]}}},\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB
        "},\"merges\":[]}}");
    expect_ids(t, "a<x>b", 0, 0, 9, 1, -1);
    expect_ids(t, "a<x>>b", 0, 0, 15, 1, -1);
    expect_ids(t, "ayy b", 0, 0, 14, 14, 13, 1, -1);
    expect_ids(t, "a yy b", 0, 0, 13, 10, 13, 1, -1);
    expect_ids(t, "a  <l>b", 0, 0, 11, 1, -1);
    expect_ids(t, "a<r>  b", 0, 0, 12, 1, -1);
    expect_ids(t, "ab", 1, 17, 0, 1, 18, -1);
    expect_ids(t, "", 1, 17, 18, -1);
    expect_decode(t, 0, "a<x>b", 3, 0, 9, 1);
    if (t) {
        /* split_special: "<x>" is text, "yy" (not special) is still matched */
        int32_t *ids;
        size_t n;
        CHECK_EQ_INT(tok_encode_flags(t, "<x> yy", 6, TOK_ENC_SPLIT_SPECIAL, &ids, &n, NULL), 0);
        CHECK_EQ_INT(n, 3 + 2);
        if (n == 5) {
            CHECK_EQ_INT(ids[0], 28);
            CHECK_EQ_INT(ids[1], 23);
            CHECK_EQ_INT(ids[2], 29);
            CHECK_EQ_INT(ids[3], 13);
            CHECK_EQ_INT(ids[4], 10);
        }
        free(ids);
    }
    expect_decode(t, 1, "ab", 3, 0, 9, 1);
    if (t) {
        CHECK_EQ_INT(tok_piece_to_id(t, "<x>"), 9);
        CHECK_EQ_INT(tok_piece_to_id(t, "abc"), 32);
        CHECK_EQ_INT(tok_piece_to_id(t, "nope"), -1);
        CHECK_EQ_STR(tok_id_to_piece(t, 9), "<x>");
        CHECK(tok_id_to_piece(t, 100000) == NULL);
        CHECK(tok_is_special(t, 9));
        CHECK(!tok_is_special(t, 10));
        CHECK_EQ_INT(tok_vocab_size(t), 33);
    }
    tok_free(t);
}

static void test_normalizers(void)
{
    struct tok *t = load("{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":"
                         "\"Strip\",\"strip_left\":true,"
                         "\"strip_right\":true},{\"type\":\"Lowercase\"},{\"type\":\"Replace\","
                         "\"pattern\":{\"Regex\":"
                         "\"\\\\s+\"},\"content\":\" "
                         "\"},{\"type\":\"NFKC\"}]},\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB
                         "},\"merges\":[]}}");
    expect_ids(t, "  AB \t c  ", 0, 0, 1, 13, 2, -1);
    expect_ids(t, "\xef\xac\x81", 0, 26, 25, -1); /* U+FB01 -> "fi" */
    tok_free(t);
    t = load("{\"normalizer\":{\"type\":\"NFC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB
             "},\"merges\":[]}}");
    expect_ids(t, "e\xcc\x81", 0, 16, -1); /* e + U+0301 -> U+00E9 */
    tok_free(t);
}

static void test_metaspace(void)
{
    struct tok *t =
        load("{" ADDED ",\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
             "\"prepend_scheme\":\"first\",\"split\":true},\"decoder\":{\"type\":\"Metaspace\","
             "\"replacement\":"
             "\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true},\"model\":{\"type\":\"BPE\","
             "\"ignore_merges\":true,\"vocab\":{" VOCAB "},\"merges\":[]}}");
    expect_ids(t, "hi there", 0, 20, 21, -1);
    expect_ids(t, "<x>hi", 0, 9, 24, 25, -1); /* not at the start: no prepend */
    expect_decode(t, 0, "hi there", 2, 20, 21);
    expect_decode(t, 0, "there hi", 2, 21, 20);
    if (t) {
        struct tok_stream *s = tok_stream_new(t, 0);
        const char *p;
        size_t n;
        CHECK_EQ_INT(tok_stream_feed(s, 20, &p, &n), 0);
        CHECK(n == 2 && !memcmp(p, "hi", 2));
        CHECK_EQ_INT(tok_stream_feed(s, 21, &p, &n), 0);
        CHECK(n == 6 && !memcmp(p, " there", 6));
        CHECK_EQ_INT(tok_stream_flush(s, &p, &n), 0);
        CHECK_EQ_INT(n, 0);
        /* after a flush the next sequence starts fresh: leading space stripped again */
        CHECK_EQ_INT(tok_stream_feed(s, 21, &p, &n), 0);
        CHECK(n == 5 && !memcmp(p, "there", 5));
        tok_stream_free(s);
    }
    tok_free(t);
}

static void test_unk(void)
{
    struct tok *t = load(
        "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"vocab\":{" VOCAB
        "},\"merges\":[]}}");
    expect_ids(t, "a??b", 0, 0, 27, 1, -1);
    tok_free(t);
    t = load(
        "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":false,\"vocab\":{" VOCAB
        "},\"merges\":[]}}");
    expect_ids(t, "a??b", 0, 0, 27, 27, 1, -1);
    tok_free(t);
}

static void test_bad_json(void)
{
    static const char *const bad[] = {
        "",
        "[]",
        "{\"model\":{}}",
        "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}",
        ("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{"
         "\"type\":\"Split\","
         "\"pattern\":{\"Regex\":\"(\"}}}"),
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":"
        "\"Nope\"}}",
    };
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(bad); i++) {
        struct tok *t = NULL;
        struct cairn_err err = {0};
        int st = tok_load_json(bad[i], strlen(bad[i]), &t, &err);
        CHECK_MSG(st != 0 && t == NULL, "bad json %zu accepted", i);
        CHECK_MSG(err.msg[0] != 0, "bad json %zu: no message", i);
    }
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_config(void)
{
    char dir[] = "/tmp/cairn_tok_cfgXXXXXX", p[256];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    write_file(p, "{" ADDED ",\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB "},\"merges\":[]}}");
    snprintf(p, sizeof(p), "%s/tokenizer_config.json", dir);
    write_file(p, "{\"bos_token\":{\"content\":\"<s>\",\"lstrip\":false},\"eos_token\":\"</"
                  "s>\",\"add_bos_token\":true,"
                  "\"model_max_length\":1000000000000000019884624838656,"
                  "\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},{\"name\":"
                  "\"default\",\"template\":\"D\"}]}");
    struct tok *t = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(tok_load(dir, &t, &err), 0);
    if (t) {
        CHECK_EQ_STR(tok_bos_token(t), "<s>");
        CHECK_EQ_STR(tok_eos_token(t), "</s>");
        CHECK_EQ_INT(tok_bos_id(t), 17);
        CHECK_EQ_INT(tok_eos_id(t), 18);
        CHECK_EQ_INT(tok_add_bos(t), 1);
        tok_free(t);
    }
    /* (the chat template is tmpl's: test_tmpl_oracle's loader cases) */
    snprintf(p, sizeof(p), "%s/tokenizer_config.json", dir);
    unlink(p);
    CHECK_EQ_INT(tok_load(dir, &t, &err), 0);
    if (t) {
        CHECK(tok_bos_token(t) == NULL);
        CHECK_EQ_INT(tok_bos_id(t), -1);
    }
    tok_free(t);
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    unlink(p);
    CHECK(tok_load(dir, &t, &err) == CAIRN_ERR_NOT_FOUND);
    rmdir(dir);
}

static void test_bytelevel_pretok(void)
{
    /* GPT-2 style: prefix space, GPT-2 regex split, byte -> char mapping; \u0120 is the space */
    struct tok *t = load(
        "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true},"
        "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,"
        "\"b\":1,\"?\":2,\"\\u0120\":3,\"\\u0120a\":4,\"\\u0120b\":5,\"b?\":6},\"merges\":["
        "\"\\u0120 a\","
        "\"\\u0120 b\",\"b ?\"]}}");
    expect_ids(t, "a b?", 0, 4, 5, 2, -1); /* " a" " b" "?": the regex keeps "?" apart from "b" */
    expect_decode(t, 0, " a b?", 3, 4, 5, 2);
    tok_free(t);
}

static void test_digits(void)
{
    const char *fmt = "{\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":%s},\"model\":"
                      "{\"type\":\"BPE\","
                      "\"vocab\":{\"a\":0,\"1\":1,\"2\":2,\"3\":3,\"12\":4,\"123\":5,\"3a\":6},"
                      "\"merges\":[\"1 2\","
                      "\"12 3\",\"3 a\"]}}";
    struct tok *t = load(fmt, "true");
    expect_ids(t, "a123a", 0, 0, 1, 2, 3, 0, -1);
    tok_free(t);
    t = load(fmt, "false");
    expect_ids(t, "a123a", 0, 0, 5, 0, -1);
    tok_free(t);
}

static void test_strip_accents(void)
{
    struct tok *t =
        load("{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"},"
             "{\"type\":\"StripAccents\"}]},\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB
             "},\"merges\":[]}}");
    expect_ids(t,
               "\xc3\xa1"
               "b\xcc\x81",
               0, 0, 1, -1); /* U+00E1 b U+0301 -> a b */
    tok_free(t);
}

static void test_normalized_added(void)
{
    /* normalized tokens are matched after the normalizer (and are normalized themselves);
     * non-normalized ones are matched on the raw text */
    struct tok *t = load(
        "{\"added_tokens\":[{\"id\":40,\"content\":\"BcB\",\"normalized\":true,\"special\":false},"
        "{\"id\":41,\"content\":\"CA\",\"normalized\":false,\"special\":false}],"
        "\"normalizer\":{\"type\":\"Lowercase\"},\"model\":{\"type\":\"BPE\",\"vocab\":{" VOCAB "},"
        "\"merges\":[]}}");
    expect_ids(t, "aBCBa", 0, 0, 40, 0, -1);
    expect_ids(t, "CAca", 0, 41, 2, 0, -1);
    expect_ids(t, "cA", 0, 2, 0, -1);
    tok_free(t);
}

int main(void)
{
    test_merges();
    test_split();
    test_added();
    test_normalizers();
    test_metaspace();
    test_unk();
    test_bad_json();
    test_config();
    test_bytelevel_pretok();
    test_digits();
    test_strip_accents();
    test_normalized_added();
    return test_summary("test_tok_unit");
}
