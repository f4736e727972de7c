/* libFuzzer target: a whole safetensors file (header + data) through safetensors_parse. When it
 * parses, every tensor's bytes are read (ASan catches any view outside the buffer) and looked
 * up by name. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy, so reads past `size` hit the ASan redzone. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct safetensors st;
    struct cairn_err err;
    if (safetensors_parse(buf, size, "fuzz", &st, &err) == CAIRN_OK) {
        volatile uint8_t acc = 0;
        for (int i = 0; i < st.n_tensors; i++) {
            const struct safetensors_tensor *t = &st.tensors[i];
            for (uint64_t j = 0; j < t->n_bytes; j++)
                acc ^= t->data[j];
            if (safetensors_find(&st, t->name) != t) abort();
        }
        for (int i = 0; i < st.n_meta; i++)
            if (!safetensors_meta_get(&st, st.meta[i].key)) abort();
        (void)acc;
        safetensors_free(&st);
    }
    free(buf);
    return 0;
}
