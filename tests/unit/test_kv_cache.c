/* kv_cache: refcounts, free list, LRU eviction order, hash chain, token-id mismatch = miss,
 * twins, tier hooks (publish, evict, promotion) and hybrid snapshots; the tier hooks also over a
 * pool in memory that is not host-visible (a GPU's), where blocks go through the host stage, or
 * straight from a tier that offers lookup_copy. */
#include "base/hash.h"
#include "base/mem.h"
#include "kv/kv_cache.h"
#include "testlib.h"

#define BS 4
#define NB 8

/* A fake lower tier: remembers evicted blocks (hash, tokens, K, V, state). */
struct fake_tier {
    int n_publish, n_evict, n_lookup, n_hit;
    uint8_t evicted_hash[32][32];
    int32_t evicted_tokens[32][BS];
    float evicted_k[32][BS * 2];
    float evicted_v[32][BS * 2];
    uint8_t evicted_state[32][16];
    int evicted_has_state[32];
    uint8_t published_hash[32][32];
    int corrupt; /* when set, lookup says miss (a damaged entry) */
    int n_wanted_asked;
};

static void fake_on_publish(void *ctx, const struct kv_block_desc *b)
{
    struct fake_tier *t = ctx;
    if (t->n_publish < 32) memcpy(t->published_hash[t->n_publish], b->hash, 32);
    t->n_publish++;
}

static void fake_on_evict(void *ctx, const struct kv_block_desc *b)
{
    struct fake_tier *t = ctx;
    int i = t->n_evict++;
    if (i >= 32) return;
    memcpy(t->evicted_hash[i], b->hash, 32);
    memcpy(t->evicted_tokens[i], b->tokens, sizeof(int32_t) * BS);
    memcpy(t->evicted_k[i], b->k, b->block_bytes);
    memcpy(t->evicted_v[i], b->v, b->block_bytes);
    t->evicted_has_state[i] = b->state != NULL;
    if (b->state) memcpy(t->evicted_state[i], b->state, b->state_bytes);
}

/* evict_wanted: 0 for a hash on_evict already got (the tier holds it) */
static int fake_evict_wanted(void *ctx, const uint8_t hash[32])
{
    struct fake_tier *t = ctx;
    t->n_wanted_asked++;
    for (int i = 0; i < t->n_evict && i < 32; i++)
        if (memcmp(t->evicted_hash[i], hash, 32) == 0) return 0;
    return 1;
}

static int fake_lookup(void *ctx, const uint8_t hash[32], const int32_t *tokens, int n_tokens, void *k,
                       void *v, size_t block_bytes, void *state, size_t state_bytes, int *has_state)
{
    struct fake_tier *t = ctx;
    t->n_lookup++;
    if (t->corrupt) return 0;
    for (int i = 0; i < t->n_evict && i < 32; i++) {
        if (memcmp(t->evicted_hash[i], hash, 32) == 0 &&
            memcmp(t->evicted_tokens[i], tokens, sizeof(int32_t) * (size_t)n_tokens) == 0) {
            memcpy(k, t->evicted_k[i], block_bytes);
            memcpy(v, t->evicted_v[i], block_bytes);
            *has_state = t->evicted_has_state[i];
            if (state && t->evicted_has_state[i]) memcpy(state, t->evicted_state[i], state_bytes);
            t->n_hit++;
            return 1;
        }
    }
    return 0;
}

static int fake_n_copied; /* hits answered by lookup_copy (straight into the pool, no stage) */

/* lookup_copy: the same blocks, K and V through the cache's copy function into the pool */
static int fake_lookup_copy(void *ctx, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                            const struct kv_tier_copy *dst, int *has_state)
{
    struct fake_tier *t = ctx;
    t->n_lookup++;
    if (t->corrupt) return 0;
    for (int i = 0; i < t->n_evict && i < 32; i++) {
        if (memcmp(t->evicted_hash[i], hash, 32) == 0 &&
            memcmp(t->evicted_tokens[i], tokens, sizeof(int32_t) * (size_t)n_tokens) == 0) {
            if (!dst->copy(dst->copy_ctx, dst->k, t->evicted_k[i], dst->block_bytes) ||
                !dst->copy(dst->copy_ctx, dst->v, t->evicted_v[i], dst->block_bytes))
                return 0;
            *has_state = t->evicted_has_state[i];
            if (dst->state && t->evicted_has_state[i]) memcpy(dst->state, t->evicted_state[i], dst->state_bytes);
            t->n_hit++;
            fake_n_copied++;
            return 1;
        }
    }
    return 0;
}

