/* SSD tier. DESIGN:
 * - Index: a hash map (kv_tier_map, LRU list oldest first) of ssd_entry, one per block file of
 *   this model or per queued write. Bytes count file sizes (queued: an estimate until written).
 * - Queue: a FIFO of ssd_job, each owning a block copy. The entry of a queued or in-flight
 *   block points at the job's block (entry->pending) so lookups copy from memory until the file
 *   is on disk. A writer pops a job, writes the file without the lock (temp, fsync, rename, fsync
 *   dir), then under the lock clears entry->pending (or removes the file again if the entry was
 *   cleared meanwhile) and evicts LRU files over budget; unlinks happen after unlocking.
 * - Lookups of on-disk blocks read without the lock and verify everything (tier_file.h);
 *   damaged files are removed from index and disk.
 * Locks: s->mu guards the map and every entry, the queue, bytes, counters, gen and stop.
 *   cond_work: queue became non-empty or stop; cond_space: queue room; cond_idle: queue empty
 *   and nothing in flight. No other lock is taken while s->mu is held. */
#include "kv/tier_ssd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "kv/tier_file.h"

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
    uint64_t n_errors_logged;     /* guarded by mu: rate-limits error lines */
    uint8_t subdir_ok[256];       /* atomic flags: <dir>/<xx> exists */
};

/* ---- paths and small helpers ---- */

static void ssd_path(const struct kv_ssd *s, const uint8_t hash[32], char *out, size_t n)
{
    char hex[65];
    cairn_hex(hash, 32, hex);
    /* s->dir is at most SSD_PATH_MAX - 128 long (checked at open): this always fits */
    int r = snprintf(out, n, "%s/%.2s/%s.safetensors", s->dir, hex, hex);
    if (r < 0 || (size_t)r >= n) out[0] = 0;
}

/* Logs the first 10 errors, then every 1000th (a full disk must not flood the log). Call with
 * mu held. */
static int ssd_should_log_locked(struct kv_ssd *s)
{
    uint64_t n = s->n_errors_logged++;
    return n < 10 || n % 1000 == 0;
}

static void ssd_unlink_hash(const struct kv_ssd *s, const uint8_t hash[32])
{
    char path[SSD_PATH_MAX];
    ssd_path(s, hash, path, sizeof(path));
    unlink(path);
}

/* Hashes collected under the lock, unlinked after. */
struct ssd_victims {
    uint8_t (*hash)[32];
    size_t n, cap;
};

static void ssd_victims_add(struct ssd_victims *v, const uint8_t hash[32])
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        uint8_t(*nh)[32] = realloc(v->hash, cap * 32);
        if (!nh) return; /* the file stays on disk, unindexed, until the next restart's scan */
        v->hash = nh;
        v->cap = cap;
    }
    memcpy(v->hash[v->n++], hash, 32);
}

static void ssd_victims_unlink(const struct kv_ssd *s, struct ssd_victims *v)
{
    for (size_t i = 0; i < v->n; i++) ssd_unlink_hash(s, v->hash[i]);
    free(v->hash);
    memset(v, 0, sizeof(*v));
}

static void ssd_entry_remove_locked(struct kv_ssd *s, struct ssd_entry *e)
{
    kv_tier_map_remove(&s->map, &e->link);
    s->bytes -= e->file_bytes;
    free(e);
}

/* Evicts least recently used on-disk files until under budget. Call with mu held. */
static void ssd_evict_locked(struct kv_ssd *s, struct ssd_victims *v)
{
    struct kv_tier_link *l = s->map.lru_head;
    while (s->bytes > s->max_bytes && l) {
        struct ssd_entry *e = (struct ssd_entry *)l;
        l = l->lru_next;
        if (e->pending) continue; /* not on disk yet */
        ssd_victims_add(v, e->link.key);
        ssd_entry_remove_locked(s, e);
        s->st.n_evictions++;
    }
}

/* ---- writing ---- */

/* xxh3 of the data section K | V | state, streamed (same value as cairn_xxh3 over the bytes
 * laid end to end). */
