/* The vocabulary trie: token byte strings sorted, then laid out as a trie in DFS pre-order, so a
 * subtree is a contiguous range of nodes [i, end[i]) and its tokens a contiguous range of ids[]
 * (see grammar_int.h). Big subtrees also get the set of bytes used below them, which lets the
 * mask walk accept a whole subtree at once (grammar_match.c). Built once per model. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

uint8_t gram_u8_next(uint8_t u, uint8_t b)
{
    switch (u) {
    case 0:
        if (b < 0x80) return b >= 0x20 && b != '"' && b != '\\' ? 0 : GRAM_U8_BAD;
        if (b >= 0xC2 && b <= 0xDF) return 1;
        if (b == 0xE0) return 4;
        if (b == 0xED) return 5;
        if (b >= 0xE1 && b <= 0xEF) return 2;
        if (b == 0xF0) return 6;
        if (b >= 0xF1 && b <= 0xF3) return 3;
        if (b == 0xF4) return 7;
        return GRAM_U8_BAD;
    case 1: return b >= 0x80 && b <= 0xBF ? 0 : GRAM_U8_BAD;
    case 2: return b >= 0x80 && b <= 0xBF ? 1 : GRAM_U8_BAD;
    case 3: return b >= 0x80 && b <= 0xBF ? 2 : GRAM_U8_BAD;
    case 4: return b >= 0xA0 && b <= 0xBF ? 1 : GRAM_U8_BAD;
    case 5: return b >= 0x80 && b <= 0x9F ? 1 : GRAM_U8_BAD;
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : GRAM_U8_BAD;
    case 7: return b >= 0x80 && b <= 0x8F ? 2 : GRAM_U8_BAD;
    default: return GRAM_U8_BAD;
    }
}

/* The first offset d such that p[d..n) is clean text (a character boundary, clean characters, a
 * valid unfinished last one); n if only the empty tail is. */
static size_t gv_clean_from(const uint8_t *p, size_t n)
{
    for (size_t d = 0; d < n; d++) {
        if (p[d] >= 0x80 && p[d] <= 0xBF) continue;
        uint8_t u = 0;
        size_t k = d;
        while (k < n && (u = gram_u8_next(u, p[k])) != GRAM_U8_BAD) k++;
        if (k == n) return d;
    }
    return n;
}

struct gv_sort {
    const uint8_t *const *bytes;
    const size_t *lens;
};

static int gv_cmp_r(const void *a, const void *b, void *ctx)
{
    const struct gv_sort *c = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = c->lens[x], ly = c->lens[y], l = lx < ly ? lx : ly;
    int r = memcmp(c->bytes[x], c->bytes[y], l);
    if (r) return r;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v) return;
    free(v->byte);
    free(v->depth);
    free(v->end);
    free(v->tok_lo);
    free(v->tok_mid);
    free(v->tok_hi);
    free(v->ids);
    free(v->sclean);
    free(v->eos_mask);
    free(v->eos);
    free(v->tb);
    free(v->tb_off);
    gram_lz_cache_free(v->lz);
    free(v);
}

int grammar_vocab_size(const struct grammar_vocab *v) { return v->n_vocab; }

