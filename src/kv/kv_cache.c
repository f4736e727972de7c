/* Device-tier block cache: refcounts, free list, LRU of cached blocks, hash-chain prefix index,
 * snapshots, tier hooks, and the planned (restore vs recompute) and fetched admission path. See
 * kv_cache.h for the design. */
#include "kv/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/mem.h"
#include "kv/kv_state.h"

enum kv_block_state {
    KV_BLOCK_FREE = 0,
    KV_BLOCK_USED,
    KV_BLOCK_CACHED,
};

struct kv_cache_block {
    int refcnt;
    uint8_t state;       /* enum kv_block_state */
    uint8_t published;   /* in the hash index (tokens, hash, parent valid) */
    int32_t lru_prev, lru_next; /* CACHED only */
    int32_t hnext;       /* next block in the same hash bucket */
    uint8_t hash[32];
    uint8_t parent[32];
    void *snapshot;      /* state_bytes in the pool's backend memory (kv_state.h), or NULL */
};

static const uint8_t kv_zero32[32];

static int kv_cache_snapshot_put(struct kv_cache *c, int b, const void *state, int from_host);

static int kv_cache_bucket(const struct kv_cache *c, const uint8_t hash[32])
{
    uint32_t h;
    memcpy(&h, hash, 4);
    return (int)(h & (uint32_t)(c->n_buckets - 1));
}

int kv_cache_init(struct kv_cache *c, struct kv_pool *pool, const uint8_t identity[32],
                  size_t state_bytes, const struct kv_tier_ops *tiers, struct cairn_err *err)
{
    memset(c, 0, sizeof(*c));
    c->pool = pool;
    memcpy(c->identity, identity, 32);
    c->state_bytes = state_bytes;
    if (tiers) c->tiers = *tiers;
    int n = pool->n_blocks;
    c->n_buckets = 16;
    while (c->n_buckets < 2 * n) c->n_buckets *= 2;
    c->blocks = calloc((size_t)n, sizeof(*c->blocks));
    c->tokens = calloc((size_t)n * (size_t)pool->block_size, sizeof(int32_t));
    c->free_stack = calloc((size_t)n, sizeof(int32_t));
    c->buckets = malloc((size_t)c->n_buckets * sizeof(int32_t));
    if (state_bytes) c->scratch_state = cairn_mem_alloc(state_bytes, CAIRN_MEM_STATE);
    /* K, V and a snapshot pass through host memory on their way to and from the tiers */
    if (!kv_pool_host_visible(pool)) c->stage_bytes = 2 * pool->block_bytes + state_bytes;
    if (c->stage_bytes) c->stage = cairn_mem_alloc(c->stage_bytes, CAIRN_MEM_OTHER);
    if (!c->blocks || !c->tokens || !c->free_stack || !c->buckets ||
        (state_bytes && !c->scratch_state) || (c->stage_bytes && !c->stage)) {
        kv_cache_free(c);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "kv cache: cannot allocate metadata for %d blocks", n);
    }
    /* Pinned once (a backend that can: a GPU), so the download of every evicted block and the
     * upload of every staged lookup skip the driver's pageable bounce (6 vs 36-50 GB/s on an
     * H200). Refused: the stage works unpinned. */
    const struct backend_ops *bo = pool->be ? pool->be->ops : NULL;
    if (c->stage && bo && bo->host_pin && bo->host_unpin)
        c->stage_pinned = bo->host_pin(pool->be, c->stage, c->stage_bytes, NULL) == CAIRN_OK;
    for (int i = 0; i < c->n_buckets; i++) c->buckets[i] = -1;
    /* Pop order 0, 1, 2 ... (cosmetic: tests read block ids more easily). */
    for (int i = 0; i < n; i++) {
        c->free_stack[i] = n - 1 - i;
        c->blocks[i].lru_prev = c->blocks[i].lru_next = c->blocks[i].hnext = -1;
    }
    c->n_free = n;
    c->lru_head = c->lru_tail = -1;
    return CAIRN_OK;
}

