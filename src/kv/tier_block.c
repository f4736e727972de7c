/* Owned block copies (in a slab slot or a cairn_mem_alloc) and the hash map + LRU list used by
 * the hot and SSD tiers. */
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "kv/tier_int.h"
#include "kv/tier_slab.h"

static size_t tier_align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

size_t kv_tier_block_layout_bytes(int n_tokens, size_t block_bytes, size_t state_bytes)
{
    if (n_tokens < 0 || n_tokens > (1 << 20)) return 0;
    if (block_bytes > SIZE_MAX / 4 || state_bytes > SIZE_MAX / 4) return 0;
    size_t head = tier_align64(sizeof(struct kv_tier_block));
    size_t tok = tier_align64((size_t)n_tokens * sizeof(int32_t));
    size_t kb = tier_align64(block_bytes);
    size_t total = head + tok + 2 * kb + state_bytes;
    return total < head ? 0 : total;
}

struct kv_tier_block *kv_tier_block_new_in(struct kv_tier_slabs *pool, int n_tokens,
                                           size_t block_bytes, size_t state_bytes)
{
    size_t total = kv_tier_block_layout_bytes(n_tokens, block_bytes, state_bytes);
    if (total == 0) return NULL;
    size_t head = tier_align64(sizeof(struct kv_tier_block));
    size_t tok = tier_align64((size_t)n_tokens * sizeof(int32_t));
    size_t kb = tier_align64(block_bytes);
    struct kv_tier_slab *slab = NULL;
    uint8_t *p = NULL;
    if (kv_tier_slabs_fits(pool, n_tokens, block_bytes, state_bytes)) {
        p = kv_tier_slabs_get(pool, &slab);
        /* a reused slot holds an earlier block: clear what readers take as metadata */
        if (p) memset(p, 0, head + tok);
    }
    if (p) {
        total = kv_tier_slabs_slot_bytes(pool);
    } else {
        p = cairn_mem_alloc(total, CAIRN_MEM_HOT);
        if (!p) return NULL;
    }
    struct kv_tier_block *b = (struct kv_tier_block *)p;
    b->n_tokens = n_tokens;
    b->block_bytes = block_bytes;
    b->state_bytes = state_bytes;
    b->has_state = state_bytes > 0;
    b->tokens = (int32_t *)(p + head);
    b->k = p + head + tok;
    b->v = b->k + kb;
    b->state = state_bytes ? b->v + kb : NULL;
    b->alloc_bytes = total;
    b->slab = slab;
    return b;
}

struct kv_tier_block *kv_tier_block_new(int n_tokens, size_t block_bytes, size_t state_bytes)
{
    return kv_tier_block_new_in(NULL, n_tokens, block_bytes, state_bytes);
}

struct kv_tier_block *kv_tier_block_from_desc_in(struct kv_tier_slabs *pool,
                                                 const struct kv_block_desc *d)
{
    size_t sb = d->state ? d->state_bytes : 0;
    struct kv_tier_block *b = kv_tier_block_new_in(pool, d->n_tokens, d->block_bytes, sb);
    if (!b) return NULL;
    memcpy(b->hash, d->hash, 32);
    memcpy(b->parent, d->parent, 32);
    if (d->n_tokens) memcpy(b->tokens, d->tokens, (size_t)d->n_tokens * sizeof(int32_t));
    memcpy(b->k, d->k, d->block_bytes);
    memcpy(b->v, d->v, d->block_bytes);
    if (sb) memcpy(b->state, d->state, sb);
    return b;
}

struct kv_tier_block *kv_tier_block_from_desc(const struct kv_block_desc *d)
{
    return kv_tier_block_from_desc_in(NULL, d);
}

void kv_tier_block_free(struct kv_tier_block *b)
{
    if (!b) return;
    if (b->slab)
        kv_tier_slabs_put(b->slab, b);
    else
        cairn_mem_free(b, b->alloc_bytes, CAIRN_MEM_HOT);
}

int kv_tier_block_copy_out(const struct kv_tier_block *b, const int32_t *tokens, int n_tokens,
                           void *k, void *v, size_t block_bytes, void *state, size_t state_bytes,
                           int *has_state)
{
    if (b->n_tokens != n_tokens || b->block_bytes != block_bytes) return 0;
    if (n_tokens && memcmp(b->tokens, tokens, (size_t)n_tokens * sizeof(int32_t)) != 0) return 0;
    int with_state = b->has_state && state != NULL;
    if (with_state && b->state_bytes != state_bytes) return 0;
    memcpy(k, b->k, block_bytes);
    memcpy(v, b->v, block_bytes);
    if (with_state) memcpy(state, b->state, state_bytes);
    if (has_state) *has_state = with_state;
    return 1;
}

