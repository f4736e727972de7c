/* Prompt-lookup drafting over a hash index of recent n-grams (see spec_ngram.h). */
#include "engine/spec_ngram.h"

#include <string.h>

#include "base/mem.h"

#define SPEC_NGRAM_MIN_CAP 1024

static uint64_t spec_ngram_fmix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* h[n] for n in [1, max_n]: hash of the n-gram tokens[end-n+1, end], built from the end so all
 * lengths cost one pass. Returns the largest n available (end + 1 when the start is near). */
static int spec_ngram_hashes(const int32_t *tokens, int end, int max_n, uint64_t *h)
{
    uint64_t x = 0xcbf29ce484222325ull;
    int n = 0;
    while (n < max_n && end - n >= 0) {
        x = (x ^ (uint32_t)tokens[end - n]) * 0x100000001b3ull;
        n++;
        h[n] = spec_ngram_fmix(x + (uint64_t)n);
    }
    return n;
}

static int spec_ngram_same(const int32_t *tokens, int end_a, int end_b, int n)
{
    for (int i = 0; i < n; i++)
        if (tokens[end_a - i] != tokens[end_b - i]) return 0;
    return 1;
}

/* The slot holding the n-gram ending at `end` (hash h), or the empty slot where it would go. */
static struct spec_ngram_slot *spec_ngram_find(struct spec_ngram *g, const int32_t *tokens, int end,
                                               int n, uint64_t h)
{
    size_t mask = g->cap - 1;
    uint16_t check = (uint16_t)(h >> 48);
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        struct spec_ngram_slot *s = &g->slots[i];
        if (!s->end1) return s;
        if (s->n == n && s->check == check && spec_ngram_same(tokens, (int)s->end1 - 1, end, n))
            return s;
    }
}

static int spec_ngram_grow(struct spec_ngram *g, const int32_t *tokens, size_t want)
{
    size_t cap = g->cap;
    while (want * 2 > cap)
        cap *= 2;
    if (cap == g->cap) return CAIRN_OK;
    struct spec_ngram_slot *old = g->slots;
    size_t old_cap = g->cap;
    g->slots = cairn_mem_alloc(cap * sizeof(*g->slots), CAIRN_MEM_OTHER);
    if (!g->slots) {
        g->slots = old;
        return CAIRN_ERR_NOMEM;
    }
    g->cap = cap;
    uint64_t h[SPEC_NGRAM_MAX_N + 1];
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].end1) continue;
        int end = (int)old[i].end1 - 1;
        spec_ngram_hashes(tokens, end, old[i].n, h);
        size_t mask = cap - 1, j = (size_t)h[old[i].n] & mask;
        while (g->slots[j].end1)
            j = (j + 1) & mask; /* all keys are distinct */
        g->slots[j] = old[i];
    }
    cairn_mem_free(old, old_cap * sizeof(*old), CAIRN_MEM_OTHER);
    return CAIRN_OK;
}

int spec_ngram_init(struct spec_ngram *g, int min_n, int max_n, int expect_tokens,
                    struct cairn_err *err)
{
    memset(g, 0, sizeof(*g));
    if (!min_n) min_n = SPEC_NGRAM_DEFAULT_MIN_N;
    if (!max_n) max_n = SPEC_NGRAM_DEFAULT_MAX_N > min_n ? SPEC_NGRAM_DEFAULT_MAX_N : min_n;
    if (min_n < 1 || max_n < min_n || max_n > SPEC_NGRAM_MAX_N)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "speculative n-gram lengths: need 1 <= min (%d) <= max (%d) <= %d",
                             min_n, max_n, SPEC_NGRAM_MAX_N);
    g->min_n = min_n;
    g->max_n = max_n;
    size_t want = (size_t)(expect_tokens > 0 ? expect_tokens : 0) * (size_t)(max_n - min_n + 1);
    g->cap = SPEC_NGRAM_MIN_CAP;
    while (want * 2 > g->cap)
        g->cap *= 2;
    g->slots = cairn_mem_alloc(g->cap * sizeof(*g->slots), CAIRN_MEM_OTHER);
    if (!g->slots) {
        size_t bytes = g->cap * sizeof(*g->slots);
        memset(g, 0, sizeof(*g));
        return cairn_err_set(err, CAIRN_ERR_NOMEM,
                             "speculative n-gram index: cannot allocate %zu bytes", bytes);
    }
    return CAIRN_OK;
}

void spec_ngram_free(struct spec_ngram *g)
{
    if (g->slots) cairn_mem_free(g->slots, g->cap * sizeof(*g->slots), CAIRN_MEM_OTHER);
    memset(g, 0, sizeof(*g));
}

void spec_ngram_reset(struct spec_ngram *g)
{
    memset(g->slots, 0, g->cap * sizeof(*g->slots));
    g->n_used = 0;
    g->n_indexed = 0;
}

/* Indexes the n-grams ending at `end`, each now pointing at its most recent end. */
static int spec_ngram_index(struct spec_ngram *g, const int32_t *tokens, int end)
{
    int rc = spec_ngram_grow(g, tokens, g->n_used + (size_t)(g->max_n - g->min_n + 1));
    if (rc) return rc;
    uint64_t h[SPEC_NGRAM_MAX_N + 1];
    int top = spec_ngram_hashes(tokens, end, g->max_n, h);
    for (int n = g->min_n; n <= top; n++) {
        struct spec_ngram_slot *s = spec_ngram_find(g, tokens, end, n, h[n]);
        if (!s->end1) {
            s->n = (uint16_t)n;
            s->check = (uint16_t)(h[n] >> 48);
            g->n_used++;
        }
        s->end1 = (uint32_t)end + 1;
    }
    return CAIRN_OK;
}

int spec_ngram_draft(struct spec_ngram *g, const int32_t *tokens, int n_tokens, int max_k,
                     int32_t *out)
{
    CAIRN_ASSERT(n_tokens >= g->n_indexed);
    /* every end but the last: an occurrence must have a continuation */
    while (g->n_indexed < n_tokens - 1) {
        int rc = spec_ngram_index(g, tokens, g->n_indexed);
        if (rc) return rc;
        g->n_indexed++;
    }
    if (max_k <= 0 || n_tokens < 2) return 0;
    uint64_t h[SPEC_NGRAM_MAX_N + 1];
    int top = spec_ngram_hashes(tokens, n_tokens - 1, g->max_n, h);
    /* a tail of length n + 1 occurring implies its length-n tail occurring: stop at the first miss
     */
    int best_end = -1;
    for (int n = g->min_n; n <= top; n++) {
        struct spec_ngram_slot *s = spec_ngram_find(g, tokens, n_tokens - 1, n, h[n]);
        if (!s->end1) break;
        best_end = (int)s->end1 - 1;
    }
    if (best_end < 0) return 0;
    for (int j = 0; j < max_k; j++) {
        int src = best_end + 1 + j; /* <= n_tokens - 1 + j, so out[src - n_tokens] is already set */
        out[j] = src < n_tokens ? tokens[src] : out[src - n_tokens];
    }
    return max_k;
}
