/* Engine scheduler over a synthetic model (engine_create_ops), fast and deterministic.
 *
 * The fake model writes each token and its position into the KV pool through the block table
 * and, for every position that needs logits, re-reads the whole prefix FROM THE POOL, checks the
 * stored positions, and derives the next token from a hash of the tokens it read. So a wrong
 * block table, a bad prefix hit, a block freed while in use or a lost preemption shows up as a
 * wrong token or a consistency error. The hybrid variant also carries a recurrent "state" (a
 * running hash) that must agree with the KV contents: a wrong snapshot restore is caught. */
#include <stdatomic.h>
#include <unistd.h>

#include "base/hash.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "kv/kv_pool.h"
#include "engine_testutil.h"
#include "testlib.h"

#define FV 97 /* vocab */

struct fake {
    struct model_info info;
    atomic_int n_errors;
    atomic_int n_forward;
    atomic_int n_entered; /* forwards started (incremented before the gate) */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    int gate_closed;
    int fail_next; /* forward returns an error once */
    int fail_code; /* ... this one (0: CAIRN_ERR_INTERNAL) */
    atomic_int n_sampled; /* rows the forward sampled itself (model_seq.sample) */
    int us_step, us_token; /* the forward sleeps us_step + us_token per token (0: no sleep) */
};

static uint64_t fake_mix(uint64_t h, int32_t t) { return (h ^ (uint64_t)(t + 1)) * 0x100000001b3ull; }

/* The reference: next token after tokens[0..n). */
static int32_t fake_ref_next(const int32_t *tokens, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) h = fake_mix(h, tokens[i]);
    return (int32_t)((h >> 17) % (FV - 1)); /* never FV-1 (used as EOS in one test) */
}

static const struct model_info *fake_info(void *ctx) { return &((struct fake *)ctx)->info; }

static void fake_state_init(void *ctx, void *state) { *(uint64_t *)state = 0xcbf29ce484222325ull; }

static int fake_forward(void *ctx, struct kv_pool *kv, const struct model_seq *seqs, int n_seqs,
                        struct cairn_err *err)
{
    struct fake *f = ctx;
    atomic_fetch_add(&f->n_entered, 1);
    pthread_mutex_lock(&f->gate_mu);
    while (f->gate_closed) pthread_cond_wait(&f->gate_cv, &f->gate_mu);
    int fail = f->fail_next, code = f->fail_code ? f->fail_code : CAIRN_ERR_INTERNAL;
    f->fail_next = 0;
    pthread_mutex_unlock(&f->gate_mu);
    atomic_fetch_add(&f->n_forward, 1);
    if (fail) return cairn_err_set(err, code, "fake forward failure");
    if (f->us_step || f->us_token) {
        int n_tok = 0;
        for (int si = 0; si < n_seqs; si++) n_tok += seqs[si].n_tokens;
        usleep((useconds_t)(f->us_step + f->us_token * n_tok));
    }
    int bs = kv->block_size;
    for (int si = 0; si < n_seqs; si++) {
        const struct model_seq *s = &seqs[si];
        for (int i = 0; i < s->n_tokens; i++) {
            int p = s->pos0 + i;
            int b = s->block_table[p / bs];
            for (int l = 0; l < kv->n_layers; l++) {
                float *k = (float *)kv_pool_k(kv, b, l) + (p % bs) * 2;
                float *v = (float *)kv_pool_v(kv, b, l) + (p % bs) * 2;
                k[0] = (float)s->tokens[i];
                k[1] = (float)p;
                v[0] = (float)(s->tokens[i] * 2 + l);
                v[1] = (float)-p;
            }
            if (s->state) *(uint64_t *)s->state = fake_mix(*(uint64_t *)s->state, s->tokens[i]);
            int r = i - (s->n_tokens - s->n_logits);
            if (r < 0) continue;
            /* re-read positions [0, p] from the pool */
            uint64_t h = 0xcbf29ce484222325ull;
            for (int q = 0; q <= p; q++) {
                int bq = s->block_table[q / bs];
                for (int l = 0; l < kv->n_layers; l++) {
                    const float *k = (const float *)kv_pool_k(kv, bq, l) + (q % bs) * 2;
                    const float *v = (const float *)kv_pool_v(kv, bq, l) + (q % bs) * 2;
                    if (k[1] != (float)q || v[1] != (float)-q || v[0] != k[0] * 2 + (float)l)
                        atomic_fetch_add(&f->n_errors, 1);
                }
                const float *k0 = (const float *)kv_pool_k(kv, bq, 0) + (q % bs) * 2;
                h = fake_mix(h, (int32_t)k0[0]);
            }
            if (s->state && *(uint64_t *)s->state != h) atomic_fetch_add(&f->n_errors, 1);
            int32_t target = (int32_t)((h >> 17) % (FV - 1));
            float *lg = s->logits + (size_t)r * FV;
            for (int j = 0; j < FV; j++) {
                int d = abs(j - target);
                lg[j] = -0.35f * (float)d;
            }
            if (s->sample) {
                /* a device sample op, played by the host reference of its semantics; the
                 * logits then must not be looked at by the engine: spoil them */
                CHECK(s->n_logits == 1 && s->sample_out);
                if (sampler_row_reference(lg, FV, s->sample, s->sample_out) != CAIRN_OK)
                    atomic_fetch_add(&f->n_errors, 1);
                for (int j = 0; j < FV; j++) lg[j] = NAN;
                atomic_fetch_add(&f->n_sampled, 1);
            }
        }
    }
    return CAIRN_OK;
}

