/* The backend interface the API layer runs requests through: the model pool, the chat
 * template, the tokenizer and the engine, behind function pointers.
 *
 * Two implementations: api/backend_real.c (model_load + engine_create + tok + tmpl) and
 * api/backend_fake.c (scripted: emits given text as tokens, so every HTTP/API behaviour is
 * testable without a model). The API layer never touches model, tok or tmpl directly.
 *
 * Threading: every function may be called from any thread. get_model may block for a long time
 * (it loads the model on first use); the API layer calls it from its worker thread, never from
 * an HTTP thread. submit's event callback runs on the backend's engine thread (see engine.h). */
#ifndef CAIRN_API_API_BACKEND_H
#define CAIRN_API_API_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/status.h"
#include "engine/engine.h"
#include "kv/tiers.h"

struct api_model_desc {
    char id[256];           /* model id: folder name, "org/name" when nested */
    int loaded;
    int context_length;     /* 0 until known */
    int64_t created;        /* unix time (folder mtime) */
};

struct api_backend {
    void *ctx;
    /* Fills up to max descriptions; returns the number of models. */
    int (*list_models)(void *ctx, struct api_model_desc *out, int max);
    /* Finds a model by id and loads it if needed (may block). *idx identifies it below.
     * CAIRN_ERR_NOT_FOUND for an unknown id; load errors otherwise. */
    int (*get_model)(void *ctx, const char *id, int *idx, struct cairn_err *err);
    /* Context length of a loaded model. */
    int (*context_length)(void *ctx, int idx);
    /* Renders the chat template. messages: OpenAI-style array ({role, content (string),
     * tool_calls, tool_call_id, reasoning_content}); tools: OpenAI-style array or NULL; kwargs:
     * extra template variables (enable_thinking ...) or NULL. *out is malloc'd (caller frees). */
    int (*render_chat)(void *ctx, int idx, json_t *messages, json_t *tools, json_t *kwargs,
                       int add_generation_prompt, char **out, struct cairn_err *err);
    /* render_chat, then tokenize with only the template's own markup recognised as control
     * tokens (message text that spells one is tokenized as text). *out and *ids malloc'd
     * (caller frees both, also on error). May be NULL: then render_chat + tokenize. */
    int (*render_chat_ids)(void *ctx, int idx, json_t *messages, json_t *tools, json_t *kwargs,
                           int add_generation_prompt, char **out, int32_t **ids, int *n_ids,
                           struct cairn_err *err);
    /* Tokenizes text (add_special: the post-processor's BOS etc.). *ids malloc'd (caller
     * frees). */
    int (*tokenize)(void *ctx, int idx, const char *text, size_t len, int add_special,
                    int32_t **ids, int *n_ids, struct cairn_err *err);
    /* Text of one token (for logprobs); returns its length, -1 if unknown. */
    int (*token_text)(void *ctx, int idx, int32_t id, char *buf, size_t cap);
    /* Fills the sampling fields a request left out (API_GIVEN_* bits in `given` are set for
     * those it gave) from the model's generation_config.json, as Hugging Face does: e.g.
     * do_sample false means greedy. May be NULL. */
    void (*sampling_defaults)(void *ctx, int idx, struct engine_sampling *s, unsigned given);
    /* Runs a generation request (engine_submit semantics and error codes). */
    int (*submit)(void *ctx, int idx, const struct engine_request *req, uint64_t *id,
                  struct cairn_err *err);
    void (*cancel)(void *ctx, int idx, uint64_t id);
    /* Stats of model idx; returns 0 if it is not loaded (st untouched). */
    int (*stats)(void *ctx, int idx, struct engine_stats *st);
    /* Drops cached KV of a tier: "device", "hot", "ssd" or "all", for every loaded model.
     * Returns the number of tiers cleared, or CAIRN_ERR_UNSUPPORTED for a tier not present. */
    int (*cache_clear)(void *ctx, const char *tier, struct cairn_err *err);
    /* Lower-tier counters of model idx (kv/tiers.h); returns 0 when it has none. May be NULL. */
    int (*tier_stats)(void *ctx, int idx, struct kv_tiers_stats *st);
    /* Cancels everything in flight (each request still gets its DONE event) and frees. */
    void (*destroy)(void *ctx);
};

/* The scripted fake backend. script: JSON file (see backend_fake.c for the format). */
int api_backend_fake_create(const char *script_path, struct api_backend *out,
                            struct cairn_err *err);
/* Same, from a JSON string (tests). */
int api_backend_fake_create_str(const char *script_json, struct api_backend *out,
                                struct cairn_err *err);

/* The real backend. */
struct api_real_opts {
    const char *model_dir;        /* each subfolder (or org/name) with config.json is a model */
    const char *const *models;    /* explicit model folders (--model, repeatable) */
    int n_models;
    uint64_t kv_bytes;            /* device KV budget per model; 0 = engine default */
    int max_batch_tokens;         /* 0 = engine default */
    int max_running;              /* 0 = engine default */
    int max_waiting;              /* 0 = engine default */
    /* Lower KV tiers (hot RAM, SSD), set up by `cairn serve` when enabled: passed to every
     * engine, and asked to clear "hot" / "ssd" on POST /api/cache/clear. tier_clear returns
     * CAIRN_OK, or CAIRN_ERR_UNSUPPORTED for a tier that is not enabled. All may be NULL. */
    struct kv_tier_ops tiers;
    int (*tier_clear)(void *tier_ctx, const char *tier, struct cairn_err *err);
    void *tier_ctx;
    /* Per-model lower tiers (kv/tiers.h), what `cairn serve` uses: when set, every model opens
     * its own kv_tiers at load with these settings (its signature filled from the model and the
     * engine options; tiers_opts->sig is ignored), so models sharing --ssd-cache-dir never see
     * each other's blocks. Budgets apply per model. Takes precedence over tiers/tier_clear. */
    const struct kv_tiers_opts *tiers_opts;
};
int api_backend_real_create(const struct api_real_opts *opts, struct api_backend *out,
                            struct cairn_err *err);

#endif
