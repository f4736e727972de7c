/* The lower KV tiers: a hot RAM tier and an SSD tier under the device cache (kv_cache).
 *
 * kv_tiers_open builds both (either may be off) and kv_tiers_ops returns the struct kv_tier_ops
 * to put in engine_opts.tiers. Flow of a block:
 *   device evicts  -> on_evict  -> hot tier (dirty)   -- hot LRU eviction --> SSD write queue
 *   device publish -> on_publish -> (write-through only) SSD write queue at once
 *   device lookup  -> hot, then SSD; an SSD hit is copied into hot (clean)
 * Memory: with a pinner (opts.pin: a GPU backend) and a hot tier, full blocks live in slots of
 * large pinned slabs (kv/tier_slab.h) so hot hits upload at DMA speed; otherwise each block is
 * one cairn_mem_alloc. Either way under CAIRN_MEM_HOT.
 * Write-back is the default: a block reaches the SSD when the hot tier evicts it, is cleared or
 * closed (dirty blocks are flushed, never dropped). Write-through (opts.hot_write_through or env
 * CAIRN_HOT_CACHE_WRITE_THROUGH=1) also queues every newly published full block for the SSD.
 * With no hot tier, evicted blocks go straight to the SSD queue.
 *
 * SSD files: <ssd_dir>/<hash[0:2]>/<hash-hex>.safetensors, see kv/tier_file.h. They survive
 * restarts: open scans the folder (headers only) and rebuilds the index in LRU order (mtime).
 * Beside them, <ssd_dir>/speeds-<model>-<device>.json keeps the measured speeds for the next run
 * (kv_tier_ops.speeds_load/save, tier_speeds.c).
 *
 * Threads: on_evict, on_publish and locate run on the engine's scheduler thread and never block
 * on I/O (they copy and queue; a full queue drops the block and counts it). lookup reads a file
 * for a block that locate called SLOW (on disk): the device cache (kv_cache.h) calls it for such
 * blocks only on its fetch thread (kv_fetch.h), so the other sequences keep decoding; hot hits
 * and queued blocks (FAST) are copied on the scheduler thread. 1-4 writer threads write the
 * files. Stats and clear may be called from any thread. Locks: see tier_hot.c, tier_ssd_int.h.
 *
 * Wiring: cmd_serve parses --hot-cache-max-size, --hot-cache-write-through, --ssd-cache-dir and
 * --ssd-cache-max-size (kv_tiers_parse_ssd_size: "%" of the disk) into one kv_tiers_opts; the
 * model pool (api/pool.c, pool_do_load) opens one kv_tiers per model after model_load, with
 * the signature from model_info, the engine's kv_dtype/block_size and the backend's pinner, and
 * puts kv_tiers_ops in engine_opts.tiers. Shutdown: engine_destroy first (it may still call the
 * hooks, and its fetch thread holds blocks of the slab pool), then kv_tiers_close. /api/status
 * and /metrics read kv_tiers_stats; the admin "clear cache" calls engine_cache_clear (device ->
 * on_evict) and/or kv_tiers_clear. */
#ifndef CAIRN_KV_TIERS_H
#define CAIRN_KV_TIERS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/kv_tier.h"
#include "tensor/tensor.h"

/* What must match for an SSD file to be used: the model and the KV layout. */
struct kv_tier_signature {
    char arch[48];        /* model_info.model_type */
    int n_layers;         /* model_info.n_layers */
    int n_kv_layers;      /* attention layers (kv_pool.n_layers) */
    int n_kv_heads;
    int head_dim;
    enum dtype kv_dtype;  /* DTYPE_BF16, DTYPE_F16 or DTYPE_F32 */
    int block_size;       /* tokens per block */
    size_t state_bytes;   /* recurrent-state snapshot size; 0 for pure-attention models */
    uint8_t identity[32]; /* model_info.identity (weights) */
};

/* K (or V) bytes of one block under sig: n_kv_layers * block_size * n_kv_heads * head_dim. */
size_t kv_tier_signature_block_bytes(const struct kv_tier_signature *sig);

/* Page-locks host memory for fast device copies (issue 15). pin returns 0 when
 * [ptr, ptr + bytes) is now pinned, -1 when not (the memory stays usable, only slower to copy to
 * the device); unpin undoes one successful pin of ptr. Both run on any thread. api/pool.c fills
 * it from the model's backend (backend_ops.host_pin / host_unpin) where the backend has them. */
struct kv_tier_pinner {
    void *ctx;
    int (*pin)(void *ctx, void *ptr, size_t bytes);
    void (*unpin)(void *ctx, void *ptr);
};

