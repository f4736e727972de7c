/* The SSD tier: one file per block (format in kv/tier_file.h) under a byte budget with LRU
 * eviction, written by background writer threads from a bounded queue. Internal to kv/: use
 * kv/tiers.h. Design and locking: tier_ssd_int.h.
 *
 * Test hook: env CAIRN_TEST_SSD_READ_DELAY_MS (read at open) makes every read of a block file
 * sleep that long first, to stand for a slow disk; unset in normal runs. */
#ifndef CAIRN_KV_TIER_SSD_H
#define CAIRN_KV_TIER_SSD_H

#include <stdint.h>

#include "base/status.h"
#include "kv/tier_int.h"
#include "kv/tiers.h"

struct kv_ssd;

struct kv_ssd_opts {
    struct kv_tier_signature sig;
    const char *dir;
    uint64_t max_bytes;        /* > 0 */
    int n_writers;             /* 1..4 */
    int queue_max_blocks;      /* > 0 */
    uint64_t queue_max_bytes;  /* > 0 */
    struct kv_tier_slabs *slabs; /* where blocks read for the hot tier (promote) go; NULL: plain
                                  * allocations. Must outlive the tier (kv_ssd_close). */
};

/* Scans dir and starts the writers. Fails only on out of memory or bad options; an unusable
 * folder is logged and turns writes into drops. Caller frees with kv_ssd_close. */
int kv_ssd_open(const struct kv_ssd_opts *o, struct kv_ssd **out, struct cairn_err *err);
/* Waits for the queue to drain, stops the writers, frees. NULL is fine. */
void kv_ssd_close(struct kv_ssd *s);
/* 1 if the block is indexed (on disk or queued); refreshes its LRU position. */
int kv_ssd_has(struct kv_ssd *s, const uint8_t hash[32]);
/* KV_TIER_LOC_NONE, _FAST (queued: still in memory) or _SLOW (a file to read). No LRU touch. */
int kv_ssd_locate(struct kv_ssd *s, const uint8_t hash[32]);
/* Queues b for writing (takes ownership). Already indexed: frees b. Queue full: waits for room
 * when blocking, else drops b (counted). */
void kv_ssd_enqueue(struct kv_ssd *s, struct kv_tier_block *b, int blocking);
/* See kv_tier_ops.lookup; thread-safe. On a hit read from disk and with promote != NULL, *promote receives
 * the block read (owned by the caller), for the hot tier. */
int kv_ssd_lookup(struct kv_ssd *s, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                  void *k, void *v, size_t block_bytes, void *state, size_t state_bytes,
                  int *has_state, struct kv_tier_block **promote);
/* Waits until the queue is empty and no write is in flight. */
void kv_ssd_sync(struct kv_ssd *s);
/* Drops the queue and removes every indexed file. */
void kv_ssd_clear(struct kv_ssd *s);
/* Tests: holds (1) or releases (0) the writers; queued blocks stay readable. */
void kv_ssd_pause_writers(struct kv_ssd *s, int paused);
void kv_ssd_stats(struct kv_ssd *s, struct kv_tier_stats *st);

#endif
