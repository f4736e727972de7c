/* tok loader: tokenizer.json's model (vocab, merges), added tokens and their tries, then the
 * pipeline parts (tok_load_parts.c), and tokenizer_config.json (bos/eos, add_bos_token).
 * Every malformed or unsupported field is an error naming the field (the fuzzer feeds this). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "tok/tok_int.h"


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
    if (cairn_buf_put(&t->pieces, "", 0)) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        size_t n = strlen(key);
        t->piece_off[id] = t->pieces.n;
        t->piece_len[id] = (uint32_t)n;
        if (cairn_buf_put(&t->pieces, key, n) || cairn_buf_put(&t->pieces, "\0", 1))
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    for (int a = 0; a < t->n_added; a++) {
        struct tok_added *ad = &t->added[a];
        t->piece_off[ad->id] = t->pieces.n;
        t->piece_len[ad->id] = (uint32_t)ad->len;
        if (cairn_buf_put(&t->pieces, ad->content, ad->len) || cairn_buf_put(&t->pieces, "\0", 1))
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
            cairn_utf8_get(k, kl, at, &cp);
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
    struct cairn_buf cat = {0};
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
        if (cairn_buf_put(&cat, a, al) || cairn_buf_put(&cat, b + skip, bl - skip)) {
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
    cairn_buf_free(&cat);
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
        struct cairn_buf a = {0}, b = {0};
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
        cairn_buf_free(&a);
        cairn_buf_free(&b);
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
    json_decref(root);
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

/* tokenizer.json at json_path, plus tokenizer_config.json at config_path (may be NULL) */
static int tok_load_files(const char *json_path, const char *config_path, struct tok **out,
                          struct cairn_err *err)
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
    char pj[4096], pc[4096];
    snprintf(pj, sizeof(pj), "%s/tokenizer.json", dir);
    snprintf(pc, sizeof(pc), "%s/tokenizer_config.json", dir);
    if (!cairn_file_exists(pj))
        return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "%s: no such file", pj);
    return tok_load_files(pj, cairn_file_exists(pc) ? pc : NULL, out, err);
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
    cairn_buf_free(&t->pieces);
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
    free(t);
}

