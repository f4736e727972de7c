/* The CUDA sample op (cuda_sample.cu) against the host sampler (engine/sampler.c).
 *
 * Every parameter combination the op takes (temperature 0 / 0.6 / 1 / 1.7, repetition penalty,
 * presence + frequency penalties, logit_bias, min_p, logprobs, top_logprobs 20, and across them
 * top_k 1 / 20 / 64 with top_p 1 or 0.9: CAIRN_CUDA_SAMPLE_TOPK=1 is set here), 64 rows per call
 * at the Llama-3 vocabulary (128,256) and an odd one, over several steps so the penalties see
 * generated tokens. Each row has twin samplers with the same seed: one samples on the host
 * (sampler_sample), the other is prepared for the op (sampler_row_prepare: edits and the host's
 * draw), sampled on the GPU and finished (sampler_row_finish). Checks:
 * - greedy ids identical, including rows with ties, -inf and NaN logits;
 * - sampled ids identical given the same draw; where they differ, the GPU's id must be the
 *   host's for a draw within 1e-6 of u (the cumulative sums are formed in another order, see
 *   cuda_sample.cu), and such boundary cases must be under 1% of the sampled rows;
 * - logprob and top_logprobs within 1e-4, the same top ids.
 * Also times the op for 64 greedy and 64 sampled rows. Exits 77 without a usable GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda.h"
#include "engine/sampler.h"
#include "testlib.h"

#define ROWS 64
#define PROMPT 30
#define STEPS 3

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* logits of one row: a spread of values with ties; kind 1: NaNs and -inf about (greedy only) */
static void fill_row(float *l, int V, int kind, const int32_t *hist, int n_hist)
{
    for (int i = 0; i < V; i++)
        l[i] = (float)(rnd() % 200000) / 20000.0f - 5.0f;
    for (int k = 0; k < 8; k++)
        l[rnd() % V] = 9.0f + (float)(rnd() % 3); /* a few tied leaders */
    for (int k = 0; k < 4 && n_hist; k++)
        l[hist[n_hist - 1 - k % n_hist]] = 10.5f; /* penalties matter */
    if (kind == 1) {
        for (int k = 0; k < 50; k++)
            l[rnd() % V] = NAN;
        for (int k = 0; k < 50; k++)
            l[rnd() % V] = -INFINITY;
        if (rnd() % 4 == 0) l[0] = NAN; /* NaN at id 0 wins on the host: must here too */
    }
}

struct combo {
    struct engine_sampling p;
    int nan_row;
};

static struct combo combo_of(int c, int vocab)
{
    const int c_all = c;
    static struct engine_logit_bias bias[3] = {{5, 3.5f}, {17, -100.0f}, {5, 1.25f}};
    struct combo k;
    engine_sampling_default(&k.p);
    k.p.temperature = (float[]){0.0f, 0.6f, 1.0f, 1.7f}[c % 4];
    c /= 4;
    k.p.repetition_penalty = c % 2 ? 1.3f : 1.0f;
    k.p.repetition_context_size = c % 2 ? 16 : 0;
    c /= 2;
    k.p.presence_penalty = c % 2 ? 0.4f : 0.0f;
    k.p.frequency_penalty = c % 2 ? 0.7f : 0.0f;
    c /= 2;
    k.p.n_logit_bias = c % 2 ? 3 : 0;
    k.p.logit_bias = bias;
    c /= 2;
    k.p.min_p = c % 2 ? 0.05f : 0.0f;
    c /= 2;
    k.p.logprobs = c % 3 > 0;
    k.p.top_logprobs = c % 3 == 2 ? 20 : 0;
    c /= 3;
    k.nan_row = k.p.temperature == 0.0f && (c % 2);
    /* top-k (the op's sorted path) across the others: 5 and 4 are coprime, so every
     * temperature meets every top-k; top-p over it every other time */
    k.p.top_k = (int[]){0, 0, 1, 20, BACKEND_SAMPLE_MAX_TOP_K}[c_all % 5];
    k.p.top_p = k.p.top_k && (c_all / 5) % 2 ? 0.9f : 1.0f;
    (void)vocab;
    return k;
}
#define N_COMBOS (4 * 2 * 2 * 2 * 2 * 3 * 2)

