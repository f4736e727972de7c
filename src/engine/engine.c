/* Engine API side: defaults, create/destroy, submit (validation and admission checks), cancel,
 * stats. The scheduler thread itself is in sched.c; engine_create (with a real model) is in
 * engine_model.c so that this file links without the model room. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/engine_int.h"
#include "engine/spec_mtp.h"
#include "engine/spec_sched.h"
#include "kv/kv_state.h"

static void engine_opts_fill(struct engine_opts *o)
{
    /* 512 tokens per step. On the CPU the tiled prefill attention makes a chunk cost its own
     * queries × context whatever its size, and the matmuls reuse each weight tile over 64-token
     * blocks, so a larger step should buy little prefill speed while it delays every other
     * running sequence's decode token by a whole step. Not yet confirmed by measurement:
     * `cairn bench --model DIR -p 4096,16384 --chunk C` for C in 256..2048, on a quiet machine. */
    if (!o->max_batch_tokens) o->max_batch_tokens = 512;
    if (!o->max_running) o->max_running = 16;
    if (!o->max_waiting) o->max_waiting = 256;
    if (!o->block_size) o->block_size = ENGINE_DEFAULT_BLOCK_SIZE;
    if (!o->kv_bytes) o->kv_bytes = 1ull << 30;
}

void engine_opts_default(struct engine_opts *o)
{
    engine_opts_fill(o);
    /* DTYPE_F32 is 0, so a zero kv_dtype here means "unset" and becomes BF16. Callers that want
     * f32 KV (tests) set it after calling engine_opts_default; engine_create keeps what it gets. */
    if (o->kv_dtype == DTYPE_F32) o->kv_dtype = DTYPE_BF16;
}

void engine_sampling_default(struct engine_sampling *s)
{
    memset(s, 0, sizeof(*s));
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
}

/* ---- speeds across restarts (kv_tier.h: kv_tier_speeds) ---- */

#define ENGINE_RATE_PRIOR_S 0.05 /* a kept prefill rate weighs as much as 50 ms of steps */

static const char *engine_device(const struct engine *e)
{
    return e->ops.be && e->ops.be->name[0] ? e->ops.be->name : "cpu";
}

/* The prefill rate and tier speeds an earlier run of this model on this device kept: priors, so
 * the first restore-or-recompute choices after a restart are informed (without them the first SSD
 * hit is always restored; on the H200 an 8B's 32K prompt then took 7.9 s against 2.7 s cold). */
static void engine_speeds_load(struct engine *e)
{
    struct kv_tier_speeds sp;
    if (!e->cache.tiers.speeds_load || !e->cache.tiers.speeds_load(e->cache.tiers.ctx, engine_device(e), &sp))
        return;
    if (sp.prefill_tok_s > 0) {
        e->prefill_w_s = ENGINE_RATE_PRIOR_S;
        e->prefill_w_tok = sp.prefill_tok_s * ENGINE_RATE_PRIOR_S;
        e->prefill_tok_s = sp.prefill_tok_s;
    }
    kv_cache_speed_priors(&e->cache, sp.fast_bps, sp.slow_bps);
    LOG_INFO("engine", "speeds from an earlier run on %s: prefill %.0f tok/s, hot %.3g MB/s, SSD %.3g MB/s",
             engine_device(e), sp.prefill_tok_s, sp.fast_bps / 1e6, sp.slow_bps / 1e6);
}

static void engine_speeds_save(struct engine *e)
{
    if (!e->cache.blocks || !e->cache.tiers.speeds_save) return;
    struct kv_tier_speeds sp = {.prefill_tok_s = e->prefill_tok_s};
    kv_cache_speeds(&e->cache, &sp.fast_bps, &sp.slow_bps);
    e->cache.tiers.speeds_save(e->cache.tiers.ctx, engine_device(e), &sp);
}

