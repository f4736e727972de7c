/* The prefix-fetch I/O thread: a FIFO of jobs, each read block by block through the tiers'
 * lookup. The same shape as the SSD writers (tier_ssd_write.c): a mutex, a condition for work,
 * the slow part done without the lock. See kv_fetch.h for the flow and the lock rules. */
#include "kv/kv_fetch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"

enum { FETCH_QUEUED = 0, FETCH_RUNNING, FETCH_DONE };

struct kv_fetch {
    struct kv_tier_ops tiers;
    kv_fetch_done_fn done;
    void *done_ctx;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond_work;          /* queue became non-empty, or stop */
    struct kv_fetch_job *q_head, *q_tail; /* guarded by mu */
    int stop;                          /* guarded by mu */
};

void kv_fetch_job_free(struct kv_fetch_job *j)
{
    if (!j) return;
    for (int i = 0; j->blk && i < j->n_read; i++) kv_tier_block_free(j->blk[i]);
    free(j->blk);
    free(j->hash);
    free(j->tokens);
    free(j);
}

#define KV_FETCH_PROBE_BLOCKS 2 /* disk reads timed before a job may stop for being slow */

/* Reads j's blocks in chain order without the lock; stops at the first miss, when the job was
 * cancelled meanwhile (checked between blocks), or when its disk reads are slower than
 * recomputing the blocks would be (recompute_block_s). */
static void kv_fetch_run(struct kv_fetch *f, struct kv_fetch_job *j)
{
    for (int i = 0; i < j->n_blocks; i++) {
        pthread_mutex_lock(&f->mu);
        int cancelled = j->cancelled;
        pthread_mutex_unlock(&f->mu);
        if (cancelled) return;
        /* in the tiers' pinned slabs when they have them: the scheduler uploads from it */
        struct kv_tier_block *b =
            kv_tier_block_new_in(f->tiers.slabs, j->block_size, j->block_bytes, j->state_bytes);
        if (!b) return;
        const int32_t *tok = j->tokens + (size_t)i * (size_t)j->block_size;
        int slow = !f->tiers.locate || f->tiers.locate(f->tiers.ctx, j->hash[i]) == KV_TIER_LOC_SLOW;
        int has_state = 0;
        double t0 = cairn_now();
        int hit = f->tiers.lookup(f->tiers.ctx, j->hash[i], tok, j->block_size, b->k, b->v,
                                  j->block_bytes, b->state, j->state_bytes, &has_state);
        double dt = cairn_now() - t0;
        if (!hit) {
            kv_tier_block_free(b);
            return;
        }
        memcpy(b->hash, j->hash[i], 32);
        memcpy(b->tokens, tok, (size_t)j->block_size * sizeof(int32_t));
        b->has_state = has_state && j->state_bytes;
        j->blk[j->n_read++] = b;
        if (slow) {
            j->slow_bytes += 2 * j->block_bytes + (b->has_state ? j->state_bytes : 0);
            j->slow_s += dt;
            j->n_slow_read++;
            /* the disk proves slower than recomputing: keep what was read, recompute the rest */
            if (j->recompute_block_s > 0 && j->n_slow_read >= KV_FETCH_PROBE_BLOCKS && i + 1 < j->n_blocks &&
                j->slow_s > j->n_slow_read * j->recompute_block_s) {
                j->cut_slow = 1;
                return;
            }
        }
    }
}

