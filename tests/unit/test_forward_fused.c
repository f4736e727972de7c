/* forward.c's fused branch (tensor/backend.h's optional matmul_add, qk_rope_store and
 * matmul_fused) on the CPU.
 *
 * The CPU backend leaves the fused ops NULL, so its forward pass never takes that branch; the GPU
 * does. Here a shim backend shares the CPU backend's state (impl) and its op table, plus fused ops
 * written as the plain op sequences tensor/backend.h defines them by: matmul into a scratch buffer
 * then add; rmsnorm of q and k, rope of both, kv_store; rmsnorm into h, matmul_multi of h, silu_mul
 * (the input norms of attention and MLP, SwiGLU, the final norm before lm_head). The same kernels then run in the same
 * order as on the plain CPU path, so the shim's logits must equal the plain path's bit for bit
 * (equal max |dlogit| against the oracle, in all three check modes) and pass the oracle at the
 * CPU's 2e-3: any argument forward.c passes wrongly to a fused op (a layer, a pointer, a norm
 * weight, the residual it adds into) changes them. Counters prove the fused ops were called.
 * Models: qwen3-tiny (q/k norms, no qkv bias) and qwen2-tiny-mlx-q4-g64 (qkv bias, no q/k norms,
 * q4 weights): both ways of each branch.
 * With a sample op too (the host reference of its semantics, sampler_row_reference), an engine
 * over the shim samples its rows from the fused lm_head's logits (the final norm folded in) and
 * must give the plain CPU engine's tokens and logprobs: greedy and seeded top-k rows through the
 * op (its sorted path), top-p-alone rows on the host from downloaded logits. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/check.h"
#include "model/model.h"
#include "test_backend.h"
#include "testlib.h"

static const struct backend_ops *plain;
static long n_matmul_add, n_qk_rope_store, n_matmul_fused, n_fused_silu;

static void shim_matmul_add(struct backend *be, const struct tensor *w, const float *x, float *y, int n)
{
    size_t bytes = sizeof(float) * (size_t)n * (size_t)w->shape[0];
    void *tmp = NULL;
    struct cairn_err err = {0};
    n_matmul_add++;
    CAIRN_ASSERT(plain->buf_alloc(be, bytes, CAIRN_MEM_SCRATCH, &tmp, &err) == CAIRN_OK);
    plain->matmul(be, w, x, tmp, n);
    plain->add(be, y, tmp, (int64_t)n * w->shape[0]);
    plain->buf_free(be, tmp, bytes, CAIRN_MEM_SCRATCH);
}

static void shim_qk_rope_store(struct backend *be, const struct backend_qk_rope_store *r)
{
    const struct backend_kv_view *kv = r->kv;
    int T = r->n_tokens, nh = r->n_heads, nkv = kv->n_kv_heads, hd = kv->head_dim;
    n_qk_rope_store++;
    if (r->q_norm) plain->rmsnorm(be, r->q, r->q, r->q_norm, T * nh, hd, r->eps, r->w_offset);
    if (r->k_norm) plain->rmsnorm(be, r->k, r->k, r->k_norm, T * nkv, hd, r->eps, r->w_offset);
    plain->rope(be, r->q, T, nh, hd, r->rot_dim, r->pos, r->inv_freq);
    plain->rope(be, r->k, T, nkv, hd, r->rot_dim, r->pos, r->inv_freq);
    plain->kv_store(be, kv, r->layer, r->slots, T, r->k, r->v);
}

static void shim_matmul_fused(struct backend *be, const struct backend_matmul_fused *f)
{
    const float *x = f->x;
    n_matmul_fused++;
    if (f->norm) {
        plain->rmsnorm(be, f->h, f->x, f->norm, f->n, (int)f->w[0]->shape[1], f->eps, f->w_offset);
        x = f->h;
    }
    plain->matmul_multi(be, f->w, f->y, f->count, x, f->n);
    if (f->silu_mul) {
        CAIRN_ASSERT(f->count == 2);
        n_fused_silu++;
        plain->silu_mul(be, f->y[0], f->y[0], f->y[1], (int64_t)f->n * f->w[0]->shape[0]);
    }
}

static long n_sample_rows;

/* The CPU's logits are host memory: the op's semantics on the host, row by row. */
static int shim_sample(struct backend *be, float *logits, int vocab,
                       const struct backend_sample_row *rows, int n, struct backend_sample_out *out,
                       struct cairn_err *err)
{
    (void)be;
    for (int i = 0; i < n; i++) {
        int rc = sampler_row_reference(logits + (size_t)rows[i].row * (size_t)vocab, vocab,
                                       &rows[i], &out[i]);
        if (rc != CAIRN_OK) return cairn_err_set(err, rc, "shim sample: row %d", i);
        n_sample_rows++;
    }
    return CAIRN_OK;
}

