/* MTP drafting in the engine (--speculative mtp), on the tiny hybrid checkpoints with a random MTP
 * head (tests/data/mtp: qwen3_5-tiny dense, qwen3next-tiny MoE; both with DeltaNet state rolled
 * back after a cut draft).
 *
 * Reference: the requests decoded with speculation off, all in flight at once. Then with
 * --speculative mtp, in one batch where every other request opts out (and one asks for prompt
 * lookup instead, which the head then never drafts for): greedy tokens identical,
 * blocks all returned, usage and stats counting the drafts. A random head drafts what the target
 * then emits about once in a thousand (make_fixtures.py prints it), so one run scripts acceptance
 * over the head's drafts (engine_opts.mtp_script, called only after the head drafted): a prefix of
 * each draft is replaced by the reference continuation and the rest is the head's own, so drafts
 * are accepted in full, cut and rejected; the head's own positions go through the KV rollback.
 * Also: the head unscripted (its own drafts only; some of them recomputed from scratch outside the
 * engine must come out the same), auto picking the head, a tight KV pool
 * (preemption while drafting), a head priced out (decodes then do not feed it: it runs over the
 * prompts only), and a model without mtp.* weights: --speculative mtp is refused
 * with a clear error, auto serves it (with n-grams), and a request asking mtp there is refused. */
#include "base/mem.h"
#include "kv/kv_pool.h"
#include "engine_oracle_util.h"
#include "model/model.h"
#include "test_backend.h"

#define N_REQ 6
#define N_GEN 32

#define N_OBS 12
#define OBS_MAX (200 + N_GEN + 8)

/* What the head drafted after a sequence (recorded by the observer, checked offline). */
struct obs {
    int32_t tokens[OBS_MAX];
    int n_tokens;
    int32_t draft[8];
    int n_draft;
};

static struct script {
    const int32_t (*prompts)[200];
    const int *len;
    const struct collect *ref;
    int n;
    int observe;                 /* only record the head's drafts, change nothing */
    long n_calls, n_head_tokens; /* calls, and draft tokens left as the head made them */
    long n_seen[N_REQ];          /* calls per request */
    struct obs obs[N_OBS];
    int n_obs;
} script;

/* out[0, max_k) holds the head's draft: a prefix of it becomes the reference continuation. */
static int script_draft(void *ctx, const int32_t *tokens, int n_tokens, int max_k, int32_t *out)
{
    struct script *sc = ctx;
    sc->n_calls++;
    if (sc->observe) {
        /* every third call, so the observations spread over steps and requests */
        if (sc->n_obs < N_OBS && sc->n_calls % 3 == 1 && n_tokens <= OBS_MAX && max_k <= 8) {
            struct obs *o = &sc->obs[sc->n_obs++];
            memcpy(o->tokens, tokens, sizeof(int32_t) * (size_t)n_tokens);
            o->n_tokens = n_tokens;
            memcpy(o->draft, out, sizeof(int32_t) * (size_t)max_k);
            o->n_draft = max_k;
        }
        return max_k;
    }
    for (int r = 0; r < sc->n; r++) {
        if (sc->len[r] > n_tokens ||
            memcmp(tokens, sc->prompts[r], (size_t)sc->len[r] * sizeof(int32_t)) != 0)
            continue;
        sc->n_seen[r]++;
        int g = n_tokens - sc->len[r];
        int keep = (n_tokens * 7) % (max_k + 2); /* 0 .. max_k + 1: none, some or all right */
        for (int j = 0; j < max_k; j++) {
            if (j < keep) {
                int at = g + j < sc->ref[r].n_tokens ? g + j : sc->ref[r].n_tokens - 1;
                out[j] = sc->ref[r].tokens[at];
            } else {
                sc->n_head_tokens++;
            }
        }
        return max_k;
    }
    return max_k;
}

static struct engine *make_engine(struct model *m, enum engine_spec_mode mode, uint64_t kv_bytes,
                                  int scripted)
{
    struct engine_opts o;
    oracle_engine_opts(&o, 16, kv_bytes, 8);
    o.speculative = mode;
    o.spec_cost_slope = 0.05; /* fixed: which steps draft must not depend on ASan timings */
    o.spec_draft_cost = 0.01; /* likewise the head's own cost (test_spec_ctl checks its charge) */
    o.spec_k_max = 4;
    if (scripted) {
        o.mtp_script.ctx = &script;
        o.mtp_script.draft = script_draft;
    }
    return oracle_engine_create(m, &o);
}

