/* Speculative verification (engine/spec_verify.h).
 * 1. Distribution: over many seeds, the token emitted at a drafted position follows the target
 *    distribution p (temperature + top-k, computed here from the definitions), the draft is
 *    accepted with probability p(d), and rejected positions follow the residual p restricted to
 *    tokens != d. Chi-square and binomial bounds are set for a false-failure rate of about 1e-6
 *    each (the seeds are fixed, so a given build either passes or fails deterministically).
 * 2. Equality: with a synthetic deterministic "model" (logits a function of the history), decoding
 *    with drafts that are sometimes right and sometimes wrong, verified k at a time, emits exactly
 *    the tokens of plain one-at-a-time decoding with the same seed, for greedy and sampled
 *    requests with repetition / presence / frequency penalties and logit bias.
 * 3. The emit callback can stop mid-draft; a draft token with p = 0 is never accepted. */
#include "engine/spec_verify.h"
#include "testlib.h"

#define V 8

/* chi-square quantile (Wilson-Hilferty), z = standard normal quantile */
static double chi2_quantile(int df, double z)
{
    double h = 2.0 / (9.0 * df);
    return df * pow(1 - h + z * sqrt(h), 3);
}
#define Z_1E6 4.753 /* P(N(0,1) > z) = 1e-6 */

static int emit_count(void *ctx, int32_t t)
{
    (void)t;
    (*(int *)ctx)++;
    return 0;
}

static void test_distribution(void)
{
    float l[V] = {1.2f, 0.3f, 2.0f, -0.5f, 1.7f, 0.9f, -2.0f, 0.0f};
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.temperature = 0.8f;
    p.top_k = 5;
    p.has_seed = 1;
    /* p by definition: softmax(l / T) over the 5 largest logits */
    double want[V] = {0}, z = 0;
    int keep[V] = {0};
    for (int n = 0; n < 5; n++) {
        int best = -1;
        for (int i = 0; i < V; i++)
            if (!keep[i] && (best < 0 || l[i] > l[best])) best = i;
        keep[best] = 1;
    }
    for (int i = 0; i < V; i++)
        z += keep[i] ? exp(l[i] / 0.8) : 0;
    for (int i = 0; i < V; i++)
        want[i] = keep[i] ? exp(l[i] / 0.8) / z : 0;

    int32_t drafts[] = {4 /* second most likely */, 1 /* least likely kept */, 6 /* p = 0 */};
    for (size_t di = 0; di < CAIRN_ARRAY_LEN(drafts); di++) {
        int32_t d = drafts[di];
        enum { N = 40000 };
        int hist[V] = {0}, rej_hist[V] = {0}, n_acc = 0, n_rej = 0;
        float rows[2 * V];
        memcpy(rows, l, sizeof(l));
        memcpy(rows + V, l, sizeof(l));
        for (int seed = 0; seed < N; seed++) {
            struct sampler s;
            p.seed = 1000003ull * (uint64_t)seed + di;
            CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
            int32_t tokens[4] = {0, 0, 0, 0};
            int n_emit = 0, acc = -1;
            int n = spec_verify(&s, rows, V, tokens, 1, 0, &d, 1, emit_count, &n_emit, &acc);
            CHECK(n == n_emit && n == acc + 1);
            int32_t x = tokens[1];
            hist[x]++;
            if (acc) {
                n_acc++;
                CHECK(x == d && n == 2);
            } else {
                n_rej++;
                rej_hist[x]++;
                CHECK(x != d && n == 1);
            }
            sampler_free(&s);
        }
        /* emitted token ~ p */
        double chi = 0;
        int df = -1;
        for (int i = 0; i < V; i++) {
            if (want[i] == 0) {
                CHECK_EQ_INT(hist[i], 0);
                continue;
            }
            double e = want[i] * N;
            chi += (hist[i] - e) * (hist[i] - e) / e;
            df++;
        }
        double lim = chi2_quantile(df, Z_1E6);
        CHECK_MSG(chi < lim, "draft %d: emitted tokens: chi2 %.2f >= %.2f (df %d)", d, chi, lim,
                  df);
        /* acceptance ~ Binomial(N, p(d)) */
        double sd = sqrt(N * want[d] * (1 - want[d]));
        CHECK_MSG(fabs(n_acc - N * want[d]) <= Z_1E6 * sd + (want[d] == 0 ? 0 : 1e-9),
                  "draft %d: accepted %d, expected %.1f", d, n_acc, N * want[d]);
        /* rejected positions ~ residual (p without d, renormalized) */
        double chr = 0;
        int dfr = -1;
        for (int i = 0; i < V; i++) {
            if (i == d || want[i] == 0) {
                if (i == d) CHECK_EQ_INT(rej_hist[i], 0);
                continue;
            }
            double e = want[i] / (1 - want[d]) * n_rej;
            chr += (rej_hist[i] - e) * (rej_hist[i] - e) / e;
            dfr++;
        }
        double limr = chi2_quantile(dfr, Z_1E6);
        CHECK_MSG(chr < limr, "draft %d: residual: chi2 %.2f >= %.2f (df %d)", d, chr, limr, dfr);
        printf("draft %d (p %.3f): accepted %.4f, chi2 emitted %.2f (limit %.2f), residual %.2f "
               "(limit %.2f)\n",
               d, want[d], (double)n_acc / N, chi, lim, chr, limr);
    }
}

