/* tmpl interpreter: walks the AST with jinja2's semantics (scoping: a for body gets a fresh
 * scope each iteration, macros see their defining scope at call time, `set` binds in the
 * innermost scope), Python arithmetic and comparisons, and the render entry points.
 * Errors longjmp to tmpl_render (see tmpl_int.h DESIGN). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl/tmpl_int.h"

#define TMPL_MAX_NATIVE_DEPTH 1500

struct tscope_var {
    const char *name;
    struct tmpl_tv val;
};

struct tscope {
    struct tscope *parent;
    struct tscope_var *vars;
    size_t n, cap;
    int captured; /* a macro closes over it: a loop must not recycle it */
};

struct tmpl_tv_macro {
    const struct tmpl_node *node; /* TMPL_N_MACRO or TMPL_N_CALLBLOCK */
    struct tscope *closure;
    const char *name;
};

static void teval_enter(struct tmpl_rstate *r)
{
    if (++r->depth > TMPL_MAX_NATIVE_DEPTH)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template evaluation nested too deeply");
    tmpl_step(r);
}

/* ---- scopes ---- */

static struct tscope *tscope_new(struct tmpl_rstate *r, struct tscope *parent)
{
    struct tscope *s = tmpl_alloc(r, sizeof(*s));
    s->parent = parent;
    return s;
}

static void tscope_set(struct tmpl_rstate *r, struct tscope *s, const char *name, struct tmpl_tv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->vars[i].name, name)) {
            s->vars[i].val = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct tscope_var *vars = tmpl_alloc(r, cap * sizeof(*vars));
        if (s->n) memcpy(vars, s->vars, s->n * sizeof(*vars));
        s->vars = vars;
        s->cap = cap;
    }
    s->vars[s->n].name = name;
    s->vars[s->n].val = v;
    s->n++;
}

static int tscope_get(const struct tscope *s, const char *name, struct tmpl_tv *out)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i > 0; i--)
            if (!strcmp(s->vars[i - 1].name, name)) {
                *out = s->vars[i - 1].val;
                return 1;
            }
    return 0;
}

/* ---- helpers ---- */

static struct tmpl_tv teval(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *n);
static void texec(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *n);

static void tundef_fail(struct tmpl_rstate *r, struct tmpl_tv v)
{
    if (v.u.s.p && v.u.s.n) tmpl_fail(r, CAIRN_ERR_INVALID, "%.*s", (int)v.u.s.n, v.u.s.p);
    tmpl_fail(r, CAIRN_ERR_INVALID, "value is undefined");
}

static void teval_args(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *n, struct tmpl_args *a,
                       size_t extra_pos, size_t extra_kw)
{
    a->n_pos = n->n_args + extra_pos;
    a->pos = tmpl_alloc(r, (a->n_pos + 1) * sizeof(struct tmpl_tv));
    for (size_t i = 0; i < n->n_args; i++) a->pos[i + extra_pos] = teval(r, s, n->args[i]);
    a->n_kw = n->n_kw + extra_kw;
    a->kw = tmpl_alloc(r, (a->n_kw + 1) * sizeof(struct tmpl_tv));
    a->kwnames = tmpl_alloc(r, (a->n_kw + 1) * sizeof(char *));
    for (size_t i = 0; i < n->n_kw; i++) {
        a->kwnames[i] = n->kwnames[i];
        a->kw[i] = teval(r, s, n->args2[i]);
    }
}

/* ---- loop object ---- */

/* ---- macros ---- */

