/* Speculation control: step-cost fit, acceptance tracking, parking and backoff (see spec_ctl.h). */
#include "engine/spec_ctl.h"

#include <math.h>
#include <string.h>

#include "base/status.h"

#define SPEC_COST_DECAY 0.98 /* per observed step: the fit follows the last ~50 steps */
/* A timed size's estimate: the fastest recent step, rising 5 % per step of that size (noise on a
 * shared machine only adds time: a mean of it priced drafts out for good, since a size that stops
 * being drafted is never timed again). */
#define SPEC_COST_TABLE_RISE 1.05
#define SPEC_CTL_DECAY 0.95       /* per tested position: alpha follows the last ~20 */
#define SPEC_CTL_SHORT_K 2        /* draft length of probes and of evidence-gathering drafts */
#define SPEC_CTL_PRIOR_WEIGHT 2.0 /* the prior counts as this many tested positions */

/* ---- cost ---- */

void spec_cost_init(struct spec_cost *c, double default_slope)
{
    memset(c, 0, sizeof(*c));
    c->default_slope = default_slope > 0 ? default_slope : SPEC_COST_DEFAULT_SLOPE;
}

void spec_cost_observe(struct spec_cost *c, int n_tokens, double seconds)
{
    if (c->fixed || !(seconds > 0) || !isfinite(seconds) || n_tokens < 1) return;
    double n = n_tokens;
    c->w = c->w * SPEC_COST_DECAY + 1;
    c->sx = c->sx * SPEC_COST_DECAY + n;
    c->sy = c->sy * SPEC_COST_DECAY + seconds;
    c->sxx = c->sxx * SPEC_COST_DECAY + n * n;
    c->sxy = c->sxy * SPEC_COST_DECAY + n * seconds;
    c->n_obs++;
    if (n_tokens < SPEC_COST_TABLE) {
        double *t = &c->t_n[n_tokens];
        *t = c->n_t_n[n_tokens]++ ? fmin(seconds, SPEC_COST_TABLE_RISE * *t) : seconds;
    }
}

/* Mean measured time of steps of n tokens, or 0 if not seen enough. */
static double spec_cost_table(const struct spec_cost *c, int n)
{
    return n < SPEC_COST_TABLE && c->n_t_n[n] >= 2 ? c->t_n[n] : 0;
}

/* Fitted a and b of t(n) = a + b n, or 0 when the data cannot support a fit: the token counts
 * must vary (variance >= 0.25) and the fit must be physical (a > 0, b >= 0). */
static int spec_cost_fit(const struct spec_cost *c, double *a, double *b)
{
    if (c->n_obs < 4 || c->w <= 0) return 0;
    double mx = c->sx / c->w, my = c->sy / c->w;
    double vxx = c->sxx / c->w - mx * mx, vxy = c->sxy / c->w - mx * my;
    if (vxx < 0.25) return 0;
    *b = vxy / vxx;
    *a = my - *b * mx;
    return *a > 0 && *b >= 0;
}

double spec_cost_slope(const struct spec_cost *c)
{
    double a, b;
    if (!spec_cost_fit(c, &a, &b)) return c->default_slope;
    return b / (a + b);
}

void spec_cost_observe_draft(struct spec_cost *c, double seconds)
{
    if (c->draft_fixed || !(seconds > 0) || !isfinite(seconds)) return;
    c->draft_s = c->n_draft_obs++ ? fmin(seconds, SPEC_COST_TABLE_RISE * c->draft_s) : seconds;
}

void spec_cost_set_draft_prior(struct spec_cost *c, double rel)
{
    c->draft_prior = rel > 0 && rel <= 1 ? rel : rel > 1 ? 1 : 0;
}

/* Measured seconds of a step of n tokens: the table, else the fit; 0 when neither is usable. */
static double spec_cost_seconds(const struct spec_cost *c, int n)
{
    double t = spec_cost_table(c, n), a, b;
    if (t > 0) return t;
    return spec_cost_fit(c, &a, &b) ? a + b * n : 0;
}

