/* kv tiers (hot RAM + SSD): hits after evict, LRU budgets, spill, write-through, flush on clear
 * and close, restart, snapshots, mismatches. Synthetic blocks, no model. */
#include <pthread.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>

#include "base/file.h"
#include "base/mem.h"
#include "kv/tier_int.h"
#include "kv/tiers.h"
#include "testlib.h"
#include "tier_testutil.h"

static struct kv_tier_signature sig;

/* Bytes one synthetic block takes in the hot tier. */
static uint64_t one_block_bytes(void)
{
    struct kv_tier_block *b =
        kv_tier_block_new(sig.block_size, kv_tier_signature_block_bytes(&sig), sig.state_bytes);
    uint64_t n = b->alloc_bytes;
    kv_tier_block_free(b);
    return n;
}

static struct kv_tiers *open_tiers(uint64_t hot, const char *dir, uint64_t ssd_max, int wt)
{
    struct kv_tiers_opts o = {.sig = sig, .hot_max_bytes = hot, .ssd_dir = dir,
                              .ssd_max_bytes = ssd_max, .hot_write_through = wt};
    struct kv_tiers *t = NULL;
    struct cairn_err err = {0};
    int rc = kv_tiers_open(&o, &t, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    return t;
}

static void test_hot_hit_after_evict(void)
{
    uint64_t mem0 = cairn_mem_used(CAIRN_MEM_HOT);
    struct kv_tiers *t = open_tiers(1 << 20, NULL, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    CHECK(ops.on_evict && ops.lookup && !ops.on_publish && ops.evict_wanted);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, NULL), 0);
    uint8_t h0[32];
    cairn_sha256("block-0", 7, h0); /* tt_block_make's hash of block 0 */
    CHECK_EQ_INT(ops.evict_wanted(ops.ctx, h0), 1); /* not held: copy it out */
    tt_evict(&ops, &sig, 0, 1);
    CHECK_EQ_INT(ops.evict_wanted(ops.ctx, h0), 0); /* held: nothing to copy */
    CHECK(cairn_mem_used(CAIRN_MEM_HOT) >= mem0 + one_block_bytes());
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, NULL), 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 1, NULL), 0);
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK(st.hot.enabled && !st.ssd.enabled);
    CHECK_EQ_INT(st.hot.n_blocks, 1);
    CHECK_EQ_INT(st.hot.n_hits, 1);
    CHECK_EQ_INT(st.hot.n_misses, 2);
    CHECK_EQ_INT(st.hot.n_writes, 1);
    kv_tiers_close(t);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_HOT), mem0);
    /* no tiers at all: no hooks */
    struct kv_tiers *none = open_tiers(0, NULL, 0, 0);
    struct kv_tier_ops nops = kv_tiers_ops(none);
    CHECK(!nops.on_evict && !nops.lookup);
    kv_tiers_close(none);
}

static void test_hot_lru_budget(void)
{
    uint64_t one = one_block_bytes();
    struct kv_tiers *t = open_tiers(3 * one, NULL, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    for (int i = 0; i < 3; i++) tt_evict(&ops, &sig, i, 0);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, NULL), 1); /* 0 becomes most recent */
    tt_evict(&ops, &sig, 3, 0);                            /* evicts 1 (oldest) */
    tt_evict(&ops, &sig, 4, 0);                            /* evicts 2 */
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_blocks, 3);
    CHECK(st.hot.n_bytes <= 3 * one);
    CHECK_EQ_INT(st.hot.n_evictions, 2);
    CHECK_EQ_INT(st.hot.n_drops, 0); /* no SSD: evicted blocks are not "lost writes" */
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, NULL), 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 1, NULL), 0);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 2, NULL), 0);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 3, NULL), 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 4, NULL), 1);
    /* evicting a block already there does not duplicate it */
    tt_evict(&ops, &sig, 4, 0);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_blocks, 3);
    kv_tiers_close(t);
}

