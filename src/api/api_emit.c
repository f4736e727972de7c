/* Encoders: OpenAI chat/completions chunks, Anthropic message events, Responses events (SSE),
 * the whole-body JSON answers and the error objects of both API families. Everything here runs
 * under call->mu and appends to call->body.
 *
 * Out of memory: an SSE event is appended whole or not at all (api_put_sse cuts a partial one
 * back and sets c->oom, which ends the call in api_call_pump); a whole body that can't be built
 * sets c->oom too. Token counts go through api_scaled (the model's usage scale, api.h). */
#include "api/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

/* ---- small helpers ---- */

/* A JSON string from bytes; invalid UTF-8 becomes U+FFFD (jansson refuses it otherwise).
 * NULL when out of memory (json_pack then fails, and the event or body with it). */
static json_t *api_json_str(const char *s, size_t n)
{
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    if (v) return v;
    struct api_sbuf b = {0};
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    int rc = CAIRN_OK;
    while (i < n && rc == CAIRN_OK) {
        long l = u[i] ? cairn_utf8_check(s, n, i) : 0;
        if (l > 0) {
            rc = api_sbuf_add(&b, s + i, (size_t)l);
            i += (size_t)l;
        } else {
            rc = api_sbuf_add(&b, u[i] ? "\xEF\xBF\xBD" : " ", u[i] ? 3 : 1);
            i++;
        }
    }
    v = rc == CAIRN_OK ? json_stringn(b.p ? b.p : "", b.len) : NULL;
    api_sbuf_free(&b);
    return v;
}

/* Appends raw SSE text pieces as one unit: all of them, or (out of memory) none and c->oom. */
static void api_put_raw(struct api_call *c, const char *const *parts, int n)
{
    if (c->oom) return;
    size_t mark = c->body.len;
    for (int i = 0; i < n; i++) {
        if (api_sbuf_adds(&c->body, parts[i]) != CAIRN_OK) {
            c->body.len = mark;
            if (c->body.p) c->body.p[mark] = 0;
            c->oom = 1;
            return;
        }
    }
}

static void api_put_sse(struct api_call *c, const char *event, json_t *data)
{
    char *s = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!s) {
        c->oom = 1; /* a json_pack or json_dumps that failed: nothing sensible to send */
        return;
    }
    const char *parts[] = {"event: ", event ? event : "", "\n", "data: ", s, "\n\n"};
    if (event) api_put_raw(c, parts, 6);
    else api_put_raw(c, parts + 3, 3);
    free(s);
}

void api_sub_free(struct api_sub *s)
{
    for (int i = 0; i < s->n_segs; i++) {
        api_sbuf_free(&s->segs[i].text);
        free(s->segs[i].name);
        free(s->segs[i].args);
    }
    free(s->segs);
    api_out_free(&s->parser);
    api_sbuf_free(&s->raw);
    free(s->toks);
    json_decref(s->logprobs);
    free(s->stop_text);
    free(s->error);
    memset(s, 0, sizeof(*s));
}

static struct api_seg *api_seg_push(struct api_sub *s, enum api_seg_kind kind)
{
    if (s->n_segs == s->cap_segs) {
        int cap = s->cap_segs ? s->cap_segs * 2 : 4;
        struct api_seg *p = api_realloc(s->segs, (size_t)cap * sizeof(*p));
        if (!p) return NULL;
        s->segs = p;
        s->cap_segs = cap;
    }
    struct api_seg *g = &s->segs[s->n_segs++];
    memset(g, 0, sizeof(*g));
    g->kind = kind;
    return g;
}

static const char *api_error_type(int anthropic, int status)
{
    if (anthropic) {
        switch (status) {
        case 400: case 405: return "invalid_request_error";
        case 401: return "authentication_error";
        case 403: return "permission_error";
        case 404: return "not_found_error";
        case 408: return "timeout_error";
        case 413: return "request_too_large";
        case 414: case 431: return "invalid_request_error";
        case 429: return "rate_limit_error";
        case 503: case 507: case 529: return "overloaded_error";
        default: return "api_error";
        }
    }
    switch (status) {
    case 400: case 404: case 405: case 408: case 413: case 414: case 431: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    default: return "server_error";
    }
}

const char *api_error_body_static(int anthropic)
{
    return anthropic ? "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"out of memory\"}}"
                     : "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
}