struct kv_tiers_opts {
    struct kv_tier_signature sig;
    uint64_t hot_max_bytes;   /* hot tier RAM budget; 0 = no hot tier */
    int hot_write_through;    /* also on when env CAIRN_HOT_CACHE_WRITE_THROUGH=1 */
    const char *ssd_dir;      /* NULL or "" = no SSD tier; created if missing */
    uint64_t ssd_max_bytes;   /* 0 = default: min(10% of the free space of ssd_dir, 50 GiB) */
    int ssd_n_writers;        /* writer threads, 1..4; 0 = 1 */
    int ssd_queue_max_blocks; /* write queue bound; 0 = 256 */
    uint64_t ssd_queue_max_bytes; /* write queue bound in bytes; 0 = 256 MiB */
    struct kv_tier_pinner pin; /* all NULL: no pinning. With pin set and a hot tier, full blocks
                                * of the hot tier, its SSD promotes, its SSD queue and the device
                                * cache's fetches live in pinned slabs (kv/tier_slab.h); without,
                                * each block is its own cairn_mem_alloc (the CPU: nothing to
                                * gain from slabs there) */
};

enum kv_tier_which {
    KV_TIER_HOT = 1,
    KV_TIER_SSD = 2,
    KV_TIER_ALL = 3,
};

/* Counters of one tier (a snapshot; all zero for a tier that is off). */
struct kv_tier_stats {
    int enabled;
    uint64_t n_blocks;       /* blocks held (SSD: indexed files + queued writes) */
    uint64_t n_bytes;        /* bytes held (hot: RAM; SSD: file bytes incl. queued) */
    uint64_t max_bytes;      /* budget */
    uint64_t n_hits;
    uint64_t n_misses;
    uint64_t n_writes;       /* hot: blocks inserted; SSD: files written */
    uint64_t n_drops;        /* hot: evicted with nowhere to go; SSD: queue full or write error */
    uint64_t n_evictions;    /* LRU evictions to stay under budget */
    uint64_t n_damaged;      /* SSD: damaged/mismatching files found and removed */
    uint64_t n_foreign;      /* SSD: files of other models or unknown names, left alone */
    uint64_t n_queued;       /* SSD: blocks waiting for a writer */
    uint64_t n_queued_bytes; /* SSD: RAM held by the queue (counted in CAIRN_MEM_HOT) */
    uint64_t n_write_errors; /* SSD: failed writes (disk full, I/O) */
    uint64_t n_read_errors;  /* SSD: failed reads */
    uint64_t n_stale_tmp;    /* SSD: leftover temp files removed at open */
    double scan_s;           /* SSD: time the open scan took */
    uint64_t n_slab_bytes;   /* hot: RAM mapped in block slabs, free slots included (what
                              * CAIRN_MEM_HOT counts for them; n_bytes counts the blocks) */
    uint64_t n_pinned_bytes; /* hot: of them, page-locked for device copies */
};

struct kv_tiers_stats {
    int write_through;
    struct kv_tier_stats hot;
    struct kv_tier_stats ssd;
};

struct kv_tiers;

/* Opens the tiers. With ssd_dir set, scans it (may take a while for many files; see
 * scan_s). An unusable ssd_dir does not fail open: it is logged and the SSD tier turns every
 * write into a drop and every lookup into a miss. Fails only on bad options (INVALID) or out
 * of memory. Caller frees with kv_tiers_close. */
int kv_tiers_open(const struct kv_tiers_opts *opts, struct kv_tiers **out, struct cairn_err *err);
/* Flushes dirty hot blocks to the SSD, waits for the write queue to drain, stops the writers
 * and frees everything. NULL is fine. */
void kv_tiers_close(struct kv_tiers *t);
/* The hooks for engine_opts.tiers (ctx = t). Valid until kv_tiers_close; all NULL for NULL t. */
struct kv_tier_ops kv_tiers_ops(struct kv_tiers *t);
void kv_tiers_stats(struct kv_tiers *t, struct kv_tiers_stats *st);
/* KV_TIER_HOT: flushes dirty blocks to the SSD, then empties the hot tier. KV_TIER_SSD: drops
 * the queue and removes this model's files (hot blocks become dirty again). KV_TIER_ALL: both,
 * without the pointless flush. */
int kv_tiers_clear(struct kv_tiers *t, enum kv_tier_which which, struct cairn_err *err);
/* Waits until every queued SSD write is done (tests, shutdown). */
void kv_tiers_sync(struct kv_tiers *t);
/* Parses an SSD size: "50G", "123456", or "10%" (of the file system holding dir; dir may not
 * exist yet, its nearest existing parent is used). Returns 1 on success. */
int kv_tiers_parse_ssd_size(const char *s, const char *dir, uint64_t *out);
/* The default SSD budget for dir: min(10% of free space, 50 GiB). */
uint64_t kv_tiers_default_ssd_bytes(const char *dir);
/* The size of one pinned slab of a hot tier of hot_max_bytes (min(hot / 8, 256 MiB): the free
 * slots of one partly used slab plus the one cached empty slab are RAM beyond the hot budget,
 * at most two slabs, which the pool's memory guard reserves beside it). */
uint64_t kv_tiers_slab_bytes(uint64_t hot_max_bytes);

#endif
