/* tok loader: tokenizer.json (model, added tokens, normalizer, pre-tokenizer, post-processor,
 * decoder) and tokenizer_config.json / chat_template.{jinja,json}; plus the small accessors.
 * Every malformed or unsupported field is an error naming the field (the fuzzer feeds this). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "tok/tok_int.h"

#define TOK_MAX_ID (1 << 24)
#define TOK_MAX_DEPTH 16

static char *tok_strndup(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static const char *tok_jstr(json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return NULL;
    if (len) *len = json_string_length(v);
    return json_string_value(v);
}

static int tok_jbool(json_t *o, const char *key, int dflt)
{
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v)) return json_is_true(v);
    return dflt;
}

/* A {"String": s} / {"Regex": r} pattern. */
static int tok_parse_pattern(json_t *pat, char **lit, size_t *lit_len, struct tok_re *re,
                             struct cairn_err *err)
{
    size_t n;
    const char *s;
    if ((s = tok_jstr(pat, "String", &n))) {
        *lit = tok_strndup(s, n);
        *lit_len = n;
        return *lit ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    if ((s = tok_jstr(pat, "Regex", &n))) return tok_re_compile(re, s, n, err);
    return cairn_err_set(err, CAIRN_ERR_FORMAT, "pattern must be {\"String\"} or {\"Regex\"}");
}

static int tok_parse_norm(json_t *j, struct tok_norm *nm, int depth, struct cairn_err *err)
{
    memset(nm, 0, sizeof(*nm));
    const char *type = tok_jstr(j, "type", NULL);
    if (!type || depth > TOK_MAX_DEPTH)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "normalizer: missing type");
    if (!strcmp(type, "Sequence")) {
        nm->type = TOK_NORM_SEQUENCE;
        json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "normalizer Sequence: no normalizers");
        size_t n = json_array_size(a);
        nm->kids = calloc(n ? n : 1, sizeof(*nm->kids));
        if (!nm->kids) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            nm->n_kids++;
            int st = tok_parse_norm(json_array_get(a, i), &nm->kids[i], depth + 1, err);
            if (st) return st;
        }
        return CAIRN_OK;
    }
    if (!strcmp(type, "NFC"))
        nm->type = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD"))
        nm->type = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC"))
        nm->type = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD"))
        nm->type = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase"))
        nm->type = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "StripAccents"))
        nm->type = TOK_NORM_STRIP_ACCENTS;
    else if (!strcmp(type, "Strip")) {
        nm->type = TOK_NORM_STRIP;
        nm->left = tok_jbool(j, "strip_left", 1);
        nm->right = tok_jbool(j, "strip_right", 1);
    } else if (!strcmp(type, "Prepend")) {
        size_t n;
        const char *s = tok_jstr(j, "prepend", &n);
        if (!s) return cairn_err_set(err, CAIRN_ERR_FORMAT, "normalizer Prepend: no prepend");
        nm->type = TOK_NORM_PREPEND;
        nm->content = tok_strndup(s, n);
        nm->content_len = n;
        if (!nm->content) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    } else if (!strcmp(type, "Replace")) {
        size_t n;
        const char *s = tok_jstr(j, "content", &n);
        if (!s) return cairn_err_set(err, CAIRN_ERR_FORMAT, "normalizer Replace: no content");
        nm->type = TOK_NORM_REPLACE;
        nm->content = tok_strndup(s, n);
        nm->content_len = n;
        if (!nm->content) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        int st =
            tok_parse_pattern(json_object_get(j, "pattern"), &nm->pat, &nm->pat_len, &nm->re, err);
        if (st) cairn_err_prefix(err, "normalizer Replace");
        return st;
    } else {
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "unsupported normalizer type '%s'", type);
    }
    return CAIRN_OK;
}

static int tok_parse_behavior(json_t *j, enum tok_split_behavior *b, struct cairn_err *err)
{
    const char *s = tok_jstr(j, "behavior", NULL);
    if (!s) s = "Isolated";
    if (!strcmp(s, "Removed"))
        *b = TOK_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated"))
        *b = TOK_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious"))
        *b = TOK_SPLIT_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext"))
        *b = TOK_SPLIT_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous"))
        *b = TOK_SPLIT_CONTIGUOUS;
    else
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "unknown split behavior '%s'", s);
    return CAIRN_OK;
}

