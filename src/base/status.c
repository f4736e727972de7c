/* Status strings and error context helpers. */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cairn_status_str(int status)
{
    switch (status) {
    case CAIRN_OK: return "ok";
    case CAIRN_ERR_NOMEM: return "out of memory";
    case CAIRN_ERR_IO: return "i/o error";
    case CAIRN_ERR_FORMAT: return "bad format";
    case CAIRN_ERR_INVALID: return "invalid argument";
    case CAIRN_ERR_UNSUPPORTED: return "unsupported";
    case CAIRN_ERR_NOT_FOUND: return "not found";
    case CAIRN_ERR_LIMIT: return "limit exceeded";
    case CAIRN_ERR_BUSY: return "busy";
    case CAIRN_ERR_CANCELLED: return "cancelled";
    case CAIRN_ERR_INTERNAL: return "internal error";
    case CAIRN_ERR_DEVICE: return "device failed";
    default: return "unknown status";
    }
}

int cairn_err_set(struct cairn_err *err, int status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void cairn_err_prefix(struct cairn_err *err, const char *fmt, ...)
{
    if (!err) return;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    char old[sizeof(err->msg)];
    memcpy(old, err->msg, sizeof(old));
    size_t n = strlen(prefix);
    if (n > sizeof(err->msg) - 3) n = sizeof(err->msg) - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = sizeof(err->msg) - n - 3;
    size_t m = strnlen(old, rest);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
}

void cairn_assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "cairn: assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}
