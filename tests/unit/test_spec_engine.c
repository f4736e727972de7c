/* Speculative decoding in the engine, on the oracle models: dense (qwen3-tiny), MoE
 * (qwen3-moe-tiny) and hybrid (qwen3_5-tiny: DeltaNet state restored after a rejected draft).
 *
 * Reference: each model's requests decoded with speculation off, all in flight at once. Then the
 * same requests with --speculative ngram, in one batch where every other request opts out (mixed
 * speculating and plain sequences): every request's greedy tokens must be identical, drafts must
 * have been both accepted and rejected (the prompts repeat spans of themselves, and the tiny
 * random models fall into loops of their own output, so prompt lookup has both right and wrong
 * guesses), and blocks must come back (no leak from rolled-back drafts). Also: a seeded sampled
 * request gives the same tokens with and without speculation; a small KV pool (preemption while
 * speculating) changes nothing; per-request usage and engine stats count drafts; a backend's
 * exact_rows bounds the drafts of a step; bad options are refused. */
#include "base/mem.h"
#include "engine_oracle_util.h"
#include "model/model.h"
#include "test_backend.h"

#define N_REQ 6
#define N_GEN 40

/* The scripted drafter: proposes the reference continuation of the request (found by its
 * prompt), with every fifth-or-so token wrong, so that drafts are accepted, cut short and
 * rejected whatever the model. */
static struct script {
    const int32_t (*prompts)[200];
    const int *len;
    const struct collect *ref;
    int n, vocab;
} script;

static int script_draft(void *ctx, const int32_t *tokens, int n_tokens, int max_k, int32_t *out)
{
    struct script *sc = ctx;
    for (int r = 0; r < sc->n; r++) {
        if (sc->len[r] > n_tokens ||
            memcmp(tokens, sc->prompts[r], (size_t)sc->len[r] * sizeof(int32_t)) != 0)
            continue;
        int g = n_tokens - sc->len[r];
        for (int j = 0; j < max_k; j++) {
            int at = g + j < sc->ref[r].n_tokens ? g + j : sc->ref[r].n_tokens - 1;
            out[j] = sc->ref[r].tokens[at];
            if ((n_tokens * 7 + j * 3) % 5 == 0) out[j] = (out[j] + 1) % sc->vocab;
        }
        return max_k;
    }
    return 0;
}

static struct engine *make_engine_d(struct model *m, enum engine_spec_mode mode, uint64_t kv_bytes,
                                    int scripted)
{
    struct engine_opts o;
    oracle_engine_opts(&o, 16, kv_bytes, 8);
    o.speculative = mode;
    o.spec_cost_slope = 0.05; /* fixed: which steps draft must not depend on ASan timings */
    if (scripted) {
        o.drafter.ctx = &script;
        o.drafter.draft = script_draft;
    }
    return oracle_engine_create(m, &o);
}

static struct engine *make_engine(struct model *m, enum engine_spec_mode mode, uint64_t kv_bytes)
{
    return make_engine_d(m, mode, kv_bytes, 0);
}

/* Prompts: oracle prompts, and copy-heavy ones (a random span, repeated with an edit). */
static int make_prompts(const struct oracle *o, int vocab, int32_t p[N_REQ][200], int *len)
{
    int n = 0;
    for (int i = 0; i < o->n_cases && n < 3; i++) {
        if (o->cases[i].prompt_len > 120) continue;
        memcpy(p[n], o->cases[i].tokens, (size_t)o->cases[i].prompt_len * sizeof(int32_t));
        len[n++] = o->cases[i].prompt_len;
    }
    uint64_t x = 12345;
    while (n < N_REQ) {
        int span = 12 + 5 * n, l = 0;
        for (int j = 0; j < span; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            p[n][l++] = (int32_t)((x >> 33) % (uint64_t)vocab);
        }
        for (int rep = 0; rep < 3; rep++)
            for (int j = 0; j < span; j++)
                p[n][l++] = j == span / 2 && rep == 1 ? (p[n][j] + 1) % vocab : p[n][j];
        len[n++] = l;
    }
    return n;
}