static int n_sampled_rows, n_boundary, n_greedy_rows;

static void run_vocab(struct backend *be, int V)
{
    float *h = malloc(sizeof(float) * (size_t)V * ROWS);
    float *d = NULL;
    struct cairn_err err = {0};
    CHECK(be->ops->buf_alloc(be, sizeof(float) * (size_t)V * ROWS, CAIRN_MEM_SCRATCH, (void **)&d,
                             &err) == CAIRN_OK);
    static int32_t hist[ROWS][PROMPT + STEPS];
    static struct sampler a[ROWS], b[ROWS];
    struct backend_sample_row rows[ROWS];
    struct backend_sample_out out[ROWS];
    for (int c0 = 0; c0 < N_COMBOS; c0 += ROWS) {
        int n = N_COMBOS - c0 < ROWS ? N_COMBOS - c0 : ROWS;
        struct combo k[ROWS];
        for (int r = 0; r < n; r++) {
            k[r] = combo_of(c0 + r, V);
            k[r].p.seed = 7 + (uint64_t)(c0 + r) * 31 + (uint64_t)V;
            k[r].p.has_seed = 1;
            CHECK(sampler_init(&a[r], &k[r].p, V, NULL) == CAIRN_OK);
            CHECK(sampler_init(&b[r], &k[r].p, V, NULL) == CAIRN_OK);
            CHECK(sampler_row_eligible(&b[r], be->sample_top_k));
            for (int i = 0; i < PROMPT; i++)
                hist[r][i] = (int32_t)(rnd() % (uint32_t)V);
        }
        for (int step = 0; step < STEPS; step++) {
            int n_hist = PROMPT + step;
            for (int r = 0; r < n; r++) {
                fill_row(h + (size_t)r * V, V, k[r].nan_row, hist[r], n_hist);
                sampler_row_prepare(&b[r], hist[r], n_hist, step, &rows[r]);
                rows[r].row = r;
            }
            CHECK(be->ops->buf_upload(be, d, h, sizeof(float) * (size_t)V * (size_t)n, &err) ==
                  CAIRN_OK);
            CHECK(be->ops->step_begin(be, &err) == CAIRN_OK);
            int rc = be->ops->sample(be, d, V, rows, n, out, &err);
            CHECK(be->ops->step_end(be, &err) == CAIRN_OK);
            CHECK_MSG(rc == CAIRN_OK, "sample: %s", err.msg);
            if (rc != CAIRN_OK) break;
            for (int r = 0; r < n; r++) {
                const float *l = h + (size_t)r * V;
                int32_t ta = sampler_sample(&a[r], l, hist[r], n_hist, step);
                int32_t tb = sampler_row_finish(&b[r], &out[r]);
                if (k[r].p.temperature == 0.0f) {
                    n_greedy_rows++;
                    CHECK_MSG(ta == tb, "V %d combo %d step %d greedy: host %d, gpu %d", V, c0 + r,
                              step, ta, tb);
                } else {
                    n_sampled_rows++;
                    if (ta != tb) {
                        /* the host's id for draws just either side of u */
                        struct backend_sample_row lo = rows[r], hi = rows[r];
                        struct backend_sample_out olo, ohi;
                        lo.u = rows[r].u - 1e-6 < 0 ? 0 : rows[r].u - 1e-6;
                        hi.u = rows[r].u + 1e-6 >= 1 ? rows[r].u : rows[r].u + 1e-6;
                        CHECK(sampler_row_reference(l, V, &lo, &olo) == CAIRN_OK);
                        CHECK(sampler_row_reference(l, V, &hi, &ohi) == CAIRN_OK);
                        CHECK_MSG(
                            tb == olo.id || tb == ohi.id,
                            "V %d combo %d step %d: host %d, gpu %d, not a boundary case (u %.9f)",
                            V, c0 + r, step, ta, tb, rows[r].u);
                        n_boundary++;
                    }
                }
                if ((k[r].p.logprobs || k[r].p.top_logprobs) && !k[r].nan_row) {
                    /* the logprob of the token each side chose (equal but in boundary cases) */
                    if (ta == tb) CHECK_NEAR(a[r].logprob, b[r].logprob, 1e-4);
                    CHECK_EQ_INT(a[r].n_top, b[r].n_top);
                    for (int t = 0; t < a[r].n_top && t < b[r].n_top; t++) {
                        CHECK_MSG(a[r].top_ids[t] == b[r].top_ids[t],
                                  "V %d combo %d top %d: %d vs %d", V, c0 + r, t, a[r].top_ids[t],
                                  b[r].top_ids[t]);
                        CHECK_NEAR(a[r].top_logprobs[t], b[r].top_logprobs[t], 1e-4);
                    }
                }
                /* both continue from the host's token, so the histories stay the same */
                sampler_accept(&a[r], ta);
                sampler_accept(&b[r], ta);
                hist[r][n_hist] = ta;
            }
        }
        for (int r = 0; r < n; r++) {
            sampler_free(&a[r]);
            sampler_free(&b[r]);
        }
    }
    be->ops->buf_free(be, d, sizeof(float) * (size_t)V * ROWS, CAIRN_MEM_SCRATCH);
    free(h);
}

