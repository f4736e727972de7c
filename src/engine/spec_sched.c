/* Speculative decoding in the scheduler: drafts packed into decode steps, verification, rollback
 * (see spec_sched.h). Scheduler thread only, except spec_sched_seq_init (engine_submit). */
#include "engine/spec_sched.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "engine/spec_mtp.h"
#include "grammar/grammar.h"
#include "engine/spec_verify.h"
#include "kv/kv_state.h"

/* Sequences per step whose drafts get logits rows: more drafts in one step gain less each (the
 * gain formula divides by the batch), and every row is vocab_size floats. */
#define SPEC_SCHED_DRAFT_SEQS 4
#define SPEC_SCHED_DEFAULT_K_MAX 8
/* decodes considered per step (the rows limit how many draft anyway) */
#define SPEC_SCHED_PLAN_MAX 256

int engine_spec_mode_parse(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "off")) return ENGINE_SPEC_OFF;
    if (!strcmp(s, "ngram")) return ENGINE_SPEC_NGRAM;
    if (!strcmp(s, "auto")) return ENGINE_SPEC_AUTO;
    if (!strcmp(s, "mtp")) return ENGINE_SPEC_MTP;
    return -1;
}

const char *engine_spec_mode_name(enum engine_spec_mode m)
{
    switch (m) {
    case ENGINE_SPEC_NGRAM:
        return "ngram";
    case ENGINE_SPEC_AUTO:
        return "auto";
    case ENGINE_SPEC_MTP:
        return "mtp";
    default:
        return "off";
    }
}

int spec_sched_opts_fill(struct engine_opts *o, struct cairn_err *err)
{
    if (o->speculative == ENGINE_SPEC_DEFAULT) o->speculative = ENGINE_SPEC_OFF;
    if (o->speculative < ENGINE_SPEC_OFF || o->speculative > ENGINE_SPEC_MTP)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "engine: unknown speculative mode %d",
                             (int)o->speculative);
    if (!(o->spec_draft_cost >= 0 && o->spec_draft_cost <= 1))
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "engine: spec_draft_cost must be in [0, 1] (got %g)",
                             o->spec_draft_cost);
    if (!(o->spec_cost_slope >= 0 && o->spec_cost_slope <= 1))
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "engine: spec_cost_slope must be in [0, 1] (got %g)",
                             o->spec_cost_slope);
    if (!o->spec_k_max) o->spec_k_max = SPEC_SCHED_DEFAULT_K_MAX;
    if (o->spec_k_max < 1 || o->spec_k_max > SPEC_CTL_MAX_K)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "engine: spec_k_max must be in [1, %d] (got %d)", SPEC_CTL_MAX_K,
                             o->spec_k_max);
    if (!o->spec_ngram_min) o->spec_ngram_min = SPEC_NGRAM_DEFAULT_MIN_N;
    if (!o->spec_ngram_max)
        o->spec_ngram_max = CAIRN_MAX(SPEC_NGRAM_DEFAULT_MAX_N, o->spec_ngram_min);
    if (o->spec_ngram_min < 1 || o->spec_ngram_max < o->spec_ngram_min ||
        o->spec_ngram_max > SPEC_NGRAM_MAX_N)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "engine: n-gram lengths need 1 <= min (%d) <= max (%d) <= %d",
                             o->spec_ngram_min, o->spec_ngram_max, SPEC_NGRAM_MAX_N);
    return CAIRN_OK;
}

int spec_sched_mode_resolve(struct engine_opts *o, const struct model_info *info, int has_mtp_op,
                            struct cairn_err *err)
{
    int has = has_mtp_op && info->n_mtp_layers > 0;
    if (o->speculative == ENGINE_SPEC_AUTO)
        o->speculative = has ? ENGINE_SPEC_MTP : ENGINE_SPEC_NGRAM;
    if (o->speculative == ENGINE_SPEC_MTP && !has)
        return cairn_err_set(
            err, CAIRN_ERR_INVALID,
            "engine: --speculative mtp needs a model with an MTP head (mtp.* weights); %s has "
            "none (use ngram, or auto to pick the best drafter the model has)",
            info->model_type);
    return CAIRN_OK;
}