int engine_create_ops(const struct engine_model_ops *ops, const struct engine_opts *opts_in,
                      struct engine **out, struct cairn_err *err)
{
    *out = NULL;
    if (!ops || !ops->info || !ops->forward)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "engine: model ops missing");
    struct engine *e = calloc(1, sizeof(*e));
    if (!e) return cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory");
    int rc = CAIRN_OK;
    e->ops = *ops;
    e->info = *ops->info(ops->ctx);
    const char *sched_env = getenv("CAIRN_ENGINE_SCHED"); /* "legacy": session 11's scheduler (A/B) */
    e->sched_legacy = sched_env && strcmp(sched_env, "legacy") == 0;
    e->opts = *opts_in;
    struct engine_opts *o = &e->opts;
    engine_opts_fill(o);
    if (o->kv_dtype != DTYPE_F32 && o->kv_dtype != DTYPE_BF16) {
        rc = cairn_err_set(err, CAIRN_ERR_INVALID, "engine: kv_dtype must be f32 or bf16");
        goto fail;
    }
    if (o->max_batch_tokens < 1 || o->max_running < 1 || o->max_waiting < 1 || o->block_size < 1 ||
        o->block_size > 4096) {
        rc = cairn_err_set(err, CAIRN_ERR_INVALID, "engine: bad options (batch %d, running %d, waiting %d, block %d)",
                           o->max_batch_tokens, o->max_running, o->max_waiting, o->block_size);
        goto fail;
    }
    /* every running sequence must be able to decode in every step (no decode starves) */
    if (o->max_running > o->max_batch_tokens) o->max_running = o->max_batch_tokens;
    if (o->context_length <= 0 || o->context_length > e->info.max_position)
        o->context_length = e->info.max_position > 0 ? e->info.max_position : 4096;
    rc = spec_sched_opts_fill(o, err);
    if (rc) goto fail;
    rc = spec_sched_mode_resolve(o, &e->info, ops->mtp_forward != NULL, err);
    if (rc) goto fail;
    e->spec_extra_rows = spec_sched_extra_rows(o);
    spec_cost_init(&e->spec_cost, o->spec_cost_slope);
    e->spec_cost.fixed = o->spec_cost_slope > 0;
    /* a head step reads its layer and the shared lm_head again: its share of the target's layers
     * plus lm_head, until head steps are timed (spec_ctl.h: drafting cost); or fixed */
    if (o->speculative == ENGINE_SPEC_MTP)
        spec_cost_set_draft_prior(&e->spec_cost, o->spec_draft_cost > 0
                                                     ? o->spec_draft_cost
                                                     : (e->info.n_mtp_layers + 1.0) / (e->info.n_layers + 1.0));
    e->spec_cost.draft_fixed = o->spec_draft_cost > 0;

    /* KV pool: kv_bytes covers K and V. */
    size_t layer_bytes = (size_t)o->block_size * (size_t)e->info.n_kv_heads * (size_t)e->info.head_dim *
                         dtype_size(o->kv_dtype);
    size_t per_block = 2 * (size_t)e->info.n_kv_layers * layer_bytes;
    uint64_t n_blocks = per_block ? o->kv_bytes / per_block : 4096;
    if (n_blocks < 1) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: kv_bytes %llu is less than one block (%zu bytes)",
                           (unsigned long long)o->kv_bytes, per_block);
        goto fail;
    }
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    rc = kv_pool_init(&e->pool, ops->be, e->info.n_kv_layers, (int)n_blocks, o->block_size,
                      e->info.n_kv_heads > 0 ? e->info.n_kv_heads : 1,
                      e->info.head_dim > 0 ? e->info.head_dim : 1, o->kv_dtype, err);
    if (rc) goto fail;

    /* The cache identity pins the KV layout too, so a lower tier never returns a payload of
     * another dtype or block size. */
    uint8_t ident[32];
    struct cairn_sha256 h;
    if (cairn_sha256_init(&h) != 0) {
        rc = cairn_err_set(err, CAIRN_ERR_INTERNAL, "engine: sha256 unavailable");
        goto fail;
    }
    int32_t layout[3] = {(int32_t)o->kv_dtype, o->block_size, 1 /* layout version */};
    cairn_sha256_update(&h, e->info.identity, 32);
    cairn_sha256_update(&h, "cairn-kv", 8);
    cairn_sha256_update(&h, layout, sizeof(layout));
    cairn_sha256_final(&h, ident);
    rc = kv_cache_init(&e->cache, &e->pool, ident, e->info.state_bytes, &o->tiers, err);
    if (rc) goto fail;
    rc = kv_cache_fetch_enable(&e->cache, engine_sched_fetch_notify, e, err);
    if (rc) goto fail;
    engine_speeds_load(e);
    if (e->info.state_bytes) {
        if (!o->snapshot_bytes) o->snapshot_bytes = o->kv_bytes / 2;
        uint64_t n_snap = o->snapshot_bytes / e->info.state_bytes;
        if (n_snap < 2 * (uint64_t)o->max_running) n_snap = 2 * (uint64_t)o->max_running;
        if (n_snap > (uint64_t)e->pool.n_blocks) n_snap = (uint64_t)e->pool.n_blocks;
        kv_cache_set_snapshot_limit(&e->cache, (int)n_snap);
        e->state_slots = calloc((size_t)o->max_running, sizeof(void *));
        if (!e->state_slots) {
            rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory");
            goto fail;
        }
        for (; e->n_state_free < o->max_running; e->n_state_free++) {
            rc = kv_state_alloc(ops->be, e->info.state_bytes, &e->state_slots[e->n_state_free], err);
            if (rc) goto fail;
        }
    }

    if (ops->reserve) {
        rc = ops->reserve(ops->ctx, o->max_batch_tokens, err);
        if (rc) goto fail;
    }
    size_t V = (size_t)e->info.vocab_size;
    size_t R = (size_t)o->max_running;
    e->n_logit_rows = o->max_running + e->spec_extra_rows;
    e->logits = cairn_mem_alloc((size_t)e->n_logit_rows * V * sizeof(float), CAIRN_MEM_SCRATCH);
    e->batch = calloc(R, sizeof(*e->batch));
    e->sched = calloc(R, sizeof(*e->sched));
    e->chunk = calloc(R, sizeof(*e->chunk));
    e->n_draft = calloc(R, sizeof(*e->n_draft));
    e->sample_rows = calloc(R, sizeof(*e->sample_rows));
    e->sample_out = calloc(R, sizeof(*e->sample_out));
    e->running = calloc(R, sizeof(*e->running));
    e->n_rows_seen = o->max_batch_tokens + e->n_logit_rows + 1; /* a step's rows are fewer */
    e->rows_seen = calloc((size_t)e->n_rows_seen / 8 + 1, 1);
    e->cap_cancel = e->cap_cancel_local = 64;
    e->cancel_ids = calloc(64, sizeof(uint64_t));
    e->cancel_local = calloc(64, sizeof(uint64_t));
    if (!e->logits || !e->batch || !e->sched || !e->chunk || !e->n_draft || !e->sample_rows || !e->sample_out || !e->running || !e->rows_seen || !e->cancel_ids ||
        !e->cancel_local) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    rc = spec_mtp_init(e, err);
    if (rc) goto fail;
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    if (pthread_create(&e->thread, NULL, engine_sched_main, e) != 0) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        pthread_cond_destroy(&e->cv_done);
        rc = cairn_err_set(err, CAIRN_ERR_INTERNAL, "engine: cannot start the scheduler thread");
        goto fail;
    }
    e->thread_started = 1;
    LOG_INFO("engine", "%d KV blocks of %d tokens (%s, %.1f MiB), batch %d tokens, %d running, speculative %s",
             e->pool.n_blocks, o->block_size, dtype_name(o->kv_dtype),
             (double)per_block * (double)e->pool.n_blocks / 1048576.0, o->max_batch_tokens, o->max_running,
             engine_spec_mode_name(o->speculative));
    *out = e;
    return CAIRN_OK;
