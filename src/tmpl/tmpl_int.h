/* tmpl internals: arena, values, AST, render state. Shared by the tmpl_*.c files only.
 *
 * DESIGN
 * - Compile: lexer (tmpl_lex.c) -> token array -> recursive-descent parser (tmpl_parse.c) ->
 *   AST of struct tnode, all allocated in the template's own arena (immutable afterwards).
 * - Render: tree-walking interpreter (tmpl_eval.c). Every value made while rendering lives in
 *   a per-render arena (struct tarena) with a byte limit, so there is no per-value freeing and
 *   errors unwind with longjmp (tmpl_fail) to tmpl_render, which frees the arena and output.
 *   Nothing between tmpl_render and a tmpl_fail call may own malloc'd memory.
 * - Values (struct tv) are small tagged unions passed by value. Strings are (pointer, length)
 *   views of valid UTF-8 (context strings point into the caller's json_t). Lists and dicts are
 *   immutable once built, except namespace() objects, which `set ns.x = ...` mutates.
 */
#ifndef CAIRN_TMPL_TMPL_INT_H
#define CAIRN_TMPL_TMPL_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tmpl/tmpl.h"

/* ---- arena ---- */
struct tarena_chunk;
struct tarena {
    struct tarena_chunk *head;
    size_t used_bytes;  /* total bytes handed out + chunk overheads */
    size_t limit_bytes; /* 0 = unlimited */
};
/* Returns NULL when out of memory or over the limit. Memory is zeroed, 16-byte aligned. */
void *tarena_alloc(struct tarena *a, size_t n);
void tarena_free_all(struct tarena *a);

/* ---- values ---- */
enum tv_type {
    TV_UNDEF = 0, /* s = hint for error messages ("'x' is undefined") */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,    /* list or tuple (l->is_tuple) */
    TV_DICT,
    TV_NS,      /* namespace(): a mutable dict */
    TV_MACRO,   /* a macro or caller() */
    TV_BUILTIN, /* global function: b = id */
    TV_METHOD,  /* bound method: m->self, m->name */
    TV_LOOP,    /* the `loop` object of a for */
    TV_CYCLER,  /* loop.cycle bound to a loop */
};

struct tv_list;
struct tv_dict;
struct tv_macro;
struct tv_method;
struct tv_loop;

struct tv {
    enum tv_type t;
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct tv_list *l;
        struct tv_dict *d;
        struct tv_macro *m;
        struct tv_method *meth;
        struct tv_loop *loop;
        int builtin;
    } u;
};

/* What Python object a list value stands for. jinja2's select/map/unique/batch/items/reverse
 * filters return generators: always truthy, no len(), no indexing, consumed by iteration
 * (pos = next unread item). dict.items()/keys()/values() return views (print as
 * dict_items([...]), not subscriptable); range() prints as range(a, b). */
enum tv_list_kind { TL_PLAIN = 0, TL_ITEMS, TL_KEYS, TL_VALUES, TL_RANGE, TL_GEN };

struct tv_list {
    size_t n;
    struct tv *items;
    int is_tuple;    /* TL_PLAIN only */
    int kind;        /* enum tv_list_kind */
    size_t pos;      /* TL_GEN: items[0, pos) are consumed */
    int64_t rng[3];  /* TL_RANGE: start, stop, step (for printing) */
};

struct tv_kv {
    struct tv key;
    struct tv val;
};

struct tv_dict {
    size_t n, cap;
    struct tv_kv *items;
    uint32_t *index;   /* open addressing: slot -> item index + 1 (0 = empty); NULL if small */
    size_t index_cap;  /* power of two */
};

struct tv_method {
    struct tv self;
    const char *name;
};

/* ---- AST ---- */
enum tnode_kind {
    /* expressions */
    N_LIT,     /* lit */
    N_NAME,    /* str */
    N_GETATTR, /* a.str */
    N_GETITEM, /* a[b] */
    N_SLICE,   /* a[b:c:d] (each may be NULL) */
    N_CALL,    /* a(args; kwnames) */
    N_FILTER,  /* a|str(args) ; a NULL inside a filter block */
    N_TEST,    /* a is [not] str(args) ; op = negated */
    N_UNARY,   /* op a */
    N_BINARY,  /* a op b */
    N_AND,
    N_OR,
    N_COMPARE, /* a then (ops[i], args[i]) */
    N_COND,    /* b if a else c (c may be NULL) */
    N_LIST,
    N_TUPLE,
    N_DICT,    /* args = keys, args2 = values */
    /* statements */
    N_BODY,    /* args = statements */
    N_DATA,    /* str */
    N_OUTPUT,  /* a */
    N_IF,      /* a cond, b body, c else (N_IF for elif, or N_BODY) */
    N_FOR,     /* args targets, a iter, b body, c else, d filter cond */
    N_SET,     /* args targets (N_NAME or N_GETATTR ns.x), a value */
    N_SETBLOCK,/* args targets, b body, a filter chain (N_FILTER with NULL base) or NULL */
    N_MACRO,   /* str name, args params (N_NAME), args2 defaults (NULL = none), b body,
                  op = TMPL_USES_* bits: which special names the body mentions */
    N_CALLBLOCK, /* a call expr, args params, args2 defaults, b body, op as N_MACRO */
    N_FILTERBLOCK, /* a filter chain, b body */
    N_WITH,    /* args targets, args2 values, b body */
    N_BREAK,
    N_CONTINUE,
};