static int tok_parse_metaspace(json_t *j, char *repl, size_t *repl_len, enum tok_prepend_scheme *ps,
                               struct cairn_err *err)
{
    size_t n = 0;
    const char *r = tok_jstr(j, "replacement", &n);
    if (!r) r = "\xe2\x96\x81", n = 3;
    if (n == 0 || n > 4 || tok_utf8_len((uint8_t)r[0]) != n)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "Metaspace: replacement must be one character");
    memcpy(repl, r, n);
    repl[n] = 0;
    *repl_len = n;
    const char *s = tok_jstr(j, "prepend_scheme", NULL);
    if (s && !strcmp(s, "first"))
        *ps = TOK_PREPEND_FIRST;
    else if (s && !strcmp(s, "never"))
        *ps = TOK_PREPEND_NEVER;
    else if (s)
        *ps = TOK_PREPEND_ALWAYS;
    else
        *ps = tok_jbool(j, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    return CAIRN_OK;
}

static const char tok_gpt2_re[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int tok_parse_pretok(json_t *j, struct tok_pretok *p, int depth, struct cairn_err *err)
{
    memset(p, 0, sizeof(*p));
    const char *type = tok_jstr(j, "type", NULL);
    if (!type || depth > TOK_MAX_DEPTH)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "pre_tokenizer: missing type");
    if (!strcmp(type, "Sequence")) {
        p->type = TOK_PRE_SEQUENCE;
        json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "pre_tokenizer Sequence: no pretokenizers");
        size_t n = json_array_size(a);
        p->kids = calloc(n ? n : 1, sizeof(*p->kids));
        if (!p->kids) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            p->n_kids++;
            int st = tok_parse_pretok(json_array_get(a, i), &p->kids[i], depth + 1, err);
            if (st) return st;
        }
        return CAIRN_OK;
    }
    if (!strcmp(type, "Split")) {
        p->type = TOK_PRE_SPLIT;
        p->invert = tok_jbool(j, "invert", 0);
        int st = tok_parse_behavior(j, &p->behavior, err);
        if (!st)
            st =
                tok_parse_pattern(json_object_get(j, "pattern"), &p->lit, &p->lit_len, &p->re, err);
        if (st) cairn_err_prefix(err, "pre_tokenizer Split");
        return st;
    }
    if (!strcmp(type, "ByteLevel")) {
        p->type = TOK_PRE_BYTELEVEL;
        p->add_prefix_space = tok_jbool(j, "add_prefix_space", 1);
        p->use_regex = tok_jbool(j, "use_regex", 1);
        if (p->use_regex) return tok_re_compile(&p->re, tok_gpt2_re, sizeof(tok_gpt2_re) - 1, err);
        return CAIRN_OK;
    }
    if (!strcmp(type, "Digits")) {
        p->type = TOK_PRE_DIGITS;
        p->individual = tok_jbool(j, "individual_digits", 0);
        return CAIRN_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        p->type = TOK_PRE_METASPACE;
        p->split = tok_jbool(j, "split", 1);
        return tok_parse_metaspace(j, p->repl, &p->repl_len, &p->prepend, err);
    }
    if (!strcmp(type, "Whitespace")) {
        p->type = TOK_PRE_WHITESPACE;
        return tok_re_compile(&p->re, "\\w+|[^\\w\\s]+", 13, err);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        p->type = TOK_PRE_WHITESPACE_SPLIT;
        return CAIRN_OK;
    }
    if (!strcmp(type, "Punctuation")) {
        p->type = TOK_PRE_PUNCTUATION;
        return tok_parse_behavior(j, &p->behavior, err);
    }
    return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "unsupported pre_tokenizer type '%s'", type);
}