static void test_spill_to_ssd(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers");
    uint64_t one = one_block_bytes();
    struct kv_tiers *t = open_tiers(2 * one, dir, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    for (int i = 0; i < 5; i++) tt_evict(&ops, &sig, i, 0);
    kv_tiers_sync(t);
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_blocks, 2);
    CHECK_EQ_INT(st.ssd.n_writes, 3);
    CHECK_EQ_INT(st.ssd.n_blocks, 3);
    CHECK(st.ssd.max_bytes > 0 && st.ssd.max_bytes <= 50ull << 30);
    for (int i = 0; i < 3; i++) {
        char p[512];
        tt_path(dir, &sig, i, p, sizeof(p));
        CHECK_MSG(cairn_file_exists(p), "%s", p);
    }
    CHECK_EQ_INT(tt_count_files(dir, NULL), 3);
    /* SSD hit, promoted into hot: the second lookup is a hot hit */
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, NULL), 1);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_hits, 1);
    CHECK_EQ_INT(st.hot.n_misses, 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, NULL), 1);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_hits, 1);
    CHECK_EQ_INT(st.hot.n_hits, 1);
    /* promoting 0 evicted a block from hot: clean ones are not written again */
    kv_tiers_sync(t);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_writes, 4); /* block 3 was dirty, so it went to SSD */
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

static void test_write_through(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers");
    struct kv_tiers *t = open_tiers(1 << 20, dir, 0, 1);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    CHECK(ops.on_publish != NULL);
    for (int i = 0; i < 3; i++) {
        struct tt_block b;
        tt_block_make(&b, &sig, i, 0);
        ops.on_publish(ops.ctx, &b.d);
        tt_block_free(&b);
    }
    kv_tiers_sync(t);
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK(st.write_through);
    CHECK_EQ_INT(st.ssd.n_writes, 3);
    CHECK_EQ_INT(st.hot.n_blocks, 0);
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 3);
    /* later eviction: goes to hot clean, is not written twice */
    tt_evict(&ops, &sig, 0, 0);
    kv_tiers_close(t);
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 3);

    /* the environment switch */
    setenv("CAIRN_HOT_CACHE_WRITE_THROUGH", "1", 1);
    t = open_tiers(1 << 20, dir, 0, 0);
    unsetenv("CAIRN_HOT_CACHE_WRITE_THROUGH");
    kv_tiers_stats(t, &st);
    CHECK(st.write_through);
    CHECK(kv_tiers_ops(t).on_publish != NULL);
    kv_tiers_close(t);
    /* write-back: publish is not hooked */
    t = open_tiers(1 << 20, dir, 0, 0);
    kv_tiers_stats(t, &st);
    CHECK(!st.write_through);
    CHECK(kv_tiers_ops(t).on_publish == NULL);
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

static void test_clear_and_close_flush(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers");
    struct kv_tiers *t = open_tiers(1 << 20, dir, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    for (int i = 0; i < 3; i++) tt_evict(&ops, &sig, i, 0);
    struct cairn_err err = {0};
    CHECK(kv_tiers_clear(t, KV_TIER_HOT, &err) == CAIRN_OK);
    kv_tiers_sync(t);
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.hot.n_blocks, 0);
    CHECK_EQ_INT(st.ssd.n_writes, 3);
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 3);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 1);

    /* SSD clear: files gone, hot copies (promoted above) become dirty and are flushed on close */
    CHECK(kv_tiers_clear(t, KV_TIER_SSD, &err) == CAIRN_OK);
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 0);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_blocks, 0);
    CHECK_EQ_INT(st.hot.n_blocks, 3);
    for (int i = 3; i < 5; i++) tt_evict(&ops, &sig, i, 0);
    kv_tiers_close(t); /* flushes the 5 dirty hot blocks */
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 5);

    t = open_tiers(1 << 20, dir, 0, 0);
    ops = kv_tiers_ops(t);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_blocks, 5);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 1);
    CHECK(kv_tiers_clear(t, KV_TIER_ALL, &err) == CAIRN_OK);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_blocks + st.hot.n_blocks, 0);
    CHECK(kv_tiers_clear(t, (enum kv_tier_which)9, &err) == CAIRN_ERR_INVALID);
    kv_tiers_close(t);
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 0);
    tt_rm_rf(dir);
}