struct tmpl_tv tmpl_macro_call(struct tmpl_rstate *r, struct tmpl_tv_macro *m, struct tmpl_args *a)
{
    if (++r->call_depth > r->lim.max_call_depth)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "macro calls nested too deeply (limit %d)", r->lim.max_call_depth);
    const struct tmpl_node *n = m->node;
    struct tscope *s = tscope_new(r, m->closure);
    size_t np = n->n_args;
    if (a->n_pos > np && !(n->op & TMPL_USES_VARARGS))
        tmpl_fail(r, CAIRN_ERR_INVALID, "macro '%s' takes not more than %zu argument(s)", m->name, np);
    struct tmpl_tv_list *varargs = tmpl_tv_list_new(r, a->n_pos > np ? a->n_pos - np : 0);
    varargs->is_tuple = 1;
    for (size_t i = np; i < a->n_pos; i++) varargs->items[i - np] = a->pos[i];
    struct tmpl_tv_dict *kwargs = tmpl_tv_dict_new(r, 0);
    int *bound = tmpl_alloc(r, (np + 1) * sizeof(int));
    for (size_t i = 0; i < np && i < a->n_pos; i++) {
        tscope_set(r, s, n->args[i]->str, a->pos[i]);
        bound[i] = 1;
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        int found = 0;
        for (size_t i = 0; i < np; i++)
            if (!strcmp(n->args[i]->str, a->kwnames[k])) {
                if (bound[i]) tmpl_fail(r, CAIRN_ERR_INVALID, "macro got multiple values for argument '%s'", a->kwnames[k]);
                tscope_set(r, s, n->args[i]->str, a->kw[k]);
                bound[i] = found = 1;
            }
        if (!found) {
            int is_caller = !strcmp(a->kwnames[k], "caller");
            if (is_caller && (n->op & TMPL_USES_CALLER)) {
                tscope_set(r, s, "caller", a->kw[k]);
            } else if (n->op & TMPL_USES_KWARGS) {
                tmpl_tv_dict_set(r, kwargs, tmpl_tv_cstr(a->kwnames[k]), a->kw[k]);
            } else if (is_caller) {
                tmpl_fail(r, CAIRN_ERR_INVALID, "macro '%s' was invoked with two values for the special caller argument", m->name);
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "macro '%s' takes no keyword argument '%s'", m->name, a->kwnames[k]);
            }
        }
    }
    if ((n->op & TMPL_USES_CALLER)) {
        struct tmpl_tv c;
        int have = 0;
        for (size_t k = 0; k < a->n_kw; k++)
            if (!strcmp(a->kwnames[k], "caller")) have = 1;
        if (!have) tscope_set(r, s, "caller", tmpl_tv_undef("No caller defined"));
        (void)c;
    }
    for (size_t i = 0; i < np; i++) {
        if (bound[i]) continue;
        if (n->args2 && n->args2[i]) tscope_set(r, s, n->args[i]->str, teval(r, s, n->args2[i]));
        else tscope_set(r, s, n->args[i]->str,
                        tmpl_tv_undef(tmpl_printf(r, "parameter '%s' was not provided", n->args[i]->str)));
    }
    tscope_set(r, s, "varargs", (struct tmpl_tv){.t = TMPL_TV_LIST, .u.l = varargs});
    tscope_set(r, s, "kwargs", (struct tmpl_tv){.t = TMPL_TV_DICT, .u.d = kwargs});
    struct tmpl_buf buf = {0};
    struct tmpl_buf *saved = r->out;
    int saved_ctl = r->loop_ctl;
    r->out = &buf;
    texec(r, s, n->b);
    r->out = saved;
    r->loop_ctl = saved_ctl;
    r->call_depth--;
    return tmpl_buf_to_str(r, &buf);
}

struct tmpl_tv tmpl_call_value(struct tmpl_rstate *r, struct tmpl_tv f, struct tmpl_args *a)
{
    switch (f.t) {
    case TMPL_TV_MACRO: return tmpl_macro_call(r, f.u.m, a);
    case TMPL_TV_BUILTIN: return tmpl_taint_result(tmpl_builtin_call(r, f.u.builtin, a), NULL, 0, a);
    case TMPL_TV_METHOD:
        return tmpl_taint_result(tmpl_method_call(r, f.u.meth, a), &f.u.meth->self, 1, a);
    case TMPL_TV_CYCLER: {
        if (a->n_pos == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "no items for cycling given");
        return a->pos[f.u.loop->index0 % a->n_pos];
    }
    case TMPL_TV_UNDEF: tundef_fail(r, f); break;
    default: break;
    }
    tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not callable", tmpl_tv_type_name(f));
}

/* ---- expressions ---- */

static int64_t tnum_int(struct tmpl_tv v) { return v.t == TMPL_TV_INT ? v.u.i : v.u.b; }
static int tis_intlike(struct tmpl_tv v) { return v.t == TMPL_TV_INT || v.t == TMPL_TV_BOOL; }
static int tis_num(struct tmpl_tv v) { return v.t == TMPL_TV_INT || v.t == TMPL_TV_BOOL || v.t == TMPL_TV_FLOAT; }
static double tnum_f(struct tmpl_tv v) { return v.t == TMPL_TV_FLOAT ? v.u.f : (double)tnum_int(v); }

static const char *const top_names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

