/* The engine: continuous batching of generation requests for one model.
 *
 * One scheduler thread per engine owns the model, the KV pool and the prefix cache. Other
 * threads (the HTTP layer) talk to it only through engine_submit / engine_cancel (a locked
 * queue) and receive results through the request's event callback.
 *
 * Events: for every generated token an ENGINE_EVENT_TOKEN (with the text it released, after
 * stop-string hold-back), then exactly one ENGINE_EVENT_DONE, after which the engine never
 * touches `user` again. Callbacks run on the scheduler thread: they must not block (copy and
 * signal); they may call engine_cancel (but not engine_cache_clear or engine_destroy, which wait
 * for the scheduler thread).
 *
 * The token that ends generation (EOS or a stop id) also gets a TOKEN event, with no text of its
 * own (text held back for a possible stop string is released with it), and counts in
 * completion_tokens. When a stop string matches, that token's event carries the text before the
 * match and nothing after. The detokenizer stream of a request is created in engine_submit (on
 * the caller's thread) and then fed only on the scheduler thread. */
#ifndef CAIRN_ENGINE_ENGINE_H
#define CAIRN_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "grammar/grammar.h"
#include "kv/kv_tier.h"
#include "model/model.h"
#include "tensor/tensor.h"

struct kv_pool;

struct engine;

/* Detokenizer the engine uses to turn tokens into text (for stop strings and events). The
 * server plugs in the tok room's streaming detokenizer; tests can plug in anything. */
struct engine_detok {
    void *ctx;
    void *(*stream_new)(void *ctx);
    /* Feeds one id; sets *text and *len to the newly complete text (valid until the next call). */
    int (*stream_feed)(void *stream, int32_t id, const char **text, size_t *len);
    /* Flushes what is pending at the end. */
    int (*stream_flush)(void *stream, const char **text, size_t *len);
    void (*stream_free)(void *stream);
};

/* Speculative decoding (engine/spec_*.h): drafts verified k + 1 tokens at a time in the same
 * batched forward, parked per request when they stop paying. Greedy output is identical with and
 * without it, and so is seeded sampled output (spec_verify.h says why). */
enum engine_spec_mode {
    ENGINE_SPEC_DEFAULT = 0, /* engine_opts: OFF; engine_request: the engine's mode */
    ENGINE_SPEC_OFF,
    ENGINE_SPEC_NGRAM,       /* prompt lookup over prompt + output (spec_ngram.h) */
    ENGINE_SPEC_AUTO,        /* the best drafter the model has: its MTP head if it has one, else
                              * the n-gram one (engine_create resolves it to MTP or NGRAM) */
    ENGINE_SPEC_MTP,         /* the model's multi-token-prediction head (spec_mtp.h); engine_create
                              * fails (CAIRN_ERR_INVALID) on a model without one */
};
/* "off", "ngram", "auto", "mtp" -> the mode; -1 if none of those. */
int engine_spec_mode_parse(const char *s);
const char *engine_spec_mode_name(enum engine_spec_mode m);

/* A drafter besides the built-in ones (tests, experiments, later draft models): writes up to
 * max_k tokens continuing tokens[0, n_tokens) to out and returns how many. Called on the
 * scheduler thread; must not block. */
struct engine_drafter {
    void *ctx;
    int (*draft)(void *ctx, const int32_t *tokens, int n_tokens, int max_k, int32_t *out);
};

