/* libFuzzer target: config.json text through model_config_parse (first half of the input) with
 * an optional generation_config.json (after a NUL byte). When it parses, the RoPE table and
 * per-module quantization lookups run too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    size_t n = strlen(text);
    const char *gen = n < size ? text + n + 1 : NULL;
    struct model_config c;
    struct cairn_err err;
    if (model_config_parse(text, gen, "fuzz", &c, &err) == CAIRN_OK) {
        float *inv = malloc(sizeof(float) * (size_t)(c.rot_dim / 2 + 1));
        if (inv) model_config_rope_inv_freq(&c, inv);
        free(inv);
        int bits, gs;
        model_config_quant_for(&c, "model.layers.0.mlp.down_proj", &bits, &gs);
        for (int i = 0; i < c.n_layers; i++)
            if (c.layer_kinds[i] != MODEL_LAYER_ATTN && c.layer_kinds[i] != MODEL_LAYER_LINEAR_ATTN)
                abort();
        model_config_free(&c);
    }
    free(text);
    return 0;
}