static void fake_init(struct fake *f, size_t state_bytes)
{
    memset(f, 0, sizeof(*f));
    f->info.arch = MODEL_ARCH_LLAMA;
    snprintf(f->info.model_type, sizeof(f->info.model_type), "fake");
    f->info.vocab_size = FV;
    f->info.n_layers = 2;
    f->info.n_kv_layers = 2;
    f->info.n_heads = 1;
    f->info.n_kv_heads = 1;
    f->info.head_dim = 2;
    f->info.max_position = 512;
    f->info.bos_id = -1;
    f->info.state_bytes = state_bytes;
    cairn_sha256("fake-model", 10, f->info.identity);
    pthread_mutex_init(&f->gate_mu, NULL);
    pthread_cond_init(&f->gate_cv, NULL);
}

/* waits until a forward has started (and is held at the closed gate) */
static void fake_wait_entered(struct fake *f, int n)
{
    for (int i = 0; i < 20000 && atomic_load(&f->n_entered) < n; i++) usleep(1000);
    CHECK(atomic_load(&f->n_entered) >= n);
}

static void fake_gate(struct fake *f, int closed)
{
    pthread_mutex_lock(&f->gate_mu);
    f->gate_closed = closed;
    pthread_cond_broadcast(&f->gate_cv);
    pthread_mutex_unlock(&f->gate_mu);
}

/* detok: id -> one letter, 'a' + id % 26 */
static char detok_buf[8];
static void *detok_new(void *ctx) { return detok_buf; }
static int detok_feed(void *stream, int32_t id, const char **text, size_t *len)
{
    char *b = stream;
    b[0] = (char)('a' + id % 26);
    *len = 1;
    *text = b;
    return 0;
}
static int detok_flush(void *stream, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    return 0;
}
static void detok_free(void *stream) {}

static struct engine *make_engine_ops(struct fake *f, int block_size, int n_blocks, int batch, int running,
                                      int can_sample)
{
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_dtype = DTYPE_F32;
    o.block_size = block_size;
    o.kv_bytes = (uint64_t)n_blocks * 2 * 2 * (uint64_t)block_size * 2 * sizeof(float);
    o.max_batch_tokens = batch;
    o.max_running = running;
    o.detok = (struct engine_detok){NULL, detok_new, detok_feed, detok_flush, detok_free};
    struct engine_model_ops ops = {f, fake_info, NULL, fake_forward, f->info.state_bytes ? fake_state_init : NULL, NULL, NULL, 0, NULL};
    ops.can_sample = can_sample;
    struct engine *e = NULL;
    struct cairn_err err = {0};
    int rc = engine_create_ops(&ops, &o, &e, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    return e;
}

static struct engine *make_engine(struct fake *f, int block_size, int n_blocks, int batch, int running)
{
    return make_engine_ops(f, block_size, n_blocks, batch, running, 0);
}

static void make_prompt(int32_t *p, int n, int seed)
{
    for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 31 + seed * 17 + (i * i) % 7) % (FV - 1));
}

/* checks collected greedy tokens against the reference continuation */
static int check_ref(const int32_t *prompt, int n_prompt, const struct collect *c)
{
    int32_t all[1024];
    memcpy(all, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int n = n_prompt;
    for (int i = 0; i < c->n_tokens; i++) {
        int32_t want = fake_ref_next(all, n);
        if (c->tokens[i] != want) return 0;
        all[n++] = c->tokens[i];
    }
    return 1;
}

static int same_collect(const struct collect *a, const struct collect *b)
{
    return a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n_tokens) == 0;
}

static void test_concurrent_greedy(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 256, 32, 8);
    enum { N = 8 };
    static int32_t prompts[N][80];
    static struct collect c[N];
    int lens[N] = {1, 5, 8, 9, 16, 33, 64, 71};
    fake_gate(&f, 1); /* all are queued before the first step ends: they really share steps */
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], lens[i], i);
        struct engine_request r = collect_request(&c[i], prompts[i], lens[i], 20);
        CHECK(engine_submit(e, &r, &c[i].id, NULL) == CAIRN_OK);
    }
    fake_gate(&f, 0);
    CHECK(collect_wait(c, N));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(c[i].n_tokens, 20);
        CHECK_EQ_INT(c[i].finish, ENGINE_FINISH_LENGTH);
        CHECK_MSG(check_ref(prompts[i], lens[i], &c[i]), "request %d tokens differ from the reference", i);
        CHECK_EQ_INT(c[i].usage.prompt_tokens, lens[i]);
        CHECK_EQ_INT(c[i].usage.completion_tokens, 20);
        CHECK_EQ_INT(c[i].n_done_events, 1);
        CHECK_EQ_INT(c[i].n_text, 20); /* one letter per token */
    }
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    collect_wait_idle(e, N);
    struct engine_stats st;
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_requests_done, N);
    CHECK_EQ_INT(st.n_generated_tokens, N * 20);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    CHECK_EQ_INT(st.n_blocks_free + st.n_blocks_cached, st.n_blocks_total);
    CHECK(st.n_blocks_cached > 0);
    engine_cache_clear(e);
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_blocks_cached, 0);
    CHECK_EQ_INT(st.n_blocks_free, st.n_blocks_total);
    engine_destroy(e);
}

static void test_prefix_reuse(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 256, 64, 4);
    static int32_t p[120];
    make_prompt(p, 120, 3);
    struct collect a, b, c2;
    struct engine_request r = collect_request(&a, p, 40, 19);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&a, 1));
    CHECK_EQ_INT(a.usage.cached_tokens, 0);
    /* same prompt: floor(39 / 8) * 8 = 32 tokens from cache, same output */
    r = collect_request(&b, p, 40, 19);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&b, 1));
    CHECK_EQ_INT(b.usage.cached_tokens, 32);
    CHECK(b.n_tokens == a.n_tokens && memcmp(a.tokens, b.tokens, sizeof(int32_t) * (size_t)a.n_tokens) == 0);
    /* multi-turn: prompt = first prompt + the answer + more: answer blocks are cached too
     * (40 + 19 generated = 59 tokens, 58 in KV -> 7 full blocks = 56 tokens) */
    int32_t p2[100];
    memcpy(p2, p, 40 * sizeof(int32_t));
    memcpy(p2 + 40, a.tokens, 19 * sizeof(int32_t));
    make_prompt(p2 + 59, 20, 9);
    r = collect_request(&c2, p2, 79, 10);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&c2, 1));
    CHECK_EQ_INT(c2.usage.cached_tokens, 56);
    CHECK(check_ref(p2, 79, &c2));
    /* a salt isolates */
    struct collect d;
    r = collect_request(&d, p, 40, 3);
    r.cache_salt[0] = 7;
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&d, 1));
    CHECK_EQ_INT(d.usage.cached_tokens, 0);
    CHECK(check_ref(p, 40, &d));
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    collect_wait_idle(e, 4);
    struct engine_stats st;
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_prefix_lookups, 4);
    CHECK_EQ_INT(st.n_prefix_hits, 2);
    CHECK_EQ_INT(st.n_cached_tokens, 32 + 56);
    engine_destroy(e);
}

