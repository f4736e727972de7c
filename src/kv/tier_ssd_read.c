/* SSD tier, reading: a lookup copies a queued block from memory, or reads its file without the
 * lock and verifies all of it (header, model signature, tokens, payload checksum); a damaged
 * file is removed. See tier_ssd_int.h for the design and the lock. */
#include "kv/tier_ssd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/log.h"


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
int kv_ssd_read_header(int fd, struct kv_tier_header *h, struct cairn_err *err)
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
int kv_ssd_check_header(const struct kv_ssd *s, const struct kv_tier_header *h,
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
    kv_ssd_path(s, hash, path, sizeof(path));
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
    int rc = kv_ssd_read_header(fd, &h, &err);
    if (rc != CAIRN_OK) {
        close(fd);
        *why = rc == CAIRN_ERR_IO ? "read error" : "bad header";
        return rc == CAIRN_ERR_IO ? SSD_READ_GONE
                                  : rc == CAIRN_ERR_NOMEM ? SSD_READ_NOMEM : SSD_READ_DAMAGED;
    }
    res = kv_ssd_check_header(s, &h, hash, (uint64_t)st.st_size, why);
    if (res != SSD_READ_OK) goto cleanup;
    res = SSD_READ_DAMAGED;
    *why = "token ids or count differ";
    if (h.n_tokens != n_tokens || h.kv_bytes != block_bytes ||
        memcmp(h.tokens, tokens, (size_t)n_tokens * sizeof(int32_t)) != 0)
        goto cleanup;
    void *k, *v, *stp = NULL;
    if (promote) {
        d->blk = kv_tier_block_new_in(s->slabs, n_tokens, block_bytes, h.state_bytes);
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
    if (kv_ssd_checksum(k, v, block_bytes, stp, h.state_bytes) != h.checksum) goto cleanup;
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

    if (s->read_delay_ms > 0) { /* test hook (tier_ssd.h): a slow disk */
        struct timespec ts = {s->read_delay_ms / 1000, (long)(s->read_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
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
            if (kv_ssd_should_log_locked(s)) {
                char hex[65];
                cairn_hex(hash, 32, hex);
                LOG_WARN("kv", "ssd tier: block %s unusable (%s)%s", hex, why,
                         unlink_it ? ", removed" : "");
            }
            kv_ssd_entry_remove_locked(s, e);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (unlink_it) kv_ssd_unlink_hash(s, hash);
    if (promote) *promote = d.blk; /* NULL unless hit */
    return hit;
}
