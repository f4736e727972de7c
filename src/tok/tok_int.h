/* tok internals shared by the tok_*.c files: hash maps, the pipeline components parsed from
 * tokenizer.json, and the per-call scratch buffers. Not for other rooms (use tok.h). */
#ifndef CAIRN_TOK_TOK_INT_H
#define CAIRN_TOK_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "base/utf8.h"
#include "tok/tok.h"

/* Number of times a growable array (spans, ids, decoder flags) had to grow; with
 * cairn_buf_n_grow (byte buffers) tests use it to show the streaming detokenizer allocates
 * nothing per token once warm. */
extern unsigned long tok_n_grow;
#define TOK_COUNT_GROW() __atomic_add_fetch(&tok_n_grow, 1, __ATOMIC_RELAXED)

/* ---- string -> int32 map (open addressing; keys copied into an arena) ---- */
struct tok_smap {
    uint32_t *slots;   /* entry index + 1; 0 = empty */
    uint32_t mask;     /* slots - 1 (power of two) */
    uint32_t n;        /* entries */
    uint32_t cap;      /* entries allocated */
    uint64_t *key_off; /* into arena */
    uint32_t *key_len;
    int32_t *val;
    struct cairn_buf arena;
};
int tok_smap_init(struct tok_smap *m, uint32_t expect);
/* Inserts or overwrites. */
int tok_smap_put(struct tok_smap *m, const char *key, size_t len, int32_t val);
/* Returns the value or -1. */
int32_t tok_smap_get(const struct tok_smap *m, const char *key, size_t len);
void tok_smap_free(struct tok_smap *m);

/* ---- uint64 -> uint64 map (keys != UINT64_MAX) ---- */
struct tok_qent {
    uint64_t key; /* UINT64_MAX = empty */
    uint64_t val;
};
struct tok_qmap {
    struct tok_qent *e; /* key and value side by side: one cache miss per probe */
    uint32_t mask, n;
};
int tok_qmap_init(struct tok_qmap *m, uint32_t expect);
int tok_qmap_put(struct tok_qmap *m, uint64_t key, uint64_t val);
int tok_qmap_get(const struct tok_qmap *m, uint64_t key, uint64_t *val); /* 1 found, 0 not */
void tok_qmap_free(struct tok_qmap *m);

/* ---- regex (PCRE2, UTF + UCP, JIT when available) ---- */
struct tok_re {
    pcre2_code *code;
};
/* Compiles a pattern written for Oniguruma / Rust regex (HF's syntax). */
int tok_re_compile(struct tok_re *re, const char *pat, size_t len, struct cairn_err *err);
void tok_re_free(struct tok_re *re);
/* Finds the next non-empty match at or after `start` in s[0..n). Returns 1 and sets [*ms,*me),
 * 0 if none, <0 on error. md is per-call match data. */
int tok_re_next(const struct tok_re *re, pcre2_match_data *md, const char *s, size_t n,
                size_t start, size_t *ms, size_t *me);

/* ---- pipeline components ---- */
enum tok_norm_type {
    TOK_NORM_SEQUENCE,
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,
    TOK_NORM_STRIP_ACCENTS,
    TOK_NORM_REPLACE,
    TOK_NORM_PREPEND,
};

struct tok_norm {
    enum tok_norm_type type;
    struct tok_norm *kids; /* SEQUENCE */
    int n_kids;
    char *pat; /* REPLACE (String pattern) */
    size_t pat_len;
    struct tok_re re; /* REPLACE (Regex pattern), code NULL if String */
    char *content;    /* REPLACE content, PREPEND text */
    size_t content_len;
    int left, right; /* STRIP */
};

enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

enum tok_pretok_type {
    TOK_PRE_SEQUENCE,
    TOK_PRE_SPLIT,
    TOK_PRE_BYTELEVEL,
    TOK_PRE_DIGITS,
    TOK_PRE_METASPACE,
    TOK_PRE_WHITESPACE,       /* \w+|[^\w\s]+ */
    TOK_PRE_WHITESPACE_SPLIT, /* split on whitespace, removed */
    TOK_PRE_PUNCTUATION,
};

enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