static void test_shared_prompt_once(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 256, 512, 8);
    enum { N = 4 };
    static int32_t p[N][60];
    static struct collect c[N];
    /* the forward waits until all are queued, so they prefill in the same step (no prefix hit
     * possible): the shared blocks are deduplicated at publish time */
    fake_gate(&f, 1);
    struct collect warm;
    int32_t one = 1;
    struct engine_request r = collect_request(&warm, &one, 1, 1);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    fake_wait_entered(&f, 1);
    for (int i = 0; i < N; i++) {
        make_prompt(p[i], 48, 100); /* same 48-token system prompt */
        make_prompt(p[i] + 48, 5, i);
        r = collect_request(&c[i], p[i], 53, 1);
        CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    }
    fake_gate(&f, 0);
    CHECK(collect_wait(c, N));
    CHECK(collect_wait(&warm, 1));
    for (int i = 0; i < N; i++) CHECK(check_ref(p[i], 53, &c[i]));
    collect_wait_idle(e, N + 1);
    struct engine_stats st;
    engine_get_stats(e, &st);
    /* 6 full blocks of system prompt, stored once; each request's 53rd token is in a partial
     * block (not cached) */
    CHECK_EQ_INT(st.n_blocks_cached, 6);
    CHECK_EQ_INT(st.n_shared_blocks, 6 * (N - 1));
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    engine_destroy(e);
}

static void test_preemption(void)
{
    struct fake f;
    fake_init(&f, 0);
    /* 12 blocks of 8 = 96 positions; 6 requests of 20 + 30 tokens need 7 blocks each */
    struct engine *e = make_engine(&f, 8, 12, 64, 6);
    enum { N = 6 };
    static int32_t p[N][20];
    static struct collect c[N];
    fake_gate(&f, 1);
    for (int i = 0; i < N; i++) {
        make_prompt(p[i], 20, 40 + i);
        struct engine_request r = collect_request(&c[i], p[i], 20, 30);
        CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    }
    fake_gate(&f, 0);
    CHECK(collect_wait(c, N));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(c[i].n_tokens, 30);
        CHECK_EQ_INT(c[i].finish, ENGINE_FINISH_LENGTH);
        CHECK_MSG(check_ref(p[i], 20, &c[i]), "request %d", i);
        CHECK_EQ_INT(c[i].usage.completion_tokens, 30);
    }
    collect_wait_idle(e, N);
    struct engine_stats st;
    engine_get_stats(e, &st);
    CHECK(st.n_preemptions > 0);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    /* a single sequence longer than the whole pool ends with LENGTH, not a hang */
    struct collect big;
    static int32_t bp[90];
    make_prompt(bp, 90, 5);
    struct engine_request r = collect_request(&big, bp, 90, 40);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&big, 1));
    CHECK_EQ_INT(big.finish, ENGINE_FINISH_LENGTH);
    CHECK(big.n_tokens >= 6 && big.n_tokens < 40);
    CHECK(check_ref(bp, 90, &big));
    engine_destroy(e);
    printf("preemptions: %llu\n", (unsigned long long)st.n_preemptions);
}

static void test_cancel(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 128, 64, 1);
    int32_t p[10];
    make_prompt(p, 10, 1);
    struct collect a, b;
    struct engine_request r = collect_request(&a, p, 10, 0); /* until the context (512) */
    a.cancel_engine = e;
    a.cancel_after = 5;
    r.user = &a;
    fake_gate(&f, 1); /* hold the first step so b's cancel is queued before a can finish */
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    fake_wait_entered(&f, 1);
    /* b waits behind a (max_running 1) and is cancelled from here */
    struct engine_request rb = collect_request(&b, p, 10, 5);
    uint64_t idb = 0;
    CHECK(engine_submit(e, &rb, &idb, NULL) == CAIRN_OK);
    engine_cancel(e, idb);
    engine_cancel(e, 123456); /* unknown: ignored */
    fake_gate(&f, 0);
    CHECK(collect_wait(&a, 1));
    CHECK(collect_wait(&b, 1));
    CHECK_EQ_INT(a.finish, ENGINE_FINISH_CANCELLED);
    CHECK(a.n_tokens >= 5 && a.n_tokens < 20);
    CHECK_EQ_INT(b.finish, ENGINE_FINISH_CANCELLED);
    CHECK_EQ_INT(a.n_done_events, 1);
    collect_wait_idle(e, 2);
    struct engine_stats st;
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    CHECK_EQ_INT(st.n_running, 0);
    /* destroy cancels what is in flight */
    fake_gate(&f, 1);
    struct collect c[3];
    for (int i = 0; i < 3; i++) {
        r = collect_request(&c[i], p, 10, 100);
        CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    }
    usleep(10000);
    fake_gate(&f, 0);
    engine_destroy(e);
    for (int i = 0; i < 3; i++) {
        CHECK(c[i].done);
        CHECK_EQ_INT(c[i].n_done_events, 1);
    }
}