static int tok_parse_dec(json_t *j, struct tok_dec *d, int depth, struct cairn_err *err)
{
    memset(d, 0, sizeof(*d));
    const char *type = tok_jstr(j, "type", NULL);
    if (!type || depth > TOK_MAX_DEPTH)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "decoder: missing type");
    if (!strcmp(type, "Sequence")) {
        d->type = TOK_DEC_SEQUENCE;
        json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "decoder Sequence: no decoders");
        size_t n = json_array_size(a);
        d->kids = calloc(n ? n : 1, sizeof(*d->kids));
        if (!d->kids) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            d->n_kids++;
            int st = tok_parse_dec(json_array_get(a, i), &d->kids[i], depth + 1, err);
            if (st) return st;
        }
        return CAIRN_OK;
    }
    if (!strcmp(type, "ByteLevel"))
        d->type = TOK_DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback"))
        d->type = TOK_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse"))
        d->type = TOK_DEC_FUSE;
    else if (!strcmp(type, "Strip")) {
        size_t n;
        const char *c = tok_jstr(j, "content", &n);
        json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        if (!c || !n || n > 4 || tok_utf8_len((uint8_t)c[0]) != n || !json_is_integer(a) ||
            !json_is_integer(b) || json_integer_value(a) < 0 || json_integer_value(b) < 0 ||
            json_integer_value(a) > 1000000 || json_integer_value(b) > 1000000)
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "decoder Strip: bad content/start/stop");
        d->type = TOK_DEC_STRIP;
        d->content = tok_strndup(c, n);
        d->content_len = n;
        d->start = (int)json_integer_value(a);
        d->stop = (int)json_integer_value(b);
        if (!d->content) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    } else if (!strcmp(type, "Replace")) {
        size_t n;
        const char *c = tok_jstr(j, "content", &n);
        if (!c) return cairn_err_set(err, CAIRN_ERR_FORMAT, "decoder Replace: no content");
        d->type = TOK_DEC_REPLACE;
        d->content = tok_strndup(c, n);
        d->content_len = n;
        if (!d->content) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        int st =
            tok_parse_pattern(json_object_get(j, "pattern"), &d->pat, &d->pat_len, &d->re, err);
        if (st) cairn_err_prefix(err, "decoder Replace");
        return st;
    } else if (!strcmp(type, "Metaspace")) {
        enum tok_prepend_scheme ps;
        d->type = TOK_DEC_METASPACE;
        int st = tok_parse_metaspace(j, d->repl, &d->repl_len, &ps, err);
        d->strip_first = ps != TOK_PREPEND_NEVER;
        return st;
    } else {
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "unsupported decoder type '%s'", type);
    }
    return CAIRN_OK;
}

/* Streaming holdback rules from the decoder tree. */
static void tok_dec_scan(struct tok *t, const struct tok_dec *d)
{
    if (d->type == TOK_DEC_BYTELEVEL || d->type == TOK_DEC_BYTEFALLBACK) t->dec_has_bytes = 1;
    if (d->type == TOK_DEC_STRIP && d->stop > 0) {
        memcpy(t->strip_tail, d->content, d->content_len);
        t->strip_tail_len = d->content_len;
        t->strip_tail_n = d->stop;
    }
    for (int k = 0; k < d->n_kids; k++)
        tok_dec_scan(t, &d->kids[k]);
}

