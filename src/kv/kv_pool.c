/* KV pool allocation through the backend (accounted under CAIRN_MEM_KV) and block copies. */
#include "kv/kv_pool.h"

#include <string.h>

#include "base/mem.h"

int kv_pool_init(struct kv_pool *p, struct backend *be, int n_layers, int n_blocks, int block_size,
                 int n_kv_heads, int head_dim, enum dtype dtype, struct cairn_err *err)
{
    memset(p, 0, sizeof(*p));
    if (n_layers < 0 || n_blocks <= 0 || block_size <= 0 || n_kv_heads <= 0 || head_dim <= 0 ||
        (dtype != DTYPE_F32 && dtype != DTYPE_BF16))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "kv pool: bad geometry");
    p->be = be;
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
    p->alloc_bytes = total;
    int rc = CAIRN_OK;
    if (be) {
        void *k = NULL, *v = NULL;
        rc = be->ops->buf_alloc(be, total, CAIRN_MEM_KV, &k, err);
        if (rc == CAIRN_OK) rc = be->ops->buf_alloc(be, total, CAIRN_MEM_KV, &v, err);
        p->k = k;
        p->v = v;
    } else {
        p->k = cairn_mem_alloc(total, CAIRN_MEM_KV);
        p->v = cairn_mem_alloc(total, CAIRN_MEM_KV);
        if (!p->k || !p->v) rc = CAIRN_ERR_NOMEM;
    }
    if (rc != CAIRN_OK) {
        kv_pool_free(p);
        return cairn_err_set(err, rc, "kv pool: cannot allocate 2 x %zu bytes", total);
    }
    p->view = (struct backend_kv_view){
        .k = p->k,
        .v = p->v,
        .n_blocks = n_blocks,
        .n_layers = n_layers,
        .block_size = block_size,
        .n_kv_heads = n_kv_heads,
        .head_dim = head_dim,
        .dtype = dtype,
        .layer_block_bytes = p->layer_block_bytes,
        .block_bytes = p->block_bytes,
    };
    return CAIRN_OK;
}

void kv_pool_free(struct kv_pool *p)
{
    if (p->be) {
        if (p->k) p->be->ops->buf_free(p->be, p->k, p->alloc_bytes, CAIRN_MEM_KV);
        if (p->v) p->be->ops->buf_free(p->be, p->v, p->alloc_bytes, CAIRN_MEM_KV);
    } else {
        cairn_mem_free(p->k, p->alloc_bytes, CAIRN_MEM_KV);
        cairn_mem_free(p->v, p->alloc_bytes, CAIRN_MEM_KV);
    }
    p->k = p->v = NULL;
    p->view.k = p->view.v = NULL;
}

int kv_pool_block_read(const struct kv_pool *p, int block, void *k, void *v, struct cairn_err *err)
{
    CAIRN_ASSERT(block >= 0 && block < p->n_blocks);
    if (!p->be) {
        memcpy(k, kv_pool_k(p, block, 0), p->block_bytes);
        memcpy(v, kv_pool_v(p, block, 0), p->block_bytes);
        return CAIRN_OK;
    }
    int rc = p->be->ops->buf_download(p->be, k, kv_pool_k(p, block, 0), p->block_bytes, err);
    if (rc == CAIRN_OK) rc = p->be->ops->buf_download(p->be, v, kv_pool_v(p, block, 0), p->block_bytes, err);
    return rc;
}

int kv_pool_block_write(struct kv_pool *p, int block, const void *k, const void *v, struct cairn_err *err)
{
    CAIRN_ASSERT(block >= 0 && block < p->n_blocks);
    if (!p->be) {
        memcpy(kv_pool_k(p, block, 0), k, p->block_bytes);
        memcpy(kv_pool_v(p, block, 0), v, p->block_bytes);
        return CAIRN_OK;
    }
    int rc = p->be->ops->buf_upload(p->be, kv_pool_k(p, block, 0), k, p->block_bytes, err);
    if (rc == CAIRN_OK) rc = p->be->ops->buf_upload(p->be, kv_pool_v(p, block, 0), v, p->block_bytes, err);
    return rc;
}