/* A client gone during a long prefill: the sequence is dropped at the next step boundary, even
 * mid-prefill, so at most the chunk in flight is computed (issue 16: four 20K-token prompts kept
 * the server busy 3.5 s after their clients left). */
static void test_cancel_mid_prefill(void)
{
    struct fake f;
    fake_init(&f, 0);
    int chunk = 32, n_prompt = 480; /* 15 prefill chunks */
    struct engine *e = make_engine(&f, 8, 128, chunk, 4);
    int32_t p[480];
    make_prompt(p, n_prompt, 7);
    struct collect a;
    struct engine_request r = collect_request(&a, p, n_prompt, 4);
    uint64_t id = 0;
    fake_gate(&f, 1);
    CHECK(engine_submit(e, &r, &id, NULL) == CAIRN_OK);
    fake_wait_entered(&f, 1); /* chunk 1 of 15 is in the forward */
    engine_cancel(e, id);
    fake_gate(&f, 0);
    CHECK(collect_wait(&a, 1));
    collect_wait_idle(e, 1);
    CHECK_EQ_INT(a.finish, ENGINE_FINISH_CANCELLED);
    CHECK_EQ_INT(a.n_tokens, 0);
    CHECK_MSG(atomic_load(&f.n_forward) == 1, "%d forwards ran for a request cancelled during its first chunk",
              atomic_load(&f.n_forward));
    struct engine_stats st;
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_running, 0);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    /* the engine goes on: the same prompt again runs to the end (reusing the cancelled
     * sequence's published chunk) */
    struct collect b;
    r = collect_request(&b, p, n_prompt, 4);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&b, 1));
    CHECK_EQ_INT(b.finish, ENGINE_FINISH_LENGTH);
    CHECK_EQ_INT(b.n_tokens, 4);
    CHECK_EQ_INT(b.tokens[0], fake_ref_next(p, n_prompt));
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    engine_destroy(e);
}

static void test_seeded_batch_independent(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 256, 64, 8);
    int32_t p[12];
    make_prompt(p, 12, 77);
    struct collect alone;
    struct engine_request r = collect_request(&alone, p, 12, 40);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 42;
    r.sampling.has_seed = 1;
    r.sampling.logprobs = 1;
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&alone, 1));
    CHECK(!check_ref(p, 12, &alone)); /* really sampled, not greedy */
    static struct collect c[6];
    static int32_t po[6][30];
    fake_gate(&f, 1);
    for (int i = 0; i < 6; i++) {
        if (i == 3) {
            r = collect_request(&c[i], p, 12, 40);
            r.sampling.temperature = 1.0f;
            r.sampling.seed = 42;
            r.sampling.has_seed = 1;
            r.sampling.logprobs = 1;
        } else {
            make_prompt(po[i], 30 - i, i);
            r = collect_request(&c[i], po[i], 30 - i, 25);
            r.sampling.temperature = 0.8f;
        }
        CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    }
    fake_gate(&f, 0);
    CHECK(collect_wait(c, 6));
    CHECK_EQ_INT(c[3].n_tokens, 40);
    CHECK(memcmp(c[3].tokens, alone.tokens, 40 * sizeof(int32_t)) == 0);
    CHECK(memcmp(c[3].logprobs, alone.logprobs, 40 * sizeof(float)) == 0);
    CHECK(alone.logprobs[0] < 0.0f);
    engine_destroy(e);
}

/* The engine with a forward that samples (ops.can_sample: a backend's sample op) gives the
 * same tokens and logprobs as the engine sampling downloaded logits, request by request, in one
 * batch with every kind of row: greedy, seeded temperature, penalties, bias, min_p, logprobs
 * (sampled by the forward) and top-k / top-p (still sampled on the host). */
static void test_device_sampling(void)
{
    enum { NR = 10 };
    static struct collect c[2][NR];
    static int32_t po[NR][40];
    struct engine_logit_bias lb[2] = {{3, 2.0f}, {11, -1.5f}};
    int n_device[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) {
        struct fake f;
        fake_init(&f, 0);
        struct engine *e = make_engine_ops(&f, 8, 512, 128, NR, pass);
        fake_gate(&f, 1);
        for (int i = 0; i < NR; i++) {
            make_prompt(po[i], 20 + i, 50 + i);
            struct engine_request r = collect_request(&c[pass][i], po[i], 20 + i, 30);
            r.sampling.seed = 1000 + (uint64_t)i;
            r.sampling.has_seed = 1;
            switch (i) {
            case 0: break; /* greedy */
            case 1: r.sampling.temperature = 1.0f; r.sampling.logprobs = 1; break;
            case 2: r.sampling.temperature = 0.7f; r.sampling.top_logprobs = 5; break;
            case 3: r.sampling.temperature = 1.2f; r.sampling.repetition_penalty = 1.4f; break;
            case 4:
                r.sampling.temperature = 0.9f;
                r.sampling.presence_penalty = 0.5f;
                r.sampling.frequency_penalty = 0.3f;
                break;
            case 5:
                r.sampling.temperature = 1.0f;
                r.sampling.logit_bias = lb;
                r.sampling.n_logit_bias = 2;
                r.sampling.min_p = 0.1f;
                break;
            case 6: r.sampling.repetition_penalty = 1.3f; r.sampling.logprobs = 1; break; /* greedy */
            case 7: r.sampling.temperature = 1.0f; r.sampling.top_k = 4; break;        /* host */
            case 8: r.sampling.temperature = 1.0f; r.sampling.top_p = 0.8f; break;     /* host */
            default: r.sampling.temperature = 1.5f; r.sampling.min_p = 0.3f; r.sampling.logprobs = 1; break;
            }
            CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
        }
        fake_gate(&f, 0);
        CHECK(collect_wait(c[pass], NR));
        collect_wait_idle(e, NR);
        struct engine_stats st;
        engine_get_stats(e, &st);
        n_device[pass] = atomic_load(&f.n_sampled);
        CHECK_EQ_INT(st.n_rows_device, (uint64_t)n_device[pass]);
        CHECK_EQ_INT(st.n_rows_host + st.n_rows_device, (uint64_t)(NR * 30));
        CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
        engine_destroy(e);
    }
    CHECK_EQ_INT(n_device[0], 0);
    CHECK_EQ_INT(n_device[1], (NR - 2) * 30); /* all but the top-k and top-p requests */
    for (int i = 0; i < NR; i++) {
        CHECK_EQ_INT(c[0][i].n_tokens, 30);
        CHECK_MSG(c[0][i].n_tokens == c[1][i].n_tokens &&
                      memcmp(c[0][i].tokens, c[1][i].tokens, sizeof(int32_t) * (size_t)c[0][i].n_tokens) == 0,
                  "request %d: tokens differ with device sampling", i);
        CHECK_MSG(memcmp(c[0][i].logprobs, c[1][i].logprobs, sizeof(float) * (size_t)c[0][i].n_tokens) == 0,
                  "request %d: logprobs differ", i);
    }
    CHECK(!check_ref(po[1], 21, &c[1][1])); /* really sampled */
}