static struct tmpl_tv trepeat(struct tmpl_rstate *r, struct tmpl_tv seq, int64_t k)
{
    if (k < 0) k = 0;
    if ((seq.t == TMPL_TV_STR && seq.u.s.n == 0) || (seq.t == TMPL_TV_LIST && seq.u.l->n == 0)) k = 0;
    if (seq.t == TMPL_TV_STR) {
        if (seq.u.s.n && (uint64_t)k > r->lim.max_memory_bytes / seq.u.s.n)
            tmpl_fail(r, CAIRN_ERR_LIMIT, "string repetition too large");
        size_t total = seq.u.s.n * (size_t)k;
        char *p = tmpl_alloc(r, total + 1);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        struct tmpl_tv res = tmpl_tv_str(p, total);
        if (seq.taint) res.taint = TMPL_TAINT_ALL;
        return res;
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)k > r->lim.max_memory_bytes / (n * sizeof(struct tmpl_tv)))
        tmpl_fail(r, CAIRN_ERR_LIMIT, "list repetition too large");
    struct tmpl_tv_list *l = tmpl_tv_list_new(r, n * (size_t)k);
    l->is_tuple = seq.u.l->is_tuple;
    for (int64_t i = 0; i < k; i++) {
        tmpl_step(r);
        if (n) memcpy(l->items + (size_t)i * n, seq.u.l->items, n * sizeof(struct tmpl_tv));
    }
    return (struct tmpl_tv){.t = TMPL_TV_LIST, .u.l = l};
}

static struct tmpl_tv tbinary(struct tmpl_rstate *r, int op, struct tmpl_tv a, struct tmpl_tv b)
{
    if (op == TMPL_OP_CONCAT) {
        struct tmpl_tv x = tmpl_tv_to_str(r, a), y = tmpl_tv_to_str(r, b);
        struct tmpl_buf buf = {0};
        tmpl_buf_put_str(r, &buf, x);
        tmpl_buf_put_str(r, &buf, y);
        return tmpl_buf_to_str(r, &buf);
    }
    if (a.t == TMPL_TV_UNDEF) tundef_fail(r, a);
    if (b.t == TMPL_TV_UNDEF) tundef_fail(r, b);
    if (op == TMPL_OP_MOD && a.t == TMPL_TV_STR) {
        struct tmpl_tv in[2] = {a, b};
        return tmpl_taint_result(tmpl_str_percent(r, a, b), in, 2, NULL);
    }
    if ((op == TMPL_OP_ADD || op == TMPL_OP_MUL) && ((a.t == TMPL_TV_LIST && a.u.l->kind != TMPL_TL_PLAIN) ||
                                           (b.t == TMPL_TV_LIST && b.u.l->kind != TMPL_TL_PLAIN)))
        tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'",
                  top_names[op - TMPL_OP_ADD], tmpl_tv_type_name(a), tmpl_tv_type_name(b));
    if (op == TMPL_OP_POW && tis_num(a) && tis_num(b) && tnum_f(a) == 0 && tnum_f(b) < 0)
        tmpl_fail(r, CAIRN_ERR_INVALID, "0.0 cannot be raised to a negative power");
    if (tis_intlike(a) && tis_intlike(b)) {
        int64_t x = tnum_int(a), y = tnum_int(b), z;
        switch (op) {
        case TMPL_OP_ADD:
            if (__builtin_add_overflow(x, y, &z)) goto overflow;
            return tmpl_tv_int(z);
        case TMPL_OP_SUB:
            if (__builtin_sub_overflow(x, y, &z)) goto overflow;
            return tmpl_tv_int(z);
        case TMPL_OP_MUL:
            if (__builtin_mul_overflow(x, y, &z)) goto overflow;
            return tmpl_tv_int(z);
        case TMPL_OP_DIV:
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "division by zero");
            return tmpl_tv_float((double)x / (double)y);
        case TMPL_OP_FLOORDIV:
        case TMPL_OP_MOD: {
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto overflow;
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return tmpl_tv_int(op == TMPL_OP_MOD ? m : q);
        }
        case TMPL_OP_POW: {
            if (y < 0) return tmpl_tv_float(pow((double)x, (double)y));
            int64_t acc = 1, base = x;
            while (y) {
                if (y & 1)
                    if (__builtin_mul_overflow(acc, base, &acc)) goto overflow;
                y >>= 1;
                if (y && __builtin_mul_overflow(base, base, &base)) goto overflow;
            }
            return tmpl_tv_int(acc);
        }
        }
    }
    if (tis_num(a) && tis_num(b)) {
        double x = tnum_f(a), y = tnum_f(b);
        switch (op) {
        case TMPL_OP_ADD: return tmpl_tv_float(x + y);
        case TMPL_OP_SUB: return tmpl_tv_float(x - y);
        case TMPL_OP_MUL: return tmpl_tv_float(x * y);
        case TMPL_OP_DIV:
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float division by zero");
            return tmpl_tv_float(x / y);
        case TMPL_OP_FLOORDIV:
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float floor division by zero");
            return tmpl_tv_float(floor(x / y));
        case TMPL_OP_MOD: {
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float modulo");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return tmpl_tv_float(m);
        }
        case TMPL_OP_POW: return tmpl_tv_float(pow(x, y));
        }
    }
    if (op == TMPL_OP_ADD && a.t == TMPL_TV_STR && b.t == TMPL_TV_STR) {
        struct tmpl_buf buf = {0};
        tmpl_buf_put_str(r, &buf, a);
        tmpl_buf_put_str(r, &buf, b);
        return tmpl_buf_to_str(r, &buf);
    }
    if (op == TMPL_OP_ADD && a.t == TMPL_TV_LIST && b.t == TMPL_TV_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, a.u.l->n + b.u.l->n);
        l->is_tuple = a.u.l->is_tuple;
        if (a.u.l->n) memcpy(l->items, a.u.l->items, a.u.l->n * sizeof(struct tmpl_tv));
        if (b.u.l->n) memcpy(l->items + a.u.l->n, b.u.l->items, b.u.l->n * sizeof(struct tmpl_tv));
        return (struct tmpl_tv){.t = TMPL_TV_LIST, .u.l = l};
    }
    if (op == TMPL_OP_MUL && (a.t == TMPL_TV_STR || a.t == TMPL_TV_LIST) && tis_intlike(b)) return trepeat(r, a, tnum_int(b));
    if (op == TMPL_OP_MUL && (b.t == TMPL_TV_STR || b.t == TMPL_TV_LIST) && tis_intlike(a)) return trepeat(r, b, tnum_int(a));
    tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'",
              top_names[op - TMPL_OP_ADD], tmpl_tv_type_name(a), tmpl_tv_type_name(b));
