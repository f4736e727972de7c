/* Model identity over every byte (see model_identity.h).
 *
 * identity = SHA-256("cairn-identity-v2", for each tensor in name order: name, dtype, shape;
 *                    for each file in set order: its size and XXH3-128 file digest)
 * file digest = XXH3-128(file size, XXH3-128 of each 64 MiB chunk of the file in order).
 * The file digests are what the cache keeps; the SHA-256 step is cheap (names and shapes). */
#include "model/model_identity.h"

#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"

#define MODEL_ID_CHUNK ((size_t)64 << 20)
#define MODEL_ID_MAX_THREADS 8
#define MODEL_ID_CACHE_MAX_ENTRIES 512
#define MODEL_ID_CACHE_MAX_BYTES ((size_t)4 << 20)

int model_identity_cache_path(char *buf, size_t cap)
{
    const char *d = getenv("CAIRN_CACHE_DIR");
    int n;
    if (d && *d) n = snprintf(buf, cap, "%s/model-identity.json", d);
    else if ((d = getenv("XDG_CACHE_HOME")) && *d) n = snprintf(buf, cap, "%s/cairn/model-identity.json", d);
    else if ((d = getenv("HOME")) && *d) n = snprintf(buf, cap, "%s/.cache/cairn/model-identity.json", d);
    else return -1;
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* ---- hashing ---- */

struct model_id_job {
    const uint8_t *p;
    size_t n, n_chunks;
    uint8_t *digests; /* [n_chunks][16] */
    atomic_size_t next;
};

static void *model_id_worker(void *arg)
{
    struct model_id_job *j = arg;
    for (;;) {
        size_t c = atomic_fetch_add(&j->next, 1);
        if (c >= j->n_chunks) break;
        size_t off = c * MODEL_ID_CHUNK, n = j->n - off < MODEL_ID_CHUNK ? j->n - off : MODEL_ID_CHUNK;
        cairn_xxh3_128(j->p + off, n, j->digests + 16 * c);
    }
    return NULL;
}

static int model_id_hash_file(const uint8_t *p, size_t n, uint8_t out[16], struct cairn_err *err)
{
    struct model_id_job j = {.p = p, .n = n, .n_chunks = n ? (n + MODEL_ID_CHUNK - 1) / MODEL_ID_CHUNK : 0};
    atomic_init(&j.next, 0);
    j.digests = malloc(8 + 16 * (j.n_chunks + 1));
    if (!j.digests) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n_threads = ncpu > 0 ? (size_t)ncpu : 1;
    if (n_threads > MODEL_ID_MAX_THREADS) n_threads = MODEL_ID_MAX_THREADS;
    if (n_threads > j.n_chunks) n_threads = j.n_chunks;
    pthread_t th[MODEL_ID_MAX_THREADS];
    size_t started = 0;
    for (size_t i = 1; i < n_threads; i++, started++)
        if (pthread_create(&th[i - 1], NULL, model_id_worker, &j)) break;
    model_id_worker(&j); /* this thread works too; it finishes whatever the others don't */
    for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    /* size first, then the chunk digests */
    uint8_t *all = j.digests;
    memmove(all + 8, all, 16 * j.n_chunks);
    for (int b = 0; b < 8; b++) all[b] = (uint8_t)((uint64_t)n >> (8 * b));
    cairn_xxh3_128(all, 8 + 16 * j.n_chunks, out);
    free(j.digests);
    return CAIRN_OK;
}

/* ---- cache ---- */

struct model_id_key {
    char path[PATH_MAX];
    uint64_t size, ino, dev;
    int64_t mtime_ns, ctime_ns;
};

static int model_id_key_get(const char *path, struct model_id_key *k, struct cairn_err *err)
{
    struct stat sb;
    memset(k, 0, sizeof(*k));
    if (!realpath(path, k->path) || stat(k->path, &sb) != 0)
        return cairn_err_set(err, CAIRN_ERR_IO, "%s: cannot stat for the model identity", path);
    k->size = (uint64_t)sb.st_size;
    k->ino = (uint64_t)sb.st_ino;
    k->dev = (uint64_t)sb.st_dev;
    k->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    k->ctime_ns = (int64_t)sb.st_ctim.tv_sec * 1000000000 + sb.st_ctim.tv_nsec;
    return CAIRN_OK;
}

static int model_id_entry_matches(json_t *e, const struct model_id_key *k)
{
    const char *p = json_string_value(json_object_get(e, "path"));
    return p && !strcmp(p, k->path) &&
           json_integer_value(json_object_get(e, "size")) == (json_int_t)k->size &&
           json_integer_value(json_object_get(e, "ino")) == (json_int_t)k->ino &&
           json_integer_value(json_object_get(e, "dev")) == (json_int_t)k->dev &&
           json_integer_value(json_object_get(e, "mtime_ns")) == (json_int_t)k->mtime_ns &&
           json_integer_value(json_object_get(e, "ctime_ns")) == (json_int_t)k->ctime_ns;
}

/* The cache's entries array (new reference; empty when missing or unreadable). */
static json_t *model_id_cache_load(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    json_t *root = NULL, *entries = NULL;
    if (cairn_file_read_all(path, MODEL_ID_CACHE_MAX_BYTES, &text, &len, NULL) == CAIRN_OK) {
        root = json_loadb(text, len, 0, NULL);
        if (json_integer_value(json_object_get(root, "version")) == 1)
            entries = json_object_get(root, "entries");
    }
    entries = json_is_array(entries) ? json_incref(entries) : json_array();
    json_decref(root);
    free(text);
    return entries;
}

static int model_id_cache_save(const char *path, json_t *entries)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    struct cairn_err e = {0};
    if (slash && cairn_mkdir_p(dir, &e) != CAIRN_OK) return -1;
    while (json_array_size(entries) > MODEL_ID_CACHE_MAX_ENTRIES) json_array_remove(entries, 0);
    json_t *root = json_pack("{s:i, s:O}", "version", 1, "entries", entries);
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    int rc = text ? cairn_file_write_atomic(path, text, strlen(text), &e) : -1;
    free(text);
    json_decref(root);
    return rc;
}

