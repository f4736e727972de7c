/* The device-tier block cache: who owns which kv_pool block, and the prefix index.
 *
 * DESIGN
 * - Every pool block is in exactly one of three states:
 *     FREE    refcount 0, unpublished, on the free list;
 *     USED    refcount > 0 (held by one or more sequences' block tables);
 *     CACHED  refcount 0 but published: it holds a full block of a known prefix and waits in LRU
 *             order (least recently released first) until its memory is needed.
 * - A FULL block is published under a chained hash
 *     hash = SHA-256(identity, parent hash, token ids (int32 LE), salt)
 *   where `identity` is what the owner passes at init (the engine mixes the model identity with
 *   the KV dtype and block size, so a tier never hands back a payload of another layout) and the
 *   parent hash is all zeroes for the first block. Lookups compare the stored token ids and the
 *   parent hash too: hash equality alone is never trusted.
 * - kv_cache_alloc takes a FREE block, else evicts the least recently used CACHED block (calling
 *   tiers.on_evict first, so a lower tier can keep it). USED blocks are never evicted.
 * - Publishing a block whose identical twin is already published returns the twin (with a
 *   reference taken): the caller switches its block table to it and releases its own copy, so a
 *   shared prefix is stored once.
 * - Hybrid models (state_bytes > 0): a block may carry a recurrent-state snapshot taken right after
 *   its last token (accounted under CAIRN_MEM_STATE, allocated when attached, freed when the block
 *   is recycled). kv_cache_match only ends a match on a block that has one. Snapshots live in the
 *   memory of the pool's backend (kv_state.h: device memory on a GPU, where the engine copies a
 *   running sequence's state in and out without a host round trip); a tier gets and gives host
 *   bytes, staged through the backend's download/upload like K and V.
 * - Tiers (kv_tier.h): on_publish at publish, on_evict at eviction, lookup on a device miss during
 *   kv_cache_match (a hit takes a block, copies the payload in and publishes it: promotion).
 * - Admission in the engine is two-phase when the tiers fill locate: kv_cache_plan walks the
 *   chain (device, then where the tiers hold each block) and chooses how much to restore against
 *   recomputing (kv_restore.h, speeds measured here and the engine's prefill speed); if a block
 *   to restore is on disk, kv_cache_fetch_start hands the chain to the fetch thread
 *   (kv_fetch.h) and the request waits; kv_cache_match_fetched then installs the job's blocks
 *   and copies RAM-tier (FAST) blocks itself. It never reads a SLOW block on this thread.
 *
 * Threading: not thread-safe; owned by the engine's scheduler thread (the fetch thread only
 * touches its jobs and the tiers). */
#ifndef CAIRN_KV_KV_CACHE_H
#define CAIRN_KV_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/kv_fetch.h"
#include "kv/kv_pool.h"
#include "kv/kv_restore.h"
#include "kv/kv_tier.h"

struct kv_cache_block; /* per-block metadata, private to kv_cache.c */

struct kv_cache {
    struct kv_pool *pool;         /* not owned */
    uint8_t identity[32];
    size_t state_bytes;           /* snapshot size; 0 = no snapshots (pure attention) */
    struct kv_tier_ops tiers;     /* copy of the hooks; NULL members are skipped */
    struct kv_cache_block *blocks; /* [pool->n_blocks] */
    int32_t *tokens;              /* [n_blocks][block_size] token ids of published blocks */
    int32_t *free_stack;          /* [n_blocks] ids of FREE blocks */
    int n_free;
    int lru_head, lru_tail;       /* CACHED blocks, head = least recently released; -1 = empty */
    int n_cached;
    int n_used;
    int32_t *buckets;             /* hash index: [n_buckets] first block id, -1 = empty */
    int n_buckets;                /* power of two */
    void *scratch_state;          /* state_bytes of host memory, for tier lookups */
    void *stage;                  /* stage_bytes of host memory for block copies to and from
                                     the tiers when the pool is not host-visible (a GPU): K, V,
                                     then a snapshot; NULL on the CPU, where tiers see the pool
                                     and the snapshots directly */
    size_t stage_bytes;           /* 2 * pool->block_bytes + state_bytes, or 0 */
    int stage_pinned;             /* the backend pinned the stage (host_pin): an evicted
                                     block's download runs at DMA speed; unpinned at free */
    int n_snapshots;              /* blocks holding a snapshot */
    int max_snapshots;            /* 0 = no limit */
    struct kv_fetch *fetch;       /* the fetch thread; NULL when the tiers lack locate */
    uint8_t (*plan_hash)[32];     /* [plan_cap] scratch of kv_cache_plan / fetch_start */
    uint8_t *plan_loc;            /* [plan_cap] */
    int plan_cap;
    /* measured speeds (kv_restore.h); 0 = not yet */
    double fast_read_bps;         /* RAM-tier copies into the pool (per block, smoothed) */
    double slow_read_bps;         /* disk reads of fetch jobs (per job, smoothed) */
    double slow_measured_at;      /* cairn_now() of the last slow measurement */
    double slow_prior_bps;        /* an earlier run's disk speed (kv_tier_ops.speeds_load): used
                                   * when no recent measurement is (else 0: unmeasured) */
    /* counters */
    uint64_t n_evictions;
    uint64_t n_promotions;
    uint64_t n_twins;             /* publishes that found an identical block */
    uint64_t n_fetches;           /* fetch jobs started */
    uint64_t n_fetches_cut;       /* of which stopped early: the disk slower than recomputing */
    uint64_t n_fetched_blocks;    /* blocks installed from fetch jobs */
    uint64_t n_plans_restore;     /* plans with tier blocks that restore all of them */
    uint64_t n_plans_recompute;   /* plans that recompute some tier blocks instead */
    uint64_t n_blocks_recomputed; /* tier blocks left to recompute by those plans */
};

