/* safetensors: read checkpoints through mmap (one file, or the shards of an index), and write
 * them crash-safely, tensor after tensor, without holding them in memory.
 *
 * File format: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v", ...}, "NAME": {"dtype": "BF16", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * then the data area; offsets are relative to the data area's start.
 *
 * Reading validates everything before a tensor is handed out: header length, JSON, dtype,
 * shape, that data_offsets lie inside the file, don't overflow or overlap, and that
 * shape x dtype size == byte length. Tensors are sorted by name (binary search).
 *
 * Writing: declare the metadata and every tensor (name, dtype, shape), then stream each
 * tensor's bytes in declaration order (in as many pieces as you like), then commit: the file
 * is written as PATH.tmp.<pid>.<n>, fsynced, renamed over PATH and the folder fsynced. Abort
 * (or a failed write) removes the temp file and leaves any old PATH untouched.
 *
 * Threading: a parsed file is read-only after open; use from any thread. A writer belongs to
 * one thread. */
#ifndef CAIRN_MODEL_SAFETENSORS_H
#define CAIRN_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/tensor.h"

#define SAFETENSORS_MAX_HEADER (100u << 20) /* 100 MB, as the reference implementation */
#define SAFETENSORS_MAX_DIMS 8

/* One tensor of a file. */
struct safetensors_tensor {
    char *name;
    char dtype_str[8]; /* as written: "BF16", "F64", ... */
    int dtype_ok;      /* 1 if dtype maps to enum dtype (else the file still opens) */
    enum dtype dtype;  /* valid when dtype_ok */
    size_t elem_bytes; /* bytes per element of dtype_str */
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t n_elems;
    const uint8_t *data; /* into the mapping (or the caller's buffer) */
    uint64_t n_bytes;
    uint64_t offset; /* begin, relative to the data area */
    int file;        /* index of the file in a set (0 for a single file) */
};

struct safetensors_meta {
    char *key;
    char *value;
};

/* A parsed file. */
struct safetensors {
    char *path;          /* for error messages ("<buffer>" if parsed from memory) */
    const uint8_t *base; /* whole file */
    size_t size;
    size_t data_start;                  /* 8 + header length */
    struct safetensors_tensor *tensors; /* sorted by name */
    int n_tensors;
    struct safetensors_meta *meta; /* __metadata__ in file order */
    int n_meta;
    int fd; /* -1 when parsed from memory */
    int mapped;
};

/* Parses a whole file held in memory (buf must outlive st). Used by the fuzz target and by
 * callers that read small files whole. Free with safetensors_free. */
int safetensors_parse(const uint8_t *buf, size_t size, const char *name, struct safetensors *st,
                      struct cairn_err *err);
/* mmaps path read-only and parses it. Free with safetensors_close. */
int safetensors_open(const char *path, struct safetensors *st, struct cairn_err *err);
void safetensors_close(struct safetensors *st);
/* Frees what safetensors_parse allocated (not buf). */
void safetensors_free(struct safetensors *st);

const struct safetensors_tensor *safetensors_find(const struct safetensors *st, const char *name);
/* Value of a __metadata__ key or NULL. */
const char *safetensors_meta_get(const struct safetensors *st, const char *key);
/* Maps a safetensors dtype name to enum dtype; returns 0 on success, -1 if unknown to cairn.
 * *elem_bytes gets the element size of any valid safetensors dtype (0 if not a dtype at all). */
int safetensors_dtype_parse(const char *s, enum dtype *out, size_t *elem_bytes);
const char *safetensors_dtype_str(enum dtype t);

/* A checkpoint folder: model.safetensors, or the shards listed in model.safetensors.index.json
 * (weight_map). Lookups span all files; every tensor of the index must be found in its shard. */
struct safetensors_set {
    char *dir;
    struct safetensors *files;
    int n_files;
    const struct safetensors_tensor **index; /* all tensors, sorted by name */
    int n_tensors;
};

int safetensors_set_open(const char *dir, struct safetensors_set *set, struct cairn_err *err);
void safetensors_set_close(struct safetensors_set *set);
/* Whether p points into one of the set's mmap'd files. */
int safetensors_set_maps(const struct safetensors_set *set, const void *p);
const struct safetensors_tensor *safetensors_set_find(const struct safetensors_set *set,
                                                      const char *name);
/* Base name of the file a tensor lives in (for error messages). */
const char *safetensors_set_file_name(const struct safetensors_set *set,
                                      const struct safetensors_tensor *t);

/* ---- writer ---- */

struct safetensors_writer;

/* Starts a writer for path (nothing is created until safetensors_writer_begin). */
int safetensors_writer_open(const char *path, struct safetensors_writer **out,
                            struct cairn_err *err);
int safetensors_writer_meta(struct safetensors_writer *w, const char *key, const char *value,
                            struct cairn_err *err);
/* Declares the next tensor. Data must later come in the same order. */
int safetensors_writer_tensor(struct safetensors_writer *w, const char *name, enum dtype dtype,
                              int n_dims, const int64_t *shape, struct cairn_err *err);
/* Creates the temp file and writes the header. No more declarations after this. */
int safetensors_writer_begin(struct safetensors_writer *w, struct cairn_err *err);
/* Appends bytes of the current tensor (may span into the next ones; the total must match). */
int safetensors_writer_write(struct safetensors_writer *w, const void *data, size_t n,
                             struct cairn_err *err);
/* Checks every byte was written, fsyncs, renames, fsyncs the folder, frees w. */
int safetensors_writer_commit(struct safetensors_writer *w, struct cairn_err *err);
/* Removes the temp file (if any) and frees w. NULL is fine. */
void safetensors_writer_abort(struct safetensors_writer *w);

#endif