double spec_cost_draft_rel(const struct spec_cost *c, int n_base)
{
    if (n_base < 1) n_base = 1;
    double t = spec_cost_seconds(c, n_base);
    if (c->n_draft_obs >= 2 && t > 0) return c->draft_s / t;
    return c->draft_prior / spec_cost_ratio(c, 1, n_base - 1);
}

double spec_cost_ratio(const struct spec_cost *c, int n_base, int k)
{
    if (n_base < 1) n_base = 1;
    if (k <= 0) return 1.0;
    double t0 = spec_cost_table(c, n_base), t1 = spec_cost_table(c, n_base + k);
    if (t0 > 0 && t1 > 0) return t1 > t0 ? t1 / t0 : 1.0;
    double a, b;
    if (!spec_cost_fit(c, &a, &b)) {
        a = 1 - c->default_slope;
        b = c->default_slope;
    }
    double r = (a + b * (n_base + k)) / (a + b * n_base);
    return r > 1.0 ? r : 1.0;
}

/* ---- break-even ---- */

double spec_ctl_best_gain_x(const struct spec_cost *cost, int n_base, double alpha, int k_max,
                            int recompute, int model_drafts, int *best_k)
{
    if (n_base < 1) n_base = 1;
    double best = 0, e = 1, ak = 1; /* e = E(k) = 1 + alpha + ... + alpha^k */
    double redo = recompute ? spec_cost_ratio(cost, n_base, 1) - 1 : 0;
    double draft = model_drafts ? spec_cost_draft_rel(cost, n_base) : 0;
    int arg = 1;
    for (int k = 1; k <= k_max; k++) {
        ak *= alpha;
        e += ak;
        double g = (n_base - 1 + e) / n_base /
                   (spec_cost_ratio(cost, n_base, k) + (1 - ak) * redo + k * draft);
        if (g > best) {
            best = g;
            arg = k;
        }
    }
    if (best_k) *best_k = arg;
    return best;
}

double spec_ctl_best_gain_rc(const struct spec_cost *cost, int n_base, double alpha, int k_max,
                             int recompute, int *best_k)
{
    return spec_ctl_best_gain_x(cost, n_base, alpha, k_max, recompute, 0, best_k);
}

double spec_ctl_best_gain(const struct spec_cost *cost, int n_base, double alpha, int k_max,
                          int *best_k)
{
    return spec_ctl_best_gain_rc(cost, n_base, alpha, k_max, 0, best_k);
}

/* ---- control ---- */

void spec_ctl_opts_default(struct spec_ctl_opts *o)
{
    if (o->k_max <= 0) o->k_max = 8;
    if (o->k_max > SPEC_CTL_MAX_K) o->k_max = SPEC_CTL_MAX_K;
    if (o->min_tries <= 0) o->min_tries = 8;
    if (o->probe_tries <= 0) o->probe_tries = 4;
    if (o->cooldown_min <= 0) o->cooldown_min = 32;
    if (o->cooldown_max <= 0) o->cooldown_max = 4096;
    if (o->cooldown_max < o->cooldown_min) o->cooldown_max = o->cooldown_min;
    if (!(o->prior_alpha > 0 && o->prior_alpha < 1)) o->prior_alpha = 0.5;
}

static void spec_ctl_fresh_evidence(struct spec_ctl *c)
{
    c->acc = c->o.prior_alpha * SPEC_CTL_PRIOR_WEIGHT;
    c->tries = SPEC_CTL_PRIOR_WEIGHT;
    c->n_tries_phase = 0;
    c->n_acc_phase = 0;
}

void spec_ctl_init(struct spec_ctl *c, const struct spec_ctl_opts *o)
{
    memset(c, 0, sizeof(*c));
    if (o) c->o = *o;
    spec_ctl_opts_default(&c->o);
    c->state = SPEC_CTL_ACTIVE;
    c->cooldown = c->o.cooldown_min;
    spec_ctl_fresh_evidence(c);
}

double spec_ctl_alpha(const struct spec_ctl *c)
{
    return c->acc / c->tries;
}

