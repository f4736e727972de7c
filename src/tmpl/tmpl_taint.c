/* tmpl taint: which bytes of the rendered output came from data rather than from the
 * template source, so that only the template's own markup can become special tokens.
 *
 * Strings from the render context are data (tmpl_tv_from_json marks them TMPL_TAINT_ALL); template
 * literals are clean. Concatenation and output capture keep exact spans (tmpl_buf_put_str); every
 * other operation that makes a string from a tainted input taints the whole result
 * (tmpl_taint_result, applied by the evaluator to each builtin's result). The output buffer's
 * spans become tmpl_render_chat_spans' answer. Over-reporting data is safe (a template special
 * next to data inside one filtered string is tokenized as text); under-reporting is the bug this
 * prevents, so every path defaults to tainted. */
#include <stdint.h>
#include <string.h>

#include "tmpl/tmpl_int.h"

#define TMPL_TAINT_MAX_DEPTH 64

void tmpl_buf_mark(struct tmpl_rstate *r, struct tmpl_buf *b, size_t off, size_t len)
{
    if (!len) return;
    if (b->n_sp) {
        struct cairn_span *last = &b->sp[b->n_sp - 1];
        if (last->off + last->len >= off) { /* spans arrive in output order */
            size_t end = off + len > last->off + last->len ? off + len : last->off + last->len;
            last->len = end - last->off;
            return;
        }
    }
    if (b->n_sp == b->cap_sp) {
        size_t cap = b->cap_sp ? b->cap_sp * 2 : 8;
        struct cairn_span *sp = tmpl_alloc(r, cap * sizeof(*sp));
        if (b->n_sp) memcpy(sp, b->sp, b->n_sp * sizeof(*sp));
        b->sp = sp;
        b->cap_sp = cap;
    }
    b->sp[b->n_sp++] = (struct cairn_span){off, len};
}

void tmpl_buf_put_str(struct tmpl_rstate *r, struct tmpl_buf *b, struct tmpl_tv s)
{
    size_t off = b->n;
    tmpl_buf_put(r, b, s.u.s.p, s.u.s.n);
    if (s.taint == TMPL_TAINT_NONE || !s.u.s.n) return;
    if (s.taint == TMPL_TAINT_ALL || s.taint - TMPL_TAINT_FIRST >= r->n_taints) {
        tmpl_buf_mark(r, b, off, s.u.s.n);
        return;
    }
    const struct tmpl_taint *t = r->taints[s.taint - TMPL_TAINT_FIRST];
    for (size_t i = 0; i < t->n; i++) tmpl_buf_mark(r, b, off + t->v[i].off, t->v[i].len);
}

uint32_t tmpl_buf_taint(struct tmpl_rstate *r, const struct tmpl_buf *b)
{
    if (!b->n_sp) return TMPL_TAINT_NONE;
    if (b->n_sp == 1 && b->sp[0].off == 0 && b->sp[0].len >= b->n) return TMPL_TAINT_ALL;
    if (r->n_taints >= UINT32_MAX - TMPL_TAINT_FIRST) return TMPL_TAINT_ALL;
    if (r->n_taints == r->cap_taints) {
        uint32_t cap = r->cap_taints ? r->cap_taints * 2 : 16;
        struct tmpl_taint **v = tmpl_alloc(r, cap * sizeof(*v));
        if (r->n_taints) memcpy(v, r->taints, r->n_taints * sizeof(*v));
        r->taints = v;
        r->cap_taints = cap;
    }
    struct tmpl_taint *t = tmpl_alloc(r, sizeof(*t) + b->n_sp * sizeof(t->v[0]));
    t->n = b->n_sp;
    memcpy(t->v, b->sp, b->n_sp * sizeof(t->v[0]));
    r->taints[r->n_taints] = t;
    return TMPL_TAINT_FIRST + r->n_taints++;
}

