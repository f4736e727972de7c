/* Out of memory inside the API layer (issue 19, bug 4), by fault injection: for each request
 * shape, every allocation of the API room (api_test_fail_alloc) is made to fail in turn - once
 * (the n-th only) and for good (from the n-th on) - until a run makes fewer allocations than the
 * failing one. Each run must end (no hang), answer
 * a status that is 200 or an error, with a body that is valid JSON in the path's shape (or an SSE
 * stream whose every event is valid JSON and that never carries a cut event), and leak nothing
 * (LeakSanitizer at exit). Then the same request without faults gives the normal answer: one
 * failed call hurts no other.
 *
 * Paths this reaches that crashed or misbehaved before: a strdup of the engine's error text
 * failing (NULL reached strlen in the error encoder), a lost token's text (the answer silently
 * missed bytes), an SSE event cut in the middle, ignored api_sbuf_add / api_out_feed results.
 *
 * jansson's own allocations are not failed here: jansson 2.14 is not safe when its allocator
 * fails (json_loadb crashes in its lexer, json_dumps emits JSON with a key missing), so that is
 * a limit of the library, not something the API can handle. */
#include <unistd.h>

#include <jansson.h>

#include "api/api.h"
#include "testlib.h"

static const char *SCRIPT =
    "{\"models\":[{\"id\":\"fake\",\"context_length\":4096},{\"id\":\"small\",\"context_length\":"
    "20}],"
    "\"replies\":[{\"match\":\"weather\",\"text\":\"<think>\\nHmm.\\n</"
    "think>\\n\\n<tool_call>\\n{\\\"name\\\": \\\"w\\\", "
    "\\\"arguments\\\": {\\\"c\\\": \\\"P\\\"}}\\n</tool_call>\"},"
    "{\"match\":\"fail\",\"text\":\"abcdefgh\",\"error_after\":2}],"
    "\"default\":\"Hello there, how are you?\",\"chunk_bytes\":4,\"cached_tokens\":2}";

static void nop(void *u)
{
    (void)u;
}

struct out {
    int status;
    int streaming;
    char *text;
    size_t len;
};

/* Runs one request to its end (bounded: a hang fails the test). */
static int run(struct api *a, const char *path, const char *body, struct out *o)
{
    memset(o, 0, sizeof(*o));
    struct api_call *c = api_call_start(a, "POST", path, body, strlen(body), nop, NULL);
    if (!c) { /* the call itself could not be allocated: the HTTP room answers 503 */
        o->status = 503;
        o->text = strdup(api_error_json_static(path));
        o->len = strlen(o->text);
        return 1;
    }
    int i;
    for (i = 0; i < 20000 && !api_call_ready(c); i++)
        usleep(200);
    if (i == 20000) {
        api_call_release(c, 1);
        return 0;
    }
    o->status = api_call_status(c);
    o->streaming = api_call_streaming(c) && o->status == 200;
    size_t cap = 1 << 16;
    o->text = malloc(cap);
    if (o->streaming) {
        char buf[512];
        int eof = 0;
        for (i = 0; i < 100000 && !eof; i++) {
            size_t n = api_call_read(c, buf, sizeof(buf), &eof);
            if (!n) {
                if (!eof) usleep(100);
                continue;
            }
            if (o->len + n + 1 > cap) o->text = realloc(o->text, cap *= 2);
            memcpy(o->text + o->len, buf, n);
            o->len += n;
        }
        if (!eof) {
            api_call_release(c, 1);
            return 0;
        }
    } else {
        size_t n;
        const char *b = api_call_body(c, &n);
        if (n + 1 > cap) o->text = realloc(o->text, cap = n + 1);
        memcpy(o->text, b, n);
        o->len = n;
    }
    o->text[o->len] = 0;
    api_call_release(c, 0);
    return 1;
}