void kv_cache_free(struct kv_cache *c)
{
    if (c->blocks && c->pool) {
        for (int i = 0; i < c->pool->n_blocks; i++)
            kv_state_free(c->pool->be, c->blocks[i].snapshot, c->state_bytes);
    }
    cairn_mem_free(c->scratch_state, c->state_bytes, CAIRN_MEM_STATE);
    if (c->stage_pinned) c->pool->be->ops->host_unpin(c->pool->be, c->stage);
    if (c->stage) cairn_mem_free(c->stage, c->stage_bytes, CAIRN_MEM_OTHER);
    free(c->blocks);
    free(c->tokens);
    free(c->free_stack);
    free(c->buckets);
    kv_fetch_close(c->fetch); /* after the engine cancelled its jobs; frees any left */
    free(c->plan_hash);
    free(c->plan_loc);
    memset(c, 0, sizeof(*c));
}

void kv_cache_hash(const struct kv_cache *c, const uint8_t *parent, const int32_t *tokens,
                   int n_tokens, const uint8_t *salt, uint8_t out[32])
{
    struct cairn_sha256 h;
    if (cairn_sha256_init(&h) != 0) {
        /* Cannot happen with a working libcrypto; an all-ones hash never matches a real one
         * because lookups also compare tokens and parent. */
        memset(out, 0xff, 32);
        return;
    }
    cairn_sha256_update(&h, c->identity, 32);
    cairn_sha256_update(&h, parent ? parent : kv_zero32, 32);
    /* token ids as int32 little endian (x86-64 is little endian; stated for other readers) */
    cairn_sha256_update(&h, tokens, (size_t)n_tokens * sizeof(int32_t));
    cairn_sha256_update(&h, salt ? salt : kv_zero32, 32);
    cairn_sha256_final(&h, out);
}

static int32_t *kv_cache_block_tokens(const struct kv_cache *c, int block)
{
    return c->tokens + (size_t)block * (size_t)c->pool->block_size;
}

/* ---- LRU ---- */

static void kv_cache_lru_remove(struct kv_cache *c, int b)
{
    struct kv_cache_block *k = &c->blocks[b];
    if (k->lru_prev >= 0) c->blocks[k->lru_prev].lru_next = k->lru_next;
    else c->lru_head = k->lru_next;
    if (k->lru_next >= 0) c->blocks[k->lru_next].lru_prev = k->lru_prev;
    else c->lru_tail = k->lru_prev;
    k->lru_prev = k->lru_next = -1;
    c->n_cached--;
}

static void kv_cache_lru_push_tail(struct kv_cache *c, int b)
{
    struct kv_cache_block *k = &c->blocks[b];
    k->lru_prev = c->lru_tail;
    k->lru_next = -1;
    if (c->lru_tail >= 0) c->blocks[c->lru_tail].lru_next = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_cached++;
}

/* ---- hash index ---- */

static void kv_cache_index_insert(struct kv_cache *c, int b)
{
    int i = kv_cache_bucket(c, c->blocks[b].hash);
    c->blocks[b].hnext = c->buckets[i];
    c->buckets[i] = b;
    c->blocks[b].published = 1;
}

static void kv_cache_index_remove(struct kv_cache *c, int b)
{
    int i = kv_cache_bucket(c, c->blocks[b].hash);
    int32_t *p = &c->buckets[i];
    while (*p >= 0 && *p != b) p = &c->blocks[*p].hnext;
    CAIRN_ASSERT(*p == b);
    *p = c->blocks[b].hnext;
    c->blocks[b].hnext = -1;
    c->blocks[b].published = 0;
}

int kv_cache_find(const struct kv_cache *c, const uint8_t hash[32], const uint8_t *parent,
                  const int32_t *tokens)
{
    size_t tok_bytes = (size_t)c->pool->block_size * sizeof(int32_t);
    if (!parent) parent = kv_zero32;
    for (int b = c->buckets[kv_cache_bucket(c, hash)]; b >= 0; b = c->blocks[b].hnext) {
        const struct kv_cache_block *k = &c->blocks[b];
        if (memcmp(k->hash, hash, 32) == 0 && memcmp(k->parent, parent, 32) == 0 &&
            memcmp(kv_cache_block_tokens(c, b), tokens, tok_bytes) == 0)
            return b;
    }
    return -1;
}

/* The tiers' view of block b. K, V and the snapshot point into the pool and the snapshot buffer
 * where they are host-visible, else into c->stage after a copy out of the device (valid until the
 * next kv_cache_desc). Returns 0 if a copy failed: the block is then not offered to the tiers (a
 * lost cache entry, never a wrong one). */