static void fill_block(struct kv_pool *p, int b, float val)
{
    float *k = kv_pool_k(p, b, 0), *v = kv_pool_v(p, b, 0);
    for (size_t i = 0; i < p->block_bytes / sizeof(float); i++) {
        k[i] = val + (float)i;
        v[i] = -val - (float)i;
    }
}

/* A backend whose memory the cache must not read directly (host_visible 0): plain host memory
 * underneath, so the test can still look, and every upload/download counted (those of a
 * snapshot's size apart: SNAP_BYTES differs from a block's 2 x BS x 4 bytes). Buffers only. */
#define SNAP_BYTES 16
static int dev_n_up, dev_n_down, dev_n_copy, dev_n_up_state, dev_n_down_state;

static int dev_alloc(struct backend *be, size_t bytes, enum cairn_mem_tag tag, void **dptr, struct cairn_err *err)
{
    *dptr = cairn_mem_alloc(bytes, tag);
    return *dptr ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "dev: out of memory");
}

static void dev_free(struct backend *be, void *dptr, size_t bytes, enum cairn_mem_tag tag)
{
    cairn_mem_free(dptr, bytes, tag);
}

static int dev_upload(struct backend *be, void *dst, const void *src, size_t bytes, struct cairn_err *err)
{
    dev_n_up++;
    dev_n_up_state += bytes == SNAP_BYTES;
    memcpy(dst, src, bytes);
    return CAIRN_OK;
}

static int dev_download(struct backend *be, void *dst, const void *src, size_t bytes, struct cairn_err *err)
{
    dev_n_down++;
    dev_n_down_state += bytes == SNAP_BYTES;
    memcpy(dst, src, bytes);
    return CAIRN_OK;
}

static int dev_copy(struct backend *be, void *dst, const void *src, size_t bytes, struct cairn_err *err)
{
    dev_n_copy++;
    memcpy(dst, src, bytes);
    return CAIRN_OK;
}

/* host_pin / host_unpin: the cache pins its host stage once and unpins that pointer at free */
static int dev_n_pin, dev_n_unpin, dev_n_bad_unpin;
static void *dev_pinned;

static int dev_pin(struct backend *be, void *ptr, size_t bytes, struct cairn_err *err)
{
    dev_n_pin++;
    dev_pinned = ptr;
    return CAIRN_OK;
}

static void dev_unpin(struct backend *be, void *ptr)
{
    dev_n_unpin++;
    dev_n_bad_unpin += ptr != dev_pinned;
    dev_pinned = NULL;
}

static const struct backend_ops dev_ops = {
    .buf_alloc = dev_alloc, .buf_free = dev_free, .buf_upload = dev_upload, .buf_download = dev_download,
    .buf_copy = dev_copy, .host_pin = dev_pin, .host_unpin = dev_unpin};
static struct backend dev_be = {.ops = &dev_ops, .kind = BACKEND_CUDA, .name = "fake-device", .host_visible = 0};

static struct backend *pool_be; /* where setup puts the pool: NULL (host) or &dev_be */
static int tier_copies;          /* setup's tier offers lookup_copy */
static int tier_wanted;          /* setup's tier offers evict_wanted */

static void setup(struct kv_pool *p, struct kv_cache *c, struct fake_tier *t, size_t state_bytes)
{
    struct cairn_err err = {0};
    uint8_t ident[32];
    cairn_sha256("test-model", 10, ident);
    CHECK(kv_pool_init(p, pool_be, 1, NB, BS, 1, 2, DTYPE_F32, &err) == CAIRN_OK);
    /* no locate: lookups stay synchronous */
    struct kv_tier_ops ops = {.ctx = t, .on_evict = fake_on_evict, .on_publish = fake_on_publish,
                              .lookup = fake_lookup};
    if (tier_copies) ops.lookup_copy = fake_lookup_copy;
    if (tier_wanted) ops.evict_wanted = fake_evict_wanted;
    CHECK(kv_cache_init(c, p, ident, state_bytes, t ? &ops : NULL, &err) == CAIRN_OK);
}

static void teardown(struct kv_pool *p, struct kv_cache *c)
{
    kv_cache_free(c);
    kv_pool_free(p);
}