static void *kv_fetch_main(void *arg)
{
    struct kv_fetch *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->q_head && !f->stop) pthread_cond_wait(&f->cond_work, &f->mu);
        if (f->stop) break;
        struct kv_fetch_job *j = f->q_head;
        f->q_head = j->next;
        if (!f->q_head) f->q_tail = NULL;
        j->next = NULL;
        j->state = FETCH_RUNNING;
        pthread_mutex_unlock(&f->mu);

        kv_fetch_run(f, j);

        pthread_mutex_lock(&f->mu);
        if (j->cancelled) {
            kv_fetch_job_free(j);
        } else {
            j->state = FETCH_DONE;
            if (f->done) f->done(f->done_ctx);
        }
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int kv_fetch_open(const struct kv_tier_ops *tiers, kv_fetch_done_fn done, void *done_ctx,
                  struct kv_fetch **out, struct cairn_err *err)
{
    *out = NULL;
    if (!tiers || !tiers->lookup)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "kv fetch: the tiers have no lookup");
    struct kv_fetch *f = calloc(1, sizeof(*f));
    if (!f) return cairn_err_set(err, CAIRN_ERR_NOMEM, "kv fetch: out of memory");
    f->tiers = *tiers;
    f->done = done;
    f->done_ctx = done_ctx;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cond_work, NULL);
    if (pthread_create(&f->thread, NULL, kv_fetch_main, f) != 0) {
        pthread_cond_destroy(&f->cond_work);
        pthread_mutex_destroy(&f->mu);
        free(f);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "kv fetch: cannot start the I/O thread");
    }
    *out = f;
    return CAIRN_OK;
}

void kv_fetch_close(struct kv_fetch *f)
{
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_broadcast(&f->cond_work);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->thread, NULL); /* the thread finishes the job in flight first */
    for (struct kv_fetch_job *j = f->q_head, *next; j; j = next) {
        next = j->next;
        kv_fetch_job_free(j);
    }
    pthread_cond_destroy(&f->cond_work);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int kv_fetch_submit(struct kv_fetch *f, const uint8_t (*hash)[32], const int32_t *tokens,
                    int n_blocks, int block_size, size_t block_bytes, size_t state_bytes,
                    double recompute_block_s, struct kv_fetch_job **out)
{
    *out = NULL;
    struct kv_fetch_job *j = calloc(1, sizeof(*j));
    if (!j) return CAIRN_ERR_NOMEM;
    size_t n_tok = (size_t)n_blocks * (size_t)block_size;
    j->hash = malloc((size_t)n_blocks * 32);
    j->tokens = malloc(n_tok * sizeof(int32_t));
    j->blk = calloc((size_t)n_blocks, sizeof(*j->blk));
    if (!j->hash || !j->tokens || !j->blk) {
        kv_fetch_job_free(j);
        return CAIRN_ERR_NOMEM;
    }
    memcpy(j->hash, hash, (size_t)n_blocks * 32);
    memcpy(j->tokens, tokens, n_tok * sizeof(int32_t));
    j->n_blocks = n_blocks;
    j->block_size = block_size;
    j->block_bytes = block_bytes;
    j->state_bytes = state_bytes;
    j->recompute_block_s = recompute_block_s;
    j->state = FETCH_QUEUED;
    pthread_mutex_lock(&f->mu);
    if (f->q_tail) f->q_tail->next = j;
    else f->q_head = j;
    f->q_tail = j;
    pthread_cond_signal(&f->cond_work);
    pthread_mutex_unlock(&f->mu);
    *out = j;
    return CAIRN_OK;
}

int kv_fetch_done(struct kv_fetch *f, struct kv_fetch_job *j)
{
    pthread_mutex_lock(&f->mu);
    int done = j->state == FETCH_DONE;
    pthread_mutex_unlock(&f->mu);
    return done;
}

void kv_fetch_cancel(struct kv_fetch *f, struct kv_fetch_job *j)
{
    pthread_mutex_lock(&f->mu);
    if (j->state == FETCH_RUNNING) {
        j->cancelled = 1; /* the thread frees it when the read in flight returns */
        pthread_mutex_unlock(&f->mu);
        return;
    }
    if (j->state == FETCH_QUEUED) {
        struct kv_fetch_job **pp = &f->q_head, *prev = NULL;
        while (*pp && *pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = j->next;
            if (f->q_tail == j) f->q_tail = prev;
        }
    }
    pthread_mutex_unlock(&f->mu);
    kv_fetch_job_free(j);
}
