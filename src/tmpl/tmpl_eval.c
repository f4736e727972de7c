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
    struct tv val;
};

struct tscope {
    struct tscope *parent;
    struct tscope_var *vars;
    size_t n, cap;
    int captured; /* a macro closes over it: a loop must not recycle it */
};

struct tv_macro {
    const struct tnode *node; /* N_MACRO or N_CALLBLOCK */
    struct tscope *closure;
    const char *name;
};

struct tv_loop {
    struct tv_list *items;
    size_t index0;
};

void tmpl_fail(struct trender *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err->msg, sizeof(r->err->msg), fmt, ap);
    va_end(ap);
    r->err->status = status;
    longjmp(r->jmp, 1);
}

void tmpl_step(struct trender *r)
{
    if (++r->steps > r->lim.max_steps)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template took too many steps (limit %llu)",
                  (unsigned long long)r->lim.max_steps);
}

void tmpl_step_bytes(struct trender *r, size_t n_bytes)
{
    r->steps += n_bytes >> 10;
    tmpl_step(r);
}

static void teval_enter(struct trender *r)
{
    if (++r->depth > TMPL_MAX_NATIVE_DEPTH)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template evaluation nested too deeply");
    tmpl_step(r);
}

/* ---- scopes ---- */

static struct tscope *tscope_new(struct trender *r, struct tscope *parent)
{
    struct tscope *s = tr_alloc(r, sizeof(*s));
    s->parent = parent;
    return s;
}

static void tscope_set(struct trender *r, struct tscope *s, const char *name, struct tv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->vars[i].name, name)) {
            s->vars[i].val = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct tscope_var *vars = tr_alloc(r, cap * sizeof(*vars));
        if (s->n) memcpy(vars, s->vars, s->n * sizeof(*vars));
        s->vars = vars;
        s->cap = cap;
    }
    s->vars[s->n].name = name;
    s->vars[s->n].val = v;
    s->n++;
}

static int tscope_get(const struct tscope *s, const char *name, struct tv *out)
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

static struct tv teval(struct trender *r, struct tscope *s, const struct tnode *n);
static void texec(struct trender *r, struct tscope *s, const struct tnode *n);

static void tundef_fail(struct trender *r, struct tv v)
{
    if (v.u.s.p && v.u.s.n) tmpl_fail(r, CAIRN_ERR_INVALID, "%.*s", (int)v.u.s.n, v.u.s.p);
    tmpl_fail(r, CAIRN_ERR_INVALID, "value is undefined");
}

