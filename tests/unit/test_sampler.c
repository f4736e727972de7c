/* Sampler: greedy, top-k / top-p / min-p truncation, penalties math, logit_bias, logprobs,
 * seeded reproducibility, parameter validation. Expected values are computed here from the
 * definitions (sampler.h), independently of the implementation. */
#include "engine/sampler.h"
#include "testlib.h"

#define V 16

static struct engine_sampling greedy(void)
{
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.temperature = 0;
    return p;
}

static void test_greedy_and_ties(void)
{
    struct sampler s;
    struct engine_sampling p = greedy();
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)((i * 7) % V) * 0.1f;
    int32_t want = 0;
    for (int i = 0; i < V; i++)
        if (l[i] > l[want]) want = i;
    CHECK_EQ_INT(sampler_sample(&s, l, NULL, 0, 0), want);
    for (int i = 0; i < V; i++) l[i] = 1.0f;
    CHECK_EQ_INT(sampler_sample(&s, l, NULL, 0, 0), 0); /* ties -> lowest id */
    sampler_free(&s);
}

static void test_top_k_indices(void)
{
    float v[50];
    for (int i = 0; i < 50; i++) v[i] = (float)((i * 37) % 50);
    v[10] = v[20] = 100.0f; /* tie at the top */
    int32_t out[7];
    sampler_top_k_indices(v, 50, 7, out);
    CHECK(out[0] == 10 && out[1] == 20);
    for (int i = 1; i < 7; i++) CHECK(v[out[i - 1]] >= v[out[i]]);
    /* the 7th value is the 7th largest */
    int bigger = 0;
    for (int i = 0; i < 50; i++) bigger += v[i] > v[out[6]];
    CHECK_EQ_INT(bigger, 6);
}

/* frequencies of n draws */
static void draw(struct sampler *s, const float *l, int n, int *counts)
{
    memset(counts, 0, sizeof(int) * V);
    for (int i = 0; i < n; i++) counts[sampler_sample(s, l, NULL, 0, 0)]++;
}

static void test_truncation(void)
{
    /* probabilities 0.5, 0.3, 0.15, 0.05 on ids 3, 7, 1, 12; everything else ~0 */
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -1e9f;
    l[3] = logf(0.5f);
    l[7] = logf(0.3f);
    l[1] = logf(0.15f);
    l[12] = logf(0.05f);
    int c[V];
    struct sampler s;
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.seed = 1;
    p.has_seed = 1;

    /* plain temperature-1 sampling follows the distribution */
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    draw(&s, l, 20000, c);
    CHECK_NEAR(c[3] / 20000.0, 0.5, 0.02);
    CHECK_NEAR(c[7] / 20000.0, 0.3, 0.02);
    CHECK_NEAR(c[1] / 20000.0, 0.15, 0.015);
    CHECK_NEAR(c[12] / 20000.0, 0.05, 0.01);
    sampler_free(&s);

    /* top_k = 2: only ids 3 and 7, renormalized 0.625 / 0.375 */
    p.top_k = 2;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    draw(&s, l, 20000, c);
    CHECK_EQ_INT(c[3] + c[7], 20000);
    CHECK_NEAR(c[3] / 20000.0, 0.625, 0.02);
    sampler_free(&s);

    /* top_p = 0.75: the nucleus is {3, 7} (0.5 < 0.75 <= 0.8) */
    p.top_k = 0;
    p.top_p = 0.75f;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    draw(&s, l, 5000, c);
    CHECK_EQ_INT(c[3] + c[7], 5000);
    CHECK(c[7] > 1000);
    sampler_free(&s);

    /* top_p = 0.9: {3, 7, 1} */
    p.top_p = 0.9f;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    draw(&s, l, 5000, c);
    CHECK_EQ_INT(c[3] + c[7] + c[1], 5000);
    CHECK(c[1] > 400);
    sampler_free(&s);

    /* min_p = 0.4: keep p >= 0.4 * 0.5 = 0.2 -> {3, 7} */
    p.top_p = 1;
    p.min_p = 0.4f;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    draw(&s, l, 5000, c);
    CHECK_EQ_INT(c[3] + c[7], 5000);
    CHECK(c[7] > 1000);
    sampler_free(&s);

    /* min_p with top_k (sorted path): top_k 3, min_p 0.4 -> {3, 7} */
    p.top_k = 3;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    draw(&s, l, 3000, c);
    CHECK_EQ_INT(c[3] + c[7], 3000);
    sampler_free(&s);

    /* low temperature sharpens: T = 0.25 -> p ∝ p^4 */
    engine_sampling_default(&p);
    p.temperature = 0.25f;
    p.seed = 9;
    p.has_seed = 1;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    draw(&s, l, 20000, c);
    double z = pow(0.5, 4) + pow(0.3, 4) + pow(0.15, 4) + pow(0.05, 4);
    CHECK_NEAR(c[3] / 20000.0, pow(0.5, 4) / z, 0.02);
    CHECK_NEAR(c[7] / 20000.0, pow(0.3, 4) / z, 0.02);
    sampler_free(&s);
}


