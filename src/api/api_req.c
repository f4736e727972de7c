/* Request parsing for the four APIs (see api_req.h). Each API has its own parse function; they
 * share the field getters, which turn a wrong type into a 400 naming the field, and the common
 * fields, both in api_req_fields.c. api_req_grammar is in api_req_grammar.c. */
#include "api/api_req_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_out.h"
#include "base/status.h"

/* ---- OpenAI chat ---- */

static int api_req_openai_messages(json_t *arr, json_t *out, struct api_req_err *e)
{
    if (!json_is_array(arr)) return api_req_fail(e, "messages", "'messages' must be an array");
    if (json_array_size(arr) == 0) return api_req_fail(e, "messages", "'messages' must not be empty");
    size_t i;
    json_t *m;
    char param[64];
    json_array_foreach(arr, i, m) {
        snprintf(param, sizeof(param), "messages[%zu]", i);
        if (!json_is_object(m)) return api_req_fail(e, param, "'%s' must be an object", param);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return api_req_fail(e, param, "'%s.role' must be a string", param);
        if (!strcmp(role, "developer")) role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool") && strcmp(role, "function"))
            return api_req_fail(e, param, "'%s.role' '%s' is not one of system, developer, user, assistant, tool", param, role);
        snprintf(param, sizeof(param), "messages[%zu].content", i);
        char *text;
        if (api_req_content_text(json_object_get(m, "content"), param, &text, e)) return -1;
        json_t *nm = api_req_msg(!strcmp(role, "function") ? "tool" : role, text);
        free(text);
        json_t *tc = json_object_get(m, "tool_calls");
        if (tc && !json_is_null(tc)) {
            snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
            if (!json_is_array(tc)) {
                json_decref(nm);
                return api_req_fail(e, param, "'%s' must be an array", param);
            }
            json_t *calls = json_array();
            size_t j;
            json_t *c;
            json_array_foreach(tc, j, c) {
                json_t *fn = json_object_get(c, "function");
                if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name"))) {
                    json_decref(calls);
                    json_decref(nm);
                    return api_req_fail(e, param, "'%s[%zu].function.name' must be a string", param, j);
                }
                json_t *nc = json_object();
                json_t *id = json_object_get(c, "id");
                json_object_set_new(nc, "id", json_is_string(id) ? json_incref(id) : json_string(""));
                json_object_set_new(nc, "type", json_string("function"));
                json_t *nf = json_object();
                json_object_set(nf, "name", json_object_get(fn, "name"));
                json_object_set_new(nf, "arguments", api_req_args_value(json_object_get(fn, "arguments")));
                json_object_set_new(nc, "function", nf);
                json_array_append_new(calls, nc);
            }
            json_object_set_new(nm, "tool_calls", calls);
        }
        json_t *v;
        if ((v = json_object_get(m, "tool_call_id")) && json_is_string(v)) json_object_set(nm, "tool_call_id", v);
        if ((v = json_object_get(m, "name")) && json_is_string(v)) json_object_set(nm, "name", v);
        if ((v = json_object_get(m, "reasoning_content")) && json_is_string(v))
            json_object_set(nm, "reasoning_content", v);
        json_array_append_new(out, nm);
    }
    return 0;
}

static int api_req_openai_tools(json_t *tools, json_t **out, struct api_req_err *e)
{
    *out = NULL;
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return api_req_fail(e, "tools", "'tools' must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_is_object(t) ? json_object_get(t, "function") : NULL;
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return api_req_fail(e, "tools", "'tools[%zu].function.name' must be a string", i);
    }
    if (json_array_size(tools)) *out = json_deep_copy(tools);
    return 0;
}