/* Random prompts, and copy-heavy ones (a span repeated with an edit). */
static int make_prompts(int vocab, int32_t p[N_REQ][200], int *len)
{
    uint64_t x = 777;
    for (int n = 0; n < N_REQ; n++) {
        int span = 9 + 7 * n, l = 0, reps = n % 2 ? 3 : 1;
        for (int j = 0; j < span; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            p[n][l++] = (int32_t)((x >> 33) % (uint64_t)vocab);
        }
        for (int rep = 1; rep < reps; rep++)
            for (int j = 0; j < span; j++)
                p[n][l++] = j == span / 2 ? (p[n][j] + 1) % vocab : p[n][j];
        len[n] = l;
    }
    return N_REQ;
}

static void run_batch(struct engine *e, int32_t p[N_REQ][200], const int *len, int n, int mix,
                      struct collect *out)
{
    struct cairn_err err = {0};
    for (int i = 0; i < n; i++) {
        struct engine_request r = collect_request(&out[i], p[i], len[i], N_GEN);
        r.ignore_eos = 1;
        if (mix && i % 2) r.speculative = ENGINE_SPEC_OFF;
        if (mix && i == 2) r.speculative = ENGINE_SPEC_NGRAM; /* prompt lookup on an MTP engine */
        CHECK_MSG(engine_submit(e, &r, NULL, &err) == CAIRN_OK, "%s", err.msg);
    }
    CHECK(collect_wait(out, n));
}

