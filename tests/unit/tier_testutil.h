/* Synthetic blocks for the tier tests: block i has a deterministic hash, tokens, K, V and
 * (optionally) state, so any payload a tier returns can be checked against what was written. */
#ifndef CAIRN_TESTS_TIER_TESTUTIL_H
#define CAIRN_TESTS_TIER_TESTUTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/hash.h"
#include "kv/tiers.h"

struct tt_block {
    uint8_t hash[32];
    uint8_t parent[32];
    int32_t tokens[64];
    uint8_t *k, *v, *state;
    size_t block_bytes, state_bytes;
    struct kv_block_desc d;
};

static inline void tt_sig(struct kv_tier_signature *s, size_t state_bytes)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->arch, sizeof(s->arch), "qwen3");
    s->n_layers = 3;
    s->n_kv_layers = 2;
    s->n_kv_heads = 2;
    s->head_dim = 8;
    s->kv_dtype = DTYPE_F32;
    s->block_size = 4;
    s->state_bytes = state_bytes;
    cairn_sha256("weights", 7, s->identity);
}

static inline uint64_t tt_rng(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Fills block i for sig (state only when sig->state_bytes and with_state). */
static inline void tt_block_make(struct tt_block *b, const struct kv_tier_signature *sig, int i,
                                 int with_state)
{
    memset(b, 0, sizeof(*b));
    char name[32];
    snprintf(name, sizeof(name), "block-%d", i);
    cairn_sha256(name, strlen(name), b->hash);
    if (i > 0) {
        snprintf(name, sizeof(name), "block-%d", i - 1);
        cairn_sha256(name, strlen(name), b->parent);
    }
    for (int j = 0; j < sig->block_size; j++) b->tokens[j] = i * 1000 + j;
    b->block_bytes = kv_tier_signature_block_bytes(sig);
    b->k = malloc(b->block_bytes);
    b->v = malloc(b->block_bytes);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    for (size_t j = 0; j < b->block_bytes; j++) {
        b->k[j] = (uint8_t)tt_rng(&x);
        b->v[j] = (uint8_t)tt_rng(&x);
    }
    if (with_state && sig->state_bytes) {
        b->state_bytes = sig->state_bytes;
        b->state = malloc(b->state_bytes);
        for (size_t j = 0; j < b->state_bytes; j++) b->state[j] = (uint8_t)tt_rng(&x);
    }
    memcpy(b->d.hash, b->hash, 32);
    memcpy(b->d.parent, b->parent, 32);
    b->d.n_tokens = sig->block_size;
    b->d.tokens = b->tokens;
    b->d.k = b->k;
    b->d.v = b->v;
    b->d.block_bytes = b->block_bytes;
    b->d.state = b->state;
    b->d.state_bytes = b->state_bytes;
}

static inline void tt_block_free(struct tt_block *b)
{
    free(b->k);
    free(b->v);
    free(b->state);
}

/* Looks block i up through ops and checks the payload. Returns 1 hit+equal, 0 miss,
 * -1 hit with a WRONG payload (must never happen). */
static inline int tt_lookup_check(const struct kv_tier_ops *ops,
                                  const struct kv_tier_signature *sig, int i, int *has_state)
{
    struct tt_block b;
    tt_block_make(&b, sig, i, 1);
    uint8_t *k = malloc(b.block_bytes), *v = malloc(b.block_bytes);
    uint8_t *st = sig->state_bytes ? malloc(sig->state_bytes) : NULL;
    int hs = 0;
    int hit = ops->lookup(ops->ctx, b.hash, b.tokens, sig->block_size, k, v, b.block_bytes, st,
                          sig->state_bytes, &hs);
    int res = 0;
    if (hit) {
        res = memcmp(k, b.k, b.block_bytes) == 0 && memcmp(v, b.v, b.block_bytes) == 0 ? 1 : -1;
        if (res == 1 && hs && memcmp(st, b.state, sig->state_bytes) != 0) res = -1;
    }
    if (has_state) *has_state = hs;
    free(k);
    free(v);
    free(st);
    tt_block_free(&b);
    return res;
}

static inline void tt_evict(const struct kv_tier_ops *ops, const struct kv_tier_signature *sig,
                            int i, int with_state)
{
    struct tt_block b;
    tt_block_make(&b, sig, i, with_state);
    ops->on_evict(ops->ctx, &b.d);
    tt_block_free(&b);
}

static inline void tt_path(const char *dir, const struct kv_tier_signature *sig, int i,
                           char *out, size_t n)
{
    struct tt_block b;
    tt_block_make(&b, sig, i, 0);
    char hex[65];
    cairn_hex(b.hash, 32, hex);
    snprintf(out, n, "%s/%.2s/%s.safetensors", dir, hex, hex);
    tt_block_free(&b);
}

static inline void tt_rm_rf(const char *path)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "rm -rf %s failed\n", path);
}

static inline void tt_tmpdir(char *out, size_t n, const char *tag)
{
    snprintf(out, n, "/tmp/cairn-%s-XXXXXX", tag);
    if (!mkdtemp(out)) abort();
}

/* Counts files under dir (recursively) whose name contains `part` (NULL = all). */
static inline int tt_count_files(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char p[4200];
        if (snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) >= (int)sizeof(p)) continue;
        struct stat st;
        if (stat(p, &st) != 0) continue;
        if (S_ISDIR(st.st_mode))
            n += tt_count_files(p, part);
        else if (!part || strstr(de->d_name, part))
            n++;
    }
    closedir(d);
    return n;
}

/* Counts files under dir (recursively) whose name ends with `suffix`. */
static inline int tt_count_suffix(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    size_t ls = strlen(suffix);
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char p[4200];
        if (snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) >= (int)sizeof(p)) continue;
        struct stat st;
        if (stat(p, &st) != 0) continue;
        size_t ln = strlen(de->d_name);
        if (S_ISDIR(st.st_mode))
            n += tt_count_suffix(p, suffix);
        else if (ln >= ls && strcmp(de->d_name + ln - ls, suffix) == 0)
            n++;
    }
    closedir(d);
    return n;
}

#endif
