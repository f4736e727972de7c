/* tmpl lexer: template source -> tokens, following jinja2's lexer with trim_blocks=True and
 * lstrip_blocks=True (as transformers configures it): `{%- -%} {{- -}} {#- -#}` strip all
 * whitespace on that side, `{%+` / `+%}` turn lstrip / trim off, a block or comment end eats
 * one following newline, and a block or comment tag alone on its line after spaces and tabs
 * loses them. Comments vanish; {% raw %}...{% endraw %} becomes data. Source must already have
 * its newlines normalized (tmpl_compile does that). */
#include <stdlib.h>
#include <string.h>

#include "tmpl/tmpl_int.h"

struct tlex {
    struct tmpl_arena *a;
    const char *s;
    size_t n, pos;
    int line;
    struct tmpl_token *toks;
    size_t n_toks, cap;
    struct cairn_err *err;
};

static int tmpl_lex_push(struct tlex *L, enum tmpl_token_type type, const char *p, size_t n)
{
    if (L->n_toks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        struct tmpl_token *t = tmpl_arena_alloc(L->a, cap * sizeof(*t));
        if (!t) return cairn_err_set(L->err, CAIRN_ERR_NOMEM, "template too large");
        if (L->n_toks) memcpy(t, L->toks, L->n_toks * sizeof(*t));
        L->toks = t;
        L->cap = cap;
    }
    struct tmpl_token *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->line = L->line;
    if (p) {
        char *c = tmpl_arena_alloc(L->a, n + 1);
        if (!c) return cairn_err_set(L->err, CAIRN_ERR_NOMEM, "template too large");
        memcpy(c, p, n);
        t->str = c;
        t->n = n;
    }
    return CAIRN_OK;
}

static void tmpl_lex_count_lines(struct tlex *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (L->s[i] == '\n') L->line++;
}

/* Length of the Python whitespace character at i (0 if none). */
static size_t tmpl_lex_space_at(const char *s, size_t n, size_t i)
{
    if (i >= n) return 0;
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) return tmpl_py_isspace(c) ? 1 : 0;
    size_t k = i;
    uint32_t cp = cairn_utf8_next(s, n, &k);
    return tmpl_py_isspace(cp) ? k - i : 0;
}

static size_t tmpl_lex_skip_space(const char *s, size_t n, size_t i)
{
    size_t k;
    while ((k = tmpl_lex_space_at(s, n, i)) > 0) i += k;
    return i;
}

/* Python str.rstrip() end of s[from, to). */
static size_t tmpl_lex_rstrip(const char *s, size_t from, size_t to)
{
    while (to > from) {
        size_t start = to - 1;
        while (start > from && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
        if (tmpl_lex_space_at(s, to, start) != to - start) break;
        to = start;
    }
    return to;
}

/* Applies jinja2's OptionalLStrip to text s[from, to) before a tag with the given sign
 * ('-', '+' or 0). Returns the new end of the text. */
static size_t tmpl_lex_strip_before(struct tlex *L, size_t from, size_t to, char sign,
                                    int is_var, int line_starting)
{
    if (sign == '-') return tmpl_lex_rstrip(L->s, from, to);
    if (sign == '+' || is_var) return to;
    size_t l_pos = from;
    int has_nl = 0;
    for (size_t i = to; i > from; i--)
        if (L->s[i - 1] == '\n') {
            l_pos = i;
            has_nl = 1;
            break;
        }
    if (!has_nl && !line_starting) return to;
    if (l_pos == to) return to; /* \s+ needs one char */
    if (tmpl_lex_skip_space(L->s, to, l_pos) == to) return l_pos;
    return to;
}

static int tmpl_lex_is_name_start(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

static int tmpl_lex_is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int tmpl_lex_hex(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Unescapes a Python string literal body (unicode-escape semantics) into the arena. */
static int tmpl_lex_string(struct tlex *L, const char *p, size_t n)
{
    char *out = tmpl_arena_alloc(L->a, n + 1);
    if (!out) return cairn_err_set(L->err, CAIRN_ERR_NOMEM, "template too large");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] != '\\' || i + 1 >= n) {
            out[o++] = p[i++];
            continue;
        }
        char e = p[i + 1];
        i += 2;
        switch (e) {
        case '\n': break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'v': out[o++] = '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = i + k < n ? tmpl_lex_hex((unsigned char)p[i + k]) : -1;
                if (h < 0)
                    return cairn_err_set(L->err, CAIRN_ERR_FORMAT,
                                         "line %d: truncated \\%cXX escape in string", L->line, e);
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)nd;
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return cairn_err_set(L->err, CAIRN_ERR_FORMAT,
                                     "line %d: illegal Unicode character in string", L->line);
            o += cairn_utf8_put(cp, out + o); /* escapes are never longer than their text */
            break;
        }
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            uint32_t cp = (uint32_t)(e - '0');
            for (int k = 0; k < 2 && i < n && p[i] >= '0' && p[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(p[i++] - '0');
            o += cairn_utf8_put(cp, out + o);
            break;
        }
        case 'N':
            return cairn_err_set(L->err, CAIRN_ERR_UNSUPPORTED,
                                 "line %d: \\N{...} escapes are not supported", L->line);
        default:
            out[o++] = '\\';
            i--; /* keep the character (may be a multi-byte lead) */
            break;
        }
    }
    int rc = tmpl_lex_push(L, TMPL_T_STRING, NULL, 0);
    if (rc) return rc;
    out[o] = 0;
    L->toks[L->n_toks - 1].str = out;
    L->toks[L->n_toks - 1].n = o;
    return CAIRN_OK;
}