/* ---- equality with plain decoding ---- */

#define EV 50
#define N_GEN 40

/* the synthetic model: logits after history[0, n) */
static void model_logits(const int32_t *h, int n, float *out)
{
    int32_t last = n ? h[n - 1] : 0, prev = n > 1 ? h[n - 2] : 0;
    for (int v = 0; v < EV; v++)
        out[v] = 2.5f * sinf(0.37f * (float)v + 1.3f * (float)last + 0.11f * (float)prev) +
                 0.02f * (float)((v * 7) % 5);
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

struct stop_ctx {
    int n_emitted, stop_at; /* stop once this many tokens were emitted in total */
};
static int emit_stop(void *ctx, int32_t t)
{
    (void)t;
    struct stop_ctx *c = ctx;
    return ++c->n_emitted >= c->stop_at;
}

static void run_equality(const struct engine_sampling *p, const char *what)
{
    enum { NP = 5 };
    const int32_t prompt[NP] = {3, 17, 3, 17, 9};
    int n_bad = 0;
    long n_drafted = 0, n_accepted = 0;
    for (int trial = 0; trial < 60; trial++) {
        struct engine_sampling q = *p;
        q.seed = 77 + (uint64_t)trial;
        /* plain */
        int32_t plain[NP + N_GEN];
        memcpy(plain, prompt, sizeof(prompt));
        struct sampler s;
        CHECK(sampler_init(&s, &q, EV, NULL) == CAIRN_OK);
        float row[EV];
        for (int i = 0; i < N_GEN; i++) {
            model_logits(plain, NP + i, row);
            plain[NP + i] = sampler_sample(&s, row, plain, NP + i, i);
            sampler_accept(&s, plain[NP + i]);
        }
        sampler_free(&s);
        /* speculative: drafts copy the plain continuation, with a wrong token now and then */
        int32_t spec[NP + N_GEN + 16];
        memcpy(spec, prompt, sizeof(prompt));
        CHECK(sampler_init(&s, &q, EV, NULL) == CAIRN_OK);
        int n = NP;
        struct stop_ctx sc = {0, N_GEN};
        static float rows[17 * EV];
        while (n < NP + N_GEN) {
            int k = (int)rnd(6);
            int32_t draft[16];
            for (int j = 0; j < k; j++) {
                int at = n + j < NP + N_GEN ? n + j : NP + N_GEN - 1;
                draft[j] = rnd(3) ? plain[at] : (int32_t)rnd(EV);
                spec[n + j] = draft[j];
            }
            for (int j = 0; j <= k; j++)
                model_logits(spec, n + j, rows + (size_t)j * EV);
            int acc = 0;
            int got = spec_verify(&s, rows, EV, spec, n, n - NP, draft, k, emit_stop, &sc, &acc);
            CHECK(got >= 1 && got <= k + 1 && acc <= got && acc >= got - 1);
            n_drafted += k;
            n_accepted += acc;
            n += got;
        }
        sampler_free(&s);
        CHECK_EQ_INT(n, NP + N_GEN); /* stopped exactly at the limit */
        if (memcmp(plain, spec, sizeof(plain)) != 0) n_bad++;
    }
    CHECK_MSG(n_bad == 0, "%s: %d of 60 speculative runs differ from plain decoding", what, n_bad);
    CHECK_MSG(n_accepted > 50 && n_accepted < n_drafted, "%s: accepted %ld of %ld drafted", what,
              n_accepted, n_drafted);
    printf("%s: 60 runs identical to plain decoding, %ld of %ld draft tokens accepted\n", what,
           n_accepted, n_drafted);
}

static void test_equality(void)
{
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.temperature = 0;
    run_equality(&p, "greedy");
    static const struct engine_logit_bias bias[2] = {{4, 1.5f}, {11, -3.0f}};
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.3f;
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    run_equality(&p, "greedy, penalties + bias");
    engine_sampling_default(&p);
    p.temperature = 0.7f;
    p.has_seed = 1;
    run_equality(&p, "sampled T 0.7");
    p.top_k = 10;
    p.top_p = 0.9f;
    p.min_p = 0.05f;
    p.repetition_penalty = 1.2f;
    p.frequency_penalty = 0.5f;
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    run_equality(&p, "sampled top-k/p, min-p, penalties + bias");
}

int main(void)
{
    test_distribution();
    test_equality();
    return test_summary("test_spec_verify");
}
