/* The hot tier: whole block copies in RAM (CAIRN_MEM_HOT) under a byte budget, LRU eviction.
 * A block is dirty when the SSD does not have it yet; evicted or flushed dirty blocks are handed
 * to the spill function (the SSD queue), clean ones are freed. Internal to kv/: use kv/tiers.h.
 *
 * Thread-safe: one mutex (hot->mu) guards the map, the LRU list, the byte count and the
 * counters. Block copies in and out happen under it; spilling happens outside it. */
#ifndef CAIRN_KV_TIER_HOT_H
#define CAIRN_KV_TIER_HOT_H

#include <stdint.h>

#include "kv/tier_int.h"
#include "kv/tiers.h"

struct kv_hot;

/* Receives an owned block leaving the hot tier dirty. blocking = 0 on the scheduler-thread paths
 * (the callee may drop), 1 on flush (clear/close: the callee waits for room). */
typedef void (*kv_hot_spill_fn)(void *ctx, struct kv_tier_block *b, int blocking);

int kv_hot_new(uint64_t max_bytes, kv_hot_spill_fn spill, void *spill_ctx, struct kv_hot **out);
/* Flushes dirty blocks to spill (blocking) when flush, then frees everything. */
void kv_hot_free(struct kv_hot *h, int flush);
/* Takes ownership of b. Already present: refreshes its LRU position and dirty flag, frees b.
 * A block larger than the whole budget goes straight to spill (when dirty). */
void kv_hot_put(struct kv_hot *h, struct kv_tier_block *b, int dirty);
/* 1 if present (and refreshes its LRU position). */
int kv_hot_touch(struct kv_hot *h, const uint8_t hash[32]);
/* See kv_tier_ops.lookup. A token or size mismatch drops the entry. Counts a hit or a miss. */
int kv_hot_lookup(struct kv_hot *h, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                  void *k, void *v, size_t block_bytes, void *state, size_t state_bytes,
                  int *has_state);
/* See kv_tier_ops.lookup_copy: the copy runs under the tier's lock (the block cannot leave
 * meanwhile). Counts a hit; a miss is left to the lookup the caller runs next. */
int kv_hot_lookup_copy(struct kv_hot *h, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                       const struct kv_tier_copy *dst, int *has_state);
/* Empties the tier; dirty blocks go to spill (blocking) when flush, else are dropped. */
void kv_hot_clear(struct kv_hot *h, int flush);
/* After the SSD was cleared: every block becomes dirty again. */
void kv_hot_mark_all_dirty(struct kv_hot *h);
void kv_hot_stats(struct kv_hot *h, struct kv_tier_stats *st);

#endif
