/* Exact bytes of every API's answers, streamed (SSE) and whole, run through the API layer with
 * the scripted fake backend (deterministic ids: counter from 1, created = 0). */
#include <stdarg.h>
#include <unistd.h>

#include "api/api.h"
#include "testlib.h"

static const char *SCRIPT =
    "{\"models\":[{\"id\":\"fake\",\"context_length\":4096},{\"id\":\"small\",\"context_length\":20}],"
    "\"replies\":[{\"match\":\"hello\",\"text\":\"Hi there\"},"
    "{\"match\":\"weather\",\"text\":\"<think>\\nHmm.\\n</think>\\n\\n<tool_call>\\n{\\\"name\\\": \\\"w\\\", \\\"arguments\\\": {\\\"c\\\": \\\"P\\\"}}\\n</tool_call>\"},"
    "{\"match\":\"fail\",\"text\":\"abcdefgh\",\"error_after\":1},"
    "{\"match\":\"stopme\",\"text\":\"one###two\"}],"
    "\"chunk_bytes\":4,\"cached_tokens\":2%s}";

/* growable string */
struct sb {
    char *p;
    size_t n;
};
static void sbf(struct sb *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sbf(struct sb *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *t = NULL;
    int k = vasprintf(&t, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    s->p = realloc(s->p, s->n + (size_t)k + 1);
    memcpy(s->p + s->n, t, (size_t)k + 1);
    s->n += (size_t)k;
    free(t);
}

static struct api *mk(const char *extra)
{
    char script[2048];
    snprintf(script, sizeof(script), SCRIPT, extra ? extra : "");
    struct api_backend be;
    struct cairn_err err;
    if (api_backend_fake_create_str(script, &be, &err) != 0) {
        fprintf(stderr, "fake: %s\n", err.msg);
        exit(1);
    }
    struct api_config cfg = {.keepalive_ms = 60000, .max_n = 8, .deterministic = 1};
    struct api *a;
    if (api_create(&cfg, &be, &a, &err) != 0) exit(1);
    return a;
}

static void nop(void *u)
{
    (void)u;
}

/* Runs one request to the end; returns the whole output (body or stream), malloc'd. */
static char *run(struct api *a, const char *path, const char *body, int *status)
{
    struct api_call *c = api_call_start(a, "POST", path, body, strlen(body), nop, NULL);
    for (int i = 0; i < 5000 && !api_call_ready(c); i++) usleep(1000);
    *status = api_call_status(c);
    struct sb out = {0};
    if (api_call_streaming(c) && *status == 200) {
        char buf[1024];
        for (int i = 0; i < 20000; i++) {
            int eof;
            size_t n = api_call_read(c, buf, sizeof(buf) - 1, &eof);
            if (n) {
                buf[n] = 0;
                sbf(&out, "%s", buf);
                continue;
            }
            if (eof) break;
            usleep(500);
        }
    } else {
        size_t n;
        const char *b = api_call_body(c, &n);
        sbf(&out, "%.*s", (int)n, b);
    }
    api_call_release(c, 0);
    return out.p ? out.p : strdup("");
}

static void check_same(const char *name, const char *got, const char *want)
{
    int same = !strcmp(got, want);
    CHECK_MSG(same, "%s differs:\n--- got ---\n%s\n--- want ---\n%s", name, got, want);
}

/* the scripted weather reply, as the model would write it (4 bytes per token) */
#define WEATHER_REPLY "<think>\nHmm.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n</tool_call>"
#define USER_HELLO "{\"role\":\"user\",\"content\":\"hello\"}"
static int prompt_len(const char *user)
{
    /* the fake template: "<|user|>\n" content "\n" then "<|assistant|>\n" */
    return (int)(strlen("<|user|>\n\n<|assistant|>\n") + strlen(user));
}

static void oa(struct sb *x, const char *delta, const char *finish, int usage_null)
{
    sbf(x, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"fake\","
           "\"choices\":[{\"index\":0,\"delta\":%s,\"logprobs\":null,\"finish_reason\":%s}]%s}\n\n",
        delta, finish, usage_null ? ",\"usage\":null" : "");
}

static void test_openai_stream(void)
{
    struct api *a = mk(NULL);
    int st;
    char *got = run(a, "/v1/chat/completions",
                    "{\"model\":\"fake\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 200);
    struct sb w = {0};
    int p = prompt_len("hello");
    oa(&w, "{\"role\":\"assistant\",\"content\":\"\"}", "null", 1);
    oa(&w, "{\"content\":\"Hi t\"}", "null", 1);
    oa(&w, "{\"content\":\"here\"}", "null", 1);
    oa(&w, "{}", "\"stop\"", 1);
    sbf(&w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"fake\",\"choices\":[],"
            "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":2,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n"
            "data: [DONE]\n\n", p, p + 2);
    check_same("openai stream", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* reasoning + tool call, no usage chunk */
    a = mk(NULL);
    got = run(a, "/v1/chat/completions",
              "{\"model\":\"fake\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],"
              "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{}}}]}", &st);
    memset(&w, 0, sizeof(w));
    oa(&w, "{\"role\":\"assistant\",\"content\":\"\"}", "null", 0);
    oa(&w, "{\"reasoning_content\":\"Hmm.\"}", "null", 0);
    oa(&w, "{\"tool_calls\":[{\"index\":0,\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":\"{\\\"c\\\":\\\"P\\\"}\"}}]}", "null", 0);
    oa(&w, "{}", "\"tool_calls\"", 0);
    sbf(&w, "data: [DONE]\n\n");
    check_same("openai tool stream", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* mid-stream failure ends with an error object and no [DONE] */
    a = mk(NULL);
    got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"fail\"}]}", &st);
    memset(&w, 0, sizeof(w));
    oa(&w, "{\"role\":\"assistant\",\"content\":\"\"}", "null", 0);
    oa(&w, "{\"content\":\"abcd\"}", "null", 0);
    sbf(&w, "data: {\"error\":{\"message\":\"scripted failure\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n");
    check_same("openai error stream", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);
}

static void test_openai_whole(void)
{
    struct api *a = mk(NULL);
    int st, p = prompt_len("hello");
    char *got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 200);
    struct sb w = {0};
    sbf(&w, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":0,\"model\":\"fake\",\"choices\":[{\"index\":0,"
            "\"message\":{\"role\":\"assistant\",\"content\":\"Hi there\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
            "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":2,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":2}}}",
        p, p + 2);
    check_same("openai whole", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* n = 2, max_tokens = 1: two choices cut by length */
    a = mk(NULL);
    got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"n\":2,\"max_tokens\":1,\"messages\":[" USER_HELLO "]}", &st);
    memset(&w, 0, sizeof(w));
    sbf(&w, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":0,\"model\":\"fake\",\"choices\":["
            "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hi t\"},\"logprobs\":null,\"finish_reason\":\"length\"},"
            "{\"index\":1,\"message\":{\"role\":\"assistant\",\"content\":\"Hi t\"},\"logprobs\":null,\"finish_reason\":\"length\"}],"
            "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":2,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":2}}}",
        p, p + 2);
    check_same("openai n=2", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* tool call whole: content null, tool_calls, finish tool_calls, reasoning_content */
    a = mk(NULL);
    got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],"
                                         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"w\"}}]}", &st);
    CHECK(strstr(got, "\"message\":{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Hmm.\",\"tool_calls\":[{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":\"{\\\"c\\\":\\\"P\\\"}\"}}]},\"logprobs\":null,\"finish_reason\":\"tool_calls\"") != NULL);
    CHECK(strstr(got, "tool_call>") == NULL);
    free(got);
    api_destroy(a);

    /* completions, echo */
    a = mk(NULL);
    got = run(a, "/v1/completions", "{\"model\":\"fake\",\"prompt\":\"hello\",\"echo\":true}", &st);
    check_same("completions", got,
               "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"fake\",\"choices\":[{\"text\":\"helloHi there\","
               "\"index\":0,\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,"
               "\"total_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":2}}}");
    free(got);
    api_destroy(a);

    /* completions stream */
    a = mk(NULL);
    got = run(a, "/v1/completions", "{\"model\":\"fake\",\"prompt\":\"hello\",\"stream\":true}", &st);
    check_same("completions stream", got,
               "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"fake\",\"choices\":[{\"text\":\"Hi t\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}]}\n\n"
               "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"fake\",\"choices\":[{\"text\":\"here\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}]}\n\n"
               "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":0,\"model\":\"fake\",\"choices\":[{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n"
               "data: [DONE]\n\n");
    free(got);
    api_destroy(a);

    /* logprobs: one entry per token with its top alternatives */
    a = mk(NULL);
    got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"logprobs\":true,\"top_logprobs\":1,\"max_tokens\":1,\"messages\":[" USER_HELLO "]}", &st);
    CHECK(strstr(got, "\"logprobs\":{\"content\":[{\"token\":\"H\",\"logprob\":-0.5,\"bytes\":[72],\"top_logprobs\":[{\"token\":\"H\",\"logprob\":-0.5,\"bytes\":[72]}]}]}") != NULL);
    free(got);
    api_destroy(a);
}