static uint64_t ssd_checksum(const void *k, const void *v, size_t block_bytes, const void *state,
                             size_t state_bytes)
{
    XXH3_state_t *x = XXH3_createState();
    if (!x) { /* fall back to one contiguous buffer */
        size_t n = 2 * block_bytes + state_bytes;
        uint8_t *tmp = malloc(n ? n : 1);
        if (!tmp) return 0;
        memcpy(tmp, k, block_bytes);
        memcpy(tmp + block_bytes, v, block_bytes);
        if (state_bytes) memcpy(tmp + 2 * block_bytes, state, state_bytes);
        uint64_t h = cairn_xxh3(tmp, n);
        free(tmp);
        return h;
    }
    XXH3_64bits_reset(x);
    XXH3_64bits_update(x, k, block_bytes);
    XXH3_64bits_update(x, v, block_bytes);
    if (state_bytes) XXH3_64bits_update(x, state, state_bytes);
    uint64_t h = XXH3_64bits_digest(x);
    XXH3_freeState(x);
    return h;
}

static uint64_t ssd_data_checksum(const struct kv_tier_block *b)
{
    return ssd_checksum(b->k, b->v, b->block_bytes, b->has_state ? b->state : NULL,
                        b->has_state ? b->state_bytes : 0);
}

/* Writes one block file. Returns CAIRN_OK and the file size, or an error (logged by caller). */
static int ssd_write_block(struct kv_ssd *s, const struct kv_tier_block *b, uint64_t *file_bytes,
                           struct cairn_err *err)
{
    char *hdr = NULL;
    size_t hdr_len = 0;
    int rc = kv_tier_header_build(&s->sig, s->sig_hex, b, ssd_data_checksum(b), &hdr, &hdr_len,
                                  err);
    if (rc != CAIRN_OK) return rc;
    char path[SSD_PATH_MAX];
    ssd_path(s, b->hash, path, sizeof(path));
    if (!__atomic_load_n(&s->subdir_ok[b->hash[0]], __ATOMIC_RELAXED)) {
        char sub[SSD_PATH_MAX + 8];
        snprintf(sub, sizeof(sub), "%s/%02x", s->dir, (unsigned)b->hash[0]);
        if (mkdir(sub, 0755) != 0 && errno != EEXIST) {
            rc = cairn_err_set(err, CAIRN_ERR_IO, "mkdir %s: %s", sub, strerror(errno));
            goto cleanup;
        }
        __atomic_store_n(&s->subdir_ok[b->hash[0]], 1, __ATOMIC_RELAXED);
    }
    const void *parts[4] = {hdr, b->k, b->v, b->state};
    size_t sizes[4] = {hdr_len, b->block_bytes, b->block_bytes, b->state_bytes};
    rc = cairn_file_write_atomic_iov(path, parts, sizes, b->has_state ? 4 : 3, err);
    if (rc == CAIRN_OK) {
        *file_bytes = hdr_len + 2 * b->block_bytes + b->state_bytes;
    } else if (errno == ENOENT) {
        /* Someone removed the subfolder: recreate it next time. */
        __atomic_store_n(&s->subdir_ok[b->hash[0]], 0, __ATOMIC_RELAXED);
    }
cleanup:
    free(hdr);
    return rc;
}