static void check_run(struct engine *e, const char *name, const char *what, int32_t p[N_REQ][200],
                      const int *len, int n, int mix, const struct collect *ref, long *accepted_out,
                      long *drafted_out)
{
    static struct collect spec[N_REQ];
    struct engine_stats st;
    run_batch(e, p, len, n, mix, spec);
    collect_wait_idle(e, (uint64_t)n);
    engine_get_stats(e, &st);
    long drafted = 0, accepted = 0;
    int n_same = 0;
    for (int i = 0; i < n; i++) {
        int same = same_tokens(&ref[i], &spec[i]);
        n_same += same;
        CHECK_MSG(same, "%s, %s: request %d: tokens differ with MTP speculation", name, what, i);
        CHECK_EQ_INT(spec[i].usage.completion_tokens, N_GEN);
        CHECK(spec[i].usage.spec_accepted <= spec[i].usage.spec_drafted);
        if (mix && i % 2) CHECK_EQ_INT(spec[i].usage.spec_drafted, 0);
        drafted += spec[i].usage.spec_drafted;
        accepted += spec[i].usage.spec_accepted;
    }
    CHECK_EQ_INT(st.n_spec_drafted, drafted);
    CHECK_EQ_INT(st.n_spec_accepted, accepted);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    CHECK_EQ_INT(st.n_blocks_free + st.n_blocks_cached, st.n_blocks_total);
    printf(
        "%s, %s: %d/%d identical, %ld of %ld drafted accepted, %llu verify steps, %llu steps, %llu "
        "preemptions\n",
        name, what, n_same, n, accepted, drafted, (unsigned long long)st.n_spec_steps,
        (unsigned long long)st.n_steps, (unsigned long long)st.n_preemptions);
    *accepted_out = accepted;
    *drafted_out = drafted;
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Recomputes an observed draft from scratch, outside the engine: the target over the sequence
 * but its last token, the head over every position, then chained on the engine's own drafts.
 * Each draft token must be the argmax (or within float noise of it). */
static void check_obs(struct model *m, const struct obs *o, const char *name)
{
    const struct model_info *mi = model_get_info(m);
    int V = mi->vocab_size, H = mi->hidden_size, N = o->n_tokens;
    struct kv_pool kv;
    struct cairn_err err = {0};
    CHECK(kv_pool_init(&kv, test_cpu_be(), mi->n_kv_layers, OBS_MAX / 16 + 2, 16, mi->n_kv_heads,
                       mi->head_dim, DTYPE_F32, &err) == CAIRN_OK);
    int32_t table[OBS_MAX / 16 + 2];
    for (int i = 0; i < OBS_MAX / 16 + 2; i++)
        table[i] = i;
    float *hid = malloc(sizeof(float) * (size_t)H * (size_t)N),
          *lg = malloc(sizeof(float) * (size_t)V);
    float *g = malloc(sizeof(float) * (size_t)H);
    void *state = malloc(mi->state_bytes);
    model_state_init(m, state);
    struct model_seq s = {.tokens = o->tokens,
                          .n_tokens = N - 1,
                          .pos0 = 0,
                          .block_table = table,
                          .state = state,
                          .n_hidden = N - 1,
                          .hidden = hid};
    CHECK_MSG(model_forward(m, kv_pool_view(&kv), &s, 1, &err) == CAIRN_OK, "%s", err.msg);
    struct model_mtp_seq q = {.tokens = o->tokens + 1,
                              .hidden = hid,
                              .n_tokens = N - 1,
                              .pos0 = 0,
                              .block_table = table,
                              .n_out = 1,
                              .logits = lg,
                              .hidden_out = g};
    for (int j = 0; j < o->n_draft; j++) {
        if (j > 0)
            q = (struct model_mtp_seq){.tokens = &o->draft[j - 1],
                                       .hidden = g,
                                       .n_tokens = 1,
                                       .pos0 = N - 2 + j,
                                       .block_table = table,
                                       .n_out = 1,
                                       .logits = lg,
                                       .hidden_out = g};
        CHECK_MSG(model_mtp_forward(m, kv_pool_view(&kv), &q, 1, &err) == CAIRN_OK, "%s", err.msg);
        int top = argmax(lg, V);
        CHECK_MSG(o->draft[j] == top || lg[o->draft[j]] >= lg[top] - 1e-3f,
                  "%s: after %d tokens, draft %d is %d (logit %g), the head says %d (%g)", name, N,
                  j, o->draft[j], lg[o->draft[j]], top, lg[top]);
    }
    free(hid);
    free(lg);
    free(g);
    free(state);
    kv_pool_free(&kv);
}

static void run_priced_out(struct model *m, const char *name, int32_t p[N_REQ][200], const int *len);

static void run_model(const char *name)
{
    char dir[1024], rel[256];
    snprintf(rel, sizeof(rel), "tests/data/mtp/%s", name);
    test_src_path(rel, dir, sizeof(dir));
    struct model *m = NULL;
    struct cairn_err err = {0};
    int rc = model_load(dir, test_cpu_be(), &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    if (rc) return;
    const struct model_info *mi = model_get_info(m);
    CHECK_EQ_INT(mi->n_mtp_layers, 1);
    static int32_t p[N_REQ][200];
    int len[N_REQ];
    int n = make_prompts(mi->vocab_size, p, len);
    static struct collect ref[N_REQ];

    struct engine *e = make_engine(m, ENGINE_SPEC_OFF, 64ull << 20, 0);
    run_batch(e, p, len, n, 0, ref);
    collect_wait_idle(e, (uint64_t)n);
    engine_destroy(e);

    long accepted, drafted;
    script = (struct script){.prompts = (const int32_t(*)[200])p, .len = len, .ref = ref, .n = n};
    e = make_engine(m, ENGINE_SPEC_MTP, 64ull << 20, 1);
    check_run(e, name, "scripted over the head", p, len, n, 1, ref, &accepted, &drafted);
    CHECK_MSG(accepted > 0 && accepted < drafted, "%s: %ld of %ld drafted accepted", name, accepted,
              drafted);
    CHECK(script.n_calls > 0 && script.n_head_tokens > 0);
    CHECK_EQ_INT(script.n_seen[2], 0); /* it asked for n-grams: the head never drafted for it */
    CHECK(script.n_seen[0] > 0 && script.n_seen[4] > 0);
    engine_destroy(e);

    /* the head's own drafts, every request speculating; auto picks the head; some drafts are
     * recomputed offline: the engine's head (catch-up over chunks, KV in the sequence's blocks,
     * rolled back after rejections) drafts what the head computed from scratch drafts */
    script.observe = 1;
    script.n_obs = 0;
    script.n_calls = 0;
    e = make_engine(m, ENGINE_SPEC_AUTO, 64ull << 20, 1);
    check_run(e, name, "head only (auto)", p, len, n, 0, ref, &accepted, &drafted);
    CHECK_MSG(drafted > 0, "%s: the head drafted nothing", name);
    engine_destroy(e);
    CHECK(script.n_obs >= 4);
    for (int i = 0; i < script.n_obs; i++)
        check_obs(m, &script.obs[i], name);
    script.observe = 0;

    /* 20 blocks of 16 tokens for 6 requests of up to ~150 tokens: preemption while drafting */
    uint64_t per_block = 2ull * (uint64_t)mi->n_kv_layers * 16 * (uint64_t)mi->n_kv_heads *
                         (uint64_t)mi->head_dim * 4;
    script.n_calls = 0;
    e = make_engine(m, ENGINE_SPEC_MTP, 20 * per_block, 1);
    check_run(e, name, "tight pool", p, len, n, 0, ref, &accepted, &drafted);
    CHECK(accepted > 0);
    engine_destroy(e);
    run_priced_out(m, name, p, len);
    model_free(m);
}

/* A head that never pays (each drafted token priced at a whole step): decodes do not feed it.
 * Two requests of 200 tokens (more than SPEC_MTP_BACKLOG, which a parked stretch used to fill
 * and catch up) give the tokens of speculation off, draft nothing, and the head runs at most
 * over their prompts (these short ones wait in the backlog and never run). */
static void run_priced_out(struct model *m, const char *name, int32_t p[N_REQ][200], const int *len)
{
    enum { N = 2, GEN = 200 };
    static struct collect ref[N], got[N];
    int prompt_rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct engine_opts o;
        oracle_engine_opts(&o, 16, 64ull << 20, 8);
        o.speculative = pass ? ENGINE_SPEC_MTP : ENGINE_SPEC_OFF;
        o.spec_cost_slope = 0.05;
        o.spec_draft_cost = 1.0; /* a drafted token costs a step: never pays (spec_ctl.h) */
        struct engine *e = oracle_engine_create(m, &o);
        struct collect *out = pass ? got : ref;
        struct cairn_err err = {0};
        for (int i = 0; i < N; i++) {
            struct engine_request r = collect_request(&out[i], p[i], len[i], GEN);
            r.ignore_eos = 1;
            CHECK_MSG(engine_submit(e, &r, NULL, &err) == CAIRN_OK, "%s", err.msg);
            if (pass) prompt_rows += len[i];
        }
        CHECK(collect_wait(out, N));
        collect_wait_idle(e, N);
        struct engine_stats st;
        engine_get_stats(e, &st);
        if (pass) {
            CHECK_EQ_INT(st.n_spec_drafted, 0);
            CHECK_MSG(st.n_spec_head_rows <= (uint64_t)prompt_rows,
                      "%s priced out: the head ran %llu positions for prompts of %d", name,
                      (unsigned long long)st.n_spec_head_rows, prompt_rows);
            printf("%s, head priced out: head ran %llu positions (prompts %d, %d generated)\n", name,
                   (unsigned long long)st.n_spec_head_rows, prompt_rows, N * GEN);
        }
        engine_destroy(e);
    }
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(got[i].n_tokens, GEN);
        CHECK_MSG(got[i].n_tokens == ref[i].n_tokens &&
                      memcmp(got[i].tokens, ref[i].tokens, sizeof(int32_t) * (size_t)GEN) == 0,
                  "%s priced out: request %d: tokens differ", name, i);
    }
}

