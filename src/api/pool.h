/* The model pool behind the real backend (api/backend_real.c): which models exist, which are
 * loaded, memory admission through the guard (engine/guard.h), and every engine request.
 * Internal to the API room.
 *
 * DESIGN
 * - Models are found at start (--model-dir subfolders with config.json and tokenizer.json, or
 *   one level of org folders; --model folders) and by pool_rescan (new folders appear, removed
 *   unloaded ones are marked `gone`: hidden, never loaded; a slot is never freed or moved, so an
 *   index stays valid for the pool's life). Each has a state: unloaded -> loading ->
 *   loaded -> unloading -> unloaded. Loads and unloads run on the pool's own thread, one at a
 *   time, never on an API or HTTP thread: pool_get waits (on its caller's thread) for the load
 *   of its model only, so concurrent first requests wait for one load and requests to loaded
 *   models never wait for it.
 * - Admission: a load reserves its weights (file bytes), KV pool, recurrent-state snapshots, hot
 *   tier and workspaces from the guard first; the hold is corrected to what was measured after
 *   the load. On a device backend (a GPU) there are two budgets: the host guard holds the mapped
 *   weight files and the hot tier, the device guard (--max-device-memory) the uploaded weights,
 *   KV pool, snapshots and workspaces; a load must fit both, and evicts for the one it misses.
 *   Without --kv-cache-size the KV pool on a device is sized at admission from what the device
 *   budget has left after the model's weights, workspaces and snapshots (pool_size_device_kv):
 *   when that is less than a full context an idle model is evicted first (if any); the pool is
 *   at least one block per running sequence, below that the load fails like any shortfall. When it does not fit (or --max-loaded-models is reached) the least recently used
 *   idle model is unloaded first; a model with running, queued or parked requests, or a user
 *   between pool_get and pool_put, is never unloaded, nor a pinned one. If nothing can be
 *   unloaded but busy models or requests may free memory, the load waits (up to memory_wait_s);
 *   otherwise it fails with CAIRN_ERR_NOMEM (507) and the numbers.
 * - Requests: pool_submit reserves the request's state and buffers. When they do not fit and
 *   waiting could help, the request is parked (no thread waits): it starts when memory frees, or
 *   ends after memory_wait_s with ENGINE_FINISH_ERROR and error_code CAIRN_ERR_NOMEM. When
 *   waiting cannot help it fails at once with CAIRN_ERR_NOMEM and the numbers.
 * - TTL: an idle model whose ttl (settings, or --ttl) has passed since its last use is unloaded.
 * - Failure (the stall watchdog): a loaded model whose engine failed (engine_failed: a step
 *   passed --step-timeout or the device faulted; its requests already ended with 503s) is
 *   unloaded by the pool thread once its last request is gone, pinned or not, and shows as
 *   "failed" with the reason (pool_model_failure) until the next load: the next request to it
 *   (or an admin load) loads it again, so a client's retry recovers without an operator.
 *
 * Locking: pool->mu guards the model states, counters, settings and the request list; lock order
 * call->mu (API) -> pool->mu -> engine->mu (engine_submit / engine_cancel) and the guard's mutex.
 * Engine callbacks take pool->mu but call the API's callback without it. engine_destroy is never
 * called with pool->mu held. A loaded model's engine/tok/tmpl pointers are read without the lock
 * by whoever holds a user reference (pool_get) or an admitted request of that model. */
#ifndef CAIRN_API_POOL_H
#define CAIRN_API_POOL_H

#include <pthread.h>
#include <stdint.h>

#include <jansson.h>

#include "api/api_backend.h"
#include "engine/guard.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tmpl/tmpl.h"
#include "tok/tok.h"

enum pool_state { POOL_UNLOADED = 0, POOL_LOADING, POOL_LOADED, POOL_UNLOADING };

#define POOL_MAX_MODELS 256      /* slots (rescans reuse the slot of a model id) */

struct pool_model {
    char id[256];
    char dir[1024];
    int64_t created;             /* folder mtime */
    /* under pool->mu */
    int gone;                    /* its folder went away while unloaded (rescan): hidden */
    enum pool_state state;
    const char *phase;           /* while loading: "waiting for memory", "weights", ... */
    double t_state;              /* when the state last changed */
    int want_load;               /* queued for the pool thread */
    int want_unload;             /* admin asked: the pool thread unloads it if idle */
    uint64_t want_order;         /* FIFO among queued loads */
    char load_error[600];        /* the last failed load */
    int load_error_code;
    uint64_t n_load_failures;    /* waiters see a new failure */
    char failure[300];           /* why the model failed (its device stalled or faulted: the
                                  * engine's CAIRN_ERR_DEVICE); "" = not failed. Set when the pool
                                  * thread unloads the failed engine, cleared by the next load */
    uint64_t n_failures;         /* such failures so far */
    int n_users;                 /* between pool_get and pool_put */
    int n_active;                /* requests admitted: parked, queued or running */
    double last_used;
    uint64_t n_loads;
    struct engine_guard_hold hold;
    struct engine_guard_hold dhold; /* on pool->dguard (device backends) */
    struct model_load_progress progress; /* bytes of weights prepared by the load (atomics) */
    /* set by the pool thread while loading; constant while loaded */
    struct model *m;             /* NULL under tensor parallel: grp */
    struct model_group *grp;     /* api_real_opts.tp: the model sharded over it, else NULL */
    struct engine *e;
    struct kv_tiers *tiers;
    struct tok *tok;
    struct tmpl *tmpl;           /* NULL: no chat template (completions only) */
    char *bos, *eos;
    int context_length;
    uint64_t mapped_charged;     /* bytes charged to CAIRN_MEM_MAPPED */
    uint64_t kv_bytes_device;    /* KV pool sized from the device budget at admission (no
                                  * --kv-cache-size on a device); 0 = not sized */
    double load_s;
    struct grammar_vocab *gvocab; /* token byte strings for constrained decoding, built on the
                                   * first constrained request (under pool->gvocab_mu); freed
                                   * with the model */
};

