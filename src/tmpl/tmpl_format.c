/* tmpl Python formatting: str.format with the format-spec mini-language, and printf-style %. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/tmpl_builtins_int.h"

/* ---- Python formatting: format-spec mini-language (str.format) and printf-style (%) ---- */

struct tmpl_bi_spec {
    uint32_t fill;
    char align;   /* 0, '<', '>', '^', '=' */
    char sign;    /* 0, '+', '-', ' ' */
    int alt;      /* '#' */
    int zero;     /* '0' before width */
    int64_t width;
    char group;   /* 0, ',', '_' */
    int64_t prec; /* -1 = none */
    char type;    /* 0 or the type letter */
};

static void tmpl_bi_group(char *digits, size_t cap, char sep)
{
    /* inserts sep every 3 digits of the integer part (digits: [0-9]+ [. ...]) */
    char tmp[512];
    size_t n = strcspn(digits, ".eE%"), len = strlen(digits), o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0 && o < sizeof(tmp) - 1) tmp[o++] = sep;
        if (o < sizeof(tmp) - 1) tmp[o++] = digits[i];
    }
    for (size_t i = n; i < len && o < sizeof(tmp) - 1; i++) tmp[o++] = digits[i];
    tmp[o] = 0;
    snprintf(digits, cap, "%s", tmp);
}