static const char *const tmpl_lex_ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};

/* Tokenizes inside {{ }} or {% %} until the end tag. */
static int tmpl_lex_tag(struct tlex *L, int is_block, int *line_starting)
{
    char stack[TMPL_MAX_PARSE_DEPTH];
    int depth = 0;
    const char *s = L->s;
    size_t n = L->n;
    for (;;) {
        size_t p = L->pos;
        if (p >= n)
            return cairn_err_set(L->err, CAIRN_ERR_FORMAT, "line %d: unexpected end of template, "
                                 "expected end of %s tag", L->line, is_block ? "block" : "print");
        if (depth == 0) {
            size_t end = 0;
            if (is_block) {
                if (p + 3 <= n && !memcmp(s + p, "+%}", 3)) end = p + 3;
                else if (p + 3 <= n && !memcmp(s + p, "-%}", 3)) end = tmpl_lex_skip_space(s, n, p + 3);
                else if (p + 2 <= n && !memcmp(s + p, "%}", 2)) end = p + 2 + (p + 2 < n && s[p + 2] == '\n');
            } else {
                if (p + 3 <= n && !memcmp(s + p, "-}}", 3)) end = tmpl_lex_skip_space(s, n, p + 3);
                else if (p + 2 <= n && !memcmp(s + p, "}}", 2)) end = p + 2;
            }
            if (end) {
                int rc = tmpl_lex_push(L, is_block ? TMPL_T_BLOCK_END : TMPL_T_VAR_END, NULL, 0);
                if (rc) return rc;
                tmpl_lex_count_lines(L, p, end);
                *line_starting = s[end - 1] == '\n';
                L->pos = end;
                return CAIRN_OK;
            }
        }
        unsigned char c = (unsigned char)s[p];
        size_t sp = tmpl_lex_space_at(s, n, p);
        if (sp) {
            if (c == '\n') L->line++;
            L->pos = p + sp;
            continue;
        }
        if (tmpl_lex_is_digit(c)) {
            /* float: digits [. digits] [e [+-] digits] with a fraction or an exponent */
            size_t q = p;
            char num[128];
            size_t k = 0;
            int is_float = 0;
#define DIGITS()                                                                                   \
    while (q < n && (tmpl_lex_is_digit((unsigned char)s[q]) ||                                     \
                     (s[q] == '_' && q + 1 < n && tmpl_lex_is_digit((unsigned char)s[q + 1])))) { \
        if (s[q] != '_' && k < sizeof(num) - 1) num[k++] = s[q];                                   \
        q++;                                                                                       \
    }
            int radix = 10;
            if (c == '0' && q + 2 < n && (s[q + 1] == 'x' || s[q + 1] == 'X' || s[q + 1] == 'o' ||
                                          s[q + 1] == 'O' || s[q + 1] == 'b' || s[q + 1] == 'B')) {
                radix = (s[q + 1] | 0x20) == 'x' ? 16 : (s[q + 1] | 0x20) == 'o' ? 8 : 2;
                q += 2;
                while (q < n && (tmpl_lex_hex((unsigned char)s[q]) >= 0 || s[q] == '_')) {
                    if (s[q] != '_' && k < sizeof(num) - 1) num[k++] = s[q];
                    q++;
                }
            } else {
                DIGITS();
                if (!(p > 0 && s[p - 1] == '.')) {
                    if (q + 1 < n && s[q] == '.' && tmpl_lex_is_digit((unsigned char)s[q + 1])) {
                        if (k < sizeof(num) - 1) num[k++] = '.';
                        q++;
                        DIGITS();
                        is_float = 1;
                    }
                    if (q < n && (s[q] == 'e' || s[q] == 'E')) {
                        size_t r = q + 1;
                        if (r < n && (s[r] == '+' || s[r] == '-')) r++;
                        if (r < n && tmpl_lex_is_digit((unsigned char)s[r])) {
                            if (k < sizeof(num) - 3) {
                                num[k++] = 'e';
                                if (s[q + 1] == '-' || s[q + 1] == '+') num[k++] = s[q + 1];
                            }
                            q = r;
                            DIGITS();
                            is_float = 1;
                        }
                    }
                }
            }
#undef DIGITS
            num[k] = 0;
            int rc = tmpl_lex_push(L, is_float ? TMPL_T_FLOAT : TMPL_T_INT, s + p, q - p);
            if (rc) return rc;
            struct tmpl_token *t = &L->toks[L->n_toks - 1];
            if (is_float) {
                t->f = strtod(num, NULL);
            } else {
                unsigned long long v = 0;
                for (size_t i = 0; i < k; i++) {
                    int d = tmpl_lex_hex((unsigned char)num[i]);
                    if (d < 0 || d >= radix)
                        return cairn_err_set(L->err, CAIRN_ERR_FORMAT, "line %d: bad number",
                                             L->line);
                    if (v > (unsigned long long)(INT64_MAX - d) / (unsigned)radix)
                        return cairn_err_set(L->err, CAIRN_ERR_UNSUPPORTED,
                                             "line %d: integer literal too large", L->line);
                    v = v * (unsigned)radix + (unsigned)d;
                }
                t->i = (int64_t)v;
            }
            L->pos = q;
            continue;
        }
        if (tmpl_lex_is_name_start(c)) {
            size_t q = p;
            while (q < n && (tmpl_lex_is_name_start((unsigned char)s[q]) ||
                             tmpl_lex_is_digit((unsigned char)s[q])))
                q++;
            int rc = tmpl_lex_push(L, TMPL_T_NAME, s + p, q - p);
            if (rc) return rc;
            L->pos = q;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < n && s[q] != (char)c) q += (s[q] == '\\' && q + 1 < n) ? 2 : 1;
            if (q >= n)
                return cairn_err_set(L->err, CAIRN_ERR_FORMAT, "line %d: unterminated string",
                                     L->line);
            int rc = tmpl_lex_string(L, s + p + 1, q - p - 1);
            if (rc) return rc;
            tmpl_lex_count_lines(L, p, q);
            L->pos = q + 1;
            continue;
        }
        const char *op = NULL;
        for (size_t i = 0; i < CAIRN_ARRAY_LEN(tmpl_lex_ops); i++) {
            size_t ol = strlen(tmpl_lex_ops[i]);
            if (p + ol <= n && !memcmp(s + p, tmpl_lex_ops[i], ol)) {
                op = tmpl_lex_ops[i];
                break;
            }
        }
        if (!op)
            return cairn_err_set(L->err, CAIRN_ERR_FORMAT, "line %d: unexpected char '%c'",
                                 L->line, c);
        if (op[1] == 0 && (c == '(' || c == '[' || c == '{')) {
            if (depth >= (int)sizeof(stack))
                return cairn_err_set(L->err, CAIRN_ERR_LIMIT, "line %d: brackets nested too deeply (limit %d)",
                                     L->line, TMPL_MAX_PARSE_DEPTH);
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (op[1] == 0 && (c == ')' || c == ']' || c == '}')) {
            if (depth == 0)
                return cairn_err_set(L->err, CAIRN_ERR_FORMAT, "line %d: unexpected '%c'", L->line, c);
            if (stack[--depth] != (char)c)
                return cairn_err_set(L->err, CAIRN_ERR_FORMAT, "line %d: unexpected '%c', expected '%c'",
                                     L->line, c, stack[depth]);
        }
        int rc = tmpl_lex_push(L, TMPL_T_OP, op, strlen(op));
        if (rc) return rc;
        L->pos = p + strlen(op);
    }
}

