/* The engine over a tensor-parallel model group on simulated CPU ranks (issue 23,
 * model/model_group.h), below the HTTP layer (tests/integration/tp_serve.sh drives it through
 * serve):
 * - the group's info: N x the rank's KV heads, query heads and state bytes, no MTP head;
 * - the group backend's buffers: a buffer of B bytes is N parts of B / N, one per rank, and
 *   upload / download / copy / zero act on every part in rank order; a copy of part of a buffer
 *   (what a tier's block read at an offset would be) is refused, not misread;
 * - engine_create_group refuses lower tiers and the MTP mode with their reasons;
 * - an engine over the group generates the same greedy tokens as one over the unsharded model
 *   (dense and hybrid at N = 2, MoE at N = 4 with its KV heads replicated), and the same again
 *   from a prefix-cache hit (a hybrid's snapshots are group buffers: every rank's part). */
#include <pthread.h>
#include <string.h>

#include "testlib.h"

#include "engine/engine.h"
#include "kv/kv_pool.h"
#include "kv/kv_state.h"
#include "model/model.h"
#include "model/model_group.h"

static char dir_buf[1024];
static const char *model_dir(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    return test_src_path(rel, dir_buf, sizeof(dir_buf));
}

static void test_buffers(struct model_group *g)
{
    struct backend *be = model_group_backend(g);
    struct cairn_err err = {0};
    int world = model_group_world(g);
    enum { B = 64 };
    void *a = NULL, *b = NULL;
    CHECK(be->ops->buf_alloc(be, B, CAIRN_MEM_STATE, &a, &err) == CAIRN_OK);
    CHECK(be->ops->buf_alloc(be, B, CAIRN_MEM_STATE, &b, &err) == CAIRN_OK);
    uint8_t in[B], out[B];
    for (int i = 0; i < B; i++)
        in[i] = (uint8_t)(i * 7 + 1);
    CHECK(kv_state_upload(be, a, in, B, &err) == CAIRN_OK);
    CHECK(kv_state_copy(be, b, a, B, &err) == CAIRN_OK);
    memset(out, 0, sizeof(out));
    CHECK(kv_state_download(be, out, b, B, &err) == CAIRN_OK);
    CHECK(memcmp(in, out, B) == 0);
    /* rank r holds bytes [r * B / N, (r + 1) * B / N): rank 1's model backend sees its part */
    struct backend *r1 = model_backend(model_group_rank(g, world - 1));
    CHECK(r1->host_visible);
    CHECK(kv_state_zero(be, a, B, &err) == CAIRN_OK);
    CHECK(kv_state_download(be, out, a, B, &err) == CAIRN_OK);
    int zero = 1;
    for (int i = 0; i < B; i++)
        zero &= out[i] == 0;
    CHECK(zero);
    /* part of a buffer: refused with the reason */
    CHECK(be->ops->buf_download(be, out, a, B / 2, &err) == CAIRN_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "copied whole") != NULL);
    be->ops->buf_free(be, a, B, CAIRN_MEM_STATE);
    be->ops->buf_free(be, b, B, CAIRN_MEM_STATE);
}

struct gen_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int32_t toks[64];
    int n;
    int finish;
};