int spec_sched_extra_rows(const struct engine_opts *o)
{
    if (o->speculative == ENGINE_SPEC_DEFAULT || o->speculative == ENGINE_SPEC_OFF) return 0;
    return CAIRN_MIN(o->max_running, SPEC_SCHED_DRAFT_SEQS) * o->spec_k_max;
}

void spec_sched_seq_free(struct engine *e, struct engine_seq *s)
{
    struct spec_seq *p = s->spec;
    if (!p) return;
    spec_ngram_free(&p->ngram);
    spec_mtp_seq_free(e, p);
    kv_state_free(e->ops.be, p->state_copy, e->info.state_bytes);
    free(p);
    s->spec = NULL;
}

void spec_sched_seq_init(struct engine *e, struct engine_seq *s, const struct engine_request *r)
{
    s->spec = NULL;
    if (!e->spec_extra_rows || r->speculative == ENGINE_SPEC_OFF) return;
    struct cairn_err err = {0};
    struct spec_seq *p = calloc(1, sizeof(*p));
    if (!p) {
        LOG_WARN("engine", "no speculation for a request: out of memory");
        return;
    }
    s->spec = p;
    /* the index grows by doubling; sized for the prompt and a typical answer */
    int expect = CAIRN_MIN(s->cap_tokens, s->n_prompt + 512);
    if (spec_ngram_init(&p->ngram, e->opts.spec_ngram_min, e->opts.spec_ngram_max, expect, &err)) {
        LOG_WARN("engine", "no speculation for a request: %s", err.msg);
        spec_sched_seq_free(e, s);
        return;
    }
    p->use_mtp = e->mtp && r->speculative != ENGINE_SPEC_NGRAM;
    struct spec_ctl_opts co = {.k_max = e->opts.spec_k_max,
                               .recompute = e->info.state_bytes > 0,
                               .model_drafts = p->use_mtp};
    spec_ctl_init(&p->ctl, &co);
    if (e->info.state_bytes) {
        if (kv_state_alloc(e->ops.be, e->info.state_bytes, &p->state_copy, &err) != CAIRN_OK) {
            LOG_WARN("engine", "no speculation for a request: no memory for a state copy: %s", err.msg);
            spec_sched_seq_free(e, s);
        }
    }
}

/* KV blocks for positions [0, n_tokens + n) of s: a free block or none (no eviction, no
 * preemption). Returns the n that fits. */
static int spec_sched_take_blocks(struct engine *e, struct engine_seq *s, int n)
{
    int bs = e->opts.block_size;
    while (n > 0 && s->n_blocks * bs < s->n_tokens + n) {
        if (kv_cache_n_free(&e->cache) == 0) return s->n_blocks * bs - s->n_tokens;
        int b = kv_cache_alloc(&e->cache);
        CAIRN_ASSERT(b >= 0 && s->n_blocks < s->cap_blocks);
        s->blocks[s->n_blocks++] = b;
    }
    return n;
}

/* The longest prefix of s's n-token draft (at s->tokens + s->n_tokens) that its grammar accepts
 * (n without one): the rest could never be verified (a masked row cannot sample it), so it is
 * cut before it costs a row. The matcher walks the draft and is rolled back (O(1) per token). */
static int spec_sched_grammar_cut(struct engine_seq *s, int n)
{
    if (!s->gm || n <= 0) return n;
    const int32_t *d = s->tokens + s->n_tokens;
    int ok = 0;
    while (ok < n && grammar_matcher_accept_token(s->gm, d[ok]) == CAIRN_OK)
        ok++;
    if (ok > 0 && grammar_matcher_rollback(s->gm, ok) != CAIRN_OK) return 0;
    return ok;
}

