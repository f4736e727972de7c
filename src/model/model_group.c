/* A model sharded over a tensor-parallel group, driven as one model: the rank threads, the
 * group backend's buffers and the group step (see model_group.h).
 *
 * Locking: model_group.mu guards gen, n_done, stopping and the job fields (kv views, rank
 * sequences, n_seqs, rc/err of the ranks), which the scheduler thread writes before it bumps
 * gen and reads after every rank is done. model_group_step_mu (process-wide) is held for a
 * whole group step. */
#include "model/model_group.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define MODEL_GROUP_BUF_MAGIC 0x63747062u /* "ctpb" */

/* One group buffer: bytes (logical) as `world` parts of rank_bytes, part r on rank r. */
struct model_group_buf {
    uint32_t magic;
    const struct model_group *g;
    size_t bytes;      /* logical: what the engine asked for */
    size_t rank_bytes; /* each rank's part (bytes / world, rounded up) */
    void *part[BACKEND_TP_MAX];
};

struct model_group {
    struct backend_tp *tp; /* not owned */
    struct model_tp *t;    /* owned: the ranks' models */
    int world;
    struct model_info info; /* the group's (model_group_info) */
    struct backend be;      /* buffers only (model_group_backend) */
    struct backend_ops ops;
    /* rank threads 1..world-1 */
    pthread_t th[BACKEND_TP_MAX];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a new job (gen) or stopping */
    pthread_cond_t cv_done; /* a rank finished its job */
    uint64_t gen;
    int n_done;
    int stopping;
    /* the job: written before gen is bumped, read after all are done */
    struct backend_kv_view kv[BACKEND_TP_MAX];
    int has_kv;
    struct model_seq *seqs[BACKEND_TP_MAX]; /* [cap_seqs] per rank */
    int cap_seqs;
    int n_seqs;
    int rc[BACKEND_TP_MAX];
    struct cairn_err err[BACKEND_TP_MAX];
};

static pthread_mutex_t model_group_step_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the group backend: buffers split across the ranks ---- */

static struct model_group_buf *model_group_buf_of(const struct model_group *g, const void *p)
{
    struct model_group_buf *b = (struct model_group_buf *)p;
    return b && b->magic == MODEL_GROUP_BUF_MAGIC && b->g == g ? b : NULL;
}

static int model_group_buf_alloc(struct backend *be, size_t bytes, enum cairn_mem_tag tag,
                                 void **dptr, struct cairn_err *err)
{
    struct model_group *g = be->impl;
    *dptr = NULL;
    struct model_group_buf *b = calloc(1, sizeof(*b));
    if (!b) return cairn_err_set(err, CAIRN_ERR_NOMEM, "tensor parallel: out of memory");
    b->magic = MODEL_GROUP_BUF_MAGIC;
    b->g = g;
    b->bytes = bytes;
    b->rank_bytes = (bytes + (size_t)g->world - 1) / (size_t)g->world;
    for (int r = 0; r < g->world; r++) {
        struct backend *rb = g->tp->bes[r];
        int rc = rb->ops->buf_alloc(rb, b->rank_bytes ? b->rank_bytes : 1, tag, &b->part[r], err);
        if (rc != CAIRN_OK) {
            for (int k = 0; k < r; k++)
                g->tp->bes[k]->ops->buf_free(g->tp->bes[k], b->part[k],
                                             b->rank_bytes ? b->rank_bytes : 1, tag);
            free(b);
            return rc;
        }
    }
    *dptr = b;
    return CAIRN_OK;
}

static void model_group_buf_free(struct backend *be, void *dptr, size_t bytes,
                                 enum cairn_mem_tag tag)
{
    struct model_group *g = be->impl;
    (void)bytes;
    struct model_group_buf *b = model_group_buf_of(g, dptr);
    if (!b) return;
    for (int r = 0; r < g->world; r++)
        g->tp->bes[r]->ops->buf_free(g->tp->bes[r], b->part[r], b->rank_bytes ? b->rank_bytes : 1,
                                     tag);
    b->magic = 0;
    free(b);
}

