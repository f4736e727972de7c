/* Prompt-lookup drafting for speculative decoding: propose the continuation of the longest recent
 * match of the sequence's tail in the sequence itself (prompt + output so far).
 *
 * Semantics (what the brute-force reference in tests/unit/test_spec_ngram.c implements): for a
 * sequence S[0, N), find the largest n in [min_n, max_n] such that the tail S[N-n, N) also occurs
 * ending at some e < N-1; among those occurrences take the most recent (largest e). The draft is
 * the continuation S[e+1], S[e+2], ... up to max_k tokens; when it runs past the end of S it
 * reads on through the draft itself (so a periodic tail drafts its period). No occurrence of
 * length >= min_n: no draft. Coding agents re-emit files and tool results they were shown, and
 * the most recent copy is usually the one being edited, hence "most recent".
 *
 * DESIGN: an open-addressing hash index of the n-grams of every length in [min_n, max_n] by
 * their end position, holding only the most recent end of each distinct n-gram. Indexing a
 * position costs max_n - min_n + 1 inserts (the tail's hashes are built incrementally from the
 * end), and a draft costs at most that many lookups plus the copy: O(1) per token whatever the
 * length of the sequence, no scan. Slots keep a 16-bit hash check and the n-gram length; a hit
 * is confirmed by comparing tokens, so the result is exact (never a hash collision). The table
 * doubles at load 1/2 (amortized O(1); it is sized for the expected length at init so decode
 * rarely grows it). Memory: 16 to 32 bytes per indexed position and length at most (8-byte
 * slots at load 1/2 to 1/4), less when n-grams repeat.
 *
 * The index does not copy tokens: every call passes the caller's token array, whose first
 * n_indexed + 1 entries must not change between calls (tokens are only ever appended; drafts
 * that were rejected never enter it). One index per sequence, used by one thread. */
#ifndef CAIRN_ENGINE_SPEC_NGRAM_H
#define CAIRN_ENGINE_SPEC_NGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define SPEC_NGRAM_MAX_N 32 /* largest max_n accepted */
#define SPEC_NGRAM_DEFAULT_MIN_N 2
#define SPEC_NGRAM_DEFAULT_MAX_N 8

struct spec_ngram_slot {
    uint32_t end1;  /* end position + 1 of the most recent occurrence; 0 = empty */
    uint16_t n;     /* n-gram length */
    uint16_t check; /* 16 more bits of the hash, to skip most token compares */
};

struct spec_ngram {
    int min_n, max_n;
    int n_indexed;                 /* end positions [0, n_indexed) are in the table */
    struct spec_ngram_slot *slots; /* [cap], owned (cairn_mem, CAIRN_MEM_OTHER) */
    size_t cap;                    /* power of two */
    size_t n_used;                 /* occupied slots */
};

/* min_n in [1, max_n], max_n in [min_n, SPEC_NGRAM_MAX_N]; 0 for either = its default.
 * expect_tokens sizes the table (0 = a small start). CAIRN_ERR_INVALID names a bad length. */
int spec_ngram_init(struct spec_ngram *g, int min_n, int max_n, int expect_tokens,
                    struct cairn_err *err);
void spec_ngram_free(struct spec_ngram *g);
/* Forgets everything (the sequence was replaced); keeps the table's memory. */
void spec_ngram_reset(struct spec_ngram *g);

/* Drafts up to max_k tokens continuing tokens[0, n_tokens) into out[max_k]; returns the count
 * (0 = no match). Indexes the end positions it has not seen yet first (all but the last).
 * CAIRN_ERR_NOMEM (negative) if the table could not grow: the draft is then 0 tokens and the
 * index stays valid for what it held; the caller may go on without speculation. n_tokens must
 * not decrease between calls (use spec_ngram_reset). */
int spec_ngram_draft(struct spec_ngram *g, const int32_t *tokens, int n_tokens, int max_k,
                     int32_t *out);

#endif
