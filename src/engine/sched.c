/* The scheduler thread: continuous batching with chunked prefill, prefix reuse and preemption.
 *
 * DESIGN
 * - A sequence holds tokens[0, n_tokens) (prompt, then generated) and KV for positions
 *   [0, n_computed). Each step processes tokens[n_computed, n_computed + chunk); when that reaches
 *   n_tokens the model returns logits for the last position and a token is sampled. Prefill,
 *   decode (chunk 1) and recomputation after preemption are the same operation.
 * - A step packs, within max_batch_tokens: (A) the decodes of running sequences, oldest first;
 *   (B) the next prefill chunk of running sequences still prefilling; (C) new sequences from the
 *   head of the waiting queue (strict FCFS: the head is never skipped, so nobody starves), up to
 *   max_running. Admission first takes the longest cached prefix (at most n_tokens - 1 tokens so
 *   the last position is computed for its logits) in up to three phases (kv_cache.h): plan
 *   (device, then the lower tiers; restore what beats recomputing at the measured speeds); if a
 *   block to restore is on disk, the request leaves the queue for the fetching list while the
 *   fetch thread reads its chain, and the others keep stepping; when the job is done it goes
 *   back to the head of the queue and the match installs the fetched blocks. RAM-tier (hot)
 *   hits are copied here, on this thread: a memcpy or an upload, no I/O.
 * - Blocks are allocated for the tokens a step processes. Admission is gated (vLLM / SGLang
 *   style): the queue's head is admitted only if the free and evictable blocks cover what it
 *   owes (the rest of its prompt and its expected output) plus what the running sequences owe
 *   and a 1% watermark (sched_blocks_reserved; the expected share of outputs, growth_ratio,
 *   adapts to preemptions). No admission happens in a step that preempted. Only a decode that
 *   cannot get a block preempts (a prefill chunk shrinks to the blocks there are, or waits,
 *   unless the step would be empty): the running sequence not yet in this step with the fewest
 *   positions computed (the newest on a tie) is preempted: its blocks are released (full ones
 *   stay cached, so it usually comes back cheaply) and it goes back to the FRONT of the waiting
 *   queue with its tokens, to be recomputed. CAIRN_ENGINE_SCHED=legacy keeps session 11's way
 *   (admitted when its first chunk fits, newest preempted, prefills preempt too) for A/B runs.
 * - Accounting (sched_acct.c): every step's rows by kind and its time before, in and after the
 *   forward, and the thread's time outside steps (engine_stats.acct, /api/status steps).
 * - After the forward, newly full blocks are published to the prefix index (switching to an
 *   identical published twin when there is one); hybrid models snapshot the recurrent state when a
 *   prefill chunk ends on a block boundary (chunks are cut at the prompt's last full block
 *   boundary so that one always exists).
 * - Finished, cancelled and failed sequences release their blocks and get exactly one DONE.
 * - A step that fails with CAIRN_ERR_DEVICE (the backend's bounded wait timed out, or a sticky
 *   device error) fails the engine for good: every running, queued and fetching request ends
 *   with error_code CAIRN_ERR_DEVICE, and so does anything submitted after (engine_failed).
 * - Speculative decoding (spec_sched.h) extends packed decodes with drafts, verified after the
 *   forward; a verify entry has chunk 1 + n_draft and as many logits rows.
 * - Sampling: a row the backend can sample (ops.can_sample and sampler_row_eligible: one logit
 *   row, no grammar, top-k only as far as be->sample_top_k, no top-p without it) is prepared
 *   before the forward (the penalties' edits and the request's PRNG draw,
 *   sampler_row_prepare) and comes back as an id (+ logprobs) in
 *   sample_out; every other row's logits come back and are sampled here. Both paths give the
 *   same tokens (sampler.h). The phases of each step are timed into engine_stats (t_*).
 * Callbacks run here, with e->mu NOT held (they may call engine_cancel). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/engine_int.h"
#include "engine/spec_mtp.h"
#include "engine/spec_sched.h"
#include "kv/kv_state.h"

/* ---- events ---- */

static void sched_emit_done(struct engine *e, struct engine_seq *s, enum engine_finish fin,
                            const char *error, int error_code)
{
    double now = cairn_now();
    struct engine_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = ENGINE_EVENT_DONE;
    ev.request_id = s->id;
    ev.finish = fin;
    ev.stop_text = fin == ENGINE_FINISH_STOP ? stop_matched(&s->stop) : NULL;
    ev.stop_token = fin == ENGINE_FINISH_STOP && !ev.stop_text ? s->stop.stop_token : -1;
    ev.error = error;
    ev.error_code = error_code;
    ev.usage = s->usage;
    if (s->t_first_sched > 0) ev.usage.queue_s = s->t_first_sched - s->t_submit;
    else ev.usage.queue_s = now - s->t_submit;
    if (s->t_first_token > 0) {
        ev.usage.prefill_s = s->t_first_token - s->t_first_sched;
        ev.usage.decode_s = now - s->t_first_token;
    } else if (s->t_first_sched > 0) {
        ev.usage.prefill_s = now - s->t_first_sched;
    }
    e->n_requests_done++;
    s->on_event(s->user, &ev);
    e->t_emit_s += cairn_now() - now;
}

static void sched_release_blocks(struct engine *e, struct engine_seq *s)
{
    for (int i = 0; i < s->n_blocks; i++) kv_cache_release(&e->cache, s->blocks[i]);
    s->n_blocks = 0;
    s->n_published = 0;
    s->n_computed = 0;
    memset(s->parent, 0, sizeof(s->parent));
}

/* Finishes a sequence that is in no list any more; error_code as engine_event's. */
static void sched_finish_code(struct engine *e, struct engine_seq *s, enum engine_finish fin, const char *error,
                              int error_code)
{
    sched_release_blocks(e, s);
    sched_emit_done(e, s, fin, error, error_code);
    engine_seq_free(e, s);
}