int model_identity_compute(const struct safetensors_set *set, const char *cache_path,
                           uint8_t out[32], struct model_identity_stats *stats,
                           struct cairn_err *err)
{
    struct model_identity_stats local = {0};
    if (!stats) stats = &local;
    memset(stats, 0, sizeof(*stats));
    char cpath[PATH_MAX];
    if (!cache_path) cache_path = model_identity_cache_path(cpath, sizeof(cpath)) == 0 ? cpath : "";
    json_t *entries = *cache_path ? model_id_cache_load(cache_path) : NULL;
    struct model_id_key *key = malloc(sizeof(*key));
    uint8_t *digests = calloc((size_t)set->n_files + 1, 16);
    int rc = CAIRN_OK, dirty = 0;
    if (!key || !digests) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    stats->n_files = set->n_files;
    double t0 = cairn_now();
    for (int f = 0; f < set->n_files; f++) {
        const struct safetensors *st = &set->files[f];
        if ((rc = model_id_key_get(st->path, key, err))) goto cleanup;
        int hit = 0;
        size_t i;
        json_t *e;
        json_array_foreach(entries, i, e) {
            if (!model_id_entry_matches(e, key)) continue;
            const char *hex = json_string_value(json_object_get(e, "xxh3_128"));
            hit = hex && strlen(hex) == 32 && cairn_unhex(hex, digests + 16 * f, 16);
            if (!hit) {
                json_array_remove(entries, i); /* a bad entry: hash again, store a good one */
            }
            break;
        }
        if (hit && key->size == st->size) {
            stats->n_cached++;
            continue;
        }
        if ((rc = model_id_hash_file(st->base, st->size, digests + 16 * f, err))) goto cleanup;
        stats->bytes_hashed += st->size;
        if (entries) {
            char hex[33];
            cairn_hex(digests + 16 * f, 16, hex);
            json_t *ne = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:s}", "path", key->path, "size",
                                   (json_int_t)key->size, "ino", (json_int_t)key->ino, "dev",
                                   (json_int_t)key->dev, "mtime_ns", (json_int_t)key->mtime_ns,
                                   "ctime_ns", (json_int_t)key->ctime_ns, "xxh3_128", hex);
            for (size_t k = json_array_size(entries); k-- > 0;) { /* one entry per path */
                const char *p = json_string_value(json_object_get(json_array_get(entries, k), "path"));
                if (p && !strcmp(p, key->path)) json_array_remove(entries, k);
            }
            if (ne && json_array_append_new(entries, ne) == 0) dirty = 1;
        }
    }
    struct cairn_sha256 h;
    if (cairn_sha256_init(&h) != 0) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    cairn_sha256_update(&h, "cairn-identity-v2", 18);
    for (int i = 0; i < set->n_tensors; i++) {
        const struct safetensors_tensor *t = set->index[i];
        cairn_sha256_update(&h, t->name, strlen(t->name) + 1);
        cairn_sha256_update(&h, t->dtype_str, strlen(t->dtype_str) + 1);
        uint8_t dims[8 * SAFETENSORS_MAX_DIMS + 1];
        dims[0] = (uint8_t)t->n_dims;
        for (int d = 0; d < t->n_dims; d++)
            for (int b = 0; b < 8; b++) dims[1 + 8 * d + b] = (uint8_t)((uint64_t)t->shape[d] >> (8 * b));
        cairn_sha256_update(&h, dims, 1 + 8 * (size_t)t->n_dims);
    }
    for (int f = 0; f < set->n_files; f++) {
        uint8_t sz[8];
        for (int b = 0; b < 8; b++) sz[b] = (uint8_t)((uint64_t)set->files[f].size >> (8 * b));
        cairn_sha256_update(&h, sz, 8);
        cairn_sha256_update(&h, digests + 16 * f, 16);
    }
    cairn_sha256_final(&h, out);
    stats->seconds = cairn_now() - t0;
    LOG_INFO("model", "%s: identity of %d file(s), %d from the cache, %.2f GB hashed in %.2f s",
             set->dir, set->n_files, stats->n_cached, (double)stats->bytes_hashed / 1e9, stats->seconds);
    if (dirty && model_id_cache_save(cache_path, entries) != 0)
        LOG_WARN("model", "%s: cannot write the identity cache %s (the next load hashes again)",
                 set->dir, cache_path);
cleanup:
    json_decref(entries);
    free(key);
    free(digests);
    return rc;
}