static int api_req_parse_chat(json_t *o, int max_n, struct api_req *r, struct api_req_err *e)
{
    if (api_req_model(o, r, e)) return -1;
    json_t *msgs = json_object_get(o, "messages");
    if (!msgs) return api_req_fail(e, "messages", "'messages' is required");
    if (api_req_openai_messages(msgs, r->messages, e)) return -1;
    if (api_req_openai_tools(json_object_get(o, "tools"), &r->tools, e)) return -1;
    json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) r->tool_choice_none = 1;
            else if (!strcmp(s, "required")) r->tool_required = 1;
            else if (strcmp(s, "auto"))
                return api_req_fail(e, "tool_choice", "'tool_choice' must be none, auto, required or a function");
        } else if (json_is_object(tc)) {
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!name) return api_req_fail(e, "tool_choice", "'tool_choice.function.name' must be a string");
            if (api_req_tools_only(r, name, "tool_choice", e)) return -1;
            r->tool_required = 1;
        } else {
            return api_req_fail(e, "tool_choice", "'tool_choice' must be a string or an object");
        }
    }
    if (api_req_get_bool(o, "parallel_tool_calls", &r->parallel_tools, e)) return -1;
    if (api_req_sampling(o, r, e)) return -1;
    long long x = -1;
    if (api_req_get_int(o, "max_tokens", 1, 1 << 30, &x, e)) return -1;
    if (api_req_get_int(o, "max_completion_tokens", 1, 1 << 30, &x, e)) return -1;
    r->max_tokens = (int)x;
    if (api_req_stop(o, "stop", r, e)) return -1;
    x = 1;
    if (api_req_get_int(o, "n", 1, max_n, &x, e)) return -1;
    r->n = (int)x;
    if (api_req_get_bool(o, "ignore_eos", &r->ignore_eos, e)) return -1;
    if (api_req_get_bool(o, "logprobs", &r->sampling.logprobs, e)) return -1;
    x = 0;
    if (api_req_get_int(o, "top_logprobs", 0, 20, &x, e)) return -1;
    r->sampling.top_logprobs = (int)x;
    if (x > 0) r->sampling.logprobs = 1;
    if (api_req_stream(o, r, e)) return -1;
    if (api_req_kwargs(o, r, e)) return -1;
    if (api_req_format(json_object_get(o, "response_format"), "response_format", r, e)) return -1;
    if (api_req_cairn_ext(o, r, e)) return -1;
    return 0;
}

static int api_req_parse_completions(json_t *o, int max_n, struct api_req *r, struct api_req_err *e)
{
    if (api_req_model(o, r, e)) return -1;
    json_t *p = json_object_get(o, "prompt");
    if (!p || json_is_null(p)) return api_req_fail(e, "prompt", "'prompt' is required");
    if (json_is_string(p)) {
        r->prompt = strdup(json_string_value(p));
    } else if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) {
        r->prompt = strdup(json_string_value(json_array_get(p, 0)));
    } else if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p), i;
        r->prompt_ids = malloc(n * sizeof(int32_t));
        if (!r->prompt_ids) return api_req_fail(e, "prompt", "out of memory");
        json_t *v;
        json_array_foreach(p, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
                return api_req_fail(e, "prompt", "'prompt[%zu]' must be a token id", i);
            r->prompt_ids[i] = (int32_t)json_integer_value(v);
        }
        r->n_prompt_ids = (int)n;
    } else {
        return api_req_fail(e, "prompt", "'prompt' must be a string, one string in an array, or an array of token ids");
    }
    if (api_req_sampling(o, r, e)) return -1;
    long long x = 16; /* the OpenAI default for completions */
    if (api_req_get_int(o, "max_tokens", 1, 1 << 30, &x, e)) return -1;
    r->max_tokens = (int)x;
    if (api_req_stop(o, "stop", r, e)) return -1;
    x = 1;
    if (api_req_get_int(o, "n", 1, max_n, &x, e)) return -1;
    r->n = (int)x;
    x = -1;
    if (api_req_get_int(o, "logprobs", 0, 5, &x, e)) return -1;
    if (x >= 0) {
        r->sampling.logprobs = 1;
        r->sampling.top_logprobs = (int)x;
    }
    if (api_req_get_bool(o, "echo", &r->echo, e)) return -1;
    if (api_req_get_bool(o, "ignore_eos", &r->ignore_eos, e)) return -1;
    if (api_req_stream(o, r, e)) return -1;
    if (api_req_cairn_ext(o, r, e)) return -1;
    return 0;
}

