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
/* Test-only fault injection into cairn_file_write_atomic(_iov), which the SSD tier's block files
 * and the settings files are written with. Inert unless a test arms it, with
 * cairn_file_fault_set or, for a whole process (a server under test), the environment variable
 *     CAIRN_FILE_FAULT=STEP:ERROR[:MATCH[:SKIP[:COUNT]]]
 * read at the first atomic write: STEP write | fsync | rename | fsync_dir; ERROR ENOSPC | EIO |
 * short; MATCH a substring of the destination path ("" or absent: every path); SKIP matching
 * writes let through first (default 0); COUNT matching writes that then fail (default -1: all).
 * ERROR short (STEP write only) fails nothing: each write() call of the file writes at most half
 * of what it was asked, so the retry loop must still write the whole file.
 * A failure before the rename leaves the old file untouched and no temp file; fsync_dir fails
 * after the rename, so the new file is in place (complete) and the error is reported. */
enum cairn_file_fault_step {
    CAIRN_FILE_FAULT_OFF = 0,
    CAIRN_FILE_FAULT_WRITE,
    CAIRN_FILE_FAULT_FSYNC,
    CAIRN_FILE_FAULT_RENAME,
    CAIRN_FILE_FAULT_FSYNC_DIR,
};
struct cairn_file_fault {
    enum cairn_file_fault_step step;
    int err;          /* errno the step fails with (ENOSPC, EIO ...); 0 with WRITE: short writes */
    char match[128];  /* only destination paths containing this; "" every path */
    long skip;        /* matching writes let through before the first fault */
    long count;       /* matching writes that then fail; < 0: all of them */
};
/* Arms f (a copy is kept), or disarms with NULL; resets the counters. Not while writes run. */
void cairn_file_fault_set(const struct cairn_file_fault *f);
/* Atomic writes that a fault was injected into since the last cairn_file_fault_set. */
long cairn_file_fault_hits(void);

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