static void sched_finish(struct engine *e, struct engine_seq *s, enum engine_finish fin, const char *error)
{
    sched_finish_code(e, s, fin, error, 0);
}

/* ---- lists ---- */

static void sched_running_remove(struct engine *e, struct engine_seq *s)
{
    for (int i = 0; i < e->n_running; i++) {
        if (e->running[i] == s) {
            memmove(&e->running[i], &e->running[i + 1], (size_t)(e->n_running - i - 1) * sizeof(s));
            e->n_running--;
            return;
        }
    }
    CAIRN_ASSERT(!"sequence not running");
}

static int sched_index_of(const struct engine *e, const struct engine_seq *s)
{
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == s) return i;
    CAIRN_ASSERT(!"sequence not running");
    return -1;
}

static void sched_waiting_push_front(struct engine *e, struct engine_seq *s)
{
    s->next = e->wait_head;
    e->wait_head = s;
    if (!e->wait_tail) e->wait_tail = s;
    e->n_waiting++;
}

static struct engine_seq *sched_waiting_pop_front(struct engine *e)
{
    struct engine_seq *s = e->wait_head;
    if (!s) return NULL;
    e->wait_head = s->next;
    if (!e->wait_head) e->wait_tail = NULL;
    s->next = NULL;
    e->n_waiting--;
    return s;
}

/* ---- the fetching list (requests whose prefix is being read) ---- */

static void sched_fetching_push(struct engine *e, struct engine_seq *s)
{
    s->next = NULL;
    if (e->fetch_tail) e->fetch_tail->next = s;
    else e->fetch_head = s;
    e->fetch_tail = s;
    e->n_fetching++;
}

/* Unlinks the fetching request with this id and finishes it CANCELLED (engine_seq_free gives
 * its job up). Returns 1 if it was there. */
static int sched_fetching_remove(struct engine *e, uint64_t id)
{
    struct engine_seq **pp = &e->fetch_head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
        struct engine_seq *s = *pp;
        if (s->id != id) continue;
        *pp = s->next;
        if (e->fetch_tail == s) e->fetch_tail = prev;
        e->n_fetching--;
        s->next = NULL;
        sched_finish(e, s, ENGINE_FINISH_CANCELLED, NULL);
        return 1;
    }
    return 0;
}

/* Moves requests whose fetch is done back to the head of the queue, in fetch order (they were
 * at the head when they left it). */
static void sched_fetching_collect(struct engine *e)
{
    struct engine_seq *done_head = NULL, *done_tail = NULL;
    struct engine_seq **pp = &e->fetch_head, *prev = NULL;
    while (*pp) {
        struct engine_seq *s = *pp;
        if (!kv_cache_fetch_done(&e->cache, s->fetch)) {
            prev = s;
            pp = &s->next;
            continue;
        }
        *pp = s->next;
        if (e->fetch_tail == s) e->fetch_tail = prev;
        e->n_fetching--;
        s->next = NULL;
        if (done_tail) done_tail->next = s;
        else done_head = s;
        done_tail = s;
        e->n_waiting++;
    }
    if (!done_head) return;
    done_tail->next = e->wait_head;
    if (!e->wait_head) e->wait_tail = done_tail;
    e->wait_head = done_head;
}