/* The group buffer at p, used whole (bytes of it, from its start); NULL after an error. */
static struct model_group_buf *model_group_buf_whole(struct backend *be, const void *p,
                                                     size_t bytes, struct cairn_err *err)
{
    struct model_group *g = be->impl;
    struct model_group_buf *b = model_group_buf_of(g, p);
    if (!b || bytes != b->bytes || b->rank_bytes * (size_t)g->world != b->bytes) {
        cairn_err_set(
            err, CAIRN_ERR_UNSUPPORTED,
            "tensor parallel: a buffer of the rank group is copied whole (%zu bytes asked%s)",
            bytes, b ? "" : ", not a group buffer");
        return NULL;
    }
    return b;
}

static int model_group_buf_upload(struct backend *be, void *dst, const void *src, size_t bytes,
                                  struct cairn_err *err)
{
    struct model_group *g = be->impl;
    struct model_group_buf *b = model_group_buf_whole(be, dst, bytes, err);
    if (!b) return CAIRN_ERR_UNSUPPORTED;
    int rc = CAIRN_OK;
    for (int r = 0; r < g->world && rc == CAIRN_OK; r++) {
        struct backend *rb = g->tp->bes[r];
        rc = rb->ops->buf_upload(rb, b->part[r], (const uint8_t *)src + (size_t)r * b->rank_bytes,
                                 b->rank_bytes, err);
    }
    return rc;
}

static int model_group_buf_download(struct backend *be, void *dst, const void *src, size_t bytes,
                                    struct cairn_err *err)
{
    struct model_group *g = be->impl;
    struct model_group_buf *b = model_group_buf_whole(be, src, bytes, err);
    if (!b) return CAIRN_ERR_UNSUPPORTED;
    int rc = CAIRN_OK;
    for (int r = 0; r < g->world && rc == CAIRN_OK; r++) {
        struct backend *rb = g->tp->bes[r];
        rc = rb->ops->buf_download(rb, (uint8_t *)dst + (size_t)r * b->rank_bytes, b->part[r],
                                   b->rank_bytes, err);
    }
    return rc;
}

static int model_group_buf_copy(struct backend *be, void *dst, const void *src, size_t bytes,
                                struct cairn_err *err)
{
    struct model_group *g = be->impl;
    struct model_group_buf *d = model_group_buf_whole(be, dst, bytes, err);
    struct model_group_buf *s = d ? model_group_buf_whole(be, src, bytes, err) : NULL;
    if (!s) return CAIRN_ERR_UNSUPPORTED;
    int rc = CAIRN_OK;
    for (int r = 0; r < g->world && rc == CAIRN_OK; r++) {
        struct backend *rb = g->tp->bes[r];
        rc = rb->ops->buf_copy(rb, d->part[r], s->part[r], d->rank_bytes, err);
    }
    return rc;
}

static int model_group_buf_zero(struct backend *be, void *dst, size_t bytes, struct cairn_err *err)
{
    struct model_group *g = be->impl;
    struct model_group_buf *b = model_group_buf_whole(be, dst, bytes, err);
    if (!b) return CAIRN_ERR_UNSUPPORTED;
    int rc = CAIRN_OK;
    for (int r = 0; r < g->world && rc == CAIRN_OK; r++) {
        struct backend *rb = g->tp->bes[r];
        rc = rb->ops->buf_zero(rb, b->part[r], b->rank_bytes, err);
    }
    return rc;
}

static int model_group_mem_stats(struct backend *be, struct backend_mem_stats *out)
{
    struct model_group *g = be->impl;
    memset(out, 0, sizeof(*out));
    for (int r = 0; r < g->world; r++) {
        struct backend *rb = g->tp->bes[r];
        struct backend_mem_stats s;
        memset(&s, 0, sizeof(s));
        if (rb->ops->mem_stats && rb->ops->mem_stats(rb, &s) == CAIRN_OK) {
            out->device_total += s.device_total;
            out->device_free += s.device_free;
            out->device_used_by_cairn += s.device_used_by_cairn;
        }
    }
    return CAIRN_OK;
}

static void model_group_be_destroy(struct backend *be)
{
    (void)be; /* the group owns it */
}

/* ---- rank threads ---- */

struct model_group_rank_arg {
    struct model_group *g;
    int rank;
};

static void model_group_rank_step(struct model_group *g, int r)
{
    g->rc[r] = model_forward(g->t->ranks[r], g->has_kv ? &g->kv[r] : NULL, g->seqs[r], g->n_seqs,
                             &g->err[r]);
}