struct engine_opts {
    int max_batch_tokens;   /* token budget per step (decodes + prefill chunks); default 512 */
    int max_running;        /* concurrent sequences; default 16 (at most max_batch_tokens) */
    int max_waiting;        /* queued requests before engine_submit says BUSY; default 256 */
    int block_size;         /* tokens per KV block; default ENGINE_DEFAULT_BLOCK_SIZE */
    uint64_t kv_bytes;      /* device-tier KV budget in bytes (K+V); default 1 GiB */
    enum dtype kv_dtype;    /* DTYPE_BF16 (default) or DTYPE_F32 */
    int context_length;     /* max prompt + completion; default model max_position */
    struct engine_detok detok;
    struct kv_tier_ops tiers; /* lower tiers (hot RAM, SSD); all NULL = none */
    uint64_t snapshot_bytes;  /* hybrid models: budget for recurrent-state snapshots kept with
                               * cached blocks (least recently used dropped first); default
                               * kv_bytes / 2, never fewer than 2 * max_running snapshots */
    enum engine_spec_mode speculative; /* default OFF: no request speculates, whatever it asks */
    int spec_k_max;           /* largest draft per sequence and step; default 8, at most 16 */
    int spec_ngram_min;       /* n-gram drafter's match lengths; defaults 2 and 8 */
    int spec_ngram_max;
    struct engine_drafter drafter; /* draft.draft set: used instead of the mode's drafter (not in
                               * mode MTP) */
    struct engine_drafter mtp_script; /* tests, mode MTP: called after the head drafted out[0, n)
                               * with max_k = n; returns how many of out (as it left them) to use,
                               * so a test can script acceptance over a random head's drafts */
    double spec_cost_slope;   /* > 0: cost of one more token in a step relative to a one-token
                               * step, fixed (tests: plans then depend on acceptance alone);
                               * 0 = measured from the engine's steps (spec_ctl.h) */
    double spec_draft_cost;   /* > 0: cost of one MTP head step (per drafted token) relative to a
                               * one-token step, fixed; 0 (default): the head's share of the layers
                               * until head steps are timed (spec_ctl.h) */
};
/* Block size, by measurement (`cairn bench-engine --attn-sweep 1024,4096`, Qwen3-0.6B attention
 * shape, bf16 KV, AVX-512, 2 threads): the decode attention kernel reads one block at a time with
 * one online-softmax rescale per block, and its time did not depend on the block size from 16 to
 * 256 beyond the run-to-run noise of the shared test machine (about +-20%, no consistent order;
 * e.g. context 4096: 7.5 / 7.1 / 7.8 / 8.1 / 6.3 ms per layer for 16 / 32 / 64 / 128 / 256). So
 * the choice is set by the cache side: reuse is rounded down to a block (at most bs - 1 tokens
 * recomputed per hit: 64 costs < 1% of a 10k-token agent prompt), and every block costs a SHA-256,
 * an index entry, a lower-tier lookup and, in the SSD tier, one file (write + fsync + rename): 64
 * has 4x fewer of those than 16. 128+ gains nothing measurable and doubles the rounding loss and
 * the partial-block slack of every running sequence. */
#define ENGINE_DEFAULT_BLOCK_SIZE 64

/* Fills defaults for every zero field. kv_dtype: DTYPE_F32 is 0, so this turns it into
 * DTYPE_BF16; set DTYPE_F32 after calling it if you want f32 KV. engine_create applies the other
 * defaults itself but keeps kv_dtype as given. */
void engine_opts_default(struct engine_opts *o);

struct engine_logit_bias {
    int32_t id;
    float bias;
};

struct engine_sampling {
    float temperature;            /* 0 = greedy */
    int top_k;                    /* 0 = off */
    float top_p;                  /* 1 = off */
    float min_p;                  /* 0 = off */
    uint64_t seed;
    int has_seed;                 /* reproducible per request, independent of batching */
    float repetition_penalty;     /* 1 (or 0) = off */
    int repetition_context_size;  /* tokens looked back; 0 = 20 when the penalty is set */
    float presence_penalty;
    float frequency_penalty;
    const struct engine_logit_bias *logit_bias; /* copied by engine_submit */
    int n_logit_bias;
    int logprobs;                 /* report the sampled token's logprob */
    int top_logprobs;             /* 0..20 alternatives per token */
};

/* Sampling defaults: temperature 1, top_p 1, everything else off. */
void engine_sampling_default(struct engine_sampling *s);

enum engine_event_kind {
    ENGINE_EVENT_TOKEN = 0,
    ENGINE_EVENT_DONE,
};

enum engine_finish {
    ENGINE_FINISH_STOP = 0,   /* EOS, stop id or stop string */
    ENGINE_FINISH_LENGTH,     /* max_tokens or context length */
    ENGINE_FINISH_CANCELLED,
    ENGINE_FINISH_ERROR,
};

struct engine_usage {
    int prompt_tokens;
    int cached_tokens;        /* prompt tokens served from the prefix cache (any tier) */
    int completion_tokens;
    double queue_s;           /* submit -> first scheduled */
    double prefill_s;         /* first scheduled -> first token */
    double decode_s;          /* first token -> done */
    int spec_drafted;         /* speculative draft tokens verified for this request */
    int spec_accepted;        /* of which accepted (each one a forward step saved) */
};