/* The oracle checkpoint has no mtp.* weights. */
static void test_no_head(void)
{
    char dir[1024];
    test_src_path("tests/data/oracle/models/qwen3_5-tiny", dir, sizeof(dir));
    struct model *m = NULL;
    struct cairn_err err = {0};
    if (model_load(dir, test_cpu_be(), &m, &err) != CAIRN_OK) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    struct engine_opts o;
    oracle_engine_opts(&o, 16, 16ull << 20, 4);
    o.speculative = ENGINE_SPEC_MTP;
    struct engine *e = NULL;
    CHECK(engine_create(m, &o, &e, &err) == CAIRN_ERR_INVALID);
    CHECK(e == NULL);
    CHECK_MSG(strstr(err.msg, "MTP head") && strstr(err.msg, "mtp.*"), "%s", err.msg);
    printf("no head, --speculative mtp: %s\n", err.msg);

    o.speculative = ENGINE_SPEC_AUTO; /* falls back to prompt lookup */
    e = oracle_engine_create(m, &o);
    if (e) {
        struct collect c[2];
        int32_t prompt[24];
        for (int i = 0; i < 24; i++)
            prompt[i] = (i % 8) * 3 + 1;
        struct engine_request r = collect_request(&c[0], prompt, 24, 8);
        r.ignore_eos = 1;
        CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
        struct engine_request r2 = collect_request(&c[1], prompt, 24, 8);
        r2.speculative = ENGINE_SPEC_MTP;
        CHECK(engine_submit(e, &r2, NULL, &err) == CAIRN_ERR_INVALID);
        CHECK_MSG(strstr(err.msg, "MTP head") != NULL, "%s", err.msg);
        CHECK(collect_wait(c, 1));
        CHECK_EQ_INT(c[0].n_tokens, 8);
        engine_destroy(e);
    }
    model_free(m);
}

int main(void)
{
    CHECK(test_cpu_be() != NULL);
    uint64_t other0 = cairn_mem_used(CAIRN_MEM_OTHER), state0 = cairn_mem_used(CAIRN_MEM_STATE);
    run_model("qwen3_5-tiny");
    run_model("qwen3next-tiny");
    test_no_head();
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_OTHER), other0);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_STATE), state0);
    return test_summary("test_spec_mtp_engine");
}
