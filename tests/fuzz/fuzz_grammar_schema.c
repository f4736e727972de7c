/* libFuzzer target for the JSON Schema compiler (grammar/grammar_schema.c): any JSON input must
 * compile or fail with an error message, never crash or leak; a compiled grammar is then walked
 * (fuzz_grammar_walk.h) with the input's bytes as the choices; with an odd length, also as a
 * tool-call envelope (many calls, or lazy with a trigger as for tool_choice auto). */
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
    /* the same as tool calls: a many-call envelope, or a lazy one (tool_choice auto); which, and
     * the trigger's arm and flags, from the input's length (JSON text leaves its bytes little
     * freedom, its length a lot) */
    if (rc == CAIRN_OK && (size & 1)) {
        struct grammar_calls c = {.open = "<t>", .close = "</t>", .sep = ";?", .many = (size & 2) != 0,
                                  .max_calls = (int)(size >> 6 & 3)};
        struct grammar *gc = NULL;
        if (grammar_from_json_schema_calls(js, &c, &gc, &err) == CAIRN_OK) {
            unsigned flags = (size & 4 ? GRAMMAR_LAZY_REPEAT : 0) | (size & 8 ? GRAMMAR_LAZY_AT_START : 0);
            if ((size & 32) || grammar_set_trigger(gc, size & 16 ? "#" : NULL, "<t>", flags, &err) == CAIRN_OK)
                fz_walk(gc, data, size);
        }
        grammar_free(gc);
    }
    json_decref(js);
    return 0;
}