overflow:
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
}

static int tcontains(struct tmpl_rstate *r, struct tmpl_tv container, struct tmpl_tv item)
{
    switch (container.t) {
    case TMPL_TV_STR:
        tmpl_step_bytes(r, container.u.s.n);
        if (item.t != TMPL_TV_STR)
            tmpl_fail(r, CAIRN_ERR_INVALID, "'in <string>' requires string as left operand, not %s",
                      tmpl_tv_type_name(item));
        if (item.u.s.n == 0) return 1;
        return memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case TMPL_TV_LIST: {
        struct tmpl_tv_list *l = container.u.l;
        for (size_t i = l->kind == TMPL_TL_GEN ? l->pos : 0; i < l->n; i++)
            if (tmpl_tv_equal(l->items[i], item)) {
                if (l->kind == TMPL_TL_GEN) l->pos = i + 1; /* `in` consumes a generator up to the hit */
                return 1;
            }
        if (l->kind == TMPL_TL_GEN) l->pos = l->n;
        return 0;
    }
    case TMPL_TV_DICT:
    case TMPL_TV_NS: {
        struct tmpl_tv v;
        if (tmpl_tv_unhashable(item))
            tmpl_fail(r, CAIRN_ERR_INVALID, "unhashable type: '%s'", tmpl_tv_type_name(item));
        return tmpl_tv_dict_get(container.u.d, item, &v);
    }
    case TMPL_TV_UNDEF: return 0;
    default:
        tmpl_fail(r, CAIRN_ERR_INVALID, "argument of type '%s' is not iterable", tmpl_tv_type_name(container));
    }
}

static int tcompare_op(struct tmpl_rstate *r, int op, struct tmpl_tv a, struct tmpl_tv b)
{
    switch (op) {
    case TMPL_OP_EQ: return tmpl_tv_equal(a, b);
    case TMPL_OP_NE: return !tmpl_tv_equal(a, b);
    case TMPL_OP_IN: return tcontains(r, b, a);
    case TMPL_OP_NOTIN: return !tcontains(r, b, a);
    default: break;
    }
    if (a.t == TMPL_TV_UNDEF) tundef_fail(r, a);
    if (b.t == TMPL_TV_UNDEF) tundef_fail(r, b);
    int c = tmpl_tv_compare(r, a, b);
    if (c == 3) return 0;
    switch (op) {
    case TMPL_OP_LT: return c < 0;
    case TMPL_OP_LE: return c <= 0;
    case TMPL_OP_GT: return c > 0;
    default: return c >= 0;
    }
}

static struct tmpl_tv tfilter_chain(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *f, struct tmpl_tv input)
{
    teval_enter(r);
    struct tmpl_tv base = f->a ? tfilter_chain(r, s, f->a, input) : input;
    struct tmpl_args a;
    teval_args(r, s, f, &a, 0, 0);
    struct tmpl_tv v = tmpl_taint_result(tmpl_filter_apply(r, f->str, base, &a, f->line), &base, 1, &a);
    r->depth--;
    return v;
}