void engine_sched_fetch_notify(void *ctx)
{
    struct engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    e->fetch_ready = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* ---- inbox: new requests, cancellations, stop ---- */

static void sched_cancel_id(struct engine *e, uint64_t id)
{
    for (int i = 0; i < e->n_running; i++) {
        struct engine_seq *s = e->running[i];
        if (s->id == id) {
            sched_running_remove(e, s);
            sched_finish(e, s, ENGINE_FINISH_CANCELLED, NULL);
            return;
        }
    }
    if (sched_fetching_remove(e, id)) return;
    struct engine_seq **pp = &e->wait_head, *prev = NULL;
    while (*pp) {
        struct engine_seq *s = *pp;
        if (s->id == id) {
            *pp = s->next;
            if (e->wait_tail == s) e->wait_tail = prev;
            e->n_waiting--;
            s->next = NULL;
            sched_finish(e, s, ENGINE_FINISH_CANCELLED, NULL);
            return;
        }
        prev = s;
        pp = &s->next;
    }
    LOG_DEBUG("engine", "cancel: request %llu not found", (unsigned long long)id);
}

static void sched_cancel_all(struct engine *e)
{
    while (e->n_running > 0) {
        struct engine_seq *s = e->running[e->n_running - 1];
        e->n_running--;
        sched_finish(e, s, ENGINE_FINISH_CANCELLED, NULL);
    }
    struct engine_seq *s;
    while ((s = sched_waiting_pop_front(e))) sched_finish(e, s, ENGINE_FINISH_CANCELLED, NULL);
    while ((s = e->fetch_head)) {
        e->fetch_head = s->next;
        e->n_fetching--;
        s->next = NULL;
        sched_finish(e, s, ENGINE_FINISH_CANCELLED, NULL);
    }
    e->fetch_tail = NULL;
}

/* The device stalled or failed (CAIRN_ERR_DEVICE): the engine is failed for good; every running,
 * queued and fetching request ends with the reason (the API's 503). */
static void sched_fail_all(struct engine *e, const char *reason)
{
    pthread_mutex_lock(&e->mu);
    if (!e->failed) {
        e->failed = 1;
        snprintf(e->fail_reason, sizeof(e->fail_reason), "%s", reason);
        LOG_ERROR("engine", "model failed, its requests end: %s", reason);
    }
    char msg[sizeof(e->fail_reason) + 64];
    snprintf(msg, sizeof(msg), "the model failed: %s", e->fail_reason);
    pthread_mutex_unlock(&e->mu);
    struct engine_seq *s;
    while (e->n_running > 0) {
        s = e->running[--e->n_running];
        sched_finish_code(e, s, ENGINE_FINISH_ERROR, msg, CAIRN_ERR_DEVICE);
    }
    while ((s = sched_waiting_pop_front(e))) sched_finish_code(e, s, ENGINE_FINISH_ERROR, msg, CAIRN_ERR_DEVICE);
    while ((s = e->fetch_head)) {
        e->fetch_head = s->next;
        e->n_fetching--;
        s->next = NULL;
        sched_finish_code(e, s, ENGINE_FINISH_ERROR, msg, CAIRN_ERR_DEVICE);
    }
    e->fetch_tail = NULL;
}

/* ---- block allocation and preemption ---- */

/* The running sequence, not in this step's batch and holding blocks, whose preemption costs
 * least: the fewest positions computed (what it may have to recompute), the newest on a tie.
 * Legacy (CAIRN_ENGINE_SCHED=legacy): the newest (highest id). NULL if there is none. */
static struct engine_seq *sched_pick_victim(struct engine *e)
{
    struct engine_seq *v = NULL;
    for (int i = 0; i < e->n_running; i++) {
        struct engine_seq *s = e->running[i];
        if (s->slot >= 0) continue;
        if (e->sched_legacy) {
            if (!v || s->id > v->id) v = s;
        } else if (s->n_blocks > 0 &&
                   (!v || s->n_computed < v->n_computed || (s->n_computed == v->n_computed && s->order > v->order))) {
            v = s;
        }
    }
    return v;
}

static void sched_preempt(struct engine *e, struct engine_seq *s)
{
    if (s->n_computed > s->n_computed_peak) s->n_computed_peak = s->n_computed;
    if (s->n_preempted) e->acct.n_repreemptions++;
    s->n_preempted++;
    s->preempt_step = e->n_steps;
    e->acct.n_preempted_blocks += (uint64_t)s->n_blocks;
    sched_running_remove(e, s);
    sched_release_blocks(e, s);
    engine_seq_state_put(e, s);
    sched_waiting_push_front(e, s);
    e->n_preemptions++;
    LOG_DEBUG("engine", "preempted request %llu (%d tokens)", (unsigned long long)s->id, s->n_tokens);
}

enum { SCHED_ALLOC_OK = 0, SCHED_ALLOC_SELF_PREEMPTED, SCHED_ALLOC_IMPOSSIBLE };

/* Makes s hold blocks for positions [0, upto). May preempt unscheduled sequences (the cheapest
 * first: sched_pick_victim); if s is itself the cheapest it is preempted (SELF_PREEMPTED). When s is the only holder and
 * still cannot fit, IMPOSSIBLE. `may_preempt` = 0 (new admissions) never preempts: it fails
 * with SELF_PREEMPTED after undoing nothing (the caller releases). */
static int sched_alloc_upto(struct engine *e, struct engine_seq *s, int upto, int may_preempt)
{
    int bs = e->opts.block_size;
    while (s->n_blocks * bs < upto) {
        CAIRN_ASSERT(s->n_blocks < s->cap_blocks);
        int b = kv_cache_alloc(&e->cache);
        if (b >= 0) {
            s->blocks[s->n_blocks++] = b;
            continue;
        }
        if (!may_preempt) return SCHED_ALLOC_SELF_PREEMPTED;
        struct engine_seq *v = sched_pick_victim(e);
        /* s is running and unscheduled (slot < 0) here, so v != NULL */
        if (v == s || !v) {
            /* s is the cheapest candidate; if nothing else holds blocks, it can never fit */
            int others = 0;
            for (int i = 0; i < e->n_running; i++)
                if (e->running[i] != s && e->running[i]->n_blocks > 0) others = 1;
            if (!others) return SCHED_ALLOC_IMPOSSIBLE;
            sched_preempt(e, s);
            return SCHED_ALLOC_SELF_PREEMPTED;
        }
        sched_preempt(e, v);
    }
    return SCHED_ALLOC_OK;
}

/* ---- admission ---- */

/* The expected share of a running sequence's output still to come (sched_blocks_owed), as
 * SGLang estimates it: it starts at SCHED_GROWTH_INIT, decays by SCHED_GROWTH_DECAY every step
 * without a preemption down to SCHED_GROWTH_MIN (requests that stop early leave room), and rises
 * by SCHED_GROWTH_BUMP at each step that preempted (the estimate was short), up to 1. */
#define SCHED_GROWTH_INIT 0.7
#define SCHED_GROWTH_MIN 0.1
#define SCHED_GROWTH_DECAY 0.001
#define SCHED_GROWTH_BUMP 0.1
#define SCHED_GROWTH_CLIP 4096 /* tokens of a sequence's output counted at most */

/* Blocks s still needs for its known tokens and for the output it is expected to add: what
 * admitting or keeping it commits of the pool. The expected output is growth_ratio of what its
 * max_tokens leaves (at most SCHED_GROWTH_CLIP tokens: a request without max_tokens may run to
 * the context's end, and seldom does), and at least one block, capped at its last position. */
static int sched_blocks_owed(const struct engine *e, const struct engine_seq *s)
{
    int bs = e->opts.block_size;
    int left = s->cap_tokens - s->n_tokens;
    int grow = (int)(e->growth_ratio * (double)(left < SCHED_GROWTH_CLIP ? left : SCHED_GROWTH_CLIP));
    if (grow < bs) grow = bs;
    int upto = grow < left ? s->n_tokens + grow : s->cap_tokens;
    int owed = (upto + bs - 1) / bs - s->n_blocks;
    return owed > 0 ? owed : 0;
}

/* The admission gate's reserve: the blocks the running sequences still owe (the rest of their
 * prompts, their expected growth) and a watermark of 1% of the pool. A sequence is admitted only
 * if the free and evictable blocks cover this plus what it owes itself, so that admissions seldom
 * make running sequences preempt one another (session 11's scheduler admitted whatever fit its
 * first chunk: then prefill chunks and decodes preempted, the preempted came back at the queue's
 * head and were preempted again, recomputing what they lost). */
static int sched_blocks_reserved(const struct engine *e)
{
    int n = e->pool.n_blocks / 100;
    for (int i = 0; i < e->n_running; i++) n += sched_blocks_owed(e, e->running[i]);
    return n;
}

/* Phases 1-2 of an admission: plans the prefix of the queue's head s and, when blocks to restore
 * are on disk, starts their fetch. Returns 1 if s now waits for it (the caller moves it to the
 * fetching list). A fetch that cannot start leaves the plan to the device and RAM tiers. */
static int sched_plan_prefix(struct engine *e, struct engine_seq *s)
{
    int max_blocks = (s->n_tokens - 1) / e->opts.block_size;
    struct kv_cache_plan p;
    kv_cache_plan(&e->cache, s->tokens, s->n_tokens, s->salt, max_blocks, e->prefill_tok_s, &p);
    s->planned = 1;
    s->match_limit = p.n_device + p.n_restore;
    if (p.n_slow == 0) return 0;
    return kv_cache_fetch_start(&e->cache, s->tokens, s->salt, &p, &s->fetch) == CAIRN_OK;
}

/* The hybrid state of a sequence being admitted: a free slot (n_running < max_running, so
 * there is one), holding the snapshot of its last matched block (a device-to-device copy on a
 * GPU) or a fresh state. A failed copy drops the match: the prefix is recomputed. */
static void sched_seq_state_start(struct engine *e, struct engine_seq *s, int *n_matched)
{
    size_t sb = e->info.state_bytes;
    if (!s->state) {
        CAIRN_ASSERT(e->n_state_free > 0);
        s->state = e->state_slots[--e->n_state_free];
    }
    int n = *n_matched;
    const void *snap = n > 0 ? kv_cache_snapshot(&e->cache, s->blocks[n - 1]) : NULL;
    struct cairn_err err = {0};
    if (snap && kv_state_copy(e->ops.be, s->state, snap, sb, &err) == CAIRN_OK) return;
    if (snap) {
        LOG_WARN("engine", "request %llu: cannot restore a state snapshot (%s): recomputing its prefix",
                 (unsigned long long)s->id, err.msg);
        while (n > 0) kv_cache_release(&e->cache, s->blocks[--n]);
        *n_matched = 0;
    }
    if (e->ops.state_init) e->ops.state_init(e->ops.ctx, s->state);
    else if (kv_state_zero(e->ops.be, s->state, sb, &err) != CAIRN_OK)
        LOG_WARN("engine", "request %llu: cannot zero its state: %s", (unsigned long long)s->id, err.msg);
}

/* Prefix lookup (phase 3) for a sequence that holds no blocks; sets n_computed to what was
 * reused. Consumes the plan and the fetched job. */
static void sched_match_prefix(struct engine *e, struct engine_seq *s)
{
    int bs = e->opts.block_size;
    int max_blocks = (s->n_tokens - 1) / bs;
    if (s->planned && s->match_limit < max_blocks) max_blocks = s->match_limit;
    int n = 0;
    struct kv_fetch_job *job = s->fetch;
    s->fetch = NULL;
    s->planned = 0;
    if (max_blocks > 0)
        n = kv_cache_match_fetched(&e->cache, s->tokens, s->n_tokens, s->salt, max_blocks, s->blocks, job);
    else
        kv_cache_match_fetched(&e->cache, s->tokens, 0, s->salt, 0, s->blocks, job); /* frees it */
    if (e->info.state_bytes) sched_seq_state_start(e, s, &n);
    s->n_blocks = s->n_published = n;
    s->n_computed = n * bs;
    memset(s->parent, 0, 32);
    if (n > 0) memcpy(s->parent, kv_cache_block_hash(&e->cache, s->blocks[n - 1]), 32);
}

/* Counts a successful admission: the prefix lookup, and the first admission's cached tokens
 * (a sequence coming back after preemption reuses its own blocks: not counted again). */
static void sched_count_admission(struct engine *e, struct engine_seq *s)
{
    e->n_prefix_lookups++;
    if (s->n_published > 0) e->n_prefix_hits++;
    if (s->n_preempted) {
        e->acct.n_readmissions++;
        if (s->preempt_step == e->n_steps) e->acct.n_readmit_same_step++;
    }
    if (!s->admitted_once) {
        s->usage.cached_tokens = s->n_computed;
        e->n_cached_tokens += (uint64_t)s->n_computed;
        e->n_prompt_tokens += (uint64_t)s->n_prompt;
        s->admitted_once = 1;
    }
}

/* Prefill chunk for s given the remaining budget. Hybrid models can only reuse a prefix that ends
 * on a block with a state snapshot, and snapshots are taken where a chunk ends on a block
 * boundary, so chunks are cut at: the last full block boundary of the known tokens (what a longer
 * follow-up prompt can reuse), the last boundary before the final token (what the same prompt sent
 * again can reuse: at most n_tokens - 1 tokens are ever reused), and otherwise at the last
 * boundary inside the budget. */
static int sched_chunk(const struct engine *e, const struct engine_seq *s, int budget)
{
    int want = s->n_tokens - s->n_computed;
    int c = want < budget ? want : budget;
    if (e->info.state_bytes && c > 1) {
        int bs = e->opts.block_size;
        int end = s->n_computed + c;
        int cuts[2] = {(s->n_tokens - 1) / bs * bs, s->n_tokens / bs * bs};
        for (int i = 0; i < 2; i++) {
            if (cuts[i] > s->n_computed && cuts[i] < end) {
                end = cuts[i];
                break;
            }
        }
        if (end == s->n_computed + c && c < want && end / bs * bs > s->n_computed) end = end / bs * bs;
        c = end - s->n_computed;
    }
    return c;
}

static void sched_add(struct engine *e, struct engine_seq *s, int chunk, int *n_sched)
{
    int i = (*n_sched)++;
    s->slot = i;
    e->sched[i] = s;
    e->chunk[i] = chunk;
    e->n_draft[i] = 0;
    if (s->t_first_sched == 0) s->t_first_sched = cairn_now();
}

/* ---- after the forward ---- */

static void sched_publish(struct engine *e, struct engine_seq *s)
{
    int bs = e->opts.block_size;
    while ((s->n_published + 1) * bs <= s->n_computed) {
        int j = s->n_published;
        int b = s->blocks[j];
        int got = kv_cache_publish(&e->cache, b, s->parent, s->tokens + (size_t)j * (size_t)bs, s->salt, s->parent);
        if (got != b) {
            kv_cache_release(&e->cache, b);
            s->blocks[j] = got;
            e->n_shared_blocks++;
        }
        s->n_published++;
    }
}

int engine_sched_grammar_mask(struct engine_seq *s, enum engine_finish *fin)
{
    if (!s->gm) return 0;
    /* only constrained sequences pay; a lazy grammar's free text needs no mask */
    int free_text = grammar_matcher_unconstrained(s->gm);
    if (free_text < 0) {
        s->error_msg = "grammar: matcher out of memory";
        *fin = ENGINE_FINISH_ERROR;
        return 1;
    }
    if (free_text) return 0;
    int n_ok = grammar_matcher_fill_mask(s->gm, s->gmask);
    if (n_ok == 0 && grammar_matcher_finished(s->gm)) { /* complete, eos already taken (ignore_eos) */
        *fin = ENGINE_FINISH_STOP;
        return 1;
    }
    if (n_ok <= 0) {
        s->error_msg = n_ok == 0 ? "grammar: no token can continue the output" : "grammar: matcher out of memory";
        *fin = ENGINE_FINISH_ERROR;
        return 1;
    }
    s->sampler.allowed = s->gmask;
    return 0;
}

int engine_sched_grammar_accept(struct engine_seq *s, int32_t tok, enum engine_finish *fin)
{
    if (s->gm && grammar_matcher_accept_token(s->gm, tok) != CAIRN_OK) {
        s->error_msg = "grammar: the sampled token was not accepted";
        *fin = ENGINE_FINISH_ERROR;
        return 1;
    }
    return 0;
}

/* Samples (or takes the row the forward sampled on the device: dev), emits the token, and returns
 * 1 if the sequence finished (finish filled). */
static int sched_sample(struct engine *e, struct engine_seq *s, const float *logits,
                        const struct backend_sample_out *dev, enum engine_finish *fin)
{
    int n_gen = s->n_tokens - s->n_prompt;
    double t0 = cairn_now();
    int32_t tok;
    if (dev) {
        tok = sampler_row_finish(&s->sampler, dev);
        e->n_rows_device++;
    } else {
        if (engine_sched_grammar_mask(s, fin)) return 1; /* mask before sampling */
        tok = sampler_sample(&s->sampler, logits, s->tokens, s->n_tokens, n_gen);
        e->n_rows_host++;
    }
    sampler_accept(&s->sampler, tok);
    e->t_sample_s += cairn_now() - t0;
    if (engine_sched_grammar_accept(s, tok, fin)) return 1;
    return engine_sched_commit(e, s, tok, fin);
}

int engine_sched_commit(struct engine *e, struct engine_seq *s, int32_t tok, enum engine_finish *fin)
{
    CAIRN_ASSERT(s->n_tokens < s->cap_tokens);
    s->tokens[s->n_tokens++] = tok;
    s->usage.completion_tokens++;
    e->n_generated_tokens++;
    if (s->t_first_token == 0) s->t_first_token = cairn_now();

    int at_limit = s->n_tokens >= s->cap_tokens;
    const char *text;
    size_t len;
    double t0 = cairn_now();
    int rc = at_limit ? stop_feed_final(&s->stop, tok, &text, &len) : stop_feed(&s->stop, tok, &text, &len);
    double t1 = cairn_now();
    e->t_detok_s += t1 - t0;
    int done = 0;
    if (rc < 0) {
        text = "";
        len = 0;
        *fin = ENGINE_FINISH_ERROR;
        done = 1;
    } else if (rc == STOP_TOKEN || rc == STOP_STRING) {
        *fin = ENGINE_FINISH_STOP;
        done = 1;
    } else if (at_limit) {
        *fin = ENGINE_FINISH_LENGTH;
        done = 1;
    }
    struct engine_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.kind = ENGINE_EVENT_TOKEN;
    ev.request_id = s->id;
    ev.token = tok;
    ev.text = text;
    ev.text_len = len;
    ev.stop_token = -1;
    ev.usage = s->usage; /* prompt and cached counts for the API's first event (engine.h) */
    if (s->sampler.p.logprobs || s->sampler.p.top_logprobs) {
        ev.logprob = s->sampler.logprob;
        ev.n_top = s->sampler.n_top;
        ev.top_ids = s->sampler.top_ids;
        ev.top_logprobs = s->sampler.top_logprobs;
    }
    s->on_event(s->user, &ev);
    e->t_emit_s += cairn_now() - t1;
    return done;
}

/* ---- one step ---- */

/* A rate weighted by tokens: tokens and seconds each decay by 0.8 a step, so a step's weight is
 * its token count (a 64-token restore chunk does not pull a 4,096-token rate down as one step
 * of equal say would). Returns the rate. */
static double sched_rate_add(double *w_tok, double *w_s, double tokens, double dt)
{
    *w_tok = 0.8 * *w_tok + tokens;
    *w_s = 0.8 * *w_s + dt;
    return *w_tok / *w_s;
}

static void sched_step(struct engine *e)
{
    double t_plan0 = cairn_now(), t_step0 = t_plan0;
    uint64_t n_preempt0 = e->n_preemptions;
    int budget = e->opts.max_batch_tokens;
    int n_sched = 0;
    int n_decode = 0, n_prefill = 0;
    for (int i = 0; i < e->n_running; i++) e->running[i]->slot = -1;

    /* (A) decodes, oldest first */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        struct engine_seq *s = e->running[i];
        if (s->n_tokens - s->n_computed != 1) continue;
        int r = sched_alloc_upto(e, s, s->n_computed + 1, 1);
        if (r == SCHED_ALLOC_IMPOSSIBLE) {
            sched_running_remove(e, s);
            sched_finish(e, s, ENGINE_FINISH_LENGTH, NULL);
            i--;
            continue;
        }
        if (r == SCHED_ALLOC_SELF_PREEMPTED) break; /* memory is short: stop packing */
        i = sched_index_of(e, s); /* preempting others may have shifted it */
        sched_add(e, s, 1, &n_sched);
        budget--;
    }
    /* (A') drafts of speculating decodes, once every decode has its token */
    if (e->spec_extra_rows && (n_sched || e->mtp)) budget -= spec_sched_plan(e, n_sched, budget);
    /* (B) prefill chunks of running sequences. They preempt nobody (only a decode that cannot get
     * a block does) unless the step would be empty: a chunk shrinks to the blocks there are, and
     * when there are none the older prefills wait for the decodes to free some (the newer ones
     * would find none either). Legacy: a chunk preempts like a decode. */
    int bs = e->opts.block_size;
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        struct engine_seq *s = e->running[i];
        if (s->slot >= 0 || s->n_tokens - s->n_computed <= 1) continue;
        int may_preempt = e->sched_legacy || n_sched == 0;
        int c = sched_chunk(e, s, budget);
        if (!may_preempt) {
            int fit = (s->n_blocks + kv_cache_n_available(&e->cache)) * bs - s->n_computed;
            if (fit <= 0) break;
            if (fit < c) c = sched_chunk(e, s, fit);
        }
        int r = sched_alloc_upto(e, s, s->n_computed + c, may_preempt);
        if (r == SCHED_ALLOC_IMPOSSIBLE) {
            sched_running_remove(e, s);
            sched_finish(e, s, ENGINE_FINISH_LENGTH, NULL);
            i--;
            continue;
        }
        if (r == SCHED_ALLOC_SELF_PREEMPTED) break;
        i = sched_index_of(e, s);
        sched_add(e, s, c, &n_sched);
        budget -= c;
    }
    /* (C) admissions, strict FCFS: none in a step that preempted (what it freed is for the running
     * ones; the preempted sequence, now at the queue's head, comes back once its blocks and the
     * reserve fit), and each only past the gate (sched_blocks_reserved). Legacy: a sequence is
     * admitted when its first chunk's blocks can be had. */
    int gate = !e->sched_legacy;
    if (gate && e->n_preemptions != n_preempt0) budget = 0;
    int reserved = gate && e->wait_head && budget > 0 ? sched_blocks_reserved(e) : 0;
    while (budget > 0 && e->n_running < e->opts.max_running && e->wait_head) {
        struct engine_seq *s = e->wait_head;
        if (!s->planned && sched_plan_prefix(e, s)) {
            sched_waiting_pop_front(e);
            sched_fetching_push(e, s); /* back at the head when its blocks are in memory */
            continue;
        }
        sched_match_prefix(e, s);
        int c = sched_chunk(e, s, budget);
        /* alone it is admitted whatever it owes: nothing else could free blocks for it (one that
         * can never fit ends with LENGTH at its decodes) */
        int r = gate && e->n_running > 0 && sched_blocks_owed(e, s) + reserved > kv_cache_n_available(&e->cache)
                    ? SCHED_ALLOC_SELF_PREEMPTED
                    : sched_alloc_upto(e, s, s->n_computed + c, 0);
        if (r != SCHED_ALLOC_OK) {
            /* keep waiting; drop what it holds so cached blocks stay evictable */
            sched_release_blocks(e, s);
            engine_seq_state_put(e, s);
            e->acct.n_admit_deferred++;
            break;
        }
        sched_count_admission(e, s);
        sched_waiting_pop_front(e);
        e->running[e->n_running++] = s;
        s->slot = -1;
        sched_add(e, s, c, &n_sched);
        budget -= c;
        if (gate) reserved += sched_blocks_owed(e, s);
    }
    if (e->n_preemptions != n_preempt0) e->growth_ratio = CAIRN_MIN(1.0, e->growth_ratio + SCHED_GROWTH_BUMP);
    else e->growth_ratio = CAIRN_MAX(SCHED_GROWTH_MIN, e->growth_ratio - SCHED_GROWTH_DECAY);
    if (n_sched == 0) {
        if (e->n_running || e->wait_head) e->acct.n_empty_passes++;
        return;
    }

    /* build the batch (a preempted sequence may have left a hole: none can, since only
     * unscheduled sequences are preempted) */
    size_t V = (size_t)e->info.vocab_size;
    int n_rows = 0, n_step_tokens = 0;
    struct engine_step_rows rows = {0};
    for (int i = 0; i < n_sched; i++) {
        struct engine_seq *s = e->sched[i];
        struct model_seq *m = &e->batch[i];
        int c = e->chunk[i], nd = e->n_draft[i];
        m->tokens = s->tokens + s->n_computed;
        m->n_tokens = c;
        m->pos0 = s->n_computed;
        m->block_table = s->blocks;
        m->state = s->state;
        /* the last position's logits, and those of each draft token (nd = 0 but for verifies) */
        m->n_logits = s->n_computed + c == s->n_tokens + nd ? 1 + nd : 0;
        m->logits = e->logits + (size_t)n_rows * V;
        m->sample = NULL;
        m->sample_out = NULL;
        int max_k = e->ops.be ? e->ops.be->sample_top_k : 0;
        if (e->ops.can_sample && m->n_logits == 1 && nd == 0 && !s->gm && sampler_row_eligible(&s->sampler, max_k)) {
            /* sampled by the forward on the device: the penalties' edits and the draw now */
            double ts = cairn_now();
            sampler_row_prepare(&s->sampler, s->tokens, s->n_tokens, s->n_tokens - s->n_prompt, &e->sample_rows[i]);
            m->sample = &e->sample_rows[i];
            m->sample_out = &e->sample_out[i];
            e->t_sample_s += cairn_now() - ts;
            t_plan0 += cairn_now() - ts; /* counted as sampling, not planning */
        }
        spec_mtp_want_hidden(e, s, m, n_step_tokens); /* n_hidden: 0 unless it drafts with MTP */
        n_rows += m->n_logits;
        n_step_tokens += c;
        if (c == 1 + nd && m->n_logits) n_decode++;
        else n_prefill += c;
        rows.n_ctx += s->n_computed + c;
        if (nd) rows.n_verify += c;
        else if (c == 1 && m->n_logits) rows.n_decode++;
        else rows.n_prefill += c;
    }
    CAIRN_ASSERT(n_rows <= e->n_logit_rows);
    /* let engine_submit see the queue as it is now, not as it was before admissions */
    pthread_mutex_lock(&e->mu);
    e->n_waiting_seen = e->n_waiting + e->n_fetching;
    pthread_mutex_unlock(&e->mu);
    double t0 = cairn_now();
    e->t_plan_s += t0 - t_plan0;
    struct cairn_err err = {0};
    int rc = e->ops.forward(e->ops.ctx, &e->pool, e->batch, n_sched, &err);
    double dt = cairn_now() - t0;
    double t_issue = 0, t_wait = dt;
    if (e->ops.step_times) e->ops.step_times(e->ops.ctx, &t_issue, &t_wait);
    e->t_issue_s += t_issue;
    e->t_wait_s += dt - t_issue;
    e->n_steps++;
    if (rc == CAIRN_ERR_DEVICE) {
        sched_fail_all(e, err.msg[0] ? err.msg : cairn_status_str(rc));
        engine_acct_step(e, &rows, t0 - t_step0, dt, cairn_now() - t0 - dt);
        return;
    }
    if (rc) {
        LOG_ERROR("engine", "forward failed: %s", err.msg);
        for (int i = 0; i < n_sched; i++) {
            struct engine_seq *s = e->sched[i];
            sched_running_remove(e, s);
            sched_finish(e, s, ENGINE_FINISH_ERROR, err.msg[0] ? err.msg : cairn_status_str(rc));
        }
        engine_acct_step(e, &rows, t0 - t_step0, dt, cairn_now() - t0 - dt);
        return;
    }
    if (n_prefill == 0) spec_sched_observe_step(e, n_step_tokens, dt);

    int n_decode_tokens = 0; /* produced by decode and verify entries */
    for (int i = 0; i < n_sched; i++) {
        struct engine_seq *s = e->sched[i];
        int c = e->chunk[i];
        int had_logits = e->batch[i].n_logits;
        if (e->n_draft[i]) {
            enum engine_finish fin = ENGINE_FINISH_STOP;
            int n_emitted = 0;
            int done = spec_sched_verify(e, s, e->n_draft[i], e->batch[i].logits, &fin, &n_emitted);
            n_decode_tokens += n_emitted;
            if (done) {
                sched_running_remove(e, s);
                sched_finish(e, s, fin,
                             fin == ENGINE_FINISH_ERROR ? (s->error_msg ? s->error_msg : "detokenizer failed") : NULL);
            } else {
                sched_publish(e, s);
            }
            continue;
        }
        if (c == 1 && had_logits) n_decode_tokens++;
        if (s->n_computed_peak > s->n_computed) { /* recomputing what a preemption dropped */
            int redo = s->n_computed_peak - s->n_computed;
            rows.n_recomputed += redo < c ? redo : c;
        }
        s->n_computed += c;
        if (e->info.state_bytes && s->n_computed % bs == 0 && !(c == 1 && had_logits)) {
            int b = s->blocks[s->n_computed / bs - 1];
            if (!kv_cache_snapshot(&e->cache, b)) kv_cache_snapshot_attach(&e->cache, b, s->state);
        }
        sched_publish(e, s);
        if (!had_logits) continue;
        enum engine_finish fin = ENGINE_FINISH_STOP;
        if (sched_sample(e, s, e->batch[i].logits, e->batch[i].sample ? &e->sample_out[i] : NULL, &fin)) {
            sched_running_remove(e, s);
            sched_finish(e, s, fin, fin == ENGINE_FINISH_ERROR ? (s->error_msg ? s->error_msg : "detokenizer failed") : NULL);
        }
    }
    if (dt > 0) {
        /* rates over steps of each kind (mixed steps count for both) */
        if (n_decode) e->decode_tok_s = sched_rate_add(&e->decode_w_tok, &e->decode_w_s, n_decode_tokens, dt);
        if (n_prefill) /* kv_cache_plan's restore-or-recompute reads it */
            e->prefill_tok_s = sched_rate_add(&e->prefill_w_tok, &e->prefill_w_s, n_prefill, dt);
    }
    double t_end = cairn_now();
    if (n_prefill == 0) {
        e->decode_step_s += t_end - t0;
        e->n_decode_step_tokens += (uint64_t)n_decode_tokens;
    }
    engine_acct_step(e, &rows, t0 - t_step0, dt, t_end - t0 - dt);
}

