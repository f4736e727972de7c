/* The engine over real (tiny) models, checked against the Hugging Face oracle
 * (tests/data/oracle/models/{qwen3-tiny,llama-tiny}, f32 KV; llama-tiny only for the first point):
 * - every case's greedy continuation equals case{i}.tokens where the oracle's margin is large,
 *   alone and with all cases in flight at once (batching never changes results);
 * - a prefix-cache hit gives the same tokens and logprobs as cold computation;
 * - a shared system prompt is stored once (block counts from engine_get_stats);
 * - in a tiny KV pool every request still completes with the same tokens (under the session-11
 *   scheduler that preempts: recomputation gives the same tokens);
 * - cancellation returns the blocks to baseline;
 * - seeded sampling is reproducible whatever else is in the batch.
 * Hybrid models are in test_engine_hybrid.c. */
#include "base/file.h"
#include "base/mem.h"
#include "engine/engine.h"
#include "engine_oracle_util.h"
#include "engine_testutil.h"
#include "model/model.h"
#include "testlib.h"
#include "test_backend.h"

static void run_model(const char *name, int full)
{
    static struct oracle o;
    struct model *m = oracle_open(name, &o);
    if (!m) return;
    struct cairn_err err = {0};
    const struct model_info *info = model_get_info(m);
    int n = o.n_cases;
    int n_gen[MAX_CASES];
    for (int i = 0; i < n; i++) n_gen[i] = o.cases[i].total_len - o.cases[i].prompt_len;

    /* 1. each case alone (cache cleared in between), then all at once */
    int n_trusted_total = 0;
    struct engine *e = oracle_engine(m, 16, 64ull << 20, 8);
    static struct collect alone[MAX_CASES], together[MAX_CASES];
    for (int i = 0; i < n; i++) {
        struct engine_request r = collect_request(&alone[i], o.cases[i].tokens, o.cases[i].prompt_len, n_gen[i]);
        r.ignore_eos = 1;
        CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
        CHECK(collect_wait(&alone[i], 1));
        engine_cache_clear(e);
        int trusted = oracle_n_trusted(&o.cases[i]);
        CHECK_EQ_INT(alone[i].n_tokens, n_gen[i]);
        int match = 0;
        while (match < trusted && alone[i].tokens[match] == o.cases[i].tokens[o.cases[i].prompt_len + match]) match++;
        CHECK_MSG(match == trusted, "%s case %d: %d of %d trusted greedy tokens match the oracle", name, i, match, trusted);
        n_trusted_total += match;
        printf("%s case %d: prompt %d, %d/%d greedy tokens trusted and matching\n", name, i,
               o.cases[i].prompt_len, match, n_gen[i]);
    }
    CHECK_MSG(n_trusted_total >= 4 * n, "%s: only %d oracle tokens checked", name, n_trusted_total);
    for (int i = 0; i < n; i++) {
        struct engine_request r = collect_request(&together[i], o.cases[i].tokens, o.cases[i].prompt_len, n_gen[i]);
        r.ignore_eos = 1;
        CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    }
    CHECK(collect_wait(together, n));
    for (int i = 0; i < n; i++) CHECK_MSG(same_tokens(&alone[i], &together[i]), "%s case %d batched != alone", name, i);
    engine_destroy(e);
    if (!full) { /* keeps the test well under a minute under ASan */
        model_free(m);
        return;
    }

    /* 2. prefix hit == cold: same tokens and logprobs; 3. shared system prompt stored once */
    /* the longest prompt of at most 128 tokens (the 300-token case would double the run time) */
    const struct oracle_case *big = NULL;
    for (int i = 0; i < n; i++)
        if (o.cases[i].prompt_len <= 128 && (!big || o.cases[i].prompt_len > big->prompt_len)) big = &o.cases[i];
    CHECK(big && big->prompt_len >= 64);
    if (!big) return;
    e = oracle_engine(m, 16, 64ull << 20, 8);
    struct collect cold, warm;
    struct engine_request r = collect_request(&cold, big->tokens, big->prompt_len, 8);
    r.sampling.logprobs = 1;
    r.sampling.top_logprobs = 3;
    r.ignore_eos = 1;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&cold, 1));
    r.user = &warm;
    memset(&warm, 0, sizeof(warm));
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&warm, 1));
    CHECK_EQ_INT(cold.usage.cached_tokens, 0);
    CHECK_EQ_INT(warm.usage.cached_tokens, (big->prompt_len - 1) / 16 * 16);
    CHECK(same_tokens(&cold, &warm));
    double max_d = 0;
    for (int i = 0; i < cold.n_tokens; i++) {
        double d = fabs((double)cold.logprobs[i] - (double)warm.logprobs[i]);
        if (d > max_d) max_d = d;
    }
    CHECK_MSG(max_d < 1e-4, "%s: prefix hit logprobs differ by %g", name, max_d);
    engine_cache_clear(e);

    /* shared system prompt: 3 requests = first 64 tokens of the big prompt + distinct suffixes */
    enum { NS = 3 };
    static int32_t sp[NS][100];
    static struct collect sc[NS];
    for (int i = 0; i < NS; i++) {
        memcpy(sp[i], big->tokens, 64 * sizeof(int32_t));
        for (int j = 0; j < 20; j++) sp[i][64 + j] = (int32_t)((j * 13 + i * 101 + 7) % info->vocab_size);
        r = collect_request(&sc[i], sp[i], 84, 4);
        r.ignore_eos = 1;
        CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    }
    CHECK(collect_wait(sc, NS));
    collect_wait_idle(e, 2 + NS);
    struct engine_stats st;
    engine_get_stats(e, &st);
    /* 84 + 4 tokens, 87 in KV: 5 full blocks of 16 each; 4 shared (the 64-token prompt) + 1 own */
    CHECK_EQ_INT(st.n_blocks_cached, 4 + NS);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    engine_destroy(e);

    /* 4. tiny pool: every request completes with the tokens it gets alone. The admission gate
     * (sched.c) holds the others back while the longest runs, so it seldom preempts; session 11's
     * scheduler (CAIRN_ENGINE_SCHED=legacy) admits them and must preempt: that pass checks that
     * recomputation after preemption gives the same tokens. */
    int need = 0;
    for (int i = 0; i < n; i++) need = CAIRN_MAX(need, (o.cases[i].total_len + 15) / 16);
    size_t block_bytes = 2 * (size_t)info->n_kv_layers * 16 * (size_t)info->n_kv_heads * (size_t)info->head_dim * 4;
    for (int legacy = 0; legacy < 2; legacy++) {
        if (legacy) setenv("CAIRN_ENGINE_SCHED", "legacy", 1); /* read at engine creation */
        e = oracle_engine(m, 16, (uint64_t)(need + 2) * block_bytes, 8);
        if (legacy) unsetenv("CAIRN_ENGINE_SCHED");
        for (int i = n - 1; i >= 0; i--) { /* the longest first: it holds most blocks when others come */
            r = collect_request(&together[i], o.cases[i].tokens, o.cases[i].prompt_len, n_gen[i]);
            r.ignore_eos = 1;
            CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
        }
        CHECK(collect_wait(together, n));
        for (int i = 0; i < n; i++)
            CHECK_MSG(same_tokens(&alone[i], &together[i]), "%s case %d in a tiny pool (%s) != alone", name, i,
                      legacy ? "legacy" : "gated");
        collect_wait_idle(e, (uint64_t)n);
        engine_get_stats(e, &st);
        if (legacy)
            CHECK_MSG(st.n_preemptions > 0, "%s: expected preemptions with %d blocks", name, st.n_blocks_total);
        CHECK_EQ_INT(st.n_blocks_used, 0);
        printf("%s: tiny pool of %d blocks (%s scheduler), %llu preemptions\n", name, st.n_blocks_total,
               legacy ? "legacy" : "gated", (unsigned long long)st.n_preemptions);
        engine_destroy(e);
    }
    e = oracle_engine(m, 16, (uint64_t)(need + 2) * block_bytes, 8);

    /* 5. cancellation returns blocks to baseline */
    struct collect cc;
    r = collect_request(&cc, big->tokens, big->prompt_len, 0);
    cc.cancel_engine = e;
    cc.cancel_after = 3;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&cc, 1));
    CHECK_EQ_INT(cc.finish, ENGINE_FINISH_CANCELLED);
    collect_wait_idle(e, 1);
    engine_get_stats(e, &st);
    CHECK_EQ_INT(st.n_blocks_used, 0);
    engine_destroy(e);

    /* 6. seeded sampling: same tokens alone and in a busy batch */
    e = oracle_engine(m, 16, 64ull << 20, 8);
    struct collect s1, s2;
    static struct collect others[MAX_CASES];
    r = collect_request(&s1, o.cases[0].tokens, o.cases[0].prompt_len, 16);
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 7;
    r.sampling.has_seed = 1;
    r.ignore_eos = 1;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&s1, 1));
    engine_cache_clear(e);
    for (int i = 0; i < n; i++) {
        struct engine_request ro = collect_request(&others[i], o.cases[i].tokens, o.cases[i].prompt_len, 12);
        ro.sampling.temperature = 1.0f;
        ro.ignore_eos = 1;
        CHECK(engine_submit(e, &ro, NULL, &err) == CAIRN_OK);
    }
    r.user = &s2;
    memset(&s2, 0, sizeof(s2));
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&s2, 1));
    CHECK(collect_wait(others, n));
    CHECK(same_tokens(&s1, &s2));
    engine_destroy(e);
    model_free(m);
}


int main(void)
{
    /* the real kernels (SIMD, thread pool), as the server runs them */
    CHECK(test_cpu_be() != NULL);
    run_model("qwen3-tiny", 1);
    run_model("llama-tiny", 0);
    return test_summary("test_engine_oracle");
}