static void test_stops(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 64, 64, 4);
    int32_t p[6];
    make_prompt(p, 6, 11);
    /* reference continuation and its text */
    int32_t all[64];
    memcpy(all, p, sizeof(p));
    char text[64];
    for (int i = 0; i < 20; i++) {
        all[6 + i] = fake_ref_next(all, 6 + i);
        text[i] = (char)('a' + all[6 + i] % 26);
    }
    text[20] = 0;
    /* stop string = letters 5..7 of the reference text: output = first 5 letters */
    char stop[4];
    memcpy(stop, text + 5, 3);
    stop[3] = 0;
    const char *stops[] = {stop};
    struct collect a;
    struct engine_request r = collect_request(&a, p, 6, 20);
    r.stop = stops;
    r.n_stop = 1;
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&a, 1));
    CHECK_EQ_INT(a.finish, ENGINE_FINISH_STOP);
    CHECK_EQ_STR(a.stop_text, stop);
    /* the stop string might also occur earlier in the text; find its first occurrence */
    char *first = strstr(text, stop);
    CHECK(first != NULL);
    size_t cut = (size_t)(first - text);
    CHECK_EQ_INT(a.n_text, cut);
    CHECK(strncmp(a.text, text, cut) == 0);
    CHECK_EQ_INT(a.n_tokens, (int)cut + 3);
    /* stop id: the 4th reference token */
    struct collect b;
    r = collect_request(&b, p, 6, 20);
    r.stop_ids = &all[6 + 3];
    r.n_stop_ids = 1;
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&b, 1));
    CHECK_EQ_INT(b.finish, ENGINE_FINISH_STOP);
    CHECK_EQ_INT(b.stop_token, all[6 + 3]);
    int first_id = 0;
    while (all[6 + first_id] != all[6 + 3]) first_id++;
    CHECK_EQ_INT(b.n_tokens, first_id + 1);
    engine_destroy(e);

    /* model EOS (vocab - 1, forced with logit_bias) and ignore_eos */
    fake_init(&f, 0);
    f.info.eos_ids[0] = FV - 1;
    f.info.n_eos = 1;
    e = make_engine(&f, 8, 64, 64, 4);
    struct engine_logit_bias lb = {FV - 1, 100.0f};
    struct collect c;
    r = collect_request(&c, p, 6, 10);
    r.sampling.logit_bias = &lb;
    r.sampling.n_logit_bias = 1;
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&c, 1));
    CHECK_EQ_INT(c.finish, ENGINE_FINISH_STOP);
    CHECK_EQ_INT(c.stop_token, FV - 1);
    CHECK_EQ_INT(c.n_tokens, 1);
    CHECK_EQ_INT(c.n_text, 0); /* EOS text is not released */
    r = collect_request(&c, p, 6, 10);
    r.sampling.logit_bias = &lb;
    r.sampling.n_logit_bias = 1;
    r.ignore_eos = 1;
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&c, 1));
    CHECK_EQ_INT(c.finish, ENGINE_FINISH_LENGTH);
    CHECK_EQ_INT(c.n_tokens, 10);
    engine_destroy(e);
}

static void test_submit_errors(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 8, 64, 1); /* 64 positions */
    struct cairn_err err = {0};
    int32_t p[600];
    make_prompt(p, 600, 2);
    struct collect c;
    struct engine_request r = collect_request(&c, p, 10, 5);
    p[3] = FV;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "prompt"));
    p[3] = 1;
    r.sampling.top_p = 1.5f;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "top_p"));
    r.sampling.top_p = 1;
    r.max_tokens = -1;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "max_tokens"));
    r.max_tokens = 5;
    const char *empty[] = {""};
    r.stop = empty;
    r.n_stop = 1;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "stop"));
    r.n_stop = 0;
    r.n_prompt = 0;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "prompt"));
    r.n_prompt = 512; /* = context length */
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_LIMIT);
    r.n_prompt = 65; /* > 8 blocks of 8 */
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_NOMEM);
    engine_destroy(e);

    /* BUSY: the forward is blocked, max_waiting 2 */
    fake_init(&f, 0);
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_dtype = DTYPE_F32;
    o.block_size = 8;
    o.kv_bytes = 1 << 20;
    o.max_running = 1;
    o.max_waiting = 2;
    struct engine_model_ops ops = {&f, fake_info, NULL, fake_forward, NULL, NULL, NULL, 0, NULL};
    CHECK(engine_create_ops(&ops, &o, &e, &err) == CAIRN_OK);
    fake_gate(&f, 1);
    struct collect cs[4];
    r = collect_request(&cs[0], p, 10, 3);
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    fake_wait_entered(&f, 1); /* the first one is in the (blocked) step */
    int n_ok = 1, n_busy = 0;
    for (int i = 1; i < 4; i++) {
        r = collect_request(&cs[i], p, 10, 3);
        int rc = engine_submit(e, &r, NULL, &err);
        if (rc == CAIRN_OK) n_ok++;
        else if (rc == CAIRN_ERR_BUSY) n_busy++, cs[i].done = 1;
    }
    CHECK_EQ_INT(n_ok, 3);
    CHECK_EQ_INT(n_busy, 1);
    fake_gate(&f, 0);
    CHECK(collect_wait(cs, 4));
    /* a failing forward ends the batch with ERROR and the engine goes on */
    f.fail_next = 1;
    struct collect x;
    r = collect_request(&x, p, 10, 3);
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&x, 1));
    CHECK_EQ_INT(x.finish, ENGINE_FINISH_ERROR);
    r = collect_request(&x, p, 10, 3);
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&x, 1));
    CHECK_EQ_INT(x.finish, ENGINE_FINISH_LENGTH);
    CHECK(check_ref(p, 10, &x));
    engine_destroy(e);
}

