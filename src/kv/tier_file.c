/* SSD tier file format: safetensors header writer and a strict, bounds-checked reader (jansson
 * for the JSON). Kept independent of model/safetensors.* on purpose: it accepts exactly what
 * tier_file.h describes. */
#include "kv/tier_file.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"

static const char *tier_dtype_st_name(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return "F32";
    case DTYPE_F16: return "F16";
    case DTYPE_BF16: return "BF16";
    case DTYPE_U8: return "U8";
    default: return NULL;
    }
}

static int tier_dtype_from_st(const char *s, enum dtype *t)
{
    if (strcmp(s, "F32") == 0) *t = DTYPE_F32;
    else if (strcmp(s, "F16") == 0) *t = DTYPE_F16;
    else if (strcmp(s, "BF16") == 0) *t = DTYPE_BF16;
    else if (strcmp(s, "U8") == 0) *t = DTYPE_U8;
    else return 0;
    return 1;
}

size_t kv_tier_signature_block_bytes(const struct kv_tier_signature *sig)
{
    return (size_t)sig->n_kv_layers * (size_t)sig->block_size * (size_t)sig->n_kv_heads *
           (size_t)sig->head_dim * dtype_size(sig->kv_dtype);
}

/* The model_type goes into JSON unescaped: keep only safe characters. */
static void tier_clean_arch(const char *in, char *out, size_t n)
{
    size_t j = 0;
    for (size_t i = 0; in[i] && i < 47 && j + 1 < n; i++) {
        char c = in[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || c == '.';
        out[j++] = ok ? c : '_';
    }
    out[j] = 0;
}

static int tier_signature_string(const struct kv_tier_signature *sig, char *out, size_t n)
{
    char arch[48], weights[65];
    tier_clean_arch(sig->arch, arch, sizeof(arch));
    cairn_hex(sig->identity, 32, weights);
    const char *dt = tier_dtype_st_name(sig->kv_dtype);
    return snprintf(out, n,
                    "\"arch\":\"%s\",\"n_layers\":\"%d\",\"n_kv_layers\":\"%d\","
                    "\"n_kv_heads\":\"%d\",\"head_dim\":\"%d\",\"kv_dtype\":\"%s\","
                    "\"block_size\":\"%d\",\"state_bytes\":\"%zu\",\"weights\":\"%s\"",
                    arch, sig->n_layers, sig->n_kv_layers, sig->n_kv_heads, sig->head_dim,
                    dt ? dt : "?", sig->block_size, sig->state_bytes, weights);
}

void kv_tier_signature_hex(const struct kv_tier_signature *sig, char out[65])
{
    char s[512];
    int n = tier_signature_string(sig, s, sizeof(s));
    uint8_t d[32];
    cairn_sha256(s, (size_t)n, d);
    cairn_hex(d, 32, out);
}

int kv_tier_header_build(const struct kv_tier_signature *sig, const char sig_hex[65],
                         const struct kv_tier_block *b, uint64_t checksum, char **out,
                         size_t *len, struct cairn_err *err)
{
    *out = NULL;
    *len = 0;
    const char *dt = tier_dtype_st_name(sig->kv_dtype);
    if (!dt) return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "kv tier: unsupported KV dtype");
    size_t cap = 2048 + (size_t)b->n_tokens * 12;
    char *buf = malloc(cap + 8);
    if (!buf) return cairn_err_set(err, CAIRN_ERR_NOMEM, "kv tier: out of memory");
    char *j = buf + 8;
    char sigs[512], hash[65], parent[65];
    tier_signature_string(sig, sigs, sizeof(sigs));
    cairn_hex(b->hash, 32, hash);
    cairn_hex(b->parent, 32, parent);
    size_t n = 0;
    n += (size_t)snprintf(j + n, cap - n,
                          "{\"__metadata__\":{\"format\":\"cairn-kv-block\",\"version\":\"%d\","
                          "\"signature\":\"%s\",%s,\"hash\":\"%s\",\"parent\":\"%s\","
                          "\"n_tokens\":\"%d\",\"checksum\":\"%016" PRIx64 "\",\"tokens\":\"",
                          KV_TIER_FILE_VERSION, sig_hex, sigs, hash, parent, b->n_tokens,
                          checksum);
    for (int i = 0; i < b->n_tokens && n < cap; i++)
        n += (size_t)snprintf(j + n, cap - n, i ? ",%" PRId32 : "%" PRId32, b->tokens[i]);
    uint64_t kb = b->block_bytes;
    if (n < cap)
        n += (size_t)snprintf(j + n, cap - n,
                              "\"},\"K\":{\"dtype\":\"%s\",\"shape\":[%d,%d,%d,%d],"
                              "\"data_offsets\":[0,%" PRIu64 "]},"
                              "\"V\":{\"dtype\":\"%s\",\"shape\":[%d,%d,%d,%d],"
                              "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                              dt, sig->n_kv_layers, sig->block_size, sig->n_kv_heads,
                              sig->head_dim, kb, dt, sig->n_kv_layers, sig->block_size,
                              sig->n_kv_heads, sig->head_dim, kb, 2 * kb);
    if (b->has_state && n < cap)
        n += (size_t)snprintf(j + n, cap - n,
                              ",\"state\":{\"dtype\":\"U8\",\"shape\":[%zu],"
                              "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                              b->state_bytes, 2 * kb, 2 * kb + b->state_bytes);
    if (n + 9 >= cap) {
        free(buf);
        return cairn_err_set(err, CAIRN_ERR_INTERNAL, "kv tier: header overflow");
    }
    j[n++] = '}';
    while (n % 8) j[n++] = ' ';
    uint64_t N = n;
    for (int i = 0; i < 8; i++) buf[i] = (char)(N >> (8 * i));
    *out = buf;
    *len = 8 + n;
    return CAIRN_OK;
}

int kv_tier_header_size(const uint8_t *buf, size_t len, uint64_t *size)
{
    if (len < 8) return CAIRN_ERR_FORMAT;
    uint64_t N = 0;
    for (int i = 0; i < 8; i++) N |= (uint64_t)buf[i] << (8 * i);
    if (N < 2 || N > KV_TIER_HEADER_MAX) return CAIRN_ERR_FORMAT;
    *size = 8 + N;
    return CAIRN_OK;
}

static const char *tier_meta_str(json_t *meta, const char *key)
{
    json_t *v = json_object_get(meta, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Strict decimal int in [lo, hi]. */
static int tier_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return 0;
    if (s[0] == '+' || s[0] == ' ' || (s[0] == '0' && s[1])) return 0;
    *out = v;
    return 1;
}

static int tier_parse_tokens(const char *s, int n, int32_t *out)
{
    const char *p = s;
    for (int i = 0; i < n; i++) {
        if (i) {
            if (*p != ',') return 0;
            p++;
        }
        int neg = *p == '-';
        if (neg) p++;
        if (*p < '0' || *p > '9') return 0;
        long long v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p - '0');
            if (++digits > 10) return 0;
            p++;
        }
        if (neg) v = -v;
        if (v < INT32_MIN || v > INT32_MAX) return 0;
        out[i] = (int32_t)v;
    }
    return *p == 0;
}

