/* tmpl internals: arena, values, AST, render state. Shared by the tmpl_*.c files only.
 *
 * DESIGN
 * - Compile: lexer (tmpl_lex.c) -> token array -> recursive-descent parser (tmpl_parse.c, tmpl_parse_expr.c) ->
 *   AST of struct tmpl_node, all allocated in the template's own arena (immutable afterwards).
 * - Render: tree-walking interpreter (tmpl_eval.c). Every value made while rendering lives in
 *   a per-render arena (struct tmpl_arena) with a byte limit, so there is no per-value freeing and
 *   errors unwind with longjmp (tmpl_fail) to tmpl_render, which frees the arena and output.
 *   Nothing between tmpl_render and a tmpl_fail call may own malloc'd memory.
 * - Values (struct tmpl_tv) are small tagged unions passed by value. Strings are (pointer, length)
 *   views of valid UTF-8 (context strings point into the caller's json_t). Lists and dicts are
 *   immutable once built, except namespace() objects, which `set ns.x = ...` mutates.
 */
#ifndef CAIRN_TMPL_TMPL_INT_H
#define CAIRN_TMPL_TMPL_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "base/span.h"
#include "base/status.h"
#include "base/utf8.h"
#include "tmpl/tmpl.h"

/* ---- arena ---- */
struct tmpl_arena_chunk;
struct tmpl_arena {
    struct tmpl_arena_chunk *head;
    size_t used_bytes;  /* total bytes handed out + chunk overheads */
    size_t limit_bytes; /* 0 = unlimited */
};
/* Returns NULL when out of memory or over the limit. Memory is zeroed, 16-byte aligned. */
void *tmpl_arena_alloc(struct tmpl_arena *a, size_t n);
void tmpl_arena_free_all(struct tmpl_arena *a);

/* ---- values ---- */
enum tmpl_tv_type {
    TMPL_TV_UNDEF = 0, /* s = hint for error messages ("'x' is undefined") */
    TMPL_TV_NONE,
    TMPL_TV_BOOL,
    TMPL_TV_INT,
    TMPL_TV_FLOAT,
    TMPL_TV_STR,
    TMPL_TV_LIST,    /* list or tuple (l->is_tuple) */
    TMPL_TV_DICT,
    TMPL_TV_NS,      /* namespace(): a mutable dict */
    TMPL_TV_MACRO,   /* a macro or caller() */
    TMPL_TV_BUILTIN, /* global function: b = id */
    TMPL_TV_METHOD,  /* bound method: m->self, m->name */
    TMPL_TV_LOOP,    /* the `loop` object of a for */
    TMPL_TV_CYCLER,  /* loop.cycle bound to a loop */
};

struct tmpl_tv_list;
struct tmpl_tv_dict;
struct tmpl_tv_macro;
struct tmpl_tv_method;
struct tmpl_tv_loop;

/* Provenance of a string's bytes (tmpl_taint.c): which came from data (the render context:
 * message contents, tools, caller kwargs) rather than from the template source. struct tmpl_tv's
 * `taint` is TMPL_TAINT_NONE (every byte is the template's), TMPL_TAINT_ALL, or
 * TMPL_TAINT_FIRST + i for the spans in trender.taints[i]. It lives in the padding after the
 * type tag, so values stay 24 bytes. Strings that builtins make from tainted inputs are tainted
 * as a whole unless the operation keeps exact spans (concatenation, output capture), so data
 * can only ever be over-reported. */
#define TMPL_TAINT_NONE 0u
#define TMPL_TAINT_ALL 1u
#define TMPL_TAINT_FIRST 2u
struct tmpl_taint {
    size_t n;               /* number of spans */
    struct cairn_span v[];  /* sorted, disjoint, not adjacent */
};

struct tmpl_tv {
    enum tmpl_tv_type t;
    uint32_t taint; /* TMPL_TV_STR: TMPL_TAINT_* (0 for every other type) */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct tmpl_tv_list *l;
        struct tmpl_tv_dict *d;
        struct tmpl_tv_macro *m;
        struct tmpl_tv_method *meth;
        struct tmpl_tv_loop *loop;
        int builtin;
    } u;
};