/* ---- Anthropic ---- */

static int api_req_anthropic_text(json_t *v, const char *param, char **out, struct api_req_err *e)
{
    /* string, or an array of {type: text, text} blocks */
    *out = NULL;
    if (json_is_string(v)) {
        *out = strdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v)) return api_req_fail(e, param, "'%s' must be a string or an array of text blocks", param);
    return api_req_content_text(v, param, out, e);
}

static int api_req_anthropic_messages(json_t *o, struct api_req *r, struct api_req_err *e)
{
    json_t *sys = json_object_get(o, "system");
    if (sys && !json_is_null(sys)) {
        char *s;
        if (api_req_anthropic_text(sys, "system", &s, e)) return -1;
        json_array_append_new(r->messages, api_req_msg("system", s));
        free(s);
    }
    json_t *msgs = json_object_get(o, "messages");
    if (!msgs) return api_req_fail(e, "messages", "'messages' is required");
    if (!json_is_array(msgs)) return api_req_fail(e, "messages", "'messages' must be an array");
    if (!json_array_size(msgs)) return api_req_fail(e, "messages", "'messages' must not be empty");
    size_t i;
    json_t *m;
    char param[64];
    json_array_foreach(msgs, i, m) {
        snprintf(param, sizeof(param), "messages.%zu", i);
        if (!json_is_object(m)) return api_req_fail(e, param, "'%s' must be an object", param);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
            return api_req_fail(e, param, "%s.role: Input should be 'user', 'assistant' or 'system'", param);
        json_t *content = json_object_get(m, "content");
        snprintf(param, sizeof(param), "messages.%zu.content", i);
        if (!strcmp(role, "system")) {
            /* A system message inside the conversation (Claude Code sends them): kept in place
             * as a system turn; api_call_prepare merges it into the leading system prompt when
             * the chat template refuses one there (api_req_merge_system). */
            char *st;
            if (api_req_anthropic_text(content, param, &st, e)) return -1;
            json_array_append_new(r->messages, api_req_msg("system", st));
            free(st);
            continue;
        }
        if (json_is_string(content)) {
            json_array_append_new(r->messages, api_req_msg(role, json_string_value(content)));
            continue;
        }
        if (!json_is_array(content)) return api_req_fail(e, param, "'%s' must be a string or an array of blocks", param);
        /* text, thinking and tool_use blocks make one message; tool_result blocks become tool
         * messages (placed before the message's text, which follows the results). */
        size_t cap = 16, tn = 0, rn = 0;
        char *text = calloc(1, cap), *reason = calloc(1, cap);
        size_t rcap = cap;
        json_t *calls = json_array();
        size_t j;
        json_t *b;
        int rc = 0;
        json_array_foreach(content, j, b) {
            const char *type = json_is_object(b) ? json_string_value(json_object_get(b, "type")) : NULL;
            if (!type) {
                rc = api_req_fail(e, param, "'%s.%zu' needs a 'type'", param, j);
                break;
            }
            if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
                int th = !strcmp(type, "thinking");
                json_t *t = json_object_get(b, th ? "thinking" : "text");
                if (!json_is_string(t)) {
                    rc = api_req_fail(e, param, "'%s.%zu.%s' must be a string", param, j, th ? "thinking" : "text");
                    break;
                }
                char **dst = th ? &reason : &text;
                size_t *dn = th ? &rn : &tn, *dc = th ? &rcap : &cap;
                size_t add = json_string_length(t);
                if (*dn + add + 1 > *dc) {
                    *dc = (*dn + add + 1) * 2;
                    *dst = realloc(*dst, *dc);
                }
                memcpy(*dst + *dn, json_string_value(t), add);
                *dn += add;
                (*dst)[*dn] = 0;
            } else if (!strcmp(type, "tool_use")) {
                json_t *name = json_object_get(b, "name"), *id = json_object_get(b, "id");
                json_t *input = json_object_get(b, "input");
                if (!json_is_string(name)) {
                    rc = api_req_fail(e, param, "'%s.%zu.name' must be a string", param, j);
                    break;
                }
                json_t *nc = json_object(), *nf = json_object();
                json_object_set_new(nc, "id", json_is_string(id) ? json_incref(id) : json_string(""));
                json_object_set_new(nc, "type", json_string("function"));
                json_object_set(nf, "name", name);
                json_object_set_new(nf, "arguments", json_is_object(input) ? json_incref(input) : json_object());
                json_object_set_new(nc, "function", nf);
                json_array_append_new(calls, nc);
            } else if (!strcmp(type, "tool_result")) {
                char *rt = NULL;
                json_t *c = json_object_get(b, "content");
                char p2[96];
                snprintf(p2, sizeof(p2), "%s.%zu.content", param, j);
                if (c && api_req_content_text(c, p2, &rt, e)) {
                    rc = -1;
                    break;
                }
                json_t *tm = api_req_msg("tool", rt ? rt : "");
                free(rt);
                json_t *id = json_object_get(b, "tool_use_id");
                if (json_is_string(id)) json_object_set(tm, "tool_call_id", id);
                json_array_append_new(r->messages, tm);
            } else if (!strcmp(type, "redacted_thinking")) {
                /* nothing to render */
            } else {
                rc = api_req_fail(e, param, "block type '%s' is not supported", type);
                break;
            }
        }
        if (rc == 0 && (tn || rn || json_array_size(calls) || !strcmp(role, "assistant"))) {
            json_t *nm = api_req_msg(role, text);
            if (rn) json_object_set_new(nm, "reasoning_content", json_string(reason));
            if (json_array_size(calls)) json_object_set(nm, "tool_calls", calls);
            json_array_append_new(r->messages, nm);
        }
        free(text);
        free(reason);
        json_decref(calls);
        if (rc) return -1;
    }
    return 0;
}

