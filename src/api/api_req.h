/* Request parsing: JSON bodies of the four APIs -> one typed request (struct api_req) with the
 * conversation normalised to OpenAI-style messages for the chat template.
 *
 * Unknown fields are ignored; a known field of the wrong type or out of range is an error that
 * names the field (`param`). */
#ifndef CAIRN_API_API_REQ_H
#define CAIRN_API_API_REQ_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/engine.h"
#include "grammar/grammar.h"

enum api_kind {
    API_KIND_CHAT = 0,      /* POST /v1/chat/completions */
    API_KIND_COMPLETIONS,   /* POST /v1/completions */
    API_KIND_MESSAGES,      /* POST /v1/messages (Anthropic) */
    API_KIND_COUNT_TOKENS,  /* POST /v1/messages/count_tokens (Anthropic) */
    API_KIND_RESPONSES,     /* POST /v1/responses */
};

/* What constrains the output (grammar room), set by response_format / text.format, a forced
 * tool call, or the cairn extension ("cairn": {"json_schema": {...}} | {"regex": "..."} |
 * {"grammar": "<GBNF>"}). */
enum api_grammar_kind {
    API_GRAMMAR_NONE = 0,
    API_GRAMMAR_SCHEMA,      /* grammar_schema: a JSON Schema */
    API_GRAMMAR_REGEX,       /* grammar_text */
    API_GRAMMAR_GBNF,        /* grammar_text */
    API_GRAMMAR_TOOLS,       /* forced: a call of one of `tools` (one or more when parallel_tools),
                              * arguments constrained to its schema */
    API_GRAMMAR_TOOLS_AUTO,  /* tool_choice auto: free text until the envelope starts, then the same
                              * constraint to the envelope's end (a lazy grammar, grammar.h); after
                              * it free again when parallel_tools, else the end */
};

/* Tool-call envelope forced for API_GRAMMAR_TOOLS (api_out parses both). */
enum api_tool_form {
    API_TOOL_FORM_HERMES = 0, /* <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call> (Qwen) */
    API_TOOL_FORM_JSON,       /* {"name": N, "parameters": {...}} as the whole output (Llama 3) */
};

#define API_MAX_STOP 16
#define API_MAX_LOGIT_BIAS 1024

/* The same bits as the model's generation_config defaults (model.h), so one mask serves both. */
#define API_GIVEN_TEMPERATURE MODEL_GEN_TEMPERATURE
#define API_GIVEN_TOP_P MODEL_GEN_TOP_P
#define API_GIVEN_TOP_K MODEL_GEN_TOP_K
#define API_GIVEN_MIN_P MODEL_GEN_MIN_P
#define API_GIVEN_REPETITION_PENALTY MODEL_GEN_REPETITION_PENALTY

struct api_req {
    enum api_kind kind;
    char model[256];
    json_t *messages;        /* normalised messages (owned) */
    json_t *tools;           /* OpenAI-style tools or NULL (owned) */
    json_t *kwargs;          /* chat template kwargs (owned, may be empty object) */
    char *prompt;            /* completions: prompt text (owned) or NULL */
    int32_t *prompt_ids;     /* completions: prompt given as token ids (owned) */
    int n_prompt_ids;
    struct engine_sampling sampling;
    unsigned sampling_given; /* API_GIVEN_* bits: fields the request set (the rest may take the
                                model's generation_config.json defaults) */
    struct engine_logit_bias logit_bias[API_MAX_LOGIT_BIAS]; /* sampling.logit_bias points here:
                                * point it again after copying the struct */
    int max_tokens;          /* -1: not given */
    char *stop[API_MAX_STOP]; /* owned */
    int n_stop;
    int n;                   /* choices (OpenAI); 1 elsewhere */
    int stream;
    int include_usage;       /* stream_options.include_usage */
    int tool_choice_none;    /* tools are not offered */
    int tool_required;       /* tool_choice required / any / a named tool */
    int parallel_tools;      /* parallel_tool_calls (OpenAI, default 1) / !disable_parallel_tool_use
                              * (Anthropic): more than one call per turn */
    int echo;                /* completions: echo the prompt */
    int ignore_eos;          /* extension (vLLM): generate past EOS up to max_tokens */
    int speculative;         /* extension: enum engine_spec_mode, "off" | "ngram" | "auto" | "mtp";
                              * 0 = the server's --speculative */
    int thinking;            /* Anthropic thinking enabled / reasoning requested: -1 unset */
    enum api_grammar_kind grammar_kind;
    json_t *grammar_schema;  /* API_GRAMMAR_SCHEMA (owned) */
    char *grammar_text;      /* API_GRAMMAR_REGEX / _GBNF (owned) */
    char grammar_param[32];  /* the field that asked for it, for errors */
    struct grammar *grammar; /* compiled at parse (HERMES form, not in thinking), owned */
};

struct api_req_err {
    int status;              /* HTTP status (400) */
    char param[64];          /* offending field, "" if none */
    char message[384];
};

/* Parses body as `kind`. On error returns -1 and fills err (req is freed). max_n bounds `n`. */
int api_req_parse(enum api_kind kind, const char *body, size_t len, int max_n,
                  struct api_req *req, struct api_req_err *err);
void api_req_free(struct api_req *req);
/* Moves every system message after the first message into the leading system message (made
 * when there is none), joined by blank lines, for chat templates that allow a system message
 * only first. Returns 1 if it moved any, 0 if there were none. */
int api_req_merge_system(json_t *messages);

/* Compiles the request's output constraint. in_think: the prompt ended inside <think>, so the
 * output first closes it ("</think>\n\n"; with tool_choice auto, the envelope is looked for only
 * after "</think>"); form: the tool-call envelope. *out is NULL when the request has none. Errors
 * (400, naming grammar_param and the unsupported keyword) go to err. With tool_choice auto, a
 * tool whose parameters cannot be enforced has them constrained to any JSON object instead,
 * unless the tool says strict: true (then the 400). */
int api_req_grammar(const struct api_req *req, int in_think, enum api_tool_form form, struct grammar **out,
                    struct api_req_err *err);

#endif
