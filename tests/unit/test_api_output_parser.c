/* Output parser (api/api_out): reasoning, Hermes/Qwen JSON, Qwen3-Coder XML and Llama-3 JSON tool
 * calls. Every case is fed whole, byte by byte and in 200 random splits; the result must be the
 * same each time and markup must never reach the text. */
#include <stdint.h>

#include "api/api_out.h"
#include "testlib.h"

struct collect {
    char text[4096];
    char reasoning[4096];
    char calls[4096]; /* "name(args);" per call */
    int n_calls;
};

static void cat(char *dst, size_t cap, const char *s, size_t n)
{
    size_t l = strlen(dst);
    if (l + n >= cap) n = cap - l - 1;
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static void on_ev(void *user, const struct api_out_event *ev)
{
    struct collect *c = user;
    if (ev->kind == API_OUT_TEXT) cat(c->text, sizeof(c->text), ev->text, ev->len);
    else if (ev->kind == API_OUT_REASONING) cat(c->reasoning, sizeof(c->reasoning), ev->text, ev->len);
    else {
        cat(c->calls, sizeof(c->calls), ev->name, strlen(ev->name));
        cat(c->calls, sizeof(c->calls), "(", 1);
        cat(c->calls, sizeof(c->calls), ev->arguments, strlen(ev->arguments));
        cat(c->calls, sizeof(c->calls), ");", 2);
        c->n_calls++;
    }
}

struct tcase {
    const char *in;
    int in_think, tools;
    const char *text, *reasoning, *calls;
};

static const struct tcase cases[] = {
    {"Hello, world!", 0, 0, "Hello, world!", "", ""},
    {"a < b and c <= d <thin", 0, 1, "a < b and c <= d <thin", "", ""},
    {"<think>\nI should greet.\n</think>\n\nHi!", 0, 0, "Hi!", "I should greet.", ""},
    {"I should greet.\n</think>\n\nHi!", 1, 0, "Hi!", "I should greet.", ""},
    {"<think>\n\n</think>\n\nHi!", 0, 0, "Hi!", "", ""},
    {"still thinking", 1, 0, "", "still thinking", ""},
    {"<think>\nagain</think>ok", 1, 0, "ok", "again", ""},
    {"Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 0, 1,
     "Sure.\n", "", "get_weather({\"city\":\"Paris\"});"},
    {"<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
     0, 1, "", "", "a({});b({\"x\":[1,2]});"},
    {"<tool_call>\n<function=run_shell>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>",
     0, 1, "", "", "run_shell({\"command\":\"ls -la\",\"timeout\":30});"},
    {"<think>plan</think><tool_call><function=f><parameter=p>{\"k\": true}</parameter></function></tool_call>", 0, 1,
     "", "plan", "f({\"p\":{\"k\":true}});"},
    {"{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}", 0, 1, "", "", "get_time({\"tz\":\"UTC\"});"},
    {"<|python_tag|>{\"name\": \"x\", \"parameters\": {}}; {\"name\": \"y\", \"parameters\": {\"a\": \"b;c\"}}", 0, 1,
     "", "", "x({});y({\"a\":\"b;c\"});"},
    {"{\"not\": \"a call\"}", 0, 1, "{\"not\": \"a call\"}", "", ""},
    {"{\"name\": \"get_time\", \"parameters\": {}}", 0, 0, "{\"name\": \"get_time\", \"parameters\": {}}", "", ""},
    {"<tool_call>not json</tool_call> after", 0, 1, "<tool_call>not json</tool_call> after", "", ""},
    {"<tool_call>{\"name\": \"f\", \"arguments\": {}}", 0, 1, "", "", "f({});"},
    {"<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", 0, 0,
     "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "", ""},
    {"caf\xc3\xa9 <think>na\xc3\xafve</think>\xe2\x9c\x93", 0, 1, "caf\xc3\xa9 \xe2\x9c\x93", "na\xc3\xafve", ""},
    {"<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\":1}\"}</tool_call>", 0, 1, "", "", "f({\"a\":1});"},
};

static uint64_t rng = 88172645463325252ull;
static uint64_t xorshift(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* splits: 0 whole, 1 byte by byte, 2 random */
static void run(const struct tcase *t, int mode, struct collect *c)
{
    struct api_out p;
    memset(c, 0, sizeof(*c));
    api_out_init(&p, t->in_think, t->tools, on_ev, c);
    size_t n = strlen(t->in), i = 0;
    while (i < n) {
        size_t k = mode == 0 ? n : mode == 1 ? 1 : 1 + xorshift() % 7;
        if (i + k > n) k = n - i;
        CHECK(api_out_feed(&p, t->in + i, k) == 0);
        i += k;
    }
    api_out_finish(&p);
    api_out_free(&p);
}

int main(void)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct tcase *t = &cases[i];
        for (int rep = 0; rep < 202; rep++) {
            struct collect c;
            run(t, rep < 2 ? rep : 2, &c);
            int ok = !strcmp(c.text, t->text) && !strcmp(c.reasoning, t->reasoning) && !strcmp(c.calls, t->calls);
            CHECK_MSG(ok, "case %zu mode %d: text [%s] reasoning [%s] calls [%s]", i, rep, c.text, c.reasoning, c.calls);
            if (!ok) break;
        }
    }
    /* parse_tool_body directly */
    char *name, *args;
    CHECK(api_out_parse_tool_body("  {\"name\":\"f\",\"parameters\":{\"a\":1}} ", 35, &name, &args) == 0);
    if (name) {
        CHECK_EQ_STR(name, "f");
        CHECK_EQ_STR(args, "{\"a\":1}");
        free(name);
        free(args);
    }
    CHECK(api_out_parse_tool_body("{\"arguments\":{}}", 16, &name, &args) == -1);
    CHECK(api_out_parse_tool_body("<function=>", 11, &name, &args) == -1);
    CHECK(api_out_parse_tool_body("", 0, &name, &args) == -1);
    return test_summary("test_api_output_parser");
}