fail:
    engine_destroy(e);
    return rc;
}

void engine_destroy(struct engine *e)
{
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        pthread_cond_destroy(&e->cv_done);
    }
    spec_mtp_free(e);
    engine_speeds_save(e);
    /* every sequence has been freed, so every state is back on the free stack */
    for (int i = 0; i < e->n_state_free; i++) kv_state_free(e->ops.be, e->state_slots[i], e->info.state_bytes);
    free(e->state_slots);
    if (e->cache.blocks) kv_cache_free(&e->cache);
    if (e->pool.k) kv_pool_free(&e->pool);
    cairn_mem_free(e->logits, (size_t)e->n_logit_rows * (size_t)e->info.vocab_size * sizeof(float),
                   CAIRN_MEM_SCRATCH);
    free(e->batch);
    free(e->sched);
    free(e->chunk);
    free(e->n_draft);
    free(e->sample_rows);
    free(e->sample_out);
    free(e->running);
    free(e->rows_seen);
    free(e->cancel_ids);
    free(e->cancel_local);
    free(e);
}

void engine_seq_state_put(struct engine *e, struct engine_seq *s)
{
    if (!s->state) return;
    CAIRN_ASSERT(e->n_state_free < e->opts.max_running);
    e->state_slots[e->n_state_free++] = s->state;
    s->state = NULL;
}

