/* tok BPE model: one pre-tokenized word -> ids, as HF tokenizers' BPE does it.
 *
 * Initial symbols are the word's characters (vocab lookups; unknown characters go to byte
 * fallback <0xXX> pieces or to the unk token, fused if fuse_unk). Merges are applied lowest
 * rank first (ties: leftmost) with a binary heap over a doubly linked symbol list, so a word of
 * n characters costs O(n log n): a 100 KB "word" is fine. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_int.h"

struct tok_heap_ent {
    uint64_t key; /* rank << 32 | pos */
    int32_t new_id;
};

static int tok_bpe_reserve(struct tok_bpe_work *w, size_t n)
{
    if (n <= w->cap) return CAIRN_OK;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *a = realloc(w->sym, cap * sizeof(int32_t));
    if (!a) return CAIRN_ERR_NOMEM;
    w->sym = a;
    a = realloc(w->prev, cap * sizeof(int32_t));
    if (!a) return CAIRN_ERR_NOMEM;
    w->prev = a;
    a = realloc(w->next, cap * sizeof(int32_t));
    if (!a) return CAIRN_ERR_NOMEM;
    w->next = a;
    uint32_t *l = realloc(w->slen, cap * sizeof(uint32_t));
    if (!l) return CAIRN_ERR_NOMEM;
    w->slen = l;
    w->cap = cap;
    return CAIRN_OK;
}

void tok_bpe_work_free(struct tok_bpe_work *w)
{
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->slen);
    free(w->heap);
    cairn_buf_free(&w->key);
    memset(w, 0, sizeof(*w));
}

static inline int tok_heap_less(const struct tok_heap_ent *a, const struct tok_heap_ent *b)
{
    return a->key < b->key;
}

static int tok_heap_push(struct tok_bpe_work *w, uint64_t key, int32_t new_id)
{
    struct tok_heap_ent *h = (struct tok_heap_ent *)w->heap;
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        h = realloc(w->heap, cap * sizeof(*h));
        if (!h) return CAIRN_ERR_NOMEM;
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    struct tok_heap_ent e = {key, new_id};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
    return CAIRN_OK;
}