/* 64 rows of the 8B's vocabulary: greedy, then temperature 1 with logprobs */
static void bench(struct backend *be)
{
    enum { V = 128256, REPS = 50 };
    float *h = malloc(sizeof(float) * (size_t)V * ROWS), *d = NULL;
    struct cairn_err err = {0};
    if (be->ops->buf_alloc(be, sizeof(float) * (size_t)V * ROWS, CAIRN_MEM_SCRATCH, (void **)&d,
                           &err))
        return;
    for (int r = 0; r < ROWS; r++)
        fill_row(h + (size_t)r * V, V, 0, NULL, 0);
    be->ops->buf_upload(be, d, h, sizeof(float) * (size_t)V * ROWS, &err);
    struct backend_sample_row rows[ROWS];
    struct backend_sample_out out[ROWS];
    for (int mode = 0; mode < 3; mode++) {
        memset(rows, 0, sizeof(rows));
        for (int r = 0; r < ROWS; r++) {
            rows[r].row = r;
            rows[r].temperature = mode ? 1.0f : 0.0f;
            rows[r].logprobs = mode == 2;
            rows[r].u = 0.37;
        }
        double best = 1e9;
        for (int i = 0; i < REPS; i++) {
            double t0 = now_s();
            be->ops->step_begin(be, &err);
            be->ops->sample(be, d, V, rows, ROWS, out, &err);
            be->ops->step_end(be, &err);
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        printf("sample op: %d rows x vocab %d, %s: %.1f us per call (best of %d)\n", ROWS, V,
               mode == 0   ? "greedy"
               : mode == 1 ? "temperature 1"
                           : "temperature 1 + logprobs",
               best * 1e6, REPS);
    }
    be->ops->buf_free(be, d, sizeof(float) * (size_t)V * ROWS, CAIRN_MEM_SCRATCH);
    free(h);
}

int main(void)
{
    struct backend *be = NULL;
    struct cairn_err err = {0};
    setenv("CAIRN_CUDA_SAMPLE_TOPK", "1", 1); /* the top-k rows too */
    int st = cuda_backend_open(0, &be, &err);
    if (st == CAIRN_ERR_UNSUPPORTED) {
        printf("test_cuda_sample: skipped: %s\n", err.msg);
        return 77;
    }
    CHECK_MSG(st == CAIRN_OK, "cuda_backend_open: %s", err.msg);
    if (st != CAIRN_OK) return test_summary("test_cuda_sample");
    CHECK(be->ops->sample != NULL);
    CHECK_EQ_INT(be->sample_top_k, BACKEND_SAMPLE_MAX_TOP_K);
    if (!be->ops->sample) return test_summary("test_cuda_sample");
    run_vocab(be, 128256);
    run_vocab(be, 50021);
    printf("test_cuda_sample: %d greedy rows, %d sampled rows, %d boundary cases (u within 1e-6)\n",
           n_greedy_rows, n_sampled_rows, n_boundary);
    CHECK(n_sampled_rows > 0 && n_boundary * 100 <= n_sampled_rows);
    bench(be);
    backend_close(be);
    return test_summary("test_cuda_sample");
}