static void test_refcounts(void)
{
    struct kv_pool p;
    struct kv_cache c;
    setup(&p, &c, NULL, 0);
    int ids[NB];
    for (int i = 0; i < NB; i++) ids[i] = kv_cache_alloc(&c);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[NB - 1], NB - 1);
    CHECK_EQ_INT(kv_cache_alloc(&c), -1);
    CHECK_EQ_INT(kv_cache_n_used(&c), NB);
    kv_cache_ref(&c, 3);
    CHECK_EQ_INT(kv_cache_refcount(&c, 3), 2);
    kv_cache_release(&c, 3);
    CHECK_EQ_INT(kv_cache_n_free(&c), 0);
    kv_cache_release(&c, 3);
    CHECK_EQ_INT(kv_cache_n_free(&c), 1);
    CHECK_EQ_INT(kv_cache_n_cached(&c), 0); /* unpublished blocks go straight back */
    CHECK_EQ_INT(kv_cache_alloc(&c), 3);
    for (int i = 0; i < NB; i++) kv_cache_release(&c, i);
    CHECK_EQ_INT(kv_cache_n_free(&c), NB);
    CHECK_EQ_INT(kv_cache_n_used(&c), 0);
    teardown(&p, &c);
}

static void test_hash_chain(void)
{
    struct kv_pool p;
    struct kv_cache c;
    setup(&p, &c, NULL, 0);
    int32_t toks[3 * BS];
    for (int i = 0; i < 3 * BS; i++) toks[i] = 100 + i;
    uint8_t salt[32] = {0};
    /* the formula, computed here independently */
    uint8_t want[32], got[32], zero[32] = {0};
    struct cairn_sha256 h;
    cairn_sha256_init(&h);
    cairn_sha256_update(&h, c.identity, 32);
    cairn_sha256_update(&h, zero, 32);
    cairn_sha256_update(&h, toks, BS * sizeof(int32_t));
    cairn_sha256_update(&h, salt, 32);
    cairn_sha256_final(&h, want);
    kv_cache_hash(&c, NULL, toks, BS, NULL, got);
    CHECK(memcmp(want, got, 32) == 0);
    /* chained: second block depends on the first's hash */
    uint8_t h2[32], h2b[32];
    kv_cache_hash(&c, got, toks + BS, BS, NULL, h2);
    uint8_t other_parent[32];
    memcpy(other_parent, got, 32);
    other_parent[5] ^= 1;
    kv_cache_hash(&c, other_parent, toks + BS, BS, NULL, h2b);
    CHECK(memcmp(h2, h2b, 32) != 0);
    /* salt changes it */
    salt[0] = 1;
    kv_cache_hash(&c, NULL, toks, BS, salt, h2b);
    CHECK(memcmp(got, h2b, 32) != 0);

    /* publish a 3-block chain, release, match */
    int b[3];
    uint8_t parent[32] = {0};
    for (int i = 0; i < 3; i++) {
        b[i] = kv_cache_alloc(&c);
        CHECK_EQ_INT(kv_cache_publish(&c, b[i], parent, toks + i * BS, NULL, parent), b[i]);
    }
    CHECK(memcmp(kv_cache_block_hash(&c, b[0]), got, 32) == 0);
    CHECK(memcmp(kv_cache_block_hash(&c, b[1]), h2, 32) == 0);
    for (int i = 0; i < 3; i++) kv_cache_release(&c, b[i]);
    CHECK_EQ_INT(kv_cache_n_cached(&c), 3);
    int32_t out[4];
    CHECK_EQ_INT(kv_cache_match(&c, toks, 3 * BS, NULL, 4, out), 3);
    CHECK(out[0] == b[0] && out[1] == b[1] && out[2] == b[2]);
    CHECK_EQ_INT(kv_cache_n_used(&c), 3);
    for (int i = 0; i < 3; i++) kv_cache_release(&c, out[i]);
    /* max_blocks and partial tokens */
    CHECK_EQ_INT(kv_cache_match(&c, toks, 3 * BS, NULL, 2, out), 2);
    kv_cache_release(&c, out[0]);
    kv_cache_release(&c, out[1]);
    CHECK_EQ_INT(kv_cache_match(&c, toks, 3 * BS - 1, NULL, 4, out), 2);
    kv_cache_release(&c, out[0]);
    kv_cache_release(&c, out[1]);
    /* a changed token in block 1 ends the match after block 0 */
    int32_t toks2[3 * BS];
    memcpy(toks2, toks, sizeof(toks));
    toks2[BS + 2] = 7;
    CHECK_EQ_INT(kv_cache_match(&c, toks2, 3 * BS, NULL, 4, out), 1);
    kv_cache_release(&c, out[0]);
    /* another salt misses entirely */
    CHECK_EQ_INT(kv_cache_match(&c, toks, 3 * BS, salt, 4, out), 0);
    /* same hash but other token ids: never trusted */
    int32_t wrong[BS] = {1, 2, 3, 4};
    CHECK_EQ_INT(kv_cache_find(&c, got, NULL, toks), b[0]);
    CHECK_EQ_INT(kv_cache_find(&c, got, NULL, wrong), -1);
    CHECK_EQ_INT(kv_cache_find(&c, got, other_parent, toks), -1);
    teardown(&p, &c);
}