/* Sets t->post_single from a post_processor; composes Sequence members. */
static int tok_parse_post(struct tok *t, json_t *j, int depth, struct cairn_err *err)
{
    const char *type = tok_jstr(j, "type", NULL);
    if (!type || depth > TOK_MAX_DEPTH)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "post_processor: missing type");
    if (!strcmp(type, "ByteLevel")) return CAIRN_OK;
    if (!strcmp(type, "Sequence")) {
        json_t *a = json_object_get(j, "processors");
        if (!json_is_array(a))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "post_processor Sequence: no processors");
        for (size_t i = 0; i < json_array_size(a); i++) {
            int st = tok_parse_post(t, json_array_get(a, i), depth + 1, err);
            if (st) return st;
        }
        return CAIRN_OK;
    }
    int32_t tmpl[64];
    int n = 0;
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(j, "single"), *sp = json_object_get(j, "special_tokens");
        if (!json_is_array(single))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "TemplateProcessing: no single");
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i), *x;
            if ((x = json_object_get(it, "Sequence"))) {
                if (n >= 64)
                    return cairn_err_set(err, CAIRN_ERR_LIMIT, "TemplateProcessing: too long");
                tmpl[n++] = -1;
            } else if ((x = json_object_get(it, "SpecialToken"))) {
                const char *name = tok_jstr(x, "id", NULL);
                json_t *e = name ? json_object_get(sp, name) : NULL;
                json_t *ids = json_object_get(e, "ids");
                if (!json_is_array(ids))
                    return cairn_err_set(err, CAIRN_ERR_FORMAT,
                                         "TemplateProcessing: special token '%s' has no ids",
                                         name ? name : "?");
                for (size_t k = 0; k < json_array_size(ids); k++) {
                    json_t *v = json_array_get(ids, k);
                    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                        json_integer_value(v) >= TOK_MAX_ID)
                        return cairn_err_set(err, CAIRN_ERR_FORMAT, "TemplateProcessing: bad id");
                    if (n >= 64)
                        return cairn_err_set(err, CAIRN_ERR_LIMIT, "TemplateProcessing: too long");
                    tmpl[n++] = (int32_t)json_integer_value(v);
                }
            } else {
                return cairn_err_set(err, CAIRN_ERR_FORMAT, "TemplateProcessing: bad item");
            }
        }
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        json_t *c = json_array_get(cls, 1), *s = json_array_get(sep, 1);
        if (!json_is_integer(c) || !json_is_integer(s) || json_integer_value(c) < 0 ||
            json_integer_value(s) < 0 || json_integer_value(c) >= TOK_MAX_ID ||
            json_integer_value(s) >= TOK_MAX_ID)
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: bad cls/sep", type);
        tmpl[n++] = (int32_t)json_integer_value(c);
        tmpl[n++] = -1;
        tmpl[n++] = (int32_t)json_integer_value(s);
    } else {
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "unsupported post_processor type '%s'",
                             type);
    }
    /* compose: the new template wraps the current one */
    int32_t out[128];
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (tmpl[i] != -1) {
            out[m++] = tmpl[i];
            continue;
        }
        if (!t->has_post) {
            out[m++] = -1;
            continue;
        }
        for (int k = 0; k < t->n_post_single && m < 127; k++)
            out[m++] = t->post_single[k];
    }
    free(t->post_single);
    t->post_single = malloc(sizeof(int32_t) * (size_t)(m ? m : 1));
    if (!t->post_single) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    memcpy(t->post_single, out, sizeof(int32_t) * (size_t)m);
    t->n_post_single = m;
    t->has_post = 1;
    return CAIRN_OK;
}

/* Builds the added-token trie for the tokens with normalized == want. */
static int tok_trie_build(struct tok *t, struct tok_trie *tr, int want)
{
    memset(tr, 0, sizeof(*tr));
    if (tok_qmap_init(&tr->edges, 64)) return CAIRN_ERR_NOMEM;
    tr->cap_nodes = 64;
    tr->term = malloc(tr->cap_nodes * sizeof(int32_t));
    if (!tr->term) return CAIRN_ERR_NOMEM;
    tr->term[0] = -1;
    tr->n_nodes = 1;
    for (int a = 0; a < t->n_added; a++) {
        struct tok_added *ad = &t->added[a];
        if (ad->normalized != want || !ad->match_len) continue;
        uint32_t node = 0;
        tr->first[(uint8_t)ad->match[0]] = 1;
        for (size_t i = 0; i < ad->match_len; i++) {
            uint64_t key = ((uint64_t)node << 8) | (uint8_t)ad->match[i], v;
            if (tok_qmap_get(&tr->edges, key, &v)) {
                node = (uint32_t)v;
                continue;
            }
            if (tr->n_nodes == tr->cap_nodes) {
                int32_t *nt = realloc(tr->term, tr->cap_nodes * 2 * sizeof(int32_t));
                if (!nt) return CAIRN_ERR_NOMEM;
                tr->term = nt;
                tr->cap_nodes *= 2;
            }
            tr->term[tr->n_nodes] = -1;
            if (tok_qmap_put(&tr->edges, key, tr->n_nodes)) return CAIRN_ERR_NOMEM;
            node = tr->n_nodes++;
        }
        tr->term[node] = a; /* a later duplicate wins, as HF's map does */
    }
    return CAIRN_OK;
}