char *tr_printf(struct trender *r, const char *fmt, ...)
{
    char buf[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    size_t n = strlen(buf);
    char *c = tr_alloc(r, n + 1);
    memcpy(c, buf, n);
    return c;
}

int targs_get(struct targs *a, size_t i, const char *name, struct tv *out)
{
    if (i < a->n_pos) {
        *out = a->pos[i];
        return 1;
    }
    for (size_t k = 0; name && k < a->n_kw; k++)
        if (!strcmp(a->kwnames[k], name)) {
            *out = a->kw[k];
            return 1;
        }
    return 0;
}

static void teval_args(struct trender *r, struct tscope *s, const struct tnode *n, struct targs *a,
                       size_t extra_pos, size_t extra_kw)
{
    a->n_pos = n->n_args + extra_pos;
    a->pos = tr_alloc(r, (a->n_pos + 1) * sizeof(struct tv));
    for (size_t i = 0; i < n->n_args; i++) a->pos[i + extra_pos] = teval(r, s, n->args[i]);
    a->n_kw = n->n_kw + extra_kw;
    a->kw = tr_alloc(r, (a->n_kw + 1) * sizeof(struct tv));
    a->kwnames = tr_alloc(r, (a->n_kw + 1) * sizeof(char *));
    for (size_t i = 0; i < n->n_kw; i++) {
        a->kwnames[i] = n->kwnames[i];
        a->kw[i] = teval(r, s, n->args2[i]);
    }
}

/* ---- loop object ---- */

struct tv tmpl_loop_attr(struct trender *r, struct tv_loop *l, const char *name)
{
    int64_t n = (int64_t)l->items->n, i = (int64_t)l->index0;
    if (!strcmp(name, "index")) return tv_int(i + 1);
    if (!strcmp(name, "index0")) return tv_int(i);
    if (!strcmp(name, "revindex")) return tv_int(n - i);
    if (!strcmp(name, "revindex0")) return tv_int(n - i - 1);
    if (!strcmp(name, "first")) return tv_bool(i == 0);
    if (!strcmp(name, "last")) return tv_bool(i == n - 1);
    if (!strcmp(name, "length")) return tv_int(n);
    if (!strcmp(name, "depth")) return tv_int(1);
    if (!strcmp(name, "depth0")) return tv_int(0);
    if (!strcmp(name, "previtem"))
        return i > 0 ? l->items->items[i - 1] : tv_undef("there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->items->items[i + 1] : tv_undef("there is no next item");
    if (!strcmp(name, "cycle")) return (struct tv){.t = TV_CYCLER, .u.loop = l};
    return tv_undef(tr_printf(r, "'LoopContext object' has no attribute '%s'", name));
}

/* ---- macros ---- */

struct tv tmpl_macro_call(struct trender *r, struct tv_macro *m, struct targs *a)
{
    if (++r->call_depth > r->lim.max_call_depth)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "macro calls nested too deeply (limit %d)", r->lim.max_call_depth);
    const struct tnode *n = m->node;
    struct tscope *s = tscope_new(r, m->closure);
    size_t np = n->n_args;
    if (a->n_pos > np && !(n->op & TMPL_USES_VARARGS))
        tmpl_fail(r, CAIRN_ERR_INVALID, "macro '%s' takes not more than %zu argument(s)", m->name, np);
    struct tv_list *varargs = tv_list_new(r, a->n_pos > np ? a->n_pos - np : 0);
    varargs->is_tuple = 1;
    for (size_t i = np; i < a->n_pos; i++) varargs->items[i - np] = a->pos[i];
    struct tv_dict *kwargs = tv_dict_new(r, 0);
    int *bound = tr_alloc(r, (np + 1) * sizeof(int));
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
                tv_dict_set(r, kwargs, tv_cstr(a->kwnames[k]), a->kw[k]);
            } else if (is_caller) {
                tmpl_fail(r, CAIRN_ERR_INVALID, "macro '%s' was invoked with two values for the special caller argument", m->name);
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "macro '%s' takes no keyword argument '%s'", m->name, a->kwnames[k]);
            }
        }
    }
    if ((n->op & TMPL_USES_CALLER)) {
        struct tv c;
        int have = 0;
        for (size_t k = 0; k < a->n_kw; k++)
            if (!strcmp(a->kwnames[k], "caller")) have = 1;
        if (!have) tscope_set(r, s, "caller", tv_undef("No caller defined"));
        (void)c;
    }
    for (size_t i = 0; i < np; i++) {
        if (bound[i]) continue;
        if (n->args2 && n->args2[i]) tscope_set(r, s, n->args[i]->str, teval(r, s, n->args2[i]));
        else tscope_set(r, s, n->args[i]->str,
                        tv_undef(tr_printf(r, "parameter '%s' was not provided", n->args[i]->str)));
    }
    tscope_set(r, s, "varargs", (struct tv){.t = TV_LIST, .u.l = varargs});
    tscope_set(r, s, "kwargs", (struct tv){.t = TV_DICT, .u.d = kwargs});
    struct tbuf buf = {0};
    struct tbuf *saved = r->out;
    int saved_ctl = r->loop_ctl;
    r->out = &buf;
    texec(r, s, n->b);
    r->out = saved;
    r->loop_ctl = saved_ctl;
    r->call_depth--;
    return tbuf_to_str(r, &buf);
}

struct tv tmpl_call_value(struct trender *r, struct tv f, struct targs *a)
{
    switch (f.t) {
    case TV_MACRO: return tmpl_macro_call(r, f.u.m, a);
    case TV_BUILTIN: return tmpl_builtin_call(r, f.u.builtin, a);
    case TV_METHOD: return tmpl_method_call(r, f.u.meth, a);
    case TV_CYCLER: {
        if (a->n_pos == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "no items for cycling given");
        return a->pos[f.u.loop->index0 % a->n_pos];
    }
    case TV_UNDEF: tundef_fail(r, f); break;
    default: break;
    }
    tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' object is not callable", tv_type_name(f));
}