/* kv_cache_plan's answer for one prefix: blocks [0, n_device) are on the device, the next
 * n_tier in the lower tiers (up to the first miss); the first n_restore of those are worth
 * restoring, and n_slow of the restored ones must be read from disk (a fetch). */
struct kv_cache_plan {
    int n_device;
    int n_tier;
    int n_restore;
    int n_slow;
    double recompute_block_s; /* seconds a block's recompute takes at the plan's prefill rate (0:
                               * unknown): a fetch whose disk reads turn out slower stops there */
};

/* `identity` (32 bytes) is mixed into every block hash. `tiers` may be NULL. */
int kv_cache_init(struct kv_cache *c, struct kv_pool *pool, const uint8_t identity[32],
                  size_t state_bytes, const struct kv_tier_ops *tiers, struct cairn_err *err);
void kv_cache_free(struct kv_cache *c);
/* Speeds an earlier run measured (kv_tier_ops.speeds_load), as priors until this run measures. */
void kv_cache_speed_priors(struct kv_cache *c, double fast_bps, double slow_bps);
/* What this run knows of its tiers' speeds, for kv_tier_ops.speeds_save: measured, else the prior. */
void kv_cache_speeds(const struct kv_cache *c, double *fast_bps, double *slow_bps);

/* Chained block hash (see the DESIGN note). parent may be NULL (= zeroes), salt may be NULL. */
void kv_cache_hash(const struct kv_cache *c, const uint8_t *parent, const int32_t *tokens,
                   int n_tokens, const uint8_t *salt, uint8_t out[32]);

/* Takes a block with refcount 1 (FREE first, else evicts the LRU CACHED one). Returns the block
 * id, or -1 when every block is USED. */
int kv_cache_alloc(struct kv_cache *c);
/* One more reference to a USED or CACHED block (a CACHED block becomes USED). */
void kv_cache_ref(struct kv_cache *c, int block);
/* Drops one reference. At zero, a published block becomes CACHED (most recently used end of the
 * LRU), an unpublished one FREE. */
void kv_cache_release(struct kv_cache *c, int block);

/* Publishes USED block `block` holding `block_size` tokens whose KV is fully computed, under the
 * chain (parent, tokens, salt). Returns the block the caller should now hold: `block` itself, or an
 * identical published twin, in which case a reference to the twin was taken and the caller must
 * switch to it and release `block`. *hash_out (may be NULL) receives the block hash. */
int kv_cache_publish(struct kv_cache *c, int block, const uint8_t *parent, const int32_t *tokens,
                     const uint8_t *salt, uint8_t hash_out[32]);

/* Published block with this hash whose stored parent and token ids equal the arguments, or -1.
 * Takes no reference. */
int kv_cache_find(const struct kv_cache *c, const uint8_t hash[32], const uint8_t *parent,
                  const int32_t *tokens);