static int tok_set_piece_table(struct tok *t, int32_t n_vocab, json_t *vocab, struct cairn_err *err)
{
    t->n_vocab = n_vocab;
    t->piece_off = calloc((size_t)n_vocab + 1, sizeof(uint64_t));
    t->piece_len = calloc((size_t)n_vocab + 1, sizeof(uint32_t));
    t->special = calloc((size_t)n_vocab + 1, 1);
    t->is_added = calloc((size_t)n_vocab + 1, 1);
    t->id_byte = calloc((size_t)n_vocab + 1, sizeof(uint16_t));
    if (!t->piece_off || !t->piece_len || !t->special || !t->is_added || !t->id_byte)
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory for %d pieces", n_vocab);
    for (int32_t i = 0; i <= n_vocab; i++)
        t->piece_off[i] = UINT64_MAX;
    if (tok_buf_put(&t->pieces, "", 0)) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        size_t n = strlen(key);
        t->piece_off[id] = t->pieces.n;
        t->piece_len[id] = (uint32_t)n;
        if (tok_buf_put(&t->pieces, key, n) || tok_buf_put(&t->pieces, "\0", 1))
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    for (int a = 0; a < t->n_added; a++) {
        struct tok_added *ad = &t->added[a];
        t->piece_off[ad->id] = t->pieces.n;
        t->piece_len[ad->id] = (uint32_t)ad->len;
        if (tok_buf_put(&t->pieces, ad->content, ad->len) || tok_buf_put(&t->pieces, "\0", 1))
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        t->is_added[ad->id] = 1;
        t->special[ad->id] = ad->special;
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        if (t->piece_off[i] == UINT64_MAX) continue;
        int b = tok_byte_piece(t->pieces.p + t->piece_off[i], t->piece_len[i]);
        if (b >= 0) t->id_byte[i] = (uint16_t)(b + 1);
    }
    return CAIRN_OK;
}

static int tok_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int tok_parse_model(struct tok *t, json_t *m, int32_t *max_id, struct cairn_err *err)
{
    const char *type = tok_jstr(m, "type", NULL);
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (type && strcmp(type, "BPE"))
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                             "model type '%s' is not supported (BPE only)", type);
    if (!json_is_object(vocab))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "model.vocab is not an object");
    if (merges && !json_is_array(merges))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "model.merges is not a list");
    t->byte_fallback = tok_jbool(m, "byte_fallback", 0);
    t->fuse_unk = tok_jbool(m, "fuse_unk", 0);
    t->ignore_merges = tok_jbool(m, "ignore_merges", 0);
    size_t n;
    const char *s;
    if ((s = tok_jstr(m, "continuing_subword_prefix", &n)) && n) {
        t->cont_prefix = tok_strndup(s, n);
        t->cont_prefix_len = n;
    }
    if ((s = tok_jstr(m, "end_of_word_suffix", &n)) && n) {
        t->eow_suffix = tok_strndup(s, n);
        t->eow_suffix_len = n;
    }
    if (tok_smap_init(&t->model_vocab, (uint32_t)json_object_size(vocab)))
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
            return cairn_err_set(err, CAIRN_ERR_FORMAT,
                                 "model.vocab['%.40s']: id must be in [0, %d)", key, TOK_MAX_ID);
        int32_t id = (int32_t)json_integer_value(v);
        if (id > *max_id) *max_id = id;
        if (tok_smap_put(&t->model_vocab, key, strlen(key), id))
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    /* where SentencePiece-style words may be cut (see tok_int.h) */
    t->sp_split = !t->ignore_merges && !t->cont_prefix && !t->eow_suffix &&
                  tok_smap_get(&t->model_vocab, "\xe2\x96\x81", 3) >= 0;
    for (uint32_t e = 0; t->sp_split && e < t->model_vocab.n; e++) {
        const char *k = t->model_vocab.arena.p + t->model_vocab.key_off[e];
        size_t kl = t->model_vocab.key_len[e];
        for (const char *f = k; (f = memmem(f, kl - (size_t)(f - k), "\xe2\x96\x81", 3)); f += 3) {
            if (f == k) continue;
            size_t at = (size_t)(f - k) - 1;
            while (at > 0 && ((uint8_t)k[at] & 0xc0) == 0x80)
                at--;
            uint32_t cp;
            tok_utf8_get(k, kl, at, &cp);
            if (cp == 0x2581) continue;
            uint32_t *g = realloc(t->sp_glue, (t->n_sp_glue + 1) * sizeof(uint32_t));
            if (!g) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            t->sp_glue = g;
            t->sp_glue[t->n_sp_glue++] = cp;
        }
    }
    if (t->n_sp_glue) qsort(t->sp_glue, t->n_sp_glue, sizeof(uint32_t), tok_cmp_u32);
    t->unk_id = -1;
    if ((s = tok_jstr(m, "unk_token", &n))) t->unk_id = tok_smap_get(&t->model_vocab, s, n);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        t->byte_ids[b] = tok_smap_get(&t->model_vocab, name, 6);
    }
    size_t nm = merges ? json_array_size(merges) : 0;
    if (tok_qmap_init(&t->merges, (uint32_t)nm + 1))
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    struct tok_buf cat = {0};
    int st = CAIRN_OK;
    for (size_t i = 0; i < nm && !st; i++) {
        json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(e)) {
            a = json_string_value(e);
            const char *sp = memchr(a, ' ', json_string_length(e));
            if (!sp) {
                st = cairn_err_set(err, CAIRN_ERR_FORMAT, "model.merges[%zu]: expected \"a b\"", i);
                break;
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = json_string_length(e) - al - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bl = json_string_length(json_array_get(e, 1));
        } else {
            st = cairn_err_set(err, CAIRN_ERR_FORMAT,
                               "model.merges[%zu]: expected \"a b\" or [a, b]", i);
            break;
        }
        int32_t ia = tok_smap_get(&t->model_vocab, a, al),
                ib = tok_smap_get(&t->model_vocab, b, bl);
        size_t skip = (t->cont_prefix && bl >= t->cont_prefix_len &&
                       !memcmp(b, t->cont_prefix, t->cont_prefix_len))
                          ? t->cont_prefix_len
                          : 0;
        cat.n = 0;
        if (tok_buf_put(&cat, a, al) || tok_buf_put(&cat, b + skip, bl - skip)) {
            st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            break;
        }
        int32_t ic = tok_smap_get(&t->model_vocab, cat.p, cat.n);
        if (ia < 0 || ib < 0 || ic < 0) {
            st = cairn_err_set(err, CAIRN_ERR_FORMAT, "model.merges[%zu]: token not in vocab", i);
            break;
        }
        if (tok_qmap_put(&t->merges, ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib,
                         ((uint64_t)i << 32) | (uint32_t)ic))
            st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    tok_buf_free(&cat);
    return st;
}

