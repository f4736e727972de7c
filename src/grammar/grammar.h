/* grammar: constrained decoding. JSON Schema, a regex or a small GBNF grammar compiles to one
 * form (a byte-level recursive transition network); a matcher runs it over the BYTES of the
 * generated tokens and gives, before each sampling step, the set of vocabulary tokens that keep
 * the output inside the language (a bitset the sampler turns into -inf logits).
 *
 * Pieces and who owns them:
 *   struct grammar          compiled grammar, immutable, refcounted (grammar_retain / _free);
 *                           shared by every matcher made from it, any thread.
 *   struct grammar_vocab    the model's vocabulary as byte strings in a trie; immutable, made
 *                           once per model, any thread; must outlive its matchers.
 *   struct grammar_matcher  one per sequence, one thread at a time.
 *
 * Languages (what the compilers take):
 *   JSON Schema (jansson json_t): type (string / number / integer / boolean / null / object /
 *     array, or a list of them), properties, required, additionalProperties (false, true or a
 *     schema), items, minItems, maxItems, enum, const, pattern, format (date, time, date-time,
 *     uuid, email), minLength, maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum,
 *     anyOf, allOf of one schema, $ref into the document ("#", "#/$defs/..", "#/definitions/..",
 *     recursion included), $defs / definitions; and, beyond OpenAI's strict mode, where they are
 *     exact: minProperties / maxProperties on an object with listed properties (only those are
 *     ever written), prefixItems (with items for the rest, or items: false), oneOf when its
 *     branches are provably disjoint (distinct types, consts / enums, or a required property
 *     with distinct consts), else an error naming 'oneOf'; multipleOf with an integer m <= 100
 *     on integers (a mod-m automaton over the decimal digits, bounds included) or on numbers
 *     (then only integers are written). Annotations (title, description, default,
 *     examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, strict, name) are
 *     ignored. Any other keyword (not, if, patternProperties ...) is an error naming it and
 *     where it was (CAIRN_ERR_UNSUPPORTED).
 *     Output is compact JSON: objects list properties in declared order, a single optional space
 *     is allowed after ':' and ',' and nowhere else (a model can't pad forever); numbers have at
 *     most 16 digits before and after the point and 3 in the exponent. `pattern` is
 *     matched against the whole string (a full match is also a search match, so it validates).
 *   Regex (UTF-8 text): literals, escapes (\d \w \s \D \W \S \n \t \r \f \v \xHH \uHHHH and
 *     escaped punctuation), classes [a-z] [^...] (codepoints, turned into UTF-8 byte ranges),
 *     '.', groups ( ) (?: ), alternation |, * + ? {m} {m,} {m,n} (a lazy '?' suffix means the
 *     same here), leading ^ and trailing $ (the match is always the whole output). No
 *     backreferences or lookaround (CAIRN_ERR_UNSUPPORTED).
 *   GBNF (llama.cpp's grammar format): `name ::= alternatives` rules, "literals" with escapes,
 *     [classes], rule references, ( ), * + ? {m,n}, # comments; the start rule is `root`.
 *     Left recursion is rejected.
 *
 * Matcher: a set of stacks over the network (an Earley-like, graph-structured stack: each frame
 * is (state, frame below), interned, so identical stacks are one id and the set of live stacks
 * is an interned sorted list). Why not a plain DFA: JSON Schema needs recursion ($ref); why not
 * a full Earley chart: the schemas, regexes and grammars here are almost deterministic, so the
 * live set is a handful of stacks and one byte costs a few table lookups, and the interned sets
 * double as keys for a per-set transition table and token-mask cache. History is one set id per
 * accepted token, so rollback is O(1).
 *
 * Masks: grammar_matcher_fill_mask walks the vocabulary trie from the current set, stepping one
 * byte per trie edge through the memoized transition table (shared prefixes are stepped once),
 * skipping dead subtrees, and accepting a whole subtree at once where the set is the inside of a
 * JSON string and every token below holds only clean text (precomputed per trie node); the
 * result is cached per set. `cairn bench-grammar` measures it. */
#ifndef CAIRN_GRAMMAR_GRAMMAR_H
#define CAIRN_GRAMMAR_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/status.h"

struct grammar;
struct grammar_vocab;
struct grammar_matcher;

/* Compilers. On success *out has one reference (grammar_free drops it). Errors:
 * CAIRN_ERR_UNSUPPORTED (a keyword / construct not supported: the message names it),
 * CAIRN_ERR_INVALID (malformed: the message says where), CAIRN_ERR_LIMIT (too big),
 * CAIRN_ERR_NOMEM. */
int grammar_from_json_schema(const json_t *schema, struct grammar **out, struct cairn_err *err);
/* Same, the JSON text surrounded by literal bytes (a tool-call envelope: prefix "<tool_call>\n"
 * ...). Either may be NULL. */
