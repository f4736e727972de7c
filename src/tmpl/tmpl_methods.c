/* tmpl methods: Python str, dict and list methods (the non-mutating ones the sandbox allows). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/tmpl_builtins_int.h"

/* ---- methods ---- */

struct tmpl_tv tmpl_bi_arg(struct tmpl_args *a, size_t i, const char *name, struct tmpl_tv def)
{
    struct tmpl_tv v;
    return tmpl_args_get(a, i, name, &v) ? v : def;
}

struct tmpl_tv tmpl_bi_items_list(struct tmpl_rstate *r, struct tmpl_tv_dict *d)
{
    struct tmpl_tv_list *l = tmpl_tv_list_new(r, d->n);
    for (size_t i = 0; i < d->n; i++) {
        struct tmpl_tv_list *t = tmpl_tv_list_new(r, 2);
        t->is_tuple = 1;
        t->items[0] = d->items[i].key;
        t->items[1] = d->items[i].val;
        l->items[i] = TMPL_TV_LISTV(t);
    }
    return TMPL_TV_LISTV(l);
}

int tmpl_bi_is_digit_cp(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND;
}

int tmpl_bi_is_alpha_cp(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

struct tmpl_tv tmpl_bi_str_pred(struct tmpl_tv s, const char *name)
{
    size_t i = 0;
    int any = 0, cased = 0;
    if (s.u.s.n == 0) return tmpl_tv_bool(0);
    while (i < s.u.s.n) {
        uint32_t cp = cairn_utf8_next(s.u.s.p, s.u.s.n, &i);
        any = 1;
        int ok;
        if (!strcmp(name, "isdigit") || !strcmp(name, "isnumeric") || !strcmp(name, "isdecimal")) ok = tmpl_bi_is_digit_cp(cp);
        else if (!strcmp(name, "isalpha")) ok = tmpl_bi_is_alpha_cp(cp);
        else if (!strcmp(name, "isalnum")) ok = tmpl_bi_is_alpha_cp(cp) || tmpl_bi_is_digit_cp(cp);
        else if (!strcmp(name, "isspace")) ok = tmpl_py_isspace(cp);
        else if (!strcmp(name, "isupper")) {
            if (tmpl_case_is_upper(cp)) cased = 1;
            ok = !tmpl_case_is_lower(cp) && !tmpl_case_is_title(cp);
        } else {
            if (tmpl_case_is_lower(cp)) cased = 1;
            ok = !tmpl_case_is_upper(cp) && !tmpl_case_is_title(cp);
        }
        if (!ok) return tmpl_tv_bool(0);
    }
    if (!strcmp(name, "isupper") || !strcmp(name, "islower")) return tmpl_tv_bool(cased);
    return tmpl_tv_bool(any);
}

struct tmpl_tv tmpl_method_call(struct tmpl_rstate *r, struct tmpl_tv_method *m, struct tmpl_args *a)
{
    struct tmpl_tv s = m->self;
    const char *name = m->name;
    tmpl_step_bytes(r, s.t == TMPL_TV_STR ? s.u.s.n : 0);
    if (s.t == TMPL_TV_DICT) {
        if (!strcmp(name, "items")) {
            struct tmpl_tv it = tmpl_bi_items_list(r, s.u.d);
            it.u.l->kind = TMPL_TL_ITEMS;
            return it;
        }
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            struct tmpl_tv_list *l = tmpl_tv_list_new(r, s.u.d->n);
            l->kind = name[0] == 'k' ? TMPL_TL_KEYS : TMPL_TL_VALUES;
            for (size_t i = 0; i < l->n; i++)
                l->items[i] = name[0] == 'k' ? s.u.d->items[i].key : s.u.d->items[i].val;
            return TMPL_TV_LISTV(l);
        }
        if (!strcmp(name, "get")) {
            struct tmpl_tv k, v;
            if (!tmpl_args_get(a, 0, NULL, &k)) tmpl_fail(r, CAIRN_ERR_INVALID, "get expected at least 1 argument");
            if (tmpl_tv_dict_get(s.u.d, k, &v)) return v;
            return tmpl_bi_arg(a, 1, NULL, tmpl_tv_none());
        }
        if (!strcmp(name, "copy")) return s;
    }
    if (s.t == TMPL_TV_LIST) {
        if (!strcmp(name, "copy")) return s;
        struct tmpl_tv x;
        if (!tmpl_args_get(a, 0, NULL, &x)) tmpl_fail(r, CAIRN_ERR_INVALID, "%s expected 1 argument", name);
        int64_t cnt = 0;
        for (size_t i = 0; i < s.u.l->n; i++)
            if (tmpl_tv_equal(s.u.l->items[i], x)) {
                if (!strcmp(name, "index")) return tmpl_tv_int((int64_t)i);
                cnt++;
            }
        if (!strcmp(name, "index")) tmpl_fail(r, CAIRN_ERR_INVALID, "value is not in list");
        return tmpl_tv_int(cnt);
    }
    if (s.t != TMPL_TV_STR) tmpl_fail(r, CAIRN_ERR_INVALID, "unknown method %s", name);
    struct tmpl_tv x;
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!tmpl_args_get(a, 0, NULL, &x)) tmpl_fail(r, CAIRN_ERR_INVALID, "%s takes at least 1 argument", name);
        int end = name[0] == 'e';
        if (x.t == TMPL_TV_LIST && x.u.l->is_tuple) {
            for (size_t i = 0; i < x.u.l->n; i++)
                if (tmpl_bi_affix(s, tmpl_bi_need_str(r, x.u.l->items[i], name), end)) return tmpl_tv_bool(1);
            return tmpl_tv_bool(0);
        }
        return tmpl_tv_bool(tmpl_bi_affix(s, tmpl_bi_need_str(r, x, name), end));
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        struct tmpl_tv sep = tmpl_bi_arg(a, 0, "sep", tmpl_tv_none());
        if (sep.t != TMPL_TV_NONE) tmpl_bi_need_str(r, sep, "separator");
        int64_t maxsplit = tmpl_bi_need_int(r, tmpl_bi_arg(a, 1, "maxsplit", tmpl_tv_int(-1)), "maxsplit");
        return tmpl_bi_split(r, s, sep, maxsplit, name[0] == 'r');
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        struct tmpl_tv chars = tmpl_bi_arg(a, 0, NULL, tmpl_tv_none());
        if (chars.t != TMPL_TV_NONE) tmpl_bi_need_str(r, chars, "strip arg");
        return tmpl_bi_strip(s, chars, name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "replace")) {
        struct tmpl_tv o = tmpl_bi_need_str(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_none()), "replace arg 1");
        struct tmpl_tv nw = tmpl_bi_need_str(r, tmpl_bi_arg(a, 1, NULL, tmpl_tv_none()), "replace arg 2");
        int64_t count = tmpl_bi_need_int(r, tmpl_bi_arg(a, 2, "count", tmpl_tv_int(-1)), "count");
        return tmpl_bi_replace(r, s, o, nw, count);
    }
    if (!strcmp(name, "upper")) return tmpl_bi_map_case(r, s, 1);
    if (!strcmp(name, "lower") || !strcmp(name, "casefold")) return tmpl_bi_map_case(r, s, 0);
    if (!strcmp(name, "swapcase")) return tmpl_bi_map_case(r, s, 2);
    if (!strcmp(name, "title")) return tmpl_bi_pytitle(r, s);
    if (!strcmp(name, "capitalize")) return tmpl_bi_capitalize(r, s);
    if (!strcmp(name, "find") || !strcmp(name, "index") || !strcmp(name, "rfind") || !strcmp(name, "rindex")) {
        struct tmpl_tv sub = tmpl_bi_need_str(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_none()), name);
        long found = -1;
        if (name[0] != 'r') {
            const char *h = sub.u.s.n ? memmem(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n) : s.u.s.p;
            if (h) found = (long)(h - s.u.s.p);
        } else if (sub.u.s.n <= s.u.s.n) {
            for (size_t k = s.u.s.n - sub.u.s.n + 1; k-- > 0;)
                if (!memcmp(s.u.s.p + k, sub.u.s.p, sub.u.s.n)) {
                    found = (long)k;
                    break;
                }
        }
        if (found < 0) {
            if (strstr(name, "index")) tmpl_fail(r, CAIRN_ERR_INVALID, "substring not found");
            return tmpl_tv_int(-1);
        }
        return tmpl_tv_int(tmpl_bi_cp_index(s, (size_t)found));
    }
    if (!strcmp(name, "count")) {
        struct tmpl_tv sub = tmpl_bi_need_str(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_none()), name);
        if (sub.u.s.n == 0) return tmpl_tv_int((int64_t)cairn_utf8_count(s.u.s.p, s.u.s.n) + 1);
        int64_t c = 0;
        size_t i = 0;
        const char *h;
        while ((h = memmem(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n)) != NULL) {
            c++;
            i = (size_t)(h - s.u.s.p) + sub.u.s.n;
        }
        return tmpl_tv_int(c);
    }
    if (!strcmp(name, "format")) return tmpl_bi_format(r, s, a);
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        struct tmpl_tv x2 = tmpl_bi_need_str(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_none()), name);
        int end = name[6] == 's';
        if (!tmpl_bi_affix(s, x2, end)) return s;
        return tmpl_tv_str(s.u.s.p + (end ? 0 : x2.u.s.n), s.u.s.n - x2.u.s.n);
    }
    if (!strcmp(name, "join")) {
        struct tmpl_tv_list *l = tmpl_tv_iter_list(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_undef(NULL)));
        struct tmpl_buf b = {0};
        tmpl_buf_put(r, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i) tmpl_buf_put(r, &b, s.u.s.p, s.u.s.n);
            struct tmpl_tv it = tmpl_bi_need_str(r, l->items[i], "sequence item");
            tmpl_buf_put(r, &b, it.u.s.p, it.u.s.n);
        }
        return tmpl_buf_to_str(r, &b);
    }
    if (!strcmp(name, "splitlines")) {
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, s.u.s.n + 1);
        l->n = 0;
        size_t st = 0, i = 0;
        while (i < s.u.s.n) {
            size_t cst = i;
            uint32_t cp = cairn_utf8_next(s.u.s.p, s.u.s.n, &i);
            if (cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D ||
                cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
                l->items[l->n++] = tmpl_tv_str(s.u.s.p + st, cst - st);
                if (cp == '\r' && i < s.u.s.n && s.u.s.p[i] == '\n') i++;
                st = i;
            }
        }
        if (st < s.u.s.n) l->items[l->n++] = tmpl_tv_str(s.u.s.p + st, s.u.s.n - st);
        return TMPL_TV_LISTV(l);
    }
    if (!strncmp(name, "is", 2)) return tmpl_bi_str_pred(s, name);
    if (!strcmp(name, "center") || !strcmp(name, "ljust") || !strcmp(name, "rjust")) {
        int64_t w = tmpl_bi_need_int(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_none()), "width");
        struct tmpl_tv fill = tmpl_bi_need_str(r, tmpl_bi_arg(a, 1, NULL, tmpl_tv_cstr(" ")), "fillchar");
        return tmpl_bi_pad(r, s, w, fill, name[0] == 'c' ? 0 : name[0] == 'l' ? 1 : 2);
    }
    if (!strcmp(name, "zfill")) {
        int64_t w = tmpl_bi_need_int(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_none()), "width");
        return tmpl_bi_pad(r, s, w, tmpl_tv_cstr("0"), 2);
    }
    if (!strcmp(name, "partition") || !strcmp(name, "rpartition")) {
        struct tmpl_tv sep = tmpl_bi_need_str(r, tmpl_bi_arg(a, 0, NULL, tmpl_tv_none()), "sep");
        if (!sep.u.s.n) tmpl_fail(r, CAIRN_ERR_INVALID, "empty separator");
        struct tmpl_tv_list *t = tmpl_tv_list_new(r, 3);
        t->is_tuple = 1;
        struct tmpl_tv parts = tmpl_bi_split(r, s, sep, 1, name[0] == 'r');
        if (parts.u.l->n == 2) {
            t->items[0] = parts.u.l->items[0];
            t->items[1] = sep;
            t->items[2] = parts.u.l->items[1];
        } else if (name[0] == 'r') {
            t->items[0] = tmpl_tv_str("", 0);
            t->items[1] = tmpl_tv_str("", 0);
            t->items[2] = s;
        } else {
            t->items[0] = s;
            t->items[1] = tmpl_tv_str("", 0);
            t->items[2] = tmpl_tv_str("", 0);
        }
        return TMPL_TV_LISTV(t);
    }
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "str.%s is not supported", name);
}
