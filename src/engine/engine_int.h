/* Engine internals shared by engine.c (API side: create, submit, cancel, stats) and sched.c (the
 * scheduler thread).
 *
 * Speculative decoding's part of the scheduler is in spec_sched.c (spec_sched.h).
 *
 * Locking: `mu` guards the inbox (incoming, cancel ids, stop flag), fetch_ready, failed and
 * fail_reason, n_pending and `stats`. Everything
 * else (waiting, running, the pool, the cache, every struct engine_seq once taken from the inbox)
 * belongs to the scheduler thread alone. Callbacks run without `mu` held. */
#ifndef CAIRN_ENGINE_ENGINE_INT_H
#define CAIRN_ENGINE_ENGINE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec_ctl.h"
#include "engine/stop.h"
#include "kv/kv_cache.h"
#include "kv/kv_pool.h"

struct engine_seq {
    struct engine_seq *next;   /* inbox / waiting list link */
    uint64_t id;
    engine_event_fn on_event;
    void *user;
    int32_t *tokens;           /* [cap_tokens] prompt then generated */
    int n_prompt;
    int n_tokens;              /* prompt + generated so far */
    int cap_tokens;            /* min(n_prompt + max_tokens, context_length) */
    int max_tokens;            /* 0 = until the context is full */
    int n_computed;            /* positions whose KV is in the blocks */
    int32_t *blocks;           /* block table [cap_blocks] */
    int n_blocks;
    int cap_blocks;
    int n_published;           /* leading blocks already published / matched */
    uint8_t parent[32];        /* hash of block n_published-1 (zeroes when none) */
    uint8_t salt[32];
    void *state;               /* hybrid: one of engine.state_slots while admitted (running),
                                * else NULL; state_bytes in ops.be's memory (kv/kv_state.h) */
    struct sampler sampler;
    struct stop_state stop;
    struct grammar_matcher *gm; /* constrained decoding, or NULL */
    uint32_t *gmask;           /* [(vocab + 31) / 32] the matcher's mask for this step */
    const char *error_msg;     /* static text for ENGINE_FINISH_ERROR from sampling, or NULL */
    int admitted_once;         /* cached_tokens counted */
    int cancelled;
    uint64_t order;            /* admission order (newest last) */
    int n_computed_peak;       /* most positions it ever held KV for: below it, a prefill row
                                * recomputes what a preemption dropped (engine_sched_acct) */
    int n_preempted;           /* times preempted */
    uint64_t preempt_step;     /* engine.n_steps when it was last preempted */
    struct engine_usage usage;
    double t_submit, t_first_sched, t_first_token;
    int slot;                  /* index of its logits row this step */
    struct spec_seq *spec;     /* speculation state (spec_sched.h), or NULL: never drafts */
    /* prefix restore (kv_cache.h's planned admission) */
    int planned;               /* match_limit holds this admission attempt's plan */
    int match_limit;           /* blocks the plan restores or finds on the device */
    struct kv_fetch_job *fetch; /* its blocks being read off the scheduler thread, or NULL */
};

struct engine {
    struct engine_model_ops ops;
    struct model_info info;    /* copy */
    struct engine_opts opts;
    struct kv_pool pool;
    struct kv_cache cache;
    float *logits;             /* [max_running][vocab] */
    struct model_seq *batch;   /* [max_running] */
    struct engine_seq **sched; /* [max_running] sequences in this step */
    int *chunk;                /* [max_running] tokens each processes this step */
    int *n_draft;              /* [max_running] of which draft tokens (speculative verify) */
    struct backend_sample_row *sample_rows; /* [max_running] rows the forward samples (ops.can_sample) */
    struct backend_sample_out *sample_out;  /* [max_running] their results */
    int n_logit_rows;          /* rows of `logits`: max_running + spec_extra_rows */
    int spec_extra_rows;       /* rows for draft tokens per step (0 when speculation is off) */
    struct spec_mtp *mtp;      /* MTP drafting buffers (spec_mtp.h), or NULL (mode not MTP) */
    /* Hybrid models: max_running recurrent states, allocated once in ops.be's memory (device
     * memory on a GPU, where the gdn op reads them in place; allocating once keeps a GPU's
     * cached graphs valid). A sequence takes one at admission and gives it back when it is
     * preempted or finishes: a waiting sequence needs none, since admission restores its state
     * from a snapshot or starts it afresh. Scheduler thread only. */
    void **state_slots;        /* [max_running]; [0, n_state_free) are the free ones */
    int n_state_free;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* guarded by mu */
    struct engine_seq *inbox_head, *inbox_tail;
    pthread_cond_t cv_done;    /* signalled when a cache clear request completes */
    uint64_t *cancel_ids;
    int n_cancel, cap_cancel;
    int stopping;
    int n_inbox;
    int n_waiting_seen;        /* scheduler's waiting count, published at each step */
    int fetch_ready;           /* the fetch thread finished a job since the scheduler looked */
    int failed;                /* the device stalled or failed (CAIRN_ERR_DEVICE): sticky */
    char fail_reason[256];     /* why, for engine_failed and the errors of later submits */
    uint64_t clear_req, clear_done;
    uint64_t next_id;
    struct engine_stats stats;

