/* Request fields the four APIs share (see api_req_int.h): the typed getters, which turn a wrong
 * type or range into a 400 naming the field, and the common fields (model, sampling, stop,
 * logit_bias, stream, speculative, output constraints, chat_template_kwargs). The per-API parse
 * functions are in api_req.c; this file calls none of them. */
#include "api/api_req_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_out.h"
#include "base/status.h"

int api_req_fail(struct api_req_err *e, const char *param, const char *fmt, ...)
{
    e->status = 400;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return -1;
}

/* Field getters: absent or null leaves *out alone and returns 0; wrong type or range -> -1. */
int api_req_get_num(json_t *o, const char *key, double lo, double hi, double *out,
                    struct api_req_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return api_req_fail(e, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return api_req_fail(e, key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    *out = d;
    return 0;
}

int api_req_get_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                    struct api_req_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return api_req_fail(e, key, "'%s' must be an integer", key);
    if (x < lo || x > hi)
        return api_req_fail(e, key, "'%s' must be between %lld and %lld, got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

int api_req_get_bool(json_t *o, const char *key, int *out, struct api_req_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return api_req_fail(e, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

int api_req_get_str(json_t *o, const char *key, const char **out, struct api_req_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return api_req_fail(e, key, "'%s' must be a string", key);
    *out = json_string_value(v);
    return 0;
}

/* Concatenated text of an OpenAI/Responses content value (string, null or parts). */
int api_req_content_text(json_t *content, const char *param, char **out,
                         struct api_req_err *e)
{
    *out = NULL;
    if (!content || json_is_null(content)) {
        *out = strdup("");
        return 0;
    }
    if (json_is_string(content)) {
        *out = strdup(json_string_value(content));
        return 0;
    }
    if (!json_is_array(content))
        return api_req_fail(e, param, "'%s' must be a string or an array of content parts", param);
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_is_object(part) ? json_string_value(json_object_get(part, "type")) : NULL;
        if (json_is_string(part)) {
            total += json_string_length(part);
            continue;
        }
        if (!type) return api_req_fail(e, param, "content part %zu of '%s' has no type", i, param);
        if (strcmp(type, "text") && strcmp(type, "input_text") && strcmp(type, "output_text"))
            return api_req_fail(e, param, "content part type '%s' is not supported (text only)", type);
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) return api_req_fail(e, param, "content part %zu of '%s' needs a string 'text'", i, param);
        total += json_string_length(t);
    }
    char *s = malloc(total + 1), *w = s;
    if (!s) return api_req_fail(e, param, "out of memory");
    json_array_foreach(content, i, part) {
        json_t *t = json_is_string(part) ? part : json_object_get(part, "text");
        memcpy(w, json_string_value(t), json_string_length(t));
        w += json_string_length(t);
    }
    *w = 0;
    *out = s;
    return 0;
}

/* Arguments of a tool call as an object when they parse (templates iterate them), else as
 * given. */
json_t *api_req_args_value(json_t *args)
{
    if (json_is_string(args)) {
        json_error_t je;
        json_t *o = json_loads(json_string_value(args), 0, &je);
        if (o && json_is_object(o)) return o;
        json_decref(o);
        return json_incref(args);
    }
    if (json_is_object(args)) return json_incref(args);
    return json_object();
}

json_t *api_req_msg(const char *role, const char *content)
{
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string(role));
    json_object_set_new(m, "content", json_string(content ? content : ""));
    return m;
}

/* Keeps only the tool named `name`. */
int api_req_tools_only(struct api_req *r, const char *name, const char *param,
                       struct api_req_err *e)
{
    json_t *keep = json_array();
    size_t i;
    json_t *t;
    if (r->tools)
        json_array_foreach(r->tools, i, t) {
            const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            if (n && !strcmp(n, name)) json_array_append(keep, t);
        }
    if (json_array_size(keep) == 0) {
        json_decref(keep);
        return api_req_fail(e, param, "tool_choice names '%s', which is not in 'tools'", name);
    }
    json_decref(r->tools);
    r->tools = keep;
    return 0;
}

int api_req_stop(json_t *o, const char *key, struct api_req *r, struct api_req_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v)) r->stop[r->n_stop++] = strdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v)) return api_req_fail(e, key, "'%s' must be a string or an array of strings", key);
    if (json_array_size(v) > API_MAX_STOP) return api_req_fail(e, key, "'%s' has more than %d entries", key, API_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return api_req_fail(e, key, "'%s[%zu]' must be a string", key, i);
        if (json_string_length(s)) r->stop[r->n_stop++] = strdup(json_string_value(s));
    }
    return 0;
}

