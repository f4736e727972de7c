/* Speculation control (engine/spec_ctl.h): the step-cost fit recovers a synthetic linear cost,
 * the break-even gain matches the formula evaluated here, and the state machine parks on no
 * acceptance, probes after the cooldown, backs off exponentially to the cap, resumes on a good
 * probe, skips drafts (without parking) where the batch makes them a loss, and keeps the modelled
 * overhead of a never-accepting drafter under 3% over a long generation. A drafter that runs a
 * model (the MTP head) is charged its own steps: the prior until head steps are timed, then the
 * measured time; the charge turns a verdict that pays for free drafts into a park. */
#include "base/status.h"
#include "engine/spec_ctl.h"
#include "testlib.h"

/* gain(k) from the header's definition, with t(n) = a + b n */
static double ref_gain(double a, double b, int n_base, double alpha, int k)
{
    double e = 0;
    for (int i = 0; i <= k; i++)
        e += pow(alpha, i);
    return (n_base - 1 + e) / n_base * (a + b * n_base) / (a + b * (n_base + k));
}

static void test_cost(void)
{
    struct spec_cost c;
    spec_cost_init(&c, 0);
    /* no data: t(n) = 1 + 0.1 (n - 1) */
    CHECK_NEAR(spec_cost_ratio(&c, 1, 4), (1 + SPEC_COST_DEFAULT_SLOPE * 4) / 1.0, 1e-12);
    CHECK_NEAR(spec_cost_ratio(&c, 3, 2),
               (1 + SPEC_COST_DEFAULT_SLOPE * 4) / (1 + SPEC_COST_DEFAULT_SLOPE * 2), 1e-12);
    CHECK_NEAR(spec_cost_slope(&c), SPEC_COST_DEFAULT_SLOPE, 1e-12);
    /* constant token counts cannot fit a slope: still the default */
    for (int i = 0; i < 50; i++)
        spec_cost_observe(&c, 1, 0.010);
    CHECK_NEAR(spec_cost_slope(&c), SPEC_COST_DEFAULT_SLOPE, 1e-12);
    /* t = 2 ms + 0.5 ms per token over varied counts: the fit forgets the old steps (decay) and
     * recovers the line */
    for (int i = 0; i < 1000; i++) {
        int n = 1 + i % 9;
        spec_cost_observe(&c, n, 0.002 + 0.0005 * n);
    }
    CHECK_NEAR(spec_cost_slope(&c), 0.0005 / 0.0025, 1e-6);
    CHECK_NEAR(spec_cost_ratio(&c, 1, 4), (0.002 + 0.0005 * 5) / 0.0025, 1e-6);
    CHECK_NEAR(spec_cost_ratio(&c, 8, 3), (0.002 + 0.0005 * 11) / (0.002 + 0.0005 * 8), 1e-6);
    CHECK_EQ_INT(spec_cost_ratio(&c, 1, 0) == 1.0, 1);
    /* sizes timed one by one win over the line: a kernel that costs 10x for any chunk > 1 */
    {
        struct spec_cost st;
        spec_cost_init(&st, 0);
        for (int i = 0; i < 40; i++)
            spec_cost_observe(&st, 1 + i % 4, i % 4 ? 0.010 : 0.001);
        CHECK_NEAR(spec_cost_ratio(&st, 1, 1), 10.0, 1e-9);
        CHECK_NEAR(spec_cost_ratio(&st, 1, 3), 10.0, 1e-9);
        CHECK_NEAR(spec_cost_ratio(&st, 2, 1), 1.0, 1e-9);
        /* n = 6 was never timed: the line through all steps, t ~ 1 ms + 2.7 ms * n (unweighted fit:
         * slope 2.7, intercept 1.0), ratio (1 + 2.7 * 6) / (1 + 2.7) = 4.6 */
        double r = spec_cost_ratio(&st, 1, 5);
        CHECK_MSG(r > 4.0 && r < 5.2, "ratio %g", r);
        /* a step function defeats any draft: alpha 0.9 does not pay for 10x */
        CHECK(spec_ctl_best_gain(&st, 1, 0.9, 3, NULL) < 1.0);
        /* the table follows the recent steps */
        for (int i = 0; i < 40; i++)
            spec_cost_observe(&st, 2, 0.0015);
        CHECK_NEAR(spec_cost_ratio(&st, 1, 1), 1.5, 1e-2);
    }
    /* timing noise only adds time: a slow outlier (a busy machine) does not price drafts out
     * (a mean of the steps made t(5) 3.0 ms here, and gain at alpha 0.6 fell below 1), and a real
     * rise is followed within a few dozen steps */
    {
        struct spec_cost ns;
        spec_cost_init(&ns, 0);
        for (int i = 0; i < 20; i++) {
            spec_cost_observe(&ns, 1, 0.001);
            spec_cost_observe(&ns, 5, 0.0013);
        }
        spec_cost_observe(&ns, 5, 0.010);
        spec_cost_observe(&ns, 1, 0.001);
        double r = spec_cost_ratio(&ns, 1, 4);
        CHECK_MSG(r > 1.29 && r < 1.4, "ratio after an outlier %g", r);
        CHECK(spec_ctl_best_gain(&ns, 1, 0.6, 4, NULL) > 1.5);
        for (int i = 0; i < 60; i++) {
            spec_cost_observe(&ns, 1, 0.001);
            spec_cost_observe(&ns, 5, 0.004);
        }
        CHECK_NEAR(spec_cost_ratio(&ns, 1, 4), 4.0, 1e-9);
    }
    /* a fixed cost ignores every step */
    {
        struct spec_cost fx;
        spec_cost_init(&fx, 0.05);
        fx.fixed = 1;
        for (int i = 0; i < 50; i++)
            spec_cost_observe(&fx, 1 + i % 5, 0.001 * (1 + i % 5));
        CHECK_EQ_INT(fx.n_obs, 0);
        CHECK_NEAR(spec_cost_ratio(&fx, 1, 2), 1.1, 1e-12);
    }
    /* bad observations are ignored */
    uint64_t n_obs = c.n_obs;
    spec_cost_observe(&c, 3, -1.0);
    spec_cost_observe(&c, 0, 1.0);
    spec_cost_observe(&c, 3, NAN);
    CHECK_EQ_INT(c.n_obs, n_obs);
    /* an unphysical fit (time falling with tokens) falls back to the default */
    spec_cost_init(&c, 0.3);
    for (int i = 0; i < 50; i++)
        spec_cost_observe(&c, 1 + i % 5, 0.01 - 0.001 * (1 + i % 5));
    CHECK_NEAR(spec_cost_slope(&c), 0.3, 1e-12);

    /* best gain: argmax and value over k, by the formula */
    spec_cost_init(&c, 0);
    double a = 1 - SPEC_COST_DEFAULT_SLOPE, b = SPEC_COST_DEFAULT_SLOPE;
    double alphas[] = {0.0, 0.2, 0.5, 0.8, 0.95};
    int nbs[] = {1, 4, 32};
    for (int i = 0; i < (int)CAIRN_ARRAY_LEN(alphas); i++) {
        for (int j = 0; j < (int)CAIRN_ARRAY_LEN(nbs); j++) {
            double want = 0;
            int want_k = 1;
            for (int k = 1; k <= 8; k++) {
                double g = ref_gain(a, b, nbs[j], alphas[i], k);
                if (g > want) {
                    want = g;
                    want_k = k;
                }
            }
            int got_k;
            CHECK_NEAR(spec_ctl_best_gain(&c, nbs[j], alphas[i], 8, &got_k), want, 1e-9);
            CHECK_EQ_INT(got_k, want_k);
        }
    }
    /* a recompute after a cut draft: gain by the formula with the extra term */
    {
        double redo = (a + b * 2) / (a + b) - 1, want = 0;
        for (int k = 1; k <= 8; k++) {
            double e = 0;
            for (int i = 0; i <= k; i++)
                e += pow(0.6, i);
            double g = e / ((a + b * (1 + k)) / (a + b) + (1 - pow(0.6, k)) * redo);
            if (g > want) want = g;
        }
        CHECK_NEAR(spec_ctl_best_gain_rc(&c, 1, 0.6, 8, 1, NULL), want, 1e-9);
        CHECK(spec_ctl_best_gain_rc(&c, 1, 0.6, 8, 1, NULL) <
              spec_ctl_best_gain(&c, 1, 0.6, 8, NULL));
    }
    /* alpha 0 never pays; alpha 0.8 pays for one sequence */
    CHECK(spec_ctl_best_gain(&c, 1, 0.0, 8, NULL) < 1.0);
    CHECK(spec_ctl_best_gain(&c, 1, 0.8, 8, NULL) > 2.0);
}

