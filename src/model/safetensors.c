/* safetensors reader (mmap, validated header) and crash-safe streaming writer.
 * See safetensors.h for the format and the checks. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"

static const struct {
    const char *name;
    size_t bytes;
    int cairn; /* enum dtype, or -1 */
} safetensors_dtypes[] = {
    {"F32", 4, DTYPE_F32}, {"F16", 2, DTYPE_F16}, {"BF16", 2, DTYPE_BF16}, {"I32", 4, DTYPE_I32},
    {"U32", 4, DTYPE_U32}, {"I64", 8, DTYPE_I64}, {"U8", 1, DTYPE_U8},     {"I8", 1, DTYPE_I8},
    {"F64", 8, -1},        {"I16", 2, -1},        {"U16", 2, -1},          {"U64", 8, -1},
    {"BOOL", 1, -1},       {"F8_E4M3", 1, -1},    {"F8_E5M2", 1, -1},
};

int safetensors_dtype_parse(const char *s, enum dtype *out, size_t *elem_bytes)
{
    *elem_bytes = 0;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(safetensors_dtypes); i++) {
        if (strcmp(s, safetensors_dtypes[i].name) == 0) {
            *elem_bytes = safetensors_dtypes[i].bytes;
            if (safetensors_dtypes[i].cairn < 0) return -1;
            *out = (enum dtype)safetensors_dtypes[i].cairn;
            return 0;
        }
    }
    return -1;
}

const char *safetensors_dtype_str(enum dtype t)
{
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(safetensors_dtypes); i++)
        if (safetensors_dtypes[i].cairn == (int)t) return safetensors_dtypes[i].name;
    return NULL;
}

static int safetensors_cmp_name(const void *a, const void *b)
{
    const struct safetensors_tensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static int safetensors_cmp_offset(const void *a, const void *b)
{
    const struct safetensors_tensor *x = *(const struct safetensors_tensor *const *)a;
    const struct safetensors_tensor *y = *(const struct safetensors_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->n_bytes != y->n_bytes) return x->n_bytes < y->n_bytes ? -1 : 1;
    return 0;
}

/* Reads a non-negative JSON integer. */
static int safetensors_json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    if (i < 0) return -1;
    *out = (uint64_t)i;
    return 0;
}

static int safetensors_parse_entry(struct safetensors *st, const char *key, json_t *val,
                                   uint64_t data_size, struct safetensors_tensor *t,
                                   struct cairn_err *err)
{
    const char *path = st->path;
    if (!json_is_object(val))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path,
                             key);
    json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape");
    json_t *jo = json_object_get(val, "data_offsets");
    if (!json_is_string(jd))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': missing or non-string dtype",
                             path, key);
    const char *ds = json_string_value(jd);
    t->dtype_ok = safetensors_dtype_parse(ds, &t->dtype, &t->elem_bytes) == 0;
    if (t->elem_bytes == 0)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.16s'", path,
                             key, ds);
    snprintf(t->dtype_str, sizeof(t->dtype_str), "%s", ds);
    if (!json_is_array(js))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': missing or non-array shape",
                             path, key);
    size_t nd = json_array_size(js);
    if (nd > SAFETENSORS_MAX_DIMS)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': %zu dims (max %d)", path, key,
                             nd, SAFETENSORS_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t n = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (safetensors_json_u64(json_array_get(js, i), &d) != 0 || d > (uint64_t)INT64_MAX)
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': bad shape dim %zu", path,
                                 key, i);
        t->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(n, d, &n))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': shape overflows", path,
                                 key);
    }
    t->n_elems = n;
    uint64_t want;
    if (__builtin_mul_overflow(n, (uint64_t)t->elem_bytes, &want))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s': byte size overflows", path,
                             key);
    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        safetensors_json_u64(json_array_get(jo, 0), &b) != 0 ||
        safetensors_json_u64(json_array_get(jo, 1), &e) != 0)
        return cairn_err_set(err, CAIRN_ERR_FORMAT,
                             "%s: tensor '%s': data_offsets must be [begin, end]", path, key);
    if (b > e || e > data_size)
        return cairn_err_set(
            err, CAIRN_ERR_FORMAT,
            "%s: tensor '%s': data_offsets [%llu, %llu] outside the data area (%llu bytes)", path,
            key, (unsigned long long)b, (unsigned long long)e, (unsigned long long)data_size);
    if (e - b != want)
        return cairn_err_set(
            err, CAIRN_ERR_FORMAT,
            "%s: tensor '%s': %llu bytes in data_offsets but shape x %s needs %llu", path, key,
            (unsigned long long)(e - b), ds, (unsigned long long)want);
    t->offset = b;
    t->n_bytes = e - b;
    t->data = st->base + st->data_start + b;
    t->name = strdup(key);
    if (!t->name) return cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", path);
    return CAIRN_OK;
}