/* Extension, every API: per-request speculative decoding (engine.h). */
int api_req_speculative(json_t *o, struct api_req *r, struct api_req_err *e)
{
    const char *spec = NULL;
    if (api_req_get_str(o, "speculative", &spec, e)) return -1;
    if (spec) {
        int m = engine_spec_mode_parse(spec);
        if (m < 0) return api_req_fail(e, "speculative", "'speculative' must be \"off\", \"ngram\", \"mtp\" or \"auto\"");
        r->speculative = m;
    }
    return 0;
}

/* Sampling fields shared by chat and completions (OpenAI names, plus the usual extensions). */
int api_req_sampling(json_t *o, struct api_req *r, struct api_req_err *e)
{
    double d;
    long long x;
    struct engine_sampling *s = &r->sampling;
    d = s->temperature;
    if (api_req_get_num(o, "temperature", 0, 100, &d, e)) return -1;
    s->temperature = (float)d;
    d = s->top_p;
    if (api_req_get_num(o, "top_p", 0, 1, &d, e)) return -1;
    s->top_p = d <= 0 ? 1.0f : (float)d;
    x = 0;
    if (api_req_get_int(o, "top_k", -1, 1 << 30, &x, e)) return -1;
    s->top_k = x < 0 ? 0 : (int)x;
    d = 0;
    if (api_req_get_num(o, "min_p", 0, 1, &d, e)) return -1;
    s->min_p = (float)d;
    json_t *seed = json_object_get(o, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return api_req_fail(e, "seed", "'seed' must be an integer");
        s->seed = (uint64_t)json_integer_value(seed);
        s->has_seed = 1;
    }
    d = 0;
    if (api_req_get_num(o, "presence_penalty", -2, 2, &d, e)) return -1;
    s->presence_penalty = (float)d;
    d = 0;
    if (api_req_get_num(o, "frequency_penalty", -2, 2, &d, e)) return -1;
    s->frequency_penalty = (float)d;
    d = 1;
    if (api_req_get_num(o, "repetition_penalty", 1e-6, 100, &d, e)) return -1;
    s->repetition_penalty = (float)d;
    x = 0;
    if (api_req_get_int(o, "repetition_context_size", 0, 1 << 20, &x, e)) return -1;
    s->repetition_context_size = (int)x;
    if (api_req_speculative(o, r, e)) return -1;
    return api_req_logit_bias(o, r, e);
}

/* logit_bias (OpenAI; an extension in Anthropic messages): {"token id": bias in [-100, 100]}. */
int api_req_logit_bias(json_t *o, struct api_req *r, struct api_req_err *e)
{
    struct engine_sampling *s = &r->sampling;
    json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb)) return api_req_fail(e, "logit_bias", "'logit_bias' must be an object");
        const char *k;
        json_t *v;
        json_object_foreach(lb, k, v) {
            char *end;
            long id = strtol(k, &end, 10);
            if (*k == 0 || *end || id < 0 || id > INT32_MAX)
                return api_req_fail(e, "logit_bias", "'logit_bias' key '%s' is not a token id", k);
            if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
                return api_req_fail(e, "logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
            if (s->n_logit_bias >= API_MAX_LOGIT_BIAS)
                return api_req_fail(e, "logit_bias", "'logit_bias' has more than %d entries", API_MAX_LOGIT_BIAS);
            r->logit_bias[s->n_logit_bias].id = (int32_t)id;
            r->logit_bias[s->n_logit_bias].bias = (float)json_number_value(v);
            s->n_logit_bias++;
        }
        s->logit_bias = r->logit_bias;
    }
    return 0;
}

