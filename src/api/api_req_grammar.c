/* api_req_grammar (api_req.h): the grammar that enforces a parsed request's output constraint
 * (JSON schema, forced or lazy tool calls, regex, GBNF), built when the call is prepared, once the
 * template's tool-call form and whether the prompt ends inside <think> are known. */
#include "api/api_req_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_out.h"
#include "base/status.h"

/* The body schema of one forced call of any of `tools`: {"name": const, ARGS: parameters}; the
 * tools' $defs / definitions move to the root so their local $refs still resolve. */
static json_t *api_req_tools_schema(json_t *tools, const char *args_key)
{
    json_t *any = json_array(), *root = json_object(), *defs = json_object();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        json_t *params = json_object_get(fn, "parameters");
        json_t *p = json_is_object(params) ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
        const char *dk[] = {"$defs", "definitions"};
        for (int k = 0; k < 2; k++) {
            json_t *d = json_object_get(p, dk[k]);
            if (json_is_object(d)) {
                json_t *into = json_object_get(root, dk[k]);
                if (!into) {
                    into = k == 0 ? defs : json_object();
                    json_object_set(root, dk[k], into);
                    if (k) json_decref(into);
                }
                json_object_update(into, d);
                json_object_del(p, dk[k]);
            }
        }
        json_t *body = json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s,s], s:b}", "type", "object", "properties", "name", "const",
                                 json_object_get(fn, "name"), args_key, p, "required", "name", args_key,
                                 "additionalProperties", 0);
        json_array_append_new(any, body);
    }
    json_object_set_new(root, "anyOf", any);
    json_decref(defs);
    return root;
}

/* tool_choice auto: the tools with parameters that cannot be enforced get "any object" ones,
 * unless strict (a 400). A new array, or NULL with e filled. */
static json_t *api_req_tools_lenient(json_t *tools, struct api_req_err *e)
{
    json_t *out = json_deep_copy(tools);
    size_t i;
    json_t *t;
    json_array_foreach(out, i, t) {
        json_t *fn = json_object_get(t, "function");
        json_t *params = json_object_get(fn, "parameters");
        if (!json_is_object(params)) continue;
        struct grammar *g = NULL;
        struct cairn_err err = {0};
        int rc = grammar_from_json_schema(params, &g, &err);
        grammar_free(g);
        if (rc == CAIRN_OK) continue;
        if (json_is_true(json_object_get(fn, "strict")) || rc == CAIRN_ERR_NOMEM) {
            api_req_fail(e, "tools", "'tools[%zu]' (strict) cannot be enforced: %s", i, err.msg);
            json_decref(out);
            return NULL;
        }
        json_object_set_new(fn, "parameters", json_pack("{s:s}", "type", "object"));
    }
    return out;
}

int api_req_grammar(const struct api_req *r, int in_think, enum api_tool_form form, struct grammar **out,
                    struct api_req_err *e)
{
    *out = NULL;
    if (!r->grammar_kind) return 0;
    struct cairn_err err = {0};
    const char *think = in_think ? "</think>\n\n" : "";
    int rc = 0, json_form = form == API_TOOL_FORM_JSON;
    switch (r->grammar_kind) {
    case API_GRAMMAR_NONE: break;
    case API_GRAMMAR_SCHEMA: rc = grammar_from_json_schema_wrapped(r->grammar_schema, think, NULL, out, &err); break;
    case API_GRAMMAR_TOOLS: {
        /* Hermes calls follow each other on new lines, Llama-3's JSON ones after ';' */
        json_t *schema = api_req_tools_schema(r->tools, json_form ? "parameters" : "arguments");
        struct grammar_calls calls = {.lead = think, .open = json_form ? "" : "<tool_call>\n",
                                      .close = json_form ? "" : "\n</tool_call>", .sep = json_form ? "; ?" : "\n?",
                                      .many = r->parallel_tools, .max_calls = json_form ? API_OUT_MAX_JSON_CALLS : 0};
        rc = grammar_from_json_schema_calls(schema, &calls, out, &err);
        json_decref(schema);
        break;
    }
    case API_GRAMMAR_TOOLS_AUTO: {
        json_t *tools = api_req_tools_lenient(r->tools, e);
        if (!tools) return -1;
        json_t *schema = api_req_tools_schema(tools, json_form ? "parameters" : "arguments");
        json_decref(tools);
        /* Hermes: a call starts at "<tool_call>" anywhere in the text and may repeat; Llama-3's
         * JSON call is the whole output, so only a '{' that comes first starts one (then more
         * after ';') */
        struct grammar_calls calls = {.open = json_form ? "" : "<tool_call>\n", .close = json_form ? "" : "\n</tool_call>",
                                      .sep = "; ?", .many = json_form && r->parallel_tools, .max_calls = API_OUT_MAX_JSON_CALLS};
        rc = grammar_from_json_schema_calls(schema, &calls, out, &err);
        json_decref(schema);
        if (rc == CAIRN_OK) {
            unsigned flags = json_form ? GRAMMAR_LAZY_AT_START : r->parallel_tools ? GRAMMAR_LAZY_REPEAT : 0;
            rc = grammar_set_trigger(*out, in_think ? "</think>" : NULL, json_form ? "{" : "<tool_call>", flags, &err);
            if (rc) {
                grammar_free(*out);
                *out = NULL;
            }
        }
        break;
    }
    case API_GRAMMAR_REGEX: {
        size_t n = strlen(r->grammar_text) + 32;
        char *re = malloc(n);
        if (!re) return api_req_fail(e, r->grammar_param, "out of memory");
        snprintf(re, n, "%s(?:%s)", in_think ? "</think>\n\n" : "", r->grammar_text);
        rc = grammar_from_regex(re, strlen(re), out, &err);
        free(re);
        break;
    }
    case API_GRAMMAR_GBNF: rc = grammar_from_gbnf(r->grammar_text, strlen(r->grammar_text), out, &err); break;
    }
    if (rc) return api_req_fail(e, r->grammar_param, "'%s' cannot be enforced: %s", r->grammar_param, err.msg);
    return 0;
}
