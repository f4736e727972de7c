/* Helpers for the grammar tests: a byte vocabulary (token b = byte b, eos = 256), a synthetic
 * multi-byte vocabulary, random walks through a matcher, and a brute-force mask reference. */
#ifndef CAIRN_TEST_GRAMMAR_UTIL_H
#define CAIRN_TEST_GRAMMAR_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

struct tg_vocab {
    int n;
    uint8_t **bytes;
    size_t *lens;
    struct grammar_vocab *v;
};

static uint64_t tg_rng_state = 0x1234567887654321ull;
static inline uint32_t tg_rand(void)
{
    tg_rng_state ^= tg_rng_state << 13;
    tg_rng_state ^= tg_rng_state >> 7;
    tg_rng_state ^= tg_rng_state << 17;
    return (uint32_t)(tg_rng_state >> 16);
}

static inline void tg_vocab_free(struct tg_vocab *tv)
{
    for (int i = 0; i < tv->n; i++) free(tv->bytes[i]);
    free(tv->bytes);
    free(tv->lens);
    grammar_vocab_free(tv->v);
    memset(tv, 0, sizeof(*tv));
}

static inline void tg_vocab_add(struct tg_vocab *tv, const void *p, size_t n)
{
    tv->bytes[tv->n] = n ? malloc(n) : NULL;
    if (n) memcpy(tv->bytes[tv->n], p, n);
    tv->lens[tv->n] = n;
    tv->n++;
}

/* 256 single bytes, then n_extra random strings (JSON-ish ASCII pieces and UTF-8), then eos. */
static inline int tg_vocab_make(struct tg_vocab *tv, int n_extra)
{
    memset(tv, 0, sizeof(*tv));
    int cap = 257 + n_extra;
    tv->bytes = calloc((size_t)cap, sizeof(uint8_t *));
    tv->lens = calloc((size_t)cap, sizeof(size_t));
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        tg_vocab_add(tv, &c, 1);
    }
    static const char *pieces[] = {"\"", "{", "}", "[", "]", ":", ",", " ", "\": ", "\", \"", "true", "false", "null",
                                   "0", "1", "12", "-", ".", "e", "abc", "name", "id", "\\", "\\n", "\\u00", "é", "日本",
                                   "ü", "\xf0\x9f\x98\x80", "\xe6", "\x97\xa5", "\"}", "\"]", "}}", "]}", "\n", "T",
                                   "Z", ":00", "2024", "-0", "@", "x.y", "  "};
    int np = (int)(sizeof(pieces) / sizeof(pieces[0]));
    for (int k = 0; k < n_extra; k++) {
        char buf[64];
        size_t n = 0;
        int parts = 1 + (int)(tg_rand() % 4);
        for (int p = 0; p < parts; p++) {
            const char *s = pieces[tg_rand() % (uint32_t)np];
            size_t l = strlen(s);
            if (n + l >= sizeof(buf)) break;
            memcpy(buf + n, s, l);
            n += l;
        }
        tg_vocab_add(tv, buf, n);
    }
    tg_vocab_add(tv, NULL, 0); /* eos */
    int32_t eos = tv->n - 1;
    return grammar_vocab_create((const uint8_t *const *)tv->bytes, tv->lens, tv->n, &eos, 1, &tv->v, NULL);
}

static inline int tg_bit(const uint32_t *mask, int i) { return (int)(mask[i >> 5] >> (i & 31) & 1); }

/* Brute force: every token's bytes tried through the matcher; eos when accepting. 1 if equal. */
static inline int tg_mask_matches_brute(struct grammar_matcher *m, const struct tg_vocab *tv, const uint32_t *mask)
{
    int ok = 1;
    for (int i = 0; i < tv->n && ok; i++) {
        int want = tv->lens[i] ? grammar_matcher_try_bytes(m, tv->bytes[i], tv->lens[i]) == 1
                               : grammar_matcher_accepting(m);
        if (want != tg_bit(mask, i)) {
            fprintf(stderr, "mask mismatch at token %d (len %zu): brute %d, mask %d\n", i, tv->lens[i], want,
                    tg_bit(mask, i));
            ok = 0;
        }
    }
    return ok;
}

/* Random walk (tg_walk_n also gives the length: the bytes may hold NULs): picks allowed tokens at random (eos with probability p_stop when allowed) until
 * eos or max_tokens; appends bytes to out (NUL-terminated). Returns 1 if it ended in eos. */
static inline int tg_walk_n(struct grammar_matcher *m, const struct tg_vocab *tv, int max_tokens, double p_stop,
                            char *out, size_t cap, size_t *out_len, int check_brute, int *brute_ok)
{
    size_t n = 0;
    uint32_t *mask = malloc(((size_t)tv->n + 31) / 32 * sizeof(uint32_t));
    int32_t *allowed = malloc((size_t)tv->n * sizeof(int32_t));
    int32_t eos = tv->n - 1;
    int ended = 0;
    out[0] = 0;
    for (int step = 0; step < max_tokens; step++) {
        int cnt = grammar_matcher_fill_mask(m, mask);
        if (cnt <= 0) break;
        if (check_brute && !tg_mask_matches_brute(m, tv, mask)) *brute_ok = 0;
        int na = 0;
        for (int i = 0; i < tv->n; i++)
            if (tg_bit(mask, i) && i != eos) allowed[na++] = i;
        if (tg_bit(mask, eos) && (na == 0 || (double)(tg_rand() % 1000) < p_stop * 1000)) {
            grammar_matcher_accept_token(m, eos);
            ended = 1;
            break;
        }
        if (na == 0) break;
        int32_t t = allowed[tg_rand() % (uint32_t)na];
        if (grammar_matcher_accept_token(m, t) != 0) break;
        if (n + tv->lens[t] + 1 < cap) {
            memcpy(out + n, tv->bytes[t], tv->lens[t]);
            n += tv->lens[t];
            out[n] = 0;
        }
    }
    free(mask);
    free(allowed);
    if (out_len) *out_len = n;
    return ended;
}

static inline int tg_walk(struct grammar_matcher *m, const struct tg_vocab *tv, int max_tokens, double p_stop,
                          char *out, size_t cap, int check_brute, int *brute_ok)
{
    return tg_walk_n(m, tv, max_tokens, p_stop, out, cap, NULL, check_brute, brute_ok);
}

#endif
