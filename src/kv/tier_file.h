/* The SSD tier's file format: one safetensors file per block.
 *
 *   [u64 LE N][N bytes JSON header, space-padded to a multiple of 8][data section]
 *   data section: K then V, each [n_kv_layers, block_size, n_kv_heads, head_dim] of the KV dtype,
 *   then "state" (U8 [state_bytes]) when the block carries a recurrent-state snapshot.
 *   __metadata__ (all strings): format "cairn-kv-block", version "1", signature (hex SHA-256 of
 *   the model signature), arch, n_layers, n_kv_layers, n_kv_heads, head_dim, kv_dtype,
 *   block_size, state_bytes, weights (hex identity), hash, parent (hex), n_tokens, tokens
 *   (comma-separated decimal ids), checksum (16 hex digits: xxh3 of the data section).
 *
 * The parser accepts only this canonical layout (K at 0, V after it, state after V) and checks
 * every offset, shape and length; anything else is CAIRN_ERR_FORMAT. It is fuzzed
 * (tests/fuzz/fuzz_tier_header.c). */
#ifndef CAIRN_KV_TIER_FILE_H
#define CAIRN_KV_TIER_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/tier_int.h"
#include "kv/tiers.h"

#define KV_TIER_FILE_VERSION 1
#define KV_TIER_HEADER_MAX (1u << 20) /* JSON header bytes accepted */
#define KV_TIER_MAX_TOKENS 65536

/* Hex SHA-256 of the canonical signature string (65 chars with NUL). */
void kv_tier_signature_hex(const struct kv_tier_signature *sig, char out[65]);

/* Builds the header for b (8-byte length + padded JSON). checksum is xxh3 of the data section.
 * Caller frees *out with free(). */
int kv_tier_header_build(const struct kv_tier_signature *sig, const char sig_hex[65],
                         const struct kv_tier_block *b, uint64_t checksum, char **out,
                         size_t *len, struct cairn_err *err);

struct kv_tier_header {
    int version;
    char signature[65];
    uint8_t hash[32];
    uint8_t parent[32];
    int n_tokens;
    int32_t *tokens;        /* [n_tokens], malloc'd; kv_tier_header_free */
    uint64_t checksum;
    enum dtype kv_dtype;
    int64_t kv_shape[4];    /* [n_kv_layers, block_size, n_kv_heads, head_dim] */
    uint64_t kv_bytes;      /* K bytes (= V bytes) */
    int has_state;
    uint64_t state_bytes;
    uint64_t data_offset;   /* 8 + N: where the data section starts in the file */
    uint64_t data_bytes;    /* 2 * kv_bytes + state_bytes */
};

/* From the first bytes of a file: the total header size 8 + N. Returns CAIRN_OK, or
 * CAIRN_ERR_FORMAT when len < 8 or N is 0 / over KV_TIER_HEADER_MAX. */
int kv_tier_header_size(const uint8_t *buf, size_t len, uint64_t *size);
/* Parses a whole header (buf holds at least 8 + N bytes). On success fills h (free with
 * kv_tier_header_free). Never reads past len. */
int kv_tier_header_parse(const uint8_t *buf, size_t len, struct kv_tier_header *h,
                         struct cairn_err *err);
void kv_tier_header_free(struct kv_tier_header *h);

/* Parses "<64 hex>.safetensors" (a file name, no folder). Returns 1 and the hash on success. */
int kv_tier_file_name_hash(const char *name, uint8_t hash[32]);

#endif