    /* scheduler thread only */
    uint64_t *cancel_local;    /* swapped with cancel_ids under mu */
    int cap_cancel_local;
    int n_waiting;
    struct engine_seq *wait_head, *wait_tail;
    struct engine_seq *fetch_head, *fetch_tail; /* waiting for their prefix (seq->fetch) */
    int n_fetching;
    struct engine_seq **running; /* [max_running], in admission order */
    int n_running;
    uint64_t next_order;
    uint64_t n_preemptions;
    uint64_t n_shared_blocks;
    uint64_t n_requests_done, n_prompt_tokens, n_cached_tokens, n_generated_tokens;
    uint64_t n_prefix_lookups, n_prefix_hits, n_steps;
    double decode_tok_s, prefill_tok_s;
    /* their decayed sums (tokens, seconds): a rate weighted by tokens, so a short step (the last
     * block of a restored prefix) barely moves it, and no start from 0 biases the first steps */
    double decode_w_tok, decode_w_s, prefill_w_tok, prefill_w_s;
    double decode_step_s;
    uint64_t n_decode_step_tokens;
    struct spec_cost spec_cost;  /* step-cost fit (spec_ctl.h) */
    uint64_t n_spec_drafted, n_spec_accepted, n_spec_steps, n_spec_parks, n_spec_head_rows;
    double t_plan_s, t_issue_s, t_wait_s, t_sample_s, t_detok_s, t_emit_s; /* engine_stats */
    uint64_t n_rows_device, n_rows_host;
    struct engine_sched_acct acct; /* sched_acct.c */
    uint8_t *rows_seen;        /* [n_rows_seen / 8] bitmap: row counts some step had */
    int n_rows_seen;
    double t_sched_start;      /* when the scheduler thread started (cairn_now) */
    double growth_ratio;       /* expected share of running outputs still to come (sched.c) */
    int sched_legacy;          /* CAIRN_ENGINE_SCHED=legacy: session 11's admission and preemption
                                * (no KV gate, newest victim, prefills preempt), for A/B runs */
};

/* One step's token rows for the accounting (sched_acct.c). */
struct engine_step_rows {
    int n_decode, n_verify, n_prefill;
    int n_recomputed;          /* prefill rows below their sequence's n_computed_peak */
    int64_t n_ctx;             /* KV positions its sequences span (pos0 + chunk, summed) */
};
/* Adds a step: its rows, the time before its forward, in it and after it. */
void engine_acct_step(struct engine *e, const struct engine_step_rows *r, double t_pre, double t_forward,
                      double t_post);
/* Fills elapsed and between and copies the accounting to *out (sched_publish_stats, mu held). */
void engine_acct_publish(struct engine *e, struct engine_sched_acct *out);

void *engine_sched_main(void *arg);
/* kv_fetch_done_fn for the engine's cache (ctx = the engine): wakes the scheduler. */
void engine_sched_fetch_notify(void *ctx);
void engine_seq_free(struct engine *e, struct engine_seq *s);
/* Gives s's recurrent state (if it holds one) back to engine.state_slots. */
void engine_seq_state_put(struct engine *e, struct engine_seq *s);
/* Commits a sampled token to s (tokens, usage, stop rules) and emits its TOKEN event; returns 1
 * if the sequence finished (*fin filled). sched.c; spec_sched.c calls it per verified token. */
int engine_sched_commit(struct engine *e, struct engine_seq *s, int32_t tok, enum engine_finish *fin);
/* The grammar around one sampled row of a constrained sequence (no-ops without s->gm): _mask
 * fills s->gmask for the matcher's state and points s->sampler.allowed at it (not in a lazy
 * grammar's free text); _accept advances the matcher by the sampled token. Each returns 1 when
 * the sequence finished (*fin filled: STOP for a completed grammar, ERROR with error_msg). sched.c;
 * spec_sched.c calls them per verified row. */
int engine_sched_grammar_mask(struct engine_seq *s, enum engine_finish *fin);
int engine_sched_grammar_accept(struct engine_seq *s, int32_t tok, enum engine_finish *fin);

#endif