void engine_seq_free(struct engine *e, struct engine_seq *s)
{
    if (!s) return;
    if (s->fetch) kv_cache_fetch_cancel(&e->cache, s->fetch); /* scheduler thread only sets it */
    spec_sched_seq_free(e, s);
    sampler_free(&s->sampler);
    stop_free(&s->stop);
    grammar_matcher_free(s->gm);
    free(s->gmask);
    free(s->tokens);
    free(s->blocks);
    engine_seq_state_put(e, s);
    free(s);
}

static int engine_validate(const struct engine *e, const struct engine_request *r, struct cairn_err *err)
{
    int V = e->info.vocab_size;
    if (!r->on_event) return cairn_err_set(err, CAIRN_ERR_INVALID, "on_event: a callback is required");
    if (!r->prompt || r->n_prompt <= 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "prompt: at least one token is required");
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= V)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "prompt: token %d at position %d is out of range [0, %d)",
                                 (int)r->prompt[i], i, V);
    int rc = sampler_validate(&r->sampling, V, err);
    if (rc) return rc;
    if (r->speculative < ENGINE_SPEC_DEFAULT || r->speculative > ENGINE_SPEC_MTP)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "speculative: unknown mode %d", (int)r->speculative);
    if (r->speculative == ENGINE_SPEC_MTP && e->opts.speculative != ENGINE_SPEC_OFF && !e->mtp)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "speculative: mtp needs a model with an MTP head (mtp.* weights) served with "
                             "--speculative mtp or auto; %s drafts with %s",
                             e->info.model_type, engine_spec_mode_name(e->opts.speculative));
    if (r->max_tokens < 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "max_tokens must be >= 0 (got %d)", r->max_tokens);
    if (r->n_stop_ids < 0 || (r->n_stop_ids > 0 && !r->stop_ids))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "stop_ids: bad count %d", r->n_stop_ids);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= V)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "stop_ids: token %d out of range [0, %d)",
                                 (int)r->stop_ids[i], V);
    if (r->n_stop < 0 || (r->n_stop > 0 && !r->stop))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "stop: bad count %d", r->n_stop);
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0])
            return cairn_err_set(err, CAIRN_ERR_INVALID, "stop: string %d is empty", i);
    if (r->n_stop > 0 && !e->opts.detok.stream_new)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "stop: stop strings need a detokenizer");
    if (r->grammar && (!r->grammar_vocab || grammar_vocab_size(r->grammar_vocab) > V))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "grammar: %s",
                             r->grammar_vocab ? "the grammar vocabulary is larger than the model's" : "no vocabulary given");
    if (r->n_prompt >= e->opts.context_length)
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "prompt of %d tokens does not fit the context length %d",
                             r->n_prompt, e->opts.context_length);
    int bs = e->opts.block_size;
    int need = (r->n_prompt + bs - 1) / bs;
    if (need > e->pool.n_blocks)
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "prompt of %d tokens needs %d KV blocks, the cache has %d",
                             r->n_prompt, need, e->pool.n_blocks);
    return CAIRN_OK;
}