static void *ssd_writer_main(void *arg)
{
    struct kv_ssd *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while ((!s->q_head || s->paused) && !s->stop) pthread_cond_wait(&s->cond_work, &s->mu);
        if (!s->q_head) break; /* stop, and drained */
        struct ssd_job *job = s->q_head;
        s->q_head = job->next;
        if (!s->q_head) s->q_tail = NULL;
        s->q_n--;
        s->n_inflight++;
        pthread_cond_broadcast(&s->cond_space);
        pthread_mutex_unlock(&s->mu);

        struct cairn_err err = {0};
        uint64_t file_bytes = 0;
        int rc = ssd_write_block(s, job->blk, &file_bytes, &err);

        struct ssd_victims v = {0};
        int unlink_it = 0;
        pthread_mutex_lock(&s->mu);
        s->n_inflight--;
        s->q_bytes -= job->blk->alloc_bytes;
        struct ssd_entry *e = (struct ssd_entry *)kv_tier_map_find(&s->map, job->blk->hash);
        int ours = e && e->pending == job->blk;
        if (rc == CAIRN_OK) {
            if (ours) {
                e->pending = NULL;
                s->bytes = s->bytes - e->file_bytes + file_bytes;
                e->file_bytes = file_bytes;
                s->st.n_writes++;
            } else {
                unlink_it = 1; /* cleared while in flight */
            }
        } else {
            s->st.n_write_errors++;
            s->st.n_drops++;
            if (ours) ssd_entry_remove_locked(s, e);
            if (ssd_should_log_locked(s))
                LOG_WARN("kv", "ssd tier: write failed, block dropped: %s", err.msg);
        }
        ssd_evict_locked(s, &v);
        if (!s->q_head && s->n_inflight == 0) pthread_cond_broadcast(&s->cond_idle);
        pthread_mutex_unlock(&s->mu);

        if (unlink_it) ssd_unlink_hash(s, job->blk->hash);
        ssd_victims_unlink(s, &v);
        kv_tier_block_free(job->blk);
        free(job);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void kv_ssd_enqueue(struct kv_ssd *s, struct kv_tier_block *b, int blocking)
{
    struct ssd_job *job = malloc(sizeof(*job));
    struct ssd_entry *e = calloc(1, sizeof(*e));
    /* The header's length does not depend on the checksum: build it once now for the exact
     * file size, so the budget is right while the block waits. */
    uint64_t file_bytes = 2 * b->block_bytes + b->state_bytes + 1024 + (uint64_t)b->n_tokens * 12;
    char *hdr = NULL;
    size_t hdr_len = 0;
    if (kv_tier_header_build(&s->sig, s->sig_hex, b, 0, &hdr, &hdr_len, NULL) == CAIRN_OK)
        file_bytes = hdr_len + 2 * b->block_bytes + b->state_bytes;
    free(hdr);
    pthread_mutex_lock(&s->mu);
    struct kv_tier_link *have = kv_tier_map_find(&s->map, b->hash);
    if (have) {
        kv_tier_map_touch(&s->map, have);
        goto free_all;
    }
    if (!job || !e) {
        s->st.n_drops++;
        goto free_all;
    }
    while (blocking && !s->stop &&
           (s->q_n >= s->queue_max_blocks || s->q_bytes + b->alloc_bytes > s->queue_max_bytes) &&
           (s->q_n > 0 || s->n_inflight > 0))
        pthread_cond_wait(&s->cond_space, &s->mu);
    int busy = s->q_n > 0 || s->n_inflight > 0;
    int full = s->q_n >= s->queue_max_blocks || s->q_bytes + b->alloc_bytes > s->queue_max_bytes;
    if (s->stop || (busy && full)) {
        s->st.n_drops++;
        goto free_all;
    }
    /* A lookup may have indexed it while we waited. */
    if (kv_tier_map_find(&s->map, b->hash)) goto free_all;
    memcpy(e->link.key, b->hash, 32);
    e->pending = b;
    e->file_bytes = file_bytes;
    if (kv_tier_map_insert(&s->map, &e->link) != 0) {
        s->st.n_drops++;
        goto free_all;
    }
    s->bytes += e->file_bytes;
    job->blk = b;
    job->next = NULL;
    if (s->q_tail)
        s->q_tail->next = job;
    else
        s->q_head = job;
    s->q_tail = job;
    s->q_n++;
    s->q_bytes += b->alloc_bytes;
    pthread_cond_signal(&s->cond_work);
    pthread_mutex_unlock(&s->mu);
    return;
free_all:
    pthread_mutex_unlock(&s->mu);
    free(job);
    free(e);
    kv_tier_block_free(b);
}

int kv_ssd_has(struct kv_ssd *s, const uint8_t hash[32])
{
    pthread_mutex_lock(&s->mu);
    struct kv_tier_link *l = kv_tier_map_find(&s->map, hash);
    if (l) kv_tier_map_touch(&s->map, l);
    pthread_mutex_unlock(&s->mu);
    return l != NULL;
}

/* ---- reading ---- */

enum ssd_read_result {
    SSD_READ_OK = 0,
    SSD_READ_DAMAGED,  /* remove the file */
    SSD_READ_FOREIGN,  /* another model's file: forget it, leave it */
    SSD_READ_GONE,     /* vanished or unreadable: forget it */
    SSD_READ_NOMEM,
};

static int ssd_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Reads and parses the header of an open file. On success the caller frees h. */
static int ssd_read_header(int fd, struct kv_tier_header *h, struct cairn_err *err)
{
    uint8_t first[4096];
    ssize_t got;
    do got = pread(fd, first, sizeof(first), 0);
    while (got < 0 && errno == EINTR);
    if (got < 0) return cairn_err_set(err, CAIRN_ERR_IO, "read: %s", strerror(errno));
    uint64_t size;
    if (kv_tier_header_size(first, (size_t)got, &size) != CAIRN_OK)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "bad header length");
    if (size <= (uint64_t)got) return kv_tier_header_parse(first, (size_t)got, h, err);
    uint8_t *big = malloc(size);
    if (!big) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    int rc = ssd_pread_full(fd, big, size, 0) == 0
                 ? kv_tier_header_parse(big, size, h, err)
                 : cairn_err_set(err, CAIRN_ERR_FORMAT, "header truncated");
    free(big);
    return rc;
}