static int api_req_anthropic_tools(json_t *o, struct api_req *r, struct api_req_err *e)
{
    json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return api_req_fail(e, "tools", "'tools' must be an array");
        json_t *out = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *name = json_is_object(t) ? json_string_value(json_object_get(t, "name")) : NULL;
            if (!name) {
                json_decref(out);
                return api_req_fail(e, "tools", "'tools.%zu.name' must be a string", i);
            }
            json_t *schema = json_object_get(t, "input_schema");
            if (!schema) continue; /* server tools (web search ...) are not ours to run */
            json_t *nt = json_object(), *fn = json_object();
            json_object_set_new(nt, "type", json_string("function"));
            json_object_set_new(fn, "name", json_string(name));
            json_t *d = json_object_get(t, "description");
            if (json_is_string(d)) json_object_set(fn, "description", d);
            json_object_set(fn, "parameters", schema);
            json_object_set_new(nt, "function", fn);
            json_array_append_new(out, nt);
        }
        if (json_array_size(out)) r->tools = out;
        else json_decref(out);
    }
    json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *type = json_is_object(tc) ? json_string_value(json_object_get(tc, "type")) : NULL;
        if (!type) return api_req_fail(e, "tool_choice", "'tool_choice' must be an object with a 'type'");
        if (!strcmp(type, "none")) r->tool_choice_none = 1;
        else if (!strcmp(type, "tool")) {
            const char *name = json_string_value(json_object_get(tc, "name"));
            if (!name) return api_req_fail(e, "tool_choice", "'tool_choice.name' must be a string");
            if (api_req_tools_only(r, name, "tool_choice", e)) return -1;
            r->tool_required = 1;
        } else if (!strcmp(type, "any")) {
            r->tool_required = 1;
        } else if (strcmp(type, "auto")) {
            return api_req_fail(e, "tool_choice", "'tool_choice.type' must be auto, any, tool or none");
        }
        int no_parallel = 0;
        if (api_req_get_bool(tc, "disable_parallel_tool_use", &no_parallel, e)) return -1;
        r->parallel_tools = !no_parallel;
    }
    return 0;
}