/* A step that fails with CAIRN_ERR_DEVICE (a device wait past the step timeout): every running
 * and queued request ends ERROR with error_code CAIRN_ERR_DEVICE and the reason, later submits
 * fail with CAIRN_ERR_DEVICE, engine_failed says why, and no step runs any more. */
static void test_device_failure(void)
{
    struct fake f;
    fake_init(&f, 0);
    struct engine *e = make_engine(&f, 8, 64, 64, 2);
    static int32_t p[40];
    make_prompt(p, 40, 5);
    fake_gate(&f, 1);
    static struct collect cs[4];
    for (int i = 0; i < 4; i++) {
        struct engine_request r = collect_request(&cs[i], p, 20 + i, 50);
        CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    }
    for (int i = 0; i < 2000 && atomic_load(&f.n_entered) == 0; i++) usleep(1000);
    pthread_mutex_lock(&f.gate_mu);
    f.fail_next = 1;
    f.fail_code = CAIRN_ERR_DEVICE;
    pthread_mutex_unlock(&f.gate_mu);
    fake_gate(&f, 0);
    CHECK(collect_wait(cs, 4));
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(cs[i].finish, ENGINE_FINISH_ERROR);
        CHECK_EQ_INT(cs[i].error_code, CAIRN_ERR_DEVICE);
        CHECK_MSG(strstr(cs[i].error, "fake forward failure") != NULL, "%s", cs[i].error);
        CHECK_EQ_INT(cs[i].n_done_events, 1);
    }
    char why[256] = "";
    CHECK_EQ_INT(engine_failed(e, why, sizeof(why)), 1);
    CHECK_MSG(strstr(why, "fake forward failure") != NULL, "%s", why);
    int n_fwd = atomic_load(&f.n_forward);
    struct collect x;
    struct engine_request r = collect_request(&x, p, 10, 3);
    struct cairn_err err = {0};
    CHECK_EQ_INT(engine_submit(e, &r, NULL, &err), CAIRN_ERR_DEVICE);
    CHECK_MSG(strstr(err.msg, "reloaded") != NULL, "%s", err.msg);
    usleep(20000);
    CHECK_EQ_INT(atomic_load(&f.n_forward), n_fwd);
    struct engine_stats st;
    collect_wait_idle(e, 4);
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    engine_destroy(e);
}

static void test_hybrid_prefix(void)
{
    struct fake f;
    fake_init(&f, sizeof(uint64_t));
    struct engine *e = make_engine(&f, 8, 128, 16, 4); /* small budget: several chunks */
    static int32_t p[100];
    make_prompt(p, 100, 21);
    struct collect a, b, c;
    struct engine_request r = collect_request(&a, p, 45, 5);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&a, 1));
    CHECK(check_ref(p, 45, &a));
    /* the same prompt + more: reuse up to the snapshot at 40 (the prompt's last boundary) */
    r = collect_request(&b, p, 60, 5);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&b, 1));
    CHECK_EQ_INT(b.usage.cached_tokens, 40);
    CHECK(check_ref(p, 60, &b));
    /* chunks ending at 16 and 32 (budget 16) left snapshots too: a prompt diverging at 35 gets 32 */
    int32_t q[50];
    memcpy(q, p, sizeof(q));
    q[35] = (q[35] + 1) % (FV - 1);
    r = collect_request(&c, q, 50, 5);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&c, 1));
    CHECK_EQ_INT(c.usage.cached_tokens, 32);
    CHECK(check_ref(q, 50, &c));
    /* a block-aligned prompt (64) sent twice: the chunk was also cut at 56 so the repeat reuses 56 */
    struct collect d1, d2;
    int32_t w[64];
    make_prompt(w, 64, 99);
    engine_destroy(e);
    e = make_engine(&f, 8, 128, 256, 4);
    r = collect_request(&d1, w, 64, 3);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&d1, 1));
    r = collect_request(&d2, w, 64, 3);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&d2, 1));
    CHECK_EQ_INT(d2.usage.cached_tokens, 56);
    CHECK(check_ref(w, 64, &d2) && same_collect(&d1, &d2));
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    engine_destroy(e);
}


/* A RAM "lower tier" behind the engine: keeps evicted blocks and hands them back. */
struct ram_tier {
    int n_publish, n_evict, n_lookup, n_hit;
    int n;
    uint8_t hash[64][32];
    int32_t tokens[64][8];
    float *k[64], *v[64];
    uint64_t state[64];
    int has_state[64];
};

static void ram_on_publish(void *ctx, const struct kv_block_desc *b)
{
    ((struct ram_tier *)ctx)->n_publish++;
}