/* ---- expressions ---- */

static int64_t tnum_int(struct tv v) { return v.t == TV_INT ? v.u.i : v.u.b; }
static int tis_intlike(struct tv v) { return v.t == TV_INT || v.t == TV_BOOL; }
static int tis_num(struct tv v) { return v.t == TV_INT || v.t == TV_BOOL || v.t == TV_FLOAT; }
static double tnum_f(struct tv v) { return v.t == TV_FLOAT ? v.u.f : (double)tnum_int(v); }

static const char *const top_names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};

static struct tv trepeat(struct trender *r, struct tv seq, int64_t k)
{
    if (k < 0) k = 0;
    if ((seq.t == TV_STR && seq.u.s.n == 0) || (seq.t == TV_LIST && seq.u.l->n == 0)) k = 0;
    if (seq.t == TV_STR) {
        if (seq.u.s.n && (uint64_t)k > r->lim.max_memory_bytes / seq.u.s.n)
            tmpl_fail(r, CAIRN_ERR_LIMIT, "string repetition too large");
        size_t total = seq.u.s.n * (size_t)k;
        char *p = tr_alloc(r, total + 1);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        return tv_str(p, total);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)k > r->lim.max_memory_bytes / (n * sizeof(struct tv)))
        tmpl_fail(r, CAIRN_ERR_LIMIT, "list repetition too large");
    struct tv_list *l = tv_list_new(r, n * (size_t)k);
    l->is_tuple = seq.u.l->is_tuple;
    for (int64_t i = 0; i < k; i++) {
        tmpl_step(r);
        if (n) memcpy(l->items + (size_t)i * n, seq.u.l->items, n * sizeof(struct tv));
    }
    return (struct tv){.t = TV_LIST, .u.l = l};
}

static struct tv tbinary(struct trender *r, int op, struct tv a, struct tv b)
{
    if (op == OP_CONCAT) {
        struct tv x = tv_to_str(r, a), y = tv_to_str(r, b);
        struct tbuf buf = {0};
        tbuf_put(r, &buf, x.u.s.p, x.u.s.n);
        tbuf_put(r, &buf, y.u.s.p, y.u.s.n);
        return tbuf_to_str(r, &buf);
    }
    if (a.t == TV_UNDEF) tundef_fail(r, a);
    if (b.t == TV_UNDEF) tundef_fail(r, b);
    if (op == OP_MOD && a.t == TV_STR) return tmpl_str_percent(r, a, b);
    if ((op == OP_ADD || op == OP_MUL) && ((a.t == TV_LIST && a.u.l->kind != TL_PLAIN) ||
                                           (b.t == TV_LIST && b.u.l->kind != TL_PLAIN)))
        tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'",
                  top_names[op - OP_ADD], tv_type_name(a), tv_type_name(b));
    if (op == OP_POW && tis_num(a) && tis_num(b) && tnum_f(a) == 0 && tnum_f(b) < 0)
        tmpl_fail(r, CAIRN_ERR_INVALID, "0.0 cannot be raised to a negative power");
    if (tis_intlike(a) && tis_intlike(b)) {
        int64_t x = tnum_int(a), y = tnum_int(b), z;
        switch (op) {
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &z)) goto overflow;
            return tv_int(z);
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &z)) goto overflow;
            return tv_int(z);
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &z)) goto overflow;
            return tv_int(z);
        case OP_DIV:
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "division by zero");
            return tv_float((double)x / (double)y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto overflow;
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return tv_int(op == OP_MOD ? m : q);
        }
        case OP_POW: {
            if (y < 0) return tv_float(pow((double)x, (double)y));
            int64_t acc = 1, base = x;
            while (y) {
                if (y & 1)
                    if (__builtin_mul_overflow(acc, base, &acc)) goto overflow;
                y >>= 1;
                if (y && __builtin_mul_overflow(base, base, &base)) goto overflow;
            }
            return tv_int(acc);
        }
        }
    }
    if (tis_num(a) && tis_num(b)) {
        double x = tnum_f(a), y = tnum_f(b);
        switch (op) {
        case OP_ADD: return tv_float(x + y);
        case OP_SUB: return tv_float(x - y);
        case OP_MUL: return tv_float(x * y);
        case OP_DIV:
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float division by zero");
            return tv_float(x / y);
        case OP_FLOORDIV:
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float floor division by zero");
            return tv_float(floor(x / y));
        case OP_MOD: {
            if (y == 0) tmpl_fail(r, CAIRN_ERR_INVALID, "float modulo");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return tv_float(m);
        }
        case OP_POW: return tv_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.t == TV_STR && b.t == TV_STR) {
        struct tbuf buf = {0};
        tbuf_put(r, &buf, a.u.s.p, a.u.s.n);
        tbuf_put(r, &buf, b.u.s.p, b.u.s.n);
        return tbuf_to_str(r, &buf);
    }
    if (op == OP_ADD && a.t == TV_LIST && b.t == TV_LIST && a.u.l->is_tuple == b.u.l->is_tuple) {
        struct tv_list *l = tv_list_new(r, a.u.l->n + b.u.l->n);
        l->is_tuple = a.u.l->is_tuple;
        if (a.u.l->n) memcpy(l->items, a.u.l->items, a.u.l->n * sizeof(struct tv));
        if (b.u.l->n) memcpy(l->items + a.u.l->n, b.u.l->items, b.u.l->n * sizeof(struct tv));
        return (struct tv){.t = TV_LIST, .u.l = l};
    }
    if (op == OP_MUL && (a.t == TV_STR || a.t == TV_LIST) && tis_intlike(b)) return trepeat(r, a, tnum_int(b));
    if (op == OP_MUL && (b.t == TV_STR || b.t == TV_LIST) && tis_intlike(a)) return trepeat(r, b, tnum_int(a));
    tmpl_fail(r, CAIRN_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'",
              top_names[op - OP_ADD], tv_type_name(a), tv_type_name(b));
overflow:
    tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
}