struct gen_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, n;
    int32_t toks[16];
    float lp[16];
};

static void gen_event(void *user, const struct engine_event *ev)
{
    struct gen_ctx *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->kind == ENGINE_EVENT_TOKEN && c->n < 16) {
        c->lp[c->n] = ev->logprob;
        c->toks[c->n++] = ev->token;
    }
    if (ev->kind == ENGINE_EVENT_DONE) {
        c->done = 1;
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* 16 tokens (with logprobs) of a fixed prompt through an engine over model `name` on be. mode 0:
 * greedy; 1: seeded temperature 0.8 with top_p 0.9 alone (a row the engine samples on the host);
 * 2: the same with top_k 20 (the op's sorted path where be->sample_top_k admits it). */
static int gen_on(const char *name, struct backend *be, int mode, struct gen_ctx *c)
{
    char dir[1024], rel[512];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    test_src_path(rel, dir, sizeof(dir));
    struct cairn_err err = {0};
    struct model *m = NULL;
    struct engine *e = NULL;
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int rc = model_load(dir, be, &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    struct engine_opts o;
    engine_opts_default(&o);
    o.kv_dtype = DTYPE_F32;
    o.kv_bytes = 8u << 20;
    o.block_size = 16;
    o.max_running = 2;
    o.max_batch_tokens = 64;
    if (rc == CAIRN_OK) {
        rc = engine_create(m, &o, &e, &err);
        CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    }
    if (rc == CAIRN_OK) {
        int32_t prompt[40];
        for (int i = 0; i < 40; i++)
            prompt[i] = (int32_t)((i * 37 + 11) % 500);
        struct engine_request r = {.prompt = prompt,
                                   .n_prompt = 40,
                                   .max_tokens = 16,
                                   .ignore_eos = 1,
                                   .on_event = gen_event,
                                   .user = c};
        engine_sampling_default(&r.sampling);
        r.sampling.temperature = mode ? 0.8f : 0.0f;
        r.sampling.logprobs = 1;
        r.sampling.top_p = mode ? 0.9f : 1.0f;
        r.sampling.top_k = mode == 2 ? 20 : 0;
        r.sampling.seed = 1234;
        r.sampling.has_seed = 1;
        uint64_t id;
        rc = engine_submit(e, &r, &id, &err);
        CHECK_MSG(rc == CAIRN_OK, "%s: submit: %s", name, err.msg);
        pthread_mutex_lock(&c->mu);
        while (rc == CAIRN_OK && !c->done)
            pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
    }
    engine_destroy(e);
    model_free(m);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    return c->n;
}

/* The oracle check of the model on backend be, all three modes; *max_abs: its max |dlogit|
 * (left as it was if the check could not run). */
static void check_on(const char *name, struct backend *be, double *max_abs)
{
    char dir[1024], rel[512], exp[1100];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    test_src_path(rel, dir, sizeof(dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", dir);
    struct cairn_err err = {0};
    struct model *m = NULL;
    int rc = model_load(dir, be, &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    if (rc != CAIRN_OK) return;
    struct model_check_opts o = {.tol = 2e-3, .kv_dtype = DTYPE_F32, .chunk = 32, .block_size = 16, .modes = 0};
    struct model_check_result r;
    rc = model_check_run(m, exp, &o, &r, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    CHECK_MSG(rc != CAIRN_OK || r.n_failed == 0, "%s on %s: %d of %d runs failed (max %g)", name,
              be->ops == plain ? "cpu" : "the fused shim", r.n_failed, r.n_runs, r.max_abs);
    model_free(m);
    if (rc == CAIRN_OK) *max_abs = r.max_abs;
}

int main(void)
{
    struct backend *cpu = test_cpu_be();
    plain = cpu->ops;
    CHECK(!plain->matmul_add && !plain->qk_rope_store && !plain->matmul_fused); /* else this test proves nothing new */
    struct backend_ops ops = *plain;
    ops.matmul_add = shim_matmul_add;
    ops.qk_rope_store = shim_qk_rope_store;
    ops.matmul_fused = shim_matmul_fused;
    struct backend shim = *cpu; /* the same impl: the shim runs the CPU's kernels */
    shim.ops = &ops;
    static const char *const models[] = {"qwen3-tiny", "qwen2-tiny-mlx-q4-g64"};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(models); i++) {
        double want = -1, got = -1;
        long adds0 = n_matmul_add, qkr0 = n_qk_rope_store, mmf0 = n_matmul_fused, silu0 = n_fused_silu;
        check_on(models[i], cpu, &want);
        CHECK(n_matmul_add == adds0 && n_qk_rope_store == qkr0 && n_matmul_fused == mmf0);
        check_on(models[i], &shim, &got);
        CHECK_MSG(n_matmul_add > adds0 && n_qk_rope_store > qkr0 && n_matmul_fused > mmf0 && n_fused_silu > silu0,
                  "%s: fused ops not called (%ld, %ld, %ld, %ld)", models[i], n_matmul_add - adds0,
                  n_qk_rope_store - qkr0, n_matmul_fused - mmf0, n_fused_silu - silu0);
        CHECK_MSG(got == want && want >= 0, "%s: fused path max|dlogit| %.9g, plain %.9g", models[i], got, want);
        printf("%-24s plain and fused max|dlogit| %.6e %.6e (%ld matmul_add, %ld qk_rope_store, %ld matmul_fused, "
               "%ld with silu_mul)\n",
               models[i], want, got, n_matmul_add - adds0, n_qk_rope_store - qkr0, n_matmul_fused - mmf0,
               n_fused_silu - silu0);
    }
    ops.sample = shim_sample;
    shim.sample_top_k = BACKEND_SAMPLE_MAX_TOP_K;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(models); i++) {
        for (int mode = 0; mode <= 2; mode++) { /* 0, 2: sampled by the op; 1: on the host */
            struct gen_ctx want, got;
            long rows0 = n_sample_rows, mmf0 = n_matmul_fused;
            gen_on(models[i], cpu, mode, &want);
            CHECK(n_sample_rows == rows0);
            gen_on(models[i], &shim, mode, &got);
            CHECK_EQ_INT(want.n, 16);
            CHECK_EQ_INT(got.n, want.n);
            CHECK_MSG(n_matmul_fused > mmf0, "%s: matmul_fused not called", models[i]);
            CHECK_MSG(mode == 1 ? n_sample_rows == rows0 : n_sample_rows - rows0 >= 15,
                      "%s mode %d: %ld rows through the sample op", models[i], mode, n_sample_rows - rows0);
            for (int t = 0; t < want.n && t < got.n; t++) {
                CHECK_MSG(got.toks[t] == want.toks[t], "%s mode %d: token %d: %d, plain %d", models[i], mode, t,
                          got.toks[t], want.toks[t]);
                CHECK_MSG(fabsf(got.lp[t] - want.lp[t]) <= 1e-5f, "%s mode %d: logprob %d: %g, plain %g", models[i],
                          mode, t, (double)got.lp[t], (double)want.lp[t]);
            }
        }
    }
    return test_summary("test_forward_fused");
}
