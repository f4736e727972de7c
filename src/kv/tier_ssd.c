/* SSD tier: the index (map, LRU, byte budget, eviction) and the tier's life: open, close,
 * clear, sync, stats. The design note and the lock rules are in tier_ssd_int.h; writes are in
 * tier_ssd_write.c, reads in tier_ssd_read.c, the open scan in tier_ssd_scan.c. */
#include "kv/tier_ssd_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"

/* ---- paths and small helpers ---- */

void kv_ssd_path(const struct kv_ssd *s, const uint8_t hash[32], char *out, size_t n)
{
    char hex[65];
    cairn_hex(hash, 32, hex);
    /* s->dir is at most SSD_PATH_MAX - 128 long (checked at open): this always fits */
    int r = snprintf(out, n, "%s/%.2s/%s.safetensors", s->dir, hex, hex);
    if (r < 0 || (size_t)r >= n) out[0] = 0;
}

/* Logs the first 10 errors, then every 1000th (a full disk must not flood the log). Call with
 * mu held. */
int kv_ssd_should_log_locked(struct kv_ssd *s)
{
    uint64_t n = s->n_errors_logged++;
    return n < 10 || n % 1000 == 0;
}

void kv_ssd_unlink_hash(const struct kv_ssd *s, const uint8_t hash[32])
{
    char path[SSD_PATH_MAX];
    kv_ssd_path(s, hash, path, sizeof(path));
    unlink(path);
}


void kv_ssd_victims_add(struct ssd_victims *v, const uint8_t hash[32])
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

void kv_ssd_victims_unlink(const struct kv_ssd *s, struct ssd_victims *v)
{
    for (size_t i = 0; i < v->n; i++) kv_ssd_unlink_hash(s, v->hash[i]);
    free(v->hash);
    memset(v, 0, sizeof(*v));
}

void kv_ssd_entry_remove_locked(struct kv_ssd *s, struct ssd_entry *e)
{
    kv_tier_map_remove(&s->map, &e->link);
    s->bytes -= e->file_bytes;
    free(e);
}

/* Evicts least recently used on-disk files until under budget. Call with mu held. */
void kv_ssd_evict_locked(struct kv_ssd *s, struct ssd_victims *v)
{
    struct kv_tier_link *l = s->map.lru_head;
    while (s->bytes > s->max_bytes && l) {
        struct ssd_entry *e = (struct ssd_entry *)l;
        l = l->lru_next;
        if (e->pending) continue; /* not on disk yet */
        kv_ssd_victims_add(v, e->link.key);
        kv_ssd_entry_remove_locked(s, e);
        s->st.n_evictions++;
    }
}
int kv_ssd_locate(struct kv_ssd *s, const uint8_t hash[32])
{
    pthread_mutex_lock(&s->mu);
    struct ssd_entry *e = (struct ssd_entry *)kv_tier_map_find(&s->map, hash);
    int loc = !e ? KV_TIER_LOC_NONE : e->pending ? KV_TIER_LOC_FAST : KV_TIER_LOC_SLOW;
    pthread_mutex_unlock(&s->mu);
    return loc;
}

int kv_ssd_has(struct kv_ssd *s, const uint8_t hash[32])
{
    pthread_mutex_lock(&s->mu);
    struct kv_tier_link *l = kv_tier_map_find(&s->map, hash);
    if (l) kv_tier_map_touch(&s->map, l);
    pthread_mutex_unlock(&s->mu);
    return l != NULL;
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
    s->slabs = o->slabs;
    const char *delay = getenv("CAIRN_TEST_SSD_READ_DELAY_MS");
    if (delay && *delay) s->read_delay_ms = atoi(delay) > 0 ? atoi(delay) : 0;
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
    int rc = kv_ssd_scan(s);
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
        if (pthread_create(&s->writers[i], NULL, kv_ssd_writer_main, s) != 0) break;
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
        if (!e->pending) kv_ssd_victims_add(&v, e->link.key);
        kv_ssd_entry_remove_locked(s, e);
    }
    pthread_mutex_unlock(&s->mu);
    ssd_free_jobs(q);
    kv_ssd_victims_unlink(s, &v);
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
    while (s->map.lru_head) kv_ssd_entry_remove_locked(s, (struct ssd_entry *)s->map.lru_head);
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