/* jinja2 macros accept caller= / extra kwargs / extra positionals only if their body mentions
 * caller / kwargs / varargs. */
#define TMPL_USES_CALLER 1
#define TMPL_USES_KWARGS 2
#define TMPL_USES_VARARGS 4

enum tnode_op {
    OP_NONE = 0,
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_NOT, OP_NEG, OP_POS,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
};

struct tnode {
    enum tnode_kind kind;
    int line;
    int op;                /* enum tnode_op, or negation flag for N_TEST */
    const char *str;       /* names, data text (NUL-terminated, arena) */
    size_t str_n;
    struct tv lit;         /* N_LIT */
    struct tnode *a, *b, *c, *d;
    struct tnode **args;   /* positional args / items / statements */
    size_t n_args;
    struct tnode **args2;  /* kwarg values / dict values / defaults */
    const char **kwnames;  /* N_CALL/N_FILTER/N_TEST kwarg names (n_kw of them) */
    size_t n_kw;
    int *ops;              /* N_COMPARE ops */
};

struct tmpl {
    struct tarena arena; /* AST + strings */
    struct tnode *root;  /* N_BODY */
};

/* ---- lexer ---- */
enum ttok_type {
    T_EOF = 0,
    T_DATA,        /* text between tags */
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,      /* already unescaped */
    T_INT,
    T_FLOAT,
    T_OP,          /* str holds the operator text */
};

struct ttok {
    enum ttok_type type;
    int line;
    const char *str; /* NUL-terminated (arena) */
    size_t n;
    int64_t i;
    double f;
};

/* Tokenizes normalized source into an arena array. Returns CAIRN_OK or an error in err. */
int tmpl_lex(struct tarena *a, const char *src, size_t len, struct ttok **out, size_t *n_out,
             struct cairn_err *err);
int tmpl_parse(struct tarena *a, const struct ttok *toks, size_t n_toks, struct tnode **root,
               struct cairn_err *err);

/* ---- UTF-8 helpers (tmpl_str.c) ---- */
/* Decodes one code point at s[*i] (valid UTF-8 assumed) and advances *i. */
uint32_t tutf8_next(const char *s, size_t n, size_t *i);
size_t tutf8_put(uint32_t cp, char *out); /* writes 1-4 bytes */
size_t tutf8_len(const char *s, size_t n); /* code points */
int tutf8_valid(const char *s, size_t n);
int tpy_isspace(uint32_t cp);
/* Python case properties and full case mapping of s[i] (tmpl_case.c); mode 'u', 'l' or 't'. */
int tcase_is_upper(uint32_t cp);
int tcase_is_lower(uint32_t cp);
int tcase_is_title(uint32_t cp);
int tcase_is_cased(uint32_t cp);
size_t tcase_map(const uint32_t *s, size_t n, size_t i, char mode, uint32_t out[3]);

/* ---- render state ---- */
struct tbuf {
    char *p;
    size_t n, cap;
};

struct tscope;

struct trender {
    struct tarena arena;
    struct tmpl_limits lim;
    struct cairn_err *err;
    jmp_buf jmp;
    uint64_t steps;
    int depth;          /* native recursion depth (eval + exec) */
    int call_depth;     /* macro calls */
    struct tbuf *out;   /* current output (captures swap it) */
    struct tbuf main_out; /* malloc'd: the final output */
    struct tscope *globals; /* top scope: context variables */
    int loop_ctl;       /* 0, 1 = break, 2 = continue */
};

/* Python's unhashable types among ours: dict, list, dict views. */
static inline int tv_unhashable(struct tv v)
{
    return v.t == TV_DICT || (v.t == TV_LIST && !v.u.l->is_tuple && v.u.l->kind != TL_RANGE &&
                              v.u.l->kind != TL_GEN);
}