static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* top_p over a large, flat vocabulary (the histogram path): every draw is in the exact nucleus
 * computed here by a full sort. */
static void test_top_p_large(void)
{
    enum { BV = 5000 };
    static float l[BV], sorted[BV];
    for (int i = 0; i < BV; i++) l[i] = sinf((float)i * 0.37f) * 2.0f + (float)((i * 7919) % 1000) * 0.001f;
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.seed = 5;
    p.has_seed = 1;
    /* naive nucleus threshold: smallest kept probability */
    double mx = -1e30, z = 0;
    for (int i = 0; i < BV; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < BV; i++) {
        sorted[i] = (float)exp((l[i] - mx) / 0.8);
        z += sorted[i];
    }
    qsort(sorted, BV, sizeof(float), cmp_desc);
    double c = 0;
    float min_kept = 0;
    int n_nucleus = 0;
    for (int i = 0; i < BV; i++) {
        c += sorted[i];
        n_nucleus++;
        if (c >= 0.9 * z) {
            min_kept = sorted[i];
            break;
        }
    }
    CHECK(n_nucleus > 500); /* really a large nucleus */
    struct sampler s;
    CHECK(sampler_init(&s, &p, BV, NULL) == CAIRN_OK);
    int bad = 0, distinct = 0;
    static uint8_t seen[BV];
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < 1500; i++) {
        int32_t t = sampler_sample(&s, l, NULL, 0, 0);
        float pt = (float)exp((l[t] - mx) / 0.8);
        if (pt < min_kept * 0.9999f) bad++;
        if (!seen[t]) distinct++, seen[t] = 1;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(distinct > 300);
    sampler_free(&s);
    /* all equal: the nucleus is the first ceil(0.9 * V) ids (ties -> lower id first) */
    for (int i = 0; i < BV; i++) l[i] = 0.5f;
    CHECK(sampler_init(&s, &p, BV, NULL) == CAIRN_OK);
    int max_id = 0;
    for (int i = 0; i < 500; i++) {
        int32_t t = sampler_sample(&s, l, NULL, 0, 0);
        max_id = t > max_id ? t : max_id;
    }
    CHECK(max_id < 4500 && max_id > 4000);
    sampler_free(&s);
}