static int tok_parse_added(struct tok *t, json_t *arr, int32_t *max_id, struct cairn_err *err)
{
    if (!arr || json_is_null(arr)) return CAIRN_OK;
    if (!json_is_array(arr))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "added_tokens is not a list");
    size_t n = json_array_size(arr);
    t->added = calloc(n ? n : 1, sizeof(*t->added));
    if (!t->added) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    if (tok_smap_init(&t->added_map, (uint32_t)n))
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i), *id = json_object_get(e, "id");
        size_t len;
        const char *c = tok_jstr(e, "content", &len);
        if (!c || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= TOK_MAX_ID)
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "added_tokens[%zu]: needs content and id",
                                 i);
        if (memchr(c, 0, len))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "added_tokens[%zu]: NUL in content", i);
        struct tok_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        if (a->id > *max_id) *max_id = a->id;
        a->content = tok_strndup(c, len);
        a->len = len;
        if (!a->content) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        a->special = (uint8_t)tok_jbool(e, "special", 0);
        a->lstrip = (uint8_t)tok_jbool(e, "lstrip", 0);
        a->rstrip = (uint8_t)tok_jbool(e, "rstrip", 0);
        a->single_word = (uint8_t)tok_jbool(e, "single_word", 0);
        a->normalized = (uint8_t)tok_jbool(e, "normalized", !a->special);
        if (tok_smap_put(&t->added_map, c, len, a->id))
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    return CAIRN_OK;
}