void tmpl_fail(struct trender *r, int status, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void *tr_alloc(struct trender *r, size_t n);
/* printf into the render arena (messages up to ~300 bytes). */
char *tr_printf(struct trender *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* values (tmpl_value.c) */
struct tv tv_none(void);
struct tv tv_bool(int b);
struct tv tv_int(int64_t i);
struct tv tv_float(double f);
struct tv tv_str(const char *p, size_t n);
struct tv tv_cstr(const char *p);
struct tv tv_undef(const char *hint);
struct tv tv_str_copy(struct trender *r, const char *p, size_t n);
struct tv tv_from_json(struct trender *r, json_t *j);
struct tv_list *tv_list_new(struct trender *r, size_t n);
struct tv_dict *tv_dict_new(struct trender *r, size_t cap);
void tv_dict_set(struct trender *r, struct tv_dict *d, struct tv key, struct tv val);
/* Returns 1 and *out if found. */
int tv_dict_get(const struct tv_dict *d, struct tv key, struct tv *out);
int tv_dict_get_str(const struct tv_dict *d, const char *key, struct tv *out);
int tv_truthy(struct tv v);
int tv_equal(struct tv a, struct tv b);
/* Python ordering; fails (TypeError) on incomparable types. Returns <0, 0, >0. */
int tv_compare(struct trender *r, struct tv a, struct tv b);
const char *tv_type_name(struct tv v);
/* str() and repr() appended to a buffer in the arena. */
void tv_str_append(struct trender *r, struct tbuf *b, struct tv v);
void tv_repr_append(struct trender *r, struct tbuf *b, struct tv v);
struct tv tv_to_str(struct trender *r, struct tv v);
/* json.dumps(v, ensure_ascii, indent (<0 = None), separators (NULL = default), sort_keys). */
void tv_tojson_append(struct trender *r, struct tbuf *b, struct tv v, int ensure_ascii,
                      int indent, const char *item_sep, const char *key_sep, int sort_keys,
                      int level);
void tv_float_repr(double f, char *out, size_t n);

/* buffers growing in the render arena (bounded by max_output_bytes) */
void tbuf_put(struct trender *r, struct tbuf *b, const char *p, size_t n);
void tbuf_putc(struct trender *r, struct tbuf *b, char c);
void tbuf_puts(struct trender *r, struct tbuf *b, const char *s);
struct tv tbuf_to_str(struct trender *r, struct tbuf *b);

/* iteration: materializes a list view of any iterable (str -> chars, dict -> keys). */
struct tv_list *tv_iter_list(struct trender *r, struct tv v);

/* filters / tests / methods / builtins (tmpl_builtins.c) */
struct targs {
    struct tv *pos;
    size_t n_pos;
    const char **kwnames;
    struct tv *kw;
    size_t n_kw;
};
struct tv tmpl_filter_apply(struct trender *r, const char *name, struct tv v, struct targs *a,
                            int line);
int tmpl_test_apply(struct trender *r, const char *name, struct tv v, struct targs *a, int line);
int tmpl_test_exists(const char *name);
int tmpl_filter_exists(const char *name);
struct tv tmpl_getattr(struct trender *r, struct tv obj, const char *name);
struct tv tmpl_getitem(struct trender *r, struct tv obj, struct tv key);
struct tv tmpl_method_call(struct trender *r, struct tv_method *m, struct targs *a);
struct tv tmpl_builtin_call(struct trender *r, int id, struct targs *a);
int tmpl_builtin_lookup(const char *name);
struct tv tmpl_slice(struct trender *r, struct tv obj, struct tv start, struct tv stop,
                     struct tv step);
/* calls a macro (tmpl_eval.c) */
struct tv tmpl_macro_call(struct trender *r, struct tv_macro *m, struct targs *a);
/* generic call of any callable value */
struct tv tmpl_call_value(struct trender *r, struct tv f, struct targs *a);
/* arg binding helper: picks positional i or keyword name, else default; returns 1 if given. */
int targs_get(struct targs *a, size_t i, const char *name, struct tv *out);
void tmpl_step(struct trender *r);
/* Python "fmt % arg": a tuple gives the arguments, a dict serves %(key)s, anything else is
 * the single argument (printf-style flags, width, precision; s r a d i u f F e E g G x X o c). */
struct tv tmpl_str_percent(struct trender *r, struct tv fmt, struct tv arg);
/* Charges work proportional to bytes touched (1 step per KiB), so big strings cost steps. */
void tmpl_step_bytes(struct trender *r, size_t n_bytes);
struct tv tmpl_loop_attr(struct trender *r, struct tv_loop *l, const char *name);

#endif