/* Formats one value (Python format(v, spec) for str / int / float; pct = printf-style rules). */
static void tmpl_bi_format_value(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv v, struct tmpl_bi_spec *sp, int pct)
{
    char body[512] = "", prefix[4] = "";
    const char *text = body;
    size_t text_n;
    int neg = 0, numeric = 0;
    char type = sp->type;
    int is_int = v.t == TMPL_TV_INT || v.t == TMPL_TV_BOOL, is_float = v.t == TMPL_TV_FLOAT;
    if (sp->prec > 200) tmpl_fail(r, CAIRN_ERR_LIMIT, "format precision too large");
    if (sp->width > (int64_t)r->lim.max_output_bytes) tmpl_fail(r, CAIRN_ERR_LIMIT, "format width too large");
    if (!pct && v.t != TMPL_TV_STR && !is_int && !is_float)
        tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported format string passed to %s.__format__", tmpl_tv_type_name(v));
    if (!pct && type == 's' && (is_int || is_float))
        tmpl_fail(r, CAIRN_ERR_INVALID, "Unknown format code 's' for object of type '%s'", tmpl_tv_type_name(v));
    if (type == 's' || type == 'r' || (type == 0 && !is_int && !is_float)) {
        if (!pct && (sp->sign || sp->group || sp->align == '='))
            tmpl_fail(r, CAIRN_ERR_INVALID, "invalid format specifier for a string");
        if (!pct && sp->zero && !sp->align) {
            sp->fill = sp->fill ? sp->fill : '0';
            sp->align = '<';
        }
        struct tmpl_tv sv;
        if (type == 'r') {
            struct tmpl_buf rb = {0};
            tmpl_tv_repr_append(r, &rb, v);
            sv = tmpl_buf_to_str(r, &rb);
        } else {
            sv = tmpl_tv_to_str(r, v);
        }
        if (sp->prec >= 0) sv = tmpl_slice(r, sv, tmpl_tv_none(), tmpl_tv_int(sp->prec), tmpl_tv_none());
        text = sv.u.s.p;
        text_n = sv.u.s.n;
    } else if (is_int && (type == 0 || strchr("dinxXobc", type))) {
        if (!pct && sp->prec >= 0) tmpl_fail(r, CAIRN_ERR_INVALID, "Precision not allowed in integer format specifier");
        int64_t x = v.t == TMPL_TV_INT ? v.u.i : v.u.b;
        uint64_t mag = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        neg = x < 0;
        numeric = 1;
        if (type == 'c') {
            if (x < 0 || x > 0x10FFFF || (x >= 0xD800 && x <= 0xDFFF)) tmpl_fail(r, CAIRN_ERR_INVALID, "%%c arg not in range");
            text_n = cairn_utf8_put((uint32_t)x, body);
            body[text_n] = 0;
            neg = 0;
            numeric = 0;
        } else if (type == 'x' || type == 'X' || type == 'o' || type == 'b') {
            int base = type == 'o' ? 8 : type == 'b' ? 2 : 16;
            char tmp[80];
            size_t k = 0;
            do {
                unsigned d = (unsigned)(mag % (unsigned)base);
                tmp[k++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
                mag /= (unsigned)base;
            } while (mag);
            for (size_t i = 0; i < k; i++) body[i] = tmp[k - 1 - i];
            body[k] = 0;
            if (sp->alt) snprintf(prefix, sizeof(prefix), "0%c", type == 'o' ? 'o' : type == 'b' ? 'b' : type);
        } else {
            snprintf(body, sizeof(body), "%llu", (unsigned long long)mag);
            if (pct && sp->prec > 0) { /* %.3d zero-pads the digits */
                size_t len = strlen(body);
                if ((int64_t)len < sp->prec) { /* prec <= 200, len <= 20: fits */
                    size_t z = (size_t)sp->prec - len;
                    memmove(body + z, body, len + 1);
                    memset(body, '0', z);
                }
            }
            if (sp->group) tmpl_bi_group(body, sizeof(body), sp->group);
        }
        if (type != 'c') text_n = strlen(body);
    } else if ((is_int || is_float) && (type == 0 || strchr("eEfFgG%n", type))) {
        double x = is_float ? v.u.f : (double)(v.t == TMPL_TV_INT ? v.u.i : v.u.b);
        numeric = 1;
        neg = signbit(x) != 0 && !isnan(x);
        double ax = fabs(x);
        int p = sp->prec >= 0 ? (int)sp->prec : 6;
        if (type == 0 && sp->prec < 0) {
            tmpl_tv_float_repr(ax, body, sizeof(body));
        } else if (type == 0 || type == 'g' || type == 'G' || type == 'n') {
            snprintf(body, sizeof(body), type == 'G' ? "%.*G" : "%.*g", p ? p : 1, ax);
        } else if (type == '%') {
            snprintf(body, sizeof(body), "%.*f%%", p, ax * 100);
        } else {
            char f[16] = {'%', '.', '*', type, 0};
            snprintf(body, sizeof(body), f, p, ax);
        }
        if (isinf(x) || isnan(x)) snprintf(body, sizeof(body), "%s", isnan(x) ? (type == 'F' || type == 'E' || type == 'G' ? "NAN" : "nan") : (type == 'F' || type == 'E' || type == 'G' ? "INF" : "inf"));
        if (sp->alt && !strchr(body, '.') && !strchr(body, 'e') && isfinite(x)) strncat(body, ".", sizeof(body) - strlen(body) - 1);
        if (sp->group) tmpl_bi_group(body, sizeof(body), sp->group);
        text_n = strlen(body);
    } else {
        tmpl_fail(r, CAIRN_ERR_INVALID, "Unknown format code '%c' for object of type '%s'", type ? type : '?', tmpl_tv_type_name(v));
    }
    if (numeric && sp->group && sp->zero && !sp->align)
        tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "zero padding with a thousands separator is not supported");
    char signc = 0;
    if (numeric) {
        if (neg) signc = '-';
        else if (sp->sign == '+' || sp->sign == ' ') signc = sp->sign;
    }
    char align = sp->align;
    uint32_t fill = sp->fill ? sp->fill : ' ';
    if (sp->zero && numeric && !align) {
        align = '=';
        fill = '0';
    }
    if (!align) align = (numeric && !pct) || pct ? '>' : '<';
    if (!numeric && !pct && !sp->align) align = '<';
    size_t len = cairn_utf8_count(text, text_n) + (signc ? 1 : 0) + strlen(prefix);
    size_t pad = sp->width > (int64_t)len ? (size_t)sp->width - len : 0, left = 0, right = 0;
    if (align == '<') right = pad;
    else if (align == '^') left = pad / 2, right = pad - pad / 2;
    else left = pad;
    char fenc[4];
    size_t fl = cairn_utf8_put(fill, fenc);
    if (align != '=')
        for (size_t i = 0; i < left; i++) tmpl_buf_put(r, b, fenc, fl);
    if (signc) tmpl_buf_putc(r, b, signc);
    tmpl_buf_puts(r, b, prefix);
    if (align == '=')
        for (size_t i = 0; i < left; i++) tmpl_buf_put(r, b, fenc, fl);
    tmpl_buf_put(r, b, text, text_n);
    for (size_t i = 0; i < right; i++) tmpl_buf_put(r, b, fenc, fl);
}

