/* When speculation pays: a step-cost model measured by the engine, and per-request acceptance
 * tracking with parking, cooldown probes and exponential backoff.
 *
 * Cost model. The engine feeds every step without prefill (decodes and verify chunks) to
 * spec_cost_observe: (tokens in the step, seconds). t(n) is, in order of preference: the
 * fastest recent step of exactly n tokens (a running minimum that rises 5 % per step of that
 * size: timing noise only adds time; n < SPEC_COST_TABLE, once two were seen, for both sizes a
 * ratio compares), which follows any shape (a kernel that pads short
 * chunks costs a step, not a slope); else a weighted least-squares line a + b*n over all steps,
 * once the token counts vary enough to fit one; else t(n) = 1 + default_slope * (n - 1) in units
 * of a one-token step (SPEC_COST_DEFAULT_SLOPE: decode reads every weight once per step, so each
 * extra token adds little; the CPU's compute share is higher, hence measured).
 *
 * Drafting cost. A drafter that runs a model (the MTP head: one chained head step, logits
 * included, per drafted token) costs d per drafted token, in units of a one-token step: measured
 * (spec_cost_observe_draft: the fastest recent head step, rising likewise, over t(1) or
 * t(n_base) as measured) once two head steps were timed, else the prior the engine sets from
 * the head's share of the weights (spec_cost_set_draft_prior). N-gram drafts cost nothing here.
 *
 * Break-even. With per-position acceptance probability alpha (the draft is accepted up to its
 * first mismatch), a verify step with a k-token draft emits E(k) = (1 - alpha^(k+1)) / (1 - alpha)
 * tokens. In a step of n_base tokens without the draft (this sequence's decode included), the
 * step's throughput changes by
 *   gain(k) = (n_base - 1 + E(k)) / n_base * t(n_base) / (t(n_base + k) + k * draft(n_base)),
 * draft(n_base) being the drafting cost per token in seconds (0 for n-grams).
 * Speculation pays when max over k of gain(k) > 1; spec_ctl_plan returns that k. A big batch
 * thus dilutes what one sequence's draft can gain, and a compute-bound step (large b) charges
 * more for it: speculation stops on its own where it cannot pay.
 *
 * Acceptance. alpha is the decayed ratio accepted / tested positions (a verify step that
 * accepted m of k tested m + (m < k) positions), starting from prior_alpha.
 *
 * Models with recurrent state (opts.recompute) pay for a cut draft with a recompute: see
 * spec_ctl_best_gain_rc.
 *
 * States (per request). Verdicts (park, resume) judge the acceptance alone, as gain at
 * n_base = 1; the batch only decides whether one step drafts (spec_ctl_plan returns 0 when
 * this batch makes the draft a loss), so a big batch never parks a request whose drafts are good.
 *   ACTIVE   speculate with the planned k where it pays; where the estimate fell below the
 *            prior before min_tries tested positions, keep drafting short (2 tokens) if the
 *            prior would pay, so that the park is decided on evidence; once min_tries positions
 *            were tested since entering ACTIVE, if the best gain is <= 1 -> PARKED for
 *            cooldown_min tokens.
 *   PARKED   no drafts; spec_ctl_decoded counts the tokens decoded normally; after `wait` of
 *            them -> PROBING.
 *   PROBING  speculate short (at most 2 tokens: the cheapest evidence) from fresh evidence; after
 *            probe_tries tested positions, judged on the probe's own acceptance, a gain > 1
 *            resumes ACTIVE (cooldown back to cooldown_min), else PARKED with the
 *            cooldown doubled, up to cooldown_max (4096 by default).
 * Steps where the drafter had nothing (k = 0) cost nothing and change nothing but the counters.
 * All plain data: no allocation, one request per struct, used by the scheduler thread. */
#ifndef CAIRN_ENGINE_SPEC_CTL_H
#define CAIRN_ENGINE_SPEC_CTL_H

#include <stdint.h>

#define SPEC_COST_DEFAULT_SLOPE 0.1 /* extra token's cost relative to a one-token step */
#define SPEC_CTL_MAX_K 16           /* largest k_max accepted */
#define SPEC_COST_TABLE 64          /* step sizes timed one by one */

struct spec_cost {
    double w, sx, sy, sxx, sxy;  /* decayed sums of 1, n, t, n^2, n*t */
    double t_n[SPEC_COST_TABLE]; /* seconds of a step of n tokens (recent minimum, rising) */
    uint32_t n_t_n[SPEC_COST_TABLE]; /* how many such steps were seen */
    double default_slope;
    int fixed; /* observations ignored: always the default slope */
    uint64_t n_obs;
    double draft_s;       /* seconds of one drafting model step (likewise) */
    uint32_t n_draft_obs; /* how many were timed */
    double draft_prior;   /* a drafting step relative to a one-token step, before any was timed */
    int draft_fixed;      /* drafting steps' timings ignored: always draft_prior */
};

