/* SHA-256 through OpenSSL's EVP interface, xxh3 through libxxhash. */
#include "base/hash.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int cairn_sha256_init(struct cairn_sha256 *h)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) return -1;
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return -1;
    }
    h->ctx = ctx;
    return 0;
}

void cairn_sha256_update(struct cairn_sha256 *h, const void *data, size_t n)
{
    if (n) EVP_DigestUpdate((EVP_MD_CTX *)h->ctx, data, n);
}

void cairn_sha256_final(struct cairn_sha256 *h, uint8_t out[CAIRN_SHA256_BYTES])
{
    unsigned int len = 0;
    EVP_DigestFinal_ex((EVP_MD_CTX *)h->ctx, out, &len);
    EVP_MD_CTX_free((EVP_MD_CTX *)h->ctx);
    h->ctx = NULL;
}

void cairn_sha256(const void *data, size_t n, uint8_t out[CAIRN_SHA256_BYTES])
{
    unsigned int len = 0;
    if (EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) != 1) abort();
}

void cairn_hex(const uint8_t *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = 0;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int cairn_unhex(const char *hex, uint8_t *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hex_val(hex[2 * i]), lo = hi < 0 ? -1 : hex_val(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return 0;
        bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

uint64_t cairn_xxh3(const void *data, size_t n)
{
    return XXH3_64bits(data, n);
}

void cairn_xxh3_128(const void *data, size_t n, uint8_t out[CAIRN_XXH128_BYTES])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, n));
    memcpy(out, c.digest, CAIRN_XXH128_BYTES);
}