static void ram_on_evict(void *ctx, const struct kv_block_desc *b)
{
    struct ram_tier *t = ctx;
    t->n_evict++;
    if (t->n >= 64 || b->n_tokens != 8) return;
    int i = t->n++;
    memcpy(t->hash[i], b->hash, 32);
    memcpy(t->tokens[i], b->tokens, 8 * sizeof(int32_t));
    t->k[i] = malloc(b->block_bytes);
    t->v[i] = malloc(b->block_bytes);
    memcpy(t->k[i], b->k, b->block_bytes);
    memcpy(t->v[i], b->v, b->block_bytes);
    t->has_state[i] = b->state != NULL;
    if (b->state) memcpy(&t->state[i], b->state, sizeof(uint64_t));
}

static int ram_lookup(void *ctx, const uint8_t hash[32], const int32_t *tokens, int n_tokens, void *k, void *v,
                      size_t block_bytes, void *state, size_t state_bytes, int *has_state)
{
    struct ram_tier *t = ctx;
    t->n_lookup++;
    for (int i = 0; i < t->n; i++) {
        if (memcmp(t->hash[i], hash, 32) || memcmp(t->tokens[i], tokens, sizeof(int32_t) * (size_t)n_tokens))
            continue;
        memcpy(k, t->k[i], block_bytes);
        memcpy(v, t->v[i], block_bytes);
        *has_state = t->has_state[i];
        if (state && t->has_state[i]) memcpy(state, &t->state[i], state_bytes);
        t->n_hit++;
        return 1;
    }
    return 0;
}

static void test_tiers(size_t state_bytes)
{
    struct fake f;
    fake_init(&f, state_bytes);
    struct ram_tier t;
    memset(&t, 0, sizeof(t));
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_dtype = DTYPE_F32;
    o.block_size = 8;
    o.kv_bytes = 64ull * 2 * 2 * 8 * 2 * sizeof(float); /* 64 blocks */
    o.max_batch_tokens = 64;
    o.tiers = (struct kv_tier_ops){.ctx = &t, .on_evict = ram_on_evict, .on_publish = ram_on_publish,
                                   .lookup = ram_lookup};
    struct engine_model_ops ops = {&f, fake_info, NULL, fake_forward, state_bytes ? fake_state_init : NULL, NULL, NULL, 0, NULL};
    struct engine *e = NULL;
    CHECK(engine_create_ops(&ops, &o, &e, NULL) == CAIRN_OK);
    static int32_t p[60];
    make_prompt(p, 60, 33);
    struct collect a, b;
    struct engine_request r = collect_request(&a, p, 50, 6);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&a, 1));
    CHECK(check_ref(p, 50, &a));
    collect_wait_idle(e, 1);
    CHECK_EQ_INT(t.n_publish, 6); /* 55 in KV: 6 full blocks */
    engine_cache_clear(e);          /* everything goes down to the tier */
    CHECK_EQ_INT(t.n_evict, 6);
    struct engine_stats st;
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_blocks_cached, 0);
    /* same prompt again: the device tier is empty, the blocks come back from the tier */
    r = collect_request(&b, p, 50, 6);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&b, 1));
    CHECK(check_ref(p, 50, &b));
    CHECK_EQ_INT(b.usage.cached_tokens, state_bytes ? 48 : 48);
    CHECK(t.n_hit >= 6);
    collect_wait_idle(e, 2);
    engine_get_stats(e, &st);
    CHECK(st.n_promotions >= 6);
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    engine_destroy(e);
    for (int i = 0; i < t.n; i++) {
        free(t.k[i]);
        free(t.v[i]);
    }
}

static void test_hybrid_preemption(void)
{
    struct fake f;
    fake_init(&f, sizeof(uint64_t));
    /* 11 blocks: two requests (6 blocks each at their end) pass the admission gate at its first
     * estimate of their growth (sched.c) and then cannot both finish: one is preempted */
    struct engine *e = make_engine(&f, 8, 11, 24, 6);
    enum { N = 5 };
    static int32_t p[N][30];
    static struct collect c[N];
    fake_gate(&f, 1);
    for (int i = 0; i < N; i++) {
        make_prompt(p[i], 21 + i, 60 + i);
        struct engine_request r = collect_request(&c[i], p[i], 21 + i, 25);
        CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    }
    fake_gate(&f, 0);
    CHECK(collect_wait(c, N));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(c[i].n_tokens, 25);
        CHECK_MSG(check_ref(p[i], 21 + i, &c[i]), "hybrid request %d", i);
    }
    collect_wait_idle(e, N);
    struct engine_stats st;
    engine_get_stats(e, &st);
    CHECK(st.n_preemptions > 0);
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    engine_destroy(e);
}

/* Many long requests in a small pool (vLLM-style admission, engine.h's engine_sched_acct): every
 * request gets the tokens it gets alone, and the scheduler does not thrash: no sequence is
 * readmitted in the step that preempted it, few are preempted at all (let alone twice), and
 * little is recomputed. Session 11's scheduler (CAIRN_ENGINE_SCHED=legacy) admitted whatever
 * fit its first chunk and fails the bounds. The accounting covers every step. */