/* ---- thread ---- */

static void sched_publish_stats(struct engine *e)
{
    struct engine_stats *st = &e->stats;
    st->n_running = e->n_running;
    st->n_waiting = e->n_waiting + e->n_fetching;
    st->n_fetching = e->n_fetching;
    st->n_fetches = e->cache.n_fetches;
    st->n_fetches_cut = e->cache.n_fetches_cut;
    st->n_fetched_blocks = e->cache.n_fetched_blocks;
    st->n_plans_restore = e->cache.n_plans_restore;
    st->n_plans_recompute = e->cache.n_plans_recompute;
    st->n_blocks_recomputed = e->cache.n_blocks_recomputed;
    st->tier_fast_read_bps = e->cache.fast_read_bps;
    st->tier_slow_read_bps = e->cache.slow_read_bps;
    st->n_blocks_total = e->pool.n_blocks;
    st->n_blocks_used = kv_cache_n_used(&e->cache);
    st->n_blocks_cached = kv_cache_n_cached(&e->cache);
    st->n_blocks_free = kv_cache_n_free(&e->cache);
    st->n_requests_done = e->n_requests_done;
    st->n_prompt_tokens = e->n_prompt_tokens;
    st->n_cached_tokens = e->n_cached_tokens;
    st->n_generated_tokens = e->n_generated_tokens;
    st->n_preemptions = e->n_preemptions;
    st->n_prefix_lookups = e->n_prefix_lookups;
    st->n_prefix_hits = e->n_prefix_hits;
    st->decode_tok_s = e->decode_tok_s;
    st->prefill_tok_s = e->prefill_tok_s;
    st->block_size = e->opts.block_size;
    st->n_steps = e->n_steps;
    st->n_evictions = e->cache.n_evictions;
    st->n_promotions = e->cache.n_promotions;
    st->n_shared_blocks = e->n_shared_blocks;
    st->n_snapshots = e->cache.n_snapshots;
    st->decode_step_s = e->decode_step_s;
    st->n_decode_step_tokens = e->n_decode_step_tokens;
    st->n_spec_drafted = e->n_spec_drafted;
    st->n_spec_accepted = e->n_spec_accepted;
    st->n_spec_steps = e->n_spec_steps;
    st->n_spec_parks = e->n_spec_parks;
    st->n_spec_head_rows = e->n_spec_head_rows;
    st->spec_cost_slope = e->spec_extra_rows ? spec_cost_slope(&e->spec_cost) : 0;
    st->t_plan_s = e->t_plan_s;
    st->t_issue_s = e->t_issue_s;
    st->t_wait_s = e->t_wait_s;
    st->t_sample_s = e->t_sample_s;
    st->t_detok_s = e->t_detok_s;
    st->t_emit_s = e->t_emit_s;
    st->n_rows_device = e->n_rows_device;
    st->n_rows_host = e->n_rows_host;
    engine_acct_publish(e, &st->acct);
    e->n_waiting_seen = e->n_waiting + e->n_fetching;
}