static void test_restart_lru_by_mtime(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers");
    struct kv_tiers *t = open_tiers(0, dir, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    CHECK(ops.on_evict != NULL);
    for (int i = 0; i < 20; i++) tt_evict(&ops, &sig, i, 0);
    kv_tiers_close(t);
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 20);
    /* Make block i older than block i+1, whatever order the writer used. */
    uint64_t all_bytes = 0, newest_bytes = 0; /* sizes differ a little: token ids are text */
    for (int i = 0; i < 20; i++) {
        char p[512];
        tt_path(dir, &sig, i, p, sizeof(p));
        struct timespec ts[2] = {{1700000000 + i, 0}, {1700000000 + i, 0}};
        CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
        struct stat st;
        stat(p, &st);
        all_bytes += (uint64_t)st.st_size;
        if (i >= 10) newest_bytes += (uint64_t)st.st_size;
    }
    /* Same budget: all 20 back, identical payloads. */
    t = open_tiers(0, dir, 0, 0);
    ops = kv_tiers_ops(t);
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_blocks, 20);
    CHECK_EQ_INT(st.ssd.n_bytes, all_bytes);
    CHECK_EQ_INT(st.ssd.n_damaged + st.ssd.n_foreign, 0);
    for (int i = 0; i < 20; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 1);
    kv_tiers_close(t);
    for (int i = 0; i < 20; i++) { /* lookups touched mtimes: reset */
        char p[512];
        tt_path(dir, &sig, i, p, sizeof(p));
        struct timespec ts[2] = {{1700000000 + i, 0}, {1700000000 + i, 0}};
        utimensat(AT_FDCWD, p, ts, 0);
    }
    /* Budget of 10 files: the 10 oldest are evicted at open. */
    t = open_tiers(0, dir, newest_bytes, 0);
    ops = kv_tiers_ops(t);
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_blocks, 10);
    CHECK_EQ_INT(st.ssd.n_evictions, 10);
    CHECK(st.ssd.n_bytes <= st.ssd.max_bytes);
    for (int i = 0; i < 10; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 0);
    for (int i = 10; i < 20; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 1);
    /* Writing 5 more keeps it under budget by evicting the least recently used. */
    for (int i = 20; i < 25; i++) tt_evict(&ops, &sig, i, 0);
    kv_tiers_sync(t);
    kv_tiers_stats(t, &st);
    CHECK(st.ssd.n_bytes <= st.ssd.max_bytes);
    CHECK_EQ_INT(st.ssd.n_blocks, 10);
    CHECK_EQ_INT(tt_count_files(dir, ".safetensors"), 10);
    for (int i = 20; i < 25; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 1);
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

static void test_state_snapshot(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers");
    struct kv_tier_signature saved = sig;
    tt_sig(&sig, 100);
    struct kv_tiers *t = open_tiers(1 << 20, dir, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    tt_evict(&ops, &sig, 0, 1); /* with snapshot */
    tt_evict(&ops, &sig, 1, 0); /* without */
    int hs = -1;
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, &hs), 1);
    CHECK_EQ_INT(hs, 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 1, &hs), 1);
    CHECK_EQ_INT(hs, 0);
    /* K/V only when the caller passes no state buffer */
    struct tt_block b;
    tt_block_make(&b, &sig, 0, 1);
    uint8_t *k = malloc(b.block_bytes), *v = malloc(b.block_bytes);
    hs = -1;
    CHECK(ops.lookup(ops.ctx, b.hash, b.tokens, 4, k, v, b.block_bytes, NULL, 0, &hs) == 1);
    CHECK_EQ_INT(hs, 0);
    CHECK(memcmp(k, b.k, b.block_bytes) == 0 && memcmp(v, b.v, b.block_bytes) == 0);
    kv_tiers_close(t); /* flushes both to SSD */

    t = open_tiers(0, dir, 0, 0); /* SSD only: reads the file */
    ops = kv_tiers_ops(t);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, &hs), 1);
    CHECK_EQ_INT(hs, 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 1, &hs), 1);
    CHECK_EQ_INT(hs, 0);
    hs = -1;
    CHECK(ops.lookup(ops.ctx, b.hash, b.tokens, 4, k, v, b.block_bytes, NULL, 0, &hs) == 1);
    CHECK_EQ_INT(hs, 0);
    /* a caller's state buffer of another size: a miss, and the file stays */
    uint8_t small[50];
    CHECK(ops.lookup(ops.ctx, b.hash, b.tokens, 4, k, v, b.block_bytes, small, 50, &hs) == 0);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, &hs), 1);
    CHECK_EQ_INT(hs, 1);
    /* a snapshot of the wrong size is not accepted from the engine */
    struct tt_block w;
    tt_block_make(&w, &sig, 7, 1);
    w.d.state_bytes = 99;
    ops.on_evict(ops.ctx, &w.d);
    kv_tiers_sync(t);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 7, NULL), 0);
    tt_block_free(&w);
    free(k);
    free(v);
    tt_block_free(&b);
    kv_tiers_close(t);
    sig = saved;
    tt_rm_rf(dir);
}

