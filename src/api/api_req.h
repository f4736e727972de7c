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

enum api_kind {
    API_KIND_CHAT = 0,      /* POST /v1/chat/completions */
    API_KIND_COMPLETIONS,   /* POST /v1/completions */
    API_KIND_MESSAGES,      /* POST /v1/messages (Anthropic) */
    API_KIND_COUNT_TOKENS,  /* POST /v1/messages/count_tokens (Anthropic) */
    API_KIND_RESPONSES,     /* POST /v1/responses */
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
    struct engine_logit_bias logit_bias[API_MAX_LOGIT_BIAS];
    int max_tokens;          /* -1: not given */
    char *stop[API_MAX_STOP]; /* owned */
    int n_stop;
    int n;                   /* choices (OpenAI); 1 elsewhere */
    int stream;
    int include_usage;       /* stream_options.include_usage */
    int tool_choice_none;    /* tools are not offered */
    int tool_required;       /* tool_choice required / any / a named tool */
    int echo;                /* completions: echo the prompt */
    int ignore_eos;          /* extension (vLLM): generate past EOS up to max_tokens */
    int speculative;         /* extension: enum engine_spec_mode, "off" | "ngram" | "auto";
                              * 0 = the server's --speculative */
    int thinking;            /* Anthropic thinking enabled / reasoning requested: -1 unset */
    char warning[256];       /* for the x-cairn-warning header, "" if none */
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

#endif