/* Longest cached prefix of tokens[0..n_tokens): walks the hash chain block by block (device tier,
 * then tiers.lookup with promotion), at most max_blocks blocks. With state_bytes > 0 the match is
 * cut back to the last block that has a snapshot. Takes one reference per returned block and
 * writes their ids to out_blocks[] (capacity max_blocks). Returns the number of blocks matched. */
int kv_cache_match(struct kv_cache *c, const int32_t *tokens, int n_tokens, const uint8_t *salt,
                   int max_blocks, int32_t *out_blocks);

/* Phase 1 of an admission (see the DESIGN note): plans the prefix of tokens[0, n_tokens) in at
 * most max_blocks blocks. prefill_tok_s is the model's measured prefill speed (0 = unknown).
 * Takes no references, reads no payload, counts the decision. Without locate every tier block
 * counts as FAST. Stale disk speeds (older than a minute) count as unmeasured, so a slow moment
 * does not turn restoring off for good. */
void kv_cache_plan(struct kv_cache *c, const int32_t *tokens, int n_tokens, const uint8_t *salt,
                   int max_blocks, double prefill_tok_s, struct kv_cache_plan *p);
/* Phase 2 when p->n_slow > 0: queues the fetch of blocks [n_device, n_device + n_restore).
 * CAIRN_ERR_NOMEM (or no fetch thread): the caller goes on without it (the slow blocks are then
 * recomputed). The job belongs to the caller: kv_cache_fetch_done / _cancel / match_fetched. */
int kv_cache_fetch_start(struct kv_cache *c, const int32_t *tokens, const uint8_t *salt,
                         const struct kv_cache_plan *p, struct kv_fetch_job **out);
/* 1 when the job's reads are over. */
int kv_cache_fetch_done(struct kv_cache *c, struct kv_fetch_job *job);
/* Gives the job up (cancel, disconnect, shutdown); it is freed now or by the fetch thread. */
void kv_cache_fetch_cancel(struct kv_cache *c, struct kv_fetch_job *job);
/* Phase 3: as kv_cache_match, but reads no SLOW block on this thread: blocks come from the
 * device, from `job` (may be NULL; a done job, freed here), or from a FAST tier lookup. Without
 * locate it is kv_cache_match. Folds the job's disk speed into slow_read_bps. */
int kv_cache_match_fetched(struct kv_cache *c, const int32_t *tokens, int n_tokens,
                           const uint8_t *salt, int max_blocks, int32_t *out_blocks,
                           struct kv_fetch_job *job);
/* The fetch thread calls done(ctx) when a job finishes (the engine wakes its scheduler). Starts
 * the thread; call once after init when the tiers fill locate. No-op otherwise. */
int kv_cache_fetch_enable(struct kv_cache *c, kv_fetch_done_fn done, void *ctx,
                          struct cairn_err *err);

/* Hash of a published block (32 bytes), or NULL if the block is not published. */
const uint8_t *kv_cache_block_hash(const struct kv_cache *c, int block);
int kv_cache_refcount(const struct kv_cache *c, int block);
int kv_cache_is_published(const struct kv_cache *c, int block);

/* Snapshots (state_bytes > 0), in the pool's backend memory. attach copies `state` (a buffer in
 * that memory too, e.g. a sequence's state) into the block (allocating its buffer).
 * With a limit set, attaching past it first drops the snapshot of the least recently used CACHED
 * block that has one; if only USED blocks hold snapshots it returns CAIRN_ERR_LIMIT. Returns
 * CAIRN_ERR_NOMEM if the allocation fails. In both cases the block simply has no snapshot. */
int kv_cache_snapshot_attach(struct kv_cache *c, int block, const void *state);
/* At most n snapshots at once (n * state_bytes of CAIRN_MEM_STATE); 0 = no limit. */
void kv_cache_set_snapshot_limit(struct kv_cache *c, int n);
/* The block's snapshot (in the pool's backend memory), or NULL. */
const void *kv_cache_snapshot(const struct kv_cache *c, int block);

/* Evicts every CACHED block (calling tiers.on_evict). */
void kv_cache_clear(struct kv_cache *c);

static inline int kv_cache_n_free(const struct kv_cache *c) { return c->n_free; }
static inline int kv_cache_n_cached(const struct kv_cache *c) { return c->n_cached; }
static inline int kv_cache_n_used(const struct kv_cache *c) { return c->n_used; }
/* Blocks an alloc could produce right now (FREE + CACHED). */
static inline int kv_cache_n_available(const struct kv_cache *c) { return c->n_free + c->n_cached; }

#endif