static void test_penalties(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 2 ? 2.0 : -2.0);
    struct sampler s;
    struct engine_sampling p = greedy();

    /* repetition penalty 2 over the last 20 tokens of prompt + generated */
    p.repetition_penalty = 2.0f;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    CHECK_EQ_INT(s.rep_ctx, 20);
    int32_t hist[25];
    for (int i = 0; i < 25; i++) hist[i] = 0;
    hist[0] = 3;  /* outside the window of 20: not penalized */
    hist[10] = 5; /* positive logit: 2 / 2 = 1 */
    hist[11] = 5; /* counted once */
    hist[24] = 4; /* negative logit: -2 * 2 = -4 */
    sampler_sample(&s, l, hist, 25, 2);
    CHECK_NEAR(s.work[3], 2.0, 1e-6);
    CHECK_NEAR(s.work[5], 1.0, 1e-6);
    CHECK_NEAR(s.work[4], -4.0, 1e-6);
    CHECK_NEAR(s.work[0], -4.0, 1e-6);
    CHECK_NEAR(s.work[7], 2.0, 1e-6);
    sampler_free(&s);

    /* explicit context size */
    p.repetition_context_size = 30;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    sampler_sample(&s, l, hist, 25, 2);
    CHECK_NEAR(s.work[3], 1.0, 1e-6);
    sampler_free(&s);

    /* presence / frequency over generated tokens only */
    p = greedy();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    int32_t h2[6] = {9, 9, 3, 3, 3, 7}; /* prompt {9, 9}, generated {3, 3, 3, 7} */
    for (int i = 2; i < 6; i++) sampler_accept(&s, h2[i]);
    sampler_sample(&s, l, h2, 6, 4);
    CHECK_NEAR(s.work[3], 2.0 - (3 * 0.25 + 0.5), 1e-6);
    CHECK_NEAR(s.work[7], 2.0 - (1 * 0.25 + 0.5), 1e-6);
    CHECK_NEAR(s.work[9], 2.0, 1e-6);
    /* applying twice gives the same (counts restored after the sign trick) */
    sampler_sample(&s, l, h2, 6, 4);
    CHECK_NEAR(s.work[3], 2.0 - (3 * 0.25 + 0.5), 1e-6);
    sampler_free(&s);

    /* logit_bias: +100 forces, -100 forbids */
    p = greedy();
    struct engine_logit_bias b[2] = {{4, 100.0f}, {15, -100.0f}};
    p.logit_bias = b;
    p.n_logit_bias = 2;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    b[0].id = 0; /* the sampler keeps its own copy */
    CHECK_EQ_INT(sampler_sample(&s, l, NULL, 0, 0), 4);
    CHECK_NEAR(s.work[15], -98.0, 1e-4);
    sampler_free(&s);
}

static void test_logprobs(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = sinf((float)i) * 3.0f;
    struct sampler s;
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.temperature = 0.7f; /* logprobs ignore temperature (documented) */
    p.seed = 3;
    p.has_seed = 1;
    p.logprobs = 1;
    p.top_logprobs = 5;
    CHECK(sampler_init(&s, &p, V, NULL) == CAIRN_OK);
    int32_t t = sampler_sample(&s, l, NULL, 0, 0);
    double mx = -1e30, sum = 0;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++) sum += exp(l[i] - mx);
    double lse = mx + log(sum);
    CHECK_NEAR(s.logprob, l[t] - lse, 1e-5);
    CHECK_EQ_INT(s.n_top, 5);
    int best = 0;
    for (int i = 0; i < V; i++)
        if (l[i] > l[best]) best = i;
    CHECK_EQ_INT(s.top_ids[0], best);
    CHECK_NEAR(s.top_logprobs[0], l[best] - lse, 1e-5);
    for (int i = 1; i < 5; i++) CHECK(s.top_logprobs[i - 1] >= s.top_logprobs[i]);
    sampler_free(&s);
}

static void test_seeds(void)
{
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)i * 0.05f;
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.seed = 1234;
    p.has_seed = 1;
    p.top_p = 0.95f;
    struct sampler a, b, c;
    CHECK(sampler_init(&a, &p, V, NULL) == CAIRN_OK);
    CHECK(sampler_init(&b, &p, V, NULL) == CAIRN_OK);
    p.seed = 1235;
    CHECK(sampler_init(&c, &p, V, NULL) == CAIRN_OK);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 64; i++) {
        int32_t ta = sampler_sample(&a, l, NULL, 0, 0);
        int32_t tb = sampler_sample(&b, l, NULL, 0, 0);
        int32_t tc = sampler_sample(&c, l, NULL, 0, 0);
        same_ab &= ta == tb;
        same_ac &= ta == tc;
    }
    CHECK(same_ab);
    CHECK(!same_ac);
    sampler_free(&a);
    sampler_free(&b);
    sampler_free(&c);
}

