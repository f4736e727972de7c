/* The memory guard: one budget per memory domain (host RAM now; device memory once a GPU backend
 * charges CAIRN_MEM_DEVICE, see base/mem.h) that every large holder reserves from before it
 * allocates, so the process never grows past --max-process-memory.
 *
 * A holder is a `struct engine_guard_hold` with a name ("model qwen3-tiny", "request 12") and
 * bytes per category (the cairn_mem tags: weights, kv, state, hot, scratch, mapped, request ...).
 * engine_guard_reserve grows a hold only when the guard's total stays within the limit, and
 * otherwise says CAIRN_ERR_NOMEM with the numbers (needed, available, what waiting could free).
 * Nothing blocks inside reserve: the caller (the model pool, api/pool.c) decides whether to evict
 * idle models, wait (engine_guard_wait sleeps until some hold shrinks) or answer 507.
 *
 * A hold is `transient` when it ends by itself (a request): memory held that way may free up, so
 * a request that would fit once they are gone waits, one that would not gets a 507 at once.
 *
 * Sizing helpers: engine_guard_kv_bytes counts only the layers that keep per-token KV
 * (model_info.n_kv_layers: a hybrid's linear-attention layers keep a fixed recurrent state,
 * counted by engine_guard_request_need as `state`, once per sequence, and by
 * engine_guard_snapshot_bytes for the prefix cache's snapshots of it).
 *
 * Threading: every function is thread-safe; one mutex per guard guards its holds and totals.
 * A hold must stay at one address while it is reserved (it is linked into the guard's list). */
#ifndef CAIRN_ENGINE_GUARD_H
#define CAIRN_ENGINE_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "base/status.h"
#include "model/model.h"
#include "tensor/tensor.h"

struct engine_guard;

struct engine_guard_hold {
    char owner[128];                       /* shown in /api/status */
    uint64_t bytes[CAIRN_MEM_N_TAGS];      /* reserved per category */
    int transient;                         /* ends by itself (a request) */
    int linked;                            /* in the guard's list (under the guard's mutex) */
    struct engine_guard_hold *next, *prev; /* the guard's list (under the guard's mutex) */
};

/* Why a reservation was refused (all bytes). */
struct engine_guard_deny {
    uint64_t need;       /* what was asked */
    uint64_t available;  /* limit - reserved, at the time */
    uint64_t limit;
    uint64_t transient;  /* reserved by transient holds (may free up by waiting) */
};

struct engine_guard_stats {
    enum cairn_mem_domain domain;
    uint64_t limit;
    uint64_t reserved;                     /* sum of all holds */
    uint64_t by_cat[CAIRN_MEM_N_TAGS];
    uint64_t transient;
    int n_holds;
    uint64_t n_denied;                     /* reservations refused so far */
    int n_waiting;                         /* threads in engine_guard_wait now */
};

/* limit 0 = engine_guard_default_limit(cairn_mem_total_ram()) (give a device budget its limit:
 * engine_guard_default_device_limit of the backend's total). Free with engine_guard_free
 * (after every hold is released). */
int engine_guard_create(enum cairn_mem_domain dom, uint64_t limit, struct engine_guard **out,
                        struct cairn_err *err);
void engine_guard_free(struct engine_guard *g);
uint64_t engine_guard_limit(const struct engine_guard *g);

/* The default --max-process-memory: physical RAM less min(8 GiB, 10 % of it), i.e. RAM - 8 GiB
 * from 80 GiB up and 90 % below, with no jump in between. */
uint64_t engine_guard_default_limit(uint64_t ram_bytes);
/* The default --max-device-memory: the device's total less a margin for what the driver, the
 * CUDA context and library workspaces take outside cairn's accounting: 1/16 of the total, at
 * least 1 GiB and at most 4 GiB (an H200's 141 GiB leaves 137; a 24 GiB card 22.5). */
uint64_t engine_guard_default_device_limit(uint64_t device_total_bytes);

void engine_guard_hold_init(struct engine_guard_hold *h, const char *owner, int transient);
/* Adds need[tag] bytes to the hold, all or nothing. CAIRN_ERR_NOMEM (deny filled, err says the
 * numbers) when the total would pass the limit. */
int engine_guard_reserve(struct engine_guard *g, struct engine_guard_hold *h,
                         const uint64_t need[CAIRN_MEM_N_TAGS], struct engine_guard_deny *deny,
                         struct cairn_err *err);
/* Sets one category of a reserved hold to what was measured (may pass the limit: the memory is
 * already in use; later reservations see it). */
void engine_guard_set(struct engine_guard *g, struct engine_guard_hold *h, enum cairn_mem_tag tag,
                      uint64_t bytes);
/* Gives back everything the hold has and unlinks it (no-op for an empty hold). Wakes waiters. */
void engine_guard_release(struct engine_guard *g, struct engine_guard_hold *h);
/* Sleeps until some hold shrinks or timeout_s passes. Returns 1 if something was released. */
int engine_guard_wait(struct engine_guard *g, double timeout_s);
/* Wakes waiters without releasing (something else changed: a model became idle). */
void engine_guard_kick(struct engine_guard *g);

void engine_guard_get_stats(struct engine_guard *g, struct engine_guard_stats *st);
/* Calls fn for every hold (under the guard's mutex: fn must not call the guard). */
void engine_guard_foreach(struct engine_guard *g,
                          void (*fn)(void *user, const struct engine_guard_hold *h), void *user);

static inline uint64_t engine_guard_hold_total(const struct engine_guard_hold *h)
{
    uint64_t t = 0;
    for (int i = 0; i < CAIRN_MEM_N_TAGS; i++) t += h->bytes[i];
    return t;
}

/* K + V bytes of n_tokens (rounded up to whole blocks) over the layers that keep per-token KV. */
uint64_t engine_guard_kv_bytes(const struct model_info *mi, int block_size, enum dtype kv_dtype,
                               int n_tokens);
/* What one sequence of up to cap_tokens tokens reserves besides the KV pool: the recurrent state
 * (hybrids), its token and block arrays, the sampler's vocabulary-sized buffers. Fills need[]
 * (zeroed first): CAIRN_MEM_REQUEST holds the buffers, CAIRN_MEM_STATE the recurrent state. */
void engine_guard_request_need(const struct model_info *mi, int block_size, int cap_tokens,
                               uint64_t need[CAIRN_MEM_N_TAGS]);
/* What a hybrid's prefix cache keeps as recurrent-state snapshots, engine.c's rule: budget /
 * state_bytes snapshots, at least 2 per running sequence, at most one per KV block, plus the
 * cache's one scratch state. 0 when state_bytes is 0 (pure attention). */
uint64_t engine_guard_snapshot_bytes(uint64_t state_bytes, uint64_t snapshot_budget, int max_running,
                                     uint64_t n_blocks);

#endif