static void run_batch(struct engine *e, int32_t p[N_REQ][200], const int *len, int n, int mix,
                      struct collect *out)
{
    struct cairn_err err = {0};
    for (int i = 0; i < n; i++) {
        struct engine_request r = collect_request(&out[i], p[i], len[i], N_GEN);
        r.ignore_eos = 1;
        if (mix && i % 2) r.speculative = ENGINE_SPEC_OFF;
        CHECK_MSG(engine_submit(e, &r, NULL, &err) == CAIRN_OK, "%s", err.msg);
    }
    CHECK(collect_wait(out, n));
}

/* Runs the batch on e (every other request opting out) and checks it against ref. Returns the
 * accepted and drafted totals. */
static void check_spec_run(struct engine *e, const char *name, const char *what,
                           int32_t p[N_REQ][200], const int *len, int n, const struct collect *ref,
                           long *accepted_out, long *drafted_out)
{
    static struct collect spec[N_REQ];
    struct engine_stats st;
    run_batch(e, p, len, n, 1, spec);
    collect_wait_idle(e, (uint64_t)n);
    engine_get_stats(e, &st);
    int n_same = 0;
    long drafted = 0, accepted = 0;
    for (int i = 0; i < n; i++) {
        int same = same_tokens(&ref[i], &spec[i]);
        n_same += same;
        CHECK_MSG(same, "%s, %s: request %d (%s): tokens differ with speculation", name, what, i,
                  i % 2 ? "plain" : "speculating");
        CHECK_EQ_INT(spec[i].n_tokens, N_GEN);
        CHECK_EQ_INT(spec[i].usage.completion_tokens, N_GEN);
        CHECK(spec[i].usage.spec_accepted <= spec[i].usage.spec_drafted);
        if (i % 2) CHECK_EQ_INT(spec[i].usage.spec_drafted, 0); /* opted out */
        drafted += spec[i].usage.spec_drafted;
        accepted += spec[i].usage.spec_accepted;
    }
    CHECK_EQ_INT(st.n_spec_drafted, drafted);
    CHECK_EQ_INT(st.n_spec_accepted, accepted);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    CHECK_EQ_INT(st.n_blocks_free + st.n_blocks_cached, st.n_blocks_total);
    printf("%s, %s: %d/%d requests identical, %ld of %ld drafted tokens accepted, %llu verify "
           "steps, %llu steps\n",
           name, what, n_same, n, accepted, drafted, (unsigned long long)st.n_spec_steps,
           (unsigned long long)st.n_steps);
    *accepted_out = accepted;
    *drafted_out = drafted;
}

