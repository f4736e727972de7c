/* The device-tier KV pool: fixed-size blocks of K and V for every attention layer.
 *
 * Layout: k and v are each [n_blocks][n_layers][block_size][n_kv_heads][head_dim] of `dtype`
 * (DTYPE_BF16 by default, DTYPE_F32 for tests). One block of one layer is `layer_block_bytes`;
 * one whole block (all layers) is contiguous, `block_bytes`, so a tier can copy it in one go.
 * A sequence's block table maps logical block j (positions [j*block_size, (j+1)*block_size))
 * to a pool block id. The pool is plain memory: who owns which block is kv_cache's business. */
#ifndef CAIRN_KV_KV_POOL_H
#define CAIRN_KV_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/tensor.h"

struct kv_pool {
    int n_layers;             /* attention layers (model_info.n_kv_layers) */
    int n_blocks;
    int block_size;           /* tokens per block */
    int n_kv_heads;
    int head_dim;
    enum dtype dtype;         /* DTYPE_BF16 or DTYPE_F32 */
    size_t layer_block_bytes; /* block_size * n_kv_heads * head_dim * dtype_size */
    size_t block_bytes;       /* n_layers * layer_block_bytes: K (or V) of one block */
    uint8_t *k;
    uint8_t *v;
};

int kv_pool_init(struct kv_pool *p, int n_layers, int n_blocks, int block_size, int n_kv_heads,
                 int head_dim, enum dtype dtype, struct cairn_err *err);
void kv_pool_free(struct kv_pool *p);

/* K or V of (block, layer): [block_size][n_kv_heads][head_dim]. */
static inline void *kv_pool_k(const struct kv_pool *p, int block, int layer)
{
    return p->k + ((size_t)block * (size_t)p->n_layers + (size_t)layer) * p->layer_block_bytes;
}
static inline void *kv_pool_v(const struct kv_pool *p, int block, int layer)
{
    return p->v + ((size_t)block * (size_t)p->n_layers + (size_t)layer) * p->layer_block_bytes;
}

#endif