/* Matches `{%[-+]?\s*WORD\s*` at p; returns the position after it or 0. */
static size_t tmpl_lex_match_word_tag(const char *s, size_t n, size_t p, const char *word,
                                      char *sign)
{
    if (p + 2 > n || s[p] != '{' || s[p + 1] != '%') return 0;
    size_t q = p + 2;
    *sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *sign = s[q++];
    q = tmpl_lex_skip_space(s, n, q);
    size_t wl = strlen(word);
    if (q + wl > n || memcmp(s + q, word, wl)) return 0;
    q += wl;
    return tmpl_lex_skip_space(s, n, q);
}

int tmpl_lex(struct tmpl_arena *a, const char *src, size_t len, struct tmpl_token **out, size_t *n_out,
             struct cairn_err *err)
{
    struct tlex L = {.a = a, .s = src, .n = len, .line = 1, .err = err};
    int line_starting = 1;
    int rc;
    while (L.pos < len) {
        /* find the next tag opener */
        size_t t = L.pos;
        const char *hit = NULL;
        while ((hit = memchr(src + t, '{', len - t)) != NULL) {
            t = (size_t)(hit - src);
            if (t + 1 < len && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#')) break;
            t++;
            hit = NULL;
            if (t >= len) break;
        }
        if (!hit) {
            rc = tmpl_lex_push(&L, TMPL_T_DATA, src + L.pos, len - L.pos);
            if (rc) return rc;
            break;
        }
        char kind = src[t + 1];
        char sign = (t + 2 < len && (src[t + 2] == '-' || src[t + 2] == '+')) ? src[t + 2] : 0;
        /* raw block? */
        size_t raw_end = 0;
        if (kind == '%') {
            char rs;
            size_t q = tmpl_lex_match_word_tag(src, len, t, "raw", &rs);
            if (q) {
                if (q + 3 <= len && !memcmp(src + q, "-%}", 3)) raw_end = tmpl_lex_skip_space(src, len, q + 3);
                else if (q + 2 <= len && !memcmp(src + q, "%}", 2)) raw_end = q + 2;
            }
        }
        size_t text_end = tmpl_lex_strip_before(&L, L.pos, t, sign, kind == '{', line_starting);
        if (text_end > L.pos) {
            rc = tmpl_lex_push(&L, TMPL_T_DATA, src + L.pos, text_end - L.pos);
            if (rc) return rc;
        }
        tmpl_lex_count_lines(&L, L.pos, t);
        if (raw_end) {
            tmpl_lex_count_lines(&L, t, raw_end);
            /* find {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?) */
            size_t q = raw_end, body_end = 0, after = 0;
            char es = 0;
            for (; q < len; q++) {
                if (src[q] != '{' || q + 1 >= len || src[q + 1] != '%') continue;
                size_t w = tmpl_lex_match_word_tag(src, len, q, "endraw", &es);
                if (!w) continue;
                if (w + 3 <= len && !memcmp(src + w, "+%}", 3)) after = w + 3;
                else if (w + 3 <= len && !memcmp(src + w, "-%}", 3)) after = tmpl_lex_skip_space(src, len, w + 3);
                else if (w + 2 <= len && !memcmp(src + w, "%}", 2)) after = w + 2 + (w + 2 < len && src[w + 2] == '\n');
                else continue;
                body_end = q;
                break;
            }
            if (!after)
                return cairn_err_set(err, CAIRN_ERR_FORMAT, "line %d: missing end of raw directive",
                                     L.line);
            int ls = src[raw_end - 1] == '\n';
            size_t be = tmpl_lex_strip_before(&L, raw_end, body_end, es, 0, ls);
            if (be > raw_end) {
                rc = tmpl_lex_push(&L, TMPL_T_DATA, src + raw_end, be - raw_end);
                if (rc) return rc;
            }
            tmpl_lex_count_lines(&L, raw_end, after);
            line_starting = src[after - 1] == '\n';
            L.pos = after;
            continue;
        }
        size_t body = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t q = body, after = 0;
            for (; q + 1 < len; q++) {
                if (src[q] == '#' && src[q + 1] == '}') break;
            }
            if (q + 1 >= len)
                return cairn_err_set(err, CAIRN_ERR_FORMAT, "line %d: missing end of comment tag",
                                     L.line);
            /* (.*?) is lazy: a '-' or '+' right before #} belongs to the end tag */
            if (q > body && src[q - 1] == '-') after = tmpl_lex_skip_space(src, len, q + 2);
            else if (q > body && src[q - 1] == '+') after = q + 2;
            else after = q + 2 + (q + 2 < len && src[q + 2] == '\n');
            tmpl_lex_count_lines(&L, t, after);
            line_starting = src[after - 1] == '\n';
            L.pos = after;
            continue;
        }
        rc = tmpl_lex_push(&L, kind == '%' ? TMPL_T_BLOCK_BEGIN : TMPL_T_VAR_BEGIN, NULL, 0);
        if (rc) return rc;
        L.pos = body;
        rc = tmpl_lex_tag(&L, kind == '%', &line_starting);
        if (rc) return rc;
    }
    rc = tmpl_lex_push(&L, TMPL_T_EOF, NULL, 0);
    if (rc) return rc;
    *out = L.toks;
    *n_out = L.n_toks;
    return CAIRN_OK;
}