static void run_model(const char *name, int natural)
{
    static struct oracle o;
    struct model *m = oracle_open(name, &o);
    if (!m) return;
    struct cairn_err err = {0};
    int vocab = model_get_info(m)->vocab_size;
    static int32_t p[N_REQ][200];
    int len[N_REQ];
    int n = make_prompts(&o, vocab, p, len);
    static struct collect ref[N_REQ], tight[N_REQ];

    struct engine *e = make_engine(m, ENGINE_SPEC_OFF, 64ull << 20);
    run_batch(e, p, len, n, 0, ref);
    struct engine_stats st;
    collect_wait_idle(e, (uint64_t)n);
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_spec_drafted, 0);
    engine_destroy(e);

    /* the scripted drafter: both outcomes whatever the model */
    script = (struct script){
        .prompts = (const int32_t(*)[200])p, .len = len, .ref = ref, .n = n, .vocab = vocab};
    long accepted, drafted;
    e = make_engine_d(m, ENGINE_SPEC_NGRAM, 64ull << 20, 1);
    check_spec_run(e, name, "scripted drafts", p, len, n, ref, &accepted, &drafted);
    CHECK_MSG(accepted > 0 && accepted < drafted, "%s: %ld of %ld scripted draft tokens accepted",
              name, accepted, drafted);
    engine_destroy(e);

    /* prompt lookup: the dense and MoE tiny models fall into loops of their own output, which the
     * drafter then predicts (the hybrid ones do not: their output never repeats) */
    e = make_engine(m, ENGINE_SPEC_NGRAM, 64ull << 20);
    check_spec_run(e, name, "prompt lookup", p, len, n, ref, &accepted, &drafted);
    if (natural)
        CHECK_MSG(accepted > 0 && accepted < drafted,
                  "%s: %ld of %ld prompt-lookup draft tokens accepted", name, accepted, drafted);

    /* seeded sampling: the same tokens with and without speculation (spec_verify.h) */
    struct collect s_on, s_off;
    for (int pass = 0; pass < 2; pass++) {
        struct collect *c = pass ? &s_on : &s_off;
        struct engine_request r = collect_request(c, p[n - 1], len[n - 1], N_GEN);
        r.ignore_eos = 1;
        r.sampling.temperature = 0.8f;
        r.sampling.top_k = 20;
        r.sampling.seed = 4242;
        r.sampling.has_seed = 1;
        r.speculative = pass ? ENGINE_SPEC_NGRAM : ENGINE_SPEC_OFF;
        CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
        CHECK(collect_wait(c, 1));
    }
    CHECK_MSG(same_tokens(&s_on, &s_off), "%s: seeded sampling differs with speculation", name);
    if (natural) CHECK(s_on.usage.spec_drafted > 0);
    engine_destroy(e);

    /* a pool of 24 blocks of 16 tokens for 6 requests of up to ~150 tokens: preemption while
     * speculating, drafts cut to the blocks they have */
    {
        const struct model_info *mi = model_get_info(m);
        uint64_t per_block = 2ull * (uint64_t)mi->n_kv_layers * 16 * (uint64_t)mi->n_kv_heads *
                             (uint64_t)mi->head_dim * 4;
        e = make_engine_d(m, ENGINE_SPEC_NGRAM, 24 * per_block, 1);
    }
    run_batch(e, p, len, n, 0, tight);
    collect_wait_idle(e, (uint64_t)n);
    engine_get_stats(e, &st);
    for (int i = 0; i < n; i++)
        CHECK_MSG(same_tokens(&ref[i], &tight[i]), "%s request %d: differs in a tight pool", name,
                  i);
    printf("%s, tight pool: %llu preemptions, %llu drafted, %llu accepted\n", name,
           (unsigned long long)st.n_preemptions, (unsigned long long)st.n_spec_drafted,
           (unsigned long long)st.n_spec_accepted);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    engine_destroy(e);
    model_free(m);
}

/* A backend whose rows are exact only in steps of at most exact_rows (the GPU: tensor/backend.h):
 * the planner keeps decode + drafts inside it (exact_rows 4: at most 3 drafted tokens per verify
 * step of one request; 1: none), and greedy output stays the reference's. */
