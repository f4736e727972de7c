/* Model identity over every byte (see model_identity.h).
 *
 * identity = SHA-256("cairn-identity-v2", for each tensor in name order: name, dtype, shape and
 *                    its data digest), so it names the weights, not how they are sharded
 * data digest = XXH3-128(byte count, XXH3-128 of each 64 MiB chunk of the tensor in order).
 * The cache keeps each file's data digests by tensor name; the SHA-256 step is cheap. */
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

/* The chunks of all tensors of one file, hashed by up to MODEL_ID_MAX_THREADS threads. */
struct model_id_chunk {
    const uint8_t *p;
    size_t n;
};

struct model_id_job {
    struct model_id_chunk *chunks;
    size_t n_chunks;
    uint8_t *digests; /* [n_chunks][16] */
    atomic_size_t next;
};

static void *model_id_worker(void *arg)
{
    struct model_id_job *j = arg;
    for (;;) {
        size_t c = atomic_fetch_add(&j->next, 1);
        if (c >= j->n_chunks) break;
        cairn_xxh3_128(j->chunks[c].p, j->chunks[c].n, j->digests + 16 * c);
    }
    return NULL;
}

static size_t model_id_n_chunks(uint64_t n) { return n ? (size_t)((n + MODEL_ID_CHUNK - 1) / MODEL_ID_CHUNK) : 0; }

/* Data digests of every tensor of st into out[i * 16] (st->tensors order). */
static int model_id_hash_file(const struct safetensors *st, uint8_t *out, struct cairn_err *err)
{
    struct model_id_job j = {0};
    atomic_init(&j.next, 0);
    for (int i = 0; i < st->n_tensors; i++) j.n_chunks += model_id_n_chunks(st->tensors[i].n_bytes);
    j.chunks = malloc((j.n_chunks + 1) * sizeof(*j.chunks));
    j.digests = malloc(16 * (j.n_chunks + 1));
    uint8_t *cat = malloc(8 + 16 * (j.n_chunks + 1));
    if (!j.chunks || !j.digests || !cat) {
        free(j.chunks);
        free(j.digests);
        free(cat);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    size_t k = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct safetensors_tensor *t = &st->tensors[i];
        for (uint64_t off = 0; off < t->n_bytes; off += MODEL_ID_CHUNK, k++) {
            j.chunks[k].p = t->data + off;
            j.chunks[k].n = (size_t)(t->n_bytes - off < MODEL_ID_CHUNK ? t->n_bytes - off : MODEL_ID_CHUNK);
        }
    }
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
    /* per tensor: byte count, then its chunk digests */
    k = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        uint64_t n = st->tensors[i].n_bytes;
        size_t nc = model_id_n_chunks(n);
        for (int b = 0; b < 8; b++) cat[b] = (uint8_t)(n >> (8 * b));
        memcpy(cat + 8, j.digests + 16 * k, 16 * nc);
        cairn_xxh3_128(cat, 8 + 16 * nc, out + 16 * i);
        k += nc;
    }
    free(j.chunks);
    free(j.digests);
    free(cat);
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
    /* data digests of all tensors, file after file in st->tensors order; base[f] = file f's first */
    size_t n_all = 0;
    for (int f = 0; f < set->n_files; f++) n_all += (size_t)set->files[f].n_tensors;
    uint8_t *digests = calloc(n_all + 1, 16);
    size_t *base = calloc((size_t)set->n_files + 1, sizeof(size_t));
    char *hex = malloc(32 * n_all + 1);
    int rc = CAIRN_OK, dirty = 0;
    if (!key || !digests || !base || !hex) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    stats->n_files = set->n_files;
    double t0 = cairn_now();
    for (int f = 0; f < set->n_files; f++) {
        const struct safetensors *st = &set->files[f];
        uint8_t *fd = digests + 16 * base[f];
        size_t nt = (size_t)st->n_tensors;
        base[f + 1] = base[f] + nt;
        if ((rc = model_id_key_get(st->path, key, err))) goto cleanup;
        int hit = 0;
        size_t i;
        json_t *e;
        json_array_foreach(entries, i, e) {
            if (!model_id_entry_matches(e, key)) continue;
            const char *h = json_string_value(json_object_get(e, "xxh3_128"));
            hit = h && strlen(h) == 32 * nt && cairn_unhex(h, fd, 16 * nt);
            if (!hit) json_array_remove(entries, i); /* a bad entry: hash again, store a good one */
            break;
        }
        if (hit) {
            stats->n_cached++;
            continue;
        }
        if ((rc = model_id_hash_file(st, fd, err))) goto cleanup;
        stats->bytes_hashed += st->size;
        if (entries) {
            cairn_hex(fd, 16 * nt, hex);
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
        size_t k = base[t->file] + (size_t)(t - set->files[t->file].tensors);
        cairn_sha256_update(&h, digests + 16 * k, 16);
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
    free(base);
    free(hex);
    return rc;
}
