/* grammar internals: the builder the three compilers emit into, the compiled network, and the
 * vocabulary trie. Not for other rooms (use grammar.h).
 *
 * Builder: Thompson-style fragments over states with three edge kinds (byte range, call of a
 * rule, epsilon). gram_finish removes the epsilons (each state takes the edges and the final
 * flag of its epsilon closure), checks for left recursion and packs the network:
 *   state s: byte edges  be[be_off[s] .. be_off[s+1])   {lo, hi, target}
 *            call edges  ce[ce_off[s] .. ce_off[s+1])   {rule, return state}
 *            final[s]    the rule the state belongs to may end here
 *   rule r:  rule_start[r]; rule 0 is the start rule. */
#ifndef CAIRN_GRAMMAR_GRAMMAR_INT_H
#define CAIRN_GRAMMAR_GRAMMAR_INT_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

#define GRAM_MAX_STATES (1 << 20)  /* builder states: bounds {m,n} and maxLength blow-up */
#define GRAM_MAX_RULES (1 << 16)
#define GRAM_MAX_WORK (1 << 21)    /* finish: closure members + edges copied, bounds its time and the
                                    * packed network's size (n nullable parts in a row cost n^2) */
#define GRAM_MAX_REPARSE (1 << 20) /* pattern bytes parsed again for the copies of quantified atoms:
                                    * nested {m,n} multiply, and an atom with no states (a long
                                    * class of one range) never meets GRAM_MAX_STATES */
#define GRAM_MAX_DEPTH 512         /* stack frames at run time (nesting of recursive rules) */

/* UTF-8 as a small DFA, for "clean string text": characters JSON strings take unescaped (not
 * '"', '\' or a control), complete or a valid unfinished last one. State 0 = at a character
 * boundary; GRAM_U8_BAD = invalid or not clean. */
#define GRAM_U8_BAD 255
uint8_t gram_u8_next(uint8_t state, uint8_t byte);

enum { GRAM_EDGE_BYTE = 0, GRAM_EDGE_CALL, GRAM_EDGE_EPS };

struct gram_bedge {
    uint8_t kind;
    uint8_t lo, hi;   /* GRAM_EDGE_BYTE */
    int32_t rule;     /* GRAM_EDGE_CALL */
    int32_t to;
};

struct gram_bstate {
    struct gram_bedge *e;
    int n, cap;
    int final;
    int32_t alt_end; /* gram_f_alt's entry state: its exit state + 1 (0: not one) */
};

struct gram_frag {
    int32_t s, e;     /* entry and exit state */
};

struct gram_builder {
    struct gram_bstate *st;
    int n_st, cap_st;
    int32_t *rule_start, *rule_end; /* rule_end: the exit state (made final at finish) */
    int n_rules, cap_rules;
    size_t reparsed;   /* gram_b_reparse's count, up to GRAM_MAX_REPARSE */
    int failed;        /* a limit or allocation failed: status in fail_status */
    int fail_status;
    struct cairn_err *err;
};

void gram_b_init(struct gram_builder *b, struct cairn_err *err);
void gram_b_free(struct gram_builder *b);
int32_t gram_b_state(struct gram_builder *b);
/* Counts len pattern bytes about to be parsed again for one more copy of a quantified atom;
 * past GRAM_MAX_REPARSE in all the builder fails (CAIRN_ERR_LIMIT). Returns 0 or the status. */