struct tok_pretok {
    enum tok_pretok_type type;
    struct tok_pretok *kids;
    int n_kids;
    struct tok_re re; /* SPLIT with a Regex pattern; WHITESPACE; BYTELEVEL with use_regex */
    char *lit;        /* SPLIT with a String pattern */
    size_t lit_len;
    enum tok_split_behavior behavior;
    int invert;
    int add_prefix_space; /* BYTELEVEL */
    int use_regex;        /* BYTELEVEL */
    int individual;       /* DIGITS */
    char repl[8];         /* METASPACE replacement, UTF-8 */
    size_t repl_len;
    enum tok_prepend_scheme prepend;
    int split; /* METASPACE */
};

enum tok_dec_type {
    TOK_DEC_SEQUENCE,
    TOK_DEC_BYTELEVEL,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_REPLACE,
    TOK_DEC_METASPACE,
};

struct tok_dec {
    enum tok_dec_type type;
    struct tok_dec *kids;
    int n_kids;
    char *pat; /* REPLACE */
    size_t pat_len;
    struct tok_re re;
    char *content; /* REPLACE content; STRIP content char (UTF-8) */
    size_t content_len;
    int start, stop; /* STRIP */
    char repl[8];    /* METASPACE */
    size_t repl_len;
    int strip_first; /* METASPACE: prepend_scheme != never (or add_prefix_space) */
};

struct tok_added {
    int32_t id;
    char *content; /* as written in tokenizer.json */
    size_t len;
    char *match; /* what is searched for: content, normalized if `normalized` */
    size_t match_len;
    uint8_t special, lstrip, rstrip, single_word, normalized;
};

/* Byte trie over added-token strings: edges in a qmap keyed (node << 8 | byte). */
struct tok_trie {
    struct tok_qmap edges;
    int32_t *term; /* node -> index into tok.added, or -1 */
    uint32_t n_nodes, cap_nodes;
    uint8_t first[256]; /* bytes that start some token */
};

struct tok {
    /* vocabulary: pieces by id (added tokens override the model's), NUL-terminated */
    int32_t n_vocab;
    uint64_t *piece_off;
    uint32_t *piece_len;
    struct cairn_buf pieces;
    uint8_t *special; /* [n_vocab] 1 = special added token */
    uint8_t *is_added;

    struct tok_smap model_vocab; /* the BPE model's own vocab */
    struct tok_smap added_map;   /* added token content -> id */

    /* BPE model */
    struct tok_qmap merges; /* (id_a << 32 | id_b) -> (rank << 32 | new_id) */
    int32_t unk_id;         /* -1 if none */
    int byte_fallback, fuse_unk, ignore_merges;
    char *cont_prefix, *eow_suffix; /* may be NULL */
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_ids[256];       /* <0xXX> ids or -1 */
    int32_t byte_level_ids[256]; /* id of the byte-level char of each byte, or -1 */
    /* SentencePiece-style words (no pre-tokenizer: a whole segment is one word) are cut before
     * each U+2581 whose preceding char never precedes U+2581 inside a vocab token: no merge can
     * cross such a cut, so the result is the same and the heaps stay small. */
    int sp_split;
    uint32_t *sp_glue; /* sorted codepoints c such that some token contains c U+2581 */
    size_t n_sp_glue;
    uint16_t *id_byte; /* [n_vocab]: 1 + byte value if piece is <0xXX> (tok_byte_piece), else 0 */

    struct tok_added *added;
    int n_added;
    struct tok_trie trie_raw;  /* non-normalized added tokens, matched on raw text */
    struct tok_trie trie_norm; /* normalized added tokens, matched on normalized text */

    struct tok_norm *norm;     /* NULL if none */
    struct tok_pretok *pretok; /* NULL if none */
    struct tok_dec *dec;       /* NULL if none (pieces joined by " ") */
    int32_t *post_single;      /* template for one sequence; -1 marks the sequence */
    int n_post_single;
    int has_post;

    /* holdback rules for streaming */
    int dec_has_bytes;  /* ByteLevel or ByteFallback present */
    char strip_tail[8]; /* Strip-after-Fuse stop char (UTF-8) */
    size_t strip_tail_len;
    int strip_tail_n;

    /* tokenizer_config.json */
    char *bos_token, *eos_token;
    int32_t bos_id, eos_id;
    int add_bos;
};

/* Byte <-> char tables of GPT-2's byte-level encoding. */
extern uint32_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp); /* -1 if not a byte-level char */
void tok_bytelevel_init(void);