/* Checks a parsed header against this tier's model and the file's name. */
static int ssd_check_header(const struct kv_ssd *s, const struct kv_tier_header *h,
                            const uint8_t hash[32], uint64_t file_size, const char **why)
{
    if (h->version != KV_TIER_FILE_VERSION || strcmp(h->signature, s->sig_hex) != 0) {
        *why = "other model or format version";
        return SSD_READ_FOREIGN;
    }
    *why = "hash differs from file name";
    if (memcmp(h->hash, hash, 32) != 0) return SSD_READ_DAMAGED;
    *why = "KV layout differs from the signature";
    const struct kv_tier_signature *g = &s->sig;
    if (h->kv_dtype != g->kv_dtype || h->kv_shape[0] != g->n_kv_layers ||
        h->kv_shape[1] != g->block_size || h->kv_shape[2] != g->n_kv_heads ||
        h->kv_shape[3] != g->head_dim || h->kv_bytes != kv_tier_signature_block_bytes(g) ||
        h->n_tokens != g->block_size || (h->has_state && h->state_bytes != g->state_bytes))
        return SSD_READ_DAMAGED;
    *why = "file size differs from the header (truncated?)";
    if (file_size != h->data_offset + h->data_bytes) return SSD_READ_DAMAGED;
    return SSD_READ_OK;
}

/* Where a read lands: the caller's buffers (no hot tier to promote into) or a new block. */
struct ssd_dest {
    void *k, *v;          /* block_bytes each */
    void *state;          /* the caller's state buffer or NULL */
    size_t state_bytes;   /* its size */
    int *has_state;
    struct kv_tier_block *blk; /* out, when reading into a new block (promote) */
};

static int ssd_preadv_full(int fd, struct iovec *iov, int n_iov, uint64_t off, size_t want)
{
    size_t got = 0;
    while (got < want) {
        ssize_t r = preadv(fd, iov, n_iov, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
        off += (uint64_t)r;
        size_t adv = (size_t)r; /* advance the iovecs past what was read */
        int i = 0;
        while (i < n_iov && adv >= iov[i].iov_len) adv -= iov[i++].iov_len;
        memmove(iov, iov + i, (size_t)(n_iov - i) * sizeof(iov[0]));
        n_iov -= i;
        if (n_iov) {
            iov[0].iov_base = (uint8_t *)iov[0].iov_base + adv;
            iov[0].iov_len -= adv;
        }
    }
    return got == want ? 0 : -1;
}

/* Reads and verifies one block file completely into d. A caller's state buffer of the wrong
 * size is a plain miss (SSD_READ_NOMEM: nothing wrong with the file). */
static int ssd_read_block(struct kv_ssd *s, const uint8_t hash[32], const int32_t *tokens,
                          int n_tokens, size_t block_bytes, int promote, struct ssd_dest *d,
                          const char **why)
{
    d->blk = NULL;
    char path[SSD_PATH_MAX];
    ssd_path(s, hash, path, sizeof(path));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *why = strerror(errno);
    if (fd < 0) return SSD_READ_GONE;
    struct kv_tier_header h;
    struct cairn_err err = {0};
    struct stat st;
    int res = SSD_READ_DAMAGED;
    uint8_t *scratch = NULL;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return SSD_READ_GONE;
    }
    int rc = ssd_read_header(fd, &h, &err);
    if (rc != CAIRN_OK) {
        close(fd);
        *why = rc == CAIRN_ERR_IO ? "read error" : "bad header";
        return rc == CAIRN_ERR_IO ? SSD_READ_GONE
                                  : rc == CAIRN_ERR_NOMEM ? SSD_READ_NOMEM : SSD_READ_DAMAGED;
    }
    res = ssd_check_header(s, &h, hash, (uint64_t)st.st_size, why);
    if (res != SSD_READ_OK) goto cleanup;
    res = SSD_READ_DAMAGED;
    *why = "token ids or count differ";
    if (h.n_tokens != n_tokens || h.kv_bytes != block_bytes ||
        memcmp(h.tokens, tokens, (size_t)n_tokens * sizeof(int32_t)) != 0)
        goto cleanup;
    void *k, *v, *stp = NULL;
    if (promote) {
        d->blk = kv_tier_block_new(n_tokens, block_bytes, h.state_bytes);
        if (!d->blk) {
            res = SSD_READ_NOMEM;
            goto cleanup;
        }
        memcpy(d->blk->hash, h.hash, 32);
        memcpy(d->blk->parent, h.parent, 32);
        memcpy(d->blk->tokens, h.tokens, (size_t)n_tokens * sizeof(int32_t));
        k = d->blk->k;
        v = d->blk->v;
        stp = d->blk->state;
    } else {
        if (h.has_state && d->state && d->state_bytes != h.state_bytes) {
            res = SSD_READ_NOMEM;
            *why = "state size differs";
            goto cleanup;
        }
        k = d->k;
        v = d->v;
        if (h.has_state) {
            /* the snapshot is part of the checksum even when the caller does not want it */
            stp = d->state ? d->state : (scratch = malloc(h.state_bytes));
            if (!stp) {
                res = SSD_READ_NOMEM;
                goto cleanup;
            }
        }
    }
    /* one large sequential read: let the kernel read ahead the whole data section */
    posix_fadvise(fd, (off_t)h.data_offset, (off_t)(2 * block_bytes + h.state_bytes),
                  POSIX_FADV_WILLNEED);
    struct iovec iov[3] = {{k, block_bytes}, {v, block_bytes}, {stp, h.state_bytes}};
    *why = "short read";
    if (ssd_preadv_full(fd, iov, h.has_state ? 3 : 2, h.data_offset,
                        2 * block_bytes + h.state_bytes) != 0)
        goto cleanup;
    *why = "payload checksum mismatch";
    if (ssd_checksum(k, v, block_bytes, stp, h.state_bytes) != h.checksum) goto cleanup;
    futimens(fd, NULL); /* recency survives restarts (LRU by mtime) */
    if (promote) {
        if (!kv_tier_block_copy_out(d->blk, tokens, n_tokens, d->k, d->v, block_bytes, d->state,
                                    d->state_bytes, d->has_state)) {
            res = SSD_READ_NOMEM;
            *why = "state size differs";
            goto cleanup;
        }
    } else if (d->has_state) {
        *d->has_state = h.has_state && d->state != NULL;
    }
    res = SSD_READ_OK;
cleanup:
    if (res != SSD_READ_OK) {
        kv_tier_block_free(d->blk);
        d->blk = NULL;
    }
    free(scratch);
    kv_tier_header_free(&h);
    close(fd);
    return res;
}

