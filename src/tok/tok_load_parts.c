/* tok pipeline parts of tokenizer.json: normalizer, pre-tokenizer, decoder and post-processor
 * trees (each Sequence nested at most TOK_MAX_DEPTH deep), and the streaming holdback rules
 * read from the decoder tree. Called by tok_parse (tok_load.c). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok_int.h"

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

int tok_parse_norm(json_t *j, struct tok_norm *nm, int depth, struct cairn_err *err)
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
    if (n == 0 || n > 4 || cairn_utf8_seq_len((uint8_t)r[0]) != n)
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

int tok_parse_pretok(json_t *j, struct tok_pretok *p, int depth, struct cairn_err *err)
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

int tok_parse_dec(json_t *j, struct tok_dec *d, int depth, struct cairn_err *err)
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
        if (!c || !n || n > 4 || cairn_utf8_seq_len((uint8_t)c[0]) != n || !json_is_integer(a) ||
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
void tok_dec_scan(struct tok *t, const struct tok_dec *d)
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
int tok_parse_post(struct tok *t, json_t *j, int depth, struct cairn_err *err)
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
