/* Stop handling: stop strings fed byte by byte and split across tokens, hold-back, exclusion of
 * the stop string, EOS / stop ids / ignore_eos, flush at the end. A fake detokenizer maps each
 * id to a fixed string (ids < 256: the single byte; others: a table), and can hold bytes back
 * until flush to mimic a streaming detokenizer waiting for a UTF-8 continuation. */
#include "engine/stop.h"
#include "testlib.h"

struct fake_stream {
    char held[16];
    size_t n_held;
    char out[64];
};

static const char *fake_table[] = {"Hel", "lo", " wo", "rld", "<|e", "nd|>", "!!"};

static void *fake_new(void *ctx) { return calloc(1, sizeof(struct fake_stream)); }

static int fake_feed(void *stream, int32_t id, const char **text, size_t *len)
{
    struct fake_stream *f = stream;
    if (id == 999) { /* "held" byte, only released by the next id or flush */
        f->held[f->n_held++] = 'Z';
        *text = "";
        *len = 0;
        return 0;
    }
    size_t n = 0;
    memcpy(f->out, f->held, f->n_held);
    n = f->n_held;
    f->n_held = 0;
    if (id < 256) {
        f->out[n++] = (char)id;
    } else {
        const char *s = fake_table[id - 256];
        memcpy(f->out + n, s, strlen(s));
        n += strlen(s);
    }
    *text = f->out;
    *len = n;
    return 0;
}

static int fake_flush(void *stream, const char **text, size_t *len)
{
    struct fake_stream *f = stream;
    memcpy(f->out, f->held, f->n_held);
    *text = f->out;
    *len = f->n_held;
    f->n_held = 0;
    return 0;
}

static void fake_free(void *stream) { free(stream); }

static const struct engine_detok fake_detok = {NULL, fake_new, fake_feed, fake_flush, fake_free};

/* Feeds ids, concatenating released text into out; returns the last result. */
static int feed_all(struct stop_state *s, const int32_t *ids, int n, char *out, size_t cap, int *n_fed)
{
    size_t o = strlen(out);
    int r = STOP_CONTINUE;
    *n_fed = 0;
    for (int i = 0; i < n; i++) {
        const char *t;
        size_t l;
        r = stop_feed(s, ids[i], &t, &l);
        (*n_fed)++;
        CHECK(o + l < cap);
        memcpy(out + o, t, l);
        o += l;
        out[o] = 0;
        if (r != STOP_CONTINUE) break;
    }
    return r;
}

static void bytes_to_ids(const char *s, int32_t *ids) {
    for (int i = 0; s[i]; i++) ids[i] = (unsigned char)s[i];
}

static void test_byte_by_byte(void)
{
    const char *stops[] = {"STOP"};
    struct stop_state s;
    CHECK(stop_init(&s, &fake_detok, stops, 1, NULL, 0, NULL, 0, 0, NULL) == CAIRN_OK);
    const char *text = "hello STxSTOP world";
    int32_t ids[64];
    bytes_to_ids(text, ids);
    char out[128] = "";
    int fed;
    /* after "hello ST" the "ST" is held back */
    int r = feed_all(&s, ids, 8, out, sizeof(out), &fed);
    CHECK_EQ_INT(r, STOP_CONTINUE);
    CHECK_EQ_STR(out, "hello ");
    /* 'x' breaks the partial match: "STx" released */
    r = feed_all(&s, ids + 8, 1, out, sizeof(out), &fed);
    CHECK_EQ_STR(out, "hello STx");
    r = feed_all(&s, ids + 9, (int)strlen(text) - 9, out, sizeof(out), &fed);
    CHECK_EQ_INT(r, STOP_STRING);
    CHECK_EQ_INT(fed, 4); /* stopped at the 'P' */
    CHECK_EQ_STR(out, "hello STx");
    CHECK_EQ_STR(stop_matched(&s), "STOP");
    stop_free(&s);
}

static void test_across_tokens(void)
{
    /* "Hel" "lo" " wo" "rld": stop "lo wor" spans three tokens */
    const char *stops[] = {"zzz", "lo wor"};
    struct stop_state s;
    CHECK(stop_init(&s, &fake_detok, stops, 2, NULL, 0, NULL, 0, 0, NULL) == CAIRN_OK);
    int32_t ids[] = {256, 257, 258, 259};
    char out[64] = "";
    int fed;
    int r = feed_all(&s, ids, 4, out, sizeof(out), &fed);
    CHECK_EQ_INT(r, STOP_STRING);
    CHECK_EQ_INT(fed, 4);
    CHECK_EQ_STR(out, "Hel");
    CHECK_EQ_STR(stop_matched(&s), "lo wor");
    stop_free(&s);

    /* earliest match wins when two stop strings appear in one chunk */
    const char *stops2[] = {"d", "wo"};
    CHECK(stop_init(&s, &fake_detok, stops2, 2, NULL, 0, NULL, 0, 0, NULL) == CAIRN_OK);
    int32_t ids2[] = {258, 259}; /* " wo" then "rld" */
    out[0] = 0;
    r = feed_all(&s, ids2, 2, out, sizeof(out), &fed);
    CHECK_EQ_INT(r, STOP_STRING);
    CHECK_EQ_INT(fed, 1);
    CHECK_EQ_STR(out, " ");
    CHECK_EQ_STR(stop_matched(&s), "wo");
    stop_free(&s);

    /* a special-token-like stop string "<|end|>" split as "<|e" + "nd|>", then text after it */
    const char *stops3[] = {"<|end|>"};
    CHECK(stop_init(&s, &fake_detok, stops3, 1, NULL, 0, NULL, 0, 0, NULL) == CAIRN_OK);
    int32_t ids3[] = {'o', 'k', 260, 261, 'x'};
    out[0] = 0;
    r = feed_all(&s, ids3, 5, out, sizeof(out), &fed);
    CHECK_EQ_INT(r, STOP_STRING);
    CHECK_EQ_INT(fed, 4);
    CHECK_EQ_STR(out, "ok");
    stop_free(&s);
}

