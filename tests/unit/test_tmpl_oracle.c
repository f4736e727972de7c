/* tmpl oracle parity: every case of tests/data/oracle/templates/NAME.json (transformers'
 * apply_chat_template output) renders byte-exactly through tmpl_load_from_dir +
 * tmpl_render_chat, and every error case fails. Also the loader's file layouts. */
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "testlib.h"
#include "tmpl/tmpl.h"

static const char *const oracle_names[] = {"qwen3", "llama3", "llama3_1", "llama2", "gemma3", "gptoss", "deepseek_v3"};

static void test_oracle(const char *name, int *n_ok, int *n_total)
{
    char path[1024], dir[1024], rel[256];
    snprintf(rel, sizeof(rel), "tests/data/oracle/templates/%s.json", name);
    json_error_t je;
    json_t *root = json_load_file(test_src_path(rel, path, sizeof(path)), 0, &je);
    CHECK_MSG(root != NULL, "cannot load %s: %s", path, je.text);
    if (!root) return;
    snprintf(rel, sizeof(rel), "tests/data/tmpl/tokenizers/%s", name);
    test_src_path(rel, dir, sizeof(dir));
    struct tmpl *t = NULL;
    char *bos = NULL, *eos = NULL;
    struct cairn_err err = {0};
    int load_rc = tmpl_load_from_dir(dir, &t, &bos, &eos, &err);
    /* bos/eos in the oracle file: string, null, or an AddedToken object */
    json_t *jb = json_object_get(root, "bos_token"), *jeo = json_object_get(root, "eos_token");
    if (json_is_object(jb)) jb = json_object_get(jb, "content");
    if (json_is_object(jeo)) jeo = json_object_get(jeo, "content");
    if (load_rc == 0) {
        CHECK_MSG(json_is_string(jb) ? bos && !strcmp(bos, json_string_value(jb)) : bos == NULL, "%s bos", name);
        CHECK_MSG(json_is_string(jeo) ? eos && !strcmp(eos, json_string_value(jeo)) : eos == NULL, "%s eos", name);
    }
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        (*n_total)++;
        const char *conv = json_string_value(json_object_get(c, "conv"));
        json_t *exp = json_object_get(c, "rendered");
        if (load_rc != 0) {
            /* no template: transformers raised, so every case must be an error case */
            CHECK_MSG(!exp && json_object_get(c, "error"), "%s/%s: load failed (%s) but oracle rendered",
                      name, conv, err.msg);
            if (!exp) (*n_ok)++;
            continue;
        }
        json_t *tools = json_object_get(c, "tools");
        char *out = NULL;
        size_t n = 0;
        struct cairn_err rerr = {0};
        int rc = tmpl_render_chat(t, json_object_get(c, "messages"), json_is_null(tools) ? NULL : tools,
                                  json_is_true(json_object_get(c, "add_generation_prompt")), bos, eos,
                                  json_object_get(c, "kwargs"), &out, &n, &rerr);
        if (exp) {
            int ok = rc == 0 && n == json_string_length(exp) && !memcmp(out, json_string_value(exp), n);
            CHECK_MSG(ok, "%s/%s agp=%d: rc %d (%s)\n  got:      [%s]\n  expected: [%s]", name, conv,
                      json_is_true(json_object_get(c, "add_generation_prompt")), rc, rerr.msg,
                      out ? out : "", json_string_value(exp));
            *n_ok += ok;
        } else {
            CHECK_MSG(rc != 0, "%s/%s should fail: %s", name, conv,
                      json_string_value(json_object_get(c, "error")));
            /* raise_exception messages come through unchanged */
            const char *em = json_string_value(json_object_get(c, "error"));
            if (rc && em && strstr(em, "Conversation roles")) CHECK_EQ_STR(rerr.msg, em);
            *n_ok += rc != 0;
        }
        free(out);
    }
    free(bos);
    free(eos);
    tmpl_free(t);
    json_decref(root);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void check_dir(const char *dir, const char *expect_out, const char *expect_bos)
{
    struct tmpl *t = NULL;
    char *bos = NULL, *eos = NULL, *out = NULL;
    struct cairn_err err = {0};
    int rc = tmpl_load_from_dir(dir, &t, &bos, &eos, &err);
    CHECK_MSG(rc == 0, "load %s: %s", dir, err.msg);
    if (rc) return;
    json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "x");
    size_t n;
    CHECK_EQ_INT(tmpl_render_chat(t, msgs, NULL, 0, bos, eos, NULL, &out, &n, &err), 0);
    if (out) CHECK_EQ_STR(out, expect_out);
    if (expect_bos) CHECK(bos && !strcmp(bos, expect_bos));
    else CHECK(bos == NULL);
    free(out);
    free(bos);
    free(eos);
    json_decref(msgs);
    tmpl_free(t);
}

static void test_loader(void)
{
    char dir[] = "/tmp/cairn_tmpl_load_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    struct cairn_err err = {0};
    struct tmpl *t = NULL;
    /* nothing there */
    CHECK_EQ_INT(tmpl_load_from_dir(dir, &t, NULL, NULL, &err), CAIRN_ERR_NOT_FOUND);
    /* chat_template.jinja beside a config without a template; bos as AddedToken object */
    write_file(dir, "tokenizer_config.json", "{\"bos_token\": {\"content\": \"<B>\"}, \"model_max_length\": 1000000000000000019884624838656}");
    write_file(dir, "chat_template.jinja", "J{{ bos_token }}{{ messages[0].content }}\n");
    check_dir(dir, "J<B>x", "<B>");
    /* .jinja wins over the config's template */
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"CONFIG\", \"bos_token\": \"<B>\"}");
    check_dir(dir, "J<B>x", "<B>");
    write_file(dir, "tokenizer_config.json", "{\"bos_token\": {\"content\": \"<B>\"}}");
    /* chat_template.json when there is no .jinja */
    char p[1100];
    snprintf(p, sizeof(p), "%s/chat_template.jinja", dir);
    unlink(p);
    write_file(dir, "chat_template.json", "{\"chat_template\": \"S{{ messages|length }}\"}");
    check_dir(dir, "S1", "<B>");
    /* as in transformers, the file wins over the config's template too */
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"CONFIG\", \"bos_token\": \"<B>\"}");
    check_dir(dir, "S1", "<B>");
    snprintf(p, sizeof(p), "%s/chat_template.json", dir);
    unlink(p);
    check_dir(dir, "CONFIG", "<B>");
    /* named list in tokenizer_config.json: "default" wins over first */
    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D{{ eos_token }}\"}], \"eos_token\": \"<E>\"}");
    check_dir(dir, "D<E>", NULL);
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"a\", \"template\": \"A\"}, {\"name\": \"b\", \"template\": \"B\"}]}");
    check_dir(dir, "A", NULL);
    /* broken config / template */
    write_file(dir, "tokenizer_config.json", "{not json");
    CHECK_EQ_INT(tmpl_load_from_dir(dir, &t, NULL, NULL, &err), CAIRN_ERR_FORMAT);
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"{% if %}\"}");
    CHECK(tmpl_load_from_dir(dir, &t, NULL, NULL, &err) != 0 && t == NULL);
    snprintf(p, sizeof(p), "%s/tokenizer_config.json", dir);
    unlink(p);
    rmdir(dir);
}

int main(void)
{
    int n_ok = 0, n_total = 0;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(oracle_names); i++) test_oracle(oracle_names[i], &n_ok, &n_total);
    printf("oracle template cases: %d/%d match\n", n_ok, n_total);
    CHECK_EQ_INT(n_total, 70);
    test_loader();
    return test_summary("test_tmpl_oracle");
}