/* s drafts n tokens (at s->tokens + s->n_tokens) in decode entry i of this step */
static void spec_sched_add_draft(struct engine *e, int i, int n)
{
    struct engine_seq *s = e->sched[i];
    struct spec_seq *p = s->spec;
    memcpy(p->draft, s->tokens + s->n_tokens, (size_t)n * sizeof(int32_t));
    if (p->state_copy) {
        struct cairn_err err = {0};
        /* a failed copy is a device failure: the step fails with it (step_end) */
        if (kv_state_copy(e->ops.be, p->state_copy, s->state, e->info.state_bytes, &err) != CAIRN_OK)
            LOG_ERROR("engine", "request %llu: cannot copy its state: %s", (unsigned long long)s->id, err.msg);
    }
    e->chunk[i] += n;
    e->n_draft[i] = n;
}

int spec_sched_plan(struct engine *e, int n_decodes, int budget)
{
    int used = 0, rows_left = e->spec_extra_rows, bs = e->opts.block_size;
    int want[SPEC_SCHED_PLAN_MAX];
    int n_plan = CAIRN_MIN(n_decodes, SPEC_SCHED_PLAN_MAX), any_mtp = 0;
    for (int i = 0; i < n_plan; i++)
        want[i] = 0;
    /* a backend whose results depend on the step's row count beyond exact_rows (the GPU: its
     * small-batch matmuls vs cuBLAS, split-K vs tiled attention) gets drafts only inside it, so every verified row
     * has the bits its plain decode would have: greedy output is the same with and without */
    int exact = e->ops.be ? e->ops.be->exact_rows : 0; /* a test engine may have none */
    if (exact > 0) budget = CAIRN_MIN(budget, exact - n_decodes);
    for (int i = 0; i < n_plan && budget - used > 0 && rows_left > 0; i++) {
        struct engine_seq *s = e->sched[i];
        struct spec_seq *p = s->spec;
        if (!p) continue;
        CAIRN_ASSERT(e->chunk[i] == 1 && s->n_tokens - s->n_computed == 1);
        int k = spec_ctl_plan(&p->ctl, &e->spec_cost, n_decodes);
        /* the head is fed this step (its hidden rows asked of the forward) only when drafting
         * pays now or a probe is near: a decode priced out or parked costs it nothing */
        int left = spec_ctl_parked_left(&p->ctl);
        if (p->use_mtp && (k > 0 || (left >= 0 && left <= SPEC_MTP_BACKLOG)))
            p->head_step = e->n_steps + 1;
        /* up to k + 1 tokens are emitted: they must fit the request */
        k = CAIRN_MIN(k, s->cap_tokens - s->n_tokens - 1);
        k = CAIRN_MIN(k, CAIRN_MIN(budget - used, rows_left));
        int n = 0;
        if (k > 0 && p->use_mtp) {
            /* the head drafts after this loop: take its blocks and budget now */
            n = spec_sched_take_blocks(e, s, k);
            if (n <= 0) {
                spec_ctl_decoded(&p->ctl, 1);
                continue;
            }
            want[i] = n;
            any_mtp = 1;
            used += n;
            rows_left -= n;
            continue;
        }
        if (k > 0 && e->opts.drafter.draft) {
            n = e->opts.drafter.draft(e->opts.drafter.ctx, s->tokens, s->n_tokens, k,
                                      s->tokens + s->n_tokens);
            n = CAIRN_MAX(0, CAIRN_MIN(n, k));
        } else if (k > 0) {
            n = spec_ngram_draft(&p->ngram, s->tokens, s->n_tokens, k, s->tokens + s->n_tokens);
            if (n < 0) {
                LOG_WARN("engine",
                         "request %llu stops speculating: out of memory for its n-gram index",
                         (unsigned long long)s->id);
                spec_sched_seq_free(e, s);
                continue;
            }
        }
        n = spec_sched_grammar_cut(s, n);
        if (n > 0) n = spec_sched_take_blocks(e, s, n);
        if (n <= 0) {
            spec_ctl_decoded(&p->ctl, 1); /* counts a parked request's cooldown */
            continue;
        }
        spec_sched_add_draft(e, i, n);
        used += n;
        rows_left -= n;
    }
    if (!e->mtp) return used;
    /* the MTP head: catch-up of every running MTP sequence, drafts for those that asked */
    int asked[SPEC_SCHED_PLAN_MAX];
    memcpy(asked, want, sizeof(int) * (size_t)n_plan);
    spec_mtp_draft(e, n_plan, want);
    if (!any_mtp) return used;
    for (int i = 0; i < n_plan; i++) {
        if (!asked[i]) continue;
        struct engine_seq *s = e->sched[i];
        int n = want[i];
        if (n > 0 && e->opts.mtp_script.draft) {
            n = e->opts.mtp_script.draft(e->opts.mtp_script.ctx, s->tokens, s->n_tokens, n,
                                         s->tokens + s->n_tokens);
            n = CAIRN_MAX(0, CAIRN_MIN(n, want[i]));
        }
        n = spec_sched_grammar_cut(s, n);
        used -= asked[i] - n;
        /* blocks taken for drafts the head did not make go back (never written by the target) */
        int keep = (s->n_tokens + n + bs - 1) / bs;
        while (s->n_blocks > keep && s->n_blocks > s->n_published)
            kv_cache_release(&e->cache, s->blocks[--s->n_blocks]);
        if (n <= 0) {
            spec_ctl_decoded(&s->spec->ctl, 1);
            continue;
        }
        spec_sched_add_draft(e, i, n);
    }
    return used;
}