static int safetensors_parse_meta(struct safetensors *st, json_t *meta, struct cairn_err *err)
{
    if (!json_is_object(meta))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: __metadata__ is not an object", st->path);
    size_t n = json_object_size(meta);
    st->meta = calloc(n ? n : 1, sizeof(*st->meta));
    if (!st->meta) return cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", st->path);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v)
    {
        if (!json_is_string(v))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: __metadata__ '%s' is not a string",
                                 st->path, k);
        struct safetensors_meta *m = &st->meta[st->n_meta++];
        m->key = strdup(k);
        m->value = strdup(json_string_value(v));
        if (!m->key || !m->value)
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", st->path);
    }
    return CAIRN_OK;
}

int safetensors_parse(const uint8_t *buf, size_t size, const char *name, struct safetensors *st,
                      struct cairn_err *err)
{
    memset(st, 0, sizeof(*st));
    st->fd = -1;
    st->base = buf;
    st->size = size;
    st->path = strdup(name ? name : "<buffer>");
    if (!st->path) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    json_t *root = NULL;
    const struct safetensors_tensor **by_off = NULL;
    int rc = CAIRN_OK;
    if (size < 8) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT,
                           "%s: %zu bytes, too short for a safetensors header", st->path, size);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > SAFETENSORS_MAX_HEADER || hlen > size - 8) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT,
                           "%s: header length %llu does not fit in a %zu-byte file", st->path,
                           (unsigned long long)hlen, size);
        goto done;
    }
    st->data_start = 8 + (size_t)hlen;
    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: header JSON: %s at byte %d", st->path,
                           jerr.text, jerr.position);
        goto done;
    }
    if (!json_is_object(root)) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: header is not a JSON object", st->path);
        goto done;
    }
    size_t n = json_object_size(root);
    st->tensors = calloc(n ? n : 1, sizeof(*st->tensors));
    if (!st->tensors) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", st->path);
        goto done;
    }
    uint64_t data_size = size - st->data_start;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            rc = safetensors_parse_meta(st, val, err);
        } else {
            rc = safetensors_parse_entry(st, key, val, data_size, &st->tensors[st->n_tensors], err);
            if (rc == CAIRN_OK) st->n_tensors++;
        }
        if (rc != CAIRN_OK) goto done;
    }
    qsort(st->tensors, (size_t)st->n_tensors, sizeof(*st->tensors), safetensors_cmp_name);
    /* Overlap check: sort views by offset, each must start at or after the previous end. */
    by_off = malloc(sizeof(*by_off) * (size_t)(st->n_tensors ? st->n_tensors : 1));
    if (!by_off) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", st->path);
        goto done;
    }
    for (int i = 0; i < st->n_tensors; i++)
        by_off[i] = &st->tensors[i];
    qsort(by_off, (size_t)st->n_tensors, sizeof(*by_off), safetensors_cmp_offset);
    for (int i = 1; i < st->n_tensors; i++) {
        const struct safetensors_tensor *a = by_off[i - 1], *b = by_off[i];
        if (b->offset < a->offset + a->n_bytes) {
            rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", st->path,
                               a->name, b->name);
            goto done;
        }
    }
done:
    free(by_off);
    json_decref(root);
    if (rc != CAIRN_OK) safetensors_free(st);
    return rc;
}

void safetensors_free(struct safetensors *st)
{
    if (st->tensors)
        for (int i = 0; i < st->n_tensors; i++)
            free(st->tensors[i].name);
    /* A failed parse may leave one strdup'd name past n_tensors: parse_entry only sets it last,
     * so there is none. */
    free(st->tensors);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->meta);
    free(st->path);
    st->tensors = NULL;
    st->meta = NULL;
    st->path = NULL;
    st->n_tensors = st->n_meta = 0;
}