static void *model_group_rank_main(void *arg)
{
    struct model_group_rank_arg a = *(struct model_group_rank_arg *)arg;
    free(arg);
    struct model_group *g = a.g;
    uint64_t seen = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (g->gen == seen && !g->stopping)
            pthread_cond_wait(&g->cv, &g->mu);
        if (g->stopping) break;
        seen = g->gen;
        pthread_mutex_unlock(&g->mu);
        model_group_rank_step(g, a.rank);
        pthread_mutex_lock(&g->mu);
        g->n_done++;
        pthread_cond_signal(&g->cv_done);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ---- load / free ---- */

int model_group_load(const char *dir, struct backend_tp *tp, struct model_group **out,
                     struct cairn_err *err)
{
    *out = NULL;
    struct model_group *g = calloc(1, sizeof(*g));
    if (!g) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    g->tp = tp;
    g->world = tp->world;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    pthread_cond_init(&g->cv_done, NULL);
    int rc = model_tp_load(dir, tp, &g->t, err);
    if (rc != CAIRN_OK) goto fail;
    g->info = *model_get_info(g->t->ranks[0]);
    g->info.n_heads *= g->world;
    g->info.n_kv_heads *= g->world;
    g->info.state_bytes *= (size_t)g->world;
    g->info.n_mtp_layers = 0; /* not under tensor parallel (model_group.h) */
    g->ops = (struct backend_ops){
        .destroy = model_group_be_destroy,
        .mem_stats = model_group_mem_stats,
        .buf_alloc = model_group_buf_alloc,
        .buf_free = model_group_buf_free,
        .buf_upload = model_group_buf_upload,
        .buf_download = model_group_buf_download,
        .buf_copy = model_group_buf_copy,
        .buf_zero = model_group_buf_zero,
    };
    struct backend *b0 = tp->bes[0];
    g->be = (struct backend){.ops = &g->ops,
                             .kind = b0->kind,
                             .host_visible = 0,
                             .impl = g,
                             .step_timeout_s = b0->step_timeout_s,
                             .tp_rank = 0,
                             .tp_world = g->world,
                             .exact_rows = b0->exact_rows};
    snprintf(g->be.name, sizeof(g->be.name), "tp%d:%.24s", g->world, b0->name);
    for (int r = 1; r < g->world; r++) {
        struct model_group_rank_arg *a = malloc(sizeof(*a));
        if (a) *a = (struct model_group_rank_arg){.g = g, .rank = r};
        if (!a || pthread_create(&g->th[r], NULL, model_group_rank_main, a) != 0) {
            free(a);
            rc = cairn_err_set(err, CAIRN_ERR_INTERNAL,
                               "tensor parallel: cannot start the thread of rank %d", r);
            goto fail;
        }
        g->n_threads = r;
    }
    *out = g;
    return CAIRN_OK;
fail:
    model_group_free(g);
    return rc;
}

void model_group_free(struct model_group *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r <= g->n_threads; r++)
        pthread_join(g->th[r], NULL);
    for (int r = 0; r < BACKEND_TP_MAX; r++)
        free(g->seqs[r]);
    model_tp_free(g->t);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pthread_cond_destroy(&g->cv_done);
    free(g);
}

const struct model_info *model_group_info(const struct model_group *g)
{
    return &g->info;
}
struct backend *model_group_backend(struct model_group *g)
{
    return &g->be;
}
int model_group_world(const struct model_group *g)
{
    return g->world;
}
struct model *model_group_rank(struct model_group *g, int r)
{
    return r >= 0 && r < g->world ? g->t->ranks[r] : NULL;
}

/* ---- steps ---- */

int model_group_reserve(struct model_group *g, int max_tokens, struct cairn_err *err)
{
    if (max_tokens > g->cap_seqs) { /* a step has at most one sequence per token */
        for (int r = 0; r < g->world; r++) {
            struct model_seq *s = realloc(g->seqs[r], (size_t)max_tokens * sizeof(*s));
            if (!s) return cairn_err_set(err, CAIRN_ERR_NOMEM, "tensor parallel: out of memory");
            g->seqs[r] = s;
        }
        g->cap_seqs = max_tokens;
    }
    for (int r = 0; r < g->world; r++) {
        int rc = model_reserve(g->t->ranks[r], max_tokens, err);
        if (rc != CAIRN_OK) return rc;
    }
    return CAIRN_OK;
}