static int tcontains(struct trender *r, struct tv container, struct tv item)
{
    switch (container.t) {
    case TV_STR:
        tmpl_step_bytes(r, container.u.s.n);
        if (item.t != TV_STR)
            tmpl_fail(r, CAIRN_ERR_INVALID, "'in <string>' requires string as left operand, not %s",
                      tv_type_name(item));
        if (item.u.s.n == 0) return 1;
        return memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case TV_LIST: {
        struct tv_list *l = container.u.l;
        for (size_t i = l->kind == TL_GEN ? l->pos : 0; i < l->n; i++)
            if (tv_equal(l->items[i], item)) {
                if (l->kind == TL_GEN) l->pos = i + 1; /* `in` consumes a generator up to the hit */
                return 1;
            }
        if (l->kind == TL_GEN) l->pos = l->n;
        return 0;
    }
    case TV_DICT:
    case TV_NS: {
        struct tv v;
        if (tv_unhashable(item))
            tmpl_fail(r, CAIRN_ERR_INVALID, "unhashable type: '%s'", tv_type_name(item));
        return tv_dict_get(container.u.d, item, &v);
    }
    case TV_UNDEF: return 0;
    default:
        tmpl_fail(r, CAIRN_ERR_INVALID, "argument of type '%s' is not iterable", tv_type_name(container));
    }
}

static int tcompare_op(struct trender *r, int op, struct tv a, struct tv b)
{
    switch (op) {
    case OP_EQ: return tv_equal(a, b);
    case OP_NE: return !tv_equal(a, b);
    case OP_IN: return tcontains(r, b, a);
    case OP_NOTIN: return !tcontains(r, b, a);
    default: break;
    }
    if (a.t == TV_UNDEF) tundef_fail(r, a);
    if (b.t == TV_UNDEF) tundef_fail(r, b);
    int c = tv_compare(r, a, b);
    if (c == 3) return 0;
    switch (op) {
    case OP_LT: return c < 0;
    case OP_LE: return c <= 0;
    case OP_GT: return c > 0;
    default: return c >= 0;
    }
}

static struct tv tfilter_chain(struct trender *r, struct tscope *s, const struct tnode *f, struct tv input)
{
    teval_enter(r);
    struct tv base = f->a ? tfilter_chain(r, s, f->a, input) : input;
    struct targs a;
    teval_args(r, s, f, &a, 0, 0);
    struct tv v = tmpl_filter_apply(r, f->str, base, &a, f->line);
    r->depth--;
    return v;
}

