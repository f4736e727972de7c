/* Recurrent-state buffers in a backend's memory (kv_state.h). */
#include "kv/kv_state.h"

#include <string.h>

#include "base/mem.h"

int kv_state_alloc(struct backend *be, size_t bytes, void **out, struct cairn_err *err)
{
    *out = NULL;
    if (!be) {
        *out = cairn_mem_alloc(bytes, CAIRN_MEM_STATE); /* zeroed */
        return *out ? CAIRN_OK
                    : cairn_err_set(err, CAIRN_ERR_NOMEM, "recurrent state: cannot allocate %zu bytes", bytes);
    }
    return be->ops->buf_alloc(be, bytes, CAIRN_MEM_STATE, out, err);
}

void kv_state_free(struct backend *be, void *state, size_t bytes)
{
    if (!state) return;
    if (be) be->ops->buf_free(be, state, bytes, CAIRN_MEM_STATE);
    else cairn_mem_free(state, bytes, CAIRN_MEM_STATE);
}

int kv_state_zero(struct backend *be, void *state, size_t bytes, struct cairn_err *err)
{
    if (kv_state_host_visible(be)) {
        memset(state, 0, bytes);
        return CAIRN_OK;
    }
    return be->ops->buf_zero(be, state, bytes, err);
}

int kv_state_copy(struct backend *be, void *dst, const void *src, size_t bytes, struct cairn_err *err)
{
    if (kv_state_host_visible(be)) {
        memcpy(dst, src, bytes);
        return CAIRN_OK;
    }
    return be->ops->buf_copy(be, dst, src, bytes, err);
}

int kv_state_download(struct backend *be, void *host_dst, const void *state, size_t bytes,
                      struct cairn_err *err)
{
    if (kv_state_host_visible(be)) {
        memcpy(host_dst, state, bytes);
        return CAIRN_OK;
    }
    return be->ops->buf_download(be, host_dst, state, bytes, err);
}

int kv_state_upload(struct backend *be, void *state, const void *host_src, size_t bytes,
                    struct cairn_err *err)
{
    if (kv_state_host_visible(be)) {
        memcpy(state, host_src, bytes);
        return CAIRN_OK;
    }
    return be->ops->buf_upload(be, state, host_src, bytes, err);
}
