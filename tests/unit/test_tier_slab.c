/* The tier block slab pool (kv/tier_slab.h) with a fake pinner: one pin per slab (never per
 * block), one unpin per pin, the cached empty slab reused, wrong-size blocks in plain
 * allocations, a refused pin still serving, CAIRN_MEM_HOT back to its baseline, and the pool
 * behind kv_tiers (hot hits byte-identical, SSD writers and the fetch thread freeing slots on
 * their threads before close frees the pool). Synthetic blocks, no model. */
#include <pthread.h>

#include "base/mem.h"
#include "kv/kv_fetch.h"
#include "kv/tier_int.h"
#include "kv/tier_slab.h"
#include "kv/tiers.h"
#include "testlib.h"
#include "tier_testutil.h"

#define PIN_MAX 256

/* The fake pinner: what is pinned now, and how often pin/unpin ran. */
static struct {
    pthread_mutex_t mu;
    void *ptr[PIN_MAX];
    size_t bytes[PIN_MAX];
    int n_pins, n_unpins, n_bad_unpins;
    int refuse; /* pin returns -1 */
} fp = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int fake_pin(void *ctx, void *ptr, size_t bytes)
{
    (void)ctx;
    pthread_mutex_lock(&fp.mu);
    int rc = -1;
    if (!fp.refuse) {
        for (int i = 0; i < PIN_MAX; i++)
            if (!fp.ptr[i]) {
                fp.ptr[i] = ptr;
                fp.bytes[i] = bytes;
                fp.n_pins++;
                rc = 0;
                break;
            }
    }
    pthread_mutex_unlock(&fp.mu);
    return rc;
}

static void fake_unpin(void *ctx, void *ptr)
{
    (void)ctx;
    pthread_mutex_lock(&fp.mu);
    int found = 0;
    for (int i = 0; i < PIN_MAX && !found; i++)
        if (fp.ptr[i] == ptr) {
            fp.ptr[i] = NULL;
            found = 1;
        }
    fp.n_unpins++;
    if (!found) fp.n_bad_unpins++;
    pthread_mutex_unlock(&fp.mu);
}

static const struct kv_tier_pinner pinner = {.ctx = &fp, .pin = fake_pin, .unpin = fake_unpin};

static void fp_reset(void)
{
    pthread_mutex_lock(&fp.mu);
    memset(fp.ptr, 0, sizeof(fp.ptr));
    fp.n_pins = fp.n_unpins = fp.n_bad_unpins = fp.refuse = 0;
    pthread_mutex_unlock(&fp.mu);
}

static struct kv_tier_signature sig;

static void fill(struct kv_tier_block *b, int seed)
{
    memset(b->k, seed, b->block_bytes);
    memset(b->v, seed ^ 0x5a, b->block_bytes);
}

static int holds(const struct kv_tier_block *b, int seed)
{
    for (size_t i = 0; i < b->block_bytes; i++)
        if (b->k[i] != (uint8_t)seed || b->v[i] != (uint8_t)(seed ^ 0x5a)) return 0;
    return 1;
}