static struct tv teval_call(struct trender *r, struct tscope *s, const struct tnode *n, struct tv caller)
{
    struct tv f = teval(r, s, n->a);
    struct targs a;
    teval_args(r, s, n, &a, 0, caller.t == TV_MACRO ? 1 : 0);
    if (caller.t == TV_MACRO) {
        a.kwnames[a.n_kw - 1] = "caller";
        a.kw[a.n_kw - 1] = caller;
    }
    if (f.t == TV_UNDEF && n->a->kind == N_NAME)
        tmpl_fail(r, CAIRN_ERR_INVALID, "'%s' is undefined", n->a->str);
    return tmpl_call_value(r, f, &a);
}

static struct tv teval(struct trender *r, struct tscope *s, const struct tnode *n)
{
    teval_enter(r);
    struct tv v;
    switch (n->kind) {
    case N_LIT: v = n->lit; break;
    case N_NAME:
        if (!tscope_get(s, n->str, &v)) {
            int b = tmpl_builtin_lookup(n->str);
            if (b >= 0) v = (struct tv){.t = TV_BUILTIN, .u.builtin = b};
            else v = tv_undef(tr_printf(r, "'%s' is undefined", n->str));
        }
        break;
    case N_GETATTR: {
        struct tv obj = teval(r, s, n->a);
        if (obj.t == TV_UNDEF) tundef_fail(r, obj);
        v = tmpl_getattr(r, obj, n->str);
        break;
    }
    case N_GETITEM: {
        struct tv obj = teval(r, s, n->a);
        struct tv key = teval(r, s, n->b);
        if (obj.t == TV_UNDEF) tundef_fail(r, obj);
        v = tmpl_getitem(r, obj, key);
        break;
    }
    case N_SLICE: {
        struct tv obj = teval(r, s, n->a);
        if (obj.t == TV_UNDEF) tundef_fail(r, obj);
        struct tv st = n->b ? teval(r, s, n->b) : tv_none();
        struct tv sp = n->c ? teval(r, s, n->c) : tv_none();
        struct tv stp = n->d ? teval(r, s, n->d) : tv_none();
        v = tmpl_slice(r, obj, st, sp, stp);
        break;
    }
    case N_CALL: v = teval_call(r, s, n, tv_none()); break;
    case N_FILTER: {
        struct tv base = teval(r, s, n->a);
        struct targs a;
        teval_args(r, s, n, &a, 0, 0);
        v = tmpl_filter_apply(r, n->str, base, &a, n->line);
        break;
    }
    case N_TEST: {
        struct tv base = teval(r, s, n->a);
        struct targs a;
        teval_args(r, s, n, &a, 0, 0);
        int t = tmpl_test_apply(r, n->str, base, &a, n->line);
        v = tv_bool(n->op ? !t : t);
        break;
    }
    case N_UNARY: {
        struct tv a = teval(r, s, n->a);
        if (n->op == OP_NOT) {
            v = tv_bool(!tv_truthy(a));
        } else {
            if (a.t == TV_UNDEF) tundef_fail(r, a);
            if (a.t == TV_FLOAT) v = tv_float(n->op == OP_NEG ? -a.u.f : a.u.f);
            else if (tis_intlike(a)) {
                int64_t x = tnum_int(a);
                if (n->op == OP_NEG && x == INT64_MIN) tmpl_fail(r, CAIRN_ERR_UNSUPPORTED, "integer overflow");
                v = tv_int(n->op == OP_NEG ? -x : x);
            } else {
                tmpl_fail(r, CAIRN_ERR_INVALID, "bad operand type for unary %s: '%s'",
                          n->op == OP_NEG ? "-" : "+", tv_type_name(a));
            }
        }
        break;
    }
    case N_BINARY: {
        struct tv a = teval(r, s, n->a);
        struct tv b = teval(r, s, n->b);
        v = tbinary(r, n->op, a, b);
        break;
    }
    case N_AND: {
        struct tv a = teval(r, s, n->a);
        v = tv_truthy(a) ? teval(r, s, n->b) : a;
        break;
    }
    case N_OR: {
        struct tv a = teval(r, s, n->a);
        v = tv_truthy(a) ? a : teval(r, s, n->b);
        break;
    }
    case N_COMPARE: {
        struct tv left = teval(r, s, n->a);
        v = tv_bool(1);
        for (size_t i = 0; i < n->n_args; i++) {
            struct tv right = teval(r, s, n->args[i]);
            if (!tcompare_op(r, n->ops[i], left, right)) {
                v = tv_bool(0);
                break;
            }
            left = right;
        }
        break;
    }
    case N_COND:
        if (tv_truthy(teval(r, s, n->a))) v = teval(r, s, n->b);
        else if (n->c) v = teval(r, s, n->c);
        else v = tv_undef("the inline if-expression evaluated to false and no else section was defined");
        break;
    case N_LIST:
    case N_TUPLE: {
        struct tv_list *l = tv_list_new(r, n->n_args);
        l->is_tuple = n->kind == N_TUPLE;
        for (size_t i = 0; i < n->n_args; i++) l->items[i] = teval(r, s, n->args[i]);
        v = (struct tv){.t = TV_LIST, .u.l = l};
        break;
    }
    case N_DICT: {
        struct tv_dict *d = tv_dict_new(r, n->n_args);
        for (size_t i = 0; i < n->n_args; i++) {
            struct tv k = teval(r, s, n->args[i]);
            if (tv_unhashable(k)) tmpl_fail(r, CAIRN_ERR_INVALID, "unhashable type: '%s'", tv_type_name(k));
            tv_dict_set(r, d, k, teval(r, s, n->args2[i]));
        }
        v = (struct tv){.t = TV_DICT, .u.d = d};
        break;
    }
    default:
        tmpl_fail(r, CAIRN_ERR_INTERNAL, "bad expression node %d", n->kind);
    }
    r->depth--;
    return v;
}