static void test_lru_and_tiers(void)
{
    struct kv_pool p;
    struct kv_cache c;
    struct fake_tier t;
    memset(&t, 0, sizeof(t));
    setup(&p, &c, &t, 0);
    int32_t toks[NB * BS];
    for (int i = 0; i < NB * BS; i++) toks[i] = i;
    /* three independent first blocks A, B, C (parent zero) */
    int b[3];
    uint8_t hs[3][32];
    for (int i = 0; i < 3; i++) {
        b[i] = kv_cache_alloc(&c);
        fill_block(&p, b[i], 10.0f * (float)(i + 1));
        kv_cache_publish(&c, b[i], NULL, toks + i * BS, NULL, hs[i]);
    }
    CHECK_EQ_INT(t.n_publish, 3);
    CHECK(memcmp(t.published_hash[1], hs[1], 32) == 0);
    /* release order B, A, C: eviction order must be the same */
    kv_cache_release(&c, b[1]);
    kv_cache_release(&c, b[0]);
    kv_cache_release(&c, b[2]);
    /* touching A again (match) and releasing moves it to the MRU end: order B, C, A */
    int32_t out[2];
    CHECK_EQ_INT(kv_cache_match(&c, toks, BS, NULL, 1, out), 1);
    CHECK_EQ_INT(out[0], b[0]);
    kv_cache_release(&c, out[0]);
    int held[NB];
    int n_held = 0;
    while (kv_cache_n_free(&c) > 0) held[n_held++] = kv_cache_alloc(&c);
    CHECK_EQ_INT(t.n_evict, 0);
    held[n_held++] = kv_cache_alloc(&c);
    held[n_held++] = kv_cache_alloc(&c);
    held[n_held++] = kv_cache_alloc(&c);
    CHECK_EQ_INT(t.n_evict, 3);
    CHECK(memcmp(t.evicted_hash[0], hs[1], 32) == 0);
    CHECK(memcmp(t.evicted_hash[1], hs[2], 32) == 0);
    CHECK(memcmp(t.evicted_hash[2], hs[0], 32) == 0);
    CHECK(t.evicted_k[0][0] == 20.0f && t.evicted_v[0][1] == -21.0f);
    CHECK_EQ_INT(kv_cache_alloc(&c), -1);
    CHECK_EQ_INT(n_held, NB);
    /* a device miss asks the tier; with no free block the promotion cannot happen */
    CHECK_EQ_INT(kv_cache_match(&c, toks + BS, BS, NULL, 1, out), 0);
    for (int i = 0; i < n_held; i++) kv_cache_release(&c, held[i]);
    /* now promotion: block B comes back from the tier with its payload */
    int lookups = t.n_lookup;
    CHECK_EQ_INT(kv_cache_match(&c, toks + BS, BS, NULL, 1, out), 1);
    CHECK(t.n_lookup > lookups);
    CHECK_EQ_INT(c.n_promotions, 1);
    CHECK(memcmp(kv_cache_block_hash(&c, out[0]), hs[1], 32) == 0);
    float *k = kv_pool_k(&p, out[0], 0);
    float *v = kv_pool_v(&p, out[0], 0);
    CHECK(k[0] == 20.0f && k[3] == 23.0f && v[2] == -22.0f);
    CHECK_EQ_INT(t.n_publish, 3); /* promotion does not publish back down */
    kv_cache_release(&c, out[0]);
    /* a damaged tier entry is a miss */
    t.corrupt = 1;
    CHECK_EQ_INT(kv_cache_match(&c, toks + 2 * BS, BS, NULL, 1, out), 0);
    CHECK_EQ_INT(kv_cache_n_used(&c), 0);
    /* clear: every cached block goes through on_evict */
    int ev = t.n_evict;
    int cached = kv_cache_n_cached(&c);
    CHECK(cached == 1);
    kv_cache_clear(&c);
    CHECK_EQ_INT(t.n_evict, ev + cached);
    CHECK_EQ_INT(kv_cache_n_free(&c), NB);
    teardown(&p, &c);
}