struct spec_sched_emit_ctx {
    struct engine *e;
    struct engine_seq *s;
    enum engine_finish *fin;
    int done;
};

static int spec_sched_emit(void *ctx, int32_t tok)
{
    struct spec_sched_emit_ctx *x = ctx;
    x->done = engine_sched_grammar_accept(x->s, tok, x->fin) ||
              engine_sched_commit(x->e, x->s, tok, x->fin);
    return x->done;
}

/* The grammar's mask for the next row (sched_sample's, per verified row) */
static int spec_sched_mask(void *ctx)
{
    struct spec_sched_emit_ctx *x = ctx;
    x->done = engine_sched_grammar_mask(x->s, x->fin);
    return x->done;
}

int spec_sched_verify(struct engine *e, struct engine_seq *s, int n_draft, const float *rows,
                      enum engine_finish *fin, int *n_emitted)
{
    struct spec_seq *p = s->spec;
    CAIRN_ASSERT(p && n_draft > 0 && s->n_tokens - s->n_computed == 1);
    int n0 = s->n_tokens, c0 = s->n_computed, bs = e->opts.block_size;
    struct spec_sched_emit_ctx x = {e, s, fin, 0};
    int acc = 0;
    *n_emitted = spec_verify_masked(&s->sampler, rows, (size_t)e->info.vocab_size, s->tokens, n0,
                                    n0 - s->n_prompt, p->draft, n_draft,
                                    s->gm ? spec_sched_mask : NULL, spec_sched_emit, &x, &acc);
    s->usage.spec_drafted += n_draft;
    s->usage.spec_accepted += acc;
    e->n_spec_drafted += (uint64_t)n_draft;
    e->n_spec_accepted += (uint64_t)acc;
    e->n_spec_steps++;
    uint64_t parks = p->ctl.n_parks;
    spec_ctl_observe(&p->ctl, &e->spec_cost, n_draft, acc);
    e->n_spec_parks += p->ctl.n_parks - parks;
    if (x.done) return 1; /* the caller finishes it and releases everything */

    /* KV holds the last committed token and the accepted drafts */
    s->n_computed = c0 + 1 + acc;
    if (p->state_copy && acc < n_draft) {
        /* the state absorbed rejected tokens: back to the step's start, recompute next step */
        struct cairn_err err = {0};
        if (kv_state_copy(e->ops.be, s->state, p->state_copy, e->info.state_bytes, &err) != CAIRN_OK)
            LOG_ERROR("engine", "request %llu: cannot roll its state back: %s", (unsigned long long)s->id, err.msg);
        s->n_computed = c0;
    }
    int keep = (s->n_tokens + bs - 1) / bs;
    CAIRN_ASSERT(s->n_published <= keep);
    while (s->n_blocks > keep)
        kv_cache_release(&e->cache, s->blocks[--s->n_blocks]);
    return 0;
}

void spec_sched_observe_step(struct engine *e, int n_tokens, double seconds)
{
    if (e->spec_extra_rows) spec_cost_observe(&e->spec_cost, n_tokens, seconds);
}