struct engine_event {
    enum engine_event_kind kind;
    uint64_t request_id;
    /* ENGINE_EVENT_TOKEN */
    int32_t token;
    const char *text;         /* text released with this token (may be empty) */
    size_t text_len;
    float logprob;            /* when sampling.logprobs */
    int n_top;
    const int32_t *top_ids;   /* [n_top], by decreasing logprob */
    const float *top_logprobs;
    /* both kinds: usage so far. prompt_tokens and cached_tokens (the prefix-cache lookup)
     * are final from the first TOKEN event on, so an API can report them before the end. */
    struct engine_usage usage;
    /* ENGINE_EVENT_DONE */
    enum engine_finish finish;
    const char *stop_text;    /* matched stop string, or NULL */
    int32_t stop_token;       /* EOS/stop id that ended it, or -1 */
    const char *error;        /* ENGINE_FINISH_ERROR: message */
    int error_code;           /* ENGINE_FINISH_ERROR: a cairn status, 0 if none in particular
                               * (CAIRN_ERR_NOMEM: the memory guard said no, HTTP 507;
                               * CAIRN_ERR_DEVICE: the device stalled or failed, HTTP 503) */
};

typedef void (*engine_event_fn)(void *user, const struct engine_event *ev);

struct engine_request {
    const int32_t *prompt;    /* copied by engine_submit */
    int n_prompt;
    struct engine_sampling sampling;
    int max_tokens;           /* 0 = until the context is full */
    const int32_t *stop_ids;  /* besides the model's EOS ids; copied */
    int n_stop_ids;
    int ignore_eos;
    const char *const *stop;  /* stop strings, excluded from the output; copied */
    int n_stop;
    uint8_t cache_salt[32];   /* mixed into block hashes (zeroes = none) */
    enum engine_spec_mode speculative; /* DEFAULT = the engine's; OFF opts out; NGRAM / AUTO /
                               * MTP opt in (only where the engine's mode is not OFF; with a
                               * grammar too, see spec_sched.h); AUTO = the engine's drafter; NGRAM
                               * drafts by prompt lookup on an MTP engine too; MTP needs an
                               * engine in mode MTP (else CAIRN_ERR_INVALID) */
    /* Constrained decoding (NULL = none): before each sampling step the tokens the grammar does
     * not allow get -inf logits, after it the grammar advances by the sampled token. The engine
     * retains the grammar (the caller keeps its own reference). grammar_vocab is the model's
     * vocabulary as byte strings (ids beyond it are never allowed); it must outlive the request.
     * The model's EOS ids are allowed only where the grammar accepts the output. */
    struct grammar *grammar;
    const struct grammar_vocab *grammar_vocab;
    engine_event_fn on_event;
    void *user;
};

/* Creates the engine and starts its scheduler thread. The engine does not own the model. */
int engine_create(struct model *m, const struct engine_opts *opts, struct engine **out,
                  struct cairn_err *err);
/* The same over a tensor-parallel model group (model/model_group.h): one engine, one scheduler
 * and prefix cache; the KV pool and states on the group's backend (every rank's part under the
 * same block ids). Lower tiers (opts->tiers) and the MTP head are refused under it
 * (CAIRN_ERR_UNSUPPORTED, saying why). The engine does not own the group. */
struct model_group;
int engine_create_group(struct model_group *g, const struct engine_opts *opts, struct engine **out,
                        struct cairn_err *err);

/* What the engine needs from a model, as functions (engine_create fills them from model.h).
 * Lets tests and benchmarks drive the scheduler with a synthetic forward, and leaves room for
 * other executors (draft models, remote devices). All called on the scheduler thread except
 * info, which is also called by engine_create / engine_submit. */
struct engine_model_ops {
    void *ctx;
    const struct model_info *(*info)(void *ctx);
    int (*reserve)(void *ctx, int max_tokens, struct cairn_err *err);  /* may be NULL */
    int (*forward)(void *ctx, struct kv_pool *kv, const struct model_seq *seqs, int n_seqs,
                   struct cairn_err *err);
    void (*state_init)(void *ctx, void *state);                       /* may be NULL: zeroes */
    struct backend *be;  /* where the KV pool lives (the model's backend); NULL: host memory */
    /* The model's MTP head (model_mtp_forward); NULL: none (ENGINE_SPEC_MTP unavailable). */
    int (*mtp_forward)(void *ctx, struct kv_pool *kv, const struct model_mtp_seq *seqs, int n_seqs,
                       struct cairn_err *err);
    /* 1: forward samples a row itself when its model_seq.sample is set (model_forward does on a
     * backend with the sample op): the scheduler then asks it to for every row that can be
     * sampled there (sampler_row_eligible; one logit row, no grammar), and samples the others
     * from their logits. 0: every row's logits come back. */
    int can_sample;
    /* Host time of the last forward, split (model_last_step_times); may be NULL. */
    void (*step_times)(void *ctx, double *issue_s, double *wait_s);
};
int engine_create_ops(const struct engine_model_ops *ops, const struct engine_opts *opts,
                      struct engine **out, struct cairn_err *err);