static int64_t tmpl_bi_parse_num(const char *p, size_t n, size_t *i)
{
    int64_t v = 0;
    while (*i < n && p[*i] >= '0' && p[*i] <= '9') {
        if (v < 100000000) v = v * 10 + (p[*i] - '0');
        (*i)++;
    }
    return v;
}

/* Parses a str.format spec ([[fill]align][sign][z][#][0][width][,_][.prec][type]). */
static void tmpl_bi_parse_spec(struct tmpl_rstate *r, const char *p, size_t n, struct tmpl_bi_spec *sp)
{
    memset(sp, 0, sizeof(*sp));
    sp->prec = -1;
    size_t i = 0;
    if (n) {
        size_t k = 0;
        uint32_t first = cairn_utf8_next(p, n, &k);
        if (k < n && strchr("<>=^", p[k])) {
            sp->fill = first;
            sp->align = p[k];
            i = k + 1;
        } else if (strchr("<>=^", p[0])) {
            sp->align = p[0];
            i = 1;
        }
    }
    if (i < n && (p[i] == '+' || p[i] == '-' || p[i] == ' ')) sp->sign = p[i++];
    if (i < n && p[i] == 'z') i++;
    if (i < n && p[i] == '#') sp->alt = 1, i++;
    if (i < n && p[i] == '0') sp->zero = 1, i++;
    sp->width = tmpl_bi_parse_num(p, n, &i);
    if (i < n && (p[i] == ',' || p[i] == '_')) sp->group = p[i++];
    if (i < n && p[i] == '.') {
        i++;
        if (i >= n || p[i] < '0' || p[i] > '9') tmpl_fail(r, CAIRN_ERR_INVALID, "Format specifier missing precision");
        sp->prec = tmpl_bi_parse_num(p, n, &i);
    }
    if (i < n && strchr("sdnxXobceEfFgG%", p[i])) sp->type = p[i++];
    if (i != n) tmpl_fail(r, CAIRN_ERR_INVALID, "Invalid format specifier '%.*s'", (int)n, p);
}