static void test_pool(void)
{
    fp_reset();
    uint64_t mem0 = cairn_mem_used(CAIRN_MEM_HOT);
    size_t bb = kv_tier_signature_block_bytes(&sig);
    size_t slot = (kv_tier_block_layout_bytes(sig.block_size, bb, 16) + 63) & ~(size_t)63;
    struct kv_tier_slabs *p = NULL;
    CHECK_EQ_INT(kv_tier_slabs_new(sig.block_size, bb, 16, 4 * slot + slot / 2, &pinner, &p),
                 CAIRN_OK);
    CHECK_EQ_INT(kv_tier_slabs_slot_bytes(p), slot);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0); /* nothing mapped before the first block */

    struct kv_tier_block *b[5];
    for (int i = 0; i < 5; i++) {
        b[i] = kv_tier_block_new_in(p, sig.block_size, bb, i == 2 ? 0 : 16); /* no snapshot fits */
        CHECK(b[i] && b[i]->slab);
        CHECK_EQ_INT(b[i]->alloc_bytes, slot);
        CHECK_EQ_INT(((uintptr_t)b[i]) % 64, 0);
        fill(b[i], 10 + i);
    }
    struct kv_tier_slab_stats st;
    kv_tier_slabs_stats(p, &st);
    CHECK_EQ_INT(st.n_slabs, 2); /* 4 slots a slab: the fifth block mapped a second */
    CHECK_EQ_INT(st.n_slots, 8);
    CHECK_EQ_INT(st.n_slots_used, 5);
    CHECK_EQ_INT(st.n_slabs_pinned, 2);
    CHECK_EQ_INT(st.pinned_bytes, st.mapped_bytes);
    CHECK_EQ_INT(fp.n_pins, 2); /* once per slab, not per block */
    CHECK(st.mapped_bytes >= 8 * slot);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0 + st.mapped_bytes);
    for (int i = 0; i < 5; i++)
        CHECK(holds(b[i], 10 + i)); /* no two slots overlap */
    CHECK(b[2]->state == NULL && b[0]->state != NULL && b[0]->state_bytes == 16);

    /* other sizes: plain allocations, accounted as before */
    uint64_t mem1 = cairn_mem_used(CAIRN_MEM_HOT);
    struct kv_tier_block *odd = kv_tier_block_new_in(p, sig.block_size - 1, bb, 16);
    struct kv_tier_block *odd2 = kv_tier_block_new_in(p, sig.block_size, bb + 64, 0);
    struct kv_tier_block *odd3 = kv_tier_block_new_in(p, sig.block_size, bb, 8);
    CHECK(odd && !odd->slab && odd2 && !odd2->slab && odd3 && !odd3->slab);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT),
                 mem1 + odd->alloc_bytes + odd2->alloc_bytes + odd3->alloc_bytes);
    kv_tier_block_free(odd);
    kv_tier_block_free(odd2);
    kv_tier_block_free(odd3);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem1);

    /* Freed in order, slab 1 (the first four) empties first and is cached; slab 2 then
     * empties as well and is given back: unpinned once. */
    for (int i = 0; i < 5; i++)
        kv_tier_block_free(b[i]);
    kv_tier_slabs_stats(p, &st);
    CHECK_EQ_INT(st.n_slabs, 1);
    CHECK_EQ_INT(st.n_slots_used, 0);
    CHECK_EQ_INT(fp.n_unpins, 1);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0 + st.mapped_bytes);

    /* The cached slab serves the next blocks without another pin. */
    for (int i = 0; i < 4; i++) {
        b[i] = kv_tier_block_new_in(p, sig.block_size, bb, 16);
        CHECK(b[i] && b[i]->slab);
        CHECK(b[i]->n_tokens == sig.block_size && b[i]->tokens[0] == 0); /* header cleared */
    }
    CHECK_EQ_INT(fp.n_pins, 2);
    for (int i = 0; i < 4; i++)
        kv_tier_block_free(b[i]);
    kv_tier_slabs_free(p);
    CHECK_EQ_INT(fp.n_unpins, 2); /* exactly one unpin per pin */
    CHECK_EQ_INT(fp.n_bad_unpins, 0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0);
    /* no pool: a plain allocation */
    struct kv_tier_block *plain = kv_tier_block_new_in(NULL, sig.block_size, bb, 0);
    CHECK(plain && !plain->slab);
    kv_tier_block_free(plain);
}

static void test_pin_refused(void)
{
    fp_reset();
    fp.refuse = 1;
    uint64_t mem0 = cairn_mem_used(CAIRN_MEM_HOT);
    size_t bb = kv_tier_signature_block_bytes(&sig);
    struct kv_tier_slabs *p = NULL;
    CHECK_EQ_INT(kv_tier_slabs_new(sig.block_size, bb, 0, 1, &pinner, &p), CAIRN_OK); /* 1 slot */
    struct kv_tier_block *a = kv_tier_block_new_in(p, sig.block_size, bb, 0);
    struct kv_tier_block *b = kv_tier_block_new_in(p, sig.block_size, bb, 0);
    CHECK(a && a->slab && b && b->slab && a->slab != b->slab);
    fill(a, 1);
    fill(b, 2);
    CHECK(holds(a, 1) && holds(b, 2));
    struct kv_tier_slab_stats st;
    kv_tier_slabs_stats(p, &st);
    CHECK_EQ_INT(st.n_slabs, 2);
    CHECK_EQ_INT(st.n_slabs_pinned, 0);
    CHECK_EQ_INT(st.pinned_bytes, 0);
    CHECK_EQ_INT(st.n_pin_failures, 2);
    kv_tier_block_free(a);
    kv_tier_block_free(b);
    kv_tier_slabs_free(p);
    CHECK_EQ_INT(fp.n_pins, 0);
    CHECK_EQ_INT(fp.n_unpins, 0); /* never unpin what was not pinned */
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0);
    fp.refuse = 0;
}