int tok_parse(struct tok *t, const char *json, size_t len, struct cairn_err *err)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    int st = CAIRN_OK;
    int32_t max_id = -1;
    tok_bytelevel_init();
    t->unk_id = t->bos_id = t->eos_id = -1;
    if (!root || !json_is_object(root)) {
        st = cairn_err_set(err, CAIRN_ERR_FORMAT, "tokenizer.json: %s (line %d)",
                           root ? "not an object" : je.text, je.line);
        goto cleanup;
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        st = cairn_err_set(err, CAIRN_ERR_FORMAT, "tokenizer.json: no model");
        goto cleanup;
    }
    if ((st = tok_parse_model(t, model, &max_id, err))) goto cleanup;
    if ((st = tok_parse_added(t, json_object_get(root, "added_tokens"), &max_id, err)))
        goto cleanup;
    if ((st = tok_set_piece_table(t, max_id + 1, json_object_get(model, "vocab"), err)))
        goto cleanup;
    json_t *j;
    if ((j = json_object_get(root, "normalizer")) && !json_is_null(j)) {
        t->norm = calloc(1, sizeof(*t->norm));
        if (!t->norm) {
            st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        if ((st = tok_parse_norm(j, t->norm, 0, err))) goto cleanup;
    }
    if ((j = json_object_get(root, "pre_tokenizer")) && !json_is_null(j)) {
        t->pretok = calloc(1, sizeof(*t->pretok));
        if (!t->pretok) {
            st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        if ((st = tok_parse_pretok(j, t->pretok, 0, err))) goto cleanup;
    }
    if ((j = json_object_get(root, "post_processor")) && !json_is_null(j))
        if ((st = tok_parse_post(t, j, 0, err))) goto cleanup;
    if ((j = json_object_get(root, "decoder")) && !json_is_null(j)) {
        t->dec = calloc(1, sizeof(*t->dec));
        if (!t->dec) {
            st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        if ((st = tok_parse_dec(j, t->dec, 0, err))) goto cleanup;
        tok_dec_scan(t, t->dec);
    }
    for (int k = 0; k < t->n_post_single; k++)
        if (t->post_single[k] >= t->n_vocab) {
            st = cairn_err_set(err, CAIRN_ERR_FORMAT, "post_processor: id %d out of vocab",
                               t->post_single[k]);
            goto cleanup;
        }
    /* what each added token is matched as: normalized ones through the normalizer */
    {
        struct tok_buf a = {0}, b = {0};
        pcre2_match_data *md = pcre2_match_data_create(8, NULL);
        for (int k = 0; k < t->n_added && !st; k++) {
            struct tok_added *ad = &t->added[k];
            if (ad->normalized && t->norm) {
                st = tok_norm_apply(t->norm, md, ad->content, ad->len, &a, &b);
                if (!st && !(ad->match = tok_strndup(a.p ? a.p : "", a.n))) st = CAIRN_ERR_NOMEM;
                ad->match_len = a.n;
            } else {
                ad->match = ad->content;
                ad->match_len = ad->len;
            }
        }
        pcre2_match_data_free(md);
        tok_buf_free(&a);
        tok_buf_free(&b);
        if (st) {
            cairn_err_set(err, st, "normalizing added tokens failed");
            goto cleanup;
        }
    }
    if (tok_trie_build(t, &t->trie_raw, 0) || tok_trie_build(t, &t->trie_norm, 1)) {
        st = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
cleanup:
    json_decref(root);
    return st;
}

/* ---- config ---- */

static char *tok_token_field(json_t *v)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return NULL;
    return tok_strndup(json_string_value(v), json_string_length(v));
}

static char *tok_template_field(json_t *v)
{
    if (json_is_string(v)) return tok_strndup(json_string_value(v), json_string_length(v));
    if (!json_is_array(v)) return NULL;
    json_t *pick = NULL;
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        const char *name = tok_jstr(e, "name", NULL);
        if (!pick && json_is_string(json_object_get(e, "template"))) pick = e;
        if (name && !strcmp(name, "default") && json_is_string(json_object_get(e, "template"))) {
            pick = e;
            break;
        }
    }
    return pick ? tok_template_field(json_object_get(pick, "template")) : NULL;
}

static int tok_load_config(struct tok *t, const char *path, struct cairn_err *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: %s (line %d)", path,
                             root ? "not an object" : je.text, je.line);
    }
    t->bos_token = tok_token_field(json_object_get(root, "bos_token"));
    t->eos_token = tok_token_field(json_object_get(root, "eos_token"));
    t->add_bos = tok_jbool(root, "add_bos_token", 0);
    t->chat_template = tok_template_field(json_object_get(root, "chat_template"));
    json_decref(root);
    return CAIRN_OK;
}

static int tok_load_template(struct tok *t, const char *path, struct cairn_err *err)
{
    size_t n = strlen(path);
    char *text = NULL;
    size_t len;
    int st = cairn_file_read_all(path, 64u << 20, &text, &len, err);
    if (st) return st;
    free(t->chat_template);
    t->chat_template = NULL;
    if (n >= 5 && !strcmp(path + n - 5, ".json")) {
        json_error_t je;
        json_t *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
        t->chat_template = tok_template_field(json_object_get(root, "chat_template"));
        json_decref(root);
        free(text);
        if (!t->chat_template)
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: no chat_template", path);
        return CAIRN_OK;
    }
    t->chat_template = text;
    return CAIRN_OK;
}