/* A copy function that counts and can fail (a device upload that errs). */
static int copy_n, copy_fail;
static int count_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    copy_n++;
    if (copy_fail) return 0;
    memcpy(dst, src, bytes);
    return 1;
}

/* lookup_copy (a device pool's path): the hot tier answers through the caller's copy, the same
 * bytes as lookup; a miss is not counted (the caller's lookup does that), a failed copy is a miss
 * that keeps the block, and a token mismatch drops it as lookup does. The SSD never answers. */
static void test_hot_lookup_copy(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers");
    struct kv_tiers *t = open_tiers(1 << 20, dir, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    CHECK(ops.lookup_copy != NULL);
    tt_evict(&ops, &sig, 0, 1);
    struct tt_block b;
    tt_block_make(&b, &sig, 0, 1);
    uint8_t *k = calloc(1, b.block_bytes), *v = calloc(1, b.block_bytes), *st = calloc(1, sig.state_bytes + 1);
    struct kv_tier_copy dst = {.k = k, .v = v, .block_bytes = b.block_bytes, .state = st,
                               .state_bytes = sig.state_bytes, .copy = count_copy};
    int hs = 0;
    CHECK_EQ_INT(ops.lookup_copy(ops.ctx, b.hash, b.tokens, sig.block_size, &dst, &hs), 1);
    CHECK_EQ_INT(copy_n, 2);
    CHECK(memcmp(k, b.k, b.block_bytes) == 0 && memcmp(v, b.v, b.block_bytes) == 0);
    CHECK(hs == (sig.state_bytes > 0));
    if (sig.state_bytes) CHECK(memcmp(st, b.state, sig.state_bytes) == 0);
    /* a failed copy: a miss, and the block stays */
    copy_fail = 1;
    CHECK_EQ_INT(ops.lookup_copy(ops.ctx, b.hash, b.tokens, sig.block_size, &dst, &hs), 0);
    copy_fail = 0;
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 0, NULL), 1);
    /* not in RAM: 0 without a copy */
    struct tt_block b1;
    tt_block_make(&b1, &sig, 1, 0);
    copy_n = 0;
    CHECK_EQ_INT(ops.lookup_copy(ops.ctx, b1.hash, b1.tokens, sig.block_size, &dst, &hs), 0);
    CHECK_EQ_INT(copy_n, 0);
    struct kv_tiers_stats s;
    kv_tiers_stats(t, &s);
    CHECK_EQ_INT(s.hot.n_hits, 2); /* lookup_copy's and tt_lookup_check's */
    CHECK_EQ_INT(s.hot.n_misses, 0);
    /* a token mismatch drops the block */
    int32_t other[4];
    memcpy(other, b.tokens, sizeof(other));
    other[2]++;
    CHECK_EQ_INT(ops.lookup_copy(ops.ctx, b.hash, other, sig.block_size, &dst, &hs), 0);
    CHECK_EQ_INT(copy_n, 0);
    kv_tiers_stats(t, &s);
    CHECK_EQ_INT(s.hot.n_damaged, 1);
    CHECK_EQ_INT(s.hot.n_blocks, 0);
    kv_tiers_close(t);
    tt_block_free(&b);
    tt_block_free(&b1);
    free(k);
    free(v);
    free(st);
    tt_rm_rf(dir);
}

static void test_token_mismatch(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers");
    struct kv_tiers *t = open_tiers(1 << 20, dir, 0, 0);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    tt_evict(&ops, &sig, 0, 0);
    tt_evict(&ops, &sig, 1, 0);
    struct tt_block b;
    tt_block_make(&b, &sig, 0, 0);
    uint8_t *k = malloc(b.block_bytes), *v = malloc(b.block_bytes);
    int32_t other[4];
    memcpy(other, b.tokens, sizeof(other));
    other[3]++;
    CHECK(ops.lookup(ops.ctx, b.hash, other, 4, k, v, b.block_bytes, NULL, 0, NULL) == 0);
    CHECK(ops.lookup(ops.ctx, b.hash, b.tokens, 3, k, v, b.block_bytes, NULL, 0, NULL) == 0);
    CHECK(ops.lookup(ops.ctx, b.hash, b.tokens, 4, k, v, b.block_bytes - 4, NULL, 0, NULL) == 0);
    kv_tiers_close(t); /* block 1 is flushed; block 0 was dropped from hot by the mismatch */

    t = open_tiers(0, dir, 0, 0);
    ops = kv_tiers_ops(t);
    struct tt_block b1;
    tt_block_make(&b1, &sig, 1, 0);
    memcpy(other, b1.tokens, sizeof(other));
    other[0] = 77;
    CHECK(ops.lookup(ops.ctx, b1.hash, other, 4, k, v, b1.block_bytes, NULL, 0, NULL) == 0);
    struct kv_tiers_stats st;
    kv_tiers_stats(t, &st);
    CHECK_EQ_INT(st.ssd.n_misses, 1);
    CHECK_EQ_INT(st.ssd.n_damaged, 1);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 1, NULL), 0); /* removed */
    kv_tiers_close(t);
    tt_block_free(&b);
    tt_block_free(&b1);
    free(k);
    free(v);
    tt_rm_rf(dir);
}