/* Reads one tensor entry: dtype, shape (n_dims 1..4, each >= 0) and data_offsets. */
static int tier_parse_tensor(json_t *t, enum dtype *dt, int64_t shape[4], int *n_dims,
                             uint64_t *begin, uint64_t *end)
{
    if (!json_is_object(t)) return 0;
    json_t *jd = json_object_get(t, "dtype"), *js = json_object_get(t, "shape"),
           *jo = json_object_get(t, "data_offsets");
    if (!json_is_string(jd) || !tier_dtype_from_st(json_string_value(jd), dt)) return 0;
    if (!json_is_array(js) || json_array_size(js) < 1 || json_array_size(js) > 4) return 0;
    if (!json_is_array(jo) || json_array_size(jo) != 2) return 0;
    *n_dims = (int)json_array_size(js);
    uint64_t elems = 1;
    for (int i = 0; i < *n_dims; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 ||
            json_integer_value(d) > (1ll << 40))
            return 0;
        shape[i] = json_integer_value(d);
        if (shape[i] && elems > (UINT64_MAX >> 8) / (uint64_t)shape[i]) return 0;
        elems *= (uint64_t)shape[i];
    }
    json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(e)) return 0;
    if (json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b)) return 0;
    *begin = (uint64_t)json_integer_value(b);
    *end = (uint64_t)json_integer_value(e);
    return *end - *begin == elems * dtype_size(*dt);
}