int kv_ssd_lookup(struct kv_ssd *s, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                  void *k, void *v, size_t block_bytes, void *state, size_t state_bytes,
                  int *has_state, struct kv_tier_block **promote)
{
    if (promote) *promote = NULL;
    pthread_mutex_lock(&s->mu);
    struct ssd_entry *e = (struct ssd_entry *)kv_tier_map_find(&s->map, hash);
    if (!e) {
        s->st.n_misses++;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    kv_tier_map_touch(&s->map, &e->link);
    if (e->pending) {
        int hit = kv_tier_block_copy_out(e->pending, tokens, n_tokens, k, v, block_bytes, state,
                                         state_bytes, has_state);
        if (hit)
            s->st.n_hits++;
        else
            s->st.n_misses++;
        pthread_mutex_unlock(&s->mu);
        return hit;
    }
    pthread_mutex_unlock(&s->mu);

    const char *why = "";
    struct ssd_dest d = {.k = k, .v = v, .state = state, .state_bytes = state_bytes,
                         .has_state = has_state};
    int res = ssd_read_block(s, hash, tokens, n_tokens, block_bytes, promote != NULL, &d, &why);
    int hit = res == SSD_READ_OK;
    int unlink_it = 0;
    pthread_mutex_lock(&s->mu);
    if (hit) {
        s->st.n_hits++;
    } else {
        s->st.n_misses++;
        e = (struct ssd_entry *)kv_tier_map_find(&s->map, hash);
        if (res != SSD_READ_NOMEM && e && !e->pending) {
            if (res == SSD_READ_DAMAGED) {
                s->st.n_damaged++;
                unlink_it = 1;
            } else if (res == SSD_READ_FOREIGN) {
                s->st.n_foreign++;
            } else {
                s->st.n_read_errors++;
            }
            if (ssd_should_log_locked(s)) {
                char hex[65];
                cairn_hex(hash, 32, hex);
                LOG_WARN("kv", "ssd tier: block %s unusable (%s)%s", hex, why,
                         unlink_it ? ", removed" : "");
            }
            ssd_entry_remove_locked(s, e);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (unlink_it) ssd_unlink_hash(s, hash);
    if (promote) *promote = d.blk; /* NULL unless hit */
    return hit;
}

/* ---- open: scan ---- */

struct ssd_found {
    uint8_t hash[32];
    uint64_t mtime_ns;
    uint64_t size;
};

/* One scan thread's findings and counters (merged into s->st after the threads join). */
struct ssd_scan {
    struct kv_ssd *s;
    int top;                 /* fd of the cache folder */
    char (*subs)[3];         /* the <xx> subfolders to scan */
    int n_subs, i_first, stride;
    struct ssd_found *v;
    size_t n, cap;
    uint64_t n_foreign, n_damaged, n_stale_tmp;
};

static int ssd_found_cmp(const void *a, const void *b)
{
    const struct ssd_found *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return memcmp(x->hash, y->hash, 32);
}

/* "<64 hex>.safetensors.tmp.<pid>.<n>": a temp file of cairn_file_write_atomic. Returns its
 * pid, or 0 if the name is not one. */
static long ssd_tmp_pid(const char *name)
{
    const char *t = strstr(name, ".safetensors.tmp.");
    if (!t) return 0;
    char *end;
    long pid = strtol(t + 17, &end, 10);
    return (pid > 0 && *end == '.') ? pid : 0;
}

static void ssd_scan_file(struct kv_ssd *s, int dfd, const char *sub, const char *name,
                          struct ssd_scan *sc)
{
    uint8_t hash[32];
    if (!kv_tier_file_name_hash(name, hash)) {
        long pid = ssd_tmp_pid(name);
        /* A temp file whose writer is gone is a write that never finished. */
        if (pid && (pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))) {
            if (unlinkat(dfd, name, 0) == 0) sc->n_stale_tmp++;
        } else {
            sc->n_foreign++;
        }
        return;
    }
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    struct kv_tier_header h;
    struct cairn_err err = {0};
    const char *why = "bad header";
    int res = SSD_READ_DAMAGED;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        sc->n_foreign++;
        return;
    }
    int rc = ssd_read_header(fd, &h, &err);
    close(fd);
    if (rc == CAIRN_OK) {
        res = ssd_check_header(s, &h, hash, (uint64_t)st.st_size, &why);
        kv_tier_header_free(&h);
        char hex[3];
        snprintf(hex, sizeof(hex), "%02x", hash[0]);
        if (res == SSD_READ_OK && strcmp(hex, sub) != 0) {
            res = SSD_READ_DAMAGED;
            why = "in the wrong folder";
        }
    } else if (rc == CAIRN_ERR_IO || rc == CAIRN_ERR_NOMEM) {
        return; /* unreadable now: leave it, do not index it */
    }
    if (res == SSD_READ_FOREIGN) {
        sc->n_foreign++;
        return;
    }
    if (res == SSD_READ_DAMAGED) {
        sc->n_damaged++;
        if (sc->n_damaged <= 10)
            LOG_WARN("kv", "ssd tier: %s/%s/%s: %s, removed", s->dir, sub, name, why);
        unlinkat(dfd, name, 0);
        return;
    }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 1024;
        struct ssd_found *nv = realloc(sc->v, cap * sizeof(*nv));
        if (!nv) return;
        sc->v = nv;
        sc->cap = cap;
    }
    struct ssd_found *f = &sc->v[sc->n++];
    memcpy(f->hash, hash, 32);
    f->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    f->size = (uint64_t)st.st_size;
}