int kv_tier_block_copy_to(const struct kv_tier_block *b, const int32_t *tokens, int n_tokens,
                          const struct kv_tier_copy *dst, int *has_state)
{
    if (b->n_tokens != n_tokens || b->block_bytes != dst->block_bytes) return 0;
    if (n_tokens && memcmp(b->tokens, tokens, (size_t)n_tokens * sizeof(int32_t)) != 0) return 0;
    int with_state = b->has_state && dst->state != NULL;
    if (with_state && b->state_bytes != dst->state_bytes) return 0;
    if (!dst->copy(dst->copy_ctx, dst->k, b->k, b->block_bytes) ||
        !dst->copy(dst->copy_ctx, dst->v, b->v, b->block_bytes))
        return -1;
    if (with_state) memcpy(dst->state, b->state, b->state_bytes);
    if (has_state) *has_state = with_state;
    return 1;
}

/* ---- map ---- */

static size_t tier_map_slot(const struct kv_tier_map *m, const uint8_t key[32])
{
    uint64_t h;
    memcpy(&h, key, 8); /* keys are SHA-256 digests: any 8 bytes are well mixed */
    return (size_t)h & (m->n_buckets - 1);
}

int kv_tier_map_init(struct kv_tier_map *m)
{
    memset(m, 0, sizeof(*m));
    m->n_buckets = 1024;
    m->buckets = calloc(m->n_buckets, sizeof(*m->buckets));
    return m->buckets ? 0 : -1;
}

void kv_tier_map_free(struct kv_tier_map *m)
{
    free(m->buckets);
    memset(m, 0, sizeof(*m));
}

struct kv_tier_link *kv_tier_map_find(const struct kv_tier_map *m, const uint8_t key[32])
{
    for (struct kv_tier_link *l = m->buckets[tier_map_slot(m, key)]; l; l = l->bucket_next)
        if (memcmp(l->key, key, 32) == 0) return l;
    return NULL;
}

static int tier_map_grow(struct kv_tier_map *m)
{
    size_t nb = m->n_buckets * 2;
    struct kv_tier_link **b = calloc(nb, sizeof(*b));
    if (!b) return -1;
    for (size_t i = 0; i < m->n_buckets; i++) {
        struct kv_tier_link *l = m->buckets[i];
        while (l) {
            struct kv_tier_link *next = l->bucket_next;
            uint64_t h;
            memcpy(&h, l->key, 8);
            size_t s = (size_t)h & (nb - 1);
            l->bucket_next = b[s];
            b[s] = l;
            l = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->n_buckets = nb;
    return 0;
}

int kv_tier_map_insert(struct kv_tier_map *m, struct kv_tier_link *l)
{
    if (m->n + 1 > m->n_buckets && tier_map_grow(m) != 0) return -1;
    size_t s = tier_map_slot(m, l->key);
    l->bucket_next = m->buckets[s];
    m->buckets[s] = l;
    l->lru_next = NULL;
    l->lru_prev = m->lru_tail;
    if (m->lru_tail)
        m->lru_tail->lru_next = l;
    else
        m->lru_head = l;
    m->lru_tail = l;
    m->n++;
    return 0;
}

static void tier_lru_unlink(struct kv_tier_map *m, struct kv_tier_link *l)
{
    if (l->lru_prev)
        l->lru_prev->lru_next = l->lru_next;
    else
        m->lru_head = l->lru_next;
    if (l->lru_next)
        l->lru_next->lru_prev = l->lru_prev;
    else
        m->lru_tail = l->lru_prev;
    l->lru_prev = l->lru_next = NULL;
}

void kv_tier_map_remove(struct kv_tier_map *m, struct kv_tier_link *l)
{
    struct kv_tier_link **pp = &m->buckets[tier_map_slot(m, l->key)];
    while (*pp && *pp != l) pp = &(*pp)->bucket_next;
    if (*pp) *pp = l->bucket_next;
    l->bucket_next = NULL;
    tier_lru_unlink(m, l);
    m->n--;
}

void kv_tier_map_touch(struct kv_tier_map *m, struct kv_tier_link *l)
{
    if (m->lru_tail == l) return;
    tier_lru_unlink(m, l);
    l->lru_prev = m->lru_tail;
    if (m->lru_tail)
        m->lru_tail->lru_next = l;
    else
        m->lru_head = l;
    m->lru_tail = l;
}