static int api_req_parse_messages(json_t *o, int count_only, struct api_req *r, struct api_req_err *e)
{
    if (api_req_model(o, r, e)) return -1;
    if (api_req_anthropic_messages(o, r, e)) return -1;
    if (api_req_anthropic_tools(o, r, e)) return -1;
    json_t *th = json_object_get(o, "thinking");
    if (th && !json_is_null(th)) {
        const char *type = json_is_object(th) ? json_string_value(json_object_get(th, "type")) : NULL;
        if (!type) return api_req_fail(e, "thinking", "'thinking' must be an object with a 'type'");
        r->thinking = !strcmp(type, "enabled") || !strcmp(type, "adaptive");
        json_object_set_new(r->kwargs, "enable_thinking", json_boolean(r->thinking));
    }
    if (count_only) return 0;
    long long x = -1;
    json_t *mt = json_object_get(o, "max_tokens");
    if (!mt || json_is_null(mt)) return api_req_fail(e, "max_tokens", "'max_tokens' is required");
    if (api_req_get_int(o, "max_tokens", 1, 1 << 30, &x, e)) return -1;
    r->max_tokens = (int)x;
    if (api_req_speculative(o, r, e)) return -1;
    double d = 1;
    if (api_req_get_num(o, "temperature", 0, 1, &d, e)) return -1;
    r->sampling.temperature = (float)d;
    d = 1;
    if (api_req_get_num(o, "top_p", 0, 1, &d, e)) return -1;
    r->sampling.top_p = d <= 0 ? 1.0f : (float)d;
    x = 0;
    if (api_req_get_int(o, "top_k", 0, 1 << 30, &x, e)) return -1;
    r->sampling.top_k = (int)x;
    if (api_req_logit_bias(o, r, e)) return -1; /* extension */
    if (json_is_string(json_object_get(o, "stop_sequences")))
        return api_req_fail(e, "stop_sequences", "'stop_sequences' must be an array of strings");
    if (api_req_stop(o, "stop_sequences", r, e)) return -1;
    if (api_req_get_bool(o, "stream", &r->stream, e)) return -1;
    r->include_usage = 1;
    if (api_req_cairn_ext(o, r, e)) return -1;
    return 0;
}

/* ---- Responses ---- */

