/* tmpl loader: finds a tokenizer folder's chat template and its bos/eos token strings. The one
 * reader of chat templates in cairn (tok does not read them), with transformers' precedence: a
 * template file (chat_template.jinja, else the legacy chat_template.json) wins over
 * tokenizer_config.json's "chat_template". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "tmpl/tmpl.h"

#define TMPL_LOAD_MAX_CONFIG ((size_t)64 << 20)

/* "tok" or {"content": "tok"} -> malloc'd copy, or NULL */
static char *tmpl_load_token(json_t *v)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return NULL;
    return strdup(json_string_value(v));
}

/* chat_template: a string, or [{name, template}] -> "default" or the first. Borrowed. */
static const char *tmpl_load_pick(json_t *ct, size_t *len)
{
    if (json_is_string(ct)) {
        *len = json_string_length(ct);
        return json_string_value(ct);
    }
    if (!json_is_array(ct) || json_array_size(ct) == 0) return NULL;
    json_t *pick = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(ct, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && !strcmp(name, "default")) {
            pick = e;
            break;
        }
    }
    if (!pick) pick = json_array_get(ct, 0);
    json_t *t = json_object_get(pick, "template");
    if (!json_is_string(t)) return NULL;
    *len = json_string_length(t);
    return json_string_value(t);
}

int tmpl_load_from_dir(const char *dir, struct tmpl **out, char **bos, char **eos,
                       struct cairn_err *err)
{
    char path[4096];
    json_t *cfg = NULL, *ctj = NULL;
    char *text = NULL;
    const char *src = NULL;
    size_t src_len = 0;
    int rc;
    *out = NULL;
    if (bos) *bos = NULL;
    if (eos) *eos = NULL;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    if (cairn_file_exists(path)) {
        json_error_t je;
        /* INT_AS_REAL: configs carry ints beyond int64 (model_max_length = 1e30) */
        cfg = json_load_file(path, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
        if (!json_is_object(cfg)) {
            rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
            goto cleanup;
        }
        if (bos) *bos = tmpl_load_token(json_object_get(cfg, "bos_token"));
        if (eos) *eos = tmpl_load_token(json_object_get(cfg, "eos_token"));
    }
    snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
    if (cairn_file_exists(path)) {
        rc = cairn_file_read_all(path, TMPL_MAX_SOURCE_BYTES, &text, &src_len, err);
        if (rc) goto cleanup;
        src = text;
    } else {
        snprintf(path, sizeof(path), "%s/chat_template.json", dir);
        if (cairn_file_exists(path)) {
            json_error_t je;
            ctj = json_load_file(path, JSON_DECODE_ANY, &je);
            if (!ctj) {
                rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
                goto cleanup;
            }
            src = tmpl_load_pick(json_is_object(ctj) ? json_object_get(ctj, "chat_template") : ctj,
                                 &src_len);
        }
    }
    if (!src && cfg) src = tmpl_load_pick(json_object_get(cfg, "chat_template"), &src_len);
    if (!src) {
        rc = cairn_err_set(err, CAIRN_ERR_NOT_FOUND,
                           "Cannot use chat template functions because tokenizer.chat_template is "
                           "not set (no chat template in %s)", dir);
        goto cleanup;
    }
    rc = tmpl_compile(src, src_len, out, err);
    if (rc) cairn_err_prefix(err, "%s: chat template", dir);
cleanup:
    if (rc) {
        if (bos) {
            free(*bos);
            *bos = NULL;
        }
        if (eos) {
            free(*eos);
            *eos = NULL;
        }
    }
    free(text);
    json_decref(cfg);
    json_decref(ctj);
    return rc;
}