static void gen_event(void *user, const struct engine_event *ev)
{
    struct gen_ctx *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->kind == ENGINE_EVENT_TOKEN && c->n < 64) c->toks[c->n++] = ev->token;
    if (ev->kind == ENGINE_EVENT_DONE) {
        c->done = 1;
        c->finish = ev->finish;
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Greedy tokens of a fixed prompt through engine e (max 24, EOS ignored). */
static int gen(struct engine *e, struct gen_ctx *c)
{
    int32_t prompt[80];
    for (int i = 0; i < 80; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % 1000);
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    struct engine_request r = {.prompt = prompt,
                               .n_prompt = 80,
                               .max_tokens = 24,
                               .ignore_eos = 1,
                               .on_event = gen_event,
                               .user = c};
    engine_sampling_default(&r.sampling);
    r.sampling.temperature = 0;
    struct cairn_err err = {0};
    uint64_t id;
    if (engine_submit(e, &r, &id, &err) != CAIRN_OK) {
        fprintf(stderr, "submit: %s\n", err.msg);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    while (!c->done)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    return c->n;
}

static void dummy_evict(void *ctx, const struct kv_block_desc *b)
{
    (void)ctx;
    (void)b;
}

static void test_model(const char *name, int world)
{
    struct cairn_err err = {0};
    struct backend_tp *tp = NULL;
    struct model_group *g = NULL;
    struct backend *be = NULL;
    struct model *m = NULL;
    CHECK_MSG(backend_tp_open("cpu", world, &tp, &err) == CAIRN_OK, "%s", err.msg);
    CHECK_MSG(model_group_load(model_dir(name), tp, &g, &err) == CAIRN_OK, "%s: %s", name, err.msg);
    CHECK(backend_open("cpu", 0, &be, &err) == CAIRN_OK);
    CHECK_MSG(model_load(model_dir(name), be, &m, &err) == CAIRN_OK, "%s", err.msg);
    if (!g || !m) goto out;
    const struct model_info *gi = model_group_info(g), *mi = model_get_info(m),
                            *ri = model_get_info(model_group_rank(g, 0));
    CHECK_EQ_INT(gi->n_kv_heads, world * ri->n_kv_heads);
    CHECK_EQ_INT(gi->n_heads, mi->n_heads);
    CHECK_EQ_INT(gi->state_bytes, (size_t)world * ri->state_bytes);
    CHECK_EQ_INT(gi->n_mtp_layers, 0);
    CHECK_EQ_INT(gi->vocab_size, mi->vocab_size);
    test_buffers(g);

    struct engine_opts o = {0};
    engine_opts_default(&o);
    o.kv_dtype = DTYPE_F32;
    o.kv_bytes = 8u << 20;
    o.block_size = 16;
    o.max_running = 4;
    o.max_batch_tokens = 128;
    struct engine *e = NULL;
    struct engine_opts bad = o;
    bad.speculative = ENGINE_SPEC_MTP;
    CHECK(engine_create_group(g, &bad, &e, &err) == CAIRN_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "MTP head does not run sharded") != NULL);
    bad = o;
    bad.tiers.on_evict = dummy_evict; /* never called: refused first */
    CHECK(engine_create_group(g, &bad, &e, &err) == CAIRN_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "lower KV tiers") != NULL);

    struct gen_ctx a, b;
    int na = -1, nb = -2;
    CHECK_MSG(engine_create_group(g, &o, &e, &err) == CAIRN_OK, "%s", err.msg);
    if (e) {
        na = gen(e, &a);
        gen(e, &b); /* again: a prefix-cache hit (80 tokens = 5 blocks of 16) */
        CHECK_EQ_INT(b.n, a.n);
        CHECK(memcmp(a.toks, b.toks, sizeof(a.toks)) == 0);
        struct engine_stats st;
        engine_get_stats(e, &st);
        CHECK_MSG(st.n_cached_tokens >= 64, "%s: %llu cached", name,
                  (unsigned long long)st.n_cached_tokens);
        /* a group has no device sampling (engine_create_group): every row on the host */
        CHECK_EQ_INT(st.n_rows_device, 0);
        CHECK_MSG(st.n_rows_host >= 24, "%s: %llu rows sampled on the host", name,
                  (unsigned long long)st.n_rows_host);
        engine_destroy(e);
    }
    struct engine *e1 = NULL;
    CHECK(engine_create(m, &o, &e1, &err) == CAIRN_OK);
    if (e1) {
        nb = gen(e1, &b);
        engine_destroy(e1);
    }
    CHECK_EQ_INT(na, 24);
    CHECK_EQ_INT(nb, 24);
    CHECK_MSG(memcmp(a.toks, b.toks, sizeof(a.toks)) == 0, "%s at %d ranks: greedy tokens differ",
              name, world);
out:
    model_free(m);
    backend_close(be);
    model_group_free(g);
    backend_tp_close(tp);
}

int main(void)
{
    test_model("qwen3-tiny", 2);
    test_model("qwen3_5-tiny", 2); /* hybrid: states split, snapshots on every rank */
    test_model("qwen3-moe-tiny", 4);
    return test_summary("test_tp_engine");
}
