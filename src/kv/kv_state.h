/* Recurrent-state buffers of hybrid models (Gated DeltaNet conv + delta state, model/gdn.h) in
 * the memory of the backend that runs the model, so its gdn op reads and writes them in place:
 * a running sequence's state (engine), the block-boundary snapshots of the prefix cache
 * (kv_cache.h) and a speculative step's rollback copy. A tier (hot RAM, SSD) only ever sees host
 * bytes: kv_state_download / kv_state_upload move a snapshot across.
 *
 * be NULL or host-visible (the CPU): plain host memory, copies are memcpy (no staging).
 * Otherwise (a GPU): the backend's buf_* calls, synchronous. Everything is accounted under
 * CAIRN_MEM_STATE (on the device's budget for a GPU: the backend charges buf_alloc there). */
#ifndef CAIRN_KV_KV_STATE_H
#define CAIRN_KV_KV_STATE_H

#include <stddef.h>

#include "base/status.h"
#include "tensor/backend.h"

static inline int kv_state_host_visible(const struct backend *be) { return !be || be->host_visible; }

/* A zeroed buffer of bytes in be's memory; the caller frees it with kv_state_free. */
int kv_state_alloc(struct backend *be, size_t bytes, void **out, struct cairn_err *err);
void kv_state_free(struct backend *be, void *state, size_t bytes);
int kv_state_zero(struct backend *be, void *state, size_t bytes, struct cairn_err *err);
/* dst, src both in be's memory (they must not overlap). */
int kv_state_copy(struct backend *be, void *dst, const void *src, size_t bytes, struct cairn_err *err);
/* host_dst <- state (be's memory) / state <- host_src. */
int kv_state_download(struct backend *be, void *host_dst, const void *state, size_t bytes,
                      struct cairn_err *err);
int kv_state_upload(struct backend *be, void *state, const void *host_src, size_t bytes,
                    struct cairn_err *err);

#endif
