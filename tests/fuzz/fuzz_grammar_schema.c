/* libFuzzer target for the JSON Schema compiler (grammar/grammar_schema.c): any JSON input must
 * compile or fail with an error message, never crash or leak; a compiled grammar is then walked
 * (fuzz_grammar_walk.h) with the input's bytes as the choices. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_grammar_walk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192) return 0;
    json_t *js = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!js) return 0;
    struct grammar *g = NULL;
    struct cairn_err err = {0};
    int rc = grammar_from_json_schema(js, &g, &err);
    CAIRN_ASSERT(rc == CAIRN_OK ? g != NULL : g == NULL && err.msg[0]);
    if (g) fz_walk(g, data, size);
    grammar_free(g);
    json_decref(js);
    return 0;
}
