/* A growable byte buffer (malloc'd), kept NUL-terminated by cairn_buf_put. Zero-initialize,
 * then put; cairn_buf_free releases it (and zeroes it for reuse). */
#ifndef CAIRN_BASE_BUF_H
#define CAIRN_BASE_BUF_H

#include <stddef.h>

struct cairn_buf {
    char *p;         /* NULL until the first put */
    size_t n, cap;   /* bytes used (without the NUL), bytes allocated */
};

/* Makes room for `extra` more bytes. CAIRN_OK or CAIRN_ERR_NOMEM (b unchanged). */
int cairn_buf_reserve(struct cairn_buf *b, size_t extra);
/* Appends data[0..n) and a NUL (not counted in b->n). CAIRN_OK or CAIRN_ERR_NOMEM. */
int cairn_buf_put(struct cairn_buf *b, const void *data, size_t n);
void cairn_buf_free(struct cairn_buf *b);

/* Number of reallocations so far, all buffers (relaxed atomic): tests use it to check that a
 * path allocates nothing once its buffers have grown. */
unsigned long cairn_buf_n_grow(void);

#endif