static int kv_cache_desc(const struct kv_cache *c, int b, struct kv_block_desc *d)
{
    const struct kv_cache_block *k = &c->blocks[b];
    memset(d, 0, sizeof(*d));
    memcpy(d->hash, k->hash, 32);
    memcpy(d->parent, k->parent, 32);
    d->n_tokens = c->pool->block_size;
    d->tokens = kv_cache_block_tokens(c, b);
    d->block_bytes = c->pool->block_bytes;
    d->state = k->snapshot;
    d->state_bytes = k->snapshot ? c->state_bytes : 0;
    if (!c->stage) {
        d->k = kv_pool_k(c->pool, b, 0);
        d->v = kv_pool_v(c->pool, b, 0);
        return 1;
    }
    uint8_t *st = c->stage;
    d->k = st;
    d->v = st + c->pool->block_bytes;
    if (k->snapshot) {
        d->state = st + 2 * c->pool->block_bytes;
        if (kv_state_download(c->pool->be, st + 2 * c->pool->block_bytes, k->snapshot, c->state_bytes, NULL))
            return 0;
    }
    return kv_pool_block_read(c->pool, b, st, st + c->pool->block_bytes, NULL) == CAIRN_OK;
}

/* ---- alloc / ref / release ---- */

static void kv_cache_drop_snapshot(struct kv_cache *c, int b)
{
    if (!c->blocks[b].snapshot) return;
    kv_state_free(c->pool->be, c->blocks[b].snapshot, c->state_bytes);
    c->blocks[b].snapshot = NULL;
    c->n_snapshots--;
}

/* Removes CACHED block b from the cache (on_evict, unindex); it becomes FREE-but-not-listed. */
static void kv_cache_evict_one(struct kv_cache *c, int b)
{
    const struct kv_tier_ops *o = &c->tiers;
    if (o->on_evict && (!o->evict_wanted || o->evict_wanted(o->ctx, c->blocks[b].hash))) {
        struct kv_block_desc d;
        if (kv_cache_desc(c, b, &d)) c->tiers.on_evict(c->tiers.ctx, &d);
    }
    kv_cache_lru_remove(c, b);
    kv_cache_index_remove(c, b);
    kv_cache_drop_snapshot(c, b);
    c->n_evictions++;
}

int kv_cache_alloc(struct kv_cache *c)
{
    int b;
    if (c->n_free > 0) {
        b = c->free_stack[--c->n_free];
    } else if (c->lru_head >= 0) {
        b = c->lru_head;
        kv_cache_evict_one(c, b);
    } else {
        return -1;
    }
    struct kv_cache_block *k = &c->blocks[b];
    CAIRN_ASSERT(k->refcnt == 0 && !k->published);
    k->refcnt = 1;
    k->state = KV_BLOCK_USED;
    c->n_used++;
    return b;
}

void kv_cache_ref(struct kv_cache *c, int b)
{
    struct kv_cache_block *k = &c->blocks[b];
    if (k->state == KV_BLOCK_CACHED) {
        kv_cache_lru_remove(c, b);
        k->state = KV_BLOCK_USED;
        c->n_used++;
    }
    CAIRN_ASSERT(k->state == KV_BLOCK_USED);
    k->refcnt++;
}

void kv_cache_release(struct kv_cache *c, int b)
{
    struct kv_cache_block *k = &c->blocks[b];
    CAIRN_ASSERT(k->state == KV_BLOCK_USED && k->refcnt > 0);
    if (--k->refcnt > 0) return;
    c->n_used--;
    if (k->published) {
        k->state = KV_BLOCK_CACHED;
        kv_cache_lru_push_tail(c, b);
    } else {
        k->state = KV_BLOCK_FREE;
        kv_cache_drop_snapshot(c, b);
        c->free_stack[c->n_free++] = b;
    }
}

