/* Internals of the SSD tier, shared by its four files:
 *   tier_ssd.c        the index (map, LRU, byte budget, eviction), open / close / clear / stats;
 *   tier_ssd_write.c  the write queue and its writer threads;
 *   tier_ssd_read.c   lookups: reading and verifying one block file;
 *   tier_ssd_scan.c   recovery at open: the folder scan that rebuilds the index.
 *
 * DESIGN
 * - Index: a hash map (kv_tier_map, LRU list oldest first) of ssd_entry, one per block file of
 *   this model or per queued write. Bytes count file sizes (queued: an estimate until written).
 * - Queue: a FIFO of ssd_job, each owning a block copy. The entry of a queued or in-flight
 *   block points at the job's block (entry->pending) so lookups copy from memory until the file
 *   is on disk. A writer pops a job, writes the file without the lock (temp, fsync, rename, fsync
 *   dir), then under the lock clears entry->pending (or removes the file again if the entry was
 *   cleared meanwhile) and evicts LRU files over budget; unlinks happen after unlocking.
 * - Lookups of on-disk blocks read without the lock and verify everything (tier_file.h);
 *   damaged files are removed from index and disk.
 * Locks: s->mu guards the map and every entry, the queue, bytes, counters, paused and stop.
 *   cond_work: queue became non-empty or stop; cond_space: queue room; cond_idle: queue empty
 *   and nothing in flight. No other lock is taken while s->mu is held. */
#ifndef CAIRN_KV_TIER_SSD_INT_H
#define CAIRN_KV_TIER_SSD_INT_H

#include <pthread.h>
#include <stdint.h>

#include "kv/tier_file.h"
#include "kv/tier_ssd.h"

#define SSD_PATH_MAX 4096
#define SSD_MAX_WRITERS 4

struct ssd_entry {
    struct kv_tier_link link;     /* first: key = block hash */
    uint64_t file_bytes;
    struct kv_tier_block *pending; /* queued or being written (owned by the job); NULL on disk */
};

struct ssd_job {
    struct kv_tier_block *blk;    /* owned */
    struct ssd_job *next;
};

struct kv_ssd {
    struct kv_tier_signature sig;
    char sig_hex[65];
    char dir[SSD_PATH_MAX];
    uint64_t max_bytes;
    int queue_max_blocks;
    uint64_t queue_max_bytes;
    struct kv_tier_slabs *slabs;  /* kv_ssd_opts.slabs (not owned) */
    pthread_t writers[SSD_MAX_WRITERS];
    int n_writers;

    pthread_mutex_t mu;
    pthread_cond_t cond_work, cond_space, cond_idle;
    struct kv_tier_map map;       /* guarded by mu */
    uint64_t bytes;               /* guarded by mu */
    struct ssd_job *q_head, *q_tail; /* guarded by mu */
    int q_n;                      /* queued jobs, guarded by mu */
    uint64_t q_bytes;             /* queued + in-flight block bytes, guarded by mu */
    int n_inflight;               /* guarded by mu */
    int stop;                     /* guarded by mu */
    int paused;                   /* guarded by mu: tests hold the writers */
    struct kv_tier_stats st;      /* counters, guarded by mu */
    int read_delay_ms;            /* tests: env CAIRN_TEST_SSD_READ_DELAY_MS at open; each disk
                                     read first sleeps this long (0 = off: every normal run) */
    uint64_t n_errors_logged;     /* guarded by mu: rate-limits error lines */
    uint8_t subdir_ok[256];       /* atomic flags: <dir>/<xx> exists */
};

enum ssd_read_result {
    SSD_READ_OK = 0,
    SSD_READ_DAMAGED,  /* remove the file */
    SSD_READ_FOREIGN,  /* another model's file: forget it, leave it */
    SSD_READ_GONE,     /* vanished or unreadable: forget it */
    SSD_READ_NOMEM,
};

/* Hashes collected under the lock, unlinked after. */
struct ssd_victims {
    uint8_t (*hash)[32];
    size_t n, cap;
};

/* tier_ssd.c: paths, logging, victims, index and eviction. */
/* <dir>/<hash[0:2]>/<hash-hex>.safetensors into out[n] (empty on overflow, which open rules out). */
void kv_ssd_path(const struct kv_ssd *s, const uint8_t hash[32], char *out, size_t n);
/* Logs the first 10 errors, then every 1000th. Call with mu held. */
int kv_ssd_should_log_locked(struct kv_ssd *s);
void kv_ssd_unlink_hash(const struct kv_ssd *s, const uint8_t hash[32]);
void kv_ssd_victims_add(struct ssd_victims *v, const uint8_t hash[32]);
/* Unlinks the collected files (call without mu) and frees the list. */
void kv_ssd_victims_unlink(const struct kv_ssd *s, struct ssd_victims *v);
/* Drops e from the index and the byte count, frees it. Call with mu held. */
void kv_ssd_entry_remove_locked(struct kv_ssd *s, struct ssd_entry *e);
/* Evicts least recently used on-disk files until under budget into v. Call with mu held. */
void kv_ssd_evict_locked(struct kv_ssd *s, struct ssd_victims *v);

/* tier_ssd_write.c */
/* xxh3 of K | V | state, the file's payload checksum. */
uint64_t kv_ssd_checksum(const void *k, const void *v, size_t block_bytes, const void *state,
                         size_t state_bytes);
/* A writer thread's body (arg = the tier): pops jobs until stop and the queue is drained. */
void *kv_ssd_writer_main(void *arg);

/* tier_ssd_read.c */
/* Reads and parses the header of an open file. On success the caller frees h. */
int kv_ssd_read_header(int fd, struct kv_tier_header *h, struct cairn_err *err);
/* Checks a parsed header against this tier's model and the file's name: enum ssd_read_result. */
int kv_ssd_check_header(const struct kv_ssd *s, const struct kv_tier_header *h,
                        const uint8_t hash[32], uint64_t file_size, const char **why);

/* tier_ssd_scan.c */
/* Scans the folder at open (before the writers start) and indexes this model's files, oldest
 * first; removes damaged files and stale temp files. CAIRN_ERR_NOMEM is the only failure. */
int kv_ssd_scan(struct kv_ssd *s);

#endif