int api_scaled(const struct api_call *c, int n)
{
    if (c->usage_scale == 1.0 || c->usage_scale <= 0) return n;
    double v = (double)n * c->usage_scale + 0.5;
    return v >= 2147483647.0 ? 2147483647 : (int)v;
}

char *api_error_body(int anthropic, int status, const char *code, const char *message,
                     const char *param)
{
    if (!message) message = "out of memory"; /* a message that could not be copied */
    json_t *o = json_object(), *e = json_object();
    if (anthropic) {
        json_object_set_new(o, "type", json_string("error"));
        json_object_set_new(e, "type", json_string(api_error_type(1, status)));
        json_object_set_new(e, "message", api_json_str(message, strlen(message)));
    } else {
        json_object_set_new(e, "message", api_json_str(message, strlen(message)));
        json_object_set_new(e, "type", json_string(api_error_type(0, status)));
        json_object_set_new(e, "param", param ? json_string(param) : json_null());
        json_object_set_new(e, "code", code ? json_string(code) : json_null());
    }
    json_object_set_new(o, "error", e);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s; /* NULL when out of memory: callers answer api_error_body_static */
}

static json_t *api_usage_json(struct api_call *c)
{
    int p = 0, k = 0, cached = 0;
    long drafted = 0, accepted = 0;
    for (int i = 0; i < c->n_subs; i++) {
        if (i == 0) {
            p = c->subs[i].usage.prompt_tokens ? c->subs[i].usage.prompt_tokens : c->n_prompt;
            cached = c->subs[i].usage.cached_tokens;
        }
        k += c->subs[i].usage.completion_tokens;
        drafted += c->subs[i].usage.spec_drafted;
        accepted += c->subs[i].usage.spec_accepted;
    }
    p = api_scaled(c, p);
    k = api_scaled(c, k);
    cached = api_scaled(c, cached);
    json_t *u = json_object();
    if (c->kind == API_KIND_MESSAGES) {
        json_object_set_new(u, "input_tokens", json_integer(p - cached));
        json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
        json_object_set_new(u, "cache_read_input_tokens", json_integer(cached));
        json_object_set_new(u, "output_tokens", json_integer(k));
    } else if (c->kind == API_KIND_RESPONSES) {
        json_object_set_new(u, "input_tokens", json_integer(p));
        json_object_set_new(u, "input_tokens_details", json_pack("{s:i}", "cached_tokens", cached));
        json_object_set_new(u, "output_tokens", json_integer(k));
        json_object_set_new(u, "output_tokens_details", json_pack("{s:i}", "reasoning_tokens", 0));
        json_object_set_new(u, "total_tokens", json_integer(p + k));
    } else {
        json_object_set_new(u, "prompt_tokens", json_integer(p));
        json_object_set_new(u, "completion_tokens", json_integer(k));
        json_object_set_new(u, "total_tokens", json_integer(p + k));
        json_object_set_new(u, "prompt_tokens_details", json_pack("{s:i}", "cached_tokens", cached));
    }
    /* extension: speculative draft tokens verified / accepted, only where the request drafted */
    if (drafted > 0)
        json_object_set_new(u, "cairn_speculative",
                            json_pack("{s:I,s:I}", "drafted", (json_int_t)drafted, "accepted", (json_int_t)accepted));
    return u;
}

static const char *api_finish_openai(struct api_sub *s)
{
    if (s->n_tool_calls && s->finish == ENGINE_FINISH_STOP) return "tool_calls";
    return s->finish == ENGINE_FINISH_LENGTH ? "length" : "stop";
}

static const char *api_finish_anthropic(struct api_sub *s, const char **stop_seq)
{
    *stop_seq = NULL;
    if (s->n_tool_calls && s->finish == ENGINE_FINISH_STOP) return "tool_use";
    if (s->finish == ENGINE_FINISH_LENGTH) return "max_tokens";
    if (s->stop_text) {
        struct api_req *r = &s->call->req;
        for (int i = 0; i < r->n_stop; i++)
            if (!strcmp(r->stop[i], s->stop_text)) {
                *stop_seq = r->stop[i];
                return "stop_sequence";
            }
    }
    return "end_turn";
}

/* ---- OpenAI chunks ---- */