static void test_park_probe_backoff(void)
{
    struct spec_cost cost;
    spec_cost_init(&cost, 0);
    struct spec_ctl c;
    spec_ctl_init(&c, NULL);
    CHECK_EQ_INT(c.state, SPEC_CTL_ACTIVE);
    CHECK_EQ_INT(c.o.cooldown_max, 4096);
    /* never accepted: each step tests one position; parks after min_tries */
    int steps = 0;
    while (c.state == SPEC_CTL_ACTIVE && steps < 100) {
        int k = spec_ctl_plan(&c, &cost, 1);
        CHECK(k >= 1);
        spec_ctl_observe(&c, &cost, k, 0);
        steps++;
    }
    CHECK_EQ_INT(steps, c.o.min_tries);
    CHECK_EQ_INT(c.state, SPEC_CTL_PARKED);
    CHECK_EQ_INT(c.n_parks, 1);
    CHECK_EQ_INT(spec_ctl_plan(&c, &cost, 1), 0);
    /* the cooldown doubles per failed probe, up to 4096, and stays there */
    int expect = c.o.cooldown_min;
    for (int round = 0; round < 12; round++) {
        CHECK_EQ_INT(c.wait, expect);
        spec_ctl_decoded(&c, expect - 1);
        CHECK_EQ_INT(c.state, SPEC_CTL_PARKED);
        spec_ctl_decoded(&c, 1);
        CHECK_EQ_INT(c.state, SPEC_CTL_PROBING);
        /* a probe drafts even though the evidence so far says it does not pay */
        int n = 0;
        while (c.state == SPEC_CTL_PROBING && n < 100) {
            int k = spec_ctl_plan(&c, &cost, 1);
            CHECK(k >= 1);
            spec_ctl_observe(&c, &cost, k, 0);
            n++;
        }
        CHECK_EQ_INT(n, c.o.probe_tries);
        CHECK_EQ_INT(c.state, SPEC_CTL_PARKED);
        expect = expect * 2 < 4096 ? expect * 2 : 4096;
    }
    CHECK_EQ_INT(c.wait, 4096);
    CHECK_EQ_INT(c.n_probes, 12);
    /* a good probe resumes, and the cooldown starts over */
    spec_ctl_decoded(&c, 4096);
    CHECK_EQ_INT(c.state, SPEC_CTL_PROBING);
    int k = spec_ctl_plan(&c, &cost, 1);
    spec_ctl_observe(&c, &cost, k, k);
    if (k < c.o.probe_tries) spec_ctl_observe(&c, &cost, k, k);
    CHECK_EQ_INT(c.state, SPEC_CTL_ACTIVE);
    CHECK_EQ_INT(c.cooldown, c.o.cooldown_min);
    CHECK(spec_ctl_alpha(&c) > 0.6);
    /* all accepted: stays active, and the planned draft grows to k_max */
    for (int i = 0; i < 50; i++) {
        k = spec_ctl_plan(&c, &cost, 1);
        spec_ctl_observe(&c, &cost, k, k);
    }
    CHECK_EQ_INT(c.state, SPEC_CTL_ACTIVE);
    CHECK_EQ_INT(spec_ctl_plan(&c, &cost, 1), c.o.k_max);
    /* drafts parked while decoding normally are not counted; parked observe is ignored */
    uint64_t drafted = c.n_drafted;
    c.state = SPEC_CTL_PARKED;
    spec_ctl_observe(&c, &cost, 4, 4);
    CHECK_EQ_INT(c.n_drafted, drafted);
}

