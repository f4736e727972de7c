/* KV pool allocation (accounted under CAIRN_MEM_KV). */
#include "kv/kv_pool.h"

#include <string.h>

#include "base/mem.h"

int kv_pool_init(struct kv_pool *p, int n_layers, int n_blocks, int block_size, int n_kv_heads,
                 int head_dim, enum dtype dtype, struct cairn_err *err)
{
    memset(p, 0, sizeof(*p));
    if (n_layers < 0 || n_blocks <= 0 || block_size <= 0 || n_kv_heads <= 0 || head_dim <= 0 ||
        (dtype != DTYPE_F32 && dtype != DTYPE_BF16))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "kv pool: bad geometry");
    p->n_layers = n_layers;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->n_kv_heads = n_kv_heads;
    p->head_dim = head_dim;
    p->dtype = dtype;
    p->layer_block_bytes = (size_t)block_size * (size_t)n_kv_heads * (size_t)head_dim * dtype_size(dtype);
    p->block_bytes = (size_t)n_layers * p->layer_block_bytes;
    size_t total = p->block_bytes * (size_t)n_blocks;
    if (total == 0) total = 64; /* a model without attention layers still gets valid pointers */
    p->k = cairn_mem_alloc(total, CAIRN_MEM_KV);
    p->v = cairn_mem_alloc(total, CAIRN_MEM_KV);
    if (!p->k || !p->v) {
        kv_pool_free(p);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "kv pool: cannot allocate 2 x %zu bytes", total);
    }
    return CAIRN_OK;
}

void kv_pool_free(struct kv_pool *p)
{
    size_t total = p->block_bytes * (size_t)p->n_blocks;
    if (total == 0) total = 64;
    cairn_mem_free(p->k, total, CAIRN_MEM_KV);
    cairn_mem_free(p->v, total, CAIRN_MEM_KV);
    p->k = p->v = NULL;
}