static void ssd_scan_subdir(struct kv_ssd *s, int top, const char *sub, struct ssd_scan *sc)
{
    int dfd = openat(top, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    __atomic_store_n(&s->subdir_ok[strtol(sub, NULL, 16) & 255], 1, __ATOMIC_RELAXED);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        ssd_scan_file(s, dirfd(d), sub, de->d_name, sc);
    }
    closedir(d);
}

static int ssd_is_subdir_name(const char *n)
{
    for (int i = 0; i < 2; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return 0;
    return n[2] == 0;
}

static void *ssd_scan_main(void *arg)
{
    struct ssd_scan *sc = arg;
    for (int i = sc->i_first; i < sc->n_subs; i += sc->stride)
        ssd_scan_subdir(sc->s, sc->top, sc->subs[i], sc);
    return NULL;
}

#define SSD_SCAN_THREADS 8 /* the scan waits on file metadata and headers: overlap the I/O */

static int ssd_scan(struct kv_ssd *s)
{
    double t0 = cairn_now();
    int top = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (top < 0) return CAIRN_OK; /* logged by the caller's mkdir; nothing to index */
    int top2 = dup(top);          /* readdir's fd; `top` stays for openat */
    DIR *d = top2 >= 0 ? fdopendir(top2) : NULL;
    if (!d) {
        if (top2 >= 0) close(top2);
        close(top);
        return CAIRN_OK;
    }
    char subs[256][3];
    int n_subs = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2]))) continue;
        if (ssd_is_subdir_name(n) && n_subs < 256)
            memcpy(subs[n_subs++], n, 3);
        else
            s->st.n_foreign++;
    }
    closedir(d);
    struct ssd_scan sc[SSD_SCAN_THREADS];
    pthread_t th[SSD_SCAN_THREADS];
    int started[SSD_SCAN_THREADS] = {0};
    int n_threads = n_subs < SSD_SCAN_THREADS ? (n_subs ? n_subs : 1) : SSD_SCAN_THREADS;
    memset(sc, 0, sizeof(sc));
    for (int i = 0; i < n_threads; i++) {
        sc[i] = (struct ssd_scan){.s = s, .top = top, .subs = subs, .n_subs = n_subs,
                                  .i_first = i, .stride = n_threads};
        if (i > 0) started[i] = pthread_create(&th[i], NULL, ssd_scan_main, &sc[i]) == 0;
    }
    ssd_scan_main(&sc[0]);
    for (int i = 1; i < n_threads; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            ssd_scan_main(&sc[i]); /* no thread: do its share here */
    }
    close(top);
    /* merge */
    size_t total = 0;
    for (int i = 0; i < n_threads; i++) total += sc[i].n;
    struct ssd_found *all = malloc((total ? total : 1) * sizeof(*all));
    int rc = all ? CAIRN_OK : CAIRN_ERR_NOMEM;
    size_t k = 0;
    for (int i = 0; i < n_threads; i++) {
        if (all && sc[i].n) memcpy(all + k, sc[i].v, sc[i].n * sizeof(*all));
        k += sc[i].n;
        free(sc[i].v);
        s->st.n_foreign += sc[i].n_foreign;
        s->st.n_damaged += sc[i].n_damaged;
        s->st.n_stale_tmp += sc[i].n_stale_tmp;
    }
    if (all && total) qsort(all, total, sizeof(*all), ssd_found_cmp);
    for (size_t i = 0; all && i < total; i++) {
        struct ssd_entry *e = calloc(1, sizeof(*e));
        if (!e) {
            rc = CAIRN_ERR_NOMEM;
            break;
        }
        memcpy(e->link.key, all[i].hash, 32);
        e->file_bytes = all[i].size;
        if (kv_tier_map_insert(&s->map, &e->link) != 0) {
            free(e);
            rc = CAIRN_ERR_NOMEM;
            break;
        }
        s->bytes += e->file_bytes;
    }
    free(all);
    struct ssd_victims v = {0};
    ssd_evict_locked(s, &v); /* the budget may have shrunk since the last run */
    ssd_victims_unlink(s, &v);
    s->st.scan_s = cairn_now() - t0;
    return rc;
}

