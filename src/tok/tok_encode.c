/* tok_encode: text -> ids.
 *
 * HF's order: (1) split the raw text on non-normalized added tokens (leftmost-longest, with
 * lstrip / rstrip / single_word), (2) normalize each remaining segment, (3) split it on
 * normalized added tokens, (4) pre-tokenize, (5) BPE each piece, (6) post-process when
 * add_special. All scratch lives in a per-call struct, so concurrent calls are safe.
 *
 * tok_encode_plain: byte ranges of the text that came from data (a rendered chat prompt's
 * message contents) match no added token; the text around them is tokenized in the same pass,
 * so a prompt without control-token text in its data tokenizes exactly as tok_encode does. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok/tok_int.h"

/* Per-call word cache: short words repeat a lot in long prompts. */
#define TOK_CACHE_MAX_WORD 48
#define TOK_CACHE_MAX_ENTRIES 65536

struct tok_cache_ent {
    uint32_t off, n; /* into cache_ids */
};

struct tok_enc_work {
    int split_special;     /* special added tokens are plain text */
    const char *text0;     /* start of the text the plain spans index */
    const struct cairn_span *plain; /* tok_encode_plain: data ranges of the input text */
    size_t n_plain;
    int seg_plain;         /* the raw segment being normalized overlaps plain and normalizing
                              moved its bytes: no normalized added tokens in it */
    size_t seg_off;        /* else: offset of the segment in text0 (normalized == raw bytes) */
    struct tok_smap cache; /* word -> index into cache_ent */
    struct tok_cache_ent *cache_ent;
    size_t n_cache_ent, cap_cache_ent;
    struct tok_ids cache_ids;
    struct cairn_buf clean;
    struct tok_pre_work pre;
    struct tok_bpe_work bpe;
    struct tok_ids ids;
    pcre2_match_data *md;
};

