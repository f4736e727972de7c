/* Hashing: SHA-256 (libcrypto) for cache keys and identities, xxh3 (libxxhash) for checksums. */
#ifndef CAIRN_BASE_HASH_H
#define CAIRN_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CAIRN_SHA256_BYTES 32

struct cairn_sha256 {
    void *ctx; /* EVP_MD_CTX */
};

/* Incremental SHA-256. init returns 0 on success. final frees the context. */
int cairn_sha256_init(struct cairn_sha256 *h);
void cairn_sha256_update(struct cairn_sha256 *h, const void *data, size_t n);
void cairn_sha256_final(struct cairn_sha256 *h, uint8_t out[CAIRN_SHA256_BYTES]);
void cairn_sha256(const void *data, size_t n, uint8_t out[CAIRN_SHA256_BYTES]);

/* Lower-case hex of n bytes into out (2n+1 chars). */
void cairn_hex(const uint8_t *bytes, size_t n, char *out);
/* Parses 2n hex chars into bytes; returns 0 on error. */
int cairn_unhex(const char *hex, uint8_t *bytes, size_t n);

uint64_t cairn_xxh3(const void *data, size_t n);
/* XXH3-128 of data, in canonical (big-endian) byte order. */
#define CAIRN_XXH128_BYTES 16
void cairn_xxh3_128(const void *data, size_t n, uint8_t out[CAIRN_XXH128_BYTES]);

#endif