int tok_load_json(const char *json, size_t len, struct tok **out, struct cairn_err *err)
{
    *out = NULL;
    struct tok *t = calloc(1, sizeof(*t));
    if (!t) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    int st = tok_parse(t, json, len, err);
    if (st) {
        tok_free(t);
        return st;
    }
    *out = t;
    return CAIRN_OK;
}

int tok_load_files(const char *json_path, const char *config_path, const char *template_path,
                   struct tok **out, struct cairn_err *err)
{
    char *text = NULL;
    size_t len;
    *out = NULL;
    int st = cairn_file_read_all(json_path, 1u << 30, &text, &len, err);
    if (st) return st;
    struct tok *t = NULL;
    st = tok_load_json(text, len, &t, err);
    free(text);
    if (st) {
        cairn_err_prefix(err, "%s", json_path);
        return st;
    }
    if (config_path && (st = tok_load_config(t, config_path, err))) goto fail;
    if (template_path && (st = tok_load_template(t, template_path, err))) goto fail;
    if (t->bos_token) t->bos_id = tok_piece_to_id(t, t->bos_token);
    if (t->eos_token) t->eos_id = tok_piece_to_id(t, t->eos_token);
    *out = t;
    return CAIRN_OK;
fail:
    tok_free(t);
    return st;
}

int tok_load(const char *dir, struct tok **out, struct cairn_err *err)
{
    char pj[4096], pc[4096], pt[4096];
    snprintf(pj, sizeof(pj), "%s/tokenizer.json", dir);
    snprintf(pc, sizeof(pc), "%s/tokenizer_config.json", dir);
    const char *tmpl = NULL;
    snprintf(pt, sizeof(pt), "%s/chat_template.jinja", dir);
    if (cairn_file_exists(pt))
        tmpl = pt;
    else {
        snprintf(pt, sizeof(pt), "%s/chat_template.json", dir);
        if (cairn_file_exists(pt)) tmpl = pt;
    }
    if (!cairn_file_exists(pj))
        return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "%s: no such file", pj);
    return tok_load_files(pj, cairn_file_exists(pc) ? pc : NULL, tmpl, out, err);
}

static void tok_trie_free(struct tok_trie *tr)
{
    tok_qmap_free(&tr->edges);
    free(tr->term);
}

void tok_free(struct tok *t)
{
    if (!t) return;
    free(t->piece_off);
    free(t->piece_len);
    tok_buf_free(&t->pieces);
    free(t->special);
    free(t->is_added);
    free(t->id_byte);
    tok_smap_free(&t->model_vocab);
    tok_smap_free(&t->added_map);
    tok_qmap_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->sp_glue);
    for (int a = 0; a < t->n_added; a++) {
        if (t->added[a].match != t->added[a].content) free(t->added[a].match);
        free(t->added[a].content);
    }
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    if (t->norm) tok_norm_free(t->norm);
    free(t->norm);
    if (t->pretok) tok_pretok_free(t->pretok);
    free(t->pretok);
    if (t->dec) tok_dec_free(t->dec);
    free(t->dec);
    free(t->post_single);
    free(t->bos_token);
    free(t->eos_token);
    free(t->chat_template);
    free(t);
}

/* ---- accessors ---- */

int tok_vocab_size(const struct tok *t)
{
    return t->n_vocab;
}

int32_t tok_piece_to_id(const struct tok *t, const char *piece)
{
    size_t n = strlen(piece);
    int32_t id = tok_smap_get(&t->added_map, piece, n);
    return id >= 0 ? id : tok_smap_get(&t->model_vocab, piece, n);
}

const char *tok_id_to_piece(const struct tok *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab || t->piece_off[id] == UINT64_MAX) return NULL;
    return t->pieces.p + t->piece_off[id];
}

int tok_is_special(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->special[id];
}

const char *tok_bos_token(const struct tok *t)
{
    return t->bos_token;
}

const char *tok_eos_token(const struct tok *t)
{
    return t->eos_token;
}

int32_t tok_bos_id(const struct tok *t)
{
    return t->bos_id;
}

int32_t tok_eos_id(const struct tok *t)
{
    return t->eos_id;
}

const char *tok_chat_template(const struct tok *t)
{
    return t->chat_template;
}

int tok_add_bos(const struct tok *t)
{
    return t->add_bos;
}