static int api_req_responses_input(json_t *o, struct api_req *r, struct api_req_err *e)
{
    const char *instr = NULL;
    if (api_req_get_str(o, "instructions", &instr, e)) return -1;
    if (instr) json_array_append_new(r->messages, api_req_msg("system", instr));
    json_t *in = json_object_get(o, "input");
    if (!in || json_is_null(in)) return api_req_fail(e, "input", "'input' is required");
    if (json_is_string(in)) {
        json_array_append_new(r->messages, api_req_msg("user", json_string_value(in)));
        return 0;
    }
    if (!json_is_array(in)) return api_req_fail(e, "input", "'input' must be a string or an array of items");
    size_t i;
    json_t *it;
    char param[64];
    json_t *last_asst = NULL; /* consecutive function_call items join one assistant message */
    json_array_foreach(in, i, it) {
        snprintf(param, sizeof(param), "input[%zu]", i);
        if (!json_is_object(it)) return api_req_fail(e, param, "'%s' must be an object", param);
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!type || !strcmp(type, "message")) {
            const char *role = json_string_value(json_object_get(it, "role"));
            if (!role) return api_req_fail(e, param, "'%s.role' must be a string", param);
            if (!strcmp(role, "developer")) role = "system";
            if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
                return api_req_fail(e, param, "'%s.role' must be system, developer, user or assistant", param);
            char p2[80], *text;
            snprintf(p2, sizeof(p2), "%s.content", param);
            if (api_req_content_text(json_object_get(it, "content"), p2, &text, e)) return -1;
            json_t *m = api_req_msg(role, text);
            free(text);
            json_array_append_new(r->messages, m);
            last_asst = !strcmp(role, "assistant") ? m : NULL;
        } else if (!strcmp(type, "function_call")) {
            json_t *name = json_object_get(it, "name");
            if (!json_is_string(name)) return api_req_fail(e, param, "'%s.name' must be a string", param);
            if (!last_asst) {
                last_asst = api_req_msg("assistant", "");
                json_array_append_new(r->messages, last_asst);
            }
            json_t *calls = json_object_get(last_asst, "tool_calls");
            if (!calls) {
                calls = json_array();
                json_object_set_new(last_asst, "tool_calls", calls);
            }
            json_t *nc = json_object(), *nf = json_object();
            json_t *id = json_object_get(it, "call_id");
            json_object_set_new(nc, "id", json_is_string(id) ? json_incref(id) : json_string(""));
            json_object_set_new(nc, "type", json_string("function"));
            json_object_set(nf, "name", name);
            json_object_set_new(nf, "arguments", api_req_args_value(json_object_get(it, "arguments")));
            json_object_set_new(nc, "function", nf);
            json_array_append_new(calls, nc);
        } else if (!strcmp(type, "function_call_output")) {
            json_t *out = json_object_get(it, "output");
            char *text = NULL;
            char p2[80];
            snprintf(p2, sizeof(p2), "%s.output", param);
            if (api_req_content_text(out, p2, &text, e)) return -1;
            json_t *m = api_req_msg("tool", text);
            free(text);
            json_t *id = json_object_get(it, "call_id");
            if (json_is_string(id)) json_object_set(m, "tool_call_id", id);
            json_array_append_new(r->messages, m);
            last_asst = NULL;
        } else if (!strcmp(type, "reasoning")) {
            /* earlier reasoning is not re-rendered */
        } else {
            return api_req_fail(e, param, "input item type '%s' is not supported", type);
        }
    }
    if (!json_array_size(r->messages)) return api_req_fail(e, "input", "'input' must not be empty");
    return 0;
}

static int api_req_responses_tools(json_t *o, struct api_req *r, struct api_req_err *e)
{
    json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return api_req_fail(e, "tools", "'tools' must be an array");
        json_t *out = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *type = json_is_object(t) ? json_string_value(json_object_get(t, "type")) : NULL;
            const char *name = json_is_object(t) ? json_string_value(json_object_get(t, "name")) : NULL;
            if (!type || strcmp(type, "function")) continue; /* built-in tools aren't run here */
            if (!name) {
                json_decref(out);
                return api_req_fail(e, "tools", "'tools[%zu].name' must be a string", i);
            }
            json_t *nt = json_object(), *fn = json_object();
            json_object_set_new(nt, "type", json_string("function"));
            json_object_set_new(fn, "name", json_string(name));
            json_t *d = json_object_get(t, "description");
            if (json_is_string(d)) json_object_set(fn, "description", d);
            json_t *p = json_object_get(t, "parameters");
            json_object_set_new(fn, "parameters", json_is_object(p) ? json_incref(p) : json_object());
            json_object_set_new(nt, "function", fn);
            json_array_append_new(out, nt);
        }
        if (json_array_size(out)) r->tools = out;
        else json_decref(out);
    }
    json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) r->tool_choice_none = 1;
            else if (!strcmp(s, "required")) r->tool_required = 1;
            else if (strcmp(s, "auto"))
                return api_req_fail(e, "tool_choice", "'tool_choice' must be none, auto, required or a function");
        } else if (json_is_object(tc)) {
            const char *name = json_string_value(json_object_get(tc, "name"));
            if (!name) return api_req_fail(e, "tool_choice", "'tool_choice.name' must be a string");
            if (api_req_tools_only(r, name, "tool_choice", e)) return -1;
            r->tool_required = 1;
        } else {
            return api_req_fail(e, "tool_choice", "'tool_choice' must be a string or an object");
        }
    }
    return 0;
}