static void an(struct sb *x, const char *event, const char *data)
{
    sbf(x, "event: %s\ndata: %s\n\n", event, data);
}

static void test_anthropic(void)
{
    struct api *a = mk(NULL);
    int st, p = prompt_len("hello");
    char *got = run(a, "/v1/messages", "{\"model\":\"fake\",\"max_tokens\":50,\"stream\":true,\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 200);
    struct sb w = {0};
    char buf[1024];
    snprintf(buf, sizeof(buf), "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"fake\","
                               "\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%d,"
                               "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2,\"output_tokens\":0}}}", p - 2);
    an(&w, "message_start", buf);
    an(&w, "ping", "{\"type\":\"ping\"}");
    an(&w, "content_block_start", "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}");
    an(&w, "content_block_delta", "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi t\"}}");
    an(&w, "content_block_delta", "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"here\"}}");
    an(&w, "content_block_stop", "{\"type\":\"content_block_stop\",\"index\":0}");
    snprintf(buf, sizeof(buf), "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},"
                               "\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2,\"output_tokens\":2}}", p - 2);
    an(&w, "message_delta", buf);
    an(&w, "message_stop", "{\"type\":\"message_stop\"}");
    check_same("anthropic stream", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* thinking + tool_use stream */
    a = mk(NULL);
    got = run(a, "/v1/messages", "{\"model\":\"fake\",\"max_tokens\":50,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],"
                                 "\"tools\":[{\"name\":\"w\",\"input_schema\":{\"type\":\"object\"}}]}", &st);
    memset(&w, 0, sizeof(w));
    int pw = -1;
    /* message_start's input count, which message_delta must repeat (checked below) */
    sscanf(strstr(got, "\"input_tokens\":") ? strstr(got, "\"input_tokens\":") : "", "\"input_tokens\":%d", &pw);
    snprintf(buf, sizeof(buf), "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"fake\","
                               "\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%d,"
                               "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2,\"output_tokens\":0}}}", pw);
    an(&w, "message_start", buf);
    an(&w, "ping", "{\"type\":\"ping\"}");
    an(&w, "content_block_start", "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}");
    an(&w, "content_block_delta", "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Hmm.\"}}");
    an(&w, "content_block_stop", "{\"type\":\"content_block_stop\",\"index\":0}");
    an(&w, "content_block_start", "{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"w\",\"input\":{}}}");
    an(&w, "content_block_delta", "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"c\\\":\\\"P\\\"}\"}}");
    an(&w, "content_block_stop", "{\"type\":\"content_block_stop\",\"index\":1}");
    snprintf(buf, sizeof(buf), "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},"
                               "\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2,\"output_tokens\":%d}}", pw,
             (int)(strlen(WEATHER_REPLY) + 3) / 4);
    an(&w, "message_delta", buf);
    an(&w, "message_stop", "{\"type\":\"message_stop\"}");
    check_same("anthropic tool stream", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* whole, stop sequence */
    a = mk(NULL);
    got = run(a, "/v1/messages", "{\"model\":\"fake\",\"max_tokens\":50,\"stop_sequences\":[\"###\"],\"messages\":[{\"role\":\"user\",\"content\":\"stopme\"}]}", &st);
    p = prompt_len("stopme");
    memset(&w, 0, sizeof(w));
    sbf(&w, "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"fake\",\"content\":[{\"type\":\"text\",\"text\":\"one\"}],"
            "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"###\",\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":0,"
            "\"cache_read_input_tokens\":2,\"output_tokens\":1}}", p - 2);
    check_same("anthropic whole", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* mid-stream error event */
    a = mk(NULL);
    got = run(a, "/v1/messages", "{\"model\":\"fake\",\"max_tokens\":50,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"fail\"}]}", &st);
    const char *tail = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"scripted failure\"}}\n\n";
    CHECK(strlen(got) > strlen(tail) && !strcmp(got + strlen(got) - strlen(tail), tail));
    CHECK(strstr(got, "message_stop") == NULL);
    free(got);
    api_destroy(a);

    /* count_tokens */
    a = mk(NULL);
    got = run(a, "/v1/messages/count_tokens", "{\"model\":\"fake\",\"messages\":[" USER_HELLO "]}", &st);
    snprintf(buf, sizeof(buf), "{\"input_tokens\":%d}", prompt_len("hello"));
    check_same("count_tokens", got, buf);
    free(got);
    api_destroy(a);
}

static void rs(struct sb *x, const char *type, const char *fields, int seq)
{
    sbf(x, "event: %s\ndata: {\"type\":\"%s\",%s,\"sequence_number\":%d}\n\n", type, type, fields, seq);
}

static void test_responses(void)
{
    struct api *a = mk(NULL);
    int st, p = prompt_len("hello");
    char *got = run(a, "/v1/responses", "{\"model\":\"fake\",\"input\":\"hello\",\"stream\":true}", &st);
    CHECK_EQ_INT(st, 200);
    struct sb w = {0};
    const char *head = "\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":0,";
    const char *mid = "\"error\":null,\"incomplete_details\":null,\"model\":\"fake\",";
    const char *tailf = "\"parallel_tool_calls\":true,\"tool_choice\":\"auto\",\"tools\":[],";
    char buf[2048];
    snprintf(buf, sizeof(buf), "\"response\":{%s\"status\":\"in_progress\",%s\"output\":[],%s\"usage\":null}", head, mid, tailf);
    rs(&w, "response.created", buf, 0);
    rs(&w, "response.in_progress", buf, 1);
    rs(&w, "response.output_item.added", "\"output_index\":0,\"item\":{\"id\":\"msg_2\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}", 2);
    rs(&w, "response.content_part.added", "\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}", 3);
    rs(&w, "response.output_text.delta", "\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi t\"", 4);
    rs(&w, "response.output_text.delta", "\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"delta\":\"here\"", 5);
    rs(&w, "response.output_text.done", "\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"text\":\"Hi there\"", 6);
    rs(&w, "response.content_part.done", "\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"Hi there\",\"annotations\":[]}", 7);
    const char *item = "{\"id\":\"msg_2\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi there\",\"annotations\":[]}]}";
    snprintf(buf, sizeof(buf), "\"output_index\":0,\"item\":%s", item);
    rs(&w, "response.output_item.done", buf, 8);
    snprintf(buf, sizeof(buf), "\"response\":{%s\"status\":\"completed\",%s\"output\":[%s],%s\"usage\":{\"input_tokens\":%d,"
                               "\"input_tokens_details\":{\"cached_tokens\":2},\"output_tokens\":2,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":%d}}",
             head, mid, item, tailf, p, p + 2);
    rs(&w, "response.completed", buf, 9);
    check_same("responses stream", got, w.p);
    free(got);
    free(w.p);
    api_destroy(a);

    /* whole, with reasoning and a function call */
    a = mk(NULL);
    got = run(a, "/v1/responses", "{\"model\":\"fake\",\"input\":\"weather?\",\"tools\":[{\"type\":\"function\",\"name\":\"w\",\"parameters\":{}}]}", &st);
    CHECK(strstr(got, "\"output\":[{\"id\":\"rs_2\",\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"Hmm.\"}]},"
                      "{\"id\":\"fc_3\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":\"call_3\",\"name\":\"w\",\"arguments\":\"{\\\"c\\\":\\\"P\\\"}\"}]") != NULL);
    free(got);
    api_destroy(a);

    /* streamed function call events */
    a = mk(NULL);
    got = run(a, "/v1/responses", "{\"model\":\"fake\",\"stream\":true,\"input\":\"weather?\",\"tools\":[{\"type\":\"function\",\"name\":\"w\",\"parameters\":{}}]}", &st);
    CHECK(strstr(got, "event: response.reasoning_text.delta\ndata: {\"type\":\"response.reasoning_text.delta\",\"item_id\":\"rs_2\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hmm.\"") != NULL);
    CHECK(strstr(got, "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"id\":\"fc_3\",\"type\":\"function_call\",\"status\":\"in_progress\",\"call_id\":\"call_3\",\"name\":\"w\",\"arguments\":\"\"}") != NULL);
    CHECK(strstr(got, "event: response.function_call_arguments.done\ndata: {\"type\":\"response.function_call_arguments.done\",\"item_id\":\"fc_3\",\"output_index\":1,\"arguments\":\"{\\\"c\\\":\\\"P\\\"}\"") != NULL);
    CHECK(strstr(got, "event: response.completed") != NULL);
    free(got);
    api_destroy(a);
}

static void test_errors(void)
{
    int st;
    struct api *a = mk(",\"max_running\":0,\"max_waiting\":0");
    char *got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 429);
    check_same("429", got, "{\"error\":{\"message\":\"the queue is full (0 requests)\",\"type\":\"rate_limit_error\",\"param\":null,\"code\":\"queue_full\"}}");
    free(got);
    got = run(a, "/v1/messages", "{\"model\":\"fake\",\"max_tokens\":5,\"stream\":true,\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 429);
    check_same("429 anthropic", got, "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"the queue is full (0 requests)\"}}");
    free(got);
    api_destroy(a);

    a = mk(",\"kv_tokens\":10");
    got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"stream\":true,\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 507);
    CHECK(strstr(got, "\"code\":\"insufficient_memory\"") != NULL);
    free(got);
    got = run(a, "/v1/chat/completions", "{\"model\":\"small\",\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 400);
    char want[256];
    snprintf(want, sizeof(want), "maximum context length is 20 tokens. However, your prompt has %d tokens", prompt_len("hello"));
    CHECK_MSG(strstr(got, want) != NULL, "%s", got);
    CHECK(strstr(got, "\"param\":\"messages\",\"code\":\"context_length_exceeded\"") != NULL);
    free(got);
    got = run(a, "/v1/chat/completions", "{\"model\":\"nope\",\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 404);
    check_same("404 model", got, "{\"error\":{\"message\":\"The model 'nope' does not exist\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}");
    free(got);
    got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"messages\":[" USER_HELLO "],\"temperature\":\"x\"}", &st);
    CHECK_EQ_INT(st, 400);
    check_same("400 param", got, "{\"error\":{\"message\":\"'temperature' must be a number\",\"type\":\"invalid_request_error\",\"param\":\"temperature\",\"code\":null}}");
    free(got);
    /* GET on a POST route */
    struct api_call *c = api_call_start(a, "GET", "/v1/messages", "", 0, nop, NULL);
    CHECK_EQ_INT(api_call_status(c), 405);
    api_call_release(c, 0);
    c = api_call_start(a, "GET", "/v1/nothing", "", 0, nop, NULL);
    CHECK_EQ_INT(api_call_status(c), 404);
    api_call_release(c, 0);
    c = api_call_start(a, "POST", "/api/cache/clear", "{\"tier\":\"hot\"}", 14, nop, NULL);
    CHECK_EQ_INT(api_call_status(c), 400);
    api_call_release(c, 0);
    c = api_call_start(a, "POST", "/api/cache/clear", "{\"tier\":\"device\"}", 17, nop, NULL);
    CHECK_EQ_INT(api_call_status(c), 200);
    api_call_release(c, 0);
    c = api_call_start(a, "POST", "/api/cache/clear", "{\"tier\":\"moon\"}", 15, nop, NULL);
    CHECK_EQ_INT(api_call_status(c), 400);
    api_call_release(c, 0);
    /* shutting down: 503 */
    api_shutdown_begin(a);
    got = run(a, "/v1/chat/completions", "{\"model\":\"fake\",\"messages\":[" USER_HELLO "]}", &st);
    CHECK_EQ_INT(st, 503);
    free(got);
    api_destroy(a);
}

int main(void)
{
    test_openai_stream();
    test_openai_whole();
    test_anthropic();
    test_responses();
    test_errors();
    return test_summary("test_api_sse");
}
