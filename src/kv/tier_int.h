/* Internals shared by the hot and SSD tiers: an owned copy of one block, and a hash map with an
 * intrusive LRU list keyed by the 32-byte block hash. Not thread-safe by themselves: each tier
 * guards its own map with its own mutex. */
#ifndef CAIRN_KV_TIER_INT_H
#define CAIRN_KV_TIER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_tier.h"

/* An owned copy of a block: one allocation holding this struct, the token ids, K, V and the
 * snapshot, either a slot of a slab pool (tier_slab.h: pinned memory, so device uploads run at
 * DMA speed) or, for blocks without a pool or that fit none of its slots, a cairn_mem_alloc
 * (CAIRN_MEM_HOT). Immutable once built, so readers may copy from it while another thread
 * holds a pointer (under the owner's lock). */
struct kv_tier_block {
    uint8_t hash[32];
    uint8_t parent[32];
    int n_tokens;
    int has_state;
    size_t block_bytes; /* K (= V) bytes */
    size_t state_bytes; /* 0 when has_state is 0 */
    int32_t *tokens;    /* [n_tokens], inside this allocation */
    uint8_t *k;
    uint8_t *v;
    uint8_t *state;     /* NULL when has_state is 0 */
    size_t alloc_bytes; /* the whole allocation (what budgets count): a slab's slot size */
    struct kv_tier_slab *slab; /* the slab holding it (kv_tier_block_free gives the slot back);
                                * NULL: a cairn_mem_alloc */
};

/* The speeds file of a model (identity) on a device in an SSD folder (tier_speeds.c): load
 * returns 1 with *sp filled or 0 (none, damaged: *sp zeroed); save writes it crash-safely (a
 * failure is logged, never fatal). */
int kv_tier_speeds_load(const char *dir, const uint8_t identity[32], const char *device, struct kv_tier_speeds *sp);
void kv_tier_speeds_save(const char *dir, const uint8_t identity[32], const char *device,
                         const struct kv_tier_speeds *sp);

struct kv_tier_slabs;

/* Bytes of one block's layout (header, tokens, K, V, state); 0 for sizes out of range. */
size_t kv_tier_block_layout_bytes(int n_tokens, size_t block_bytes, size_t state_bytes);
/* Allocates an empty block with room for the given sizes: in a slot of pool when pool is not
 * NULL and the sizes fit its slots (kv_tier_slabs_fits), else (or when no slab can be mapped)
 * with cairn_mem_alloc. Header and token ids are zeroed; K, V and state are not (in a slot)
 * and must be written in full. NULL on out of memory. pool must outlive the block. */
struct kv_tier_block *kv_tier_block_new_in(struct kv_tier_slabs *pool, int n_tokens,
                                           size_t block_bytes, size_t state_bytes);
/* kv_tier_block_new_in without a pool. */
struct kv_tier_block *kv_tier_block_new(int n_tokens, size_t block_bytes, size_t state_bytes);
/* Copies a descriptor (into a slot of pool when it fits, like kv_tier_block_new_in). NULL on
 * out of memory. */
struct kv_tier_block *kv_tier_block_from_desc_in(struct kv_tier_slabs *pool,
                                                 const struct kv_block_desc *d);
struct kv_tier_block *kv_tier_block_from_desc(const struct kv_block_desc *d);
/* Frees a block from any thread (a slot goes back to its slab). NULL is fine. */
void kv_tier_block_free(struct kv_tier_block *b);
/* Lookup check and copy-out: returns 1 and fills k/v(/state) when tokens and sizes match. */
int kv_tier_block_copy_out(const struct kv_tier_block *b, const int32_t *tokens, int n_tokens,
                           void *k, void *v, size_t block_bytes, void *state, size_t state_bytes,
                           int *has_state);
/* kv_tier_block_copy_out through dst->copy (kv_tier.h's lookup_copy): 1 copied, 0 the block does
 * not match (tokens, sizes), -1 the copy failed. */
int kv_tier_block_copy_to(const struct kv_tier_block *b, const int32_t *tokens, int n_tokens,
                          const struct kv_tier_copy *dst, int *has_state);

/* Map node: embed as the first member of an entry. lru_prev/next form a list, oldest first. */
struct kv_tier_link {
    uint8_t key[32];
    struct kv_tier_link *bucket_next;
    struct kv_tier_link *lru_prev;
    struct kv_tier_link *lru_next;
};

struct kv_tier_map {
    struct kv_tier_link **buckets;
    size_t n_buckets; /* power of two */
    size_t n;
    struct kv_tier_link *lru_head; /* least recently used */
    struct kv_tier_link *lru_tail; /* most recently used */
};

int kv_tier_map_init(struct kv_tier_map *m);
void kv_tier_map_free(struct kv_tier_map *m); /* frees the buckets, not the entries */
struct kv_tier_link *kv_tier_map_find(const struct kv_tier_map *m, const uint8_t key[32]);
/* Inserts (key must be absent) at the MRU end. Returns 0, or -1 on out of memory (growth). */
int kv_tier_map_insert(struct kv_tier_map *m, struct kv_tier_link *l);
void kv_tier_map_remove(struct kv_tier_map *m, struct kv_tier_link *l);
void kv_tier_map_touch(struct kv_tier_map *m, struct kv_tier_link *l); /* move to MRU end */

#endif
