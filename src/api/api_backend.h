/* The backend interface the API layer runs requests through: the model pool, the chat
 * template, the tokenizer and the engine, behind function pointers.
 *
 * Two implementations: api/backend_real.c (model_load + engine_create + tok + tmpl) and
 * api/backend_fake.c (scripted: emits given text as tokens, so every HTTP/API behaviour is
 * testable without a model). The API layer never touches model, tok or tmpl directly.
 *
 * Threading: every function may be called from any thread. get_model may block for a long time
 * (it waits for the model's load on first use); the API layer calls it from the call's own
 * preparing thread, never from an HTTP thread, so a load delays only requests for that model.
 * submit never blocks (a request waiting for memory is parked by the backend); its event
 * callback runs on a backend thread (the engine's, see engine.h). */
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
    int failed;             /* its device stalled or failed; reloads on the next request */
    char failure[300];      /* why, when failed */
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
    /* The model's vocabulary as byte strings, for constrained decoding (built on first use, owned
     * by the backend, valid until the model is unloaded, which waits for its requests); NULL with
     * err set when it can't be built. May be NULL: the backend can't constrain. */
    const struct grammar_vocab *(*grammar_vocab)(void *ctx, int idx, struct cairn_err *err);
    /* Stats of model idx; returns 0 if it is not loaded (st untouched). */
    int (*stats)(void *ctx, int idx, struct engine_stats *st);
    /* Drops cached KV of a tier: "device", "hot", "ssd" or "all", for every loaded model.
     * Returns the number of tiers cleared, or CAIRN_ERR_UNSUPPORTED for a tier not present. */
    int (*cache_clear)(void *ctx, const char *tier, struct cairn_err *err);
    /* Lower-tier counters of model idx (kv/tiers.h); returns 0 when it has none. May be NULL. */
    int (*tier_stats)(void *ctx, int idx, struct kv_tiers_stats *st);
    /* Cancels everything in flight (each request still gets its DONE event) and frees. */
    void (*destroy)(void *ctx);
    /* Drops the reference get_model took: a model is never unloaded between get_model and
     * put_model, nor while it has requests. May be NULL. */
    void (*put_model)(void *ctx, int idx);
    /* Like get_model for a model that is loaded now (returns 1 with a reference for put_model);
     * returns 0, and never starts a load, otherwise. May be NULL (get_model never loads). */
    int (*peek_model)(void *ctx, const char *id, int *idx);
    /* The memory guard's budget, holders and state for /api/status (new reference). May be
     * NULL. */
    json_t *(*memory_json)(void *ctx);
    /* {"tensor_parallel": N, "devices": [names]} for /api/status: the devices models run on, one
     * per tensor-parallel rank (new reference). May be NULL. */
    json_t *(*devices_json)(void *ctx);
    /* Admin API (api/api_admin.c); NULL: those routes answer 501. Never block on a load.
     * admin_models: array of model states (new reference). admin_model: action "get", "load",
     * "unload", "pin" or "unpin" on one model (id or alias): *out is its state afterwards;
     * CAIRN_ERR_NOT_FOUND, CAIRN_ERR_BUSY (unloading a busy or pinned model). admin_settings_get:
     * {"path", "settings"}. admin_settings_put: merges a patch, validated (field names the bad
     * key), saved; *out says what applied at once and what waits for the next load. */
    json_t *(*admin_models)(void *ctx);
    int (*admin_model)(void *ctx, const char *id, const char *action, json_t **out,
                       struct cairn_err *err);
    json_t *(*admin_settings_get)(void *ctx);
    int (*admin_settings_put)(void *ctx, json_t *patch, json_t **out, char *field, size_t cap,
                              struct cairn_err *err);
    /* Looks at the model folder again (new folders appear, removed unloaded ones go); force 0:
     * only when the last look is a few seconds old. *out: {"added", "removed", "models"} (new
     * reference). May be NULL. */
    int (*admin_rescan)(void *ctx, int force, json_t **out, struct cairn_err *err);
};

/* The scripted fake backend. script: JSON file (see backend_fake.c for the format). */
int api_backend_fake_create(const char *script_path, struct api_backend *out,
                            struct cairn_err *err);
/* Same, from a JSON string (tests). */
int api_backend_fake_create_str(const char *script_json, struct api_backend *out,
                                struct cairn_err *err);

/* The real backend: the model pool (api/pool.h) with its memory guard and settings. */
struct api_real_opts {
    const char *model_dir;        /* each subfolder (or org/name) with config.json is a model */
    const char *const *models;    /* explicit model folders (--model, repeatable) */
    int n_models;
    uint64_t kv_bytes;            /* device KV budget per model (--kv-cache-size); 0 = on a device,
                                   * what its budget has left at load (api/pool.h); on the CPU,
                                   * the engine default */
    int max_batch_tokens;         /* 0 = engine default */
    int max_running;              /* 0 = engine default */
    int max_waiting;              /* 0 = engine default */
    int speculative;              /* enum engine_spec_mode; 0 = engine default (off) */
    int spec_ngram_min, spec_k_max; /* 0 = engine defaults */
    double spec_cost_slope;         /* 0 = measured (engine.h) */
    double spec_draft_cost;         /* 0 = prior, then measured (engine.h) */
    /* Per-model lower tiers (kv/tiers.h), what `cairn serve` uses: when set, every model opens
     * its own kv_tiers at load with these settings (its signature filled from the model and the
     * engine options; tiers_opts->sig is ignored), so models sharing --ssd-cache-dir never see
     * each other's blocks. Budgets apply per model. A model's `tiers: false` setting opts out. */
    const struct kv_tiers_opts *tiers_opts;
    struct backend *device;       /* where models are loaded (tensor/backend.h); not owned */
    struct backend_tp *tp;        /* --tensor-parallel: every model is loaded sharded over this
                                   * group (model/model_group.h) and `device` is its rank 0; the
                                   * device budget is the ranks' sum. NULL: one device. Not owned */
    uint64_t max_process_memory;  /* host budget of the guard; 0 = engine_guard_default_limit */
    uint64_t max_device_memory;   /* device budget (a GPU backend); 0 = max_device_memory_pct of
                                   * the device's total, or engine_guard_default_device_limit */
    double max_device_memory_pct;
    double step_timeout_s;        /* --step-timeout: the device's wait bound (backend.h); 0 = the
                                   * settings' global.step_timeout, else 30 s */
    int device_budget;            /* tests: a device budget even on the CPU (the seam; needs
                                   * max_device_memory) */
    int max_loaded_models;        /* 0 = no limit */
    double ttl_s;                 /* --ttl (seconds, 0 = never): wins over the settings file */
    int has_ttl;
    const char *settings_path;    /* --settings; NULL = $CAIRN_HOME or ~/.cairn */
    double memory_wait_s;         /* how long loads and requests wait for memory; 0 = 60 */
};
int api_backend_real_create(const struct api_real_opts *opts, struct api_backend *out,
                            struct cairn_err *err);

#endif