static void test_ids_and_flush(void)
{
    const char *stops[] = {"!!!"};
    int32_t eos[] = {262};
    int32_t stop_ids[] = {301};
    struct stop_state s;
    CHECK(stop_init(&s, &fake_detok, stops, 1, stop_ids, 1, eos, 1, 0, NULL) == CAIRN_OK);
    /* "a!!" holds "!!"; EOS releases it and stops */
    int32_t ids[] = {'a', '!', '!', 262};
    char out[64] = "";
    int fed;
    int r = feed_all(&s, ids, 3, out, sizeof(out), &fed);
    CHECK_EQ_STR(out, "a");
    r = feed_all(&s, ids + 3, 1, out, sizeof(out), &fed);
    CHECK_EQ_INT(r, STOP_TOKEN);
    CHECK_EQ_STR(out, "a!!");
    CHECK_EQ_INT(s.stop_token, 262);
    CHECK(stop_matched(&s) == NULL);
    stop_free(&s);

    /* ignore_eos: the EOS id is just a token; stop ids still stop */
    CHECK(stop_init(&s, &fake_detok, NULL, 0, stop_ids, 1, eos, 1, 1, NULL) == CAIRN_OK);
    const char *t;
    size_t l;
    CHECK_EQ_INT(stop_feed(&s, 'q', &t, &l), STOP_CONTINUE);
    CHECK(l == 1 && t[0] == 'q');
    CHECK_EQ_INT(stop_feed(&s, 262, &t, &l), STOP_CONTINUE);
    CHECK(l == 2 && memcmp(t, "!!", 2) == 0);
    CHECK_EQ_INT(stop_feed(&s, 301, &t, &l), STOP_TOKEN);
    stop_free(&s);
}

static void test_held_bytes(void)
{
    /* detokenizer holds a byte (id 999) until the next id or the flush */
    const char *stops[] = {"ZZ"};
    struct stop_state s;
    CHECK(stop_init(&s, &fake_detok, stops, 1, NULL, 0, NULL, 0, 0, NULL) == CAIRN_OK);
    const char *t;
    size_t l;
    CHECK_EQ_INT(stop_feed(&s, 'a', &t, &l), STOP_CONTINUE);
    CHECK(l == 1 && t[0] == 'a');
    CHECK_EQ_INT(stop_feed(&s, 999, &t, &l), STOP_CONTINUE);
    CHECK_EQ_INT(l, 0);
    CHECK_EQ_INT(stop_feed(&s, 'b', &t, &l), STOP_CONTINUE);
    CHECK(l == 2 && memcmp(t, "Zb", 2) == 0);
    /* length end: flush releases the held 'Z' (a partial "ZZ" match at the end is released) */
    CHECK_EQ_INT(stop_feed(&s, 999, &t, &l), STOP_CONTINUE);
    CHECK_EQ_INT(stop_finish(&s, &t, &l), STOP_CONTINUE);
    CHECK(l == 1 && t[0] == 'Z');
    stop_free(&s);

    /* stop_feed_final: the last token's text and the flush in one release */
    CHECK(stop_init(&s, &fake_detok, stops, 1, NULL, 0, NULL, 0, 0, NULL) == CAIRN_OK);
    CHECK_EQ_INT(stop_feed(&s, 'Z', &t, &l), STOP_CONTINUE);
    CHECK_EQ_INT(l, 0); /* "Z" held: could start "ZZ" */
    CHECK_EQ_INT(stop_feed_final(&s, 'c', &t, &l), STOP_CONTINUE);
    CHECK(l == 2 && memcmp(t, "Zc", 2) == 0);
    stop_free(&s);

    /* ... and a flush that completes a stop string stops */
    CHECK(stop_init(&s, &fake_detok, stops, 1, NULL, 0, NULL, 0, 0, NULL) == CAIRN_OK);
    CHECK_EQ_INT(stop_feed(&s, 'Z', &t, &l), STOP_CONTINUE);
    CHECK_EQ_INT(stop_feed_final(&s, 999, &t, &l), STOP_STRING);
    CHECK_EQ_INT(l, 0);
    stop_free(&s);
}

static void test_no_detok(void)
{
    int32_t eos[] = {5};
    struct stop_state s;
    CHECK(stop_init(&s, NULL, NULL, 0, NULL, 0, eos, 1, 0, NULL) == CAIRN_OK);
    const char *t;
    size_t l;
    CHECK_EQ_INT(stop_feed(&s, 4, &t, &l), STOP_CONTINUE);
    CHECK_EQ_INT(l, 0);
    CHECK_EQ_INT(stop_feed(&s, 5, &t, &l), STOP_TOKEN);
    stop_free(&s);
}

int main(void)
{
    test_byte_by_byte();
    test_across_tokens();
    test_ids_and_flush();
    test_held_bytes();
    test_no_detok();
    return test_summary("test_stop");
}
