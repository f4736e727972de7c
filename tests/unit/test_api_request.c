/* Request parsing (api/api_req): each API's fields land in the typed request, conversations are
 * normalised for the template, and wrong types / ranges are 400s that name the field. */
#include "api/api_req.h"
#include "testlib.h"

static int parse(enum api_kind k, const char *body, struct api_req *r, struct api_req_err *e)
{
    return api_req_parse(k, body, strlen(body), 8, r, e);
}

/* Expects a 400 naming `param`. */
static void expect_err(enum api_kind k, const char *body, const char *param)
{
    struct api_req r;
    struct api_req_err e;
    int rc = parse(k, body, &r, &e);
    CHECK_MSG(rc == -1, "accepted: %s", body);
    if (rc == 0) {
        api_req_free(&r);
        return;
    }
    CHECK_EQ_INT(e.status, 400);
    CHECK_MSG(!strcmp(e.param, param), "body %s: param [%s] want [%s] (%s)", body, e.param, param, e.message);
    CHECK(e.message[0] != 0);
}

static char *dump(json_t *v)
{
    return json_dumps(v, JSON_COMPACT);
}

static void test_chat(void)
{
    struct api_req r;
    struct api_req_err e;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
        "\"max_completion_tokens\":77,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":7,"
        "\"stop\":[\"END\",\"\"],\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,"
        "\"repetition_context_size\":64,\"logit_bias\":{\"50256\":-100,\"7\":2.5},\"logprobs\":true,\"top_logprobs\":3,"
        "\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],\"tool_choice\":\"auto\","
        "\"parallel_tool_calls\":false,\"chat_template_kwargs\":{\"enable_thinking\":false},\"unknown_field\":{\"x\":1}}";
    CHECK(parse(API_KIND_CHAT, body, &r, &e) == 0);
    CHECK_EQ_STR(r.model, "m");
    CHECK_EQ_INT(r.max_tokens, 77);
    CHECK_NEAR(r.sampling.temperature, 0.5, 1e-6);
    CHECK_NEAR(r.sampling.top_p, 0.9, 1e-6);
    CHECK_EQ_INT(r.sampling.top_k, 40);
    CHECK_NEAR(r.sampling.min_p, 0.05, 1e-6);
    CHECK(r.sampling.has_seed && r.sampling.seed == 7);
    CHECK_EQ_INT(r.n_stop, 1);
    CHECK_EQ_STR(r.stop[0], "END");
    CHECK_NEAR(r.sampling.presence_penalty, 0.5, 1e-6);
    CHECK_NEAR(r.sampling.frequency_penalty, -0.5, 1e-6);
    CHECK_NEAR(r.sampling.repetition_penalty, 1.1, 1e-6);
    CHECK_EQ_INT(r.sampling.repetition_context_size, 64);
    CHECK_EQ_INT(r.sampling.n_logit_bias, 2);
    CHECK_EQ_INT(r.sampling.logit_bias[0].id, 50256);
    CHECK_NEAR(r.sampling.logit_bias[0].bias, -100, 1e-6);
    CHECK_EQ_INT(r.sampling.logit_bias[1].id, 7);
    CHECK(r.sampling.logprobs == 1 && r.sampling.top_logprobs == 3);
    CHECK_EQ_INT(r.n, 2);
    CHECK(r.stream && r.include_usage);
    CHECK(r.tools && json_array_size(r.tools) == 1);
    CHECK(json_is_false(json_object_get(r.kwargs, "enable_thinking")));
    char *m = dump(r.messages);
    CHECK_EQ_STR(m, "[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"hi there\"},"
                    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
                    "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c1\"}]");
    free(m);
    api_req_free(&r);

    /* defaults */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == 0);
    CHECK_EQ_INT(r.max_tokens, -1);
    CHECK_NEAR(r.sampling.temperature, 1.0, 1e-6);
    CHECK_EQ_INT(r.n, 1);
    CHECK(!r.stream && !r.tools && !r.sampling.has_seed);
    CHECK(r.grammar_kind == API_GRAMMAR_NONE && r.grammar == NULL);
    api_req_free(&r);

    /* tool_choice none drops tools; a named function keeps only it */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}", &r, &e) == 0);
    CHECK(r.tools == NULL);
    api_req_free(&r);
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", &r, &e) == 0);
    CHECK(r.tools && json_array_size(r.tools) == 1);
    CHECK(r.tool_required);
    /* the call is forced by a grammar, not asked for in the prompt */
    CHECK(r.grammar_kind == API_GRAMMAR_TOOLS && r.grammar != NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(r.messages, 0), "role")), "user");
    api_req_free(&r);

    /* response_format compiles to a grammar; the prompt is untouched */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":\"object\"}}}}", &r, &e) == 0);
    CHECK(r.grammar_kind == API_GRAMMAR_SCHEMA && r.grammar != NULL);
    CHECK_EQ_INT(json_array_size(r.messages), 1);
    api_req_free(&r);
    /* unsupported schema keywords, bad regexes and two constraints at once are 400s naming them */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\",\"contentMediaType\":\"x\"}}}}", &r, &e) < 0);
    CHECK_EQ_STR(e.param, "response_format");
    CHECK(e.status == 400 && strstr(e.message, "contentMediaType"));
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cairn\":{\"regex\":\"(?=a)\"}}", &r, &e) < 0);
    CHECK_EQ_STR(e.param, "cairn.regex");
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"},\"cairn\":{\"regex\":\"a\"}}", &r, &e) < 0);
    CHECK_EQ_STR(e.param, "cairn.regex");
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"patternProperties\":{}}}}],\"tool_choice\":\"required\"}", &r, &e) < 0);
    CHECK(!strcmp(e.param, "tools") && strstr(e.message, "patternProperties"));
    CHECK(parse(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"cairn\":{\"grammar\":\"root ::= [a-z]+\"}}", &r, &e) == 0);
    CHECK(r.grammar_kind == API_GRAMMAR_GBNF && r.grammar != NULL);
    api_req_free(&r);

    expect_err(API_KIND_CHAT, "{\"model\":\"m\"", "");
    expect_err(API_KIND_CHAT, "[1,2]", "");
    expect_err(API_KIND_CHAT, "{\"messages\":[]}", "model");
    expect_err(API_KIND_CHAT, "{\"model\":5,\"messages\":[]}", "model");
    expect_err(API_KIND_CHAT, "{\"model\":\"m\"}", "messages");
    expect_err(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", "messages");
    expect_err(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages");
    expect_err(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0]");
    expect_err(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content");
    expect_err(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages[0].content");
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[512];
#define BAD(field, param)                                                                          \
    do {                                                                                           \
        snprintf(b, sizeof(b), "{\"model\":\"m\",%s,%s}", msgs, field);                          \
        expect_err(API_KIND_CHAT, b, param);                                                       \
    } while (0)
    BAD("\"temperature\":\"hot\"", "temperature");
    BAD("\"temperature\":-1", "temperature");
    BAD("\"top_p\":2", "top_p");
    BAD("\"top_k\":1.5", "top_k");
    BAD("\"max_tokens\":0", "max_tokens");
    BAD("\"max_tokens\":\"10\"", "max_tokens");
    BAD("\"max_completion_tokens\":-3", "max_completion_tokens");
    BAD("\"n\":0", "n");
    BAD("\"n\":100", "n");
    BAD("\"stream\":\"yes\"", "stream");
    BAD("\"stream_options\":{\"include_usage\":1}", "include_usage");
    BAD("\"stop\":5", "stop");
    BAD("\"stop\":[\"a\",1]", "stop");
    BAD("\"seed\":\"x\"", "seed");
    BAD("\"logit_bias\":{\"abc\":1}", "logit_bias");
    BAD("\"logit_bias\":{\"5\":1000}", "logit_bias");
    BAD("\"logprobs\":1", "logprobs");
    BAD("\"top_logprobs\":21", "top_logprobs");
    BAD("\"tools\":{}", "tools");
    BAD("\"tools\":[{\"type\":\"function\"}]", "tools");
    BAD("\"tool_choice\":5", "tool_choice");
    BAD("\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}", "tool_choice");
    BAD("\"response_format\":{\"type\":\"xml\"}", "response_format");
    BAD("\"chat_template_kwargs\":[]", "chat_template_kwargs");
    BAD("\"presence_penalty\":3", "presence_penalty");
    BAD("\"parallel_tool_calls\":\"no\"", "parallel_tool_calls");
#undef BAD
    /* null means absent */
    CHECK(parse(API_KIND_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":null,\"max_tokens\":null}", &r, &e) == 0);
    api_req_free(&r);
}

static void test_completions(void)
{
    struct api_req r;
    struct api_req_err e;
    CHECK(parse(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"Once\",\"echo\":true,\"logprobs\":2}", &r, &e) == 0);
    CHECK_EQ_STR(r.prompt, "Once");
    CHECK_EQ_INT(r.max_tokens, 16);
    CHECK(r.echo && r.sampling.logprobs && r.sampling.top_logprobs == 2);
    api_req_free(&r);
    CHECK(parse(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,2,3]}", &r, &e) == 0);
    CHECK_EQ_INT(r.n_prompt_ids, 3);
    CHECK(r.prompt_ids && r.prompt_ids[2] == 3 && !r.prompt);
    api_req_free(&r);
    expect_err(API_KIND_COMPLETIONS, "{\"model\":\"m\"}", "prompt");
    expect_err(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":{}}", "prompt");
    expect_err(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,-2]}", "prompt");
    expect_err(API_KIND_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"echo\":1}", "echo");
}

static void test_messages(void)
{
    struct api_req r;
    struct api_req_err e;
    const char *body =
        "{\"model\":\"claude\",\"max_tokens\":100,\"system\":[{\"type\":\"text\",\"text\":\"sys\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"checking\"},{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"w\",\"input\":{\"c\":\"P\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":\"thanks\"}]}],"
        "\"stop_sequences\":[\"###\"],\"temperature\":0.2,\"top_k\":5,\"top_p\":0.8,"
        "\"tools\":[{\"name\":\"w\",\"description\":\"weather\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},\"stream\":true}";
    CHECK(parse(API_KIND_MESSAGES, body, &r, &e) == 0);
    CHECK_EQ_INT(r.max_tokens, 100);
    CHECK_EQ_INT(r.n_stop, 1);
    CHECK_NEAR(r.sampling.temperature, 0.2, 1e-6);
    CHECK_EQ_INT(r.sampling.top_k, 5);
    CHECK(r.stream && r.thinking == 1);
    CHECK(json_is_true(json_object_get(r.kwargs, "enable_thinking")));
    char *m = dump(r.messages);
    /* tool_choice any: forced by a grammar, the system prompt untouched */
    CHECK(r.grammar_kind == API_GRAMMAR_TOOLS && r.grammar != NULL);
    CHECK_EQ_STR(m, "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"weather?\"},"
                    "{\"role\":\"assistant\",\"content\":\"checking\",\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":\"t1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":{\"c\":\"P\"}}}]},"
                    "{\"role\":\"tool\",\"content\":\"sunny\",\"tool_call_id\":\"t1\"},{\"role\":\"user\",\"content\":\"thanks\"}]");
    free(m);
    char *t = dump(r.tools);
    CHECK_EQ_STR(t, "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"description\":\"weather\",\"parameters\":{\"type\":\"object\"}}}]");
    free(t);
    api_req_free(&r);
    CHECK(parse(API_KIND_COUNT_TOKENS, "{\"model\":\"c\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == 0);
    api_req_free(&r);
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens");
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages.0");
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", "messages.0.content");
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":1.5}", "temperature");
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":5}", "system");
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":\"x\"}", "stop_sequences");
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":true}", "thinking");
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", "tool_choice");
}

static void test_responses(void)
{
    struct api_req r;
    struct api_req_err e;
    CHECK(parse(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"hello\",\"instructions\":\"be nice\",\"max_output_tokens\":50,\"reasoning\":{\"effort\":\"high\"}}", &r, &e) == 0);
    char *m = dump(r.messages);
    CHECK_EQ_STR(m, "[{\"role\":\"system\",\"content\":\"be nice\"},{\"role\":\"user\",\"content\":\"hello\"}]");
    free(m);
    CHECK_EQ_INT(r.max_tokens, 50);
    CHECK(json_is_true(json_object_get(r.kwargs, "enable_thinking")));
    api_req_free(&r);
    const char *body =
        "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"w?\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"w\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"v\",\"arguments\":\"{\\\"q\\\":1}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"sun\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"w\",\"parameters\":{\"type\":\"object\"}},{\"type\":\"web_search\"}],"
        "\"text\":{\"format\":{\"type\":\"json_object\"}}}";
    CHECK(parse(API_KIND_RESPONSES, body, &r, &e) == 0);
    m = dump(r.messages);
    CHECK_EQ_STR(m, "[{\"role\":\"user\",\"content\":\"w?\"},"
                    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":{}}},"
                    "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"v\",\"arguments\":{\"q\":1}}}]},"
                    "{\"role\":\"tool\",\"content\":\"sun\",\"tool_call_id\":\"c1\"}]");
    free(m);
    CHECK(r.tools && json_array_size(r.tools) == 1);
    CHECK(r.grammar_kind == API_GRAMMAR_SCHEMA && r.grammar != NULL);
    api_req_free(&r);
    expect_err(API_KIND_RESPONSES, "{\"model\":\"m\"}", "input");
    expect_err(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":5}", "input");
    expect_err(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":\"r1\"}", "previous_response_id");
    expect_err(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":\"5\"}", "max_output_tokens");
    expect_err(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":[{\"type\":\"computer_call\"}]}", "input[0]");
    expect_err(API_KIND_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"instructions\":3}", "instructions");
}

/* What Claude Code sends, field by field: accepted, and each does what it should. */
static void test_messages_claude_code(void)
{
    struct api_req r;
    struct api_req_err e;
#define CC_BASE "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
    static const struct {
        const char *extra;
        int thinking; /* kwargs.enable_thinking: 1 true, 0 false, -1 absent */
    } fields[] = {
        {",\"thinking\":{\"type\":\"adaptive\"}", 1},
        {",\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2048}", 1},
        {",\"thinking\":{\"type\":\"disabled\"}", 0},
        {",\"context_management\":{\"edits\":[{\"type\":\"clear_tool_uses_20250919\",\"trigger\":{\"type\":\"input_tokens\",\"value\":30000}}]}", -1},
        {",\"output_config\":{\"effort\":\"high\"}", -1},
        {",\"metadata\":{\"user_id\":\"user_abc\"}", -1},
        {",\"betas\":[\"interleaved-thinking-2025-05-14\"]", -1},
        {",\"system\":[{\"type\":\"text\",\"text\":\"S\",\"cache_control\":{\"type\":\"ephemeral\"}}]", -1},
        {",\"tools\":[{\"name\":\"Read\",\"input_schema\":{\"type\":\"object\"},\"cache_control\":{\"type\":\"ephemeral\"}},"
         "{\"type\":\"web_search_20250305\",\"name\":\"web_search\",\"max_uses\":5}]", -1},
    };
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(fields); i++) {
        char body[1024];
        snprintf(body, sizeof(body), CC_BASE "%s}", fields[i].extra);
        int rc = parse(API_KIND_MESSAGES, body, &r, &e);
        CHECK_MSG(rc == 0, "refused %s: %s", fields[i].extra, e.message);
        if (rc) continue;
        json_t *th = json_object_get(r.kwargs, "enable_thinking");
        if (fields[i].thinking < 0) CHECK_MSG(th == NULL, "%s set enable_thinking", fields[i].extra);
        else CHECK_MSG(th && json_is_true(th) == fields[i].thinking, "%s: enable_thinking", fields[i].extra);
        api_req_free(&r);
    }
    /* tools: the server tool (no input_schema) is left out, Read kept */
    CHECK(parse(API_KIND_MESSAGES, CC_BASE ",\"tools\":[{\"name\":\"Read\",\"input_schema\":{}},{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}", &r, &e) == 0);
    CHECK_EQ_INT((int)json_array_size(r.tools), 1);
    api_req_free(&r);

    /* a system turn inside messages: kept in place, as a system message */
    const char *mid = "{\"model\":\"c\",\"max_tokens\":10,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                      "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"R1\"}]},{\"role\":\"assistant\",\"content\":\"b\"},"
                      "{\"role\":\"system\",\"content\":\"R2\"},{\"role\":\"user\",\"content\":\"c\"}]}";
    CHECK(parse(API_KIND_MESSAGES, mid, &r, &e) == 0);
    char *m = dump(r.messages);
    CHECK_EQ_STR(m, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"a\"},"
                    "{\"role\":\"system\",\"content\":\"R1\"},{\"role\":\"assistant\",\"content\":\"b\"},"
                    "{\"role\":\"system\",\"content\":\"R2\"},{\"role\":\"user\",\"content\":\"c\"}]");
    free(m);
    /* ... and merged into the leading one for a template that refuses it there */
    CHECK_EQ_INT(api_req_merge_system(r.messages), 1);
    m = dump(r.messages);
    CHECK_EQ_STR(m, "[{\"role\":\"system\",\"content\":\"S\\n\\nR1\\n\\nR2\"},{\"role\":\"user\",\"content\":\"a\"},"
                    "{\"role\":\"assistant\",\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]");
    free(m);
    CHECK_EQ_INT(api_req_merge_system(r.messages), 0); /* nothing left to move */
    api_req_free(&r);
    /* no leading system prompt: one is made */
    CHECK(parse(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                                   "{\"role\":\"system\",\"content\":\"R\"}]}", &r, &e) == 0);
    CHECK_EQ_INT(api_req_merge_system(r.messages), 1);
    m = dump(r.messages);
    CHECK_EQ_STR(m, "[{\"role\":\"system\",\"content\":\"R\"},{\"role\":\"user\",\"content\":\"a\"}]");
    free(m);
    api_req_free(&r);
    /* a system turn's content must be text */
    expect_err(API_KIND_MESSAGES, "{\"model\":\"c\",\"max_tokens\":10,\"messages\":[{\"role\":\"system\",\"content\":5}]}", "messages.0.content");
    /* a NUL escape: the message names it, not jansson's flag */
    CHECK(parse(API_KIND_MESSAGES, CC_BASE ",\"system\":\"a\\u0000b\"}", &r, &e) == -1);
    CHECK_MSG(strstr(e.message, "\\u0000 (a NUL character)") && !strstr(e.message, "JSON_ALLOW_NUL"), "%s", e.message);
#undef CC_BASE
}

int main(void)
{
    test_chat();
    test_completions();
    test_messages();
    test_messages_claude_code();
    test_responses();
    return test_summary("test_api_request");
}