int kv_tier_header_parse(const uint8_t *buf, size_t len, struct kv_tier_header *h,
                         struct cairn_err *err)
{
    memset(h, 0, sizeof(*h));
    uint64_t size;
    if (kv_tier_header_size(buf, len, &size) != CAIRN_OK)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "bad header length");
    if (size > len) return cairn_err_set(err, CAIRN_ERR_FORMAT, "header truncated");
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)(size - 8), JSON_REJECT_DUPLICATES,
                              &jerr);
    if (!root) return cairn_err_set(err, CAIRN_ERR_FORMAT, "header JSON: %s", jerr.text);
    int rc = CAIRN_ERR_FORMAT;
    const char *what = "not an object";
    if (!json_is_object(root)) goto cleanup;
    json_t *meta = json_object_get(root, "__metadata__");
    what = "no __metadata__";
    if (!json_is_object(meta)) goto cleanup;
    const char *fmt = tier_meta_str(meta, "format");
    what = "format";
    if (!fmt || strcmp(fmt, "cairn-kv-block") != 0) goto cleanup;
    long long v;
    what = "version";
    if (!tier_parse_int(tier_meta_str(meta, "version"), 1, 1000000, &v)) goto cleanup;
    h->version = (int)v;
    const char *s = tier_meta_str(meta, "signature");
    what = "signature";
    if (!s || strlen(s) != 64) goto cleanup;
    uint8_t tmp[32];
    if (!cairn_unhex(s, tmp, 32)) goto cleanup;
    memcpy(h->signature, s, 65);
    s = tier_meta_str(meta, "hash");
    what = "hash";
    if (!s || strlen(s) != 64 || !cairn_unhex(s, h->hash, 32)) goto cleanup;
    s = tier_meta_str(meta, "parent");
    what = "parent";
    if (!s || strlen(s) != 64 || !cairn_unhex(s, h->parent, 32)) goto cleanup;
    s = tier_meta_str(meta, "checksum");
    what = "checksum";
    if (!s || strlen(s) != 16) goto cleanup;
    uint8_t ck[8];
    if (!cairn_unhex(s, ck, 8)) goto cleanup;
    for (int i = 0; i < 8; i++) h->checksum = h->checksum << 8 | ck[i];
    what = "n_tokens";
    if (!tier_parse_int(tier_meta_str(meta, "n_tokens"), 0, KV_TIER_MAX_TOKENS, &v)) goto cleanup;
    h->n_tokens = (int)v;
    s = tier_meta_str(meta, "tokens");
    what = "tokens";
    if (!s) goto cleanup;
    h->tokens = malloc((size_t)(h->n_tokens ? h->n_tokens : 1) * sizeof(int32_t));
    if (!h->tokens) {
        rc = CAIRN_ERR_NOMEM;
        goto cleanup;
    }
    if (!tier_parse_tokens(s, h->n_tokens, h->tokens)) goto cleanup;

    /* Tensors: exactly K, V and optionally state, in the canonical layout. */
    enum dtype dk, dv, ds;
    int64_t sk[4] = {0}, sv[4] = {0}, ss[4] = {0};
    int nk, nv, ns;
    uint64_t kb, ke, vb, ve, sb = 0, se = 0;
    what = "tensor K";
    if (!tier_parse_tensor(json_object_get(root, "K"), &dk, sk, &nk, &kb, &ke)) goto cleanup;
    what = "tensor V";
    if (!tier_parse_tensor(json_object_get(root, "V"), &dv, sv, &nv, &vb, &ve)) goto cleanup;
    what = "K/V layout";
    if (nk != 4 || nv != 4 || dk != dv || dk == DTYPE_U8 || memcmp(sk, sv, sizeof(sk)) != 0 ||
        kb != 0 || vb != ke || ve - vb != ke - kb)
        goto cleanup;
    json_t *st = json_object_get(root, "state");
    size_t n_keys = 3;
    if (st) {
        what = "tensor state";
        if (!tier_parse_tensor(st, &ds, ss, &ns, &sb, &se) || ds != DTYPE_U8 || ns != 1 ||
            sb != ve || se == sb)
            goto cleanup;
        n_keys = 4;
    }
    what = "unexpected keys";
    if (json_object_size(root) != n_keys) goto cleanup;
    h->kv_dtype = dk;
    memcpy(h->kv_shape, sk, sizeof(sk));
    h->kv_bytes = ke;
    h->has_state = st != NULL;
    h->state_bytes = st ? se - sb : 0;
    h->data_offset = size;
    h->data_bytes = st ? se : ve;
    rc = CAIRN_OK;
cleanup:
    json_decref(root);
    if (rc != CAIRN_OK) {
        free(h->tokens);
        h->tokens = NULL;
        if (rc == CAIRN_ERR_FORMAT) cairn_err_set(err, rc, "bad header: %s", what);
        else cairn_err_set(err, rc, "out of memory");
    }
    return rc;
}

void kv_tier_header_free(struct kv_tier_header *h)
{
    free(h->tokens);
    h->tokens = NULL;
}

int kv_tier_file_name_hash(const char *name, uint8_t hash[32])
{
    if (strlen(name) != 64 + 12 || strcmp(name + 64, ".safetensors") != 0) return 0;
    for (int i = 0; i < 64; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return cairn_unhex(name, hash, 32);
}