int spec_ctl_plan(const struct spec_ctl *c, const struct spec_cost *cost, int n_base)
{
    if (c->state == SPEC_CTL_PARKED) return 0;
    int k;
    double alpha = spec_ctl_alpha(c);
    if (spec_ctl_best_gain_x(cost, n_base, alpha, c->o.k_max, c->o.recompute, c->o.model_drafts,
                             &k) > 1.0)
        return k;
    /* a probe always drafts (that is how evidence comes back), short: the cheapest evidence */
    if (c->state == SPEC_CTL_PROBING) return CAIRN_MIN(k, SPEC_CTL_SHORT_K);
    /* ACTIVE and not paying in this step. If the estimate fell below the prior early and the prior
     * would pay here, keep drafting (short) until min_tries decide the park, so an unlucky start
     * does not stop drafting for good. If not even the prior would pay, the cost is the reason (a
     * big batch, a costly chunk): skip this step; a cheaper one drafts again. */
    int k1;
    if (c->n_tries_phase < c->o.min_tries && alpha < c->o.prior_alpha &&
        spec_ctl_best_gain_x(cost, n_base, c->o.prior_alpha, c->o.k_max, c->o.recompute,
                             c->o.model_drafts, &k1) > 1.0)
        return CAIRN_MIN(k1, SPEC_CTL_SHORT_K);
    return 0;
}

static void spec_ctl_park(struct spec_ctl *c)
{
    c->state = SPEC_CTL_PARKED;
    c->wait = c->cooldown;
    c->n_parks++;
}

void spec_ctl_observe(struct spec_ctl *c, const struct spec_cost *cost, int k, int n_accepted)
{
    if (k <= 0 || c->state == SPEC_CTL_PARKED) return;
    if (n_accepted < 0) n_accepted = 0;
    if (n_accepted > k) n_accepted = k;
    int tested = n_accepted + (n_accepted < k);
    double d = pow(SPEC_CTL_DECAY, tested);
    c->acc = c->acc * d + n_accepted;
    c->tries = c->tries * d + tested;
    c->n_tries_phase += tested;
    c->n_acc_phase += n_accepted;
    c->n_drafted += (uint64_t)k;
    c->n_accepted += (uint64_t)n_accepted;
    c->n_verify_steps++;

    /* verdicts on the acceptance alone (a one-sequence step): a big batch only skips drafts in
     * spec_ctl_plan, it never parks a request whose drafts are good */
    if (c->state == SPEC_CTL_ACTIVE) {
        double g = spec_ctl_best_gain_x(cost, 1, spec_ctl_alpha(c), c->o.k_max, c->o.recompute,
                                        c->o.model_drafts, NULL);
        if (c->n_tries_phase >= c->o.min_tries && g <= 1.0) {
            c->cooldown = c->o.cooldown_min;
            spec_ctl_park(c);
        }
    } else if (c->n_tries_phase >= c->o.probe_tries) {
        /* PROBING: the verdict on the probe's own evidence (the prior would outweigh a short probe)
         */
        double g = spec_ctl_best_gain_x(cost, 1, (double)c->n_acc_phase / c->n_tries_phase,
                                        c->o.k_max, 0, c->o.model_drafts, NULL);
        if (g > 1.0) {
            c->state = SPEC_CTL_ACTIVE;
            c->cooldown = c->o.cooldown_min;
            c->n_tries_phase = c->n_acc_phase = 0;
        } else {
            c->cooldown = c->cooldown * 2 < c->o.cooldown_max ? c->cooldown * 2 : c->o.cooldown_max;
            spec_ctl_park(c);
        }
    }
}

int spec_ctl_parked_left(const struct spec_ctl *c)
{
    if (c->state != SPEC_CTL_PARKED) return -1;
    return c->wait > 0 ? c->wait : 0;
}

void spec_ctl_decoded(struct spec_ctl *c, int n)
{
    if (c->state != SPEC_CTL_PARKED || n <= 0) return;
    c->wait -= n;
    if (c->wait <= 0) {
        c->state = SPEC_CTL_PROBING;
        c->n_probes++;
        spec_ctl_fresh_evidence(c);
    }
}