int api_req_stream(json_t *o, struct api_req *r, struct api_req_err *e)
{
    if (api_req_get_bool(o, "stream", &r->stream, e)) return -1;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return api_req_fail(e, "stream_options", "'stream_options' must be an object");
        if (api_req_get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    return 0;
}

/* Records what constrains the output; a second constraint is an error. */
int api_req_set_grammar(struct api_req *r, enum api_grammar_kind kind, const char *param, json_t *schema,
                        const char *text, struct api_req_err *e)
{
    if (r->grammar_kind)
        return api_req_fail(e, param, "'%s' and '%s' both constrain the output: give one", r->grammar_param, param);
    r->grammar_kind = kind;
    snprintf(r->grammar_param, sizeof(r->grammar_param), "%s", param);
    if (schema) r->grammar_schema = json_deep_copy(schema);
    if (text) r->grammar_text = strdup(text);
    if ((schema && !r->grammar_schema) || (text && !r->grammar_text)) return api_req_fail(e, param, "out of memory");
    return 0;
}

/* response_format (chat) / text.format (responses): JSON output, constrained by a grammar. */
int api_req_format(json_t *fmt, const char *param, struct api_req *r, struct api_req_err *e)
{
    if (!fmt || json_is_null(fmt)) return 0;
    if (!json_is_object(fmt)) return api_req_fail(e, param, "'%s' must be an object", param);
    const char *type = json_string_value(json_object_get(fmt, "type"));
    if (!type) return api_req_fail(e, param, "'%s.type' must be a string", param);
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_schema")) {
        json_t *js = json_object_get(fmt, "json_schema");
        json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : json_object_get(fmt, "schema");
        if (!json_is_object(schema)) return api_req_fail(e, param, "'%s' json_schema needs a 'schema' object", param);
        return api_req_set_grammar(r, API_GRAMMAR_SCHEMA, param, schema, NULL, e);
    }
    if (strcmp(type, "json_object")) return api_req_fail(e, param, "'%s.type' must be text, json_object or json_schema", param);
    json_t *any = json_pack("{s:s}", "type", "object");
    int rc = api_req_set_grammar(r, API_GRAMMAR_SCHEMA, param, any, NULL, e);
    json_decref(any);
    return rc;
}

/* The cairn extension: "cairn": {"json_schema": {...}} | {"regex": "..."} | {"grammar": "..."}. */
int api_req_cairn_ext(json_t *o, struct api_req *r, struct api_req_err *e)
{
    json_t *c = json_object_get(o, "cairn");
    if (!c || json_is_null(c)) return 0;
    if (!json_is_object(c)) return api_req_fail(e, "cairn", "'cairn' must be an object");
    json_t *v;
    if ((v = json_object_get(c, "json_schema"))) {
        if (!json_is_object(v)) return api_req_fail(e, "cairn.json_schema", "'cairn.json_schema' must be an object");
        if (api_req_set_grammar(r, API_GRAMMAR_SCHEMA, "cairn.json_schema", v, NULL, e)) return -1;
    }
    if ((v = json_object_get(c, "regex"))) {
        if (!json_is_string(v)) return api_req_fail(e, "cairn.regex", "'cairn.regex' must be a string");
        if (api_req_set_grammar(r, API_GRAMMAR_REGEX, "cairn.regex", NULL, json_string_value(v), e)) return -1;
    }
    if ((v = json_object_get(c, "grammar"))) {
        if (!json_is_string(v)) return api_req_fail(e, "cairn.grammar", "'cairn.grammar' must be a string (GBNF)");
        if (api_req_set_grammar(r, API_GRAMMAR_GBNF, "cairn.grammar", NULL, json_string_value(v), e)) return -1;
    }
    return 0;
}

int api_req_model(json_t *o, struct api_req *r, struct api_req_err *e)
{
    json_t *m = json_object_get(o, "model");
    if (!m || json_is_null(m)) return api_req_fail(e, "model", "'model' is required");
    if (!json_is_string(m)) return api_req_fail(e, "model", "'model' must be a string");
    if (json_string_length(m) >= sizeof(r->model)) return api_req_fail(e, "model", "'model' is too long");
    snprintf(r->model, sizeof(r->model), "%s", json_string_value(m));
    return 0;
}

int api_req_kwargs(json_t *o, struct api_req *r, struct api_req_err *e)
{
    json_t *k = json_object_get(o, "chat_template_kwargs");
    if (!k || json_is_null(k)) return 0;
    if (!json_is_object(k)) return api_req_fail(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    json_object_update(r->kwargs, k);
    return 0;
}