static int tmpl_tv_tainted_at(struct tmpl_tv v, int depth)
{
    if (depth > TMPL_TAINT_MAX_DEPTH) return 1; /* too deep to tell: assume data */
    switch (v.t) {
    case TMPL_TV_STR: return v.taint != TMPL_TAINT_NONE;
    case TMPL_TV_LIST:
        for (size_t i = 0; i < v.u.l->n; i++)
            if (tmpl_tv_tainted_at(v.u.l->items[i], depth + 1)) return 1;
        return 0;
    case TMPL_TV_DICT:
    case TMPL_TV_NS:
        for (size_t i = 0; i < v.u.d->n; i++)
            if (tmpl_tv_tainted_at(v.u.d->items[i].key, depth + 1) ||
                tmpl_tv_tainted_at(v.u.d->items[i].val, depth + 1))
                return 1;
        return 0;
    case TMPL_TV_METHOD: return tmpl_tv_tainted_at(v.u.meth->self, depth + 1);
    default: return 0;
    }
}

int tmpl_tv_tainted(struct tmpl_tv v) { return tmpl_tv_tainted_at(v, 0); }

/* Marks every string in *v that is not wholly data as wholly data. Namespaces are left alone
 * (they are template state, and may refer to themselves). */
static void tmpl_tv_taint_all(struct tmpl_tv *v, int depth)
{
    if (depth > TMPL_TAINT_MAX_DEPTH) return;
    switch (v->t) {
    case TMPL_TV_STR: v->taint = TMPL_TAINT_ALL; break;
    case TMPL_TV_LIST:
        for (size_t i = 0; i < v->u.l->n; i++) tmpl_tv_taint_all(&v->u.l->items[i], depth + 1);
        break;
    case TMPL_TV_DICT:
        for (size_t i = 0; i < v->u.d->n; i++) {
            tmpl_tv_taint_all(&v->u.d->items[i].key, depth + 1);
            tmpl_tv_taint_all(&v->u.d->items[i].val, depth + 1);
        }
        break;
    default: break;
    }
}

/* 1 if string res carries the very taint of one of the inputs (it is that input, or a part of it
 * handed through unchanged), so its spans are exact. */
static int tmpl_taint_own(struct tmpl_tv res, const struct tmpl_tv *in, size_t n_in, const struct tmpl_args *a)
{
    uint32_t t = res.taint;
    if (t == TMPL_TAINT_NONE) return 0;
    if (t == TMPL_TAINT_ALL) return 1;
    for (size_t i = 0; i < n_in; i++)
        if (in[i].t == TMPL_TV_STR && in[i].taint == t) return 1;
    if (a) {
        for (size_t i = 0; i < a->n_pos; i++)
            if (a->pos[i].t == TMPL_TV_STR && a->pos[i].taint == t) return 1;
        for (size_t i = 0; i < a->n_kw; i++)
            if (a->kw[i].t == TMPL_TV_STR && a->kw[i].taint == t) return 1;
    }
    return 0;
}

struct tmpl_tv tmpl_taint_result(struct tmpl_tv res, const struct tmpl_tv *in, size_t n_in, const struct tmpl_args *a)
{
    if (res.t != TMPL_TV_STR && res.t != TMPL_TV_LIST && res.t != TMPL_TV_DICT) return res;
    if (res.t == TMPL_TV_STR && tmpl_taint_own(res, in, n_in, a)) return res;
    int tainted = 0;
    for (size_t i = 0; i < n_in && !tainted; i++) tainted = tmpl_tv_tainted(in[i]);
    if (a) {
        for (size_t i = 0; i < a->n_pos && !tainted; i++) tainted = tmpl_tv_tainted(a->pos[i]);
        for (size_t i = 0; i < a->n_kw && !tainted; i++) tainted = tmpl_tv_tainted(a->kw[i]);
    }
    if (tainted) tmpl_tv_taint_all(&res, 0);
    return res;
}
