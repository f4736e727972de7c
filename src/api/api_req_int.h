/* Internals of request parsing, shared by api_req.c (the four APIs' parse functions, merge_system,
 * free), api_req_fields.c (the typed getters and the fields the APIs share) and api_req_grammar.c
 * (api_req_grammar). Not for other files: use api_req.h.
 *
 * Every function that takes a struct api_req_err fills it (400, the offending param, a message)
 * and returns -1 on bad input, 0 otherwise. */
#ifndef CAIRN_API_API_REQ_INT_H
#define CAIRN_API_API_REQ_INT_H

#include "api/api_req.h"

/* Fills e (status 400, param, message) and returns -1. */
int api_req_fail(struct api_req_err *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Field getters: absent or null leaves *out alone and returns 0; wrong type or range -> -1. */
int api_req_get_num(json_t *o, const char *key, double lo, double hi, double *out, struct api_req_err *e);
int api_req_get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, struct api_req_err *e);
int api_req_get_bool(json_t *o, const char *key, int *out, struct api_req_err *e);
int api_req_get_str(json_t *o, const char *key, const char **out, struct api_req_err *e);

/* Concatenated text of an OpenAI/Responses content value (string, null or parts); *out malloc'd. */
int api_req_content_text(json_t *content, const char *param, char **out, struct api_req_err *e);
/* Arguments of a tool call as an object when they parse (templates iterate them), else as
 * given. A new reference. */
json_t *api_req_args_value(json_t *args);
/* A new {"role", "content"} message (NULL content: ""). */
json_t *api_req_msg(const char *role, const char *content);
/* Keeps only the tool named `name` (param: the field that named it). */
int api_req_tools_only(struct api_req *r, const char *name, const char *param, struct api_req_err *e);
/* o[key]: a string or an array of at most API_MAX_STOP strings, into r->stop. */
int api_req_stop(json_t *o, const char *key, struct api_req *r, struct api_req_err *e);
/* Extension, every API: per-request speculative decoding (engine.h). */
int api_req_speculative(json_t *o, struct api_req *r, struct api_req_err *e);
/* Sampling fields shared by chat and completions (OpenAI names, plus the usual extensions). */
int api_req_sampling(json_t *o, struct api_req *r, struct api_req_err *e);
/* logit_bias (OpenAI; an extension in Anthropic messages): {"token id": bias in [-100, 100]}. */
int api_req_logit_bias(json_t *o, struct api_req *r, struct api_req_err *e);
/* stream and stream_options.include_usage. */
int api_req_stream(json_t *o, struct api_req *r, struct api_req_err *e);
/* Records what constrains the output; a second constraint is an error. */
int api_req_set_grammar(struct api_req *r, enum api_grammar_kind kind, const char *param, json_t *schema,
                        const char *text, struct api_req_err *e);
/* response_format (chat) / text.format (responses): JSON output, constrained by a grammar. */
int api_req_format(json_t *fmt, const char *param, struct api_req *r, struct api_req_err *e);
/* The cairn extension: "cairn": {"json_schema": {...}} | {"regex": "..."} | {"grammar": "..."}. */
int api_req_cairn_ext(json_t *o, struct api_req *r, struct api_req_err *e);
/* model: a required string that fits r->model. */
int api_req_model(json_t *o, struct api_req *r, struct api_req_err *e);
/* chat_template_kwargs: an object merged into r->kwargs. */
int api_req_kwargs(json_t *o, struct api_req *r, struct api_req_err *e);

#endif