int engine_submit(struct engine *e, const struct engine_request *r, uint64_t *id, struct cairn_err *err)
{
    int rc = engine_validate(e, r, err);
    if (rc) return rc;
    struct engine_seq *s = calloc(1, sizeof(*s));
    if (!s) return cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory");
    int ctx = e->opts.context_length;
    s->n_prompt = s->n_tokens = r->n_prompt;
    s->max_tokens = r->max_tokens;
    long cap = r->max_tokens ? (long)r->n_prompt + r->max_tokens : ctx;
    s->cap_tokens = (int)(cap < ctx ? cap : ctx);
    s->cap_blocks = (s->cap_tokens + e->opts.block_size - 1) / e->opts.block_size;
    s->tokens = malloc((size_t)s->cap_tokens * sizeof(int32_t));
    s->blocks = malloc((size_t)s->cap_blocks * sizeof(int32_t));
    if (!s->tokens || !s->blocks) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory for a request of %d tokens", s->cap_tokens);
        goto fail;
    }
    memcpy(s->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    rc = sampler_init(&s->sampler, &r->sampling, e->info.vocab_size, err);
    if (rc) goto fail;
    rc = stop_init(&s->stop, &e->opts.detok, r->stop, r->n_stop, r->stop_ids, r->n_stop_ids,
                   e->info.eos_ids, e->info.n_eos, r->ignore_eos, err);
    if (rc) goto fail;
    if (r->grammar) {
        rc = grammar_matcher_create(r->grammar, r->grammar_vocab, &s->gm, err);
        if (rc) goto fail;
        s->gmask = calloc(((size_t)e->info.vocab_size + 31) / 32, sizeof(uint32_t));
        if (!s->gmask) {
            rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory for the grammar mask");
            goto fail;
        }
    }
    memcpy(s->salt, r->cache_salt, 32);
    spec_sched_seq_init(e, s, r);
    s->on_event = r->on_event;
    s->user = r->user;
    s->usage.prompt_tokens = r->n_prompt;
    s->t_submit = cairn_now();
    s->slot = -1;

    pthread_mutex_lock(&e->mu);
    if (e->failed) {
        rc = cairn_err_set(err, CAIRN_ERR_DEVICE, "the model failed and must be reloaded: %s", e->fail_reason);
        pthread_mutex_unlock(&e->mu);
        goto fail;
    }
    if (e->stopping || e->n_inbox + e->n_waiting_seen >= e->opts.max_waiting) {
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        rc = stopping ? cairn_err_set(err, CAIRN_ERR_BUSY, "engine is shutting down")
                      : cairn_err_set(err, CAIRN_ERR_BUSY, "too many queued requests (%d)", e->opts.max_waiting);
        goto fail;
    }
    s->id = e->next_id++;
    if (e->inbox_tail) e->inbox_tail->next = s;
    else e->inbox_head = s;
    e->inbox_tail = s;
    e->n_inbox++;
    if (id) *id = s->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return CAIRN_OK;
fail:
    engine_seq_free(e, s);
    return rc;
}

int engine_failed(struct engine *e, char *reason, size_t n)
{
    pthread_mutex_lock(&e->mu);
    int failed = e->failed;
    if (failed && reason && n) snprintf(reason, n, "%s", e->fail_reason);
    pthread_mutex_unlock(&e->mu);
    return failed;
}

void engine_cancel(struct engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    if (e->n_cancel == e->cap_cancel) {
        uint64_t *p = realloc(e->cancel_ids, (size_t)e->cap_cancel * 2 * sizeof(uint64_t));
        if (!p) {
            pthread_mutex_unlock(&e->mu);
            LOG_ERROR("engine", "out of memory queueing a cancellation of request %llu", (unsigned long long)id);
            return;
        }
        e->cancel_ids = p;
        e->cap_cancel *= 2;
    }
    e->cancel_ids[e->n_cancel++] = id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_get_stats(struct engine *e, struct engine_stats *st)
{
    pthread_mutex_lock(&e->mu);
    *st = e->stats;
    st->n_waiting += e->n_inbox;
    pthread_mutex_unlock(&e->mu);
}

void engine_cache_clear(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    uint64_t ticket = ++e->clear_req;
    pthread_cond_signal(&e->cv);
    while (e->clear_done < ticket && !e->stopping) pthread_cond_wait(&e->cv_done, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

const struct model_info *engine_model_info(const struct engine *e) { return &e->info; }