static void test_full_pool_no_thrash(void)
{
    struct fake f;
    fake_init(&f, 0);
    /* 40 blocks of 8 = 320 positions; 24 requests of 24-40 + 24-32 tokens need 6-9 blocks each:
     * 16 running at once would want ~120 */
    struct engine *e = make_engine(&f, 8, 40, 64, 16);
    enum { N = 24 };
    static int32_t p[N][40];
    static struct collect c[N];
    int n_prompt[N], n_out[N], sum_prompt = 0;
    fake_gate(&f, 1);
    for (int i = 0; i < N; i++) {
        n_prompt[i] = 24 + (i * 7) % 17;
        n_out[i] = 24 + (i * 5) % 9;
        sum_prompt += n_prompt[i];
        make_prompt(p[i], n_prompt[i], 300 + i);
        struct engine_request r = collect_request(&c[i], p[i], n_prompt[i], n_out[i]);
        CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    }
    fake_gate(&f, 0);
    CHECK(collect_wait(c, N));
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(c[i].n_tokens, n_out[i]);
        CHECK_EQ_INT(c[i].finish, ENGINE_FINISH_LENGTH);
        CHECK_MSG(check_ref(p[i], n_prompt[i], &c[i]), "request %d", i);
    }
    collect_wait_idle(e, N);
    struct engine_stats st;
    engine_get_stats(e, &st);
    const struct engine_sched_acct *a = &st.acct;
    CHECK_EQ_INT(atomic_load(&f.n_errors), 0);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    printf("full pool: %llu steps, %llu preemptions (%llu repeated), %llu readmissions (%llu in the same step), "
           "%llu rows recomputed of %llu prefill rows, %llu admissions deferred\n",
           (unsigned long long)st.n_steps, (unsigned long long)st.n_preemptions,
           (unsigned long long)a->n_repreemptions, (unsigned long long)a->n_readmissions,
           (unsigned long long)a->n_readmit_same_step, (unsigned long long)a->n_rows_recomputed,
           (unsigned long long)a->n_rows_prefill, (unsigned long long)a->n_admit_deferred);
    CHECK_EQ_INT((int)a->n_readmit_same_step, 0);
    CHECK_EQ_INT((int)a->n_repreemptions, 0);
    CHECK(st.n_preemptions <= N / 4);
    CHECK(a->n_rows_recomputed <= (uint64_t)sum_prompt / 10);
    CHECK(a->n_admit_deferred > 0); /* the gate did hold requests back: the pool was the limit */
    /* every step is accounted for, once by kind and once by rows */
    uint64_t n_kind = 0, n_bucket = 0, rows_kind = 0;
    for (int k = 0; k < ENGINE_STEP_N_KINDS; k++) {
        n_kind += a->kind[k].n_steps;
        rows_kind += a->kind[k].n_rows;
    }
    for (int b = 0; b < ENGINE_STEP_ROW_BUCKETS; b++) n_bucket += a->by_rows[b].n_steps;
    CHECK_EQ_INT((int)n_kind, (int)st.n_steps);
    CHECK_EQ_INT((int)n_bucket, (int)st.n_steps);
    CHECK_EQ_INT((int)rows_kind, (int)(a->n_rows_decode + a->n_rows_verify + a->n_rows_prefill));
    CHECK(a->n_rows_prefill >= (uint64_t)sum_prompt);
    CHECK(a->new_rows.n_steps >= 1 && a->new_rows.n_steps <= st.n_steps); /* each row count once */
    CHECK(a->new_rows.n_steps <= (uint64_t)64);
    CHECK(a->t_elapsed_s > 0 && a->t_steps_s > 0);
    CHECK(a->t_idle_s + a->t_between_s + a->t_steps_s <= a->t_elapsed_s * 1.0001 + 1e-6);
    engine_destroy(e);
}

static void test_step_row_buckets(void)
{
    int lo, hi;
    CHECK_EQ_INT(engine_step_row_bucket(1), 0);
    CHECK_EQ_INT(engine_step_row_bucket(2), 1);
    CHECK_EQ_INT(engine_step_row_bucket(3), 1);
    CHECK_EQ_INT(engine_step_row_bucket(256), 8);
    CHECK_EQ_INT(engine_step_row_bucket(4095), 11);
    CHECK_EQ_INT(engine_step_row_bucket(1 << 20), ENGINE_STEP_ROW_BUCKETS - 1);
    engine_step_row_range(8, &lo, &hi);
    CHECK(lo == 256 && hi == 511);
    engine_step_row_range(ENGINE_STEP_ROW_BUCKETS - 1, &lo, &hi);
    CHECK(lo == 1 << (ENGINE_STEP_ROW_BUCKETS - 1) && hi == -1);
}

/* The prefill speed the restore-or-recompute choice reads (engine_stats.prefill_tok_s) is a rate
 * weighted by tokens: four steps of a 500-token prompt (128 tokens a step), then one of 17 (a
 * restored prefix's last block), each costing 20 ms + 20 us a token, leave it near the long
 * steps' 5.7K tok/s (~4.3K; a mean of step rates started at 0 gave ~2.8K: 0.59 of it after four
 * steps, then pulled down by the short one). */
static void test_prefill_rate(void)
{
    struct fake f;
    fake_init(&f, 0);
    f.us_step = 20000;
    f.us_token = 20;
    struct engine *e = make_engine(&f, 16, 256, 128, 2);
    static int32_t p[500];
    make_prompt(p, 500, 5);
    struct collect a, b;
    struct engine_request r = collect_request(&a, p, 500, 1);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&a, 1));
    make_prompt(p, 17, 11);
    r = collect_request(&b, p, 17, 1);
    CHECK(engine_submit(e, &r, NULL, NULL) == CAIRN_OK);
    CHECK(collect_wait(&b, 1));
    collect_wait_idle(e, 2);
    struct engine_stats st;
    engine_get_stats(e, &st);
    double big = 128.0 / (0.020 + 128 * 20e-6);
    CHECK_MSG(st.prefill_tok_s > 0.6 * big && st.prefill_tok_s < 1.05 * big,
              "prefill rate %.0f tok/s, the long steps' %.0f", st.prefill_tok_s, big);
    engine_destroy(e);
}

int main(void)
{
    test_concurrent_greedy();
    test_prefix_reuse();
    test_shared_prompt_once();
    test_preemption();
    test_cancel();
    test_cancel_mid_prefill();
    test_seeded_batch_independent();
    test_device_sampling();
    test_stops();
    test_submit_errors();
    test_hybrid_prefix();
    test_device_failure();
    test_tiers(0);
    test_tiers(sizeof(uint64_t));
    test_hybrid_preemption();
    test_full_pool_no_thrash();
    test_step_row_buckets();
    test_prefill_rate();
    return test_summary("test_engine_sched");
}
