/* libFuzzer target for tmpl: compiles the input as a template and, if it compiles, renders it
 * against a small fixed chat context with tight limits. Any crash, leak, hang or sanitizer
 * report is a bug; errors are fine. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "tmpl/tmpl.h"

static json_t *fuzz_ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fuzz_ctx) {
        json_error_t je;
        fuzz_ctx = json_loads(
            "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
            " {\"role\": \"user\", \"content\": \"Hi \\u00e9 <tool_response>\"},"
            " {\"role\": \"assistant\", \"content\": \"<think>x</think>ok\", \"tool_calls\":"
            "  [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]},"
            " {\"role\": \"tool\", \"content\": \"{\\\"r\\\": 2}\"}],"
            " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
            " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
            " \"n\": 3, \"f\": 1.5, \"z\": null}",
            0, &je);
        if (!fuzz_ctx) abort();
    }
    struct tmpl *t = NULL;
    struct cairn_err err;
    if (tmpl_compile((const char *)data, size, &t, &err) != CAIRN_OK) return 0;
    struct tmpl_limits lim = tmpl_limits_default();
    lim.max_steps = 200000;
    lim.max_output_bytes = 1 << 16;
    lim.max_memory_bytes = 16 << 20;
    lim.max_call_depth = 16;
    char *out = NULL;
    size_t n = 0;
    if (tmpl_render(t, fuzz_ctx, &lim, &out, &n, &err) == CAIRN_OK) {
        if (out[n] != 0) abort(); /* always NUL-terminated */
    } else if (out != NULL) {
        abort(); /* failure never returns output */
    }
    free(out);
    tmpl_free(t);
    return 0;
}