/* What Python object a list value stands for. jinja2's select/map/unique/batch/items/reverse
 * filters return generators: always truthy, no len(), no indexing, consumed by iteration
 * (pos = next unread item). dict.items()/keys()/values() return views (print as
 * dict_items([...]), not subscriptable); range() prints as range(a, b). */
enum tmpl_tv_list_kind { TMPL_TL_PLAIN = 0, TMPL_TL_ITEMS, TMPL_TL_KEYS, TMPL_TL_VALUES, TMPL_TL_RANGE, TMPL_TL_GEN };

struct tmpl_tv_list {
    size_t n;
    struct tmpl_tv *items;
    int is_tuple;    /* TMPL_TL_PLAIN only */
    int kind;        /* enum tmpl_tv_list_kind */
    size_t pos;      /* TMPL_TL_GEN: items[0, pos) are consumed */
    int64_t rng[3];  /* TMPL_TL_RANGE: start, stop, step (for printing) */
};

struct tmpl_tv_kv {
    struct tmpl_tv key;
    struct tmpl_tv val;
};

struct tmpl_tv_dict {
    size_t n, cap;
    struct tmpl_tv_kv *items;
    uint32_t *index;   /* open addressing: slot -> item index + 1 (0 = empty); NULL if small */
    size_t index_cap;  /* power of two */
};

struct tmpl_tv_method {
    struct tmpl_tv self;
    const char *name;
};

/* The `loop` object of one for statement. */
struct tmpl_tv_loop {
    struct tmpl_tv_list *items;
    size_t index0; /* current iteration */
};

/* ---- AST ---- */
enum tmpl_node_kind {
    /* expressions */
    TMPL_N_LIT,     /* lit */
    TMPL_N_NAME,    /* str */
    TMPL_N_GETATTR, /* a.str */
    TMPL_N_GETITEM, /* a[b] */
    TMPL_N_SLICE,   /* a[b:c:d] (each may be NULL) */
    TMPL_N_CALL,    /* a(args; kwnames) */
    TMPL_N_FILTER,  /* a|str(args) ; a NULL inside a filter block */
    TMPL_N_TEST,    /* a is [not] str(args) ; op = negated */
    TMPL_N_UNARY,   /* op a */
    TMPL_N_BINARY,  /* a op b */
    TMPL_N_AND,
    TMPL_N_OR,
    TMPL_N_COMPARE, /* a then (ops[i], args[i]) */
    TMPL_N_COND,    /* b if a else c (c may be NULL) */
    TMPL_N_LIST,
    TMPL_N_TUPLE,
    TMPL_N_DICT,    /* args = keys, args2 = values */
    /* statements */
    TMPL_N_BODY,    /* args = statements */
    TMPL_N_DATA,    /* str */
    TMPL_N_OUTPUT,  /* a */
    TMPL_N_IF,      /* a cond, b body, c else (TMPL_N_IF for elif, or TMPL_N_BODY) */
    TMPL_N_FOR,     /* args targets, a iter, b body, c else, d filter cond */
    TMPL_N_SET,     /* args targets (TMPL_N_NAME or TMPL_N_GETATTR ns.x), a value */
    TMPL_N_SETBLOCK,/* args targets, b body, a filter chain (TMPL_N_FILTER with NULL base) or NULL */
    TMPL_N_MACRO,   /* str name, args params (TMPL_N_NAME), args2 defaults (NULL = none), b body,
                  op = TMPL_USES_* bits: which special names the body mentions */
    TMPL_N_CALLBLOCK, /* a call expr, args params, args2 defaults, b body, op as TMPL_N_MACRO */
    TMPL_N_FILTERBLOCK, /* a filter chain, b body */
    TMPL_N_WITH,    /* args targets, args2 values, b body */
    TMPL_N_BREAK,
    TMPL_N_CONTINUE,
};

/* jinja2 macros accept caller= / extra kwargs / extra positionals only if their body mentions
 * caller / kwargs / varargs. */