/* A compute-bound step (t = 1 + n): a big batch makes one sequence's draft a loss, so the plan
 * skips it, but the request does not park and drafts again when the batch is small. */
static void test_batch_condition(void)
{
    struct spec_cost cost;
    spec_cost_init(&cost, 0);
    for (int i = 0; i < 100; i++)
        spec_cost_observe(&cost, 1 + i % 20, 0.001 * (1 + (1 + i % 20)));
    CHECK_NEAR(spec_cost_slope(&cost), 0.5, 1e-6);
    struct spec_ctl c;
    spec_ctl_init(&c, NULL);
    for (int i = 0; i < 20;
         i++) { /* 60% of positions accepted: each step accepts 3 of 4 then misses */
        spec_ctl_observe(&c, &cost, 4, i % 2 ? 3 : 1);
    }
    double alpha = spec_ctl_alpha(&c);
    CHECK(alpha > 0.4 && alpha < 0.8);
    CHECK(ref_gain(0.001, 0.001, 1, alpha, 1) > 1.0);  /* pays alone ... */
    CHECK(ref_gain(0.001, 0.001, 16, alpha, 1) < 1.0); /* ... not in a batch of 16 */
    CHECK(spec_ctl_plan(&c, &cost, 1) >= 1);
    CHECK_EQ_INT(spec_ctl_plan(&c, &cost, 16), 0);
    CHECK_EQ_INT(c.state, SPEC_CTL_ACTIVE);
}

/* Modelled overhead of a drafter that is never right, over a long generation: every verify step
 * costs ratio(1, k) one-token steps and emits one token. */
