/* The engine over a hybrid model (qwen3_5-tiny: Gated DeltaNet recurrent state + attention),
 * against the Hugging Face oracle: greedy tokens alone and batched, and a prefix hit restored
 * from a recurrent-state snapshot. */
#include "base/mem.h"
#include "engine_oracle_util.h"
#include "test_backend.h"
#include "model/model.h"

/* Hybrid models (recurrent state + attention): oracle greedy alone and batched, and a prefix hit
 * restored from a state snapshot gives the same tokens (logprobs within float tolerance: the
 * recurrence runs in different chunks). Cases with prompts up to 80 tokens keep ASan time low. */
static void run_hybrid(const char *name)
{
    static struct oracle o;
    uint64_t state_mem0 = cairn_mem_used(CAIRN_MEM_STATE);
    struct model *m = oracle_open(name, &o);
    if (!m) return;
    struct cairn_err err = {0};
    CHECK(model_get_info(m)->state_bytes > 0);
    int idx[MAX_CASES], n = 0;
    for (int i = 0; i < o.n_cases; i++)
        if (o.cases[i].prompt_len <= 80) idx[n++] = i;
    CHECK(n >= 2);
    struct engine *e = oracle_engine(m, 16, 64ull << 20, 8);
    static struct collect alone[MAX_CASES], together[MAX_CASES];
    for (int j = 0; j < n; j++) {
        const struct oracle_case *c = &o.cases[idx[j]];
        struct engine_request r = collect_request(&alone[j], c->tokens, c->prompt_len, c->total_len - c->prompt_len);
        r.ignore_eos = 1;
        CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
        CHECK(collect_wait(&alone[j], 1));
        engine_cache_clear(e);
        int trusted = oracle_n_trusted(c), match = 0;
        while (match < trusted && alone[j].tokens[match] == c->tokens[c->prompt_len + match]) match++;
        CHECK_MSG(match == trusted, "%s case %d: %d of %d trusted greedy tokens match", name, idx[j], match, trusted);
        printf("%s case %d: prompt %d, %d/%d greedy tokens trusted and matching\n", name, idx[j], c->prompt_len,
               match, c->total_len - c->prompt_len);
    }
    for (int j = 0; j < n; j++) {
        const struct oracle_case *c = &o.cases[idx[j]];
        struct engine_request r = collect_request(&together[j], c->tokens, c->prompt_len, c->total_len - c->prompt_len);
        r.ignore_eos = 1;
        CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    }
    CHECK(collect_wait(together, n));
    for (int j = 0; j < n; j++) CHECK_MSG(same_tokens(&alone[j], &together[j]), "%s case %d batched != alone", name, idx[j]);
    engine_cache_clear(e);

    /* prefix hit from a snapshot: the longest <= 80 prompt, twice */
    const struct oracle_case *c = &o.cases[idx[n - 1]];
    struct collect cold, warm;
    struct engine_request r = collect_request(&cold, c->tokens, c->prompt_len, 8);
    r.sampling.logprobs = 1;
    r.ignore_eos = 1;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&cold, 1));
    memset(&warm, 0, sizeof(warm));
    r.user = &warm;
    CHECK(engine_submit(e, &r, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&warm, 1));
    CHECK_EQ_INT(warm.usage.cached_tokens, (c->prompt_len - 1) / 16 * 16);
    CHECK(warm.usage.cached_tokens > 0);
    CHECK(same_tokens(&cold, &warm));
    double max_d = 0;
    for (int i = 0; i < cold.n_tokens; i++) max_d = fmax(max_d, fabs((double)cold.logprobs[i] - warm.logprobs[i]));
    CHECK_MSG(max_d < 2e-3, "%s: snapshot hit logprobs differ by %g", name, max_d);
    printf("%s: snapshot prefix hit reused %d of %d tokens, max |dlogprob| %.2e\n", name, warm.usage.cached_tokens,
           c->prompt_len, max_d);
    engine_destroy(e);
    model_free(m);
    CHECK_EQ_INT(cairn_mem_used(CAIRN_MEM_STATE), state_mem0); /* snapshots and states all freed */
}

int main(void)
{
    /* the real kernels (SIMD, thread pool), as the server runs them */
    CHECK(test_cpu_be() != NULL);
    run_hybrid("qwen3_5-tiny");
    return test_summary("test_engine_hybrid");
}
