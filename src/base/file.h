/* File helpers: crash-safe writes (temp file, fsync, rename, fsync dir), whole-file reads,
 * mkdir -p, monotonic time. */
#ifndef CAIRN_BASE_FILE_H
#define CAIRN_BASE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Writes data to path crash-safely: path.tmp.<pid>.<n>, fsync, rename over path, fsync the
 * folder. On failure the old file (if any) is untouched and the temp file removed. */
int cairn_file_write_atomic(const char *path, const void *data, size_t n, struct cairn_err *err);
/* Same, from several pieces (header + payload) without concatenating them first. */
int cairn_file_write_atomic_iov(const char *path, const void *const *parts, const size_t *sizes,
                                int n_parts, struct cairn_err *err);
/* Reads a whole file (NUL-terminated for convenience; *len excludes the NUL). Fails with
 * CAIRN_ERR_LIMIT if larger than max_bytes. Caller frees *out. */
int cairn_file_read_all(const char *path, size_t max_bytes, char **out, size_t *len,
                        struct cairn_err *err);
int cairn_fsync_dir(const char *dir);
/* mkdir -p with mode 0755. */
int cairn_mkdir_p(const char *path, struct cairn_err *err);
int cairn_file_exists(const char *path);
int cairn_dir_exists(const char *path);

/* Monotonic clock in seconds / nanoseconds. */
double cairn_now(void);
uint64_t cairn_now_ns(void);

#endif