/* ---- statements ---- */

static void tassign(struct trender *r, struct tscope *s, const struct tnode *stmt, struct tv v)
{
    if (stmt->n_args == 1) {
        const struct tnode *t = stmt->args[0];
        if (t->kind == N_GETATTR) {
            struct tv ns;
            if (!tscope_get(s, t->a->str, &ns) || ns.t != TV_NS)
                tmpl_fail(r, CAIRN_ERR_INVALID, "cannot assign attribute on non-namespace object");
            tv_dict_set(r, ns.u.d, tv_cstr(t->str), v);
            return;
        }
        tscope_set(r, s, t->str, v);
        return;
    }
    if (v.t == TV_STR || v.t == TV_DICT || v.t == TV_LIST) v = (struct tv){.t = TV_LIST, .u.l = tv_iter_list(r, v)};
    else tmpl_fail(r, CAIRN_ERR_INVALID, "cannot unpack non-iterable %s object", tv_type_name(v));
    if (v.u.l->n != stmt->n_args)
        tmpl_fail(r, CAIRN_ERR_INVALID, "%s values to unpack (expected %zu, got %zu)",
                  v.u.l->n > stmt->n_args ? "too many" : "not enough", stmt->n_args, v.u.l->n);
    for (size_t i = 0; i < stmt->n_args; i++) tscope_set(r, s, stmt->args[i]->str, v.u.l->items[i]);
}

static struct tv tcapture(struct trender *r, struct tscope *s, const struct tnode *body)
{
    struct tbuf buf = {0};
    struct tbuf *saved = r->out;
    r->out = &buf;
    texec(r, s, body);
    r->out = saved;
    return tbuf_to_str(r, &buf);
}