int kv_cache_publish(struct kv_cache *c, int b, const uint8_t *parent, const int32_t *tokens,
                     const uint8_t *salt, uint8_t hash_out[32])
{
    uint8_t h[32];
    kv_cache_hash(c, parent, tokens, c->pool->block_size, salt, h);
    struct kv_cache_block *k = &c->blocks[b];
    CAIRN_ASSERT(k->state == KV_BLOCK_USED);
    /* hash_out may alias parent: write it only once parent is no longer needed */
    if (k->published) { /* already (e.g. a matched prefix block) */
        if (hash_out) memcpy(hash_out, h, 32);
        return b;
    }
    int twin = kv_cache_find(c, h, parent, tokens);
    if (twin >= 0) {
        kv_cache_ref(c, twin);
        /* keep a snapshot if only our copy has one */
        if (!c->blocks[twin].snapshot && k->snapshot) {
            c->blocks[twin].snapshot = k->snapshot;
            k->snapshot = NULL;
        }
        c->n_twins++;
        if (hash_out) memcpy(hash_out, h, 32);
        return twin;
    }
    memcpy(k->hash, h, 32);
    memcpy(k->parent, parent ? parent : kv_zero32, 32);
    memcpy(kv_cache_block_tokens(c, b), tokens, (size_t)c->pool->block_size * sizeof(int32_t));
    kv_cache_index_insert(c, b);
    if (c->tiers.on_publish) {
        struct kv_block_desc d;
        if (kv_cache_desc(c, b, &d)) c->tiers.on_publish(c->tiers.ctx, &d);
    }
    if (hash_out) memcpy(hash_out, h, 32);
    return b;
}

/* Indexes USED block b under (hash, parent, tokens) without on_publish: the tier has it. */
static void kv_cache_index_restored(struct kv_cache *c, int b, const uint8_t hash[32],
                                    const uint8_t *parent, const int32_t *tokens)
{
    struct kv_cache_block *k = &c->blocks[b];
    memcpy(k->hash, hash, 32);
    memcpy(k->parent, parent ? parent : kv_zero32, 32);
    memcpy(kv_cache_block_tokens(c, b), tokens, (size_t)c->pool->block_size * sizeof(int32_t));
    kv_cache_index_insert(c, b);
    c->n_promotions++;
}

static void kv_cache_smooth(double *avg, double x) { *avg = *avg > 0 ? 0.8 * *avg + 0.2 * x : x; }

/* kv_tier_copy.copy for a device pool: the backend's upload (synchronous). */
static int kv_cache_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
    const struct kv_pool *pool = ctx;
    return pool->be->ops->buf_upload(pool->be, dst, src, bytes, NULL) == CAIRN_OK;
}

/* Device miss: ask the lower tiers; on a hit take a block, copy the payload in and publish it.
 * Returns the block (one reference held) or -1. `timed`: the lookup is a RAM-tier copy whose
 * speed feeds fast_read_bps. */
static int kv_cache_promote(struct kv_cache *c, const uint8_t hash[32], const uint8_t *parent,
                            const int32_t *tokens, int timed)
{
    if (!c->tiers.lookup) return -1;
    int b = kv_cache_alloc(c);
    if (b < 0) return -1;
    int has_state = 0;
    double t0 = timed ? cairn_now() : 0;
    int hit = 0;
    if (c->stage && c->tiers.lookup_copy) {
        /* A device pool: a RAM tier uploads straight from its copy, without the stage */
        struct kv_tier_copy dst = {.k = kv_pool_k(c->pool, b, 0), .v = kv_pool_v(c->pool, b, 0),
                                   .block_bytes = c->pool->block_bytes, .state = c->scratch_state,
                                   .state_bytes = c->scratch_state ? c->state_bytes : 0,
                                   .copy = kv_cache_upload, .copy_ctx = c->pool};
        hit = c->tiers.lookup_copy(c->tiers.ctx, hash, tokens, c->pool->block_size, &dst, &has_state);
    }
    if (!hit) {
        /* On a device pool the payload lands in the host stage and is uploaded after. */
        uint8_t *k_dst = c->stage ? c->stage : kv_pool_k(c->pool, b, 0);
        uint8_t *v_dst = c->stage ? (uint8_t *)c->stage + c->pool->block_bytes : kv_pool_v(c->pool, b, 0);
        hit = c->tiers.lookup(c->tiers.ctx, hash, tokens, c->pool->block_size, k_dst, v_dst,
                              c->pool->block_bytes, c->scratch_state, c->scratch_state ? c->state_bytes : 0,
                              &has_state);
        if (hit && c->stage && kv_pool_block_write(c->pool, b, k_dst, v_dst, NULL) != CAIRN_OK) hit = 0;
    }
    if (!hit) {
        kv_cache_release(c, b);
        return -1;
    }
    if (timed) {
        double dt = cairn_now() - t0;
        if (dt > 0) kv_cache_smooth(&c->fast_read_bps, 2.0 * (double)c->pool->block_bytes / dt);
    }
    if (has_state && c->state_bytes) kv_cache_snapshot_put(c, b, c->scratch_state, 1);
    kv_cache_index_restored(c, b, hash, parent, tokens);
    return b;
}