/* A block the tier holds already (restored from it, then evicted again) is not copied out again
 * when the tier says so (evict_wanted): no on_evict, no download; still an eviction. */
static void test_evict_wanted(void)
{
    struct kv_pool p;
    struct kv_cache c;
    struct fake_tier t;
    memset(&t, 0, sizeof(t));
    setup(&p, &c, &t, 0);
    int32_t toks[BS];
    for (int i = 0; i < BS; i++) toks[i] = 100 + i;
    uint8_t h[32];
    int a = kv_cache_alloc(&c);
    fill_block(&p, a, 5.0f);
    kv_cache_publish(&c, a, NULL, toks, NULL, h);
    kv_cache_release(&c, a);
    int held[NB + 1], n_held = 0;
    for (int round = 0; round < 2; round++) {
        int down0 = dev_n_down, ev0 = t.n_evict, asked0 = t.n_wanted_asked;
        uint64_t evictions0 = c.n_evictions;
        n_held = 0;
        while ((held[n_held] = kv_cache_alloc(&c)) >= 0) n_held++;
        CHECK_EQ_INT(n_held, NB);
        CHECK_EQ_INT(c.n_evictions, evictions0 + 1);
        CHECK_EQ_INT(t.n_wanted_asked, asked0 + 1);
        /* first round: the tier wants it (copied out); second: it holds it (nothing copied) */
        CHECK_EQ_INT(t.n_evict, ev0 + (round == 0));
        if (pool_be) CHECK_EQ_INT(dev_n_down, down0 + (round == 0 ? 2 : 0));
        for (int i = 0; i < n_held; i++) kv_cache_release(&c, held[i]);
        /* back from the tier, with its payload */
        int32_t out[1];
        CHECK_EQ_INT(kv_cache_match(&c, toks, BS, NULL, 1, out), 1);
        CHECK(memcmp(kv_cache_block_hash(&c, out[0]), h, 32) == 0);
        CHECK(((const float *)kv_pool_k(&p, out[0], 0))[0] == 5.0f);
        kv_cache_release(&c, out[0]);
    }
    teardown(&p, &c);
}

static void test_twins(void)
{
    struct kv_pool p;
    struct kv_cache c;
    setup(&p, &c, NULL, 0);
    int32_t toks[BS] = {5, 6, 7, 8};
    int a = kv_cache_alloc(&c), b = kv_cache_alloc(&c);
    CHECK_EQ_INT(kv_cache_publish(&c, a, NULL, toks, NULL, NULL), a);
    int got = kv_cache_publish(&c, b, NULL, toks, NULL, NULL);
    CHECK_EQ_INT(got, a);
    CHECK_EQ_INT(kv_cache_refcount(&c, a), 2);
    CHECK(!kv_cache_is_published(&c, b));
    kv_cache_release(&c, b); /* the caller drops its own copy */
    CHECK_EQ_INT(kv_cache_n_free(&c), NB - 1);
    kv_cache_release(&c, a);
    kv_cache_release(&c, a);
    CHECK_EQ_INT(kv_cache_n_cached(&c), 1);
    CHECK_EQ_INT(c.n_twins, 1);
    teardown(&p, &c);
}