#define TMPL_USES_CALLER 1
#define TMPL_USES_KWARGS 2
#define TMPL_USES_VARARGS 4

enum tmpl_node_op {
    TMPL_OP_NONE = 0,
    TMPL_OP_ADD, TMPL_OP_SUB, TMPL_OP_MUL, TMPL_OP_DIV, TMPL_OP_FLOORDIV, TMPL_OP_MOD, TMPL_OP_POW, TMPL_OP_CONCAT,
    TMPL_OP_NOT, TMPL_OP_NEG, TMPL_OP_POS,
    TMPL_OP_EQ, TMPL_OP_NE, TMPL_OP_LT, TMPL_OP_LE, TMPL_OP_GT, TMPL_OP_GE, TMPL_OP_IN, TMPL_OP_NOTIN,
};

struct tmpl_node {
    enum tmpl_node_kind kind;
    int line;
    int op;                /* enum tmpl_node_op, or negation flag for TMPL_N_TEST */
    const char *str;       /* names, data text (NUL-terminated, arena) */
    size_t str_n;
    struct tmpl_tv lit;         /* TMPL_N_LIT */
    struct tmpl_node *a, *b, *c, *d;
    struct tmpl_node **args;   /* positional args / items / statements */
    size_t n_args;
    struct tmpl_node **args2;  /* kwarg values / dict values / defaults */
    const char **kwnames;  /* TMPL_N_CALL/TMPL_N_FILTER/TMPL_N_TEST kwarg names (n_kw of them) */
    size_t n_kw;
    int *ops;              /* TMPL_N_COMPARE ops */
};

struct tmpl {
    struct tmpl_arena arena; /* AST + strings */
    struct tmpl_node *root;  /* TMPL_N_BODY */
};

/* ---- lexer ---- */
enum tmpl_token_type {
    TMPL_T_EOF = 0,
    TMPL_T_DATA,        /* text between tags */
    TMPL_T_VAR_BEGIN,
    TMPL_T_VAR_END,
    TMPL_T_BLOCK_BEGIN,
    TMPL_T_BLOCK_END,
    TMPL_T_NAME,
    TMPL_T_STRING,      /* already unescaped */
    TMPL_T_INT,
    TMPL_T_FLOAT,
    TMPL_T_OP,          /* str holds the operator text */
};

struct tmpl_token {
    enum tmpl_token_type type;
    int line;
    const char *str; /* NUL-terminated (arena) */
    size_t n;
    int64_t i;
    double f;
};

/* Tokenizes normalized source into an arena array. Returns CAIRN_OK or an error in err. */
int tmpl_lex(struct tmpl_arena *a, const char *src, size_t len, struct tmpl_token **out, size_t *n_out,
             struct cairn_err *err);
int tmpl_parse(struct tmpl_arena *a, const struct tmpl_token *toks, size_t n_toks, struct tmpl_node **root,
               struct cairn_err *err);

/* ---- string helpers (tmpl_str.c; UTF-8 itself is base/utf8.h) ---- */
int tmpl_py_isspace(uint32_t cp);
/* Python case properties and full case mapping of s[i] (tmpl_case.c); mode 'u', 'l' or 't'. */
int tmpl_case_is_upper(uint32_t cp);
int tmpl_case_is_lower(uint32_t cp);
int tmpl_case_is_title(uint32_t cp);
int tmpl_case_is_cased(uint32_t cp);
size_t tmpl_case_map(const uint32_t *s, size_t n, size_t i, char mode, uint32_t out[3]);

struct tmpl_args;

/* ---- render state ---- */
struct tmpl_buf {
    char *p;
    size_t n, cap;
    struct cairn_span *sp; /* data spans of p (arena), sorted and merged */
    size_t n_sp, cap_sp;
};

struct tscope;

struct tmpl_rstate {
    struct tmpl_arena arena;
    struct tmpl_limits lim;
    struct cairn_err *err;
    jmp_buf jmp;
    uint64_t steps;
    int depth;          /* native recursion depth (eval + exec) */
    int call_depth;     /* macro calls */
    struct tmpl_buf *out;   /* current output (captures swap it) */
    struct tmpl_buf main_out; /* malloc'd: the final output */
    struct tscope *globals; /* top scope: context variables */
    int loop_ctl;       /* 0, 1 = break, 2 = continue */
    struct tmpl_taint **taints; /* spans of partly tainted strings (TMPL_TAINT_FIRST + i) */
    uint32_t n_taints, cap_taints;
};

