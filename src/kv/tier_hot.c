/* Hot RAM tier. DESIGN: a hash map of entries (kv_tier_map, with the LRU list), each owning a
 * kv_tier_block. hot->mu guards everything in struct kv_hot; blocks leaving the tier are
 * collected under the lock and spilled or freed after it is released, so the SSD queue's lock
 * is never taken inside ours (no lock order to get wrong). */
#include "kv/tier_hot.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct hot_entry {
    struct kv_tier_link link; /* first: key = block hash */
    struct kv_tier_block *blk;
    int dirty;                /* the SSD does not have it */
};

struct kv_hot {
    pthread_mutex_t mu;
    struct kv_tier_map map;   /* guarded by mu */
    uint64_t bytes;           /* sum of blk->alloc_bytes; guarded by mu */
    uint64_t max_bytes;
    kv_hot_spill_fn spill;
    void *spill_ctx;
    struct kv_tier_stats st;  /* counters; guarded by mu */
};

/* Blocks removed under the lock, handled after it. */
struct hot_out {
    struct kv_tier_block **blk;
    int *dirty;
    size_t n, cap;
};

static void hot_out_add(struct hot_out *o, struct kv_tier_block *b, int dirty)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 8;
        struct kv_tier_block **nb = realloc(o->blk, cap * sizeof(*nb));
        int *nd = nb ? realloc(o->dirty, cap * sizeof(*nd)) : NULL;
        if (nb) o->blk = nb;
        if (!nb || !nd) {
            /* Out of memory for the list: the block is lost, never leaked. */
            kv_tier_block_free(b);
            return;
        }
        o->dirty = nd;
        o->cap = cap;
    }
    o->blk[o->n] = b;
    o->dirty[o->n] = dirty;
    o->n++;
}

static void hot_out_flush(struct kv_hot *h, struct hot_out *o, int blocking)
{
    uint64_t n_dropped = 0;
    for (size_t i = 0; i < o->n; i++) {
        if (o->dirty[i] && h->spill) {
            h->spill(h->spill_ctx, o->blk[i], blocking);
        } else {
            if (o->dirty[i]) n_dropped++;
            kv_tier_block_free(o->blk[i]);
        }
    }
    if (n_dropped) {
        pthread_mutex_lock(&h->mu);
        h->st.n_drops += n_dropped;
        pthread_mutex_unlock(&h->mu);
    }
    free(o->blk);
    free(o->dirty);
    memset(o, 0, sizeof(*o));
}

static void hot_remove_locked(struct kv_hot *h, struct hot_entry *e, struct hot_out *o)
{
    kv_tier_map_remove(&h->map, &e->link);
    h->bytes -= e->blk->alloc_bytes;
    if (o)
        hot_out_add(o, e->blk, e->dirty);
    else
        kv_tier_block_free(e->blk);
    free(e);
}

int kv_hot_new(uint64_t max_bytes, kv_hot_spill_fn spill, void *spill_ctx, struct kv_hot **out)
{
    *out = NULL;
    struct kv_hot *h = calloc(1, sizeof(*h));
    if (!h) return CAIRN_ERR_NOMEM;
    if (kv_tier_map_init(&h->map) != 0) {
        free(h);
        return CAIRN_ERR_NOMEM;
    }
    pthread_mutex_init(&h->mu, NULL);
    h->max_bytes = max_bytes;
    h->spill = spill;
    h->spill_ctx = spill_ctx;
    *out = h;
    return CAIRN_OK;
}

void kv_hot_clear(struct kv_hot *h, int flush)
{
    struct hot_out o = {0};
    pthread_mutex_lock(&h->mu);
    while (h->map.lru_head)
        hot_remove_locked(h, (struct hot_entry *)h->map.lru_head, flush ? &o : NULL);
    pthread_mutex_unlock(&h->mu);
    hot_out_flush(h, &o, 1);
}