/* A block a fetch job read: takes a block and uploads the copy. Returns it or -1. */
static int kv_cache_install(struct kv_cache *c, const struct kv_tier_block *src,
                            const uint8_t *parent)
{
    int b = kv_cache_alloc(c);
    if (b < 0) return -1;
    if (kv_pool_block_write(c->pool, b, src->k, src->v, NULL) != CAIRN_OK) {
        kv_cache_release(c, b);
        return -1;
    }
    if (src->has_state && c->state_bytes && src->state_bytes == c->state_bytes)
        kv_cache_snapshot_put(c, b, src->state, 1);
    kv_cache_index_restored(c, b, src->hash, parent, src->tokens);
    return b;
}

/* Grows the plan scratch to n entries. */
static int kv_cache_plan_reserve(struct kv_cache *c, int n)
{
    if (n <= c->plan_cap) return 0;
    int cap = c->plan_cap ? c->plan_cap : 64;
    while (cap < n) cap *= 2;
    uint8_t(*h)[32] = realloc(c->plan_hash, (size_t)cap * 32);
    if (!h) return -1;
    c->plan_hash = h;
    uint8_t *loc = realloc(c->plan_loc, (size_t)cap);
    if (!loc) return -1;
    c->plan_loc = loc;
    c->plan_cap = cap;
    return 0;
}

void kv_cache_plan(struct kv_cache *c, const int32_t *tokens, int n_tokens, const uint8_t *salt,
                   int max_blocks, double prefill_tok_s, struct kv_cache_plan *p)
{
    memset(p, 0, sizeof(*p));
    int bs = c->pool->block_size;
    int n_max = n_tokens / bs < max_blocks ? n_tokens / bs : max_blocks;
    if (n_max <= 0 || kv_cache_plan_reserve(c, n_max) != 0) return;
    const uint8_t *parent = NULL;
    int n = 0;
    for (; n < n_max; n++) {
        const int32_t *bt = tokens + (size_t)n * (size_t)bs;
        kv_cache_hash(c, parent, bt, bs, salt, c->plan_hash[n]);
        parent = c->plan_hash[n];
        int on_device = kv_cache_find(c, c->plan_hash[n], n ? c->plan_hash[n - 1] : NULL, bt) >= 0;
        if (on_device && p->n_tier == 0) {
            p->n_device++;
            continue;
        }
        int loc = on_device ? KV_TIER_LOC_FAST /* behind a miss: a ref, costs nothing */
                  : !c->tiers.lookup ? KV_TIER_LOC_NONE
                  : c->tiers.locate ? c->tiers.locate(c->tiers.ctx, c->plan_hash[n])
                                    : KV_TIER_LOC_FAST;
        if (loc == KV_TIER_LOC_NONE) break;
        c->plan_loc[p->n_tier++] = (uint8_t)loc;
    }
    if (p->n_tier == 0) return;
    struct kv_restore_speeds sp = {
        .fast_bps = c->fast_read_bps,
        .slow_bps = cairn_now() - c->slow_measured_at < 60 ? c->slow_read_bps : c->slow_prior_bps,
        .prefill_tok_s = prefill_tok_s,
    };
    size_t read_bytes = 2 * c->pool->block_bytes + c->state_bytes;
    p->n_restore = kv_restore_choose(c->plan_loc, p->n_tier, read_bytes, bs, &sp);
    p->recompute_block_s = kv_restore_recompute_s(bs, prefill_tok_s);
    for (int i = 0; i < p->n_restore; i++) p->n_slow += c->plan_loc[i] == KV_TIER_LOC_SLOW;
    if (p->n_restore == p->n_tier) {
        c->n_plans_restore++;
    } else {
        c->n_plans_recompute++;
        c->n_blocks_recomputed += (uint64_t)(p->n_tier - p->n_restore);
    }
}

