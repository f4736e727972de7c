/* engine/guard.c: the default limits, all-or-nothing reservations with the numbers of a refusal,
 * measured corrections, waiting for a release, a device budget next to the host one, and KV /
 * recurrent-state sizing of a hybrid model by exact numbers worked out from its config.json
 * (Hugging Face's cache shapes), so attention-free layers are never charged KV.
 *
 * And the model pool's use of them (api/pool.c): the pre-load estimate of a hybrid holds its
 * recurrent-state snapshots by those exact numbers (and the measured hold after the load agrees);
 * a load reports its progress in bytes; through the device-budget seam (opts.device_budget, a
 * device domain on the CPU) a load that does not fit the device budget gets NOMEM naming the
 * device and the numbers, and one that fits only without an idle model evicts that model; on
 * the CPU without the seam there is no device budget. */
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/pool.h"
#include "api/pool_int.h"
#include "base/file.h"
#include "engine/engine.h"
#include "engine/guard.h"
#include "kv/tiers.h"
#include "model/model.h"
#include "test_backend.h"
#include "testlib.h"

#define GIB (1024.0 * 1024 * 1024)

static void test_default_limit(void)
{
    /* RAM less min(8 GiB, 10 %): 90 % below 80 GiB, RAM - 8 GiB above, continuous */
    CHECK_NEAR(engine_guard_default_limit((uint64_t)(16 * GIB)) / GIB, 14.4, 1e-6);
    CHECK_NEAR(engine_guard_default_limit((uint64_t)(80 * GIB)) / GIB, 72.0, 1e-6);
    CHECK_NEAR(engine_guard_default_limit((uint64_t)(128 * GIB)) / GIB, 120.0, 1e-6);
    CHECK_NEAR(engine_guard_default_limit((uint64_t)(8 * GIB)) / GIB, 7.2, 1e-6);
    /* device: total less 1/16, the margin kept between 1 and 4 GiB */
    CHECK_NEAR(engine_guard_default_device_limit((uint64_t)(141 * GIB)) / GIB, 137.0, 1e-6);
    CHECK_NEAR(engine_guard_default_device_limit((uint64_t)(32 * GIB)) / GIB, 30.0, 1e-6);
    CHECK_NEAR(engine_guard_default_device_limit((uint64_t)(24 * GIB)) / GIB, 22.5, 1e-6);
    CHECK_NEAR(engine_guard_default_device_limit((uint64_t)(8 * GIB)) / GIB, 7.0, 1e-6);
    CHECK_EQ_INT(engine_guard_default_device_limit(0), 0); /* unknown size: no default */
}

struct releaser {
    struct engine_guard *g;
    struct engine_guard_hold *h;
};

static void *release_later(void *arg)
{
    struct releaser *r = arg;
    usleep(50 * 1000);
    engine_guard_release(r->g, r->h);
    return NULL;
}

static void count_holds(void *user, const struct engine_guard_hold *h)
{
    (void)h;
    (*(int *)user)++;
}