void kv_hot_free(struct kv_hot *h, int flush)
{
    if (!h) return;
    kv_hot_clear(h, flush);
    kv_tier_map_free(&h->map);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void kv_hot_put(struct kv_hot *h, struct kv_tier_block *b, int dirty)
{
    struct hot_out o = {0};
    pthread_mutex_lock(&h->mu);
    struct hot_entry *e = (struct hot_entry *)kv_tier_map_find(&h->map, b->hash);
    if (e) {
        kv_tier_map_touch(&h->map, &e->link);
        e->dirty = dirty;
        pthread_mutex_unlock(&h->mu);
        kv_tier_block_free(b);
        return;
    }
    if (b->alloc_bytes > h->max_bytes || !(e = calloc(1, sizeof(*e)))) {
        h->st.n_evictions++;
        hot_out_add(&o, b, dirty);
        goto unlock;
    }
    /* Make room first, oldest first. */
    while (h->bytes + b->alloc_bytes > h->max_bytes && h->map.lru_head) {
        hot_remove_locked(h, (struct hot_entry *)h->map.lru_head, &o);
        h->st.n_evictions++;
    }
    memcpy(e->link.key, b->hash, 32);
    e->blk = b;
    e->dirty = dirty;
    if (kv_tier_map_insert(&h->map, &e->link) != 0) {
        free(e);
        hot_out_add(&o, b, dirty);
        goto unlock;
    }
    h->bytes += b->alloc_bytes;
    h->st.n_writes++;
unlock:
    pthread_mutex_unlock(&h->mu);
    hot_out_flush(h, &o, 0);
}

int kv_hot_touch(struct kv_hot *h, const uint8_t hash[32])
{
    pthread_mutex_lock(&h->mu);
    struct kv_tier_link *l = kv_tier_map_find(&h->map, hash);
    if (l) kv_tier_map_touch(&h->map, l);
    pthread_mutex_unlock(&h->mu);
    return l != NULL;
}

int kv_hot_lookup(struct kv_hot *h, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                  void *k, void *v, size_t block_bytes, void *state, size_t state_bytes,
                  int *has_state)
{
    int hit = 0;
    pthread_mutex_lock(&h->mu);
    struct hot_entry *e = (struct hot_entry *)kv_tier_map_find(&h->map, hash);
    if (e) {
        hit = kv_tier_block_copy_out(e->blk, tokens, n_tokens, k, v, block_bytes, state,
                                     state_bytes, has_state);
        if (hit) {
            kv_tier_map_touch(&h->map, &e->link);
        } else {
            LOG_WARN("kv", "hot tier: block with matching hash but different tokens or sizes, "
                           "dropped");
            h->st.n_damaged++;
            hot_remove_locked(h, e, NULL);
        }
    }
    if (hit)
        h->st.n_hits++;
    else
        h->st.n_misses++;
    pthread_mutex_unlock(&h->mu);
    return hit;
}

int kv_hot_lookup_copy(struct kv_hot *h, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                       const struct kv_tier_copy *dst, int *has_state)
{
    int hit = 0;
    pthread_mutex_lock(&h->mu);
    struct hot_entry *e = (struct hot_entry *)kv_tier_map_find(&h->map, hash);
    if (e) {
        hit = kv_tier_block_copy_to(e->blk, tokens, n_tokens, dst, has_state);
        if (hit == 1) {
            kv_tier_map_touch(&h->map, &e->link);
            h->st.n_hits++;
        } else if (hit == 0) {
            LOG_WARN("kv", "hot tier: block with matching hash but different tokens or sizes, "
                           "dropped");
            h->st.n_damaged++;
            hot_remove_locked(h, e, NULL);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return hit == 1;
}

void kv_hot_mark_all_dirty(struct kv_hot *h)
{
    pthread_mutex_lock(&h->mu);
    for (struct kv_tier_link *l = h->map.lru_head; l; l = l->lru_next)
        ((struct hot_entry *)l)->dirty = 1;
    pthread_mutex_unlock(&h->mu);
}

void kv_hot_stats(struct kv_hot *h, struct kv_tier_stats *st)
{
    pthread_mutex_lock(&h->mu);
    *st = h->st;
    st->enabled = 1;
    st->n_blocks = h->map.n;
    st->n_bytes = h->bytes;
    st->max_bytes = h->max_bytes;
    pthread_mutex_unlock(&h->mu);
}
