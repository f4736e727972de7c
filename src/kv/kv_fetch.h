/* Prefix fetches off the scheduler thread: one I/O thread per device cache that reads a
 * request's chain of blocks out of the lower tiers (kv_tier_ops.lookup) into host memory, so a
 * prefix hit on the SSD costs the running sequences nothing while the request waits.
 *
 * Flow (kv_cache.h owns the fetch; engine/sched.c drives it):
 *   admission: kv_cache_plan finds blocks on disk -> kv_cache_fetch_start -> a job queued here;
 *              the request waits in the engine's fetching list, the others keep stepping;
 *   I/O thread: reads the job's blocks in chain order (a miss ends it), then calls `done`;
 *   scheduler:  sees kv_fetch_done, puts the request back at the head of the queue, and
 *              kv_cache_match_fetched installs the blocks (upload through the pool, publish).
 * A cancelled request's job is freed by kv_fetch_cancel, at once when queued, else by the
 * thread when its read in flight returns; `done` is never called for it.
 *
 * Threads and locks: f->mu guards the queue, every job's `state` and `cancelled`, and stop. The
 * thread writes a job's results (blk, n_read, slow_*) without the lock while the job is
 * RUNNING; they are read by the scheduler only once kv_fetch_done said so (the lock orders
 * them). `done` runs with f->mu held: it may only take the engine's lock and signal (the engine
 * never calls into this file with its own lock held). */
#ifndef CAIRN_KV_KV_FETCH_H
#define CAIRN_KV_KV_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/kv_tier.h"
#include "kv/tier_int.h"

struct kv_fetch;

struct kv_fetch_job {
    /* set by kv_fetch_submit, read-only after */
    int n_blocks;               /* blocks asked for, in chain order */
    int block_size;             /* tokens per block */
    size_t block_bytes;         /* K (= V) bytes per block */
    size_t state_bytes;         /* snapshot size, 0 for pure attention */
    uint8_t (*hash)[32];        /* [n_blocks] chained block hashes */
    int32_t *tokens;            /* [n_blocks * block_size] their token ids */
    double recompute_block_s;   /* a block's recompute time (0: unknown). The plan restored
                                 * because it knew no faster way (often: the disk not measured
                                 * yet, right after a restart); once KV_FETCH_PROBE_BLOCKS disk
                                 * reads took longer than recomputing them, the job stops there
                                 * and the rest of the prefix is recomputed (cut_slow) */
    /* results, valid once kv_fetch_done returned 1 */
    struct kv_tier_block **blk; /* [n_blocks]; [0, n_read) filled, owned by the job */
    int n_read;                 /* leading blocks read (the first miss ends the chain) */
    uint64_t slow_bytes;        /* bytes of the blocks that locate called SLOW (disk reads) */
    double slow_s;              /* and the time their lookups took */
    int n_slow_read;            /* blocks among them */
    int cut_slow;               /* stopped because the disk was slower than recomputing */
    /* guarded by the fetch's mu */
    int state;                  /* private: queued, running, done */
    int cancelled;
    struct kv_fetch_job *next;  /* queue link */
};

/* Called on the I/O thread, with the fetch lock held, when a job is done. */
typedef void (*kv_fetch_done_fn)(void *ctx);

/* Starts the I/O thread. tiers.lookup must be thread-safe (kv_tier.h). Caller frees with
 * kv_fetch_close. */
int kv_fetch_open(const struct kv_tier_ops *tiers, kv_fetch_done_fn done, void *done_ctx,
                  struct kv_fetch **out, struct cairn_err *err);
/* Frees queued jobs, waits for the one in flight, stops the thread. NULL is fine. */
void kv_fetch_close(struct kv_fetch *f);
/* Copies the hashes and tokens into a new job and queues it. CAIRN_ERR_NOMEM on failure. */
int kv_fetch_submit(struct kv_fetch *f, const uint8_t (*hash)[32], const int32_t *tokens,
                    int n_blocks, int block_size, size_t block_bytes, size_t state_bytes,
                    double recompute_block_s, struct kv_fetch_job **out);
/* 1 when the job's reads are over (results readable), else 0. */
int kv_fetch_done(struct kv_fetch *f, struct kv_fetch_job *j);
/* Gives a job up at any point; j must not be used after. */
void kv_fetch_cancel(struct kv_fetch *f, struct kv_fetch_job *j);
/* Frees a job that is done (its blocks too). NULL is fine. */
void kv_fetch_job_free(struct kv_fetch_job *j);

#endif
