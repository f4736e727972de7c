/* tmpl: a Jinja interpreter for Hugging Face chat templates.
 *
 * Goal: byte-exact parity with transformers' apply_chat_template(..., tokenize=False), which
 * renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[loopcontrols, generation]) plus the globals raise_exception(msg) and
 * strftime_now(fmt) and a `tojson` filter that is json.dumps(x, ensure_ascii=False, indent=?,
 * separators=?, sort_keys=?).
 *
 * Supported: if/elif/else, for (loop.index/index0/revindex/revindex0/first/last/length/
 * previtem/nextitem/cycle, else, `if` filter, tuple unpacking, break/continue), set (incl.
 * namespace attributes and block set with filters), macro/call/caller() (with jinja2's
 * varargs/kwargs/caller rules), filter blocks, with, generation blocks, raw, comments,
 * whitespace control; expressions with Python semantics (truthiness, str()/repr() printing,
 * code-point string indexing and slicing, chained comparisons, int64 arithmetic with overflow
 * errors, full Unicode case mapping, str.format specs and printf-style %); jinja2's default
 * Undefined; filters tojson trim length/count items list join default/d first last
 * select/reject(attr) map upper lower capitalize title replace safe string int float abs round
 * unique sort reverse dictsort indent wordcount center sum min max attr format truncate batch
 * escape/e tuple; the usual tests; str/dict/list methods; globals range (sandbox cap 100000),
 * namespace, dict, raise_exception, strftime_now.
 * Not supported (compile or render error, never wrong output): include/extends/import,
 * recursive for loops, `do`, list/dict mutation (the immutable sandbox forbids it too),
 * integers beyond int64, nested fields in format specs, zero padding with a thousands
 * separator, the filters groupby/slice/pprint/urlencode/striptags/xmlattr/wordwrap/random,
 * loop.changed, and the cycler/joiner/lipsum globals.
 *
 * Hostile templates hit limits (steps, output bytes, memory, call depth, parse depth) and fail
 * with CAIRN_ERR_LIMIT; nothing crashes or hangs.
 *
 * Thread-safety: a compiled template is immutable; any number of threads may render it at once.
 * Each render uses its own arena, freed before tmpl_render returns.
 */
#ifndef CAIRN_TMPL_TMPL_H
#define CAIRN_TMPL_TMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/span.h"
#include "base/status.h"

struct tmpl;

/* Compile-time limits (fixed): template source size and syntactic nesting depth. */
#define TMPL_MAX_SOURCE_BYTES ((size_t)4 << 20)
#define TMPL_MAX_PARSE_DEPTH 128
#define TMPL_MAX_TREE_DEPTH 1000 /* AST depth, incl. long chains like a + b + c + ... */

struct tmpl_limits {
    uint64_t max_steps;      /* evaluation steps (statements + expression nodes + loop turns) */
    size_t max_output_bytes; /* bytes of rendered output (also of each captured block) */
    size_t max_memory_bytes; /* bytes of the render arena (all values made while rendering) */
    int max_call_depth;      /* nested macro / caller() calls */
};

/* Defaults: 50M steps, 64 MiB output, 512 MiB memory, call depth 64. */
struct tmpl_limits tmpl_limits_default(void);

/* Compiles template source (UTF-8; \r\n and \r become \n; one trailing newline is dropped, as
 * jinja2 does). On error returns CAIRN_ERR_FORMAT (syntax, with line), CAIRN_ERR_LIMIT (too big
 * or too deep) or CAIRN_ERR_NOMEM, and *out is NULL. Free with tmpl_free. */
int tmpl_compile(const char *src, size_t len, struct tmpl **out, struct cairn_err *err);
void tmpl_free(struct tmpl *t);

/* Renders with `context` (a JSON object: its keys become template variables; not modified,
 * borrowed). lim may be NULL for defaults. On success *out is a NUL-terminated malloc'd string
 * of *len bytes (caller frees). On failure *out is NULL and err says why:
 * CAIRN_ERR_INVALID for template errors (raise_exception: the message itself; undefined
 * variables used in operations; type errors), CAIRN_ERR_LIMIT when a limit was hit,
 * CAIRN_ERR_NOMEM. */
int tmpl_render(const struct tmpl *t, json_t *context, const struct tmpl_limits *lim, char **out,
                size_t *len, struct cairn_err *err);

/* Convenience for chat: builds the context as transformers does ({**special tokens, messages,
 * tools, documents: None, add_generation_prompt, **kwargs}) and renders with default limits.
 * tools NULL = None; bos/eos NULL = not defined; kwargs (JSON object or NULL) may add or
 * override any variable (e.g. enable_thinking). All JSON arguments are borrowed. */
int tmpl_render_chat(const struct tmpl *t, json_t *messages, json_t *tools, int add_generation_prompt,
                     const char *bos, const char *eos, json_t *kwargs, char **out, size_t *len,
                     struct cairn_err *err);

/* tmpl_render_chat that also says which bytes of *out came from data rather than from the
 * template source: every string of messages, tools and kwargs is data; template literals and
 * bos/eos (unless kwargs replaces them) are not. A string a filter or method makes from data is
 * data as a whole; concatenation and captured output (macros, set blocks) keep exact spans. So
 * the template's own markup is never data, and data is never reported as template text.
 * *spans (malloc'd, caller frees; NULL when *n_spans == 0) are sorted, disjoint, not adjacent. */
int tmpl_render_chat_spans(const struct tmpl *t, json_t *messages, json_t *tools,
                           int add_generation_prompt, const char *bos, const char *eos,
                           json_t *kwargs, char **out, size_t *len, struct cairn_span **spans,
                           size_t *n_spans, struct cairn_err *err);

/* Loads the chat template of a tokenizer folder, as transformers does: chat_template.jinja if
 * present, else chat_template.json {"chat_template": ...}, else tokenizer_config.json
 * "chat_template" (a string, or a list of {name, template}: "default" or else the first). The
 * only reader of chat templates (tok has none). Also returns bos/eos
 * token strings from tokenizer_config.json (string or {"content": ...}), NULL when absent.
 * Returns CAIRN_ERR_NOT_FOUND when the folder has no chat template. Caller frees *bos and *eos
 * with free() and *out with tmpl_free. bos/eos may be NULL if not wanted. */
int tmpl_load_from_dir(const char *dir, struct tmpl **out, char **bos, char **eos,
                       struct cairn_err *err);

#endif