/* ---- open / close ---- */

int kv_ssd_open(const struct kv_ssd_opts *o, struct kv_ssd **out, struct cairn_err *err)
{
    *out = NULL;
    if (!o->dir || !*o->dir || o->max_bytes == 0 || o->n_writers < 1 ||
        o->n_writers > SSD_MAX_WRITERS || o->queue_max_blocks < 1 || o->queue_max_bytes == 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "ssd tier: bad options");
    if (strlen(o->dir) > SSD_PATH_MAX - 128)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "ssd tier: folder path too long");
    struct kv_ssd *s = calloc(1, sizeof(*s));
    if (!s) return cairn_err_set(err, CAIRN_ERR_NOMEM, "ssd tier: out of memory");
    s->sig = o->sig;
    kv_tier_signature_hex(&o->sig, s->sig_hex);
    snprintf(s->dir, sizeof(s->dir), "%s", o->dir);
    size_t dl = strlen(s->dir);
    while (dl > 1 && s->dir[dl - 1] == '/') s->dir[--dl] = 0;
    s->max_bytes = o->max_bytes;
    s->queue_max_blocks = o->queue_max_blocks;
    s->queue_max_bytes = o->queue_max_bytes;
    if (kv_tier_map_init(&s->map) != 0) {
        free(s);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "ssd tier: out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond_work, NULL);
    pthread_cond_init(&s->cond_space, NULL);
    pthread_cond_init(&s->cond_idle, NULL);
    struct cairn_err e2 = {0};
    if (cairn_mkdir_p(s->dir, &e2) != CAIRN_OK)
        LOG_WARN("kv", "ssd tier: %s; blocks will not be kept on disk", e2.msg);
    int rc = ssd_scan(s);
    if (rc != CAIRN_OK) {
        cairn_err_set(err, rc, "ssd tier: out of memory scanning %s", s->dir);
        kv_ssd_close(s);
        return rc;
    }
    LOG_INFO("kv",
             "ssd tier: %s: %zu blocks (%.1f MiB of %.1f MiB) in %.3f s; %llu damaged removed, "
             "%llu foreign left, %llu stale temp files removed",
             s->dir, s->map.n, (double)s->bytes / 1048576.0, (double)s->max_bytes / 1048576.0,
             s->st.scan_s, (unsigned long long)s->st.n_damaged,
             (unsigned long long)s->st.n_foreign, (unsigned long long)s->st.n_stale_tmp);
    for (int i = 0; i < o->n_writers; i++) {
        if (pthread_create(&s->writers[i], NULL, ssd_writer_main, s) != 0) break;
        s->n_writers++;
    }
    if (s->n_writers == 0) {
        kv_ssd_close(s);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "ssd tier: cannot start a writer thread");
    }
    *out = s;
    return CAIRN_OK;
}

