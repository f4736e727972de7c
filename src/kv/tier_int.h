/* Internals shared by the hot and SSD tiers: an owned copy of one block, and a hash map with an
 * intrusive LRU list keyed by the 32-byte block hash. Not thread-safe by themselves: each tier
 * guards its own map with its own mutex. */
#ifndef CAIRN_KV_TIER_INT_H
#define CAIRN_KV_TIER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_tier.h"

/* An owned copy of a block: one cairn_mem_alloc (CAIRN_MEM_HOT) holding this struct, the token
 * ids, K, V and the snapshot. Immutable once built, so readers may copy from it while another
 * thread holds a pointer (under the owner's lock). */
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
    size_t alloc_bytes; /* the whole allocation (what budgets count) */
};

/* The speeds file of a model (identity) on a device in an SSD folder (tier_speeds.c): load
 * returns 1 with *sp filled or 0 (none, damaged: *sp zeroed); save writes it crash-safely (a
 * failure is logged, never fatal). */
int kv_tier_speeds_load(const char *dir, const uint8_t identity[32], const char *device, struct kv_tier_speeds *sp);
void kv_tier_speeds_save(const char *dir, const uint8_t identity[32], const char *device,
                         const struct kv_tier_speeds *sp);

/* Allocates an empty block with room for the given sizes. NULL on out of memory. */
struct kv_tier_block *kv_tier_block_new(int n_tokens, size_t block_bytes, size_t state_bytes);
/* Copies a descriptor. NULL on out of memory. */
struct kv_tier_block *kv_tier_block_from_desc(const struct kv_block_desc *d);
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
