/* Incremental output parser (see api_out.h). The parser keeps one growing buffer: bytes that
 * might start a tag (held back) or a tool-call body still open. Everything else is emitted as
 * soon as it is known not to be markup. */
#include "api/api_out.h"
#include "api/api_int.h" /* api_malloc & co (the tests' allocation-failure hook) */

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/status.h"

enum { API_OUT_S_TEXT = 0, API_OUT_S_THINK, API_OUT_S_TOOL, API_OUT_S_LLAMA };

static const char API_OUT_THINK_OPEN[] = "<think>";
static const char API_OUT_THINK_CLOSE[] = "</think>";
static const char API_OUT_TOOL_OPEN[] = "<tool_call>";
static const char API_OUT_TOOL_CLOSE[] = "</tool_call>";
static const char API_OUT_PYTHON_TAG[] = "<|python_tag|>";

void api_out_init(struct api_out *p, int in_think, int tools, api_out_fn emit, void *user)
{
    memset(p, 0, sizeof(*p));
    p->tools = tools;
    p->state = in_think ? API_OUT_S_THINK : API_OUT_S_TEXT;
    p->reasoning_start = in_think;
    p->at_start = 1;
    p->emit = emit;
    p->user = user;
}

void api_out_free(struct api_out *p)
{
    free(p->buf);
    p->buf = NULL;
    p->len = p->cap = 0;
}

static int api_out_append(struct api_out *p, const char *s, size_t n)
{
    if (p->len + n + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 64;
        while (cap < p->len + n + 1) cap *= 2;
        char *b = api_realloc(p->buf, cap);
        if (!b) return CAIRN_ERR_NOMEM;
        p->buf = b;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, s, n);
    p->len += n;
    p->buf[p->len] = 0;
    return CAIRN_OK;
}

static void api_out_consume(struct api_out *p, size_t n)
{
    memmove(p->buf, p->buf + n, p->len - n);
    p->len -= n;
    if (p->buf) p->buf[p->len] = 0;
}

static void api_out_emit_text(struct api_out *p, enum api_out_kind kind, const char *s, size_t n)
{
    if (kind == API_OUT_TEXT && p->after_think) {
        while (n > 0 && isspace((unsigned char)*s)) s++, n--;
        if (n == 0) return;
        p->after_think = 0;
    }
    if (kind == API_OUT_REASONING && p->reasoning_start) {
        while (n > 0 && isspace((unsigned char)*s)) s++, n--;
        if (n == 0) return;
        p->reasoning_start = 0;
    }
    if (n == 0) return;
    struct api_out_event ev = {.kind = kind, .text = s, .len = n};
    p->emit(p->user, &ev);
}