static json_t *api_chat_chunk(struct api_call *c, struct api_sub *s, json_t *delta,
                              const char *finish)
{
    int chat = c->kind == API_KIND_CHAT;
    json_t *o = json_object(), *ch = json_object();
    json_object_set_new(o, "id", json_string(c->id));
    json_object_set_new(o, "object", json_string(chat ? "chat.completion.chunk" : "text_completion"));
    json_object_set_new(o, "created", json_integer(c->created));
    json_object_set_new(o, "model", json_string(c->model));
    if (chat) {
        json_object_set_new(ch, "index", json_integer(s->index));
        json_object_set_new(ch, "delta", delta);
    } else {
        json_object_set_new(ch, "text", json_object_get(delta, "content") ? json_incref(json_object_get(delta, "content")) : json_string(""));
        json_object_set_new(ch, "index", json_integer(s->index));
        json_decref(delta);
    }
    if (chat && s->logprobs && json_array_size(s->logprobs)) {
        json_object_set_new(ch, "logprobs", json_pack("{s:o}", "content", s->logprobs));
        s->logprobs = json_array();
    } else {
        json_object_set_new(ch, "logprobs", json_null());
    }
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    if (c->req.include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

/* ---- Anthropic blocks / Responses items (streaming) ---- */

static void api_anth_close(struct api_call *c, struct api_sub *s)
{
    if (!s->seg_open || !s->n_segs) return;
    struct api_seg *g = &s->segs[s->n_segs - 1];
    json_t *o = json_pack("{s:s,s:i}", "type", "content_block_stop", "index", g->out_index);
    api_put_sse(c, "content_block_stop", o);
    s->seg_open = 0;
}

static json_t *api_resp_event(struct api_call *c, const char *type)
{
    (void)c;
    return json_pack("{s:s}", "type", type);
}

static void api_resp_send(struct api_call *c, json_t *o)
{
    json_object_set_new(o, "sequence_number", json_integer(c->seq++));
    const char *type = json_string_value(json_object_get(o, "type"));
    char ev[96];
    snprintf(ev, sizeof(ev), "%s", type ? type : "message");
    api_put_sse(c, ev, o);
}

static json_t *api_resp_item(struct api_seg *g, int done)
{
    const char *status = done ? "completed" : "in_progress";
    if (g->kind == API_SEG_TEXT) {
        json_t *content = json_array();
        if (done)
            json_array_append_new(content, json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text",
                                                     api_json_str(g->text.p, g->text.len), "annotations"));
        return json_pack("{s:s,s:s,s:s,s:s,s:o}", "id", g->id, "type", "message", "status", status,
                         "role", "assistant", "content", content);
    }
    if (g->kind == API_SEG_REASONING) {
        json_t *content = json_array();
        if (done)
            json_array_append_new(content, json_pack("{s:s,s:o}", "type", "reasoning_text", "text",
                                                     api_json_str(g->text.p, g->text.len)));
        return json_pack("{s:s,s:s,s:[],s:o}", "id", g->id, "type", "reasoning", "summary", "content", content);
    }
    char fc[64];
    snprintf(fc, sizeof(fc), "fc_%s", g->id + 5); /* id is call_... */
    return json_pack("{s:s,s:s,s:s,s:s,s:s,s:o}", "id", fc, "type", "function_call", "status", status,
                     "call_id", g->id, "name", g->name, "arguments",
                     api_json_str(done ? g->args : "", done ? strlen(g->args) : 0));
}

static const char *api_resp_item_id(struct api_seg *g, char *buf, size_t cap)
{
    if (g->kind == API_SEG_TOOL) snprintf(buf, cap, "fc_%s", g->id + 5);
    else snprintf(buf, cap, "%s", g->id);
    return buf;
}

static void api_resp_close(struct api_call *c, struct api_sub *s)
{
    if (!s->seg_open || !s->n_segs) return;
    struct api_seg *g = &s->segs[s->n_segs - 1];
    char iid[64];
    api_resp_item_id(g, iid, sizeof(iid));
    json_t *o;
    if (g->kind == API_SEG_TEXT) {
        o = api_resp_event(c, "response.output_text.done");
        json_object_set_new(o, "item_id", json_string(iid));
        json_object_set_new(o, "output_index", json_integer(g->out_index));
        json_object_set_new(o, "content_index", json_integer(0));
        json_object_set_new(o, "text", api_json_str(g->text.p, g->text.len));
        api_resp_send(c, o);
        o = api_resp_event(c, "response.content_part.done");
        json_object_set_new(o, "item_id", json_string(iid));
        json_object_set_new(o, "output_index", json_integer(g->out_index));
        json_object_set_new(o, "content_index", json_integer(0));
        json_object_set_new(o, "part", json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text",
                                                 api_json_str(g->text.p, g->text.len), "annotations"));
        api_resp_send(c, o);
    } else if (g->kind == API_SEG_REASONING) {
        o = api_resp_event(c, "response.reasoning_text.done");
        json_object_set_new(o, "item_id", json_string(iid));
        json_object_set_new(o, "output_index", json_integer(g->out_index));
        json_object_set_new(o, "content_index", json_integer(0));
        json_object_set_new(o, "text", api_json_str(g->text.p, g->text.len));
        api_resp_send(c, o);
    }
    o = api_resp_event(c, "response.output_item.done");
    json_object_set_new(o, "output_index", json_integer(g->out_index));
    json_object_set_new(o, "item", api_resp_item(g, 1));
    api_resp_send(c, o);
    s->seg_open = 0;
}