static void test_reserve(void)
{
    struct engine_guard *g = NULL;
    struct cairn_err err = {0};
    CHECK(engine_guard_create(CAIRN_MEM_HOST, 1000, &g, &err) == CAIRN_OK);
    CHECK_EQ_INT(engine_guard_limit(g), 1000);
    struct engine_guard_hold model, req, big;
    engine_guard_hold_init(&model, "model m", 0);
    engine_guard_hold_init(&req, "request 1", 1);
    engine_guard_hold_init(&big, "request 2", 1);
    uint64_t need[CAIRN_MEM_N_TAGS] = {0};
    need[CAIRN_MEM_WEIGHTS] = 400;
    need[CAIRN_MEM_KV] = 200;
    CHECK(engine_guard_reserve(g, &model, need, NULL, &err) == CAIRN_OK);
    memset(need, 0, sizeof(need));
    need[CAIRN_MEM_STATE] = 150;
    need[CAIRN_MEM_REQUEST] = 50;
    CHECK(engine_guard_reserve(g, &req, need, NULL, &err) == CAIRN_OK);
    struct engine_guard_stats st;
    engine_guard_get_stats(g, &st);
    CHECK_EQ_INT(st.reserved, 800);
    CHECK_EQ_INT(st.transient, 200);
    CHECK_EQ_INT(st.by_cat[CAIRN_MEM_WEIGHTS], 400);
    CHECK_EQ_INT(st.by_cat[CAIRN_MEM_STATE], 150);
    CHECK_EQ_INT(st.n_holds, 2);
    /* 300 do not fit in the 200 left: refused whole, with the numbers */
    memset(need, 0, sizeof(need));
    need[CAIRN_MEM_STATE] = 250;
    need[CAIRN_MEM_REQUEST] = 50;
    struct engine_guard_deny deny;
    CHECK(engine_guard_reserve(g, &big, need, &deny, &err) == CAIRN_ERR_NOMEM);
    CHECK_EQ_INT(deny.need, 300);
    CHECK_EQ_INT(deny.available, 200);
    CHECK_EQ_INT(deny.limit, 1000);
    CHECK_EQ_INT(deny.transient, 200);
    CHECK_MSG(strstr(err.msg, "request 2 needs 300 bytes") && strstr(err.msg, "200 of the 1000"), "%s", err.msg);
    CHECK_EQ_INT(engine_guard_hold_total(&big), 0);
    engine_guard_get_stats(g, &st);
    CHECK_EQ_INT(st.reserved, 800);
    CHECK_EQ_INT(st.n_denied, 1);
    /* nothing released: the wait times out */
    CHECK(engine_guard_wait(g, 0.02) == 0);
    /* a release on another thread wakes the waiter, then the big one fits */
    struct releaser r = {g, &req};
    pthread_t th;
    pthread_create(&th, NULL, release_later, &r);
    CHECK(engine_guard_wait(g, 5.0) == 1);
    pthread_join(th, NULL);
    CHECK(engine_guard_reserve(g, &big, need, NULL, &err) == CAIRN_OK);
    /* a measured correction may pass the limit; later reservations see it */
    engine_guard_set(g, &model, CAIRN_MEM_KV, 500);
    engine_guard_get_stats(g, &st);
    CHECK_EQ_INT(st.reserved, 1200);
    memset(need, 0, sizeof(need));
    need[CAIRN_MEM_OTHER] = 1;
    CHECK(engine_guard_reserve(g, &req, need, NULL, &err) == CAIRN_ERR_NOMEM);
    int n = 0;
    engine_guard_foreach(g, count_holds, &n);
    CHECK_EQ_INT(n, 2);
    engine_guard_release(g, &model);
    engine_guard_release(g, &big);
    engine_guard_release(g, &big); /* twice: no-op */
    engine_guard_get_stats(g, &st);
    CHECK_EQ_INT(st.reserved, 0);
    CHECK_EQ_INT(st.n_holds, 0);
    engine_guard_free(g);
}

static void test_device_budget(void)
{
    /* a GPU backend charges the device domain; the host counters don't move */
    uint64_t host0 = cairn_mem_used_in(CAIRN_MEM_HOST, CAIRN_MEM_KV);
    cairn_mem_charge(CAIRN_MEM_DEVICE, CAIRN_MEM_KV, 4096);
    CHECK_EQ_INT(cairn_mem_used_in(CAIRN_MEM_DEVICE, CAIRN_MEM_KV), 4096);
    CHECK_EQ_INT(cairn_mem_used_in(CAIRN_MEM_HOST, CAIRN_MEM_KV), host0);
    cairn_mem_charge(CAIRN_MEM_DEVICE, CAIRN_MEM_KV, -4096);
    CHECK_EQ_INT(cairn_mem_used_in(CAIRN_MEM_DEVICE, CAIRN_MEM_KV), 0);
    struct engine_guard *dev = NULL;
    struct cairn_err err = {0};
    CHECK(engine_guard_create(CAIRN_MEM_DEVICE, 1 << 20, &dev, &err) == CAIRN_OK);
    struct engine_guard_hold h;
    engine_guard_hold_init(&h, "model m (gpu)", 0);
    uint64_t need[CAIRN_MEM_N_TAGS] = {0};
    need[CAIRN_MEM_KV] = 2 << 20;
    CHECK(engine_guard_reserve(dev, &h, need, NULL, &err) == CAIRN_ERR_NOMEM);
    CHECK_MSG(strstr(err.msg, "device memory") != NULL, "%s", err.msg);
    engine_guard_free(dev);
}

