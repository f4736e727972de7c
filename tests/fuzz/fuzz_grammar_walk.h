/* Shared by the grammar fuzz targets: runs a compiled grammar over a byte vocabulary (token b =
 * byte b, token 256 = eos) driven by the fuzz input, and checks the matcher's invariants: every
 * token the mask allows is accepted, the mask equals a brute-force try of every token, eos is
 * allowed exactly when the output is complete, and rollback returns to the earlier mask. */
#ifndef CAIRN_FUZZ_GRAMMAR_WALK_H
#define CAIRN_FUZZ_GRAMMAR_WALK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "grammar/grammar.h"

static struct grammar_vocab *fz_vocab(void)
{
    static struct grammar_vocab *v;
    if (v) return v;
    static uint8_t bytes[256];
    static const uint8_t *p[257];
    static size_t lens[257];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (uint8_t)i;
        p[i] = &bytes[i];
        lens[i] = 1;
    }
    p[256] = NULL;
    lens[256] = 0;
    int32_t eos = 256;
    CAIRN_ASSERT(grammar_vocab_create(p, lens, 257, &eos, 1, &v, NULL) == CAIRN_OK);
    return v;
}

static void fz_walk(struct grammar *g, const uint8_t *drive, size_t n)
{
    struct grammar_matcher *m;
    if (grammar_matcher_create(g, fz_vocab(), &m, NULL) != CAIRN_OK) return;
    uint32_t mask[9], again[9];
    for (size_t k = 0; k < n && k < 64; k++) {
        int cnt = grammar_matcher_fill_mask(m, mask);
        if (cnt < 0) break;
        int c2 = 0;
        for (int t = 0; t < 257; t++) {
            int bit = (int)(mask[t >> 5] >> (t & 31) & 1);
            c2 += bit;
            uint8_t b = (uint8_t)t;
            int want = t == 256 ? grammar_matcher_accepting(m) : grammar_matcher_try_bytes(m, &b, 1) == 1;
            CAIRN_ASSERT(bit == want);
        }
        CAIRN_ASSERT(c2 == cnt);
        if (cnt == 0) break;
        /* the drive byte picks among the allowed tokens */
        int pick = drive[k] % cnt, t = 0;
        for (; t < 257; t++)
            if (mask[t >> 5] >> (t & 31) & 1 && pick-- == 0) break;
        CAIRN_ASSERT(grammar_matcher_accept_token(m, t) == CAIRN_OK);
        if (t == 256) {
            grammar_matcher_fill_mask(m, again);
            CAIRN_ASSERT(grammar_matcher_finished(m));
            break;
        }
        if (drive[k] & 0x80 && grammar_matcher_n_steps(m) >= 1) { /* roll back one and redo it */
            CAIRN_ASSERT(grammar_matcher_rollback(m, 1) == CAIRN_OK);
            grammar_matcher_fill_mask(m, again);
            CAIRN_ASSERT(memcmp(mask, again, sizeof(mask)) == 0);
            CAIRN_ASSERT(grammar_matcher_accept_token(m, t) == CAIRN_OK);
        }
    }
    grammar_matcher_free(m);
}

#endif