/* Cancels everything in flight (each gets its DONE event), stops the thread, frees. */
void engine_destroy(struct engine *e);

/* Queues a request. Errors: CAIRN_ERR_INVALID (bad parameter, names it), CAIRN_ERR_LIMIT (prompt
 * longer than the context), CAIRN_ERR_NOMEM (could never fit in the KV budget: HTTP 507),
 * CAIRN_ERR_BUSY (queue full: HTTP 429), CAIRN_ERR_DEVICE (the engine failed: HTTP 503). On success *id identifies it; no event has run yet. */
int engine_submit(struct engine *e, const struct engine_request *req, uint64_t *id,
                  struct cairn_err *err);
/* Cancels a request; its blocks are released at the next step and it gets DONE (CANCELLED).
 * Unknown or finished ids are ignored. Thread-safe. */
void engine_cancel(struct engine *e, uint64_t id);

/* The scheduler's accounting (sched_acct.c): every step and the time between steps, so that a
 * run's wall time is covered whole. A step's token rows are what its forward computed (decodes,
 * verified drafts, prefill chunks, recomputation after preemption alike). */
enum engine_step_kind {
    ENGINE_STEP_DECODE = 0, /* decode (and verify) rows only */
    ENGINE_STEP_PREFILL,    /* prefill chunks only */
    ENGINE_STEP_MIXED,      /* both */
    ENGINE_STEP_N_KINDS
};
#define ENGINE_STEP_ROW_BUCKETS 14 /* steps by token rows: [1], [2, 3], [4, 7] ... [8192, inf) */
struct engine_step_sum {
    uint64_t n_steps;
    uint64_t n_rows;          /* token rows computed */
    uint64_t n_ctx;           /* KV positions the steps' sequences spanned (what attention reads) */
    double forward_s;         /* in ops.forward */
    double wall_s;            /* the whole step: packing, the forward, sampling and events */
};
struct engine_sched_acct {
    /* seconds of the scheduler thread since it started: elapsed = idle + between + steps */
    double t_elapsed_s;
    double t_idle_s;          /* asleep: nothing running, queued or to fetch */
    double t_between_s;       /* awake outside steps: the inbox, cancels, stats, the lock, passes
                               * that scheduled nothing */
    double t_steps_s;         /* steps: t_pre_s + the forward (t_issue_s + t_wait_s) + t_post_s */
    double t_pre_s;           /* before the forward: packing, admissions, the batch, row set-up */
    double t_post_s;          /* after it: sampling, detok, stop rules, events, publishing */
    struct engine_step_sum kind[ENGINE_STEP_N_KINDS];
    struct engine_step_sum by_rows[ENGINE_STEP_ROW_BUCKETS];
    struct engine_step_sum new_rows; /* steps whose row count no step had before: a backend that
                               * plans or tunes per shape (cuBLASLt per GEMM size) pays there */
    uint64_t n_rows_decode;   /* decode rows (one token of a running sequence) */
    uint64_t n_rows_verify;   /* rows of speculative verifies (1 + drafts each) */
    uint64_t n_rows_prefill;  /* prefill-chunk rows, recomputation included */
    uint64_t n_rows_recomputed; /* of which positions a preemption had dropped (computed again) */
    uint64_t n_empty_passes;  /* passes with work that scheduled nothing (memory, fetches) */
    uint64_t n_preempted_blocks; /* blocks released by preemptions */
    uint64_t n_readmissions;  /* admissions of a preempted sequence */
    uint64_t n_readmit_same_step; /* ... in the step that preempted it (thrash) */
    uint64_t n_repreemptions; /* preemptions of a sequence preempted before (thrash) */
    uint64_t n_admit_deferred; /* passes whose queue head waited for KV room (the admission gate) */
    double growth_ratio;      /* the gate's expected share of running outputs still to come */
};
/* The bucket of a step of `rows` token rows in engine_sched_acct.by_rows; its row range. */
int engine_step_row_bucket(int rows);
void engine_step_row_range(int bucket, int *lo, int *hi);