/* default_slope <= 0: SPEC_COST_DEFAULT_SLOPE. */
void spec_cost_init(struct spec_cost *c, double default_slope);
/* One step of n_tokens (>= 1) that took `seconds` (ignored unless > 0). */
void spec_cost_observe(struct spec_cost *c, int n_tokens, double seconds);
/* t(n_base + k) / t(n_base) (>= 1). */
double spec_cost_ratio(const struct spec_cost *c, int n_base, int k);
/* The fitted per-token slope relative to a one-token step (b / (a + b)), or the default when the
 * fit is not usable yet; for reports. */
double spec_cost_slope(const struct spec_cost *c);
/* One step of the drafting model (a chained MTP head step) took `seconds` (ignored unless > 0,
 * and when c->draft_fixed). */
void spec_cost_observe_draft(struct spec_cost *c, double seconds);
/* The prior cost of a drafting step relative to a one-token target step (clamped to [0, 1]). */
void spec_cost_set_draft_prior(struct spec_cost *c, double rel);
/* Cost of one drafted token relative to a step of n_base tokens (the draft(n_base) / t(n_base)
 * of the break-even). */
double spec_cost_draft_rel(const struct spec_cost *c, int n_base);

enum spec_ctl_state {
    SPEC_CTL_ACTIVE = 0,
    SPEC_CTL_PARKED,
    SPEC_CTL_PROBING,
};

struct spec_ctl_opts {
    int k_max;          /* largest draft, in [1, SPEC_CTL_MAX_K]; default 8 */
    int min_tries;      /* tested positions before ACTIVE may park; default 8 */
    int probe_tries;    /* tested positions per probe; default 4 */
    int cooldown_min;   /* tokens decoded normally after a park; default 32 */
    int cooldown_max;   /* backoff cap; default 4096 */
    double prior_alpha; /* acceptance assumed before evidence; default 0.5 */
    int recompute;      /* 1: a draft not accepted in full costs a recompute of about one more
                         * token in the next step (models with recurrent state, spec_sched.h) */
    int model_drafts;   /* 1: each drafted token costs a drafting model step (the MTP head:
                         * spec_cost_draft_rel); 0: drafts are free (n-grams) */
};

struct spec_ctl {
    struct spec_ctl_opts o;
    enum spec_ctl_state state;
    double acc, tries; /* decayed accepted / tested positions (prior included) */
    int n_tries_phase; /* positions tested since entering ACTIVE or PROBING */
    int n_acc_phase;   /* of which accepted */
    int cooldown;      /* current backoff in tokens */
    int wait;          /* PARKED: tokens left before the next probe */
    /* counters, for usage and stats */
    uint64_t n_drafted, n_accepted, n_verify_steps, n_parks, n_probes;
};

/* Defaults for every zero field; out-of-range values are clamped (documented above). */
void spec_ctl_opts_default(struct spec_ctl_opts *o);
void spec_ctl_init(struct spec_ctl *c, const struct spec_ctl_opts *o);
/* Draft length to use for this step (0 = decode normally). n_base as in gain(k) above. */
int spec_ctl_plan(const struct spec_ctl *c, const struct spec_cost *cost, int n_base);
/* After a verify step with a k-token draft (k >= 1) of which the first n_accepted matched. */
void spec_ctl_observe(struct spec_ctl *c, const struct spec_cost *cost, int k, int n_accepted);
/* n tokens were decoded without a draft (advances a parked request's cooldown). */
void spec_ctl_decoded(struct spec_ctl *c, int n);
/* PARKED: the tokens left before the probe (>= 0); else -1. A drafter that keeps state (the MTP
 * head's KV) is fed only over the last stretch before the probe. */
int spec_ctl_parked_left(const struct spec_ctl *c);
/* Current acceptance estimate. */
double spec_ctl_alpha(const struct spec_ctl *c);
/* max over k in [1, k_max] of gain(k) for acceptance alpha; *best_k gets the argmax (may be NULL).
 */
double spec_ctl_best_gain(const struct spec_cost *cost, int n_base, double alpha, int k_max,
                          int *best_k);
/* The same, charging (1 - alpha^k) * (t(n_base + 1) / t(n_base) - 1) more per step when
 * `recompute` (the chance that a draft is cut, times the recompute of a rolled-back state). */
double spec_ctl_best_gain_rc(const struct spec_cost *cost, int n_base, double alpha, int k_max,
                             int recompute, int *best_k);
/* The same, charging k * spec_cost_draft_rel(cost, n_base) more when `model_drafts`. */
double spec_ctl_best_gain_x(const struct spec_cost *cost, int n_base, double alpha, int k_max,
                            int recompute, int model_drafts, int *best_k);

#endif