static struct tmpl_tv teval_call(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *n, struct tmpl_tv caller)
{
    struct tmpl_tv f = teval(r, s, n->a);
    struct tmpl_args a;
    teval_args(r, s, n, &a, 0, caller.t == TMPL_TV_MACRO ? 1 : 0);
    if (caller.t == TMPL_TV_MACRO) {
        a.kwnames[a.n_kw - 1] = "caller";
        a.kw[a.n_kw - 1] = caller;
    }
    if (f.t == TMPL_TV_UNDEF && n->a->kind == TMPL_N_NAME)
        tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' is undefined", n->a->str);
    return tmpl_call_value(r, f, &a);
}

static struct tmpl_tv teval(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *n)
{
    teval_enter(r);
    struct tmpl_tv v;
    switch (n->kind) {
    case TMPL_N_LIT: v = n->lit; break;
    case TMPL_N_NAME:
        if (!tscope_get(s, n->str, &v)) {
            int b = tmpl_builtin_lookup(n->str);
            if (b >= 0) v = (struct tmpl_tv){.t = TMPL_TV_BUILTIN, .u.builtin = b};
            else v = tmpl_tv_undef(tmpl_printf(r, "'%s' is undefined", n->str));
        }
        break;
    case TMPL_N_GETATTR: {
        struct tmpl_tv obj = teval(r, s, n->a);
        if (obj.t == TMPL_TV_UNDEF) tundef_fail(r, obj);
        v = tmpl_getattr(r, obj, n->str);
        if (obj.t == TMPL_TV_STR) v = tmpl_taint_result(v, &obj, 1, NULL); /* else a stored value */
        break;
    }
    case TMPL_N_GETITEM: {
        struct tmpl_tv obj = teval(r, s, n->a);
        struct tmpl_tv key = teval(r, s, n->b);
        if (obj.t == TMPL_TV_UNDEF) tundef_fail(r, obj);
        /* items of lists and dicts keep their own taint (a data key only picks one) */
        v = tmpl_getitem(r, obj, key);
        if (obj.t == TMPL_TV_STR) v = tmpl_taint_result(v, &obj, 1, NULL);
        break;
    }
    case TMPL_N_SLICE: {
        struct tmpl_tv obj = teval(r, s, n->a);
        if (obj.t == TMPL_TV_UNDEF) tundef_fail(r, obj);
        struct tmpl_tv st = n->b ? teval(r, s, n->b) : tmpl_tv_none();
        struct tmpl_tv sp = n->c ? teval(r, s, n->c) : tmpl_tv_none();
        struct tmpl_tv stp = n->d ? teval(r, s, n->d) : tmpl_tv_none();
        v = tmpl_slice(r, obj, st, sp, stp);
        if (obj.t == TMPL_TV_STR) v = tmpl_taint_result(v, &obj, 1, NULL);
        break;
    }
    case TMPL_N_CALL: v = teval_call(r, s, n, tmpl_tv_none()); break;
    case TMPL_N_FILTER: {
        struct tmpl_tv base = teval(r, s, n->a);
        struct tmpl_args a;
        teval_args(r, s, n, &a, 0, 0);
        v = tmpl_taint_result(tmpl_filter_apply(r, n->str, base, &a, n->line), &base, 1, &a);
        break;
    }
    case TMPL_N_TEST: {
        struct tmpl_tv base = teval(r, s, n->a);
        struct tmpl_args a;
        teval_args(r, s, n, &a, 0, 0);
        int t = tmpl_test_apply(r, n->str, base, &a, n->line);
        v = tmpl_tv_bool(n->op ? !t : t);
        break;
    }
    case TMPL_N_UNARY: {
        struct tmpl_tv a = teval(r, s, n->a);
        if (n->op == TMPL_OP_NOT) {
            v = tmpl_tv_bool(!tmpl_tv_truthy(a));
        } else {
            if (a.t == TMPL_TV_UNDEF) tundef_fail(r, a);
            if (a.t == TMPL_TV_FLOAT) v = tmpl_tv_float(n->op == TMPL_OP_NEG ? -a.u.f : a.u.f);
            else if (tis_intlike(a)) {
                int64_t x = tnum_int(a);
                if (n->op == TMPL_OP_NEG && x == INT64_MIN) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
                v = tmpl_tv_int(n->op == TMPL_OP_NEG ? -x : x);
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "bad operand type for unary %s: '%s'",
                          n->op == TMPL_OP_NEG ? "-" : "+", tmpl_tv_type_name(a));
            }
        }
        break;
    }
    case TMPL_N_BINARY: {
        struct tmpl_tv a = teval(r, s, n->a);
        struct tmpl_tv b = teval(r, s, n->b);
        v = tbinary(r, n->op, a, b);
        break;
    }
    case TMPL_N_AND: {
        struct tmpl_tv a = teval(r, s, n->a);
        v = tmpl_tv_truthy(a) ? teval(r, s, n->b) : a;
        break;
    }
    case TMPL_N_OR: {
        struct tmpl_tv a = teval(r, s, n->a);
        v = tmpl_tv_truthy(a) ? a : teval(r, s, n->b);
        break;
    }
    case TMPL_N_COMPARE: {
        struct tmpl_tv left = teval(r, s, n->a);
        v = tmpl_tv_bool(1);
        for (size_t i = 0; i < n->n_args; i++) {
            struct tmpl_tv right = teval(r, s, n->args[i]);
            if (!tcompare_op(r, n->ops[i], left, right)) {
                v = tmpl_tv_bool(0);
                break;
            }
            left = right;
        }
        break;
    }
    case TMPL_N_COND:
        if (tmpl_tv_truthy(teval(r, s, n->a))) v = teval(r, s, n->b);
        else if (n->c) v = teval(r, s, n->c);
        else v = tmpl_tv_undef("the inline if-expression evaluated to false and no else section was defined");
        break;
    case TMPL_N_LIST:
    case TMPL_N_TUPLE: {
        struct tmpl_tv_list *l = tmpl_tv_list_new(r, n->n_args);
        l->is_tuple = n->kind == TMPL_N_TUPLE;
        for (size_t i = 0; i < n->n_args; i++) l->items[i] = teval(r, s, n->args[i]);
        v = (struct tmpl_tv){.t = TMPL_TV_LIST, .u.l = l};
        break;
    }
    case TMPL_N_DICT: {
        struct tmpl_tv_dict *d = tmpl_tv_dict_new(r, n->n_args);
        for (size_t i = 0; i < n->n_args; i++) {
            struct tmpl_tv k = teval(r, s, n->args[i]);
            if (tmpl_tv_unhashable(k)) tmpl_fail(r, CAIRN_ERR_INVALID, "unhashable type: '%s'", tmpl_tv_type_name(k));
            tmpl_tv_dict_set(r, d, k, teval(r, s, n->args2[i]));
        }
        v = (struct tmpl_tv){.t = TMPL_TV_DICT, .u.d = d};
        break;
    }
    default:
        tmpl_fail(r, CAIRN_ERR_INTERNAL, "bad expression node %d", n->kind);
    }
    r->depth--;
    return v;
}