void model_group_state_init(struct model_group *g, void *state)
{
    struct model_group_buf *b = model_group_buf_of(g, state);
    CAIRN_ASSERT(b);
    for (int r = 0; r < g->world; r++)
        model_state_init(g->t->ranks[r], b->part[r]);
}

/* The step's arguments of every rank: its part of the pool (the same blocks, its KV heads) and
 * its part of each state; logits from rank 0 only. */
static int model_group_stage(struct model_group *g, const struct backend_kv_view *kv,
                             const struct model_seq *seqs, int n_seqs, struct cairn_err *err)
{
    if (n_seqs <= 0 || !seqs)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model_forward: no sequences");
    if (n_seqs > g->cap_seqs)
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "model_forward: %d sequences, reserved %d",
                             n_seqs, g->cap_seqs);
    g->has_kv = kv != NULL;
    if (kv) {
        struct model_group_buf *bk = model_group_buf_of(g, kv->k),
                               *bv = model_group_buf_of(g, kv->v);
        if (!bk || !bv || kv->n_kv_heads % g->world)
            return cairn_err_set(err, CAIRN_ERR_INVALID,
                                 "tensor parallel: the KV pool is not on the rank group's backend "
                                 "(%d heads, %d ranks)",
                                 kv->n_kv_heads, g->world);
        for (int r = 0; r < g->world; r++) {
            struct backend_kv_view *v = &g->kv[r];
            *v = *kv;
            v->k = bk->part[r];
            v->v = bv->part[r];
            v->n_kv_heads = kv->n_kv_heads / g->world;
            v->layer_block_bytes = kv->layer_block_bytes / (size_t)g->world;
            v->block_bytes = kv->block_bytes / (size_t)g->world;
        }
    }
    for (int i = 0; i < n_seqs; i++) {
        struct model_group_buf *st = NULL;
        if (g->info.state_bytes) {
            st = model_group_buf_of(g, seqs[i].state);
            if (!st)
                return cairn_err_set(
                    err, CAIRN_ERR_INVALID,
                    "tensor parallel: sequence %d: its state is not a group buffer", i);
        }
        for (int r = 0; r < g->world; r++) {
            struct model_seq *q = &g->seqs[r][i];
            *q = seqs[i];
            q->state = st ? st->part[r] : NULL;
            if (r > 0) { /* replicated lm_head: rank 0's logits (or sampled row) are the group's */
                q->n_logits = 0;
                q->logits = NULL;
                q->n_hidden = 0;
                q->hidden = NULL;
                q->sample = NULL; /* model_forward refuses a sampled row without its logit row */
                q->sample_out = NULL;
            }
        }
    }
    g->n_seqs = n_seqs;
    return CAIRN_OK;
}

int model_group_forward(struct model_group *g, const struct backend_kv_view *kv,
                        const struct model_seq *seqs, int n_seqs, struct cairn_err *err)
{
    int rc = model_group_stage(g, kv, seqs, n_seqs, err);
    if (rc != CAIRN_OK) return rc;
    pthread_mutex_lock(&model_group_step_mu);
    pthread_mutex_lock(&g->mu);
    for (int r = 0; r < g->world; r++) {
        g->rc[r] = CAIRN_OK;
        memset(&g->err[r], 0, sizeof(g->err[r]));
    }
    g->n_done = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    model_group_rank_step(g, 0);
    pthread_mutex_lock(&g->mu);
    while (g->n_done < g->world - 1)
        pthread_cond_wait(&g->cv_done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_unlock(&model_group_step_mu);

    int first = -1, same = 1;
    for (int r = 0; r < g->world; r++) {
        if (g->rc[r] != CAIRN_OK && first < 0) first = r;
        if (g->rc[r] != g->rc[0]) same = 0;
    }
    if (first < 0) return CAIRN_OK;
    if (same && g->rc[0] != CAIRN_ERR_DEVICE && g->rc[0] != CAIRN_ERR_INTERNAL) {
        if (err) *err = g->err[0];
        return g->rc[0];
    }
    return cairn_err_set(err, CAIRN_ERR_DEVICE, "tensor parallel: rank %d of %d failed: %s", first,
                         g->world,
                         g->err[first].msg[0] ? g->err[first].msg : cairn_status_str(g->rc[first]));
}