struct engine_stats {
    int n_running;
    int n_waiting;
    int n_blocks_total;
    int n_blocks_used;        /* referenced by running sequences */
    int n_blocks_cached;      /* unreferenced but holding a cached prefix (evictable) */
    int n_blocks_free;
    uint64_t n_requests_done;
    uint64_t n_prompt_tokens;
    uint64_t n_cached_tokens; /* prompt tokens served from cache */
    uint64_t n_generated_tokens;
    uint64_t n_preemptions;
    uint64_t n_prefix_lookups;
    uint64_t n_prefix_hits;
    double decode_tok_s;      /* recent decode throughput */
    double prefill_tok_s;     /* recent prefill throughput */
    /* additions (engine helper) */
    int block_size;
    uint64_t n_steps;
    uint64_t n_evictions;     /* cached blocks evicted from the device tier */
    uint64_t n_promotions;    /* blocks brought back from lower tiers */
    uint64_t n_shared_blocks; /* full blocks switched to an identical published twin */
    int n_snapshots;          /* recurrent-state snapshots held (hybrid models) */
    double decode_step_s;     /* total time of decode-only steps (forward + sampling) */
    uint64_t n_decode_step_tokens; /* tokens produced by those steps: their ratio is the
                                    * aggregate decode throughput */
    /* speculative decoding (all zero when off) */
    uint64_t n_spec_drafted;  /* draft tokens verified */
    uint64_t n_spec_accepted; /* of which accepted */
    uint64_t n_spec_steps;    /* sequence-steps that verified a draft */
    uint64_t n_spec_parks;    /* times a request parked (its drafts stopped paying) */
    uint64_t n_spec_head_rows; /* positions the MTP head ran (catch-up and chained steps) */
    double spec_cost_slope;   /* measured cost of one more token in a step, relative to a
                               * one-token step (spec_ctl.h) */
    /* prefix restore from the lower tiers (kv_cache.h, kv_restore.h) */
    int n_fetching;           /* requests waiting for their prefix to be read (in n_waiting) */
    uint64_t n_fetches;       /* fetch jobs started (prefix hits on disk) */
    uint64_t n_fetches_cut;   /* of which cut short: the disk proved slower than recomputing */
    uint64_t n_fetched_blocks; /* blocks installed from them */
    uint64_t n_plans_restore; /* prefix hits in the tiers restored whole */
    uint64_t n_plans_recompute; /* prefix hits of which some blocks were recomputed instead,
                               * because that was estimated faster */
    uint64_t n_blocks_recomputed; /* tier blocks those left to recompute */
    double tier_fast_read_bps; /* measured: RAM-tier copies into the KV pool, bytes/s */
    double tier_slow_read_bps; /* measured: disk reads of prefix fetches, bytes/s */
    /* host cost by phase, seconds summed over all steps (the scheduler thread's time) */
    double t_plan_s;          /* packing the step: decodes, prefill chunks, admissions, batch */
    double t_issue_s;         /* forward, until the first result was asked (staging, launches) */
    double t_wait_s;          /* forward, the rest: the device finishing, copies, device sampling */
    double t_sample_s;        /* host sampling (rows not sampled on the device) and row set-up */
    double t_detok_s;         /* detokenizer and stop rules of each token */
    double t_emit_s;          /* TOKEN/DONE callbacks (the API's side), block publishing */
    uint64_t n_rows_device;   /* rows sampled by the backend */
    uint64_t n_rows_host;     /* rows sampled on the host */
    struct engine_sched_acct acct; /* where the scheduler thread's time went, per step */
};
void engine_get_stats(struct engine *e, struct engine_stats *st);
/* 1 once a step failed with CAIRN_ERR_DEVICE (the device stalled past the backend's step timeout
 * or failed for good), with the reason in reason[n] (may be NULL). From then on the engine fails
 * every running, queued and new request (ENGINE_FINISH_ERROR, error_code CAIRN_ERR_DEVICE;
 * engine_submit: CAIRN_ERR_DEVICE) and steps no more: destroy it and load the model again. */
int engine_failed(struct engine *e, char *reason, size_t n);

/* Drops every cached (unreferenced) block of the device tier, passing them to tiers.on_evict. */
void engine_cache_clear(struct engine *e);

const struct model_info *engine_model_info(const struct engine *e);

#endif