static void test_no_acceptance_overhead(void)
{
    struct spec_cost cost;
    spec_cost_init(&cost, 0);
    struct spec_ctl c;
    spec_ctl_init(&c, NULL);
    int n_tokens = 8192;
    double t = 0;
    for (int i = 0; i < n_tokens; i++) {
        int k = spec_ctl_plan(&c, &cost, 1);
        if (k > 0) {
            t += spec_cost_ratio(&cost, 1, k);
            spec_ctl_observe(&c, &cost, k, 0);
        } else {
            t += 1;
            spec_ctl_decoded(&c, 1);
        }
    }
    double slowdown = t / n_tokens - 1;
    printf("no acceptance, %d tokens: modelled slowdown %.2f%% (%llu verify steps, %llu probes)\n",
           n_tokens, 100 * slowdown, (unsigned long long)c.n_verify_steps,
           (unsigned long long)c.n_probes);
    CHECK(slowdown < 0.03);
    CHECK(c.n_probes >= 5); /* it did keep probing */
}

/* gain(k) with each drafted token costing d one-token steps, t(n) = 1 + slope (n - 1) */
static double ref_gain_draft(double slope, double alpha, int k, double d)
{
    double e = 0;
    for (int i = 0; i <= k; i++)
        e += pow(alpha, i);
    return e / (1 + slope * k + k * d);
}

static void test_draft_cost(void)
{
    struct spec_cost c;
    spec_cost_init(&c, 0);
    /* nothing timed, no prior: drafts are free */
    CHECK_NEAR(spec_cost_draft_rel(&c, 1), 0.0, 1e-12);
    spec_cost_set_draft_prior(&c, 0.25);
    CHECK_NEAR(spec_cost_draft_rel(&c, 1), 0.25, 1e-12);
    /* relative to a 3-token step: 0.25 / t(3) with the default slope */
    CHECK_NEAR(spec_cost_draft_rel(&c, 3), 0.25 / (1 + 2 * SPEC_COST_DEFAULT_SLOPE), 1e-12);
    /* the break-even charges k * d: the formula evaluated here, best over k */
    double want = 0;
    for (int k = 1; k <= 8; k++)
        want = fmax(want, ref_gain_draft(SPEC_COST_DEFAULT_SLOPE, 0.7, k, 0.25));
    CHECK_NEAR(spec_ctl_best_gain_x(&c, 1, 0.7, 8, 0, 1, NULL), want, 1e-9);
    CHECK(spec_ctl_best_gain_x(&c, 1, 0.7, 8, 0, 0, NULL) > want + 0.1);
    /* timed: one-token steps of 10 ms, head steps of 4 ms -> 0.4 of a step, whatever the prior */
    for (int i = 0; i < 4; i++) {
        spec_cost_observe(&c, 1, 0.010);
        spec_cost_observe_draft(&c, 0.004);
    }
    CHECK_NEAR(spec_cost_draft_rel(&c, 1), 0.4, 1e-9);
    spec_cost_observe_draft(&c, -1); /* ignored */
    CHECK_NEAR(spec_cost_draft_rel(&c, 1), 0.4, 1e-9);

    /* acceptance 0.35 pays with free drafts (1.35 / 1.1 at k = 1) but not with a head step of
     * 0.25 each (1.35 / 1.35): the MTP controller parks, the n-gram one keeps drafting; with 0.4
     * even the prior 0.5 does not pay (1.5 / 1.5), so the MTP controller never drafts at all */
    const double ds[3] = {0.25, 0.25, 0.4};
    for (int t = 0; t < 3; t++) {
        int model = t > 0;
        struct spec_cost d;
        spec_cost_init(&d, 0);
        spec_cost_set_draft_prior(&d, ds[t]);
        struct spec_ctl_opts o = {.model_drafts = model};
        struct spec_ctl ctl;
        spec_ctl_init(&ctl, &o);
        /* about 35% of tested positions accepted: 1 of 3 steps accepts one of its 2 */
        for (int step = 0; step < 60 && ctl.state == SPEC_CTL_ACTIVE; step++) {
            int k = spec_ctl_plan(&ctl, &d, 1);
            if (k == 0) continue;
            spec_ctl_observe(&ctl, &d, k, step % 3 == 0 ? CAIRN_MIN(k, 1) : 0);
        }
        int want_parks = t == 1, want_drafts = t < 2;
        CHECK_MSG((int)ctl.n_parks == want_parks && (ctl.n_drafted > 0) == want_drafts,
                  "case %d: %llu parks, %llu drafted, alpha %.2f", t, (unsigned long long)ctl.n_parks,
                  (unsigned long long)ctl.n_drafted, spec_ctl_alpha(&ctl));
    }
}

int main(void)
{
    test_cost();
    test_draft_cost();
    test_park_probe_backoff();
    test_batch_condition();
    test_no_acceptance_overhead();
    return test_summary("test_spec_ctl");
}