struct pool_req;

struct pool {
    struct api_real_opts opts;
    struct engine_guard *guard;  /* host memory */
    struct engine_guard *dguard; /* device memory: NULL on the CPU */
    pthread_mutex_t mu;
    pthread_mutex_t gvocab_mu;   /* guards every model's lazy gvocab build (rare: once a load) */
    pthread_cond_t cv;           /* model state changes (pool_get waits on it) */
    pthread_cond_t cv_work;      /* work for the pool thread */
    struct pool_model *models;   /* [POOL_MAX_MODELS], never moved */
    int n_models;                /* slots in use (grows only; read without the lock by lists) */
    double t_rescan;             /* last pool_rescan (under mu) */
    struct pool_req *reqs;       /* every admitted request (parked ones too) */
    int n_parked;
    uint64_t next_req_id;
    uint64_t next_order;
    uint64_t n_parked_total, n_rejected_507, n_evictions, n_ttl_unloads;
    json_t *settings;            /* validated document (api/settings.h) */
    char settings_path[1024];
    int settings_ok;             /* settings_path resolved */
    pthread_t thread;
    int thread_started;
    int stopping;
};

int pool_create(const struct api_real_opts *opts, struct pool **out, struct cairn_err *err);
/* Cancels everything (each request gets DONE), unloads every model, frees. */
void pool_destroy(struct pool *p);

/* Looks at --model-dir again: adds new model folders, marks removed unloaded ones gone (and
 * back when they return). force 0: only if the last rescan is min_interval_s old. *added and
 * *removed (may be NULL) count what changed. Takes pool->mu. */
int pool_rescan(struct pool *p, int force, double min_interval_s, int *added, int *removed);
/* A model that lists (not gone). Under pool->mu or racy-but-harmless for a listing. */
int pool_visible(struct pool *p, int idx);

/* Index of a model by id or alias, -1 if none (takes pool->mu). */
int pool_find(struct pool *p, const char *id);
/* Loads model idx if needed and takes a user reference; waits on the caller's thread. */
int pool_get(struct pool *p, int idx, struct cairn_err *err);
void pool_put(struct pool *p, int idx);
/* Asks for a load without waiting (admin). */
int pool_load_async(struct pool *p, int idx, struct cairn_err *err);
/* Asks the pool thread to unload an idle, unpinned model (admin; does not wait).
 * CAIRN_ERR_BUSY when it has requests or is pinned. */
int pool_unload(struct pool *p, int idx, struct cairn_err *err);
/* 1 if model idx failed (see Failure in the DESIGN note), with the reason in why[n]. Under
 * pool->mu. */
int pool_model_failure(struct pool *p, int idx, char *why, size_t n);

int pool_submit(struct pool *p, int idx, const struct engine_request *req, uint64_t *id,
                struct cairn_err *err);
void pool_cancel(struct pool *p, int idx, uint64_t id);

/* Settings of a model (its entry, then global), under pool->mu: borrowed. */
json_t *pool_setting(struct pool *p, int idx, const char *key);
/* Effective ttl in seconds (flag, settings), 0 = none; pinned flag. Under pool->mu. */
double pool_ttl(struct pool *p, int idx);
int pool_pinned(struct pool *p, int idx);
/* Applies a settings patch (validated; saved to the file). *changes: {"applied": [...],
 * "on_next_load": [...]} (new reference). field names a bad key. */
int pool_settings_put(struct pool *p, json_t *patch, json_t **changes, char *field, size_t cap,
                      struct cairn_err *err);
/* Model state as JSON (admin): new reference. */
json_t *pool_model_json(struct pool *p, int idx);
/* The guard's budget and holds (status, admin): new reference. */
json_t *pool_memory_json(struct pool *p);
const char *pool_state_name(enum pool_state s);
/* The loaded model's info (the group's under tensor parallel), or NULL while not loaded. */
const struct model_info *pool_model_info(const struct pool_model *m);
/* {"tensor_parallel": N, "sharded": whether models run as a rank group, "devices": [rank 0's
 * name, ...]} for /api/status (new reference). */
json_t *pool_devices_json(const struct pool *p);

#endif
