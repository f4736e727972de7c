/* End to end through the engine: a first process (forked child) runs a long prompt greedily
 * with the tiers plugged into engine_opts.tiers and ends; a second process (this one) with the
 * same SSD folder gets the prompt from the SSD tier (cached_tokens >= prompt - one block) and
 * produces the same greedy tokens as the cold run. Two ways the first process ends:
 * - write-back, clean shutdown: engine_cache_clear (device -> hot), engine_destroy,
 *   kv_tiers_close (hot dirty blocks flushed to SSD);
 * - write-through, abrupt _exit right after the request (no close): blocks were written as
 *   they were published.
 * Models: tests/data/oracle/models/qwen3-tiny (attention) and qwen3_5-tiny (hybrid: blocks carry
 * recurrent-state snapshots), f32 KV, block size 16. */
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/engine.h"
#include "engine_oracle_util.h"
#include "engine_testutil.h"
#include "kv/tiers.h"
#include "model/model.h"
#include "testlib.h"
#include "tensor/backend.h"
#include "tier_testutil.h"

#define BLOCK 16
#define N_GEN 8

static void sig_from_model(const struct model_info *mi, struct kv_tier_signature *s)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->arch, sizeof(s->arch), "%s", mi->model_type);
    s->n_layers = mi->n_layers;
    s->n_kv_layers = mi->n_kv_layers;
    s->n_kv_heads = mi->n_kv_heads;
    s->head_dim = mi->head_dim;
    s->kv_dtype = DTYPE_F32;
    s->block_size = BLOCK;
    s->state_bytes = mi->state_bytes;
    memcpy(s->identity, mi->identity, 32);
}

/* Each process opens its own CPU backend (one thread: a forked child has no pool threads) and
 * closes it before the next fork. */
struct run {
    struct backend *be;
    struct model *m;
    struct kv_tiers *tiers;
    struct engine *e;
};

static int run_open(struct run *r, const char *model_dir, const char *ssd, int write_through)
{
    memset(r, 0, sizeof(*r));
    struct cairn_err err = {0};
    if (backend_open("cpu", 1, &r->be, &err) != CAIRN_OK || model_load(model_dir, r->be, &r->m, &err) != CAIRN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    struct kv_tiers_opts to = {.hot_max_bytes = 1 << 20, .ssd_dir = ssd,
                               .hot_write_through = write_through};
    sig_from_model(model_get_info(r->m), &to.sig);
    if (kv_tiers_open(&to, &r->tiers, &err) != CAIRN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_dtype = DTYPE_F32;
    o.block_size = BLOCK;
    o.kv_bytes = 16ull << 20;
    o.max_batch_tokens = 256;
    o.tiers = kv_tiers_ops(r->tiers);
    if (engine_create(r->m, &o, &r->e, &err) != CAIRN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int run_prompt(struct run *r, const int32_t *prompt, int n, struct collect *c)
{
    struct engine_request req = collect_request(c, prompt, n, N_GEN);
    req.ignore_eos = 1;
    if (engine_submit(r->e, &req, NULL, NULL) != CAIRN_OK) return -1;
    return collect_wait(c, 1) ? 0 : -1;
}

/* First process: cold run; writes its tokens to fd. */
static void first_process(const char *model_dir, const char *ssd, int write_through,
                          const int32_t *prompt, int n, int fd)
{
    struct run r;
    static struct collect c;
    if (run_open(&r, model_dir, ssd, write_through) != 0 || run_prompt(&r, prompt, n, &c) != 0)
        _exit(2);
    if (c.usage.cached_tokens != 0) _exit(3); /* must be cold */
    if (write(fd, &c.n_tokens, sizeof(int)) != (ssize_t)sizeof(int) ||
        write(fd, c.tokens, sizeof(int32_t) * (size_t)c.n_tokens) < 0)
        _exit(4);
    if (write_through) {
        /* a crash right after the answer: only what reached the disk counts */
        collect_wait_idle(r.e, 1);
        kv_tiers_sync(r.tiers);
        _exit(0);
    }
    engine_cache_clear(r.e); /* device blocks -> hot tier */
    engine_destroy(r.e);
    kv_tiers_close(r.tiers); /* hot dirty blocks -> SSD */
    model_free(r.m);
    backend_close(r.be);
    _exit(0);
}

static void check_restart(const char *name, int write_through, int max_prompt)
{
    char model_dir[1024], rel[256], exp[1100], ssd[256];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    test_src_path(rel, model_dir, sizeof(model_dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", model_dir);
    static struct oracle o;
    CHECK_MSG(oracle_read(exp, &o), "%s: cannot read %s", name, exp);
    const struct oracle_case *big = NULL; /* the longest prompt of at most max_prompt tokens */
    for (int i = 0; i < o.n_cases; i++)
        if (o.cases[i].prompt_len <= max_prompt &&
            (!big || o.cases[i].prompt_len > big->prompt_len))
            big = &o.cases[i];
    CHECK(big && big->prompt_len >= 4 * BLOCK);
    if (!big) return;
    int n = big->prompt_len;
    tt_tmpdir(ssd, sizeof(ssd), "tiers-engine");

    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        first_process(model_dir, ssd, write_through, big->tokens, n, fds[1]);
    }
    close(fds[1]);
    int n_cold = 0;
    int32_t cold[N_GEN];
    CHECK(read(fds[0], &n_cold, sizeof(int)) == (ssize_t)sizeof(int));
    CHECK(n_cold == N_GEN && read(fds[0], cold, sizeof(cold)) == (ssize_t)sizeof(cold));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: first process status %d", name,
              status);
    int n_files = tt_count_suffix(ssd, ".safetensors");
    CHECK_MSG(n_files >= n / BLOCK - 1, "%s: %d block files for a %d-token prompt", name, n_files,
              n);

    struct run r;
    static struct collect warm;
    CHECK(run_open(&r, model_dir, ssd, 0) == 0);
    CHECK(run_prompt(&r, big->tokens, n, &warm) == 0);
    CHECK_MSG(warm.usage.cached_tokens >= n - BLOCK, "%s: cached %d of a %d-token prompt", name,
              warm.usage.cached_tokens, n);
    CHECK_EQ_INT(warm.n_tokens, N_GEN);
    CHECK_MSG(memcmp(warm.tokens, cold, sizeof(cold)) == 0, "%s: warm tokens differ from cold",
              name);
    /* and the cold run agrees with the oracle where the oracle is sure */
    int trusted = oracle_n_trusted(big);
    for (int i = 0; i < trusted && i < N_GEN; i++) CHECK(cold[i] == big->tokens[n + i]);
    struct kv_tiers_stats st;
    kv_tiers_stats(r.tiers, &st);
    CHECK(st.ssd.n_hits >= (uint64_t)(n / BLOCK - 1));
    CHECK_EQ_INT(st.ssd.n_damaged, 0);
    printf("%s (%s): prompt %d, %d files, cached %d, ssd hits %llu, scan %.3f s\n", name,
           write_through ? "write-through, abrupt exit" : "write-back, clean shutdown", n,
           n_files, warm.usage.cached_tokens, (unsigned long long)st.ssd.n_hits, st.ssd.scan_s);
    engine_destroy(r.e);
    kv_tiers_close(r.tiers);
    model_free(r.m);
    backend_close(r.be);
    tt_rm_rf(ssd);
}

int main(void)
{
    /* the long (300-token) prompt once; shorter ones keep the test fast under ASan */
    check_restart("qwen3-tiny", 0, 320);
    check_restart("qwen3-tiny", 1, 128);
    check_restart("qwen3_5-tiny", 0, 128);
    return test_summary("test_tiers_engine");
}