static void test_sizes(void)
{
    uint64_t v = 0;
    CHECK(kv_tiers_parse_ssd_size("50G", "/tmp/x/y", &v) && v == 50ull << 30);
    CHECK(kv_tiers_parse_ssd_size("10%", "/tmp/does/not/exist", &v) && v > 0);
    CHECK(!kv_tiers_parse_ssd_size("150%", "/tmp", &v));
    CHECK(!kv_tiers_parse_ssd_size("x%", "/tmp", &v));
    CHECK(!kv_tiers_parse_ssd_size("", "/tmp", &v));
    uint64_t d = kv_tiers_default_ssd_bytes("/tmp");
    CHECK(d > 0 && d <= 50ull << 30);
    struct kv_tiers_opts o = {.sig = sig};
    o.sig.block_size = 0;
    struct kv_tiers *t = NULL;
    CHECK(kv_tiers_open(&o, &t, NULL) == CAIRN_ERR_INVALID && t == NULL);
}

/* The scheduler thread evicts and looks up while another thread reads stats and clears tiers,
 * and the writers run: every hit must carry the right payload (run under ASan here; the
 * threaded parts were also checked with TSan). */
struct stress_ctx {
    struct kv_tiers *t;
    int stop; /* atomic */
};

static void *stress_admin(void *arg)
{
    struct stress_ctx *c = arg;
    int i = 0;
    while (!__atomic_load_n(&c->stop, __ATOMIC_RELAXED)) {
        struct kv_tiers_stats st;
        kv_tiers_stats(c->t, &st);
        if (++i % 50 == 0)
            kv_tiers_clear(c->t, (i / 50) % 3 == 0 ? KV_TIER_SSD : KV_TIER_HOT, NULL);
        usleep(200);
    }
    return NULL;
}

static void test_concurrent(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers-mt");
    struct kv_tiers_opts o = {.sig = sig, .hot_max_bytes = 8 * one_block_bytes(), .ssd_dir = dir,
                              .ssd_n_writers = 2, .ssd_queue_max_blocks = 8,
                              .hot_write_through = 1};
    struct kv_tiers *t = NULL;
    CHECK(kv_tiers_open(&o, &t, NULL) == CAIRN_OK);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    struct stress_ctx c = {.t = t};
    pthread_t th;
    pthread_create(&th, NULL, stress_admin, &c);
    int wrong = 0, hits = 0;
    uint64_t x = 42;
    for (int round = 0; round < 3000; round++) {
        int i = (int)(tt_rng(&x) % 64);
        switch (tt_rng(&x) % 3) {
        case 0: tt_evict(&ops, &sig, i, 0); break;
        case 1: {
            struct tt_block b;
            tt_block_make(&b, &sig, i, 0);
            ops.on_publish(ops.ctx, &b.d);
            tt_block_free(&b);
            break;
        }
        default: {
            int r = tt_lookup_check(&ops, &sig, i, NULL);
            if (r < 0) wrong++;
            if (r > 0) hits++;
        }
        }
    }
    __atomic_store_n(&c.stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    CHECK_EQ_INT(wrong, 0);
    CHECK(hits > 0);
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

int main(void)
{
    tt_sig(&sig, 0);
    test_hot_hit_after_evict();
    test_hot_lru_budget();
    test_spill_to_ssd();
    test_write_through();
    test_clear_and_close_flush();
    test_restart_lru_by_mtime();
    test_state_snapshot();
    test_hot_lookup_copy();
    test_token_mismatch();
    test_sizes();
    test_concurrent();
    return test_summary("test_tiers");
}