/* Threads taking and giving back slots at once (any thread frees). */
struct churn_arg {
    struct kv_tier_slabs *p;
    size_t bb;
    int seed;
    int bad;
};

static void *churn_main(void *arg)
{
    struct churn_arg *a = arg;
    struct kv_tier_block *held[8] = {0};
    for (int r = 0; r < 400; r++) {
        int i = r % 8;
        if (held[i]) {
            if (!holds(held[i], a->seed + i)) a->bad++;
            kv_tier_block_free(held[i]);
        }
        held[i] = kv_tier_block_new_in(a->p, sig.block_size, a->bb, 0);
        if (!held[i] || !held[i]->slab) {
            a->bad++;
            continue;
        }
        fill(held[i], a->seed + i);
    }
    for (int i = 0; i < 8; i++)
        kv_tier_block_free(held[i]);
    return NULL;
}

static void test_threads(void)
{
    fp_reset();
    uint64_t mem0 = cairn_mem_used(CAIRN_MEM_HOT);
    size_t bb = kv_tier_signature_block_bytes(&sig);
    struct kv_tier_slabs *p = NULL;
    CHECK_EQ_INT(kv_tier_slabs_new(sig.block_size, bb, 0, 3 * 4096, &pinner, &p), CAIRN_OK);
    pthread_t th[4];
    struct churn_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct churn_arg){.p = p, .bb = bb, .seed = 16 * i};
        pthread_create(&th[i], NULL, churn_main, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(a[i].bad, 0);
    }
    struct kv_tier_slab_stats st;
    kv_tier_slabs_stats(p, &st);
    CHECK_EQ_INT(st.n_slots_used, 0);
    CHECK(st.n_slabs <= 1); /* all empty: at most the cached one is left */
    kv_tier_slabs_free(p);
    CHECK_EQ_INT(fp.n_pins, fp.n_unpins);
    CHECK_EQ_INT(fp.n_bad_unpins, 0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0);
}

static struct kv_tiers *open_pinned(uint64_t hot, const char *dir, int with_pin)
{
    struct kv_tiers_opts o = {
        .sig = sig, .hot_max_bytes = hot, .ssd_dir = dir, .ssd_max_bytes = 64 << 20};
    if (with_pin) o.pin = pinner;
    struct kv_tiers *t = NULL;
    struct cairn_err err = {0};
    CHECK_MSG(kv_tiers_open(&o, &t, &err) == CAIRN_OK, "%s", err.msg);
    return t;
}

/* Hot hits out of slabs return the bytes that went in, through lookup and lookup_copy. */
static int copy_plain(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
    return 1;
}

static void test_tiers_hot(void)
{
    fp_reset();
    uint64_t mem0 = cairn_mem_used(CAIRN_MEM_HOT);
    struct kv_tier_signature sig0 = sig;
    tt_sig(&sig, 96); /* a hybrid model: blocks with and without snapshots */
    struct kv_tiers *t = open_pinned(1 << 20, NULL, 1);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    CHECK(ops.slabs != NULL);
    for (int i = 0; i < 40; i++)
        tt_evict(&ops, &sig, i, i % 2);
    for (int i = 0; i < 40; i++) {
        int hs = -1;
        CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, &hs), 1);
        CHECK_EQ_INT(hs, i % 2);
    }
    struct tt_block want;
    tt_block_make(&want, &sig, 7, 1);
    uint8_t *k = malloc(want.block_bytes), *v = malloc(want.block_bytes), st_buf[96];
    struct kv_tier_copy dst = {.k = k,
                               .v = v,
                               .block_bytes = want.block_bytes,
                               .state = st_buf,
                               .state_bytes = sizeof(st_buf),
                               .copy = copy_plain};
    int hs = 0;
    CHECK_EQ_INT(ops.lookup_copy(ops.ctx, want.hash, want.tokens, sig.block_size, &dst, &hs), 1);
    CHECK(hs && memcmp(k, want.k, want.block_bytes) == 0 &&
          memcmp(v, want.v, want.block_bytes) == 0 &&
          memcmp(st_buf, want.state, sizeof(st_buf)) == 0);
    free(k);
    free(v);
    tt_block_free(&want);
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_blocks, 40);
    CHECK(st.hot.n_slab_bytes > 0 && st.hot.n_pinned_bytes == st.hot.n_slab_bytes);
    /* the budget counts slots; CAIRN_MEM_HOT counts the whole slabs (at least as much) */
    CHECK(st.hot.n_bytes <= st.hot.n_slab_bytes);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0 + st.hot.n_slab_bytes);
    int pins = fp.n_pins;
    CHECK(pins >= 1 && (uint64_t)pins < st.hot.n_blocks); /* per slab, not per block */
    kv_tiers_close(t);
    CHECK_EQ_INT(fp.n_unpins, pins);
    CHECK_EQ_INT(fp.n_bad_unpins, 0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0);
    /* without a pinner (the CPU): no slabs at all, blocks as before */
    t = open_pinned(1 << 20, NULL, 0);
    ops = kv_tiers_ops(t);
    CHECK(ops.slabs == NULL);
    tt_evict(&ops, &sig, 1, 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 1, NULL), 1);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_slab_bytes, 0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0 + st.hot.n_bytes);
    kv_tiers_close(t);
    CHECK_EQ_INT(fp.n_pins, pins);
    sig = sig0;
}