static void api_resp_open(struct api_call *c, struct api_sub *s, struct api_seg *g)
{
    json_t *o = api_resp_event(c, "response.output_item.added");
    json_object_set_new(o, "output_index", json_integer(g->out_index));
    json_object_set_new(o, "item", api_resp_item(g, 0));
    api_resp_send(c, o);
    if (g->kind == API_SEG_TEXT) {
        o = api_resp_event(c, "response.content_part.added");
        json_object_set_new(o, "item_id", json_string(g->id));
        json_object_set_new(o, "output_index", json_integer(g->out_index));
        json_object_set_new(o, "content_index", json_integer(0));
        json_object_set_new(o, "part", json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text", "", "annotations"));
        api_resp_send(c, o);
    }
    s->seg_open = 1;
}

/* Response object (Responses API). status: in_progress, completed, incomplete, failed. */
static json_t *api_resp_object(struct api_call *c, const char *status, int with_output)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(c->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer(c->created));
    json_object_set_new(o, "status", json_string(status));
    json_object_set_new(o, "error", json_null());
    json_object_set_new(o, "incomplete_details",
                        !strcmp(status, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
    json_object_set_new(o, "model", json_string(c->model));
    json_t *out = json_array();
    if (with_output) {
        struct api_sub *s = &c->subs[0];
        for (int i = 0; i < s->n_segs; i++) json_array_append_new(out, api_resp_item(&s->segs[i], 1));
    }
    json_object_set_new(o, "output", out);
    json_object_set_new(o, "parallel_tool_calls", json_boolean(c->req.parallel_tools));
    json_object_set_new(o, "tool_choice", json_string(c->req.tool_choice_none ? "none" : "auto"));
    json_object_set_new(o, "tools", json_array());
    json_object_set_new(o, "usage", with_output ? api_usage_json(c) : json_null());
    return o;
}

static void api_resp_lifecycle(struct api_call *c, const char *type, const char *status, int with_output)
{
    json_t *o = api_resp_event(c, type);
    json_object_set_new(o, "response", api_resp_object(c, status, with_output));
    api_resp_send(c, o);
}

/* ---- events ---- */

void api_emit_stream_start(struct api_call *c)
{
    switch (c->kind) {
    case API_KIND_CHAT:
        for (int i = 0; i < c->n_subs; i++)
            api_put_sse(c, NULL, api_chat_chunk(c, &c->subs[i],
                                                json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL));
        break;
    case API_KIND_COMPLETIONS:
        if (c->req.echo && c->req.prompt)
            for (int i = 0; i < c->n_subs; i++)
                api_put_sse(c, NULL, api_chat_chunk(c, &c->subs[i],
                                                    json_pack("{s:s}", "content", c->req.prompt), NULL));
        break;
    case API_KIND_MESSAGES: {
        /* Sent once the engine reported the prefix-cache result (api_call_pump): the same
         * input numbers as the final message_delta; no output yet. */
        json_t *u = api_usage_json(c);
        json_object_set_new(u, "output_tokens", json_integer(0));
        json_t *m = json_pack("{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}", "id", c->id, "type", "message",
                              "role", "assistant", "model", c->model, "content", "stop_reason",
                              "stop_sequence", "usage", u);
        api_put_sse(c, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", m));
        api_put_sse(c, "ping", json_pack("{s:s}", "type", "ping"));
        break;
    }
    case API_KIND_RESPONSES:
        api_resp_lifecycle(c, "response.created", "in_progress", 0);
        api_resp_lifecycle(c, "response.in_progress", "in_progress", 0);
        break;
    default: break;
    }
}

void api_emit_event(struct api_sub *s, const struct api_out_event *ev)
{
    struct api_call *c = s->call;
    enum api_seg_kind kind = ev->kind == API_OUT_TEXT ? API_SEG_TEXT
                           : ev->kind == API_OUT_REASONING ? API_SEG_REASONING : API_SEG_TOOL;
    struct api_seg *last = s->n_segs ? &s->segs[s->n_segs - 1] : NULL;
    int new_seg = !last || last->kind != kind || kind == API_SEG_TOOL;
    struct api_seg *g = last;
    if (new_seg) {
        if (c->streaming && c->kind == API_KIND_MESSAGES) api_anth_close(c, s);
        if (c->streaming && c->kind == API_KIND_RESPONSES) api_resp_close(c, s);
        g = api_seg_push(s, kind);
        if (!g) {
            c->oom = 1;
            return;
        }
        g->out_index = c->n_out_items++;
        if (kind == API_SEG_TOOL) {
            g->name = api_strdup(ev->name);
            g->args = api_strdup(ev->arguments);
            if (!g->name || !g->args) {
                free(g->name);
                free(g->args);
                s->n_segs--;
                c->oom = 1;
                return;
            }
            s->n_tool_calls++;
            api_new_id(c->api, c->kind == API_KIND_MESSAGES ? "toolu_" : "call_", g->id, sizeof(g->id));
        } else if (c->kind == API_KIND_RESPONSES) {
            api_new_id(c->api, kind == API_SEG_TEXT ? "msg_" : "rs_", g->id, sizeof(g->id));
        }
    }
    if (kind != API_SEG_TOOL && api_sbuf_add(&g->text, ev->text, ev->len) != CAIRN_OK) {
        c->oom = 1;
        return;
    }
    if (!c->streaming) return;

    switch (c->kind) {
    case API_KIND_CHAT: {
        json_t *d;
        if (kind == API_SEG_TOOL) {
            json_t *fn = json_pack("{s:s,s:o}", "name", g->name, "arguments", api_json_str(g->args, strlen(g->args)));
            json_t *tc = json_pack("{s:i,s:s,s:s,s:o}", "index", s->n_tool_calls - 1, "id", g->id,
                                   "type", "function", "function", fn);
            d = json_pack("{s:[o]}", "tool_calls", tc);
        } else {
            d = json_object();
            json_object_set_new(d, kind == API_SEG_TEXT ? "content" : "reasoning_content",
                                api_json_str(ev->text, ev->len));
        }
        api_put_sse(c, NULL, api_chat_chunk(c, s, d, NULL));
        break;
    }
    case API_KIND_COMPLETIONS:
        api_put_sse(c, NULL, api_chat_chunk(c, s, json_pack("{s:o}", "content", api_json_str(ev->text, ev->len)), NULL));
        break;
    case API_KIND_MESSAGES:
        if (new_seg) {
            json_t *cb;
            if (kind == API_SEG_TEXT) cb = json_pack("{s:s,s:s}", "type", "text", "text", "");
            else if (kind == API_SEG_REASONING) cb = json_pack("{s:s,s:s}", "type", "thinking", "thinking", "");
            else cb = json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", g->id, "name", g->name, "input");
            api_put_sse(c, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start",
                                                            "index", g->out_index, "content_block", cb));
            s->seg_open = 1;
        }
        {
            json_t *d;
            if (kind == API_SEG_TEXT)
                d = json_pack("{s:s,s:o}", "type", "text_delta", "text", api_json_str(ev->text, ev->len));
            else if (kind == API_SEG_REASONING)
                d = json_pack("{s:s,s:o}", "type", "thinking_delta", "thinking", api_json_str(ev->text, ev->len));
            else
                d = json_pack("{s:s,s:o}", "type", "input_json_delta", "partial_json", api_json_str(g->args, strlen(g->args)));
            api_put_sse(c, "content_block_delta", json_pack("{s:s,s:i,s:o}", "type", "content_block_delta",
                                                            "index", g->out_index, "delta", d));
        }
        if (kind == API_SEG_TOOL) api_anth_close(c, s);
        break;
    case API_KIND_RESPONSES: {
        if (new_seg) api_resp_open(c, s, g);
        char iid[64];
        api_resp_item_id(g, iid, sizeof(iid));
        json_t *o;
        if (kind == API_SEG_TOOL) {
            o = api_resp_event(c, "response.function_call_arguments.delta");
            json_object_set_new(o, "item_id", json_string(iid));
            json_object_set_new(o, "output_index", json_integer(g->out_index));
            json_object_set_new(o, "delta", api_json_str(g->args, strlen(g->args)));
            api_resp_send(c, o);
            o = api_resp_event(c, "response.function_call_arguments.done");
            json_object_set_new(o, "item_id", json_string(iid));
            json_object_set_new(o, "output_index", json_integer(g->out_index));
            json_object_set_new(o, "arguments", api_json_str(g->args, strlen(g->args)));
            api_resp_send(c, o);
            api_resp_close(c, s);
        } else {
            o = api_resp_event(c, kind == API_SEG_TEXT ? "response.output_text.delta" : "response.reasoning_text.delta");
            json_object_set_new(o, "item_id", json_string(iid));
            json_object_set_new(o, "output_index", json_integer(g->out_index));
            json_object_set_new(o, "content_index", json_integer(0));
            json_object_set_new(o, "delta", api_json_str(ev->text, ev->len));
            api_resp_send(c, o);
        }
        break;
    }
    default: break;
    }
}

static json_t *api_logprob_entry(struct api_call *c, int32_t id, float lp)
{
    char buf[256];
    int n = c->api->be.token_text ? c->api->be.token_text(c->api->be.ctx, c->model_idx, id, buf, sizeof(buf)) : -1;
    if (n < 0) n = snprintf(buf, sizeof(buf), "<%d>", id);
    if (n > (int)sizeof(buf) - 1) n = (int)sizeof(buf) - 1;
    json_t *bytes = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)buf[i]));
    return json_pack("{s:o,s:f,s:o}", "token", api_json_str(buf, (size_t)n), "logprob", (double)lp, "bytes", bytes);
}