/* ---- the pool over the guard ---- */

/* A model folder for the pool: the oracle model's config and weights, the demo tokenizer (the
 * pool wants one; nothing here tokenizes). */
static void make_model_dir(const char *root, const char *name, const char *oracle, char *out, size_t cap)
{
    char rel[1024], src[PATH_MAX], tok[PATH_MAX], from[PATH_MAX + 100], to[1200];
    snprintf(out, cap, "%s/%s", root, name);
    CHECK(mkdir(out, 0755) == 0);
    /* absolute targets: the links live in /tmp */
    CHECK(realpath(test_src_path(oracle, rel, sizeof(rel)), src) != NULL);
    CHECK(realpath(test_src_path("models/demo/tokenizer.json", rel, sizeof(rel)), tok) != NULL);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof(from), "%s/%s", src, files[i]);
        snprintf(to, sizeof(to), "%s/%s", out, files[i]);
        CHECK(symlink(from, to) == 0);
    }
    snprintf(to, sizeof(to), "%s/tokenizer.json", out);
    CHECK(symlink(tok, to) == 0);
}

static int make_pool_kv(const char *root, const char *const *dirs, int n, int device_budget, uint64_t max_device,
                        uint64_t kv_bytes, struct backend *be, struct pool **p);

static int make_pool(const char *root, const char *const *dirs, int n, int device_budget, uint64_t max_device,
                     struct pool **p)
{
    return make_pool_kv(root, dirs, n, device_budget, max_device, 1 << 20, NULL, p);
}

static const struct kv_tiers_opts *g_tiers; /* make_pool_kv's tiers_opts (NULL: none) */