int safetensors_open(const char *path, struct safetensors *st, struct cairn_err *err)
{
    memset(st, 0, sizeof(*st));
    st->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cairn_err_set(err, errno == ENOENT ? CAIRN_ERR_NOT_FOUND : CAIRN_ERR_IO, "%s: %s",
                             path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return cairn_err_set(err, CAIRN_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cairn_err_set(err, CAIRN_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
    }
    int rc = safetensors_parse(map ? map : (const uint8_t *)"", size, path, st, err);
    if (rc != CAIRN_OK) {
        if (map) munmap(map, size);
        close(fd);
        return rc;
    }
    st->fd = fd;
    st->mapped = map != NULL;
    return CAIRN_OK;
}

int safetensors_set_maps(const struct safetensors_set *set, const void *p)
{
    for (int i = 0; i < set->n_files; i++) {
        const struct safetensors *f = &set->files[i];
        if (f->mapped && (const uint8_t *)p >= f->base && (const uint8_t *)p < f->base + f->size) return 1;
    }
    return 0;
}

void safetensors_close(struct safetensors *st)
{
    if (st->mapped) munmap((void *)st->base, st->size);
    if (st->fd >= 0) close(st->fd);
    st->fd = -1;
    st->mapped = 0;
    safetensors_free(st);
}

const struct safetensors_tensor *safetensors_find(const struct safetensors *st, const char *name)
{
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, st->tensors[mid].name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *safetensors_meta_get(const struct safetensors *st, const char *key)
{
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

/* ---- sets (single file or sharded) ---- */

static int safetensors_cmp_ptr_name(const void *a, const void *b)
{
    const struct safetensors_tensor *x = *(const struct safetensors_tensor *const *)a;
    const struct safetensors_tensor *y = *(const struct safetensors_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int safetensors_set_add_file(struct safetensors_set *set, const char *file,
                                    struct cairn_err *err)
{
    char path[4096];
    if (strchr(file, '/') || strcmp(file, "..") == 0 || strcmp(file, ".") == 0)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: shard name '%s' is not a plain file name",
                             set->dir, file);
    snprintf(path, sizeof(path), "%s/%s", set->dir, file);
    for (int i = 0; i < set->n_files; i++)
        if (strcmp(set->files[i].path, path) == 0) return CAIRN_OK;
    struct safetensors *nf = realloc(set->files, sizeof(*nf) * (size_t)(set->n_files + 1));
    if (!nf) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    set->files = nf;
    int rc = safetensors_open(path, &set->files[set->n_files], err);
    if (rc != CAIRN_OK) return rc;
    struct safetensors *f = &set->files[set->n_files];
    for (int i = 0; i < f->n_tensors; i++)
        f->tensors[i].file = set->n_files;
    set->n_files++;
    return CAIRN_OK;
}

int safetensors_set_open(const char *dir, struct safetensors_set *set, struct cairn_err *err)
{
    memset(set, 0, sizeof(*set));
    set->dir = strdup(dir);
    if (!set->dir) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    char path[4096];
    char *text = NULL;
    size_t len;
    json_t *root = NULL;
    int rc;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    if (cairn_file_exists(path)) {
        rc = cairn_file_read_all(path, 64u << 20, &text, &len, err);
        if (rc != CAIRN_OK) goto done;
        json_error_t jerr;
        root = json_loadb(text, len, 0, &jerr);
        json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
        if (!json_is_object(wm)) {
            rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: no weight_map object%s%s", path,
                               root ? "" : ": ", root ? "" : jerr.text);
            goto done;
        }
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v)
        {
            if (!json_is_string(v)) {
                rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: weight_map '%s' is not a string",
                                   path, k);
                goto done;
            }
            rc = safetensors_set_add_file(set, json_string_value(v), err);
            if (rc != CAIRN_OK) goto done;
        }
        /* Every tensor the index names must be in the shard it names. */
        json_object_foreach(wm, k, v)
        {
            int found = 0;
            for (int i = 0; i < set->n_files && !found; i++) {
                const char *base = strrchr(set->files[i].path, '/');
                if (strcmp(base + 1, json_string_value(v)) == 0)
                    found = safetensors_find(&set->files[i], k) != NULL;
            }
            if (!found) {
                rc = cairn_err_set(err, CAIRN_ERR_FORMAT,
                                   "%s/%s: tensor '%s' listed in the index is missing", dir,
                                   json_string_value(v), k);
                goto done;
            }
        }
    } else {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        if (!cairn_file_exists(path)) {
            rc = cairn_err_set(err, CAIRN_ERR_NOT_FOUND,
                               "%s: no model.safetensors or model.safetensors.index.json", dir);
            goto done;
        }
        rc = safetensors_set_add_file(set, "model.safetensors", err);
        if (rc != CAIRN_OK) goto done;
    }
    for (int i = 0; i < set->n_files; i++)
        set->n_tensors += set->files[i].n_tensors;
    set->index = malloc(sizeof(*set->index) * (size_t)(set->n_tensors ? set->n_tensors : 1));
    if (!set->index) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto done;
    }
    int j = 0;
    for (int i = 0; i < set->n_files; i++)
        for (int t = 0; t < set->files[i].n_tensors; t++)
            set->index[j++] = &set->files[i].tensors[t];
    qsort(set->index, (size_t)set->n_tensors, sizeof(*set->index), safetensors_cmp_ptr_name);
    for (int i = 1; i < set->n_tensors; i++) {
        if (strcmp(set->index[i - 1]->name, set->index[i]->name) == 0) {
            rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: tensor '%s' is in two shards", dir,
                               set->index[i]->name);
            goto done;
        }
    }
    rc = CAIRN_OK;
done:
    json_decref(root);
    free(text);
    if (rc != CAIRN_OK) safetensors_set_close(set);
    return rc;
}

