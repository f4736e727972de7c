/* SSD tier, writing: the bounded queue of block copies and the writer threads that turn them
 * into files (temp, fsync, rename, fsync of the folder: cairn_file_write_atomic_iov). See
 * tier_ssd_int.h for the design and the lock. */
#include "kv/tier_ssd_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"

/* xxh3 of the data section K | V | state, streamed (same value as cairn_xxh3 over the bytes
 * laid end to end). */
uint64_t kv_ssd_checksum(const void *k, const void *v, size_t block_bytes, const void *state,
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
    return kv_ssd_checksum(b->k, b->v, b->block_bytes, b->has_state ? b->state : NULL,
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
    kv_ssd_path(s, b->hash, path, sizeof(path));
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

void *kv_ssd_writer_main(void *arg)
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
            if (ours) kv_ssd_entry_remove_locked(s, e);
            if (kv_ssd_should_log_locked(s))
                LOG_WARN("kv", "ssd tier: write failed, block dropped: %s", err.msg);
        }
        kv_ssd_evict_locked(s, &v);
        if (!s->q_head && s->n_inflight == 0) pthread_cond_broadcast(&s->cond_idle);
        pthread_mutex_unlock(&s->mu);

        if (unlink_it) kv_ssd_unlink_hash(s, job->blk->hash);
        kv_ssd_victims_unlink(s, &v);
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