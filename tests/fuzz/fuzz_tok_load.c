/* libFuzzer: random tokenizer.json content must load or fail cleanly (no crash, no leak); a
 * tokenizer that loads must encode and decode a fixed text and the input itself. */
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tok *t = NULL;
    struct cairn_err err = {0};
    if (tok_load_json((const char *)data, size, &t, &err)) {
        if (t || !err.msg[0]) abort();
        return 0;
    }
    static const char sample[] = "Hello, world! 123 caf\xc3\xa9 \xf0\x9f\x98\x80 <s> a-b--c\n";
    const char *texts[2] = {sample, (const char *)data};
    size_t lens[2] = {sizeof(sample) - 1, size < 4096 ? size : 4096};
    for (int k = 0; k < 2; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tok_encode(t, texts[k], lens[k], 1, &ids, &n, &err) == 0) {
            char *out = NULL;
            size_t len;
            if (tok_decode(t, ids, n, 0, &out, &len, &err) == 0) free(out);
            struct tok_stream *s = tok_stream_new(t, 0);
            const char *p;
            size_t pl;
            for (size_t i = 0; s && i < n; i++)
                tok_stream_feed(s, ids[i], &p, &pl);
            if (s) tok_stream_flush(s, &p, &pl);
            tok_stream_free(s);
            free(ids);
        }
    }
    tok_free(t);
    return 0;
}
