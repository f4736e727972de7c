/* Prefix fetches off the scheduler thread, and restore-vs-recompute, through the engine.
 *
 * One process, the SSD tier only (no hot tier, so every prefix hit is a disk read), with the test
 * hook CAIRN_TEST_SSD_READ_DELAY_MS making each block read take 400 ms (a slow disk):
 * 1. cold run of prompt P (greedy), its blocks pushed to the SSD (cache clear + sync);
 * 2. P again as C, cancelled while its fetch is in flight: C ends CANCELLED, no block held;
 * 3. request A decodes a long answer; P is sent again as B: B's chain is fetched on the I/O
 *    thread while A keeps producing tokens (counted between B's submit and B's first token: with
 *    the read on the scheduler thread A would get at most one), B restores its prefix and its
 *    greedy tokens equal the cold run's (the disk unmeasured, the plan restores; the fetch stops
 *    after two blocks, which read slower than recomputing them: B restores those two);
 * 4. the disk is now measured at 2 blocks' bytes per 400 ms, far slower than recomputing a block
 *    of this tiny model: P again as D is recomputed (a recompute decision, no cached tokens, no
 *    new fetch) and its tokens still equal the cold run's;
 * 5. a restart (engine and tiers closed and opened again on the same folder): the speeds the
 *    first run measured were kept (tier_speeds.c; the scan leaves their file alone), so the very
 *    first request, P as E, is recomputed too (without them the first SSD hit after a restart is
 *    always restored), with the cold run's tokens; kept without the disk's speed, the plan
 *    restores and the fetch stops after two blocks that read slower than recomputing (the rest is
 *    recomputed); a damaged speeds file reads as none.
 * LeakSanitizer checks that nothing (jobs, block copies) is left. Model: the oracle's qwen3-tiny,
 * f32 KV, block size 16. */
#include <stdlib.h>

#include "engine/engine.h"
#include "engine_oracle_util.h"
#include "engine_testutil.h"
#include "kv/tiers.h"
#include "model/model.h"
#include "tensor/backend.h"
#include "testlib.h"
#include "tier_testutil.h"

#define BLOCK 16
#define N_GEN 8
#define DELAY_MS "400"

static struct collect g_a;     /* the long decode */
static int g_a_at_b_submit;    /* A's tokens when B was submitted */
static int g_a_at_b_first = -1; /* ... and when B got its first token */

/* B's events: note A's progress at B's first token, then collect as usual. */
static void b_event(void *user, const struct engine_event *ev)
{
    struct collect *c = user;
    if (ev->kind == ENGINE_EVENT_TOKEN && g_a_at_b_first < 0) {
        pthread_mutex_lock(&collect_mu);
        g_a_at_b_first = g_a.n_tokens;
        pthread_mutex_unlock(&collect_mu);
    }
    collect_event(c, ev);
}