/* The byte of a byte-fallback piece "<0xXX>" (as HF's ByteFallback reads it), or -1. */
int tok_byte_piece(const char *p, size_t n);

/* components (tok_pipe.c) */
int tok_norm_apply(const struct tok_norm *nm, pcre2_match_data *md, const char *s, size_t n,
                   struct cairn_buf *out, struct cairn_buf *tmp);
void tok_norm_free(struct tok_norm *nm);
void tok_pretok_free(struct tok_pretok *p);
void tok_dec_free(struct tok_dec *d);

/* Pre-tokenized pieces: ranges into a buffer. */
struct tok_span {
    size_t off, len;
};
struct tok_spans {
    struct tok_span *v;
    size_t n, cap;
};
int tok_spans_push(struct tok_spans *s, size_t off, size_t len);

/* Runs pre-tokenizer p over s[0..n) (first: the segment starts the text). Result: pieces as
 * spans of *out_buf (which is either a copy or a transform of s). */
struct tok_pre_work {
    struct cairn_buf buf[2];
    struct tok_spans sp[2];
    struct tok_spans tmp;
    pcre2_match_data *md;
};
int tok_pretok_run(const struct tok_pretok *p, struct tok_pre_work *w, const char *s, size_t n,
                   int first, const struct cairn_buf **out_buf, const struct tok_spans **out_spans);

/* BPE (tok_bpe.c): appends the ids of word w[0..n) to ids. */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};
int tok_ids_push(struct tok_ids *ids, int32_t id);
struct tok_bpe_work {
    int32_t *sym;
    int32_t *prev, *next;
    uint32_t *slen; /* bytes */
    size_t cap;
    void *heap; /* struct tok_heap_ent[]: (rank << 32 | pos, new_id), min-heap */
    size_t heap_n, heap_cap;
    struct cairn_buf key;
};
int tok_bpe_word(const struct tok *t, struct tok_bpe_work *w, const char *s, size_t n,
                 struct tok_ids *ids);
void tok_bpe_work_free(struct tok_bpe_work *w);

/* Decoder pipeline over a list of token strings (tok_decode.c). */
struct tok_dec_work {
    struct cairn_buf buf[2];
    struct tok_spans sp[2];
    uint8_t *first[2]; /* per token: is the first token of the sequence */
    size_t first_cap[2];
    struct cairn_buf bytes;
    pcre2_match_data *md;
    int tail_open; /* out: the ByteLevel bytes end in an unfinished character */
};
void tok_dec_work_free(struct tok_dec_work *w);
/* Decodes the pieces of ids[0..n) (already filtered) into out. starts_seq: ids[0] is the first
 * token of the sequence; at_end: ids[n-1] is the last. */
int tok_dec_run(const struct tok *t, struct tok_dec_work *w, const int32_t *ids, size_t n,
                int starts_seq, int at_end, struct cairn_buf *out);

/* loader (tok_load.c) */
int tok_parse(struct tok *t, const char *json, size_t len, struct cairn_err *err);

/* JSON helpers (tok_util.c): a malloc'd copy of s[0..n); o[key] as a string (NULL if absent or
 * not one; *len its bytes, len may be NULL); o[key] as a bool (dflt if absent). */
char *tok_strndup(const char *s, size_t n);
const char *tok_jstr(json_t *o, const char *key, size_t *len);
int tok_jbool(json_t *o, const char *key, int dflt);

/* Pipeline parts of tokenizer.json (tok_load_parts.c); depth counts Sequence nesting. */
#define TOK_MAX_DEPTH 16
#define TOK_MAX_ID (1 << 24) /* ids at or above are refused */
int tok_parse_norm(json_t *j, struct tok_norm *nm, int depth, struct cairn_err *err);
int tok_parse_pretok(json_t *j, struct tok_pretok *p, int depth, struct cairn_err *err);
int tok_parse_dec(json_t *j, struct tok_dec *d, int depth, struct cairn_err *err);
int tok_parse_post(struct tok *t, json_t *j, int depth, struct cairn_err *err);
/* Streaming holdback rules (byte groups, Strip tail) from the decoder tree into t. */
void tok_dec_scan(struct tok *t, const struct tok_dec *d);

#endif
