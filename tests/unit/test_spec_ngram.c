/* Prompt-lookup drafter (engine/spec_ngram.h) against a brute-force reference of the documented
 * semantics: for every prefix of random and copy-heavy token streams, the incremental index
 * drafts exactly what a full scan of the sequence finds (longest tail in [min_n, max_n] that
 * occurred before, most recent occurrence, continuation reading through the draft itself).
 * Also: table growth from a tiny start, reset, parameter errors. */
#include "engine/spec_ngram.h"
#include "testlib.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* The reference: scans every length and every earlier end position. */
static int ref_draft(const int32_t *t, int N, int min_n, int max_n, int max_k, int32_t *out)
{
    int best_n = 0, best_end = -1;
    for (int n = min_n; n <= max_n && n <= N; n++) {
        for (int e = N - 2; e >= n - 1; e--) {
            int same = 1;
            for (int i = 0; i < n && same; i++)
                same = t[e - i] == t[N - 1 - i];
            if (same) {
                if (n > best_n) {
                    best_n = n;
                    best_end = e;
                }
                break; /* most recent of this length */
            }
        }
    }
    if (best_end < 0 || max_k <= 0) return 0;
    int32_t ext[4096 + 64];
    memcpy(ext, t, (size_t)N * sizeof(int32_t));
    for (int j = 0; j < max_k; j++) {
        ext[N + j] = ext[best_end + 1 + j];
        out[j] = ext[N + j];
    }
    return max_k;
}

/* Random tokens over `vocab`, or (copy) mostly copies of earlier spans with a few edits. */
static void make_stream(int32_t *t, int n, int vocab, int copy)
{
    int i = 0;
    while (i < n) {
        if (copy && i > 16 && rnd(4) != 0) {
            int len = 4 + (int)rnd(40), from = (int)rnd((uint32_t)i);
            for (int j = 0; j < len && i < n; j++)
                t[i++] = rnd(30) == 0 ? (int32_t)rnd((uint32_t)vocab) : t[from + j];
        } else {
            t[i++] = (int32_t)rnd((uint32_t)vocab);
        }
    }
}

static void check_stream(const int32_t *t, int n, int min_n, int max_n, int expect,
                         const char *what)
{
    struct spec_ngram g;
    CHECK(spec_ngram_init(&g, min_n, max_n, expect, NULL) == CAIRN_OK);
    int n_bad = 0, n_drafts = 0, n_long = 0;
    for (int N = 0; N <= n; N++) {
        int k = (int)rnd(12);
        int32_t got[16], want[16];
        int a = spec_ngram_draft(&g, t, N, k, got);
        int b = ref_draft(t, N, g.min_n, g.max_n, k, want);
        int same = a == b && (a <= 0 || memcmp(got, want, (size_t)a * sizeof(int32_t)) == 0);
        if (!same && n_bad++ < 5)
            fprintf(stderr, "%s: N=%d k=%d got %d want %d\n", what, N, k, a, b);
        n_drafts += b > 0;
        /* how often the match is at least max_n long (the copy streams should be long-match heavy)
         */
        if (b > 0 && N >= g.max_n) {
            int32_t tmp[16];
            n_long += ref_draft(t, N, g.max_n, g.max_n, 1, tmp) > 0;
        }
    }
    CHECK_MSG(n_bad == 0, "%s: %d of %d drafts differ from the reference", what, n_bad, n + 1);
    CHECK_MSG(n_drafts > n / 4, "%s: only %d drafts: the stream does not exercise matching", what,
              n_drafts);
    printf("%s: %d positions, %d drafts (%d at max length), table %zu slots, %zu used\n", what,
           n + 1, n_drafts, n_long, g.cap, g.n_used);
    spec_ngram_free(&g);
}

int main(void)
{
    static int32_t t[4096];
    /* random over a small vocabulary: many short matches of every length */
    make_stream(t, 3000, 3, 0);
    check_stream(t, 3000, 2, 8, 0, "random vocab 3, n 2..8");
    make_stream(t, 3000, 20, 0);
    check_stream(t, 3000, 1, 4, 3000, "random vocab 20, n 1..4");
    /* copy-heavy with edits: long matches, the most recent copy matters */
    make_stream(t, 4000, 1000, 1);
    check_stream(t, 4000, 2, 8, 0, "copy-heavy vocab 1000, n 2..8");
    make_stream(t, 4000, 50, 1);
    check_stream(t, 4000, 3, 32, 100, "copy-heavy vocab 50, n 3..32");
    /* a periodic tail drafts its period through the draft itself */
    for (int i = 0; i < 40; i++)
        t[i] = 7 + i % 3;
    check_stream(t, 40, 2, 5, 0, "periodic");
    {
        struct spec_ngram g;
        CHECK(spec_ngram_init(&g, 2, 4, 0, NULL) == CAIRN_OK);
        int32_t out[8];
        CHECK_EQ_INT(spec_ngram_draft(&g, t, 10, 8, out), 8);
        for (int j = 0; j < 8; j++)
            CHECK_EQ_INT(out[j], 7 + (10 + j) % 3);
        /* reset: a different sequence, from scratch */
        int32_t u[6] = {1, 2, 3, 4, 5, 6};
        spec_ngram_reset(&g);
        CHECK_EQ_INT(spec_ngram_draft(&g, u, 6, 4, out), 0);
        /* ends 0..4 indexed, all n-grams distinct: lengths 2..4 fit 0 + 1 + 2 + 3 + 3 times */
        CHECK_EQ_INT(g.n_used, 9);
        spec_ngram_free(&g);
    }
    /* parameter errors name the problem */
    {
        struct spec_ngram g;
        struct cairn_err err = {0};
        CHECK(spec_ngram_init(&g, 5, 3, 0, &err) == CAIRN_ERR_INVALID);
        CHECK(strstr(err.msg, "min (5)") != NULL);
        CHECK(spec_ngram_init(&g, 1, SPEC_NGRAM_MAX_N + 1, 0, &err) == CAIRN_ERR_INVALID);
        CHECK(spec_ngram_init(&g, 0, 0, 0, &err) == CAIRN_OK);
        CHECK_EQ_INT(g.min_n, SPEC_NGRAM_DEFAULT_MIN_N);
        CHECK_EQ_INT(g.max_n, SPEC_NGRAM_DEFAULT_MAX_N);
        spec_ngram_free(&g);
    }
    return test_summary("test_spec_ngram");
}
