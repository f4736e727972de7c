/* Growable byte buffers (base/buf.h). */
#include "base/buf.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static unsigned long cairn_buf_grows;

int cairn_buf_reserve(struct cairn_buf *b, size_t extra)
{
    if (b->n + extra <= b->cap) return CAIRN_OK;
    if (extra > (size_t)-1 / 2 - b->n) return CAIRN_ERR_NOMEM;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    __atomic_add_fetch(&cairn_buf_grows, 1, __ATOMIC_RELAXED);
    char *p = realloc(b->p, cap);
    if (!p) return CAIRN_ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return CAIRN_OK;
}

int cairn_buf_put(struct cairn_buf *b, const void *data, size_t n)
{
    if (cairn_buf_reserve(b, n + 1)) return CAIRN_ERR_NOMEM;
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
    return CAIRN_OK;
}

void cairn_buf_free(struct cairn_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

unsigned long cairn_buf_n_grow(void) { return __atomic_load_n(&cairn_buf_grows, __ATOMIC_RELAXED); }