/* The answer is well formed: JSON (an error object for errors), or SSE events of whole JSON. */
static int well_formed(const char *path, const struct out *o, char *why, size_t cap)
{
    int anth = api_path_is_anthropic(path);
    if (o->status != 200 && o->status < 400) return snprintf(why, cap, "status %d", o->status), 0;
    if (!o->streaming) {
        json_error_t je;
        json_t *v = json_loadb(o->text, o->len, 0, &je);
        int ok = v != NULL;
        if (ok && o->status >= 400)
            ok = anth ? json_is_object(json_object_get(v, "error")) &&
                            json_is_string(json_object_get(v, "type"))
                      : json_is_string(json_object_get(json_object_get(v, "error"), "message"));
        json_decref(v);
        if (!ok) snprintf(why, cap, "body not valid (%d): %.300s", o->status, o->text);
        return ok;
    }
    /* every "data: " line is whole JSON (or [DONE]) */
    const char *p = o->text;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) return snprintf(why, cap, "a cut SSE event: %.200s", p), 0;
        if (strncmp(p, "[DONE]", 6)) {
            json_error_t je;
            json_t *v = json_loadb(p, (size_t)(e - p), 0, &je);
            if (!v) return snprintf(why, cap, "SSE data not JSON: %.200s", p), 0;
            json_decref(v);
        }
        p = e;
    }
    if (o->len && (o->len < 2 || strcmp(o->text + o->len - 2, "\n\n")))
        return snprintf(why, cap, "stream ends inside an event: ...%.100s",
                        o->text + (o->len > 100 ? o->len - 100 : 0)),
               0;
    return 1;
}