static void test_snapshots(void)
{
    struct kv_pool p;
    struct kv_cache c;
    struct fake_tier t;
    memset(&t, 0, sizeof(t));
    uint64_t mem0 = cairn_mem_used(CAIRN_MEM_STATE);
    setup(&p, &c, &t, SNAP_BYTES);
    int32_t toks[3 * BS];
    for (int i = 0; i < 3 * BS; i++) toks[i] = 50 + i;
    int b[3];
    uint8_t parent[32] = {0};
    uint8_t st[SNAP_BYTES];
    for (int i = 0; i < 3; i++) {
        b[i] = kv_cache_alloc(&c);
        if (i == 0) {
            memset(st, 0xab, sizeof(st));
            CHECK(kv_cache_snapshot_attach(&c, b[i], st) == CAIRN_OK);
        }
        kv_cache_publish(&c, b[i], parent, toks + i * BS, NULL, parent);
    }
    CHECK(cairn_mem_used(CAIRN_MEM_STATE) >= mem0 + 32); /* scratch + one snapshot */
    for (int i = 0; i < 3; i++) kv_cache_release(&c, b[i]);
    /* only block 0 has a snapshot: the match is cut back to it */
    int32_t out[3];
    CHECK_EQ_INT(kv_cache_match(&c, toks, 3 * BS, NULL, 3, out), 1);
    CHECK_EQ_INT(out[0], b[0]);
    const uint8_t *snap = kv_cache_snapshot(&c, out[0]);
    CHECK(snap && snap[0] == 0xab && snap[15] == 0xab);
    kv_cache_release(&c, out[0]);
    /* the snapshot travels to the tier at eviction and back at promotion */
    kv_cache_clear(&c);
    CHECK(t.n_evict == 3);
    int had = 0;
    for (int i = 0; i < 3; i++) had += t.evicted_has_state[i];
    CHECK_EQ_INT(had, 1);
    CHECK_EQ_INT(kv_cache_match(&c, toks, 3 * BS, NULL, 3, out), 1);
    snap = kv_cache_snapshot(&c, out[0]);
    CHECK(snap && snap[3] == 0xab);
    kv_cache_release(&c, out[0]);
    /* a limit of 2 snapshots: a third attach drops the LRU cached block's snapshot */
    kv_cache_clear(&c);
    kv_cache_set_snapshot_limit(&c, 2);
    int s3[3];
    for (int i = 0; i < 3; i++) {
        s3[i] = kv_cache_alloc(&c);
        kv_cache_publish(&c, s3[i], NULL, toks + i * BS, NULL, NULL);
    }
    CHECK(kv_cache_snapshot_attach(&c, s3[0], st) == CAIRN_OK);
    CHECK(kv_cache_snapshot_attach(&c, s3[1], st) == CAIRN_OK);
    CHECK(kv_cache_snapshot_attach(&c, s3[2], st) == CAIRN_ERR_LIMIT); /* both holders are USED */
    CHECK(kv_cache_snapshot(&c, s3[2]) == NULL);
    kv_cache_release(&c, s3[1]);
    kv_cache_release(&c, s3[0]); /* LRU order: s3[1] then s3[0] */
    CHECK(kv_cache_snapshot_attach(&c, s3[2], st) == CAIRN_OK);
    CHECK(kv_cache_snapshot(&c, s3[1]) == NULL);
    CHECK(kv_cache_snapshot(&c, s3[0]) != NULL);
    CHECK_EQ_INT(c.n_snapshots, 2);
    kv_cache_release(&c, s3[2]);
    teardown(&p, &c);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_STATE), mem0);
}

int main(void)
{
    test_refcounts();
    test_hash_chain();
    test_lru_and_tiers();
    /* the same over device memory: publishes and evictions read blocks out (download), the
     * one promotion writes its K and V in (two uploads), and the payloads still match */
    pool_be = &dev_be;
    test_lru_and_tiers();
    CHECK_MSG(dev_n_down >= 2 * 4, "%d downloads", dev_n_down);
    CHECK_EQ_INT(dev_n_up, 2);
    CHECK(dev_n_pin >= 1); /* the stage, once per cache */
    CHECK_EQ_INT(dev_n_unpin, dev_n_pin);
    CHECK_EQ_INT(dev_n_bad_unpin, 0);
    /* and with a tier that copies straight into the pool (the hot tier's lookup_copy): the same
     * payloads, the same two uploads, none staged */
    dev_n_up = dev_n_down = 0;
    tier_copies = 1;
    test_lru_and_tiers();
    CHECK_EQ_INT(fake_n_copied, 1);
    CHECK_EQ_INT(dev_n_up, 2);
    tier_copies = 0;
    tier_wanted = 1;
    test_evict_wanted();
    pool_be = NULL;
    test_evict_wanted();
    tier_wanted = 0;
    test_twins();
    test_snapshots();
    /* snapshots in device memory: attached by device copies (4 attaches succeed), staged out
     * through a download each time block 0 goes to the tier with one (its publish and two
     * evictions) and back in through one upload when it is promoted, with the same bytes
     * (test_snapshots checks them) */
    pool_be = &dev_be;
    dev_n_up = dev_n_down = 0;
    test_snapshots();
    CHECK_EQ_INT(dev_n_copy, 4);
    CHECK_EQ_INT(dev_n_down_state, 3);
    CHECK_EQ_INT(dev_n_up_state, 1);
    pool_be = NULL;
    return test_summary("test_kv_cache");
}