void safetensors_set_close(struct safetensors_set *set)
{
    for (int i = 0; i < set->n_files; i++)
        safetensors_close(&set->files[i]);
    free(set->files);
    free(set->index);
    free(set->dir);
    memset(set, 0, sizeof(*set));
}

const struct safetensors_tensor *safetensors_set_find(const struct safetensors_set *set,
                                                      const char *name)
{
    int lo = 0, hi = set->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, set->index[mid]->name);
        if (c == 0) return set->index[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *safetensors_set_file_name(const struct safetensors_set *set,
                                      const struct safetensors_tensor *t)
{
    if (t->file < 0 || t->file >= set->n_files) return "?";
    const char *p = set->files[t->file].path, *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ---- writer ---- */

#define SAFETENSORS_WBUF (1u << 20)

struct safetensors_writer {
    char *path;
    char tmp[4200];
    int fd;
    json_t *header;
    json_t *meta;
    uint64_t data_bytes; /* declared */
    uint64_t written;    /* data bytes written so far */
    uint8_t *buf;
    size_t buf_used;
    int failed;
};

int safetensors_writer_open(const char *path, struct safetensors_writer **out,
                            struct cairn_err *err)
{
    *out = NULL;
    struct safetensors_writer *w = calloc(1, sizeof(*w));
    if (!w) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    w->fd = -1;
    w->path = strdup(path);
    w->header = json_object();
    w->meta = json_object();
    if (!w->path || !w->header || !w->meta) {
        safetensors_writer_abort(w);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    *out = w;
    return CAIRN_OK;
}

int safetensors_writer_meta(struct safetensors_writer *w, const char *key, const char *value,
                            struct cairn_err *err)
{
    if (w->fd >= 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: metadata after begin", w->path);
    if (json_object_set_new(w->meta, key, json_string(value)) != 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: bad metadata '%s' (not UTF-8?)", w->path,
                             key);
    return CAIRN_OK;
}

int safetensors_writer_tensor(struct safetensors_writer *w, const char *name, enum dtype dtype,
                              int n_dims, const int64_t *shape, struct cairn_err *err)
{
    const char *ds = safetensors_dtype_str(dtype);
    if (w->fd >= 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: tensor '%s' declared after begin",
                             w->path, name);
    if (!ds)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: tensor '%s': dtype %s cannot be stored",
                             w->path, name, dtype_name(dtype));
    if (strcmp(name, "__metadata__") == 0 || json_object_get(w->header, name))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: tensor name '%s' used twice or reserved",
                             w->path, name);
    if (n_dims < 0 || n_dims > SAFETENSORS_MAX_DIMS)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: tensor '%s': %d dims", w->path, name,
                             n_dims);
    uint64_t bytes = dtype_size(dtype);
    json_t *js = json_array();
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[i], &bytes)) {
            json_decref(js);
            return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: tensor '%s': bad shape", w->path,
                                 name);
        }
        json_array_append_new(js, json_integer(shape[i]));
    }
    json_t *e = json_object();
    json_object_set_new(e, "dtype", json_string(ds));
    json_object_set_new(e, "shape", js);
    json_t *jo = json_array();
    json_array_append_new(jo, json_integer((json_int_t)w->data_bytes));
    json_array_append_new(jo, json_integer((json_int_t)(w->data_bytes + bytes)));
    json_object_set_new(e, "data_offsets", jo);
    if (json_object_set_new(w->header, name, e) != 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: bad tensor name '%s'", w->path, name);
    w->data_bytes += bytes;
    return CAIRN_OK;
}