static void test_validation(void)
{
    struct cairn_err err = {0};
    struct engine_sampling p;
    struct sampler s;
    engine_sampling_default(&p);
    p.top_p = 0;
    CHECK(sampler_init(&s, &p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "top_p"));
    engine_sampling_default(&p);
    p.temperature = -1;
    CHECK(sampler_validate(&p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "temperature"));
    engine_sampling_default(&p);
    p.min_p = 2;
    CHECK(sampler_validate(&p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "min_p"));
    engine_sampling_default(&p);
    p.top_k = -1;
    CHECK(sampler_validate(&p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "top_k"));
    engine_sampling_default(&p);
    p.repetition_penalty = -1;
    CHECK(sampler_validate(&p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "repetition_penalty"));
    p.repetition_penalty = 0; /* = off */
    CHECK(sampler_validate(&p, V, &err) == CAIRN_OK);
    engine_sampling_default(&p);
    p.presence_penalty = 3;
    CHECK(sampler_validate(&p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "presence_penalty"));
    engine_sampling_default(&p);
    p.top_logprobs = 21;
    CHECK(sampler_validate(&p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "top_logprobs"));
    engine_sampling_default(&p);
    struct engine_logit_bias b = {V, 1.0f};
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    CHECK(sampler_validate(&p, V, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "logit_bias"));
    engine_sampling_default(&p);
    CHECK(sampler_validate(&p, V, &err) == CAIRN_OK);
}

/* ---- the vectorised argmax against the scalar rule, and the row path against sampler_sample ---- */

static uint64_t lcg_state = 12345;
static uint32_t lcg(void)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(lcg_state >> 33);
}

static int32_t scalar_argmax(const float *w, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (w[i] > w[best]) best = i;
    return best;
}

static void test_argmax_wide(void)
{
    enum { WV = 128256 + 37 };
    float *l = malloc(sizeof(float) * WV);
    struct engine_sampling p = greedy();
    int n_cases = 0;
    for (int vocab = 1; vocab <= WV; vocab = vocab < 300 ? vocab + 1 : vocab * 3 + 7) {
        struct sampler s;
        CHECK(sampler_init(&s, &p, vocab, NULL) == CAIRN_OK);
        for (int kind = 0; kind < 9; kind++) {
            for (int i = 0; i < vocab; i++) {
                switch (kind) {
                case 0: l[i] = (float)(lcg() % 2000) / 100.0f - 10.0f; break; /* many ties */
                case 1: l[i] = 1.0f; break;                                   /* all equal */
                case 2: l[i] = -INFINITY; break;
                case 3: l[i] = (lcg() % 7) ? NAN : (float)(lcg() % 5); break;  /* NaNs about */
                case 4: l[i] = i == 0 ? NAN : (float)(lcg() % 100); break;    /* NaN at 0 wins */
                case 5: l[i] = (lcg() % 3) ? -INFINITY : NAN; break;
                case 6: l[i] = (lcg() & 1) ? 0.0f : -0.0f; break;              /* signed zeros */
                case 7: l[i] = (float)i * 1e-3f; break;                       /* rising: rescans */
                default: l[i] = (lcg() % 2) ? INFINITY : (float)(lcg() % 9); break;
                }
            }
            int32_t got = sampler_sample(&s, l, NULL, 0, 0), want = scalar_argmax(l, vocab);
            CHECK_MSG(got == want, "vocab %d kind %d: %d vs %d", vocab, kind, got, want);
            n_cases++;
        }
        sampler_free(&s);
    }
    CHECK(n_cases > 300);
    free(l);
}

/* sampler_sample and the backend row path (prepare -> the op's host reference -> finish) over
 * every parameter combination the op takes: the same tokens, logprobs and top lists, bit for
 * bit, with twin samplers (same seed) so that the draws line up. */
