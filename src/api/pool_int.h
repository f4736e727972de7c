/* Shared by pool.c (models, the pool thread) and pool_req.c (requests, JSON views). */
#ifndef CAIRN_API_POOL_INT_H
#define CAIRN_API_POOL_INT_H

#include "api/pool.h"

/* Unloads model idx; pool->mu held (dropped and retaken while the engine stops). */
void pool_unload_locked(struct pool *p, int idx, const char *why);
/* Evicts the least recently used idle model; pool->mu held. Returns 1 if one went. */
int pool_evict_for_parked(struct pool *p);
/* Pool thread, pool->mu held: starts parked requests that fit now, evicts for the rest, ends
 * those past their deadline. Returns 1 if it changed anything. */
int pool_parked_step(struct pool *p);
/* Ends every parked request (DONE, cancelled); pool->mu not held. */
void pool_reqs_cancel_all(struct pool *p);
/* What a load of model idx reserves before it runs: weights as file bytes, KV pool, a hybrid's
 * recurrent-state snapshots (engine_guard_snapshot_bytes), hot tier, workspaces. host gets what
 * the host guard holds, dev (zeroed; may be NULL when the pool has no device budget) what the
 * device guard holds. Under pool->mu. */
void pool_load_estimate(struct pool *p, int idx, uint64_t host[CAIRN_MEM_N_TAGS],
                        uint64_t dev[CAIRN_MEM_N_TAGS]);
/* Plugs the model's tokenizer in as the engine's detokenizer. */
void pool_detok_opts(struct pool_model *m, struct engine_opts *o);

#endif