static int safetensors_writer_flush(struct safetensors_writer *w, struct cairn_err *err)
{
    size_t off = 0;
    while (off < w->buf_used) {
        ssize_t n = write(w->fd, w->buf + off, w->buf_used - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            w->failed = 1;
            return cairn_err_set(err, CAIRN_ERR_IO, "%s: write: %s", w->tmp, strerror(errno));
        }
        off += (size_t)n;
    }
    w->buf_used = 0;
    return CAIRN_OK;
}

static int safetensors_writer_put(struct safetensors_writer *w, const void *data, size_t n,
                                  struct cairn_err *err)
{
    const uint8_t *p = data;
    while (n) {
        size_t k = CAIRN_MIN(n, SAFETENSORS_WBUF - w->buf_used);
        memcpy(w->buf + w->buf_used, p, k);
        w->buf_used += k;
        p += k;
        n -= k;
        if (w->buf_used == SAFETENSORS_WBUF && safetensors_writer_flush(w, err) != CAIRN_OK)
            return err ? err->status : CAIRN_ERR_IO;
    }
    return CAIRN_OK;
}

static unsigned long safetensors_tmp_counter;

int safetensors_writer_begin(struct safetensors_writer *w, struct cairn_err *err)
{
    if (w->fd >= 0) return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: begin called twice", w->path);
    if (json_object_size(w->meta) > 0) json_object_set(w->header, "__metadata__", w->meta);
    char *text = json_dumps(w->header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7;
    w->buf = malloc(SAFETENSORS_WBUF);
    if (!w->buf) {
        free(text);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    unsigned long seq = __atomic_add_fetch(&safetensors_tmp_counter, 1, __ATOMIC_RELAXED);
    snprintf(w->tmp, sizeof(w->tmp), "%s.tmp.%d.%lu", w->path, (int)getpid(), seq);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        free(text);
        return cairn_err_set(err, CAIRN_ERR_IO, "%s: %s", w->tmp, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int rc = safetensors_writer_put(w, len8, 8, err);
    if (rc == CAIRN_OK) rc = safetensors_writer_put(w, text, hlen, err);
    while (rc == CAIRN_OK && hlen < padded) {
        rc = safetensors_writer_put(w, " ", 1, err);
        hlen++;
    }
    free(text);
    return rc;
}

int safetensors_writer_write(struct safetensors_writer *w, const void *data, size_t n,
                             struct cairn_err *err)
{
    if (w->fd < 0 || w->failed)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: write before begin or after an error",
                             w->path);
    if (n > w->data_bytes - w->written)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: %zu bytes more than declared", w->path,
                             n);
    w->written += n;
    return safetensors_writer_put(w, data, n, err);
}

int safetensors_writer_commit(struct safetensors_writer *w, struct cairn_err *err)
{
    int rc;
    if (w->fd < 0) {
        rc = cairn_err_set(err, CAIRN_ERR_INVALID, "%s: commit before begin", w->path);
        goto fail;
    }
    if (w->written != w->data_bytes) {
        rc = cairn_err_set(err, CAIRN_ERR_INVALID, "%s: %llu of %llu data bytes written", w->path,
                           (unsigned long long)w->written, (unsigned long long)w->data_bytes);
        goto fail;
    }
    rc = safetensors_writer_flush(w, err);
    if (rc != CAIRN_OK) goto fail;
    if (fsync(w->fd) != 0 || close(w->fd) != 0) {
        w->fd = -1;
        rc = cairn_err_set(err, CAIRN_ERR_IO, "%s: fsync/close: %s", w->tmp, strerror(errno));
        goto fail;
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        rc = cairn_err_set(err, CAIRN_ERR_IO, "rename %s -> %s: %s", w->tmp, w->path,
                           strerror(errno));
        goto fail;
    }
    w->tmp[0] = 0;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", w->path);
    if (cairn_fsync_dir(dirname(dir)) != 0) {
        rc = cairn_err_set(err, CAIRN_ERR_IO, "fsync folder of %s: %s", w->path, strerror(errno));
        goto fail;
    }
    safetensors_writer_abort(w);
    return CAIRN_OK;
fail:
    safetensors_writer_abort(w);
    return rc;
}

void safetensors_writer_abort(struct safetensors_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp[0]) unlink(w->tmp);
    json_decref(w->header);
    json_decref(w->meta);
    free(w->buf);
    free(w->path);
    free(w);
}