static int api_req_parse_responses(json_t *o, struct api_req *r, struct api_req_err *e)
{
    if (api_req_model(o, r, e)) return -1;
    json_t *prev = json_object_get(o, "previous_response_id");
    if (prev && !json_is_null(prev))
        return api_req_fail(e, "previous_response_id", "'previous_response_id' is not supported: this server is stateless, send the whole input");
    if (api_req_responses_input(o, r, e)) return -1;
    if (api_req_responses_tools(o, r, e)) return -1;
    long long x = -1;
    if (api_req_get_int(o, "max_output_tokens", 1, 1 << 30, &x, e)) return -1;
    r->max_tokens = (int)x;
    if (api_req_speculative(o, r, e)) return -1;
    double d = 1;
    if (api_req_get_num(o, "temperature", 0, 2, &d, e)) return -1;
    r->sampling.temperature = (float)d;
    d = 1;
    if (api_req_get_num(o, "top_p", 0, 1, &d, e)) return -1;
    r->sampling.top_p = d <= 0 ? 1.0f : (float)d;
    if (api_req_get_bool(o, "stream", &r->stream, e)) return -1;
    if (api_req_get_bool(o, "parallel_tool_calls", &r->parallel_tools, e)) return -1;
    json_t *text = json_object_get(o, "text");
    if (text && !json_is_null(text)) {
        if (!json_is_object(text)) return api_req_fail(e, "text", "'text' must be an object");
        if (api_req_format(json_object_get(text, "format"), "text.format", r, e)) return -1;
    }
    if (api_req_cairn_ext(o, r, e)) return -1;
    json_t *reasoning = json_object_get(o, "reasoning");
    if (reasoning && !json_is_null(reasoning)) {
        if (!json_is_object(reasoning)) return api_req_fail(e, "reasoning", "'reasoning' must be an object");
        const char *effort = NULL;
        if (api_req_get_str(reasoning, "effort", &effort, e)) return -1;
        if (effort) {
            r->thinking = strcmp(effort, "none") != 0;
            json_object_set_new(r->kwargs, "enable_thinking", json_boolean(r->thinking));
        }
    }
    r->include_usage = 1;
    return 0;
}

int api_req_merge_system(json_t *messages)
{
    json_t *first = json_array_get(messages, 0);
    const char *r0 = first ? json_string_value(json_object_get(first, "role")) : NULL;
    int have_first = r0 && !strcmp(r0, "system");
    int moved = 0;
    struct {
        char *p;
        size_t len;
    } acc = {NULL, 0};
    /* message 0 is the leading system message, or not a system message at all */
    for (size_t i = 1; i < json_array_size(messages);) {
        json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "system")) {
            i++;
            continue;
        }
        const char *t = json_string_value(json_object_get(m, "content"));
        size_t n = strlen(t ? t : "");
        char *p = realloc(acc.p, acc.len + n + 3);
        if (!p) break; /* out of memory: what was merged so far stands */
        acc.p = p;
        if (acc.len) memcpy(acc.p + acc.len, "\n\n", 2), acc.len += 2;
        memcpy(acc.p + acc.len, t ? t : "", n);
        acc.len += n;
        acc.p[acc.len] = 0;
        json_array_remove(messages, i);
        moved = 1;
    }
    if (!moved) {
        free(acc.p);
        return 0;
    }
    if (have_first) {
        const char *old = json_string_value(json_object_get(first, "content"));
        size_t n = strlen(old ? old : "") + acc.len + 3;
        char *s = malloc(n);
        if (s) {
            snprintf(s, n, "%s%s%s", old && *old ? old : "", old && *old ? "\n\n" : "", acc.p);
            json_object_set_new(first, "content", json_string(s));
            free(s);
        }
    } else {
        json_array_insert_new(messages, 0, api_req_msg("system", acc.p));
    }
    free(acc.p);
    return 1;
}

