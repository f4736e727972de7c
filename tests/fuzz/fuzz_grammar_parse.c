/* libFuzzer target for the regex and GBNF compilers (grammar/grammar_regex.c, grammar_gbnf.c).
 * Byte 0 picks the language (even: regex, odd: GBNF), the rest is the text; a compiled grammar is
 * walked (fuzz_grammar_walk.h) with the text's bytes as the choices. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_grammar_walk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096) return 0;
    const char *text = (const char *)data + 1;
    struct grammar *g = NULL;
    struct cairn_err err = {0};
    int rc = data[0] & 1 ? grammar_from_gbnf(text, size - 1, &g, &err) : grammar_from_regex(text, size - 1, &g, &err);
    CAIRN_ASSERT(rc == CAIRN_OK ? g != NULL : g == NULL && err.msg[0]);
    if (g) fz_walk(g, data + 1, size - 1);
    grammar_free(g);
    return 0;
}