int kv_cache_fetch_enable(struct kv_cache *c, kv_fetch_done_fn done, void *ctx,
                          struct cairn_err *err)
{
    if (c->fetch || !c->tiers.lookup || !c->tiers.locate) return CAIRN_OK;
    return kv_fetch_open(&c->tiers, done, ctx, &c->fetch, err);
}

int kv_cache_fetch_start(struct kv_cache *c, const int32_t *tokens, const uint8_t *salt,
                         const struct kv_cache_plan *p, struct kv_fetch_job **out)
{
    *out = NULL;
    if (!c->fetch || p->n_restore <= 0) return CAIRN_ERR_INVALID;
    int bs = c->pool->block_size;
    int first = p->n_device, n = p->n_restore;
    /* the plan's hashes are still in the scratch only if nothing planned since: recompute */
    if (kv_cache_plan_reserve(c, first + n) != 0) return CAIRN_ERR_NOMEM;
    const uint8_t *parent = NULL;
    for (int i = 0; i < first + n; i++) {
        kv_cache_hash(c, parent, tokens + (size_t)i * (size_t)bs, bs, salt, c->plan_hash[i]);
        parent = c->plan_hash[i];
    }
    int rc = kv_fetch_submit(c->fetch, (const uint8_t(*)[32])(c->plan_hash + first),
                             tokens + (size_t)first * (size_t)bs, n, bs, c->pool->block_bytes,
                             c->state_bytes, p->recompute_block_s, out);
    if (rc == CAIRN_OK) c->n_fetches++;
    return rc;
}

int kv_cache_fetch_done(struct kv_cache *c, struct kv_fetch_job *job)
{
    return kv_fetch_done(c->fetch, job);
}

void kv_cache_fetch_cancel(struct kv_cache *c, struct kv_fetch_job *job)
{
    if (job) kv_fetch_cancel(c->fetch, job);
}

/* The job's block for chain hash h at tokens, or NULL. */
static const struct kv_tier_block *kv_cache_job_block(const struct kv_cache *c,
                                                      const struct kv_fetch_job *job,
                                                      const uint8_t h[32], const int32_t *tokens)
{
    size_t tok_bytes = (size_t)c->pool->block_size * sizeof(int32_t);
    for (int i = 0; job && i < job->n_read; i++)
        if (memcmp(job->hash[i], h, 32) == 0 && memcmp(job->blk[i]->tokens, tokens, tok_bytes) == 0)
            return job->blk[i];
    return NULL;
}

/* The chain walk of both matches. fetched = 0: any tier lookup on this thread (kv_cache_match);
 * 1: device, job, or FAST-located blocks only. */
static int kv_cache_match_walk(struct kv_cache *c, const int32_t *tokens, int n_tokens,
                               const uint8_t *salt, int max_blocks, int32_t *out_blocks,
                               const struct kv_fetch_job *job, int fetched)
{
    int bs = c->pool->block_size;
    int n = 0;
    const uint8_t *parent = NULL;
    uint8_t h[32];
    while (n < max_blocks && (n + 1) * bs <= n_tokens) {
        const int32_t *bt = tokens + (size_t)n * (size_t)bs;
        kv_cache_hash(c, parent, bt, bs, salt, h);
        int b = kv_cache_find(c, h, parent, bt);
        if (b >= 0) {
            kv_cache_ref(c, b);
        } else if (!fetched || !c->tiers.locate) {
            b = kv_cache_promote(c, h, parent, bt, 0);
        } else {
            const struct kv_tier_block *src = kv_cache_job_block(c, job, h, bt);
            if (src) {
                b = kv_cache_install(c, src, parent);
                if (b >= 0) c->n_fetched_blocks++;
            } else if (c->tiers.locate(c->tiers.ctx, h) == KV_TIER_LOC_FAST) {
                b = kv_cache_promote(c, h, parent, bt, 1);
            }
        }
        if (b < 0) break;
        out_blocks[n++] = b;
        parent = c->blocks[b].hash;
    }
    if (c->state_bytes) {
        /* Hybrid: the recurrent state can only be restored at a block with a snapshot. */
        while (n > 0 && !c->blocks[out_blocks[n - 1]].snapshot) kv_cache_release(c, out_blocks[--n]);
    }
    return n;
}

