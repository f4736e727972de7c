/* Status codes and error context, shared by every room.
 *
 * Functions that can fail return int: CAIRN_OK (0) or a negative enum cairn_status.
 * Where the user needs to know what was wrong (file, tensor, parameter, byte offset), they also
 * take a `struct cairn_err *` (may be NULL) and fill it with cairn_err_set(). */
#ifndef CAIRN_BASE_STATUS_H
#define CAIRN_BASE_STATUS_H

#include <stddef.h>

enum cairn_status {
    CAIRN_OK = 0,
    CAIRN_ERR_NOMEM = -1,       /* allocation failed */
    CAIRN_ERR_IO = -2,          /* read/write/open failed (errno in the message) */
    CAIRN_ERR_FORMAT = -3,      /* malformed input file or data */
    CAIRN_ERR_INVALID = -4,     /* bad argument or parameter */
    CAIRN_ERR_UNSUPPORTED = -5, /* well-formed but not supported (architecture, dtype) */
    CAIRN_ERR_NOT_FOUND = -6,   /* missing file, tensor, model, key */
    CAIRN_ERR_LIMIT = -7,       /* a configured limit was hit (size, steps, depth) */
    CAIRN_ERR_BUSY = -8,        /* queue full, try later */
    CAIRN_ERR_CANCELLED = -9,   /* the caller cancelled */
    CAIRN_ERR_INTERNAL = -10,   /* a bug: an invariant failed */
    CAIRN_ERR_DEVICE = -11,     /* the device stalled past --step-timeout or failed for good: the
                                 * model's requests fail (HTTP 503) and it must be reloaded */
};

const char *cairn_status_str(int status);

/* Error context: a message for the user. */
struct cairn_err {
    int status;
    char msg[512];
};

/* Sets err (if non-NULL) and returns status, so callers can `return cairn_err_set(...)`. */
int cairn_err_set(struct cairn_err *err, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to an existing message (adds outer context on the way up). */
void cairn_err_prefix(struct cairn_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Always-on invariant check (never for user input): aborts with file:line. */
#define CAIRN_ASSERT(cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) cairn_assert_fail(#cond, __FILE__, __LINE__);                                 \
    } while (0)
void cairn_assert_fail(const char *cond, const char *file, int line) __attribute__((noreturn));

#define CAIRN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CAIRN_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CAIRN_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