void api_emit_token_logprobs(struct api_sub *s, const struct api_tok_raw *t)
{
    struct api_call *c = s->call;
    if (!s->logprobs) s->logprobs = json_array();
    json_t *e = api_logprob_entry(c, t->id, t->logprob);
    json_t *tops = json_array();
    for (int i = 0; i < t->n_top; i++) json_array_append_new(tops, api_logprob_entry(c, t->top_ids[i], t->top_logprobs[i]));
    json_object_set_new(e, "top_logprobs", tops);
    json_array_append_new(s->logprobs, e);
}

void api_emit_sub_done(struct api_sub *s)
{
    struct api_call *c = s->call;
    if (c->kind == API_KIND_CHAT || c->kind == API_KIND_COMPLETIONS)
        api_put_sse(c, NULL, api_chat_chunk(c, s, json_object(), api_finish_openai(s)));
}

void api_emit_stream_end(struct api_call *c)
{
    struct api_sub *s = &c->subs[0];
    switch (c->kind) {
    case API_KIND_CHAT:
    case API_KIND_COMPLETIONS:
        if (c->req.include_usage) {
            json_t *o = json_object();
            json_object_set_new(o, "id", json_string(c->id));
            json_object_set_new(o, "object", json_string(c->kind == API_KIND_CHAT ? "chat.completion.chunk" : "text_completion"));
            json_object_set_new(o, "created", json_integer(c->created));
            json_object_set_new(o, "model", json_string(c->model));
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", api_usage_json(c));
            api_put_sse(c, NULL, o);
        }
        {
            const char *done[] = {"data: [DONE]\n\n"};
            api_put_raw(c, done, 1);
        }
        break;
    case API_KIND_MESSAGES: {
        api_anth_close(c, s);
        const char *seq;
        const char *reason = api_finish_anthropic(s, &seq);
        json_t *d = json_pack("{s:s,s:o}", "stop_reason", reason, "stop_sequence", seq ? json_string(seq) : json_null());
        api_put_sse(c, "message_delta", json_pack("{s:s,s:o,s:o}", "type", "message_delta", "delta", d,
                                                  "usage", api_usage_json(c)));
        api_put_sse(c, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        break;
    }
    case API_KIND_RESPONSES: {
        api_resp_close(c, s);
        int incomplete = s->finish == ENGINE_FINISH_LENGTH;
        api_resp_lifecycle(c, incomplete ? "response.incomplete" : "response.completed",
                           incomplete ? "incomplete" : "completed", 1);
        break;
    }
    default: break;
    }
}

void api_emit_stream_error(struct api_call *c, const char *message)
{
    if (!message) message = "out of memory";
    switch (c->kind) {
    case API_KIND_MESSAGES:
        api_put_sse(c, "error", json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", "api_error",
                                          "message", api_json_str(message, strlen(message))));
        break;
    case API_KIND_RESPONSES: {
        json_t *o = api_resp_event(c, "error");
        json_object_set_new(o, "code", json_string("server_error"));
        json_object_set_new(o, "message", api_json_str(message, strlen(message)));
        json_object_set_new(o, "param", json_null());
        api_resp_send(c, o);
        o = api_resp_event(c, "response.failed");
        json_t *r = api_resp_object(c, "failed", 0);
        json_object_set_new(r, "error", json_pack("{s:s,s:o}", "code", "server_error", "message",
                                                  api_json_str(message, strlen(message))));
        json_object_set_new(o, "response", r);
        api_resp_send(c, o);
        break;
    }
    default: {
        char *e = api_error_body(0, 500, NULL, message, NULL);
        const char *parts[] = {"data: ", e ? e : api_error_body_static(0), "\n\n"};
        api_put_raw(c, parts, 3);
        free(e);
        break;
    }
    }
}