void kv_ssd_sync(struct kv_ssd *s)
{
    pthread_mutex_lock(&s->mu);
    while ((s->q_head || s->n_inflight) && s->n_writers > 0 && !s->paused)
        pthread_cond_wait(&s->cond_idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Removes every queued job; call with mu held. Returns the list to free after unlocking. */
static struct ssd_job *ssd_take_queue_locked(struct kv_ssd *s)
{
    struct ssd_job *q = s->q_head;
    for (struct ssd_job *j = q; j; j = j->next) s->q_bytes -= j->blk->alloc_bytes;
    s->q_head = s->q_tail = NULL;
    s->q_n = 0;
    pthread_cond_broadcast(&s->cond_space);
    if (s->n_inflight == 0) pthread_cond_broadcast(&s->cond_idle);
    return q;
}

static void ssd_free_jobs(struct ssd_job *q)
{
    while (q) {
        struct ssd_job *next = q->next;
        kv_tier_block_free(q->blk);
        free(q);
        q = next;
    }
}

void kv_ssd_clear(struct kv_ssd *s)
{
    struct ssd_victims v = {0};
    pthread_mutex_lock(&s->mu);
    struct ssd_job *q = ssd_take_queue_locked(s);
    while (s->map.lru_head) {
        struct ssd_entry *e = (struct ssd_entry *)s->map.lru_head;
        if (!e->pending) ssd_victims_add(&v, e->link.key);
        ssd_entry_remove_locked(s, e);
    }
    pthread_mutex_unlock(&s->mu);
    ssd_free_jobs(q);
    ssd_victims_unlink(s, &v);
}

void kv_ssd_close(struct kv_ssd *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1; /* writers drain the queue, then exit */
    pthread_cond_broadcast(&s->cond_work);
    pthread_cond_broadcast(&s->cond_space);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_writers; i++) pthread_join(s->writers[i], NULL);
    ssd_free_jobs(s->q_head); /* only when no writer ever started */
    while (s->map.lru_head) ssd_entry_remove_locked(s, (struct ssd_entry *)s->map.lru_head);
    kv_tier_map_free(&s->map);
    pthread_cond_destroy(&s->cond_work);
    pthread_cond_destroy(&s->cond_space);
    pthread_cond_destroy(&s->cond_idle);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void kv_ssd_pause_writers(struct kv_ssd *s, int paused)
{
    pthread_mutex_lock(&s->mu);
    s->paused = paused;
    pthread_cond_broadcast(&s->cond_work);
    pthread_mutex_unlock(&s->mu);
}

void kv_ssd_stats(struct kv_ssd *s, struct kv_tier_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->enabled = 1;
    st->n_blocks = s->map.n;
    st->n_bytes = s->bytes;
    st->max_bytes = s->max_bytes;
    st->n_queued = (uint64_t)s->q_n;
    st->n_queued_bytes = s->q_bytes;
    pthread_mutex_unlock(&s->mu);
}