int grammar_vocab_create(const uint8_t *const *bytes, const size_t *lens, int n, const int32_t *eos_ids, int n_eos,
                         struct grammar_vocab **out, struct cairn_err *err)
{
    *out = NULL;
    if (n <= 0 || n_eos < 0 || (n_eos && !eos_ids))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "grammar vocab: bad size %d / %d eos ids", n, n_eos);
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] < 0 || eos_ids[i] >= n)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "grammar vocab: eos id %d out of range", (int)eos_ids[i]);
    struct grammar_vocab *v = calloc(1, sizeof(*v));
    int32_t *order = NULL, *path = NULL;
    uint32_t *ends = NULL;
    if (!v) return cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar vocab: out of memory");
    v->n_vocab = n;
    size_t words = ((size_t)n + 31) / 32;
    v->eos_mask = calloc(words, sizeof(uint32_t));
    v->eos = malloc(((size_t)n_eos + 1) * sizeof(int32_t));
    v->tb_off = malloc(((size_t)n + 1) * sizeof(int64_t));
    order = malloc((size_t)n * sizeof(int32_t));
    if (!v->eos_mask || !v->eos || !v->tb_off || !order) goto nomem;
    v->n_eos = n_eos;
    for (int i = 0; i < n_eos; i++) {
        v->eos[i] = eos_ids[i];
        v->eos_mask[eos_ids[i] >> 5] |= 1u << (eos_ids[i] & 31);
    }
    size_t total = 0, max_len = 0;
    for (int i = 0; i < n; i++) {
        size_t l = bytes[i] ? lens[i] : 0;
        total += l;
        if (l > max_len) max_len = l;
    }
    if (max_len > 60000) {
        grammar_vocab_free(v);
        free(order);
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "grammar vocab: a token of %zu bytes", max_len);
    }
    v->tb = malloc(total ? total : 1);
    if (!v->tb) goto nomem;
    size_t at = 0;
    int n_tok = 0;
    for (int i = 0; i < n; i++) {
        size_t l = bytes[i] ? lens[i] : 0;
        v->tb_off[i] = (int64_t)at;
        if (l) memcpy(v->tb + at, bytes[i], l);
        at += l;
        if (l && !(v->eos_mask[i >> 5] >> (i & 31) & 1)) order[n_tok++] = i;
    }
    v->tb_off[n] = (int64_t)at;
    struct gv_sort ctx = {bytes, lens};
    qsort_r(order, (size_t)n_tok, sizeof(int32_t), gv_cmp_r, &ctx);

    /* nodes: at most 1 + total bytes */
    size_t cap = total + 1;
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof(uint16_t));
    v->end = malloc(cap * sizeof(int32_t));
    v->tok_lo = malloc(cap * sizeof(int32_t));
    v->tok_mid = malloc(cap * sizeof(int32_t));
    v->tok_hi = malloc(cap * sizeof(int32_t));
    v->ids = malloc(((size_t)n_tok + 1) * sizeof(int32_t));
    ends = calloc(cap, sizeof(uint32_t));
    path = malloc((max_len + 1) * sizeof(int32_t));
    if (!v->byte || !v->depth || !v->end || !v->tok_lo || !v->tok_mid || !v->tok_hi || !v->ids || !ends || !path)
        goto nomem;
    int32_t nn = 1;
    v->byte[0] = 0;
    v->depth[0] = 0;
    v->tok_lo[0] = 0;
    path[0] = 0;
    int plen = 0; /* path[0..plen] is the current prefix's nodes */
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (int k = 0; k < n_tok; k++) {
        int32_t id = order[k];
        const uint8_t *p = bytes[id];
        size_t l = lens[id], lcp = 0;
        while (prev && lcp < l && lcp < prev_len && p[lcp] == prev[lcp]) lcp++;
        while ((size_t)plen > lcp) { /* close the nodes deeper than the common prefix */
            int32_t x = path[plen--];
            v->end[x] = nn;
            v->tok_hi[x] = k;
        }
        for (size_t d = lcp; d < l; d++) {
            int32_t x = nn++;
            v->byte[x] = p[d];
            v->depth[x] = (uint16_t)(d + 1);
            v->tok_lo[x] = k;
            path[++plen] = x;
        }
        ends[path[plen]]++;
        v->ids[k] = id;
        prev = p;
        prev_len = l;
    }
    while (plen >= 0) {
        int32_t x = path[plen--];
        v->end[x] = nn;
        v->tok_hi[x] = n_tok;
    }
    v->n_nodes = nn;
    for (int32_t i = 0; i < nn; i++) {
        v->tok_mid[i] = v->tok_lo[i] + (int32_t)ends[i];
        if (v->depth[i] > v->max_depth) v->max_depth = v->depth[i];
    }
    /* sclean[i]: for every child c, c's byte starts a character and every token under c is clean
     * from depth(i) on (its clean-from offset <= depth(i)); from the leaves up */
    v->sclean = calloc((size_t)nn, 1);
    int32_t *maxm = malloc((size_t)nn * sizeof(int32_t));
    if (!v->sclean || !maxm) {
        free(maxm);
        goto nomem;
    }
    for (int32_t i = nn; i-- > 0;) {
        int32_t mm = -1;
        for (int32_t k = v->tok_lo[i]; k < v->tok_mid[i]; k++) {
            int32_t id = v->ids[k];
            int32_t c = (int32_t)gv_clean_from(bytes[id], lens[id]);
            if (c > mm) mm = c;
        }
        int ok = v->end[i] > i + 1;
        for (int32_t c = i + 1; c < v->end[i]; c = v->end[c]) {
            if (maxm[c] > mm) mm = maxm[c];
            if ((v->byte[c] >= 0x80 && v->byte[c] <= 0xBF) || maxm[c] > v->depth[i]) ok = 0;
        }
        maxm[i] = mm;
        v->sclean[i] = (uint8_t)ok;
    }
    free(maxm);
    free(order);
    free(ends);
    free(path);
    *out = v;
    return CAIRN_OK;
nomem:
    free(order);
    free(ends);
    free(path);
    grammar_vocab_free(v);
    return cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar vocab: out of memory");
}