void api_emit_keepalive(struct api_call *c)
{
    /* Anthropic's ping is an event, valid only after message_start; before it (a long prefill)
     * an SSE comment, which every client skips. */
    if (c->kind == API_KIND_MESSAGES && c->started) {
        api_put_sse(c, "ping", json_pack("{s:s}", "type", "ping"));
    } else {
        const char *ka[] = {": keep-alive\n\n"};
        api_put_raw(c, ka, 1);
    }
}

/* ---- whole bodies ---- */

static json_t *api_seg_text_json(struct api_sub *s, enum api_seg_kind kind)
{
    struct api_sbuf b = {0};
    for (int i = 0; i < s->n_segs; i++)
        if (s->segs[i].kind == kind &&
            api_sbuf_add(&b, s->segs[i].text.p ? s->segs[i].text.p : "", s->segs[i].text.len) != CAIRN_OK)
            s->call->oom = 1;
    json_t *v = b.len && !s->call->oom ? api_json_str(b.p, b.len) : NULL;
    if (b.len && !v) s->call->oom = 1;
    api_sbuf_free(&b);
    return v;
}

static json_t *api_legacy_logprobs(struct api_call *c, struct api_sub *s)
{
    if (!s->logprobs) return json_null();
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i;
    json_t *e;
    size_t off = c->req.echo && c->req.prompt ? strlen(c->req.prompt) : 0;
    json_array_foreach(s->logprobs, i, e) {
        json_array_append(tokens, json_object_get(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *t = json_object();
        size_t j;
        json_t *a;
        json_array_foreach(json_object_get(e, "top_logprobs"), j, a)
            json_object_set(t, json_string_value(json_object_get(a, "token")), json_object_get(a, "logprob"));
        json_array_append_new(tops, t);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += json_string_length(json_object_get(e, "token"));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

void api_emit_body(struct api_call *c)
{
    json_t *o = json_object();
    switch (c->kind) {
    case API_KIND_CHAT:
    case API_KIND_COMPLETIONS: {
        int chat = c->kind == API_KIND_CHAT;
        json_object_set_new(o, "id", json_string(c->id));
        json_object_set_new(o, "object", json_string(chat ? "chat.completion" : "text_completion"));
        json_object_set_new(o, "created", json_integer(c->created));
        json_object_set_new(o, "model", json_string(c->model));
        json_t *choices = json_array();
        for (int i = 0; i < c->n_subs; i++) {
            struct api_sub *s = &c->subs[i];
            json_t *ch = json_object();
            if (chat) {
                json_object_set_new(ch, "index", json_integer(i));
                json_t *m = json_object();
                json_object_set_new(m, "role", json_string("assistant"));
                json_t *text = api_seg_text_json(s, API_SEG_TEXT);
                json_object_set_new(m, "content", text ? text : (s->n_tool_calls ? json_null() : json_string("")));
                json_t *reason = api_seg_text_json(s, API_SEG_REASONING);
                if (reason) json_object_set_new(m, "reasoning_content", reason);
                if (s->n_tool_calls) {
                    json_t *tcs = json_array();
                    for (int k = 0; k < s->n_segs; k++) {
                        struct api_seg *g = &s->segs[k];
                        if (g->kind != API_SEG_TOOL) continue;
                        json_array_append_new(tcs, json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", g->id, "type", "function",
                                                             "function", "name", g->name, "arguments",
                                                             api_json_str(g->args, strlen(g->args))));
                    }
                    json_object_set_new(m, "tool_calls", tcs);
                }
                json_object_set_new(ch, "message", m);
                json_object_set_new(ch, "logprobs", s->logprobs ? json_pack("{s:O}", "content", s->logprobs) : json_null());
            } else {
                json_t *text = api_seg_text_json(s, API_SEG_TEXT);
                if (c->req.echo && c->req.prompt) {
                    struct api_sbuf b = {0};
                    if (api_sbuf_adds(&b, c->req.prompt) != CAIRN_OK ||
                        (text && api_sbuf_adds(&b, json_string_value(text)) != CAIRN_OK))
                        c->oom = 1;
                    json_decref(text);
                    text = api_json_str(b.p, b.len);
                    api_sbuf_free(&b);
                }
                json_object_set_new(ch, "text", text ? text : json_string(""));
                json_object_set_new(ch, "index", json_integer(i));
                json_object_set_new(ch, "logprobs", api_legacy_logprobs(c, s));
            }
            json_object_set_new(ch, "finish_reason", json_string(api_finish_openai(s)));
            json_array_append_new(choices, ch);
        }
        json_object_set_new(o, "choices", choices);
        json_object_set_new(o, "usage", api_usage_json(c));
        break;
    }
    case API_KIND_MESSAGES: {
        struct api_sub *s = &c->subs[0];
        json_object_set_new(o, "id", json_string(c->id));
        json_object_set_new(o, "type", json_string("message"));
        json_object_set_new(o, "role", json_string("assistant"));
        json_object_set_new(o, "model", json_string(c->model));
        json_t *content = json_array();
        for (int k = 0; k < s->n_segs; k++) {
            struct api_seg *g = &s->segs[k];
            if (g->kind == API_SEG_TEXT)
                json_array_append_new(content, json_pack("{s:s,s:o}", "type", "text", "text", api_json_str(g->text.p, g->text.len)));
            else if (g->kind == API_SEG_REASONING)
                json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                                                         api_json_str(g->text.p, g->text.len), "signature", ""));
            else {
                json_error_t je;
                json_t *input = json_loads(g->args, 0, &je);
                if (!json_is_object(input)) {
                    json_decref(input);
                    input = json_object();
                }
                json_array_append_new(content, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", g->id,
                                                         "name", g->name, "input", input));
            }
        }
        json_object_set_new(o, "content", content);
        const char *seq;
        json_object_set_new(o, "stop_reason", json_string(api_finish_anthropic(s, &seq)));
        json_object_set_new(o, "stop_sequence", seq ? json_string(seq) : json_null());
        json_object_set_new(o, "usage", api_usage_json(c));
        break;
    }
    case API_KIND_RESPONSES:
        json_decref(o);
        o = api_resp_object(c, c->subs[0].finish == ENGINE_FINISH_LENGTH ? "incomplete" : "completed", 1);
        break;
    default: break;
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    api_sbuf_free(&c->body);
    if (!s) c->oom = 1; /* the caller answers 503 */
    c->body.p = s;
    c->body.len = c->body.cap = s ? strlen(s) : 0;
}