static const struct {
    const char *path, *body;
} REQS[] = {
    {"/v1/chat/completions",
     "{\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},
    {"/v1/chat/completions",
     "{\"model\":\"fake\",\"n\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
     "\"logprobs\":true,\"top_logprobs\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},
    {"/v1/chat/completions",
     "{\"model\":\"fake\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\"}}],"
     "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}]}"},
    {"/v1/messages", "{\"model\":\"fake\",\"max_tokens\":50,\"stream\":true,\"tools\":[{\"name\":"
                     "\"w\",\"input_schema\":{}}],"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":"
                     "\"system\",\"content\":\"s\"}]}"},
    {"/v1/messages", "{\"model\":\"fake\",\"max_tokens\":50,\"messages\":[{\"role\":\"user\","
                     "\"content\":\"fail now\"}]}"},
    {"/v1/messages", "{\"model\":\"fake\",\"max_tokens\":50,\"stream\":true,\"messages\":[{"
                     "\"role\":\"user\",\"content\":\"fail now\"}]}"},
    {"/v1/responses", "{\"model\":\"fake\",\"stream\":true,\"input\":\"weather?\",\"tools\":[{"
                      "\"type\":\"function\",\"name\":\"w\"}]}"},
    {"/v1/completions", "{\"model\":\"fake\",\"prompt\":\"abc\",\"echo\":true,\"logprobs\":1}"},
    {"/v1/messages/count_tokens",
     "{\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},
    {"/v1/messages", "{\"model\":\"small\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
                     "\"content\":\"a long prompt here\"}]}"},
    {"/v1/chat/completions",
     "{\"model\":\"nope\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},
};

static void sweep(struct api *a, int persistent)
{
    for (size_t r = 0; r < CAIRN_ARRAY_LEN(REQS); r++) {
        struct out ref;
        CHECK(run(a, REQS[r].path, REQS[r].body, &ref)); /* the fault-free answer */
        int n_runs = 0, n_failed_status = 0;
        for (long n = 1; n < 5000; n++) {
            long f = persistent ? -n : n;
            api_test_fail_alloc(f);
            struct out o;
            int ended = run(a, REQS[r].path, REQS[r].body, &o);
            long made = api_test_fail_alloc(0);
            usleep(2000); /* let the engine thread finish with the call before counting again */
            n_runs++;
            CHECK_MSG(ended, "%s %s: hung with allocation %ld failing", REQS[r].path, REQS[r].body,
                      n);
            char why[512] = "";
            if (ended)
                CHECK_MSG(well_formed(REQS[r].path, &o, why, sizeof(why)),
                          "%s %s, allocation %ld%s: %s", REQS[r].path, REQS[r].body, n,
                          persistent ? " on" : "", why);
            if (o.status >= 400 && ref.status == 200) n_failed_status++;
            free(o.text);
            if (made < n) break; /* this run made fewer allocations: nothing left to fail */
        }
        CHECK_MSG(n_runs > 1, "%s: the sweep never hit an allocation", REQS[r].path);
        /* unhurt afterwards */
        struct out after;
        CHECK(run(a, REQS[r].path, REQS[r].body, &after));
        CHECK_EQ_INT(after.status, ref.status);
        CHECK_MSG(after.len == ref.len || strstr(REQS[r].path, "responses") ||
                      strstr(REQS[r].body, "stream"),
                  "%s: answer after the faults differs from before", REQS[r].path);
        free(after.text);
        free(ref.text);
        (void)n_failed_status;
    }
}

static int status_running(struct api *a)
{
    struct api_call *st = api_call_start(a, "GET", "/api/status", "", 0, nop, NULL);
    size_t n;
    const char *b = api_call_body(st, &n);
    json_t *v = json_loadb(b, n, 0, NULL);
    int running = (int)json_integer_value(json_object_get(json_array_get(json_object_get(v, "models"), 0), "running"));
    json_decref(v);
    api_call_release(st, 0);
    return running;
}

/* Every choice is cancelled, beyond any fixed count (max_n is configurable): by
 * api_call_release when the client leaves (was: the first 64), and by api_shutdown_begin (was:
 * the first 1024 of all calls). Each choice would run 4 s (400 tokens of 10 ms). */
static void test_cancels_all_choices(int shutdown)
{
    char script[512];
    snprintf(script, sizeof(script),
             "{\"models\":[{\"id\":\"fake\"}],\"default\":\"%0400d\",\"chunk_bytes\":1,"
             "\"token_delay_ms\":10,\"max_running\":4000}",
             0);
    struct api_backend be;
    struct cairn_err err;
    CHECK(api_backend_fake_create_str(script, &be, &err) == 0);
    struct api_config cfg = {.keepalive_ms = 60000, .max_n = 100, .deterministic = 1};
    struct api *a;
    CHECK(api_create(&cfg, &be, &a, &err) == 0);
    const char *body = "{\"model\":\"fake\",\"n\":90,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    int n_calls = shutdown ? 13 : 1; /* 13 x 90 = 1170 choices */
    struct api_call *c[13];
    for (int k = 0; k < n_calls; k++) {
        c[k] = api_call_start(a, "POST", "/v1/chat/completions", body, strlen(body), nop, NULL);
        for (int i = 0; i < 5000 && !api_call_ready(c[k]); i++) usleep(1000);
        CHECK_EQ_INT(api_call_status(c[k]), 200);
    }
    usleep(50000);
    CHECK_EQ_INT(status_running(a), 90 * n_calls);
    if (shutdown) api_shutdown_begin(a);
    else api_call_release(c[0], 1);
    int running = -1;
    for (int i = 0; i < 100 && running != 0; i++) {
        usleep(20000);
        running = status_running(a);
    }
    CHECK_MSG(running == 0, "%d of %d choices still running 2 s after the %s", running, 90 * n_calls,
              shutdown ? "shutdown began" : "client left");
    if (shutdown)
        for (int k = 0; k < n_calls; k++) api_call_release(c[k], 0);
    api_destroy(a);
}

int main(void)
{
    test_cancels_all_choices(0);
    test_cancels_all_choices(1);
    struct api_backend be;
    struct cairn_err err;
    if (api_backend_fake_create_str(SCRIPT, &be, &err) != 0) {
        fprintf(stderr, "fake: %s\n", err.msg);
        return 1;
    }
    struct api_config cfg = {.keepalive_ms = 60000, .max_n = 8, .deterministic = 1};
    struct api *a;
    if (api_create(&cfg, &be, &a, &err) != 0) return 1;
    sweep(a, 0);
    sweep(a, 1);
    api_destroy(a);
    return test_summary("test_api_faults");
}
