/* The contract between the device-tier block cache (kv_cache, engine side) and the lower tiers
 * (hot RAM, SSD). The cache calls these hooks; a tier copies what it keeps.
 *
 * Payload layout of one block: K then V, each n_kv_layers * layer_block_bytes laid out as
 * [layer][block_size][n_kv_heads][head_dim] (exactly kv_pool_k(pool, block, 0) onwards), plus an
 * optional recurrent-state snapshot (hybrid models) taken at the block's last token.
 *
 * Threads: on_evict and on_publish run on the scheduler thread. lookup runs there for blocks that
 * locate calls fast, and on the cache's fetch thread (kv/kv_fetch.h) for slow ones, concurrently
 * with the other hooks: a tier that fills locate must make lookup thread-safe. */
#ifndef CAIRN_KV_KV_TIER_H
#define CAIRN_KV_KV_TIER_H

#include <stddef.h>
#include <stdint.h>

struct kv_block_desc {
    uint8_t hash[32];      /* chained block hash (see kv_cache.h) */
    uint8_t parent[32];    /* hash of the previous block, zeroes for the first */
    int n_tokens;          /* = block_size (only full blocks are cached) */
    const int32_t *tokens; /* [n_tokens] */
    const void *k;         /* block_bytes */
    const void *v;         /* block_bytes */
    size_t block_bytes;
    const void *state;     /* snapshot or NULL */
    size_t state_bytes;
};

/* Where a lower tier holds a block (locate): FAST is a copy out of RAM, cheap enough for the
 * scheduler thread; SLOW needs I/O (an SSD read) and is fetched off the scheduler thread. */
enum kv_tier_loc {
    KV_TIER_LOC_NONE = 0,
    KV_TIER_LOC_FAST = 1,
    KV_TIER_LOC_SLOW = 2,
};

/* Where lookup_copy puts a block: K and V (block_bytes each) through copy (a device pool: the
 * backend's upload into k and v, device pointers; returns 1 on success), the state (if any) into
 * the host buffer `state`. */
struct kv_tier_copy {
    void *k, *v;
    size_t block_bytes;
    void *state;
    size_t state_bytes;
    int (*copy)(void *copy_ctx, void *dst, const void *src, size_t bytes);
    void *copy_ctx;
};

/* Speeds measured at run time that the restore-or-recompute choice reads (kv_restore.h); 0 =
 * not measured. A tier that persists them gives the next run of the same model on the same
 * device its first choices informed (without them, the first SSD hit after a restart is always
 * restored: on a GPU that can be slower than recomputing). */
struct kv_tier_speeds {
    double prefill_tok_s; /* the engine's prefill rate */
    double fast_bps;      /* RAM-tier copies (kv_cache.fast_read_bps) */
    double slow_bps;      /* disk reads (kv_cache.slow_read_bps) */
};

struct kv_tier_slabs; /* kv/tier_slab.h */

struct kv_tier_ops {
    void *ctx;
    /* A cached block leaves the device tier (evicted). Called on the scheduler thread: copy and
     * return quickly (queue slow work). May be NULL. */
    void (*on_evict)(void *ctx, const struct kv_block_desc *b);
    /* Asked before on_evict, with the block's hash only: 0 when the tiers already hold it (its
     * LRU position refreshed, as on_evict would), so the cache skips copying it out of the
     * device (a restored prefix evicted again: 2 x block_bytes of download saved); 1: call
     * on_evict. May be NULL (always 1). Scheduler thread. */
    int (*evict_wanted)(void *ctx, const uint8_t hash[32]);
    /* A new full block was published (write-through). May be NULL. */
    void (*on_publish)(void *ctx, const struct kv_block_desc *b);
    /* Looks up `hash`; on a hit whose stored tokens equal `tokens`, copies K and V (block_bytes
     * each) and, if the block has a snapshot and state != NULL, the state (state_bytes) into the
     * caller's buffers, sets *has_state, and returns 1. Returns 0 on a miss (including any
     * damaged or mismatching entry, which the tier drops). */
    int (*lookup)(void *ctx, const uint8_t hash[32], const int32_t *tokens, int n_tokens, void *k,
                  void *v, size_t block_bytes, void *state, size_t state_bytes, int *has_state);
    /* Where `hash` is held (enum kv_tier_loc), without copying anything; may refresh its LRU
     * position. May be NULL: then every lookup runs on the scheduler thread, as before there was
     * a fetch thread (tests' simple tiers). */
    int (*locate)(void *ctx, const uint8_t hash[32]);
    /* The speeds an earlier run of this model on `device` (a backend name: "cpu", "cuda:0") kept:
     * 1 and *sp filled, or 0 (none). engine_create calls it once. May be NULL. */
    int (*speeds_load)(void *ctx, const char *device, struct kv_tier_speeds *sp);
    /* Keeps them for the next run (crash-safe); engine_destroy calls it. May be NULL. */
    void (*speeds_save)(void *ctx, const char *device, const struct kv_tier_speeds *sp);
    /* lookup for a pool in device memory, answered by a RAM tier alone: on a hit K and V go
     * through dst->copy straight from the tier's own copy (no host stage: the stage's memcpy was
     * half of a hot hit's time on a GPU) and 1 is returned. 0: not in RAM, or the copy failed;
     * the caller then runs lookup into its host stage (the disk, or the copy again). Runs on the
     * scheduler thread, for blocks that locate calls fast. May be NULL. */
    int (*lookup_copy)(void *ctx, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                       const struct kv_tier_copy *dst, int *has_state);
    /* Where the device cache's fetch thread (kv_fetch.c) takes the blocks it reads for upload:
     * the tiers' pinned slab pool, or NULL (plain allocations). Lives as long as ctx. */
    struct kv_tier_slabs *slabs;
};

#endif