static struct tok_heap_ent tok_heap_pop(struct tok_bpe_work *w)
{
    struct tok_heap_ent *h = (struct tok_heap_ent *)w->heap;
    struct tok_heap_ent top = h[0];
    struct tok_heap_ent last = h[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t c = (l + 1 < n && tok_heap_less(&h[l + 1], &h[l])) ? l + 1 : l;
        if (!tok_heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

static inline int tok_merge_get(const struct tok *t, int32_t a, int32_t b, uint32_t *rank,
                                int32_t *nid)
{
    uint64_t v;
    if (!tok_qmap_get(&t->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, &v)) return 0;
    *rank = (uint32_t)(v >> 32);
    *nid = (int32_t)(uint32_t)v;
    return 1;
}

static int32_t tok_char_id(const struct tok *t, struct tok_bpe_work *w, const char *s, size_t n,
                           size_t i, size_t l)
{
    int first = i == 0, last = i + l == n;
    if (!t->cont_prefix && !t->eow_suffix) return tok_smap_get(&t->model_vocab, s + i, l);
    w->key.n = 0;
    if (!first && t->cont_prefix && cairn_buf_put(&w->key, t->cont_prefix, t->cont_prefix_len))
        return -2;
    if (cairn_buf_put(&w->key, s + i, l)) return -2;
    if (last && t->eow_suffix && cairn_buf_put(&w->key, t->eow_suffix, t->eow_suffix_len)) return -2;
    return tok_smap_get(&t->model_vocab, w->key.p, w->key.n);
}

static int tok_bpe_one(const struct tok *t, struct tok_bpe_work *w, const char *s, size_t n,
                       struct tok_ids *ids)
{
    if (tok_bpe_reserve(w, n)) return CAIRN_ERR_NOMEM;
    size_t ns = 0;
    int32_t unk_pending = 0; /* bytes of a pending (fused) unk */
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t l = cairn_utf8_seq_len((uint8_t)s[i]);
        if (i + l > n) l = n - i;
        int32_t id = tok_char_id(t, w, s, n, i, l);
        if (id == -2) return CAIRN_ERR_NOMEM;
        if (id >= 0) {
            if (unk_pending) {
                w->sym[ns] = t->unk_id, w->slen[ns++] = unk_len;
                unk_pending = 0;
            }
            w->sym[ns] = id, w->slen[ns++] = (uint32_t)l;
            i += l;
            continue;
        }
        if (t->byte_fallback) {
            int ok = 1;
            for (size_t k = 0; k < l; k++)
                if (t->byte_ids[(uint8_t)s[i + k]] < 0) ok = 0;
            if (ok) {
                for (size_t k = 0; k < l; k++)
                    w->sym[ns] = t->byte_ids[(uint8_t)s[i + k]], w->slen[ns++] = 1;
                i += l;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk_pending && t->fuse_unk) {
                unk_len += (uint32_t)l;
            } else {
                if (unk_pending) w->sym[ns] = t->unk_id, w->slen[ns++] = unk_len;
                unk_pending = 1;
                unk_len = (uint32_t)l;
            }
        }
        i += l;
    }
    if (unk_pending) w->sym[ns] = t->unk_id, w->slen[ns++] = unk_len;
    if (!ns) return CAIRN_OK;
    for (size_t k = 0; k < ns; k++) {
        w->prev[k] = (int32_t)k - 1;
        w->next[k] = k + 1 < ns ? (int32_t)k + 1 : -1;
    }
    w->heap_n = 0;
    for (size_t k = 0; k + 1 < ns; k++) {
        uint32_t rank;
        int32_t nid;
        if (tok_merge_get(t, w->sym[k], w->sym[k + 1], &rank, &nid) &&
            tok_heap_push(w, ((uint64_t)rank << 32) | k, nid))
            return CAIRN_ERR_NOMEM;
    }
    while (w->heap_n) {
        struct tok_heap_ent top = tok_heap_pop(w);
        uint32_t pos = (uint32_t)top.key;
        if (w->slen[pos] == 0 || w->next[pos] < 0) continue;
        int32_t nx = w->next[pos];
        uint32_t rank;
        int32_t nid;
        if (!tok_merge_get(t, w->sym[pos], w->sym[nx], &rank, &nid) || nid != top.new_id) continue;
        w->sym[pos] = nid;
        w->slen[pos] += w->slen[nx];
        w->slen[nx] = 0;
        w->next[pos] = w->next[nx];
        if (w->next[nx] >= 0) w->prev[w->next[nx]] = (int32_t)pos;
        int32_t pv = w->prev[pos];
        if (pv >= 0 && tok_merge_get(t, w->sym[pv], w->sym[pos], &rank, &nid) &&
            tok_heap_push(w, ((uint64_t)rank << 32) | (uint32_t)pv, nid))
            return CAIRN_ERR_NOMEM;
        nx = w->next[pos];
        if (nx >= 0 && tok_merge_get(t, w->sym[pos], w->sym[nx], &rank, &nid) &&
            tok_heap_push(w, ((uint64_t)rank << 32) | pos, nid))
            return CAIRN_ERR_NOMEM;
    }
    for (int32_t k = 0; k >= 0; k = w->next[k])
        if (tok_ids_push(ids, w->sym[k])) return CAIRN_ERR_NOMEM;
    return CAIRN_OK;
}

static int tok_sp_glued(const struct tok *t, uint32_t cp)
{
    size_t a = 0, b = t->n_sp_glue;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (t->sp_glue[m] == cp) return 1;
        if (t->sp_glue[m] < cp)
            a = m + 1;
        else
            b = m;
    }
    return 0;
}

int tok_bpe_word(const struct tok *t, struct tok_bpe_work *w, const char *s, size_t n,
                 struct tok_ids *ids)
{
    if (!n) return CAIRN_OK;
    if (t->ignore_merges) {
        int32_t id = tok_smap_get(&t->model_vocab, s, n);
        if (id >= 0) return tok_ids_push(ids, id);
    }
    if (!t->sp_split || n < 16) return tok_bpe_one(t, w, s, n, ids);
    size_t start = 0;
    uint32_t prev = 0x2581;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = cairn_utf8_get(s, n, i, &cp);
        if (cp == 0x2581 && i > start && prev != 0x2581 && !tok_sp_glued(t, prev)) {
            int st = tok_bpe_one(t, w, s + start, i - start, ids);
            if (st) return st;
            start = i;
        }
        prev = cp;
        i += l;
    }
    return tok_bpe_one(t, w, s + start, n - start, ids);
}