int kv_cache_match(struct kv_cache *c, const int32_t *tokens, int n_tokens, const uint8_t *salt,
                   int max_blocks, int32_t *out_blocks)
{
    return kv_cache_match_walk(c, tokens, n_tokens, salt, max_blocks, out_blocks, NULL, 0);
}

int kv_cache_match_fetched(struct kv_cache *c, const int32_t *tokens, int n_tokens,
                           const uint8_t *salt, int max_blocks, int32_t *out_blocks,
                           struct kv_fetch_job *job)
{
    int n = kv_cache_match_walk(c, tokens, n_tokens, salt, max_blocks, out_blocks, job, 1);
    if (job && job->cut_slow) c->n_fetches_cut++;
    if (job && job->slow_s > 0 && job->slow_bytes > 0) {
        kv_cache_smooth(&c->slow_read_bps, (double)job->slow_bytes / job->slow_s);
        c->slow_measured_at = cairn_now();
    }
    kv_fetch_job_free(job);
    return n;
}

const uint8_t *kv_cache_block_hash(const struct kv_cache *c, int b)
{
    return c->blocks[b].published ? c->blocks[b].hash : NULL;
}

int kv_cache_refcount(const struct kv_cache *c, int b) { return c->blocks[b].refcnt; }

int kv_cache_is_published(const struct kv_cache *c, int b) { return c->blocks[b].published; }

int kv_cache_snapshot_attach(struct kv_cache *c, int b, const void *state)
{
    return kv_cache_snapshot_put(c, b, state, 0);
}

/* attach, from the pool's memory (from_host 0) or from host memory (a tier's payload). */
static int kv_cache_snapshot_put(struct kv_cache *c, int b, const void *state, int from_host)
{
    if (!c->state_bytes) return CAIRN_ERR_INVALID;
    struct kv_cache_block *k = &c->blocks[b];
    if (!k->snapshot) {
        if (c->max_snapshots > 0 && c->n_snapshots >= c->max_snapshots) {
            int victim = c->lru_head;
            while (victim >= 0 && !c->blocks[victim].snapshot) victim = c->blocks[victim].lru_next;
            if (victim < 0) return CAIRN_ERR_LIMIT;
            kv_cache_drop_snapshot(c, victim);
        }
        if (kv_state_alloc(c->pool->be, c->state_bytes, &k->snapshot, NULL) != CAIRN_OK) return CAIRN_ERR_NOMEM;
        c->n_snapshots++;
    }
    struct backend *be = c->pool->be;
    int rc = from_host ? kv_state_upload(be, k->snapshot, state, c->state_bytes, NULL)
                       : kv_state_copy(be, k->snapshot, state, c->state_bytes, NULL);
    if (rc != CAIRN_OK) kv_cache_drop_snapshot(c, b); /* no snapshot rather than a wrong one */
    return rc;
}

void kv_cache_set_snapshot_limit(struct kv_cache *c, int n) { c->max_snapshots = n > 0 ? n : 0; }

const void *kv_cache_snapshot(const struct kv_cache *c, int b) { return c->blocks[b].snapshot; }

void kv_cache_clear(struct kv_cache *c)
{
    while (c->lru_head >= 0) {
        int b = c->lru_head;
        kv_cache_evict_one(c, b);
        c->blocks[b].state = KV_BLOCK_FREE;
        c->free_stack[c->n_free++] = b;
    }
}

void kv_cache_speed_priors(struct kv_cache *c, double fast_bps, double slow_bps)
{
    if (fast_bps > 0 && !(c->fast_read_bps > 0)) c->fast_read_bps = fast_bps; /* smoothed on from it */
    if (slow_bps > 0) c->slow_prior_bps = slow_bps;
}

void kv_cache_speeds(const struct kv_cache *c, double *fast_bps, double *slow_bps)
{
    *fast_bps = c->fast_read_bps;
    *slow_bps = c->slow_read_bps > 0 ? c->slow_read_bps : c->slow_prior_bps;
}