/* str.format: {} {0} {name} {x.attr} {x[0]}, !r / !s conversions, format specs; {{ }}. */
struct tmpl_tv tmpl_bi_format(struct tmpl_rstate *r, struct tmpl_tv fmt, struct tmpl_args *a)
{
    struct tmpl_buf b = {0};
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n, auto_i = 0;
    tmpl_buf_put(r, &b, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') {
            tmpl_buf_putc(r, &b, '{');
            i++;
        } else if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') {
            tmpl_buf_putc(r, &b, '}');
            i++;
        } else if (p[i] == '{') {
            const char *e = memchr(p + i, '}', n - i);
            if (!e) tmpl_fail(r, CAIRN_ERR_INVALID, "Single '{' encountered in format string");
            const char *f = p + i + 1;
            size_t fl = (size_t)(e - f);
            if (memchr(f, '{', fl)) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "nested format fields are not supported");
            const char *colon = memchr(f, ':', fl);
            size_t head = colon ? (size_t)(colon - f) : fl;
            const char *bang = memchr(f, '!', head);
            char conv = 0;
            if (bang) {
                if ((size_t)(bang - f) + 2 != head || (bang[1] != 'r' && bang[1] != 's' && bang[1] != 'a'))
                    tmpl_fail(r, CAIRN_ERR_INVALID, "bad conversion in format string");
                conv = bang[1];
                head = (size_t)(bang - f);
            }
            /* field name: arg_name ('.' attr | '[' key ']')* */
            size_t k = 0;
            while (k < head && f[k] != '.' && f[k] != '[') k++;
            struct tmpl_tv v;
            if (k == 0) {
                if (auto_i >= a->n_pos) tmpl_fail(r, CAIRN_ERR_INVALID, "Replacement index %zu out of range", auto_i);
                v = a->pos[auto_i++];
            } else if (f[0] >= '0' && f[0] <= '9') {
                size_t j = 0;
                int64_t idx = tmpl_bi_parse_num(f, k, &j);
                if (j != k || idx >= (int64_t)a->n_pos) tmpl_fail(r, CAIRN_ERR_INVALID, "Replacement index out of range");
                v = a->pos[idx];
            } else {
                int found = 0;
                for (size_t q = 0; q < a->n_kw; q++)
                    if (strlen(a->kwnames[q]) == k && !memcmp(a->kwnames[q], f, k)) {
                        v = a->kw[q];
                        found = 1;
                    }
                if (!found) tmpl_fail(r, CAIRN_ERR_INVALID, "KeyError: '%.*s'", (int)k, f);
            }
            while (k < head) {
                if (f[k] == '.') {
                    size_t st = ++k;
                    while (k < head && f[k] != '.' && f[k] != '[') k++;
                    v = tmpl_getattr(r, v, tmpl_printf(r, "%.*s", (int)(k - st), f + st));
                } else {
                    const char *close = memchr(f + k, ']', head - k);
                    if (!close) tmpl_fail(r, CAIRN_ERR_INVALID, "Missing ']' in format string");
                    size_t st = k + 1, en = (size_t)(close - f), j = st;
                    int64_t idx = tmpl_bi_parse_num(f, en, &j);
                    v = (j == en && en > st) ? tmpl_getitem(r, v, tmpl_tv_int(idx)) : tmpl_getitem(r, v, tmpl_tv_str(f + st, en - st));
                    k = en + 1;
                }
                if (v.t == TMPL_TV_UNDEF) tmpl_bi_undef_fail(r, v);
            }
            struct tmpl_bi_spec sp;
            tmpl_bi_parse_spec(r, colon ? colon + 1 : "", colon ? (size_t)(e - colon - 1) : 0, &sp);
            if (conv == 'r' || conv == 'a') {
                struct tmpl_buf rb = {0};
                tmpl_tv_repr_append(r, &rb, v);
                v = tmpl_buf_to_str(r, &rb);
            } else if (conv == 's') {
                v = tmpl_tv_to_str(r, v);
            }
            if (!colon || e == colon + 1) tmpl_tv_str_append(r, &b, v); /* empty spec: str(v) */
            else tmpl_bi_format_value(r, &b, v, &sp, 0);
            i = (size_t)(e - p);
        } else if (p[i] == '}') {
            tmpl_fail(r, CAIRN_ERR_INVALID, "Single '}' encountered in format string");
        } else {
            tmpl_buf_putc(r, &b, p[i]);
        }
    }
    return tmpl_buf_to_str(r, &b);
}