/* Python's unhashable types among ours: dict, list, dict views. */
static inline int tmpl_tv_unhashable(struct tmpl_tv v)
{
    return v.t == TMPL_TV_DICT || (v.t == TMPL_TV_LIST && !v.u.l->is_tuple && v.u.l->kind != TMPL_TL_RANGE &&
                              v.u.l->kind != TMPL_TL_GEN);
}

/* render core (tmpl_core.c): errors, accounting, arena allocation, output buffers */
void tmpl_fail(struct tmpl_rstate *r, int status, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* One evaluation step; fails with CAIRN_ERR_LIMIT past lim.max_steps. */
void tmpl_step(struct tmpl_rstate *r);
/* Charges work proportional to bytes touched (1 step per KiB), so big strings cost steps. */
void tmpl_step_bytes(struct tmpl_rstate *r, size_t n_bytes);
void *tmpl_alloc(struct tmpl_rstate *r, size_t n);
/* printf into the render arena (messages up to ~300 bytes). */
char *tmpl_printf(struct tmpl_rstate *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* buffers growing in the render arena (bounded by max_output_bytes) */
void tmpl_buf_put(struct tmpl_rstate *r, struct tmpl_buf *b, const char *p, size_t n);
void tmpl_buf_putc(struct tmpl_rstate *r, struct tmpl_buf *b, char c);
void tmpl_buf_puts(struct tmpl_rstate *r, struct tmpl_buf *b, const char *s);

/* values (tmpl_value.c) */
struct tmpl_tv tmpl_tv_none(void);
struct tmpl_tv tmpl_tv_bool(int b);
struct tmpl_tv tmpl_tv_int(int64_t i);
struct tmpl_tv tmpl_tv_float(double f);
struct tmpl_tv tmpl_tv_str(const char *p, size_t n);
struct tmpl_tv tmpl_tv_cstr(const char *p);
struct tmpl_tv tmpl_tv_undef(const char *hint);
struct tmpl_tv tmpl_tv_str_copy(struct tmpl_rstate *r, const char *p, size_t n);
struct tmpl_tv tmpl_tv_from_json(struct tmpl_rstate *r, json_t *j);
struct tmpl_tv_list *tmpl_tv_list_new(struct tmpl_rstate *r, size_t n);
struct tmpl_tv_dict *tmpl_tv_dict_new(struct tmpl_rstate *r, size_t cap);
void tmpl_tv_dict_set(struct tmpl_rstate *r, struct tmpl_tv_dict *d, struct tmpl_tv key, struct tmpl_tv val);
/* Returns 1 and *out if found. */
int tmpl_tv_dict_get(const struct tmpl_tv_dict *d, struct tmpl_tv key, struct tmpl_tv *out);
int tmpl_tv_dict_get_str(const struct tmpl_tv_dict *d, const char *key, struct tmpl_tv *out);
int tmpl_tv_truthy(struct tmpl_tv v);
int tmpl_tv_equal(struct tmpl_tv a, struct tmpl_tv b);
/* Python ordering; fails (TypeError) on incomparable types. Returns <0, 0, >0. */
int tmpl_tv_compare(struct tmpl_rstate *r, struct tmpl_tv a, struct tmpl_tv b);
const char *tmpl_tv_type_name(struct tmpl_tv v);
/* str() and repr() appended to a buffer in the arena. */
void tmpl_tv_str_append(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v);
void tmpl_tv_repr_append(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v);
struct tmpl_tv tmpl_tv_to_str(struct tmpl_rstate *r, struct tmpl_tv v);
/* json.dumps(v, ensure_ascii, indent (<0 = None), separators (NULL = default), sort_keys). */
void tmpl_tv_tojson_append(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v, int ensure_ascii,
                      int indent, const char *item_sep, const char *key_sep, int sort_keys,
                      int level);
void tmpl_tv_float_repr(double f, char *out, size_t n);

/* b's bytes (and taint) as a string value; b must not be written after */
struct tmpl_tv tmpl_buf_to_str(struct tmpl_rstate *r, struct tmpl_buf *b);

/* taint (tmpl_taint.c) */
/* Appends string s with its taint; tmpl_buf_put appends template bytes. */
void tmpl_buf_put_str(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv s);
/* Marks b->p[off, off + len) as data. */
void tmpl_buf_mark(struct tmpl_rstate *r, struct tmpl_buf *b, size_t off, size_t len);
/* The taint of b's bytes as one value (a new entry of r->taints when partial). */
uint32_t tmpl_buf_taint(struct tmpl_rstate *r, const struct tmpl_buf *b);
/* 1 if v holds a data byte anywhere (strings inside lists and dicts, keys included). */
int tmpl_tv_tainted(struct tmpl_tv v);
/* Result of an operation on inputs `in` (n_in values) and args a (may be NULL): when some input
 * is tainted, every string in res that is not one of the inputs' own becomes TMPL_TAINT_ALL. */
struct tmpl_tv tmpl_taint_result(struct tmpl_tv res, const struct tmpl_tv *in, size_t n_in, const struct tmpl_args *a);

/* iteration: materializes a list view of any iterable (str -> chars, dict -> keys). */
struct tmpl_tv_list *tmpl_tv_iter_list(struct tmpl_rstate *r, struct tmpl_tv v);

/* filters / tests / methods / builtins (tmpl_builtins.c) */
struct tmpl_args {
    struct tmpl_tv *pos;
    size_t n_pos;
    const char **kwnames;
    struct tmpl_tv *kw;
    size_t n_kw;
};
struct tmpl_tv tmpl_filter_apply(struct tmpl_rstate *r, const char *name, struct tmpl_tv v, struct tmpl_args *a,
                            int line);
int tmpl_test_apply(struct tmpl_rstate *r, const char *name, struct tmpl_tv v, struct tmpl_args *a, int line);
int tmpl_test_exists(const char *name);
int tmpl_filter_exists(const char *name);
struct tmpl_tv tmpl_getattr(struct tmpl_rstate *r, struct tmpl_tv obj, const char *name);
struct tmpl_tv tmpl_getitem(struct tmpl_rstate *r, struct tmpl_tv obj, struct tmpl_tv key);
struct tmpl_tv tmpl_method_call(struct tmpl_rstate *r, struct tmpl_tv_method *m, struct tmpl_args *a);
struct tmpl_tv tmpl_builtin_call(struct tmpl_rstate *r, int id, struct tmpl_args *a);
int tmpl_builtin_lookup(const char *name);
struct tmpl_tv tmpl_slice(struct tmpl_rstate *r, struct tmpl_tv obj, struct tmpl_tv start, struct tmpl_tv stop,
                     struct tmpl_tv step);
/* calls a macro (tmpl_eval.c) */
struct tmpl_tv tmpl_macro_call(struct tmpl_rstate *r, struct tmpl_tv_macro *m, struct tmpl_args *a);
/* generic call of any callable value */
struct tmpl_tv tmpl_call_value(struct tmpl_rstate *r, struct tmpl_tv f, struct tmpl_args *a);
/* arg binding helper: picks positional i or keyword name, else default; returns 1 if given. */
int tmpl_args_get(struct tmpl_args *a, size_t i, const char *name, struct tmpl_tv *out);
/* Python "fmt % arg": a tuple gives the arguments, a dict serves %(key)s, anything else is
 * the single argument (printf-style flags, width, precision; s r a d i u f F e E g G x X o c). */
struct tmpl_tv tmpl_str_percent(struct tmpl_rstate *r, struct tmpl_tv fmt, struct tmpl_tv arg);
/* loop.index, loop.first, ... (tmpl_value.c) */
struct tmpl_tv tmpl_loop_attr(struct tmpl_rstate *r, struct tmpl_tv_loop *l, const char *name);

#endif