static int tok_is_alnum(uint32_t cp)
{
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static int tok_is_space(uint32_t c)
{
    if (c == ' ' || (c >= 0x09 && c <= 0x0d)) return 1;
    if (c < 0x80) return 0;
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Start of the character that ends just before s[i]. */
static size_t tok_prev_char(const char *s, size_t i)
{
    size_t k = i - 1;
    while (k > 0 && ((uint8_t)s[k] & 0xc0) == 0x80)
        k--;
    return k;
}

/* Index of the first plain span that ends after byte i (n_plain if none). */
static size_t tok_plain_find(const struct tok_enc_work *w, size_t i)
{
    size_t lo = 0, hi = w->n_plain;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->plain[mid].off + w->plain[mid].len <= i) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Next added-token match in s[from..n): longest at the leftmost position that qualifies. A
 * match may not touch a plain span; s[0] is byte `base` of the caller's text (raw: 0). */
static int tok_added_next(const struct tok *t, const struct tok_enc_work *w,
                          const struct tok_trie *tr, const char *s, size_t n, size_t from,
                          size_t *ms, size_t *me, int *which, int raw)
{
    if (tr->n_nodes <= 1) return 0;
    if (!raw && w->seg_plain) return 0;
    size_t base = raw ? 0 : w->seg_off;
    int split_special = w->split_special;
    for (size_t i = from; i < n; i++) {
        if (!tr->first[(uint8_t)s[i]]) continue;
        size_t lim = n;
        if (w->n_plain) {
            size_t p = tok_plain_find(w, base + i);
            if (p < w->n_plain) {
                if (w->plain[p].off <= base + i) continue; /* i is a data byte */
                if (w->plain[p].off - base < lim) lim = w->plain[p].off - base;
            }
        }
        uint32_t node = 0;
        int best = -1;
        size_t best_end = 0;
        for (size_t k = i; k < lim; k++) {
            uint64_t v;
            if (!tok_qmap_get(&tr->edges, ((uint64_t)node << 8) | (uint8_t)s[k], &v)) break;
            node = (uint32_t)v;
            if (tr->term[node] >= 0 && !(split_special && t->added[tr->term[node]].special)) {
                best = tr->term[node];
                best_end = k + 1;
            }
        }
        if (best < 0) continue;
        const struct tok_added *ad = &t->added[best];
        if (ad->single_word) {
            uint32_t cp;
            if (i > 0) {
                cairn_utf8_get(s, n, tok_prev_char(s, i), &cp);
                if (tok_is_alnum(cp)) continue;
            }
            if (best_end < n) {
                cairn_utf8_get(s, n, best_end, &cp);
                if (tok_is_alnum(cp)) continue;
            }
        }
        *ms = i;
        *me = best_end;
        *which = best;
        return 1;
    }
    return 0;
}

/* Pre-tokenizes and BPEs one piece of normalized text. */
static int tok_encode_piece(const struct tok *t, struct tok_enc_work *w, const char *s, size_t n,
                            int first)
{
    const struct cairn_buf *pb;
    const struct tok_spans *ps;
    int st = tok_pretok_run(t->pretok, &w->pre, s, n, first, &pb, &ps);
    for (size_t k = 0; k < ps->n && !st; k++) {
        const char *word = pb->p + ps->v[k].off;
        size_t wl = ps->v[k].len;
        if (wl > TOK_CACHE_MAX_WORD) {
            st = tok_bpe_word(t, &w->bpe, word, wl, &w->ids);
            continue;
        }
        if (!w->cache.slots && tok_smap_init(&w->cache, 1024)) return CAIRN_ERR_NOMEM;
        int32_t e = tok_smap_get(&w->cache, word, wl);
        if (e >= 0) {
            const struct tok_cache_ent *ce = &w->cache_ent[e];
            for (uint32_t i = 0; i < ce->n && !st; i++)
                st = tok_ids_push(&w->ids, w->cache_ids.v[ce->off + i]);
            continue;
        }
        size_t before = w->ids.n;
        if ((st = tok_bpe_word(t, &w->bpe, word, wl, &w->ids))) break;
        if (w->n_cache_ent >= TOK_CACHE_MAX_ENTRIES) continue;
        if (w->n_cache_ent == w->cap_cache_ent) {
            size_t cap = w->cap_cache_ent ? w->cap_cache_ent * 2 : 1024;
            struct tok_cache_ent *ne = realloc(w->cache_ent, cap * sizeof(*ne));
            if (!ne) return CAIRN_ERR_NOMEM;
            w->cache_ent = ne;
            w->cap_cache_ent = cap;
        }
        struct tok_cache_ent ce = {(uint32_t)w->cache_ids.n, (uint32_t)(w->ids.n - before)};
        for (size_t i = before; i < w->ids.n && !st; i++)
            st = tok_ids_push(&w->cache_ids, w->ids.v[i]);
        if (!st) st = tok_smap_put(&w->cache, word, wl, (int32_t)w->n_cache_ent);
        if (!st) w->cache_ent[w->n_cache_ent++] = ce;
    }
    return st;
}

static int tok_split_added(const struct tok *t, struct tok_enc_work *w, const struct tok_trie *tr,
                           const char *s, size_t n, int first, int normalized);

/* A raw segment (between non-normalized added tokens): normalize it, then split it on the
 * normalized added tokens. */
static int tok_encode_raw(const struct tok *t, struct tok_enc_work *w, const char *seg, size_t n,
                          int first)
{
    int st = CAIRN_OK;
    w->seg_plain = 0;
    w->seg_off = (size_t)(seg - w->text0);
    if (!t->norm) st = tok_split_added(t, w, &t->trie_norm, seg, n, first, 1);
    else {
        struct cairn_buf nb = {0}, tmp = {0};
        st = tok_norm_apply(t->norm, w->md, seg, n, &nb, &tmp);
        /* where normalizing moved bytes, offsets don't map back: a segment with data in it
         * then matches none of the normalized added tokens */
        if (!st && w->n_plain && (nb.n != n || (n && memcmp(nb.p, seg, n)))) {
            size_t p = tok_plain_find(w, w->seg_off);
            w->seg_plain = p < w->n_plain && w->plain[p].off < w->seg_off + n;
        }
        if (!st) st = tok_split_added(t, w, &t->trie_norm, nb.p ? nb.p : "", nb.n, first, 1);
        cairn_buf_free(&nb);
        cairn_buf_free(&tmp);
    }
    w->seg_plain = 0;
    return st;
}

/* Splits s on the added tokens of trie tr, pushing their ids, and encodes the text between
 * them: raw text goes through tok_encode_raw, normalized text to the pre-tokenizer. */
static int tok_split_added(const struct tok *t, struct tok_enc_work *w, const struct tok_trie *tr,
                           const char *s, size_t n, int first, int normalized)
{
    size_t start = 0, pos = 0;
    int st = CAIRN_OK;
    for (;;) {
        size_t ms, me;
        int a;
        if (!tok_added_next(t, w, tr, s, n, pos, &ms, &me, &a, !normalized)) break;
        const struct tok_added *ad = &t->added[a];
        if (ad->lstrip)
            while (ms > start) {
                size_t k = tok_prev_char(s, ms);
                uint32_t cp;
                cairn_utf8_get(s, n, k, &cp);
                if (!tok_is_space(cp)) break;
                ms = k;
            }
        if (ad->rstrip)
            while (me < n) {
                uint32_t cp;
                size_t l = cairn_utf8_get(s, n, me, &cp);
                if (!tok_is_space(cp)) break;
                me += l;
            }
        if (ms > start) {
            st = normalized ? tok_encode_piece(t, w, s + start, ms - start, first && start == 0)
                            : tok_encode_raw(t, w, s + start, ms - start, first && start == 0);
            if (st) return st;
        }
        if ((st = tok_ids_push(&w->ids, ad->id))) return st;
        start = pos = me;
    }
    if (start < n)
        st = normalized ? tok_encode_piece(t, w, s + start, n - start, first && start == 0)
                        : tok_encode_raw(t, w, s + start, n - start, first && start == 0);
    return st;
}

static void tok_enc_work_free(struct tok_enc_work *w)
{
    tok_smap_free(&w->cache);
    free(w->cache_ent);
    free(w->cache_ids.v);
    cairn_buf_free(&w->clean);
    for (int i = 0; i < 2; i++) {
        cairn_buf_free(&w->pre.buf[i]);
        free(w->pre.sp[i].v);
    }
    free(w->pre.tmp.v);
    tok_bpe_work_free(&w->bpe);
    free(w->ids.v);
    if (w->md) pcre2_match_data_free(w->md);
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_special, int32_t **ids,
               size_t *n_ids, struct cairn_err *err)
{
    return tok_encode_flags(t, text, len, add_special ? TOK_ENC_ADD_SPECIAL : 0, ids, n_ids, err);
}

int tok_encode_flags(const struct tok *t, const char *text, size_t len, unsigned flags,
                     int32_t **ids, size_t *n_ids, struct cairn_err *err)
{
    return tok_encode_plain(t, text, len, flags, NULL, 0, ids, n_ids, err);
}

int tok_encode_plain(const struct tok *t, const char *text, size_t len, unsigned flags,
                     const struct cairn_span *plain, size_t n_plain, int32_t **ids, size_t *n_ids,
                     struct cairn_err *err)
{
    struct tok_enc_work w;
    memset(&w, 0, sizeof(w));
    w.plain = plain;
    w.n_plain = n_plain;
    int add_special = (flags & TOK_ENC_ADD_SPECIAL) != 0;
    w.split_special = (flags & TOK_ENC_SPLIT_SPECIAL) != 0;
    *ids = NULL;
    *n_ids = 0;
    int st = CAIRN_OK;
    w.md = pcre2_match_data_create(4, NULL);
    w.pre.md = w.md;
    if (!w.md) {
        st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t i = 1; i < n_plain; i++)
        if (plain[i].off < plain[i - 1].off + plain[i - 1].len) {
            st = cairn_err_set(err, CAIRN_ERR_INVALID, "tokenize: plain spans overlap or are unsorted");
            goto cleanup;
        }
    if (len && !cairn_utf8_valid(text, len)) {
        if ((st = cairn_utf8_lossy(&w.clean, text, len))) goto fail;
        text = w.clean.p;
        len = w.clean.n;
        if (n_plain) { /* repaired text has other offsets: all of it is data */
            static const struct cairn_span all = {0, SIZE_MAX};
            w.plain = &all;
            w.n_plain = 1;
        }
    }
    w.text0 = text;
    if (add_special && t->has_post) {
        for (int k = 0; k < t->n_post_single; k++) {
            if (t->post_single[k] >= 0) {
                if ((st = tok_ids_push(&w.ids, t->post_single[k]))) goto fail;
                continue;
            }
            if (len && (st = tok_split_added(t, &w, &t->trie_raw, text, len, 1, 0))) goto fail;
        }
    } else if (len && (st = tok_split_added(t, &w, &t->trie_raw, text, len, 1, 0))) {
        goto fail;
    }
    *ids = w.ids.v;
    *n_ids = w.ids.n;
    w.ids.v = NULL;
    goto cleanup;
fail:
    cairn_err_set(err, st, "tokenize failed: %s",
                  st == CAIRN_ERR_LIMIT ? "regex match limit" : cairn_status_str(st));
cleanup:
    tok_enc_work_free(&w);
    return st;
}
