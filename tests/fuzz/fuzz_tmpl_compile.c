/* libFuzzer target for tmpl: compiles the input as a template and, if it compiles, renders it
 * against a small fixed chat context with tight limits; when that works, also as a chat with
 * data spans (tmpl_render_chat_spans), which must give the text of tmpl_render_chat and sorted,
 * disjoint, non-empty spans inside it. Any crash, leak, hang or sanitizer report is a bug;
 * errors are fine. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
        json_t *m = json_object_get(fuzz_ctx, "messages"), *tl = json_object_get(fuzz_ctx, "tools");
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0, n_sp = 0;
        struct cairn_span *sp = NULL;
        int ra = tmpl_render_chat(t, m, tl, 1, "<s>", "</s>", NULL, &a, &na, &err);
        int rb = tmpl_render_chat_spans(t, m, tl, 1, "<s>", "</s>", NULL, &b, &nb, &sp, &n_sp, &err);
        if (ra != rb || (ra == 0 && (na != nb || memcmp(a, b, na)))) abort();
        for (size_t i = 0; i < n_sp; i++)
            if (!sp[i].len || sp[i].off + sp[i].len > nb ||
                (i && sp[i - 1].off + sp[i - 1].len >= sp[i].off))
                abort();
        free(a);
        free(b);
        free(sp);
    } else if (out != NULL) {
        abort(); /* failure never returns output */
    }
    free(out);
    tmpl_free(t);
    return 0;
}
