/* cairn render-template TOKENIZER_DIR: renders the folder's chat template the way
 * transformers' apply_chat_template(tokenize=False) does.
 * stdin: {"messages": [...], "tools": [...]|null, "add_generation_prompt": bool, "kwargs": {...}}
 * stdout: the rendered text, byte for byte. Exit 0 ok, 2 usage / bad input, 3 template error
 * (message on stderr), 1 other failures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "tmpl/tmpl.h"

#define RENDER_MAX_INPUT ((size_t)256 << 20)

static char *render_read_stdin(size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (len == cap) {
            if (cap >= RENDER_MAX_INPUT) {
                free(buf);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0) break;
    }
    *n = len;
    return buf;
}

int cmd_render_template(int argc, char **argv)
{
    if (argc != 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: cairn render-template TOKENIZER_DIR < request.json\n"
                "  request: {\"messages\": [...], \"tools\": [...]|null,\n"
                "            \"add_generation_prompt\": bool, \"kwargs\": {...}}\n"
                "  prints the rendered chat template; exit 3 on a template error\n");
        return argc == 2 ? 0 : 2;
    }
    struct cairn_err err = {0};
    struct tmpl *t = NULL;
    char *bos = NULL, *eos = NULL, *out = NULL, *in = NULL;
    json_t *req = NULL;
    int code = 1;
    size_t n_in = 0, n_out = 0;
    in = render_read_stdin(&n_in);
    if (!in) {
        fprintf(stderr, "cairn render-template: cannot read stdin\n");
        goto cleanup;
    }
    json_error_t je;
    req = json_loadb(in, n_in, 0, &je);
    if (!json_is_object(req)) {
        fprintf(stderr, "cairn render-template: bad request JSON: line %d: %s\n", je.line, je.text);
        code = 2;
        goto cleanup;
    }
    int rc = tmpl_load_from_dir(argv[1], &t, &bos, &eos, &err);
    if (rc) {
        fprintf(stderr, "cairn render-template: %s\n", err.msg);
        code = (rc == CAIRN_ERR_IO) ? 1 : 3;
        goto cleanup;
    }
    json_t *tools = json_object_get(req, "tools");
    json_t *kwargs = json_object_get(req, "kwargs");
    rc = tmpl_render_chat(t, json_object_get(req, "messages"), json_is_null(tools) ? NULL : tools,
                          json_is_true(json_object_get(req, "add_generation_prompt")), bos, eos,
                          json_is_object(kwargs) ? kwargs : NULL, &out, &n_out, &err);
    if (rc) {
        fprintf(stderr, "%s\n", err.msg);
        code = 3;
        goto cleanup;
    }
    if (fwrite(out, 1, n_out, stdout) != n_out || fflush(stdout) != 0) {
        fprintf(stderr, "cairn render-template: write failed\n");
        goto cleanup;
    }
    code = 0;
cleanup:
    free(in);
    free(out);
    free(bos);
    free(eos);
    tmpl_free(t);
    json_decref(req);
    return code;
}
