/* Incremental output parser: turns generated text deltas into visible text, reasoning and tool
 * calls, whatever way the text was split into tokens.
 *
 * Recognised markup:
 *   <think> ... </think>                          reasoning (also when the prompt opened it)
 *   <tool_call>{"name": N, "arguments": {...}}</tool_call>          Hermes / Qwen JSON
 *   <tool_call><function=N><parameter=P>V</parameter>...</function></tool_call>  Qwen3-Coder XML
 *   {"name": N, "parameters": {...}} (optionally after <|python_tag|>), as the whole output
 *                                                 Llama-3 JSON (only when tools are given)
 * Markup never reaches the text events: a suffix that could start a tag is held back until the
 * next delta decides it. Tool-call bodies are buffered and emitted whole at their closing tag. */
#ifndef CAIRN_API_API_OUT_H
#define CAIRN_API_API_OUT_H

#include <stddef.h>

#define API_OUT_MAX_JSON_CALLS 16 /* Llama-3 JSON calls parsed from one output (';'-separated) */

enum api_out_kind {
    API_OUT_TEXT = 0,
    API_OUT_REASONING,
    API_OUT_TOOL_CALL,  /* name + arguments (a JSON object as text) */
};

struct api_out_event {
    enum api_out_kind kind;
    const char *text;       /* TEXT / REASONING delta */
    size_t len;
    const char *name;       /* TOOL_CALL */
    const char *arguments;  /* TOOL_CALL: JSON text */
};

typedef void (*api_out_fn)(void *user, const struct api_out_event *ev);

struct api_out {
    int tools;              /* parse tool calls */
    int state;              /* internal */
    int at_start;           /* nothing visible emitted yet (llama JSON detection, trimming) */
    int after_think;        /* trim leading whitespace of content after </think> */
    int reasoning_start;    /* trim leading whitespace of reasoning */
    char *buf;              /* held-back / buffered bytes */
    size_t len, cap;
    int n_tool_calls;
    api_out_fn emit;
    void *user;
};

/* in_think: the prompt ended inside <think> (the template opened it). tools: parse tool calls. */
void api_out_init(struct api_out *p, int in_think, int tools, api_out_fn emit, void *user);
/* Feeds a text delta. Returns 0, or CAIRN_ERR_NOMEM. */
int api_out_feed(struct api_out *p, const char *text, size_t len);
/* End of output: flushes what is held back (an unterminated tool call becomes text). */
int api_out_finish(struct api_out *p);
void api_out_free(struct api_out *p);

/* Parses one tool-call body (what was between <tool_call> and </tool_call>, or a Llama JSON
 * object). On success *name and *args are malloc'd (caller frees); returns 0, else -1. */
int api_out_parse_tool_body(const char *body, size_t len, char **name, char **args);

#endif