static int a_tokens(void)
{
    pthread_mutex_lock(&collect_mu);
    int n = g_a.n_tokens;
    pthread_mutex_unlock(&collect_mu);
    return n;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void get_stats(struct engine *e, struct engine_stats *st) { engine_get_stats(e, st); }

int main(void)
{
    char model_dir[1024], exp[1100], ssd[256];
    test_src_path("tests/data/oracle/models/qwen3-tiny", model_dir, sizeof(model_dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", model_dir);
    static struct oracle o;
    CHECK_MSG(oracle_read(exp, &o), "cannot read %s", exp);
    const struct oracle_case *p = NULL, *other = NULL; /* the longest prompt <= 128, another */
    for (int i = 0; i < o.n_cases; i++)
        if (o.cases[i].prompt_len <= 128 && (!p || o.cases[i].prompt_len > p->prompt_len)) p = &o.cases[i];
    for (int i = 0; i < o.n_cases; i++)
        if (&o.cases[i] != p && o.cases[i].prompt_len >= 2) other = &o.cases[i];
    CHECK(p && other && p->prompt_len >= 4 * BLOCK);
    if (!p || !other) return test_summary("test_tiers_fetch");
    int n = p->prompt_len;

    setenv("CAIRN_TEST_SSD_READ_DELAY_MS", DELAY_MS, 1);
    tt_tmpdir(ssd, sizeof(ssd), "tiers-fetch");
    struct cairn_err err = {0};
    struct backend *be = NULL;
    struct model *m = NULL;
    struct kv_tiers *tiers = NULL;
    struct engine *e = NULL;
    CHECK(backend_open("cpu", 1, &be, &err) == CAIRN_OK);
    CHECK_MSG(model_load(model_dir, be, &m, &err) == CAIRN_OK, "%s", err.msg);
    const struct model_info *mi = model_get_info(m);
    struct kv_tiers_opts to = {.ssd_dir = ssd};
    snprintf(to.sig.arch, sizeof(to.sig.arch), "%s", mi->model_type);
    to.sig.n_layers = mi->n_layers;
    to.sig.n_kv_layers = mi->n_kv_layers;
    to.sig.n_kv_heads = mi->n_kv_heads;
    to.sig.head_dim = mi->head_dim;
    to.sig.kv_dtype = DTYPE_F32;
    to.sig.block_size = BLOCK;
    memcpy(to.sig.identity, mi->identity, 32);
    CHECK_MSG(kv_tiers_open(&to, &tiers, &err) == CAIRN_OK, "%s", err.msg);
    struct engine_opts eo;
    memset(&eo, 0, sizeof(eo));
    engine_opts_default(&eo);
    eo.kv_dtype = DTYPE_F32;
    eo.block_size = BLOCK;
    eo.kv_bytes = 16ull << 20;
    eo.max_batch_tokens = 256;
    eo.tiers = kv_tiers_ops(tiers);
    CHECK_MSG(engine_create(m, &eo, &e, &err) == CAIRN_OK, "%s", err.msg);

    /* 1. cold */
    static struct collect cold;
    struct engine_request rq = collect_request(&cold, p->tokens, n, N_GEN);
    rq.ignore_eos = 1;
    CHECK(engine_submit(e, &rq, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&cold, 1));
    CHECK_EQ_INT(cold.usage.cached_tokens, 0);
    CHECK_EQ_INT(cold.n_tokens, N_GEN);
    collect_wait_idle(e, 1);
    engine_cache_clear(e); /* device -> SSD queue (no hot tier) */
    kv_tiers_sync(tiers);

    /* 2. cancel while fetching (the disk is not measured yet, so the plan restores) */
    struct engine_stats st;
    static struct collect c;
    struct engine_request rc_ = collect_request(&c, p->tokens, n, N_GEN);
    rc_.ignore_eos = 1;
    uint64_t c_id = 0;
    CHECK(engine_submit(e, &rc_, &c_id, &err) == CAIRN_OK);
    int seen_fetching = 0;
    for (int i = 0; i < 5000 && !seen_fetching; i++) {
        get_stats(e, &st);
        seen_fetching = st.n_fetching == 1;
        if (!seen_fetching) sleep_ms(1);
    }
    CHECK(seen_fetching);
    engine_cancel(e, c_id);
    CHECK(collect_wait(&c, 1));
    CHECK_EQ_INT(c.finish, ENGINE_FINISH_CANCELLED);
    CHECK_EQ_INT(c.n_tokens, 0);
    collect_wait_idle(e, 2);
    get_stats(e, &st);
    CHECK_EQ_INT(st.n_fetching, 0);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    CHECK_EQ_INT(st.n_fetches, 1);
    CHECK_EQ_INT(st.n_plans_recompute, 0);

    /* 3. A decodes while B's prefix is fetched (a cancelled job measured nothing) */
    struct engine_request ra = collect_request(&g_a, other->tokens, other->prompt_len, 1500);
    ra.ignore_eos = 1;
    uint64_t a_id = 0;
    CHECK(engine_submit(e, &ra, &a_id, &err) == CAIRN_OK);
    for (int i = 0; i < 5000 && a_tokens() < 2; i++) sleep_ms(1);
    CHECK(a_tokens() >= 2);
    static struct collect b;
    struct engine_request rb = collect_request(&b, p->tokens, n, N_GEN);
    rb.ignore_eos = 1;
    rb.on_event = b_event;
    g_a_at_b_submit = a_tokens();
    CHECK(engine_submit(e, &rb, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&b, 1));
    int during = g_a_at_b_first - g_a_at_b_submit;
    printf("A produced %d tokens while B's %d-block prefix was fetched\n", during, n / BLOCK);
    CHECK_MSG(during >= 3, "the other sequence stalled during the fetch: %d tokens", during);
    /* the disk was not measured yet, so the plan restored; its first two reads took 800 ms where
     * recomputing two blocks of this model takes a few: the fetch stopped there (cut_slow) */
    CHECK_MSG(b.usage.cached_tokens == 2 * BLOCK, "B cached %d of %d", b.usage.cached_tokens, n);
    CHECK_EQ_INT(b.n_tokens, N_GEN);
    CHECK_MSG(memcmp(b.tokens, cold.tokens, sizeof(int32_t) * N_GEN) == 0, "B's tokens differ from cold");
    engine_cancel(e, a_id);
    CHECK(collect_wait(&g_a, 1));
    collect_wait_idle(e, 4);
    get_stats(e, &st);
    CHECK_EQ_INT(st.n_fetches, 2);
    CHECK_EQ_INT(st.n_fetches_cut, 1);
    CHECK_EQ_INT(st.n_fetched_blocks, 2);
    CHECK(st.tier_slow_read_bps > 0);
    CHECK_EQ_INT(st.n_plans_recompute, 0);

    /* 4. the measured disk is slower than recomputing: D recomputes */
    engine_cache_clear(e);
    kv_tiers_sync(tiers);
    printf("measured: disk %.0f B/s, prefill %.0f tok/s\n", st.tier_slow_read_bps, st.prefill_tok_s);
    static struct collect d;
    struct engine_request rd = collect_request(&d, p->tokens, n, N_GEN);
    rd.ignore_eos = 1;
    CHECK(engine_submit(e, &rd, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&d, 1));
    CHECK_EQ_INT(d.usage.cached_tokens, 0);
    CHECK_MSG(memcmp(d.tokens, cold.tokens, sizeof(int32_t) * N_GEN) == 0, "D's tokens differ from cold");
    collect_wait_idle(e, 5);
    get_stats(e, &st);
    CHECK_EQ_INT(st.n_plans_recompute, 1);
    CHECK(st.n_blocks_recomputed >= (uint64_t)(n / BLOCK - 1));
    CHECK_EQ_INT(st.n_fetches, 2);

    engine_destroy(e); /* keeps the speeds */
    kv_tiers_close(tiers);

    /* 5. restart */
    CHECK_MSG(kv_tiers_open(&to, &tiers, &err) == CAIRN_OK, "%s", err.msg);
    struct kv_tiers_stats ts;
    kv_tiers_stats(tiers, &ts);
    CHECK_EQ_INT(ts.ssd.n_foreign, 0);
    CHECK(ts.ssd.n_blocks >= (uint64_t)(n / BLOCK - 1));
    eo.tiers = kv_tiers_ops(tiers);
    CHECK_MSG(engine_create(m, &eo, &e, &err) == CAIRN_OK, "%s", err.msg);
    static struct collect f2;
    struct engine_request re = collect_request(&f2, p->tokens, n, N_GEN);
    re.ignore_eos = 1;
    CHECK(engine_submit(e, &re, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&f2, 1));
    CHECK_EQ_INT(f2.usage.cached_tokens, 0);
    CHECK_MSG(memcmp(f2.tokens, cold.tokens, sizeof(int32_t) * N_GEN) == 0, "E's tokens differ from cold");
    collect_wait_idle(e, 1);
    get_stats(e, &st);
    CHECK_EQ_INT(st.n_plans_recompute, 1);
    CHECK_EQ_INT(st.n_fetches, 0);
    engine_destroy(e);
    kv_tiers_close(tiers);
    /* a restart that kept the prefill rate but not the disk's speed (a run that never read the
     * disk): the plan restores, the fetch proves the disk slower than recomputing after two
     * blocks and stops; the rest is recomputed, the tokens are the cold run's */
    {
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "for f in '%s'/speeds-*-cpu.json; do printf '{\"prefill_tokens_per_s\": 5000}' > \"$f\"; done", ssd);
        CHECK(system(cmd) == 0);
        CHECK_MSG(kv_tiers_open(&to, &tiers, &err) == CAIRN_OK, "%s", err.msg);
        eo.tiers = kv_tiers_ops(tiers);
        CHECK_MSG(engine_create(m, &eo, &e, &err) == CAIRN_OK, "%s", err.msg);
        static struct collect g;
        struct engine_request rg = collect_request(&g, p->tokens, n, N_GEN);
        rg.ignore_eos = 1;
        CHECK(engine_submit(e, &rg, NULL, &err) == CAIRN_OK);
        CHECK(collect_wait(&g, 1));
        CHECK_MSG(memcmp(g.tokens, cold.tokens, sizeof(int32_t) * N_GEN) == 0, "G's tokens differ from cold");
        collect_wait_idle(e, 1);
        get_stats(e, &st);
        printf("restart, disk unknown: %d of %d prompt tokens restored, fetches %llu (cut %llu)\n",
               g.usage.cached_tokens, n, (unsigned long long)st.n_fetches, (unsigned long long)st.n_fetches_cut);
        CHECK_EQ_INT(st.n_fetches, 1);
        CHECK_EQ_INT(st.n_fetches_cut, 1);
        CHECK_EQ_INT(g.usage.cached_tokens, 2 * BLOCK);
        engine_destroy(e);
        kv_tiers_close(tiers);
    }
    /* a damaged speeds file: none (and no crash) */
    {
        struct kv_tier_ops ops;
        CHECK_MSG(kv_tiers_open(&to, &tiers, &err) == CAIRN_OK, "%s", err.msg);
        ops = kv_tiers_ops(tiers);
        struct kv_tier_speeds sp;
        CHECK(ops.speeds_load && ops.speeds_load(ops.ctx, "cpu", &sp) == 1 && sp.prefill_tok_s > 0 && sp.slow_bps > 0);
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "for f in '%s'/speeds-*-cpu.json; do printf '{\"prefill' > \"$f\"; done", ssd);
        CHECK(system(cmd) == 0);
        CHECK(ops.speeds_load(ops.ctx, "cpu", &sp) == 0 && sp.prefill_tok_s == 0);
        CHECK(ops.speeds_load(ops.ctx, "cuda:0", &sp) == 0); /* another device: none */
        kv_tiers_close(tiers);
    }
    model_free(m);
    backend_close(be);
    tt_rm_rf(ssd);
    return test_summary("test_tiers_fetch");
}
