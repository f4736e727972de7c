/* tmpl tests: jinja2's `is` tests (defined, string, mapping, divisibleby, ...). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tmpl/tmpl_builtins_int.h"

/* ---- tests ---- */

static double tmpl_bi_num_arg(struct tmpl_rstate *r, struct tmpl_tv v)
{
    if (v.t == TMPL_TV_FLOAT) return v.u.f;
    return (double)tmpl_bi_need_int(r, v, "number");
}

static const char *const tmpl_bi_test_names[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "number", "integer", "float",
    "sequence", "boolean", "true", "false", "callable", "equalto", "eq", "==", "ne", "!=", "lt",
    "<", "le", "<=", "gt", ">", "ge", ">=", "lessthan", "greaterthan", "odd", "even",
    "divisibleby", "in", "sameas", "lower", "upper", "escaped", "filter", "test", NULL};

int tmpl_test_exists(const char *name) { return tmpl_bi_in(tmpl_bi_test_names, name); }

int tmpl_test_apply(struct tmpl_rstate *r, const char *name, struct tmpl_tv v, struct tmpl_args *a, int line)
{
    tmpl_step(r);
    struct tmpl_tv x;
    int has = tmpl_args_get(a, 0, NULL, &x);
    if (!strcmp(name, "defined")) return v.t != TMPL_TV_UNDEF;
    if (!strcmp(name, "undefined")) return v.t == TMPL_TV_UNDEF;
    if (!strcmp(name, "none")) return v.t == TMPL_TV_NONE;
    if (!strcmp(name, "string")) return v.t == TMPL_TV_STR;
    if (!strcmp(name, "mapping")) return v.t == TMPL_TV_DICT;
    if (!strcmp(name, "iterable")) return v.t == TMPL_TV_STR || v.t == TMPL_TV_LIST || v.t == TMPL_TV_DICT || v.t == TMPL_TV_UNDEF;
    if (!strcmp(name, "sequence"))
        return v.t == TMPL_TV_STR || v.t == TMPL_TV_DICT || v.t == TMPL_TV_UNDEF ||
               (v.t == TMPL_TV_LIST && (v.u.l->kind == TMPL_TL_PLAIN || v.u.l->kind == TMPL_TL_RANGE));
    if (!strcmp(name, "number")) return v.t == TMPL_TV_INT || v.t == TMPL_TV_FLOAT || v.t == TMPL_TV_BOOL;
    if (!strcmp(name, "integer")) return v.t == TMPL_TV_INT;
    if (!strcmp(name, "float")) return v.t == TMPL_TV_FLOAT;
    if (!strcmp(name, "boolean")) return v.t == TMPL_TV_BOOL;
    if (!strcmp(name, "true")) return v.t == TMPL_TV_BOOL && v.u.b;
    if (!strcmp(name, "false")) return v.t == TMPL_TV_BOOL && !v.u.b;
    if (!strcmp(name, "callable")) return v.t == TMPL_TV_UNDEF || v.t == TMPL_TV_MACRO || v.t == TMPL_TV_BUILTIN || v.t == TMPL_TV_METHOD || v.t == TMPL_TV_CYCLER;
    if (!strcmp(name, "escaped")) return 0;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        struct tmpl_tv s = tmpl_tv_to_str(r, v);
        return tmpl_tv_truthy(tmpl_bi_str_pred(s, name[0] == 'l' ? "islower" : "isupper"));
    }
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (v.t != TMPL_TV_STR) return 0;
        const char *n = tmpl_tv_str_copy(r, v.u.s.p, v.u.s.n).u.s.p;
        return name[0] == 'f' ? tmpl_filter_exists(n) : tmpl_test_exists(n);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.t == TMPL_TV_UNDEF) tmpl_bi_undef_fail(r, v);
        if (v.t == TMPL_TV_FLOAT) {
            double dv = name[0] == 'd' ? tmpl_bi_num_arg(r, has ? x : tmpl_tv_none()) : 2.0;
            if (dv == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float modulo");
            double m = fmod(v.u.f, dv);
            if (m != 0 && ((m < 0) != (dv < 0))) m += dv;
            return name[0] == 'o' ? m == 1.0 : m == 0.0;
        }
        if (v.t != TMPL_TV_INT && v.t != TMPL_TV_BOOL) tmpl_fail(r, CAIRN_ERR_INVALID, "%s test needs a number", name);
        int64_t i = v.t == TMPL_TV_INT ? v.u.i : v.u.b;
        if (name[0] == 'o') return (i % 2 + 2) % 2 == 1;
        if (name[0] == 'e') return i % 2 == 0;
        int64_t d = tmpl_bi_need_int(r, has ? x : tmpl_tv_none(), "divisibleby");
        if (d == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "integer division or modulo by zero");
        if (d == -1) return 1;
        return i % d == 0;
    }
    if (!has) tmpl_fail(r, CAIRN_ERR_INVALID, "line %d: test '%s' needs an argument", line, name);
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) return tmpl_tv_equal(v, x);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !tmpl_tv_equal(v, x);
    if (!strcmp(name, "sameas")) {
        if (v.t != x.t) return 0;
        if (v.t == TMPL_TV_NONE || v.t == TMPL_TV_BOOL || v.t == TMPL_TV_UNDEF) return tmpl_tv_equal(v, x);
        if (v.t == TMPL_TV_LIST) return v.u.l == x.u.l;
        if (v.t == TMPL_TV_DICT || v.t == TMPL_TV_NS) return v.u.d == x.u.d;
        return tmpl_tv_equal(v, x);
    }
    if (!strcmp(name, "in")) {
        struct tmpl_tv_list *l;
        if (x.t == TMPL_TV_STR) {
            if (v.t != TMPL_TV_STR) tmpl_fail(r, CAIRN_ERR_INVALID, "'in <string>' requires string as left operand");
            return v.u.s.n == 0 || memmem(x.u.s.p, x.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (x.t == TMPL_TV_DICT || x.t == TMPL_TV_NS) {
            struct tmpl_tv dummy;
            return tmpl_tv_dict_get(x.u.d, v, &dummy);
        }
        l = tmpl_tv_iter_list(r, x);
        for (size_t i = 0; i < l->n; i++)
            if (tmpl_tv_equal(l->items[i], v)) return 1;
        return 0;
    }
    int op = 0;
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan")) op = 1;
    else if (!strcmp(name, "le") || !strcmp(name, "<=")) op = 2;
    else if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan")) op = 3;
    else if (!strcmp(name, "ge") || !strcmp(name, ">=")) op = 4;
    if (op) {
        if (v.t == TMPL_TV_UNDEF) tmpl_bi_undef_fail(r, v);
        if (x.t == TMPL_TV_UNDEF) tmpl_bi_undef_fail(r, x);
        int c = tmpl_tv_compare(r, v, x);
        if (c == 3) return 0;
        return op == 1 ? c < 0 : op == 2 ? c <= 0 : op == 3 ? c > 0 : c >= 0;
    }
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "line %d: no test named '%s'", line, name);
}