/* memmem for a NUL-free needle */
static const char *api_out_find(const char *h, size_t hn, const char *needle)
{
    size_t nn = strlen(needle);
    if (hn < nn) return NULL;
    return memmem(h, hn, needle, nn);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t api_out_partial(const char *s, size_t n, const char *tag)
{
    size_t tn = strlen(tag);
    size_t k = n < tn - 1 ? n : tn - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static char *api_out_strndup(const char *s, size_t n)
{
    char *r = api_malloc(n + 1);
    if (!r) return NULL;
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

/* XML form: <function=NAME><parameter=P>V</parameter>...</function> */
static int api_out_parse_xml(const char *s, const char *end, char **name, char **args)
{
    const char *q = s + strlen("<function=");
    const char *gt = memchr(q, '>', (size_t)(end - q));
    if (!gt || gt == q) return -1;
    json_t *obj = json_object();
    *name = api_out_strndup(q, (size_t)(gt - q));
    q = gt + 1;
    for (;;) {
        while (q < end && isspace((unsigned char)*q)) q++;
        if (q >= end) break;
        if ((size_t)(end - q) >= 11 && memcmp(q, "</function>", 11) == 0) break;
        if ((size_t)(end - q) < 11 || memcmp(q, "<parameter=", 11) != 0) goto fail;
        q += 11;
        gt = memchr(q, '>', (size_t)(end - q));
        if (!gt || gt == q) goto fail;
        char *pname = api_out_strndup(q, (size_t)(gt - q));
        q = gt + 1;
        const char *ve = api_out_find(q, (size_t)(end - q), "</parameter>");
        if (!ve) ve = end; /* tolerate a missing close at the end */
        const char *vs = q;
        const char *vend = ve;
        if (vs < vend && *vs == '\n') vs++;
        if (vend > vs && vend[-1] == '\n') vend--;
        json_error_t je;
        json_t *v = json_loadb(vs, (size_t)(vend - vs), JSON_DECODE_ANY, &je);
        if (!v) v = json_stringn(vs, (size_t)(vend - vs));
        if (!v) v = json_string("");
        json_object_set_new(obj, pname, v);
        free(pname);
        q = ve < end ? ve + 12 : end;
    }
    *args = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(obj);
    if (!*name || !*args) goto fail_nofree;
    return 0;
fail:
    json_decref(obj);
fail_nofree:
    free(*name);
    *name = NULL;
    return -1;
}

int api_out_parse_tool_body(const char *body, size_t len, char **name, char **args)
{
    *name = NULL;
    *args = NULL;
    const char *s = body, *end = body + len;
    while (s < end && isspace((unsigned char)*s)) s++;
    while (end > s && isspace((unsigned char)end[-1])) end--;
    if (s == end) return -1;
    if ((size_t)(end - s) > 10 && memcmp(s, "<function=", 10) == 0)
        return api_out_parse_xml(s, end, name, args);
    json_error_t je;
    json_t *root = json_loadb(s, (size_t)(end - s), 0, &je);
    if (!root || !json_is_object(root)) goto fail;
    json_t *n = json_object_get(root, "name");
    json_t *a = json_object_get(root, "arguments");
    if (!a) a = json_object_get(root, "parameters");
    if (!json_is_string(n) || json_string_length(n) == 0) goto fail;
    if (!a) a = json_object();
    else json_incref(a);
    if (json_is_string(a)) {
        *args = api_strdup(json_string_value(a));
    } else if (json_is_object(a)) {
        *args = json_dumps(a, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_decref(a);
    if (!*args) goto fail;
    *name = api_strdup(json_string_value(n));
    json_decref(root);
    if (!*name) {
        free(*args);
        *args = NULL;
        return -1;
    }
    return 0;
fail:
    json_decref(root);
    return -1;
}

static void api_out_emit_call(struct api_out *p, const char *name, const char *args)
{
    struct api_out_event ev = {.kind = API_OUT_TOOL_CALL, .name = name, .arguments = args};
    p->n_tool_calls++;
    p->emit(p->user, &ev);
}

/* A closed (or, at the end, unterminated) tool-call body: a call, or text when it won't parse. */
static void api_out_tool_body(struct api_out *p, const char *body, size_t len, int closed)
{
    char *name, *args;
    if (api_out_parse_tool_body(body, len, &name, &args) == 0) {
        api_out_emit_call(p, name, args);
        free(name);
        free(args);
        p->after_think = 1; /* whitespace between calls is not content */
        return;
    }
    api_out_emit_text(p, API_OUT_TEXT, API_OUT_TOOL_OPEN, strlen(API_OUT_TOOL_OPEN));
    api_out_emit_text(p, API_OUT_TEXT, body, len);
    if (closed) api_out_emit_text(p, API_OUT_TEXT, API_OUT_TOOL_CLOSE, strlen(API_OUT_TOOL_CLOSE));
}

/* Llama-3 JSON: one object, or several separated by ';'. */
static int api_out_llama(struct api_out *p, const char *s, size_t n)
{
    const char *e = s + n;
    while (s < e && isspace((unsigned char)*s)) s++;
    size_t tl = strlen(API_OUT_PYTHON_TAG);
    if ((size_t)(e - s) >= tl && memcmp(s, API_OUT_PYTHON_TAG, tl) == 0) s += tl;
    /* Validate every piece first, so a failure leaves the whole thing as text. */
    char *names[API_OUT_MAX_JSON_CALLS], *argv[API_OUT_MAX_JSON_CALLS];
    int k = 0;
    const char *q = s;
    while (q < e && k < API_OUT_MAX_JSON_CALLS) {
        const char *semi = q;
        int depth = 0, in_str = 0;
        for (; semi < e; semi++) {
            char c = *semi;
            if (in_str) {
                if (c == '\\' && semi + 1 < e) semi++;
                else if (c == '"') in_str = 0;
            } else if (c == '"') in_str = 1;
            else if (c == '{' || c == '[') depth++;
            else if (c == '}' || c == ']') depth--;
            else if (c == ';' && depth == 0) break;
        }
        if (api_out_parse_tool_body(q, (size_t)(semi - q), &names[k], &argv[k]) != 0) break;
        k++;
        q = semi < e ? semi + 1 : e;
        while (q < e && isspace((unsigned char)*q)) q++;
    }
    int ok = k > 0 && q >= e;
    for (int i = 0; i < k; i++) {
        if (ok) api_out_emit_call(p, names[i], argv[i]);
        free(names[i]);
        free(argv[i]);
    }
    return ok ? 0 : -1;
}

/* Runs the state machine over the buffer as far as it can. */
static void api_out_run(struct api_out *p, int final)
{
    for (;;) {
        if (p->state == API_OUT_S_TEXT) {
            if (p->at_start && p->tools) {
                size_t i = 0;
                while (i < p->len && isspace((unsigned char)p->buf[i])) i++;
                if (i == p->len && !final) return; /* only whitespace yet */
                if (i < p->len) {
                    size_t rest = p->len - i, tl = strlen(API_OUT_PYTHON_TAG);
                    if (p->buf[i] == '{') {
                        p->state = API_OUT_S_LLAMA;
                        continue;
                    }
                    if (memcmp(p->buf + i, API_OUT_PYTHON_TAG, rest < tl ? rest : tl) == 0) {
                        if (rest >= tl) {
                            p->state = API_OUT_S_LLAMA;
                            continue;
                        }
                        if (!final) return;
                    }
                }
            }
            const char *b = p->buf ? p->buf : "";
            const char *t = api_out_find(b, p->len, API_OUT_THINK_OPEN);
            const char *c = p->tools ? api_out_find(b, p->len, API_OUT_TOOL_OPEN) : NULL;
            if (t || c) {
                int is_tool = c && (!t || c < t);
                const char *at = is_tool ? c : t;
                size_t pre = (size_t)(at - b);
                if (pre) p->at_start = 0;
                api_out_emit_text(p, API_OUT_TEXT, b, pre);
                api_out_consume(p, pre + strlen(is_tool ? API_OUT_TOOL_OPEN : API_OUT_THINK_OPEN));
                p->state = is_tool ? API_OUT_S_TOOL : API_OUT_S_THINK;
                if (!is_tool) p->reasoning_start = 1;
                p->at_start = 0;
                continue;
            }
            size_t hold = 0;
            if (!final) {
                size_t h1 = api_out_partial(b, p->len, API_OUT_THINK_OPEN);
                size_t h2 = p->tools ? api_out_partial(b, p->len, API_OUT_TOOL_OPEN) : 0;
                hold = h1 > h2 ? h1 : h2;
            }
            size_t out = p->len - hold;
            if (out) {
                p->at_start = 0;
                api_out_emit_text(p, API_OUT_TEXT, b, out);
                api_out_consume(p, out);
            }
            return;
        }
        if (p->state == API_OUT_S_THINK) {
            const char *b = p->buf ? p->buf : "";
            if (p->reasoning_start) {
                /* The prompt opened <think> but the model wrote it again: drop the repeat. */
                size_t i = 0, tl = strlen(API_OUT_THINK_OPEN);
                while (i < p->len && isspace((unsigned char)b[i])) i++;
                size_t rest = p->len - i;
                if (rest && memcmp(b + i, API_OUT_THINK_OPEN, rest < tl ? rest : tl) == 0) {
                    if (rest < tl && !final) return;
                    if (rest >= tl) {
                        api_out_consume(p, i + tl);
                        continue;
                    }
                }
            }
            const char *e = api_out_find(b, p->len, API_OUT_THINK_CLOSE);
            if (e) {
                size_t pre = (size_t)(e - b), vis = pre;
                while (vis > 0 && isspace((unsigned char)b[vis - 1])) vis--; /* held back */
                api_out_emit_text(p, API_OUT_REASONING, b, vis);
                api_out_consume(p, pre + strlen(API_OUT_THINK_CLOSE));
                p->state = API_OUT_S_TEXT;
                p->after_think = 1;
                continue;
            }
            size_t hold = final ? 0 : api_out_partial(b, p->len, API_OUT_THINK_CLOSE);
            /* Hold trailing whitespace too, so reasoning doesn't end with the "\n" before
             * </think>. */
            if (!final)
                while (hold < p->len && isspace((unsigned char)b[p->len - hold - 1])) hold++;
            size_t out = p->len - hold;
            if (out) {
                api_out_emit_text(p, API_OUT_REASONING, b, out);
                api_out_consume(p, out);
            }
            return;
        }
        if (p->state == API_OUT_S_TOOL) {
            const char *b = p->buf ? p->buf : "";
            const char *e = api_out_find(b, p->len, API_OUT_TOOL_CLOSE);
            if (e) {
                size_t pre = (size_t)(e - b);
                api_out_tool_body(p, b, pre, 1);
                api_out_consume(p, pre + strlen(API_OUT_TOOL_CLOSE));
                p->state = API_OUT_S_TEXT;
                continue;
            }
            if (final) {
                api_out_tool_body(p, b, p->len, 0);
                api_out_consume(p, p->len);
            }
            return;
        }
        /* LLAMA */
        if (final) {
            if (api_out_llama(p, p->buf ? p->buf : "", p->len) != 0)
                api_out_emit_text(p, API_OUT_TEXT, p->buf ? p->buf : "", p->len);
            api_out_consume(p, p->len);
        }
        return;
    }
}

int api_out_feed(struct api_out *p, const char *text, size_t len)
{
    if (len == 0) return CAIRN_OK;
    int rc = api_out_append(p, text, len);
    if (rc) return rc;
    api_out_run(p, 0);
    return CAIRN_OK;
}

int api_out_finish(struct api_out *p)
{
    api_out_run(p, 1);
    return CAIRN_OK;
}