/* ---- statements ---- */

static void tassign(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *stmt, struct tmpl_tv v)
{
    if (stmt->n_args == 1) {
        const struct tmpl_node *t = stmt->args[0];
        if (t->kind == TMPL_N_GETATTR) {
            struct tmpl_tv ns;
            if (!tscope_get(s, t->a->str, &ns) || ns.t != TMPL_TV_NS)
                tmpl_fail(r, CAIRN_ERR_INVALID, "cannot assign attribute on non-namespace object");
            tmpl_tv_dict_set(r, ns.u.d, tmpl_tv_cstr(t->str), v);
            return;
        }
        tscope_set(r, s, t->str, v);
        return;
    }
    if (v.t == TMPL_TV_STR || v.t == TMPL_TV_DICT || v.t == TMPL_TV_LIST) v = (struct tmpl_tv){.t = TMPL_TV_LIST, .u.l = tmpl_tv_iter_list(r, v)};
    else tmpl_fail(r, CAIRN_ERR_INVALID, "cannot unpack non-iterable %s object", tmpl_tv_type_name(v));
    if (v.u.l->n != stmt->n_args)
        tmpl_fail(r, CAIRN_ERR_INVALID, "%s values to unpack (expected %zu, got %zu)",
                  v.u.l->n > stmt->n_args ? "too many" : "not enough", stmt->n_args, v.u.l->n);
    for (size_t i = 0; i < stmt->n_args; i++) tscope_set(r, s, stmt->args[i]->str, v.u.l->items[i]);
}

static struct tmpl_tv tcapture(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *body)
{
    struct tmpl_buf buf = {0};
    struct tmpl_buf *saved = r->out;
    r->out = &buf;
    texec(r, s, body);
    r->out = saved;
    return tmpl_buf_to_str(r, &buf);
}

