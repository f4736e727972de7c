/* libFuzzer target: the SSD tier's block-file header parser (kv/tier_file.h). Any input must
 * parse or fail cleanly; a parsed header must be self-consistent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv/tier_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t hsize = 0;
    if (kv_tier_header_size(data, size, &hsize) == CAIRN_OK && hsize <= size) {
        /* copy exactly the header so reads past it are caught by ASan */
        uint8_t *buf = malloc(hsize);
        if (!buf) return 0;
        memcpy(buf, data, hsize);
        struct kv_tier_header h;
        if (kv_tier_header_parse(buf, hsize, &h, NULL) == CAIRN_OK) {
            if (h.data_offset != hsize || h.data_bytes != 2 * h.kv_bytes + h.state_bytes ||
                h.n_tokens < 0 || h.n_tokens > KV_TIER_MAX_TOKENS)
                abort();
            int64_t sum = 0;
            for (int i = 0; i < h.n_tokens; i++) sum += h.tokens[i];
            if (sum == INT64_MIN) abort(); /* touches every token: ASan checks the bounds */
            kv_tier_header_free(&h);
        }
        free(buf);
    }
    if (size < 128) {
        char name[128];
        memcpy(name, data, size);
        name[size] = 0;
        uint8_t hash[32];
        kv_tier_file_name_hash(name, hash);
    }
    return 0;
}