static void test_row_path(void)
{
    enum { RV = 3001, STEPS = 12 };
    float *l = malloc(sizeof(float) * RV);
    int32_t hist[64];
    struct engine_logit_bias bias[3] = {{5, 3.5f}, {7, -100.0f}, {5, 1.25f}}; /* 5 twice: in order */
    int n_combos = 0;
    /* combos 144..287: the same with top-k (and top-p over it), the backend's sorted path */
    for (int combo = 0; combo < 2 * 2 * 2 * 2 * 3 * 3 * 2; combo++) {
        int c = combo % 144;
        struct engine_sampling p;
        engine_sampling_default(&p);
        p.temperature = (float[]){0.0f, 0.7f}[c % 2];
        c /= 2;
        p.repetition_penalty = c % 2 ? 1.3f : 1.0f;
        p.repetition_context_size = 9;
        c /= 2;
        p.presence_penalty = c % 2 ? 0.4f : 0.0f;
        p.frequency_penalty = c % 2 ? -0.3f : 0.0f;
        c /= 2;
        p.n_logit_bias = c % 2 ? 3 : 0;
        p.logit_bias = bias;
        c /= 2;
        p.min_p = (float[]){0.0f, 0.05f, 0.5f}[c % 3];
        c /= 3;
        p.logprobs = c % 3 > 0;
        p.top_logprobs = (int[]){0, 0, 20}[c % 3];
        if (combo >= 144) {
            p.top_k = (int[]){1, 2, 20, BACKEND_SAMPLE_MAX_TOP_K}[combo % 4];
            p.top_p = (float[]){1.0f, 0.9f, 0.3f}[(combo / 4) % 3];
        }
        p.seed = 99 + (uint64_t)combo;
        p.has_seed = 1;
        struct sampler a, b;
        CHECK(sampler_init(&a, &p, RV, NULL) == CAIRN_OK);
        CHECK(sampler_init(&b, &p, RV, NULL) == CAIRN_OK);
        CHECK(sampler_row_eligible(&b, (combo / 144) ? BACKEND_SAMPLE_MAX_TOP_K : 0));
        int n_hist = 0;
        for (int i = 0; i < 20; i++) hist[n_hist++] = (int32_t)(lcg() % RV); /* prompt */
        for (int step = 0; step < STEPS; step++) {
            for (int i = 0; i < RV; i++) l[i] = (float)(lcg() % 4000) / 400.0f - 5.0f;
            l[hist[n_hist - 1]] = 12.0f; /* the last token is likely again: penalties matter */
            int n_gen = n_hist - 20;
            int32_t ta = sampler_sample(&a, l, hist, n_hist, n_gen);
            struct backend_sample_row row;
            struct backend_sample_out out;
            sampler_row_prepare(&b, hist, n_hist, n_gen, &row);
            CHECK(sampler_row_reference(l, RV, &row, &out) == CAIRN_OK);
            int32_t tb = sampler_row_finish(&b, &out);
            CHECK_MSG(ta == tb, "combo %d step %d: %d vs %d", combo, step, ta, tb);
            if (p.logprobs || p.top_logprobs) {
                CHECK(memcmp(&a.logprob, &b.logprob, sizeof(float)) == 0);
                CHECK_EQ_INT(a.n_top, b.n_top);
                CHECK(memcmp(a.top_ids, b.top_ids, sizeof(int32_t) * (size_t)a.n_top) == 0);
                CHECK(memcmp(a.top_logprobs, b.top_logprobs, sizeof(float) * (size_t)a.n_top) == 0);
            }
            sampler_accept(&a, ta);
            sampler_accept(&b, tb);
            hist[n_hist++] = ta;
        }
        sampler_free(&a);
        sampler_free(&b);
        n_combos++;
    }
    CHECK_EQ_INT(n_combos, 288);
    /* what the op does not take stays on the host: top-k past the backend's bound, top-p alone
     * (with temperature; greedy rows ignore both) */
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.temperature = 0.8f;
    struct sampler s;
    p.top_k = 5;
    CHECK(sampler_init(&s, &p, RV, NULL) == CAIRN_OK);
    CHECK(!sampler_row_eligible(&s, 0));
    CHECK(!sampler_row_eligible(&s, 4));
    CHECK(sampler_row_eligible(&s, 5));
    sampler_free(&s);
    p.top_k = 0;
    p.top_p = 0.9f;
    CHECK(sampler_init(&s, &p, RV, NULL) == CAIRN_OK);
    CHECK(!sampler_row_eligible(&s, BACKEND_SAMPLE_MAX_TOP_K));
    sampler_free(&s);
    p.top_k = RV; /* top_k >= vocab is no truncation */
    p.top_p = 1.0f;
    CHECK(sampler_init(&s, &p, RV, NULL) == CAIRN_OK);
    CHECK(sampler_row_eligible(&s, 0));
    sampler_free(&s);
    p.temperature = 0.0f;
    p.top_k = 5;
    p.top_p = 0.5f;
    CHECK(sampler_init(&s, &p, RV, NULL) == CAIRN_OK);
    CHECK(sampler_row_eligible(&s, 0));
    sampler_free(&s);
    free(l);
}

int main(void)
{
    test_argmax_wide();
    test_row_path();
    test_greedy_and_ties();
    test_top_k_indices();
    test_truncation();
    test_top_p_large();
    test_penalties();
    test_logprobs();
    test_seeds();
    test_validation();
    return test_summary("test_sampler");
}