static void texec_for(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *n)
{
    struct tmpl_tv it = teval(r, s, n->a);
    struct tmpl_tv_list *items = tmpl_tv_iter_list(r, it);
    if (n->d) {
        /* for x in y if cond: filter first (loop.length counts the kept items) */
        struct tmpl_tv_list *kept = tmpl_tv_list_new(r, items->n);
        kept->n = 0;
        struct tscope *fs = tscope_new(r, s);
        for (size_t i = 0; i < items->n; i++) {
            tmpl_step(r);
            fs->n = 0; /* the condition cannot define macros: recycle the scope */
            tassign(r, fs, n, items->items[i]);
            if (tmpl_tv_truthy(teval(r, fs, n->d))) kept->items[kept->n++] = items->items[i];
        }
        items = kept;
    }
    if (items->n == 0) {
        if (n->c) texec(r, s, n->c);
        return;
    }
    struct tmpl_tv_loop *loop = tmpl_alloc(r, sizeof(*loop));
    loop->items = items;
    struct tscope *is = NULL;
    int completed = 0; /* jinja2 runs `else` unless some iteration ran to its end (no break/continue) */
    for (size_t i = 0; i < items->n; i++) {
        tmpl_step(r);
        loop->index0 = i;
        /* a fresh scope per iteration (jinja2 semantics), recycled unless a macro captured it,
         * so long loops run in constant memory */
        if (!is || is->captured) is = tscope_new(r, s);
        is->n = 0;
        tscope_set(r, is, "loop", (struct tmpl_tv){.t = TMPL_TV_LOOP, .u.loop = loop});
        tassign(r, is, n, items->items[i]);
        texec(r, is, n->b);
        if (r->loop_ctl == 1) {
            r->loop_ctl = 0;
            break;
        }
        if (r->loop_ctl == 0) completed = 1;
        r->loop_ctl = 0;
    }
    if (!completed && n->c) texec(r, s, n->c);
}

static void texec(struct tmpl_rstate *r, struct tscope *s, const struct tmpl_node *n)
{
    teval_enter(r);
    switch (n->kind) {
    case TMPL_N_BODY:
        for (size_t i = 0; i < n->n_args && !r->loop_ctl; i++) texec(r, s, n->args[i]);
        break;
    case TMPL_N_DATA: tmpl_buf_put(r, r->out, n->str, n->str_n); break;
    case TMPL_N_OUTPUT: tmpl_tv_str_append(r, r->out, teval(r, s, n->a)); break;
    case TMPL_N_IF:
        if (tmpl_tv_truthy(teval(r, s, n->a))) texec(r, s, n->b);
        else if (n->c) texec(r, s, n->c);
        break;
    case TMPL_N_FOR: texec_for(r, s, n); break;
    case TMPL_N_SET: tassign(r, s, n, teval(r, s, n->a)); break;
    case TMPL_N_SETBLOCK: {
        struct tmpl_tv v = tcapture(r, s, n->b);
        if (n->a) v = tfilter_chain(r, s, n->a, v);
        tassign(r, s, n, v);
        break;
    }
    case TMPL_N_MACRO: {
        struct tmpl_tv_macro *m = tmpl_alloc(r, sizeof(*m));
        m->node = n;
        m->closure = s;
        s->captured = 1;
        m->name = n->str;
        tscope_set(r, s, n->str, (struct tmpl_tv){.t = TMPL_TV_MACRO, .u.m = m});
        break;
    }
    case TMPL_N_CALLBLOCK: {
        struct tmpl_tv_macro *m = tmpl_alloc(r, sizeof(*m));
        m->node = n;
        m->closure = s;
        s->captured = 1;
        m->name = "caller";
        struct tmpl_tv v = teval_call(r, s, n->a, (struct tmpl_tv){.t = TMPL_TV_MACRO, .u.m = m});
        tmpl_tv_str_append(r, r->out, v);
        break;
    }
    case TMPL_N_FILTERBLOCK: {
        struct tmpl_tv v = tcapture(r, s, n->b);
        tmpl_tv_str_append(r, r->out, tfilter_chain(r, s, n->a, v));
        break;
    }
    case TMPL_N_WITH: {
        struct tscope *ws = tscope_new(r, s);
        for (size_t i = 0; i < n->n_args; i++) tscope_set(r, ws, n->args[i]->str, teval(r, s, n->args2[i]));
        texec(r, ws, n->b);
        break;
    }
    case TMPL_N_BREAK: r->loop_ctl = 1; break;
    case TMPL_N_CONTINUE: r->loop_ctl = 2; break;
    default: tmpl_fail(r, CAIRN_ERR_INTERNAL, "bad statement node %d", n->kind);
    }
    r->depth--;
}

/* ---- entry points ---- */

struct tmpl_limits tmpl_limits_default(void)
{
    struct tmpl_limits l = {
        .max_steps = 50u * 1000 * 1000,
        .max_output_bytes = (size_t)64 << 20,
        .max_memory_bytes = (size_t)512 << 20,
        .max_call_depth = 64,
    };
    return l;
}