static void texec_for(struct trender *r, struct tscope *s, const struct tnode *n)
{
    struct tv it = teval(r, s, n->a);
    struct tv_list *items = tv_iter_list(r, it);
    if (n->d) {
        /* for x in y if cond: filter first (loop.length counts the kept items) */
        struct tv_list *kept = tv_list_new(r, items->n);
        kept->n = 0;
        struct tscope *fs = tscope_new(r, s);
        for (size_t i = 0; i < items->n; i++) {
            tmpl_step(r);
            fs->n = 0; /* the condition cannot define macros: recycle the scope */
            tassign(r, fs, n, items->items[i]);
            if (tv_truthy(teval(r, fs, n->d))) kept->items[kept->n++] = items->items[i];
        }
        items = kept;
    }
    if (items->n == 0) {
        if (n->c) texec(r, s, n->c);
        return;
    }
    struct tv_loop *loop = tr_alloc(r, sizeof(*loop));
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
        tscope_set(r, is, "loop", (struct tv){.t = TV_LOOP, .u.loop = loop});
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

static void texec(struct trender *r, struct tscope *s, const struct tnode *n)
{
    teval_enter(r);
    switch (n->kind) {
    case N_BODY:
        for (size_t i = 0; i < n->n_args && !r->loop_ctl; i++) texec(r, s, n->args[i]);
        break;
    case N_DATA: tbuf_put(r, r->out, n->str, n->str_n); break;
    case N_OUTPUT: tv_str_append(r, r->out, teval(r, s, n->a)); break;
    case N_IF:
        if (tv_truthy(teval(r, s, n->a))) texec(r, s, n->b);
        else if (n->c) texec(r, s, n->c);
        break;
    case N_FOR: texec_for(r, s, n); break;
    case N_SET: tassign(r, s, n, teval(r, s, n->a)); break;
    case N_SETBLOCK: {
        struct tv v = tcapture(r, s, n->b);
        if (n->a) v = tfilter_chain(r, s, n->a, v);
        tassign(r, s, n, v);
        break;
    }
    case N_MACRO: {
        struct tv_macro *m = tr_alloc(r, sizeof(*m));
        m->node = n;
        m->closure = s;
        s->captured = 1;
        m->name = n->str;
        tscope_set(r, s, n->str, (struct tv){.t = TV_MACRO, .u.m = m});
        break;
    }
    case N_CALLBLOCK: {
        struct tv_macro *m = tr_alloc(r, sizeof(*m));
        m->node = n;
        m->closure = s;
        s->captured = 1;
        m->name = "caller";
        struct tv v = teval_call(r, s, n->a, (struct tv){.t = TV_MACRO, .u.m = m});
        tv_str_append(r, r->out, v);
        break;
    }
    case N_FILTERBLOCK: {
        struct tv v = tcapture(r, s, n->b);
        tv_str_append(r, r->out, tfilter_chain(r, s, n->a, v));
        break;
    }
    case N_WITH: {
        struct tscope *ws = tscope_new(r, s);
        for (size_t i = 0; i < n->n_args; i++) tscope_set(r, ws, n->args[i]->str, teval(r, s, n->args2[i]));
        texec(r, ws, n->b);
        break;
    }
    case N_BREAK: r->loop_ctl = 1; break;
    case N_CONTINUE: r->loop_ctl = 2; break;
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

int tmpl_render(const struct tmpl *t, json_t *context, const struct tmpl_limits *lim, char **out,
                size_t *len, struct cairn_err *err)
{
    *out = NULL;
    if (len) *len = 0;
    if (!t || (context && !json_is_object(context)))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "tmpl_render: context must be a JSON object");
    struct trender *r = calloc(1, sizeof(*r));
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
        tarena_free_all(&r->arena);
        free(r);
        return rc;
    }
    struct tscope *g = tscope_new(r, NULL);
    r->globals = g;
    if (context) {
        const char *k;
        json_t *v;
        json_object_foreach(context, k, v) tscope_set(r, g, k, tv_from_json(r, v));
    }
    texec(r, tscope_new(r, g), t->root);
    char *res = r->main_out.p;
    size_t n = r->main_out.n;
    if (!res) {
        res = malloc(1);
        if (!res) tmpl_fail(r, CAIRN_ERR_NOMEM, "out of memory");
        res[0] = 0;
    }
    tarena_free_all(&r->arena);
    free(r);
    *out = res;
    if (len) *len = n;
    return CAIRN_OK;
}

int tmpl_render_chat(const struct tmpl *t, json_t *messages, json_t *tools, int add_generation_prompt,
                     const char *bos, const char *eos, json_t *kwargs, char **out, size_t *len,
                     struct cairn_err *err)
{
    json_t *ctx = json_object();
    if (!ctx) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    if (bos) json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos) json_object_set_new(ctx, "eos_token", json_string(eos));
    json_object_set(ctx, "messages", messages ? messages : json_null());
    json_object_set(ctx, "tools", tools ? tools : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (kwargs && json_is_object(kwargs)) json_object_update(ctx, kwargs);
    int rc = tmpl_render(t, ctx, NULL, out, len, err);
    json_decref(ctx);
    return rc;
}