/* printf-style "fmt" % args: %[-+ 0#][width][.prec](s r d i u f F e E g G x X o c %) */
struct tmpl_tv tmpl_str_percent(struct tmpl_rstate *r, struct tmpl_tv fmt, struct tmpl_tv arg)
{
    struct tmpl_buf b = {0};
    size_t ai = 0;
    struct tmpl_tv_list one = {.n = 1, .items = &arg}, *args = &one;
    if (arg.t == TMPL_TV_LIST && arg.u.l->is_tuple) args = arg.u.l;
    /* a mapping-like argument (dict, list) is not "unconverted" when no spec consumes it */
    int mapping_like = arg.t == TMPL_TV_DICT || (arg.t == TMPL_TV_LIST && !arg.u.l->is_tuple);
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n;
    tmpl_buf_put(r, &b, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            tmpl_buf_putc(r, &b, p[i]);
            continue;
        }
        if (++i >= n) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format");
        if (p[i] == '%') {
            tmpl_buf_putc(r, &b, '%');
            continue;
        }
        struct tmpl_bi_spec sp;
        memset(&sp, 0, sizeof(sp));
        sp.prec = -1;
        struct tmpl_tv keyed;
        int has_key = 0;
        if (p[i] == '(') {
            if (arg.t != TMPL_TV_DICT) tmpl_fail(r, CAIRN_ERR_INVALID, "format requires a mapping");
            const char *close = memchr(p + i, ')', n - i);
            if (!close) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format key");
            if (!tmpl_tv_dict_get(arg.u.d, tmpl_tv_str(p + i + 1, (size_t)(close - p) - i - 1), &keyed))
                tmpl_fail(r, CAIRN_ERR_INVALID, "KeyError: '%.*s'", (int)((size_t)(close - p) - i - 1), p + i + 1);
            has_key = 1;
            i = (size_t)(close - p) + 1;
            if (i >= n) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format");
        }
        for (; i < n && strchr("-+ 0#", p[i]); i++) {
            if (p[i] == '-') sp.align = '<';
            else if (p[i] == '0') sp.zero = 1;
            else if (p[i] == '#') sp.alt = 1;
            else if (sp.sign != '+') sp.sign = p[i];
        }
        if (i < n && p[i] == '*') tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "'*' width is not supported");
        sp.width = tmpl_bi_parse_num(p, n, &i);
        if (i < n && p[i] == '.') {
            i++;
            sp.prec = tmpl_bi_parse_num(p, n, &i);
        }
        while (i < n && (p[i] == 'h' || p[i] == 'l' || p[i] == 'L')) i++;
        if (i >= n) tmpl_fail(r, CAIRN_ERR_INVALID, "incomplete format");
        char c = p[i];
        if (!strchr("srdiufFeEgGxXoca", c)) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "unsupported format character '%c'", c);
        struct tmpl_tv v;
        if (has_key) {
            v = keyed;
        } else {
            if (ai >= args->n) tmpl_fail(r, CAIRN_ERR_INVALID, "not enough arguments for format string");
            v = args->items[ai++];
        }
        if (c == 'i' || c == 'u') c = 'd';
        if (c == 'a') c = 'r';
        if (strchr("dxXoc", c) && v.t == TMPL_TV_FLOAT) {
            if (c != 'd') tmpl_fail(r, CAIRN_ERR_INVALID, "%%%c format: an integer is required, not float", c);
            if (!isfinite(v.u.f) || fabs(v.u.f) > 9.2e18) tmpl_fail(r, CAIRN_ERR_INVALID, "cannot convert float to integer");
            v = tmpl_tv_int((int64_t)v.u.f);
        }
        if (strchr("dxXoc", c) && v.t != TMPL_TV_INT && v.t != TMPL_TV_BOOL)
            tmpl_fail(r, CAIRN_ERR_INVALID, "%%%c format: a real number is required, not %s", c, tmpl_tv_type_name(v));
        if (strchr("fFeEgG", c) && v.t != TMPL_TV_INT && v.t != TMPL_TV_BOOL && v.t != TMPL_TV_FLOAT)
            tmpl_fail(r, CAIRN_ERR_INVALID, "must be real number, not %s", tmpl_tv_type_name(v));
        if (c == 'o' && sp.alt) sp.alt = 1;
        if (c == 's' || c == 'r') sp.zero = 0;
        sp.type = c;
        tmpl_bi_format_value(r, &b, v, &sp, 1);
    }
    if (ai < args->n && !(mapping_like && ai == 0))
        tmpl_fail(r, CAIRN_ERR_INVALID, "not all arguments converted during string formatting");
    return tmpl_buf_to_str(r, &b);
}