/* tmpl_render, plus: the strings of the context keys in `trusted` (NULL-terminated list, may be
 * NULL) count as template text, and when spans is not NULL the data spans of the output. */
static int tmpl_render_impl(const struct tmpl *t, json_t *context, const struct tmpl_limits *lim,
                            const char *const *trusted, char **out, size_t *len,
                            struct cairn_span **spans, size_t *n_spans, struct cairn_err *err)
{
    *out = NULL;
    if (len) *len = 0;
    if (spans) {
        *spans = NULL;
        *n_spans = 0;
    }
    if (!t || (context && !json_is_object(context)))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "tmpl_render: context must be a JSON object");
    struct tmpl_rstate *r = calloc(1, sizeof(*r));
    struct cairn_err local;
    if (!r) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    r->err = err ? err : &local;
    r->lim = lim ? *lim : tmpl_limits_default();
    if (r->lim.max_call_depth > 1000) r->lim.max_call_depth = 1000;
    r->arena.limit_bytes = r->lim.max_memory_bytes;
    r->out = &r->main_out;
    if (setjmp(r->jmp)) {
        int rc = r->err->status ? r->err->status : CAIRN_ERR_INTERNAL;
        free(r->main_out.p);
        tmpl_arena_free_all(&r->arena);
        free(r);
        return rc;
    }
    struct tscope *g = tscope_new(r, NULL);
    r->globals = g;
    if (context) {
        const char *k;
        json_t *v;
        json_object_foreach(context, k, v) {
            struct tmpl_tv val = tmpl_tv_from_json(r, v);
            for (size_t i = 0; trusted && trusted[i]; i++)
                if (val.t == TMPL_TV_STR && !strcmp(trusted[i], k)) val.taint = TMPL_TAINT_NONE;
            tscope_set(r, g, k, val);
        }
    }
    texec(r, tscope_new(r, g), t->root);
    if (!r->main_out.p) {
        r->main_out.p = malloc(1);
        if (!r->main_out.p) tmpl_fail(r, CAIRN_ERR_NOMEM, "out of memory");
        r->main_out.p[0] = 0;
    }
    struct cairn_span *sp = NULL;
    if (spans && r->main_out.n_sp) {
        sp = malloc(r->main_out.n_sp * sizeof(*sp));
        if (!sp) tmpl_fail(r, CAIRN_ERR_NOMEM, "out of memory");
        memcpy(sp, r->main_out.sp, r->main_out.n_sp * sizeof(*sp));
        *spans = sp;
        *n_spans = r->main_out.n_sp;
    }
    *out = r->main_out.p;
    if (len) *len = r->main_out.n;
    tmpl_arena_free_all(&r->arena);
    free(r);
    return CAIRN_OK;
}

int tmpl_render(const struct tmpl *t, json_t *context, const struct tmpl_limits *lim, char **out,
                size_t *len, struct cairn_err *err)
{
    return tmpl_render_impl(t, context, lim, NULL, out, len, NULL, NULL, err);
}

int tmpl_render_chat(const struct tmpl *t, json_t *messages, json_t *tools, int add_generation_prompt,
                     const char *bos, const char *eos, json_t *kwargs, char **out, size_t *len,
                     struct cairn_err *err)
{
    return tmpl_render_chat_spans(t, messages, tools, add_generation_prompt, bos, eos, kwargs, out,
                                  len, NULL, NULL, err);
}

int tmpl_render_chat_spans(const struct tmpl *t, json_t *messages, json_t *tools,
                           int add_generation_prompt, const char *bos, const char *eos,
                           json_t *kwargs, char **out, size_t *len, struct cairn_span **spans,
                           size_t *n_spans, struct cairn_err *err)
{
    json_t *ctx = json_object();
    if (!ctx) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    if (bos) json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos) json_object_set_new(ctx, "eos_token", json_string(eos));
    json_object_set(ctx, "messages", messages ? messages : json_null());
    json_object_set(ctx, "tools", tools ? tools : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    /* the tokenizer's own bos/eos are template text, unless the caller's kwargs replaced them */
    const char *trusted[3] = {NULL, NULL, NULL};
    int n_trusted = 0;
    if (bos && !(kwargs && json_object_get(kwargs, "bos_token"))) trusted[n_trusted++] = "bos_token";
    if (eos && !(kwargs && json_object_get(kwargs, "eos_token"))) trusted[n_trusted++] = "eos_token";
    if (kwargs && json_is_object(kwargs)) json_object_update(ctx, kwargs);
    int rc = tmpl_render_impl(t, ctx, NULL, trusted, out, len, spans, n_spans, err);
    json_decref(ctx);
    return rc;
}