void *engine_sched_main(void *arg)
{
    struct engine *e = arg;
    pthread_mutex_lock(&e->mu);
    e->t_sched_start = cairn_now();
    e->growth_ratio = SCHED_GROWTH_INIT;
    sched_publish_stats(e);
    for (;;) {
        double t_wait0 = cairn_now();
        while (!e->stopping && !e->inbox_head && !e->n_cancel && e->clear_req == e->clear_done &&
               e->n_running == 0 && !e->wait_head && !e->fetch_ready)
            pthread_cond_wait(&e->cv, &e->mu);
        e->acct.t_idle_s += cairn_now() - t_wait0;
        e->fetch_ready = 0; /* the fetching list is looked at below */
        /* take the inbox */
        struct engine_seq *in = e->inbox_head;
        int n_in = e->n_inbox;
        e->inbox_head = e->inbox_tail = NULL;
        e->n_inbox = 0;
        e->n_waiting_seen += n_in; /* keep BUSY accounting continuous until the next publish */
        uint64_t *ids = e->cancel_ids;
        int n_ids = e->n_cancel, cap = e->cap_cancel;
        e->cancel_ids = e->cancel_local;
        e->cap_cancel = e->cap_cancel_local;
        e->n_cancel = 0;
        e->cancel_local = ids;
        e->cap_cancel_local = cap;
        int stopping = e->stopping;
        int failed = e->failed;
        int clear = e->clear_req != e->clear_done;
        uint64_t clear_to = e->clear_req;
        pthread_mutex_unlock(&e->mu);

        while (in) {
            struct engine_seq *s = in;
            in = in->next;
            s->next = NULL;
            if (e->wait_tail) e->wait_tail->next = s;
            else e->wait_head = s;
            e->wait_tail = s;
            e->n_waiting++;
        }
        for (int i = 0; i < n_ids; i++) sched_cancel_id(e, ids[i]);
        if (e->fetch_head) sched_fetching_collect(e);
        if (stopping) {
            sched_cancel_all(e);
            pthread_mutex_lock(&e->mu);
            /* late submissions raced with stopping: cancel them too */
            while (e->inbox_head) {
                struct engine_seq *s = e->inbox_head;
                e->inbox_head = s->next;
                pthread_mutex_unlock(&e->mu);
                sched_finish(e, s, ENGINE_FINISH_CANCELLED, NULL);
                pthread_mutex_lock(&e->mu);
            }
            e->inbox_tail = NULL;
            e->n_inbox = 0;
            sched_publish_stats(e);
            pthread_cond_broadcast(&e->cv_done);
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        if (clear) kv_cache_clear(&e->cache);
        if (failed) sched_fail_all(e, ""); /* what raced in before submit saw the failure */
        else sched_step(e);

        pthread_mutex_lock(&e->mu);
        sched_publish_stats(e);
        if (clear) {
            e->clear_done = clear_to;
            pthread_cond_broadcast(&e->cv_done);
        }
    }
}
