/* The device-tier KV pool: fixed-size blocks of K and V for every attention layer, in the
 * memory of the model's backend (tensor/backend.h).
 *
 * Layout: k and v are each [n_blocks][n_layers][block_size][n_kv_heads][head_dim] of `dtype`
 * (DTYPE_BF16 by default, DTYPE_F32 for tests). One block of one layer is `layer_block_bytes`;
 * one whole block (all layers) is contiguous, `block_bytes`, so a tier can copy it in one go.
 * A sequence's block table maps logical block j (positions [j*block_size, (j+1)*block_size))
 * to a pool block id. Kernels see the pool through kv_pool_view (a backend_kv_view), never
 * this struct. The pool is plain memory: who owns which block is kv_cache's business.
 *
 * Memory: allocated with the backend's buf_alloc (accounted under CAIRN_MEM_KV); be NULL: host
 * memory (cairn_mem_alloc), for engines driven by synthetic model ops. k/v are device pointers:
 * host-readable only when kv_pool_host_visible. kv_pool_block_read / _write copy one whole block
 * (K and V, all layers) between the pool and host memory (the tiers' path on any backend). */
#ifndef CAIRN_KV_KV_POOL_H
#define CAIRN_KV_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/backend.h"
#include "tensor/tensor.h"

struct kv_pool {
    struct backend *be;       /* where k and v live (not owned); NULL: host memory */
    int n_layers;             /* attention layers (model_info.n_kv_layers) */
    int n_blocks;
    int block_size;           /* tokens per block */
    int n_kv_heads;
    int head_dim;
    enum dtype dtype;         /* DTYPE_BF16 or DTYPE_F32 */
    size_t layer_block_bytes; /* block_size * n_kv_heads * head_dim * dtype_size */
    size_t block_bytes;       /* n_layers * layer_block_bytes: K (or V) of one block */
    uint8_t *k;               /* device */
    uint8_t *v;               /* device */
    size_t alloc_bytes;       /* of k (and of v) */
    struct backend_kv_view view; /* what kernels read (kv_pool_view) */
};

int kv_pool_init(struct kv_pool *p, struct backend *be, int n_layers, int n_blocks, int block_size,
                 int n_kv_heads, int head_dim, enum dtype dtype, struct cairn_err *err);
void kv_pool_free(struct kv_pool *p);

static inline const struct backend_kv_view *kv_pool_view(const struct kv_pool *p) { return &p->view; }
static inline int kv_pool_host_visible(const struct kv_pool *p) { return !p->be || p->be->host_visible; }

/* K or V of (block, layer): [block_size][n_kv_heads][head_dim] (a device pointer). */
static inline void *kv_pool_k(const struct kv_pool *p, int block, int layer)
{
    return p->k + ((size_t)block * (size_t)p->n_layers + (size_t)layer) * p->layer_block_bytes;
}
static inline void *kv_pool_v(const struct kv_pool *p, int block, int layer)
{
    return p->v + ((size_t)block * (size_t)p->n_layers + (size_t)layer) * p->layer_block_bytes;
}

/* Copies block's K and V (block_bytes each) to host k, v / from host k, v into the pool. */
int kv_pool_block_read(const struct kv_pool *p, int block, void *k, void *v, struct cairn_err *err);
int kv_pool_block_write(struct kv_pool *p, int block, const void *k, const void *v, struct cairn_err *err);

#endif