int grammar_from_json_schema_wrapped(const json_t *schema, const char *prefix, const char *suffix,
                                     struct grammar **out, struct cairn_err *err);
/* Tool-call envelopes: `lead`, then one call `open` JSON `close`, and when `many`, further
 * calls (up to max_calls in all, 0: no limit), each after `sep` (a regex in the syntax below,
 * e.g. "\n?"). NULL strings are empty. */
struct grammar_calls {
    const char *lead, *open, *close, *sep;
    int many, max_calls;
};
int grammar_from_json_schema_calls(const json_t *schema, const struct grammar_calls *c, struct grammar **out,
                                   struct cairn_err *err);
int grammar_from_regex(const char *re, size_t len, struct grammar **out, struct cairn_err *err);
int grammar_from_gbnf(const char *text, size_t len, struct grammar **out, struct cairn_err *err);
/* Lazy grammars (tool_choice auto): the output is free text until `trigger` (bytes, e.g.
 * "<tool_call>") appears in it; the trigger's bytes and what follows are then held to g, whose
 * language must begin with the trigger, to the end of g's sentence. With GRAMMAR_LAZY_REPEAT the
 * output is free again after it (another trigger may come), else only eos may follow. With
 * GRAMMAR_LAZY_AT_START the trigger counts only at the start of the output (after whitespace):
 * any other first byte leaves the whole output free (Llama-3's bare JSON call). `arm` (NULL or
 * "": none) must appear before the trigger is looked for (the "</think>" that ends reasoning).
 * While free, tokens are not constrained, except a token that would complete the trigger and go
 * on with bytes g rejects; grammar_matcher_unconstrained says when no mask is needed at all.
 * Call once, before g is shared; CAIRN_ERR_INVALID if g rejects the trigger as its start. */
#define GRAMMAR_LAZY_REPEAT 1u
#define GRAMMAR_LAZY_AT_START 2u
#define GRAMMAR_TRIGGER_MAX 64
int grammar_set_trigger(struct grammar *g, const char *arm, const char *trigger, unsigned flags,
                        struct cairn_err *err);
struct grammar *grammar_retain(struct grammar *g);
void grammar_free(struct grammar *g); /* drops one reference; NULL is fine */
int grammar_n_states(const struct grammar *g);

/* Vocabulary: bytes[i][0..lens[i]) is what token i decodes to; a NULL or empty entry (special
 * tokens, unused ids) is never allowed by a mask, except the eos ids, which are allowed exactly
 * when the grammar accepts the output so far. Copies what it needs. */
int grammar_vocab_create(const uint8_t *const *bytes, const size_t *lens, int n, const int32_t *eos_ids,
                         int n_eos, struct grammar_vocab **out, struct cairn_err *err);
void grammar_vocab_free(struct grammar_vocab *v);
int grammar_vocab_size(const struct grammar_vocab *v);

/* Matcher at the start of the output. Retains g. */
int grammar_matcher_create(struct grammar *g, const struct grammar_vocab *v,
                           struct grammar_matcher **out, struct cairn_err *err);
void grammar_matcher_free(struct grammar_matcher *m);
/* Advances by a token (its bytes, or an eos id: only when accepting, after which nothing more is
 * allowed). CAIRN_ERR_INVALID when the grammar rejects it (state unchanged); CAIRN_ERR_LIMIT /
 * CAIRN_ERR_NOMEM when the matcher's memory cap is hit. */
int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t id);
/* Advances by raw bytes as one history step (tests, forced text). Same errors. */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const uint8_t *b, size_t n);
/* 1 if b[0..n) would be accepted from here (state unchanged), 0 if not, <0 on error. */
int grammar_matcher_try_bytes(struct grammar_matcher *m, const uint8_t *b, size_t n);
/* Undoes the last n accepted steps (tokens or byte runs). CAIRN_ERR_INVALID if fewer exist. */
int grammar_matcher_rollback(struct grammar_matcher *m, int n);
int grammar_matcher_n_steps(const struct grammar_matcher *m); /* steps that can be rolled back */
/* 1 if the output so far is a complete sentence of the grammar. */
int grammar_matcher_accepting(const struct grammar_matcher *m);
/* 1 if no byte can follow (complete and closed: only eos remains). */
int grammar_matcher_finished(const struct grammar_matcher *m);
/* 1 if no mask is needed before the next token (a lazy grammar's free text, where every token
 * is allowed: the caller may skip fill_mask and sample freely), 0 if a mask is needed, <0 on
 * error. Always 0 for a grammar that is not lazy. */
int grammar_matcher_unconstrained(struct grammar_matcher *m);
/* Fills mask[(n_vocab + 31) / 32]: bit i of word i/32 set = token i allowed now. Returns the
 * number of allowed tokens (0: nothing can continue), or <0 on error. */
int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask);

#endif