static void test_exact_rows(void)
{
    static struct oracle o;
    struct model *m = oracle_open("qwen3-tiny", &o);
    if (!m) return;
    int vocab = model_get_info(m)->vocab_size;
    static int32_t p[N_REQ][200];
    int len[N_REQ];
    int n = make_prompts(&o, vocab, p, len);
    static struct collect ref[N_REQ];
    struct engine *e = make_engine(m, ENGINE_SPEC_OFF, 64ull << 20);
    run_batch(e, p, len, n, 0, ref);
    collect_wait_idle(e, (uint64_t)n);
    engine_destroy(e);
    script = (struct script){
        .prompts = (const int32_t(*)[200])p, .len = len, .ref = ref, .n = n, .vocab = vocab};
    struct backend *be = model_backend(m);
    const int limits[2] = {4, 1};
    for (int li = 0; li < 2; li++) {
        be->exact_rows = limits[li];
        e = make_engine_d(m, ENGINE_SPEC_NGRAM, 64ull << 20, 1);
        struct collect c;
        struct cairn_err err = {0};
        struct engine_request r = collect_request(&c, p[n - 1], len[n - 1], N_GEN);
        r.ignore_eos = 1;
        CHECK_MSG(engine_submit(e, &r, NULL, &err) == CAIRN_OK, "%s", err.msg);
        CHECK(collect_wait(&c, 1));
        collect_wait_idle(e, 1);
        struct engine_stats st;
        engine_get_stats(e, &st);
        CHECK_MSG(same_tokens(&ref[n - 1], &c), "exact_rows %d: tokens differ", limits[li]);
        if (limits[li] == 1)
            CHECK_EQ_INT(st.n_spec_drafted, 0);
        else
            CHECK_MSG(st.n_spec_drafted > 0 && st.n_spec_drafted <= 3 * st.n_spec_steps,
                      "exact_rows 4: %llu drafted in %llu verify steps",
                      (unsigned long long)st.n_spec_drafted, (unsigned long long)st.n_spec_steps);
        printf("exact_rows %d: %llu drafted, %llu accepted, %llu verify steps\n", limits[li],
               (unsigned long long)st.n_spec_drafted, (unsigned long long)st.n_spec_accepted,
               (unsigned long long)st.n_spec_steps);
        engine_destroy(e);
    }
    be->exact_rows = 0;
    model_free(m);
}

static void test_bad_options(void)
{
    char dir[1024];
    test_src_path("tests/data/oracle/models/qwen3-tiny", dir, sizeof(dir));
    struct model *m = NULL;
    struct cairn_err err = {0};
    if (model_load(dir, test_cpu_be(), &m, &err) != CAIRN_OK) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.speculative = ENGINE_SPEC_NGRAM;
    o.spec_k_max = 17;
    struct engine *e = NULL;
    CHECK(engine_create(m, &o, &e, &err) == CAIRN_ERR_INVALID && !e);
    CHECK(strstr(err.msg, "spec_k_max") != NULL);
    o.spec_k_max = 0;
    o.spec_cost_slope = -1;
    CHECK(engine_create(m, &o, &e, &err) == CAIRN_ERR_INVALID && !e);
    CHECK(strstr(err.msg, "spec_cost_slope") != NULL);
    o.spec_cost_slope = 0;
    o.spec_ngram_min = 5;
    o.spec_ngram_max = 3;
    CHECK(engine_create(m, &o, &e, &err) == CAIRN_ERR_INVALID && !e);
    CHECK(strstr(err.msg, "n-gram") != NULL);
    o.spec_ngram_min = o.spec_ngram_max = 0;
    CHECK(engine_create(m, &o, &e, &err) == CAIRN_OK);
    struct collect c;
    int32_t prompt[3] = {1, 2, 3};
    struct engine_request r = collect_request(&c, prompt, 3, 4);
    r.speculative = (enum engine_spec_mode)9;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_ERR_INVALID);
    CHECK(strstr(err.msg, "speculative") != NULL);
    engine_destroy(e);
    model_free(m);
    CHECK_EQ_INT(engine_spec_mode_parse("ngram"), ENGINE_SPEC_NGRAM);
    CHECK_EQ_INT(engine_spec_mode_parse("auto"), ENGINE_SPEC_AUTO);
    CHECK_EQ_INT(engine_spec_mode_parse("off"), ENGINE_SPEC_OFF);
    CHECK_EQ_INT(engine_spec_mode_parse("mtp"), ENGINE_SPEC_MTP);
    CHECK_EQ_INT(engine_spec_mode_parse("eagle"), -1);
}

int main(void)
{
    CHECK(test_cpu_be() != NULL); /* the real kernels, as the server runs them */
    uint64_t other0 = cairn_mem_used(CAIRN_MEM_OTHER), state0 = cairn_mem_used(CAIRN_MEM_STATE);
    run_model("qwen3-tiny", 1);
    run_model("qwen3-moe-tiny", 1);
    run_model("qwen3_5-tiny", 0);
    test_exact_rows();
    test_bad_options();
    /* n-gram indexes and state copies are all returned */
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_OTHER), other0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_STATE), state0);
    return test_summary("test_spec_engine");
}