/* kv_bytes 0: sized by the pool; be NULL: the CPU backend. */
static int make_pool_kv(const char *root, const char *const *dirs, int n, int device_budget, uint64_t max_device,
                        uint64_t kv_bytes, struct backend *be, struct pool **p)
{
    static char settings[1200];
    snprintf(settings, sizeof(settings), "%s/settings.json", root);
    struct api_real_opts o;
    memset(&o, 0, sizeof(o));
    o.models = dirs;
    o.n_models = n;
    o.kv_bytes = kv_bytes;
    o.max_running = 2;
    o.max_batch_tokens = 64;
    o.device = be ? be : test_cpu_be();
    o.device_budget = device_budget;
    o.max_device_memory = max_device;
    o.settings_path = settings;
    o.memory_wait_s = 0.2;
    o.tiers_opts = g_tiers;
    struct cairn_err err = {0};
    int rc = pool_create(&o, p, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    return rc;
}

static void estimate(struct pool *p, int idx, uint64_t host[CAIRN_MEM_N_TAGS], uint64_t dev[CAIRN_MEM_N_TAGS])
{
    pthread_mutex_lock(&p->mu);
    pool_load_estimate(p, idx, host, dev);
    pthread_mutex_unlock(&p->mu);
}

static uint64_t sum_bytes(const uint64_t *b)
{
    uint64_t t = 0;
    for (int i = 0; i < CAIRN_MEM_N_TAGS; i++) t += b[i];
    return t;
}

/* The hybrid's estimate: KV pool as asked, snapshots by engine.c's rule over the exact state. */
static void test_pool_hybrid_estimate(const char *root, uint64_t state, uint64_t kv_per_token)
{
    char dir[1100];
    make_model_dir(root, "h", "tests/data/oracle/models/qwen3_5-tiny", dir, sizeof(dir));
    const char *dirs[] = {dir};
    struct pool *p = NULL;
    if (make_pool(root, dirs, 1, 0, 0, &p)) return;
    CHECK(p->dguard == NULL); /* the CPU has no device budget without the seam */
    uint64_t host[CAIRN_MEM_N_TAGS];
    estimate(p, 0, host, NULL);
    /* 1 MiB of KV in 64-token blocks; snapshots: kv_bytes / 2 over the state, at least 2 per
     * running sequence (2 running), at most one per block, plus the cache's scratch state */
    uint64_t n_blocks = (1 << 20) / (64 * kv_per_token);
    uint64_t n_snap = (512 * 1024) / state;
    if (n_snap < 4) n_snap = 4;
    if (n_snap > n_blocks) n_snap = n_blocks;
    CHECK_EQ_INT(host[CAIRN_MEM_KV], 1 << 20);
    CHECK_EQ_INT(host[CAIRN_MEM_STATE], (n_snap + 1) * state);
    CHECK(host[CAIRN_MEM_STATE] > 0);
    struct cairn_err err = {0};
    int rc = pool_get(p, 0, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    if (rc == CAIRN_OK) {
        /* what was measured after the load agrees with the estimate */
        CHECK_EQ_INT(p->models[0].hold.bytes[CAIRN_MEM_STATE], host[CAIRN_MEM_STATE]);
        CHECK_EQ_INT(p->models[0].hold.bytes[CAIRN_MEM_KV], n_blocks * 64 * kv_per_token);
        /* progress: every byte of the prepared weights, no more than the files hold */
        uint64_t done = p->models[0].progress.bytes_done, total = p->models[0].progress.bytes_total;
        CHECK(total > 0);
        CHECK_EQ_INT(done, total);
        CHECK(total <= model_get_info(p->models[0].m)->weight_bytes);
        pool_put(p, 0);
    }
    pool_destroy(p);
}

/* The hot tier in the estimate: its budget on the CPU; on a device (pinned slabs) its budget
 * plus the two slabs that may be mapped beyond it (kv_tiers_slab_bytes). */
static void test_pool_hot_estimate(const char *root)
{
    char da[1100];
    make_model_dir(root, "ha", "tests/data/oracle/models/llama-tiny", da, sizeof(da));
    const char *dirs[] = {da};
    struct kv_tiers_opts to;
    memset(&to, 0, sizeof(to));
    for (int k = 0; k < 2; k++) {
        to.hot_max_bytes = k ? 8ull << 30 : 64ull << 20; /* slabs of 256 MiB, of hot / 8 */
        CHECK_EQ_INT(kv_tiers_slab_bytes(to.hot_max_bytes), k ? 256u << 20 : 8u << 20);
        for (int dev = 0; dev <= 1; dev++) {
            struct pool *p = NULL;
            g_tiers = &to;
            int rc = make_pool(root, dirs, 1, dev, 1ull << 40, &p);
            g_tiers = NULL;
            if (rc) return;
            uint64_t h[CAIRN_MEM_N_TAGS], d[CAIRN_MEM_N_TAGS];
            estimate(p, 0, h, d);
            pool_destroy(p);
            uint64_t want = to.hot_max_bytes + (dev ? 2 * kv_tiers_slab_bytes(to.hot_max_bytes) : 0);
            CHECK_MSG(h[CAIRN_MEM_HOT] == want, "hot %llu device %d: estimate %llu, want %llu",
                      (unsigned long long)to.hot_max_bytes, dev, (unsigned long long)h[CAIRN_MEM_HOT],
                      (unsigned long long)want);
            CHECK_EQ_INT(d[CAIRN_MEM_HOT], 0);
        }
    }
}

static void test_pool_device_budget(const char *root)
{
    char da[1100], db[1100];
    make_model_dir(root, "da", "tests/data/oracle/models/llama-tiny", da, sizeof(da));
    make_model_dir(root, "db", "tests/data/oracle/models/qwen3-tiny", db, sizeof(db));
    const char *dirs[] = {da, db};
    struct pool *p = NULL;
    /* the estimate on a device: weights, KV, snapshots, workspaces there; mapped files host */
    if (make_pool(root, dirs, 2, 1, 1ull << 40, &p)) return;
    CHECK(p->dguard != NULL);
    uint64_t ha[CAIRN_MEM_N_TAGS], dva[CAIRN_MEM_N_TAGS], hb[CAIRN_MEM_N_TAGS], dvb[CAIRN_MEM_N_TAGS];
    estimate(p, 0, ha, dva);
    estimate(p, 1, hb, dvb);
    pool_destroy(p);
    CHECK_EQ_INT(dva[CAIRN_MEM_KV], 1 << 20);
    CHECK_EQ_INT(ha[CAIRN_MEM_KV], 0);
    CHECK(dva[CAIRN_MEM_WEIGHTS] > 0 && dva[CAIRN_MEM_WEIGHTS] == ha[CAIRN_MEM_MAPPED]);
    CHECK(dva[CAIRN_MEM_SCRATCH] > 0 && ha[CAIRN_MEM_SCRATCH] == 0);
    uint64_t a = sum_bytes(dva), b = sum_bytes(dvb);

    /* a budget one byte short of model a: NOMEM naming the device, nothing left reserved */
    if (make_pool(root, dirs, 2, 1, a - 1, &p)) return;
    struct cairn_err err = {0};
    CHECK(pool_get(p, 0, &err) == CAIRN_ERR_NOMEM);
    char want[160];
    snprintf(want, sizeof(want), "needs %llu bytes of device memory", (unsigned long long)a);
    CHECK_MSG(strstr(err.msg, want) && strstr(err.msg, "--max-device-memory"), "%s", err.msg);
    struct engine_guard_stats hs, ds;
    engine_guard_get_stats(p->guard, &hs);
    engine_guard_get_stats(p->dguard, &ds);
    CHECK_EQ_INT(hs.reserved, 0);
    CHECK_EQ_INT(ds.reserved, 0);
    pool_destroy(p);

    /* room for one of them: loading b evicts the idle a */
    uint64_t one = (a > b ? a : b) + (a < b ? a : b) / 2;
    if (make_pool(root, dirs, 2, 1, one, &p)) return;
    CHECK_MSG(pool_get(p, 0, &err) == CAIRN_OK, "%s", err.msg);
    pool_put(p, 0);
    engine_guard_get_stats(p->dguard, &ds);
    CHECK_EQ_INT(ds.reserved, a); /* a CPU charges nothing to the device: the estimate stays */
    CHECK_MSG(pool_get(p, 1, &err) == CAIRN_OK, "%s", err.msg);
    CHECK_EQ_INT(p->models[0].state, POOL_UNLOADED);
    CHECK_EQ_INT(p->n_evictions, 1);
    engine_guard_get_stats(p->dguard, &ds);
    CHECK_EQ_INT(ds.reserved, b);
    /* a busy b is never evicted: a load of a now fails for the device (after its short wait) */
    CHECK(pool_get(p, 0, &err) == CAIRN_ERR_NOMEM);
    CHECK_MSG(strstr(err.msg, "device memory") != NULL, "%s", err.msg);
    CHECK_EQ_INT(p->models[1].state, POOL_LOADED);
    pool_put(p, 1);
    json_t *mem = pool_memory_json(p);
    json_t *dev = json_object_get(mem, "device");
    CHECK(json_is_object(dev) && json_integer_value(json_object_get(dev, "limit")) == (json_int_t)one);
    CHECK_EQ_STR(json_string_value(json_object_get(dev, "domain")), "device");
    json_decref(mem);
    pool_destroy(p);
}

/* A CPU backend that plays a GPU for the weights: each weight_prepare "uploads" (charges the
 * weight's bytes to the device domain, as the CUDA backend does) and counts what it charged. */
static void ignore_event(void *user, const struct engine_event *ev)
{
    (void)user;
    (void)ev;
}

static struct backend_ops g_up_ops;
static struct backend g_up_be;
static uint64_t g_up_charged;

static uint64_t up_bytes(const struct tensor *w)
{
    return w->dtype == DTYPE_Q ? 0 : (uint64_t)tensor_n_elems(w) * dtype_size(w->dtype);
}

static int up_weight_prepare(struct backend *be, struct tensor *w, int hint, size_t *extra, struct cairn_err *err)
{
    int rc = test_cpu_be()->ops->weight_prepare(be, w, hint, extra, err);
    if (rc == CAIRN_OK) {
        cairn_mem_charge(CAIRN_MEM_DEVICE, CAIRN_MEM_WEIGHTS, (int64_t)up_bytes(w));
        g_up_charged += up_bytes(w);
    }
    return rc;
}

static void up_weight_release(struct backend *be, struct tensor *w)
{
    cairn_mem_charge(CAIRN_MEM_DEVICE, CAIRN_MEM_WEIGHTS, -(int64_t)up_bytes(w));
    test_cpu_be()->ops->weight_release(be, w);
}

static struct backend *uploading_be(void)
{
    g_up_ops = *test_cpu_be()->ops;
    g_up_ops.weight_prepare = up_weight_prepare;
    g_up_ops.weight_release = up_weight_release;
    g_up_be = *test_cpu_be();
    g_up_be.ops = &g_up_ops;
    return &g_up_be;
}

/* Without --kv-cache-size, the KV pool on a device is what the device budget leaves after the
 * model's weights and workspaces, in whole blocks (llama-tiny: 3 layers x 2 KV heads x 32 dims,
 * bf16 K and V = 768 bytes a token, 49152 a 64-token block, from its config.json); a prompt
 * longer than a small pool gets NOMEM (the API's 507); and weights uploaded to the device leave
 * the host budget's mapped-file count. */
static void test_pool_device_kv_sizing(const char *root)
{
    char da[1100];
    make_model_dir(root, "ka", "tests/data/oracle/models/llama-tiny", da, sizeof(da));
    const char *dirs[] = {da};
    const uint64_t per_block = 64ull * 2 * 3 * 2 * 32 * 2;
    struct pool *p = NULL;
    /* the other device categories, from an estimate with the KV size given */
    if (make_pool(root, dirs, 1, 1, 1ull << 40, &p)) return;
    uint64_t h[CAIRN_MEM_N_TAGS], dv[CAIRN_MEM_N_TAGS];
    estimate(p, 0, h, dv);
    pool_destroy(p);
    CHECK_EQ_INT(dv[CAIRN_MEM_STATE], 0);
    uint64_t fixed = sum_bytes(dv) - dv[CAIRN_MEM_KV];

    struct cairn_err err = {0};
    for (int round = 0; round < 2; round++) {
        /* 200.5 blocks left: a 200-block pool (more than one 8192-token context: 128 blocks);
         * then 10.5: a 10-block pool (no idle model to evict for a full context) */
        uint64_t n_want = round == 0 ? 200 : 10;
        uint64_t limit = fixed + n_want * per_block + per_block / 2;
        if (make_pool_kv(root, dirs, 1, 1, limit, 0, round == 0 ? uploading_be() : NULL, &p)) return;
        g_up_charged = 0;
        int rc = pool_get(p, 0, &err);
        CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
        if (rc != CAIRN_OK) {
            pool_destroy(p);
            return;
        }
        struct engine *e = p->models[0].e;
        struct engine_stats st;
        engine_get_stats(e, &st);
        for (int i = 0; i < 500 && st.n_blocks_total == 0; i++) {
            usleep(10000);
            engine_get_stats(e, &st);
        }
        CHECK_EQ_INT(st.n_blocks_total, n_want);
        struct engine_guard_stats ds;
        engine_guard_get_stats(p->dguard, &ds);
        if (round == 0) {
            /* the uploads were measured: the device hold is what was charged, and the host no
             * longer counts the uploaded weights as mapped file pages */
            const struct model_info *mi = model_get_info(p->models[0].m);
            const struct engine_guard_hold *hh = &p->models[0].hold;
            CHECK(g_up_charged > 0);
            CHECK_EQ_INT(p->models[0].dhold.bytes[CAIRN_MEM_WEIGHTS], g_up_charged);
            uint64_t rest = mi->weight_bytes > g_up_charged + hh->bytes[CAIRN_MEM_WEIGHTS]
                                ? mi->weight_bytes - g_up_charged - hh->bytes[CAIRN_MEM_WEIGHTS] : 0;
            CHECK_EQ_INT(hh->bytes[CAIRN_MEM_MAPPED], rest);
            CHECK(hh->bytes[CAIRN_MEM_MAPPED] < mi->weight_bytes);
        } else {
            CHECK_EQ_INT(ds.reserved, fixed + n_want * per_block); /* a CPU charges nothing */
            /* 11 blocks of prompt can never fit 10: NOMEM; 100 tokens can */
            static int32_t prompt[11 * 64];
            for (int i = 0; i < 11 * 64; i++) prompt[i] = 3 + i % 500;
            struct engine_request rq;
            memset(&rq, 0, sizeof(rq));
            rq.prompt = prompt;
            rq.n_prompt = 11 * 64 - 4;
            rq.max_tokens = 1;
            engine_sampling_default(&rq.sampling);
            rq.on_event = ignore_event;
            CHECK_EQ_INT(engine_submit(e, &rq, NULL, &err), CAIRN_ERR_NOMEM);
            rq.n_prompt = 100;
            uint64_t id = 0;
            CHECK_EQ_INT(engine_submit(e, &rq, &id, &err), CAIRN_OK);
        }
        pool_put(p, 0);
        pool_destroy(p);
    }
    /* below one block per running sequence (2) the load fails for the device, with the numbers */
    if (make_pool_kv(root, dirs, 1, 1, fixed + per_block, 0, NULL, &p)) return;
    CHECK(pool_get(p, 0, &err) == CAIRN_ERR_NOMEM);
    CHECK_MSG(strstr(err.msg, "device memory") != NULL, "%s", err.msg);
    pool_destroy(p);
}

static int cfg_int(json_t *c, const char *k)
{
    return (int)json_integer_value(json_object_get(c, k));
}

/* qwen3_5-tiny: two linear-attention (Gated DeltaNet) layers and two full-attention layers. */
static void test_hybrid_sizing(void)
{
    char dir[1024], cfgp[1100];
    test_src_path("tests/data/oracle/models/qwen3_5-tiny", dir, sizeof(dir));
    snprintf(cfgp, sizeof(cfgp), "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(cfgp, 0, &je);
    CHECK_MSG(c != NULL, "%s: %s", cfgp, je.text);
    if (!c) return;
    /* independent of cairn's config parser: count the layer kinds and apply HF's cache shapes */
    json_t *types = json_object_get(c, "layer_types");
    int n_full = 0, n_linear = 0;
    for (size_t i = 0; i < json_array_size(types); i++) {
        const char *t = json_string_value(json_array_get(types, i));
        n_full += !strcmp(t, "full_attention");
        n_linear += !strcmp(t, "linear_attention");
    }
    int kvh = cfg_int(c, "num_key_value_heads"), hd = cfg_int(c, "head_dim");
    int nk = cfg_int(c, "linear_num_key_heads"), nv = cfg_int(c, "linear_num_value_heads");
    int dk = cfg_int(c, "linear_key_head_dim"), dv = cfg_int(c, "linear_value_head_dim");
    int ker = cfg_int(c, "linear_conv_kernel_dim"), vocab = cfg_int(c, "vocab_size");
    int n_layers = cfg_int(c, "num_hidden_layers");
    json_decref(c);
    CHECK_EQ_INT(n_full, 2);
    CHECK_EQ_INT(n_linear, 2);
    /* K and V, bf16, per full-attention layer: [kv_heads, head_dim] per token */
    uint64_t kv_per_token = 2ull * (uint64_t)n_full * (uint64_t)kvh * (uint64_t)hd * 2;
    /* conv state: conv_dim = 2 * key_dim + value_dim channels; HF keeps conv_kernel columns,
     * cairn the kernel - 1 it needs (the newest column is the current input); recurrent state
     * [v_heads, k_dim, v_dim]; both f32 */
    uint64_t conv_dim = 2ull * (uint64_t)nk * (uint64_t)dk + (uint64_t)nv * (uint64_t)dv;
    uint64_t state = (uint64_t)n_linear * 4ull * (conv_dim * (uint64_t)(ker - 1) + (uint64_t)nv * (uint64_t)dk * (uint64_t)dv);

    struct model *m = NULL;
    struct cairn_err err = {0};
    int rc = model_load(dir, test_cpu_be(), &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    if (rc) return;
    const struct model_info *mi = model_get_info(m);
    CHECK_EQ_INT(mi->n_kv_layers, n_full);
    CHECK_EQ_INT(mi->n_layers, n_layers);
    CHECK_EQ_INT(mi->state_bytes, state);
    /* 100 tokens take two 64-token blocks */
    CHECK_EQ_INT(engine_guard_kv_bytes(mi, 64, DTYPE_BF16, 100), 128 * kv_per_token);
    CHECK_EQ_INT(engine_guard_kv_bytes(mi, 64, DTYPE_F32, 64), 64 * kv_per_token * 2);
    CHECK_EQ_INT(engine_guard_kv_bytes(mi, 64, DTYPE_BF16, 0), 0);
    /* counting every layer would double it here (4x on 3:1 hybrids): the false 507s */
    CHECK(engine_guard_kv_bytes(mi, 64, DTYPE_BF16, 100) * (uint64_t)n_layers / (uint64_t)n_full ==
          2 * engine_guard_kv_bytes(mi, 64, DTYPE_BF16, 100));
    uint64_t need[CAIRN_MEM_N_TAGS];
    engine_guard_request_need(mi, 64, 100, need);
    CHECK_EQ_INT(need[CAIRN_MEM_STATE], state);
    CHECK_EQ_INT(need[CAIRN_MEM_REQUEST], 4 * 100 + 4 * 2 + 17ull * (uint64_t)vocab + 4096);
    CHECK_EQ_INT(need[CAIRN_MEM_KV], 0); /* KV comes from the model's pool, reserved at load */
    /* the engine's pool sized the same way: 1 MiB of KV holds 1 MiB / (64 * kv_per_token) blocks */
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_bytes = 1 << 20;
    o.max_batch_tokens = 64;
    o.max_running = 2;
    struct engine *e = NULL;
    uint64_t kv0 = cairn_mem_used(CAIRN_MEM_KV);
    rc = engine_create(m, &o, &e, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    if (rc == CAIRN_OK) {
        /* the scheduler thread publishes the stats once it has started: wait for that (5 s max) */
        struct engine_stats st;
        engine_get_stats(e, &st);
        for (int i = 0; i < 500 && st.n_blocks_total == 0; i++) {
            usleep(10000);
            engine_get_stats(e, &st);
        }
        CHECK_EQ_INT(st.n_blocks_total, (1 << 20) / (64 * kv_per_token));
        CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_KV) - kv0, (uint64_t)st.n_blocks_total * 64 * kv_per_token);
        engine_destroy(e);
    }
    model_free(m);
    /* the snapshots of the prefix cache by the same rule */
    uint64_t n_blocks = 1000, budget = 10 * state;
    CHECK_EQ_INT(engine_guard_snapshot_bytes(state, budget, 2, n_blocks), 11 * state);
    CHECK_EQ_INT(engine_guard_snapshot_bytes(state, budget, 8, n_blocks), 17 * state); /* 2 per running */
    CHECK_EQ_INT(engine_guard_snapshot_bytes(state, budget, 2, 3), 4 * state);        /* one per block */
    CHECK_EQ_INT(engine_guard_snapshot_bytes(0, budget, 2, n_blocks), 0);

    char root[] = "/tmp/cairn-test-guard-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    test_pool_hybrid_estimate(root, state, kv_per_token);
    test_pool_device_budget(root);
    test_pool_hot_estimate(root);
    test_pool_device_kv_sizing(root);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    test_default_limit();
    test_reserve();
    test_device_budget();
    test_hybrid_sizing();
    return test_summary("test_guard");
}