int gram_b_reparse(struct gram_builder *b, size_t len);
void gram_b_eps(struct gram_builder *b, int32_t from, int32_t to);
void gram_b_byte(struct gram_builder *b, int32_t from, int32_t to, uint8_t lo, uint8_t hi);
void gram_b_call(struct gram_builder *b, int32_t from, int32_t to, int32_t rule);
/* A new rule; its body is connected by the caller between rule_start[r] and rule_end[r]. */
int32_t gram_b_rule(struct gram_builder *b);
/* Fragments. */
struct gram_frag gram_f_empty(struct gram_builder *b);
struct gram_frag gram_f_bytes(struct gram_builder *b, const void *s, size_t n); /* literal */
struct gram_frag gram_f_range(struct gram_builder *b, uint8_t lo, uint8_t hi);
struct gram_frag gram_f_call(struct gram_builder *b, int32_t rule);
/* Codepoint ranges [lo[i], hi[i]] (sorted or not, may overlap; surrogates dropped) as UTF-8. */
struct gram_frag gram_f_cps(struct gram_builder *b, const uint32_t *lo, const uint32_t *hi, int n);
struct gram_frag gram_f_seq(struct gram_builder *b, struct gram_frag x, struct gram_frag y);
struct gram_frag gram_f_alt(struct gram_builder *b, struct gram_frag x, struct gram_frag y);
struct gram_frag gram_f_opt(struct gram_builder *b, struct gram_frag x);
struct gram_frag gram_f_star(struct gram_builder *b, struct gram_frag x);
/* Connects body between rule r's start and end. */
void gram_b_rule_body(struct gram_builder *b, int32_t r, struct gram_frag body);
/* Failure helper: records status (first one wins) and returns it. */
int gram_b_fail(struct gram_builder *b, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Compiles the builder (rule 0 = start) into *out. Frees nothing of b. */
int gram_b_finish(struct gram_builder *b, struct grammar **out);

/* Regex into a fragment. json_string: the text sits inside a JSON string, so '"', '\\' and
 * control characters are emitted as their JSON escapes. */
int gram_regex_emit(struct gram_builder *b, const char *re, size_t len, int json_string,
                    struct gram_frag *out);
/* A class body at s[*i] (just after '['), through the closing ']'; *i moves past it. */
int gram_regex_class(struct gram_builder *b, const char *s, size_t n, size_t *i, struct gram_frag *out);

/* ---- compiled ---- */
struct gram_edge {
    uint8_t lo, hi;
    int32_t to;
};
struct gram_call {
    int32_t rule;
    int32_t ret;
};

/* A lazy grammar's trigger (grammar_set_trigger). Free states, numbered 0 .. n_free - 1:
 * [0, n_arm) looking for the arm string (KMP state k), [n_arm, n_arm + n_trig) looking for the
 * trigger (KMP state k - n_arm), n_arm + n_trig: free for good (an AT_START trigger that did not
 * come first). A matcher starts in free state 0 and returns to n_arm after a REPEAT sentence. */
struct gram_trigger {
    uint8_t arm[GRAMMAR_TRIGGER_MAX], trig[GRAMMAR_TRIGGER_MAX];
    int n_arm, n_trig, n_free;
    uint8_t arm_fail[GRAMMAR_TRIGGER_MAX], trig_fail[GRAMMAR_TRIGGER_MAX]; /* KMP borders */
    unsigned flags;           /* GRAMMAR_LAZY_* */
};
#define GRAM_LZ_TRIGGERED (-1) /* gram_lz_step: the trigger's last byte */
/* The free state after `byte` from free state f, or GRAM_LZ_TRIGGERED. */
int gram_lz_step(const struct gram_trigger *t, int f, uint8_t byte);
/* The tokens that, read from free state f, complete the trigger (ids ascending), cached in the
 * vocabulary per trigger (any thread: the cache has its own lock). CAIRN_ERR_NOMEM. */
int gram_vocab_lz_cands(const struct grammar_vocab *v, const struct gram_trigger *t, int f, const int32_t **ids,
                        int *n);
struct gram_lz_cache;
void gram_lz_cache_free(struct gram_lz_cache *c);

struct grammar {
    int refs;                 /* atomic */
    struct gram_trigger *lazy; /* NULL: constrained from the first byte */
    int n_states, n_rules;
    int32_t *be_off;          /* [n_states + 1] */
    struct gram_edge *be;
    int32_t *ce_off;          /* [n_states + 1] */
    struct gram_call *ce;
    uint8_t *final;           /* [n_states] */
    int32_t *rule_start;      /* [n_rules] */
};

/* ---- vocabulary trie (DFS pre-order) ---- */
struct grammar_vocab {
    int n_vocab;
    int n_nodes;              /* node 0 is the root (empty prefix) */
    uint8_t *byte;            /* [n_nodes] edge byte from the parent */
    uint16_t *depth;          /* [n_nodes] root = 0 */
    int32_t *end;             /* [n_nodes] first node after the subtree */
    int32_t *tok_lo;          /* [n_nodes] tokens ending here: ids[tok_lo .. tok_mid) */
    int32_t *tok_mid;         /*   and tokens below: ids[tok_mid .. tok_hi) */
    int32_t *tok_hi;
    int32_t *ids;             /* token ids in trie order */
    uint8_t *sclean;          /* [n_nodes] 1: every token strictly below has clean text after this
                               * node's prefix (see grammar_vocab.c), so a set inside a JSON string
                               * accepts the whole subtree */
    int max_depth;
    uint32_t *eos_mask;       /* [(n_vocab + 31) / 32] */
    int32_t *eos;
    int n_eos;
    uint8_t *tb;              /* all token bytes */
    int64_t *tb_off;          /* [n_vocab + 1] token i = tb[tb_off[i] .. tb_off[i+1]) */
    struct gram_lz_cache *lz; /* lazy grammars' trigger candidates (grammar_lazy.c); the only
                               * mutable part, behind its own lock */
};

#endif