void api_req_free(struct api_req *r)
{
    json_decref(r->messages);
    json_decref(r->tools);
    json_decref(r->kwargs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    json_decref(r->grammar_schema);
    free(r->grammar_text);
    grammar_free(r->grammar);
    memset(r, 0, sizeof(*r));
}

int api_req_parse(enum api_kind kind, const char *body, size_t len, int max_n,
                  struct api_req *r, struct api_req_err *e)
{
    memset(r, 0, sizeof(*r));
    memset(e, 0, sizeof(*e));
    r->kind = kind;
    r->max_tokens = -1;
    r->n = 1;
    r->thinking = -1;
    r->parallel_tools = 1;
    engine_sampling_default(&r->sampling);
    r->messages = json_array();
    r->kwargs = json_object();
    json_error_t je;
    json_t *o = json_loadb(body ? body : "", len, 0, &je);
    int rc = -1;
    if (!o) {
        /* jansson's text names its own flag for a NUL escape: say what is wrong instead */
        if (strstr(je.text, "\\u0000"))
            api_req_fail(e, "", "malformed JSON at line %d column %d: a string contains \\u0000 (a NUL "
                         "character), which is not supported", je.line, je.column);
        else
            api_req_fail(e, "", "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        goto done;
    }
    if (!json_is_object(o)) {
        api_req_fail(e, "", "the request body must be a JSON object");
        goto done;
    }
    static const struct {
        const char *key;
        unsigned bit;
    } given[] = {{"temperature", API_GIVEN_TEMPERATURE}, {"top_p", API_GIVEN_TOP_P}, {"top_k", API_GIVEN_TOP_K},
                 {"min_p", API_GIVEN_MIN_P}, {"repetition_penalty", API_GIVEN_REPETITION_PENALTY}};
    for (size_t i = 0; i < sizeof(given) / sizeof(given[0]); i++) {
        json_t *v = json_object_get(o, given[i].key);
        if (v && !json_is_null(v)) r->sampling_given |= given[i].bit;
    }
    switch (kind) {
    case API_KIND_CHAT: rc = api_req_parse_chat(o, max_n, r, e); break;
    case API_KIND_COMPLETIONS: rc = api_req_parse_completions(o, max_n, r, e); break;
    case API_KIND_MESSAGES: rc = api_req_parse_messages(o, 0, r, e); break;
    case API_KIND_COUNT_TOKENS: rc = api_req_parse_messages(o, 1, r, e); break;
    case API_KIND_RESPONSES: rc = api_req_parse_responses(o, r, e); break;
    }
    if (rc == 0 && r->tool_choice_none) {
        json_decref(r->tools);
        r->tools = NULL;
    }
    /* A required tool call: the envelope and the arguments are forced by a grammar. */
    if (rc == 0 && r->tool_required && r->tools && kind != API_KIND_COUNT_TOKENS)
        rc = api_req_set_grammar(r, API_GRAMMAR_TOOLS, "tools", NULL, NULL, e);
    /* tool_choice auto (or unset) with tools: a call's envelope and arguments are held to the
     * tools once the model starts one, unless another constraint (response_format ...) rules */
    else if (rc == 0 && r->tools && !r->grammar_kind && kind != API_KIND_COUNT_TOKENS)
        rc = api_req_set_grammar(r, API_GRAMMAR_TOOLS_AUTO, "tools", NULL, NULL, e);
    /* compiled now so that an unsupported schema is a 400 before anything runs */
    if (rc == 0 && kind != API_KIND_COUNT_TOKENS) rc = api_req_grammar(r, 0, API_TOOL_FORM_HERMES, &r->grammar, e);
done:
    json_decref(o);
    if (rc) api_req_free(r);
    return rc;
}