/* A small hot tier spills to the SSD queue: its writer threads free slab blocks while the
 * scheduler-side thread keeps evicting; close drains them before it frees the pool. Then a
 * restart: an SSD hit is promoted into the hot tier in a slab, and the fetch thread reads into
 * slab blocks that the caller frees. */
static void test_tiers_ssd_and_fetch(void)
{
    fp_reset();
    uint64_t mem0 = cairn_mem_used(CAIRN_MEM_HOT);
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "slab");
    size_t bb = kv_tier_signature_block_bytes(&sig);
    uint64_t slot = (kv_tier_block_layout_bytes(sig.block_size, bb, 0) + 63) & ~(size_t)63;
    struct kv_tiers *t = open_pinned(16 * slot, dir, 1); /* slabs of 2 slots */
    struct kv_tier_ops ops = kv_tiers_ops(t);
    for (int i = 0; i < 64; i++)
        tt_evict(&ops, &sig, i, 0);
    kv_tiers_close(t); /* hot flush -> queue -> writers free -> pool freed last */
    CHECK(fp.n_pins >= 1);
    CHECK_EQ_INT(fp.n_unpins, fp.n_pins);
    CHECK_EQ_INT(fp.n_bad_unpins, 0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0);
    CHECK_EQ_INT(tt_count_suffix(dir, ".safetensors"), 64);

    fp_reset();
    t = open_pinned(16 * slot, dir, 1);
    ops = kv_tiers_ops(t);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 5, NULL), 1); /* from disk, promoted into hot */
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_blocks, 1);
    CHECK(st.hot.n_slab_bytes > 0);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 5, NULL), 1); /* now a hot hit */
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_hits, 1);

    struct kv_fetch *f = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(kv_fetch_open(&ops, NULL, NULL, &f, &err), CAIRN_OK);
    uint8_t hash[3][32];
    int32_t tokens[3 * 64];
    for (int i = 0; i < 3; i++) {
        struct tt_block b;
        tt_block_make(&b, &sig, 20 + i, 0);
        memcpy(hash[i], b.hash, 32);
        memcpy(tokens + i * sig.block_size, b.tokens, (size_t)sig.block_size * sizeof(int32_t));
        tt_block_free(&b);
    }
    struct kv_fetch_job *j = NULL;
    CHECK_EQ_INT(
        kv_fetch_submit(f, (const uint8_t(*)[32])hash, tokens, 3, sig.block_size, bb, 0, 0, &j),
        CAIRN_OK);
    for (int w = 0; w < 5000 && !kv_fetch_done(f, j); w++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK(kv_fetch_done(f, j));
    CHECK_EQ_INT(j->n_read, 3);
    for (int i = 0; i < j->n_read; i++) {
        struct tt_block b;
        tt_block_make(&b, &sig, 20 + i, 0);
        CHECK(j->blk[i]->slab != NULL);
        CHECK(memcmp(j->blk[i]->k, b.k, bb) == 0 && memcmp(j->blk[i]->v, b.v, bb) == 0);
        tt_block_free(&b);
    }
    kv_fetch_job_free(j); /* on this thread: slots taken on the fetch thread come back here */
    kv_fetch_close(f);
    kv_tiers_close(t);
    CHECK_EQ_INT(fp.n_unpins, fp.n_pins);
    CHECK_EQ_INT(fp.n_bad_unpins, 0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0);
    tt_rm_rf(dir);
}

int main(void)
{
    tt_sig(&sig, 0);
    test_pool();
    test_pin_refused();
    test_threads();
    test_tiers_hot();
    test_tiers_ssd_and_fetch();
    return test_summary("test_tier_slab");
}
