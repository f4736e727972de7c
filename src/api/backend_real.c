/* The real backend: struct api_backend over the model pool (api/pool.h: loads on the pool's own
 * thread, the memory guard, LRU/TTL unloads, settings), the tokenizer (tok) and the chat
 * template (tmpl).
 *
 * A load never blocks an HTTP thread nor requests to other models: get_model waits on the
 * calling API thread for that model's load only. Settings reach requests here: sampling
 * defaults (request > model entry > global > generation_config.json) and chat_template_kwargs
 * (the request's keys win). */
#include "api/api_backend.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/pool.h"
#include "base/log.h"

static int real_list(void *ctx, struct api_model_desc *out, int max)
{
    struct pool *p = ctx;
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_models; i++) {
        struct pool_model *m = &p->models[i];
        if (m->gone) continue; /* its folder went away (pool_rescan) */
        if (n < max) {
            memset(&out[n], 0, sizeof(out[n]));
            snprintf(out[n].id, sizeof(out[n].id), "%s", m->id);
            out[n].created = m->created;
            out[n].loaded = m->state == POOL_LOADED;
            out[n].context_length = m->state == POOL_LOADED ? m->context_length : 0;
            out[n].failed = pool_model_failure(p, i, out[n].failure, sizeof(out[n].failure));
        }
        n++;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

static int real_get(void *ctx, const char *id, int *idx, struct cairn_err *err)
{
    struct pool *p = ctx;
    int i = pool_find(p, id);
    if (i < 0) return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "model '%s' not found", id);
    int rc = pool_get(p, i, err);
    if (rc == CAIRN_OK) *idx = i;
    return rc == CAIRN_ERR_NOT_FOUND ? CAIRN_ERR_IO : rc; /* NOT_FOUND means "no such id" */
}

static int real_peek(void *ctx, const char *id, int *idx)
{
    struct pool *p = ctx;
    int i = pool_find(p, id);
    if (i < 0) return 0;
    pthread_mutex_lock(&p->mu);
    int loaded = p->models[i].state == POOL_LOADED;
    if (loaded) p->models[i].n_users++; /* a peek does not count as use (last_used unchanged) */
    pthread_mutex_unlock(&p->mu);
    if (loaded) *idx = i;
    return loaded;
}

static void real_put(void *ctx, int idx)
{
    pool_put(ctx, idx);
}

static int real_ctx_len(void *ctx, int idx)
{
    return ((struct pool *)ctx)->models[idx].context_length;
}

/* A number setting into *dst when the request left it out. Under pool->mu. */
static int real_setting_num(struct pool *p, int idx, const char *key, double *dst)
{
    json_t *v = pool_setting(p, idx, key);
    if (!json_is_number(v)) return 0;
    *dst = json_number_value(v);
    return 1;
}

/* The sampling defaults a request may leave out: the bit of MODEL_GEN_* it is, its settings key,
 * and where it lives in engine_sampling and in generation_config.json's defaults (top_k is the
 * one int). */
static const struct real_gen_field {
    unsigned bit;
    const char *key;
    size_t s_off, g_off;
    int is_int;
} real_gen_fields[] = {
    {MODEL_GEN_TEMPERATURE, "temperature", offsetof(struct engine_sampling, temperature),
     offsetof(struct model_gen_defaults, temperature), 0},
    {MODEL_GEN_TOP_P, "top_p", offsetof(struct engine_sampling, top_p), offsetof(struct model_gen_defaults, top_p), 0},
    {MODEL_GEN_TOP_K, "top_k", offsetof(struct engine_sampling, top_k), offsetof(struct model_gen_defaults, top_k), 1},
    {MODEL_GEN_MIN_P, "min_p", offsetof(struct engine_sampling, min_p), offsetof(struct model_gen_defaults, min_p), 0},
    {MODEL_GEN_REPETITION_PENALTY, "repetition_penalty", offsetof(struct engine_sampling, repetition_penalty),
     offsetof(struct model_gen_defaults, repetition_penalty), 0},
};

static void real_gen_store(const struct real_gen_field *f, struct engine_sampling *s, double v)
{
    char *dst = (char *)s + f->s_off;
    if (f->is_int) *(int *)(void *)dst = (int)v;
    else *(float *)(void *)dst = (float)v;
}

static void real_sampling_defaults(void *ctx, int idx, struct engine_sampling *s, unsigned given)
{
    struct pool *p = ctx;
    const struct model_gen_defaults *g = &pool_model_info(&p->models[idx])->gen;
    unsigned from_gen = g->has & ~given;
    double v;
    pthread_mutex_lock(&p->mu);
    /* the settings file first: per model, then global; then generation_config.json */
    for (size_t i = 0; i < sizeof(real_gen_fields) / sizeof(real_gen_fields[0]); i++) {
        const struct real_gen_field *f = &real_gen_fields[i];
        if (!(given & f->bit) && real_setting_num(p, idx, f->key, &v)) {
            real_gen_store(f, s, v);
            from_gen &= ~f->bit;
        }
    }
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < sizeof(real_gen_fields) / sizeof(real_gen_fields[0]); i++) {
        const struct real_gen_field *f = &real_gen_fields[i];
        if (!(from_gen & f->bit)) continue;
        const char *src = (const char *)g + f->g_off;
        real_gen_store(f, s, f->is_int ? (double)*(const int *)(const void *)src : (double)*(const float *)(const void *)src);
    }
}

/* The chat-template kwargs of a render: the model's chat_template_kwargs setting with the
 * request's kwargs over it (a new reference), or NULL when there is no setting (use kwargs as
 * they are). *special_in_content (if asked): the special_tokens_in_content setting. */
static json_t *real_template_kwargs(struct pool *p, int idx, json_t *kwargs, int *special_in_content)
{
    pthread_mutex_lock(&p->mu);
    json_t *set = pool_setting(p, idx, "chat_template_kwargs");
    json_t *merged = json_is_object(set) ? json_deep_copy(set) : NULL;
    if (special_in_content) *special_in_content = json_is_true(pool_setting(p, idx, "special_tokens_in_content"));
    pthread_mutex_unlock(&p->mu);
    if (merged && json_is_object(kwargs)) json_object_update(merged, kwargs);
    return merged;
}

static int real_render(void *ctx, int idx, json_t *messages, json_t *tools, json_t *kwargs,
                       int add_generation_prompt, char **out, struct cairn_err *err)
{
    struct pool *p = ctx;
    struct pool_model *m = &p->models[idx];
    if (!m->tmpl)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model '%s' has no chat template: use /v1/completions", m->id);
    json_t *merged = real_template_kwargs(p, idx, kwargs, NULL);
    size_t len;
    int rc = tmpl_render_chat(m->tmpl, messages, tools, add_generation_prompt, m->bos, m->eos,
                              merged ? merged : kwargs, out, &len, err);
    json_decref(merged);
    return rc;
}

static int real_tokenize(void *ctx, int idx, const char *text, size_t len, int add_special,
                         int32_t **ids, int *n_ids, struct cairn_err *err)
{
    struct pool_model *m = &((struct pool *)ctx)->models[idx];
    size_t n = 0;
    int rc = tok_encode(m->tok, text, len, add_special, ids, &n, err);
    *n_ids = (int)n;
    return rc;
}

/* render_chat + tokenize, with the data spans of the rendered prompt (message contents, tool
 * results: tmpl_render_chat_spans) tokenized as plain text, so a user cannot write control
 * tokens; the `special_tokens_in_content` setting brings back the old behaviour. */
static int real_render_ids(void *ctx, int idx, json_t *messages, json_t *tools, json_t *kwargs,
                           int add_generation_prompt, char **out, int32_t **ids, int *n_ids,
                           struct cairn_err *err)
{
    struct pool *p = ctx;
    struct pool_model *m = &p->models[idx];
    if (!m->tmpl)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model '%s' has no chat template: use /v1/completions", m->id);
    int special_in_content = 0;
    json_t *merged = real_template_kwargs(p, idx, kwargs, &special_in_content);
    size_t len, n_sp = 0, n = 0;
    struct cairn_span *sp = NULL;
    int rc = tmpl_render_chat_spans(m->tmpl, messages, tools, add_generation_prompt, m->bos, m->eos,
                                    merged ? merged : kwargs, out, &len, special_in_content ? NULL : &sp,
                                    &n_sp, err);
    json_decref(merged);
    if (rc == 0) rc = tok_encode_plain(m->tok, *out, len, 0, sp, n_sp, ids, &n, err);
    free(sp);
    *n_ids = (int)n;
    return rc;
}

static int real_token_text(void *ctx, int idx, int32_t id, char *buf, size_t cap)
{
    struct pool_model *m = &((struct pool *)ctx)->models[idx];
    char *s = NULL;
    size_t len = 0;
    if (tok_decode(m->tok, &id, 1, 0, &s, &len, NULL) != 0) return -1;
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
    free(s);
    return (int)n;
}

static int real_submit(void *ctx, int idx, const struct engine_request *req, uint64_t *id,
                       struct cairn_err *err)
{
    return pool_submit(ctx, idx, req, id, err);
}

static const struct grammar_vocab *real_grammar_vocab(void *ctx, int idx, struct cairn_err *err)
{
    struct pool *p = ctx;
    struct pool_model *m = &p->models[idx];
    pthread_mutex_lock(&p->gvocab_mu);
    if (!m->gvocab && m->tok && pool_model_info(m)) {
        uint8_t *blob = NULL;
        const uint8_t **bytes = NULL;
        size_t *lens = NULL;
        const struct model_info *mi = pool_model_info(m);
        if (tok_vocab_bytes(m->tok, &blob, &bytes, &lens, err) == CAIRN_OK) {
            int n = tok_vocab_size(m->tok);
            if (n > mi->vocab_size) n = mi->vocab_size; /* ids past the model's rows never come out */
            grammar_vocab_create(bytes, lens, n, mi->eos_ids, mi->n_eos, &m->gvocab, err);
        }
        free(blob);
        free((void *)bytes);
        free(lens);
    }
    const struct grammar_vocab *v = m->gvocab;
    pthread_mutex_unlock(&p->gvocab_mu);
    return v;
}

static void real_cancel(void *ctx, int idx, uint64_t id)
{
    pool_cancel(ctx, idx, id);
}

static int real_stats(void *ctx, int idx, struct engine_stats *st)
{
    struct pool *p = ctx;
    pthread_mutex_lock(&p->mu);
    int loaded = p->models[idx].state == POOL_LOADED;
    if (loaded) engine_get_stats(p->models[idx].e, st);
    pthread_mutex_unlock(&p->mu);
    return loaded;
}

static int real_tier_stats(void *ctx, int idx, struct kv_tiers_stats *st)
{
    struct pool *p = ctx;
    pthread_mutex_lock(&p->mu);
    struct pool_model *m = &p->models[idx];
    int has = m->state == POOL_LOADED && m->tiers;
    if (has) kv_tiers_stats(m->tiers, st);
    pthread_mutex_unlock(&p->mu);
    return has;
}

static int real_cache_clear(void *ctx, const char *tier, struct cairn_err *err)
{
    struct pool *p = ctx;
    int all = !strcmp(tier, "all");
    const struct kv_tiers_opts *to = p->opts.tiers_opts;
    int has_hot = to && to->hot_max_bytes != 0, has_ssd = to && to->ssd_dir && *to->ssd_dir;
    if (!all && strcmp(tier, "device")) {
        if (strcmp(tier, "hot") && strcmp(tier, "ssd"))
            return cairn_err_set(err, CAIRN_ERR_INVALID, "tier must be device, hot, ssd or all");
        if (!(!strcmp(tier, "hot") ? has_hot : has_ssd))
            return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "the %s tier is not enabled", tier);
    }
    enum kv_tier_which which = all ? KV_TIER_ALL : !strcmp(tier, "hot") ? KV_TIER_HOT : KV_TIER_SSD;
    int device = all || !strcmp(tier, "device");
    for (int i = 0; i < p->n_models; i++) {
        /* a user reference keeps the model loaded while its engine clears (which waits for
         * the scheduler thread: never under pool->mu) */
        pthread_mutex_lock(&p->mu);
        struct pool_model *m = &p->models[i];
        int loaded = m->state == POOL_LOADED;
        if (loaded) m->n_users++;
        pthread_mutex_unlock(&p->mu);
        if (!loaded) continue;
        if (device) engine_cache_clear(m->e); /* device first: its blocks pass through on_evict */
        if (m->tiers && (all || !device)) kv_tiers_clear(m->tiers, which, NULL);
        pool_put(p, i);
    }
    return all ? 1 + has_hot + has_ssd : 1;
}

static void real_destroy(void *ctx)
{
    pool_destroy(ctx);
}

static json_t *real_memory_json(void *ctx)
{
    return pool_memory_json(ctx);
}

static json_t *real_devices_json(void *ctx)
{
    return pool_devices_json(ctx);
}

static json_t *real_admin_models(void *ctx)
{
    struct pool *p = ctx;
    pool_rescan(p, 0, 5.0, NULL, NULL); /* a listing looks at the folder at most every 5 s */
    json_t *arr = json_array();
    int n = __atomic_load_n(&p->n_models, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++)
        if (pool_visible(p, i)) json_array_append_new(arr, pool_model_json(p, i));
    return arr;
}

static int real_admin_rescan(void *ctx, int force, json_t **out, struct cairn_err *err)
{
    struct pool *p = ctx;
    (void)err;
    int added = 0, removed = 0;
    pool_rescan(p, force, 5.0, &added, &removed);
    *out = json_pack("{s:i,s:i,s:o}", "added", added, "removed", removed, "models", real_admin_models(ctx));
    return CAIRN_OK;
}

static int real_admin_pin(struct pool *p, int idx, int pin, struct cairn_err *err)
{
    json_t *changes = NULL;
    char field[200];
    json_t *patch = json_pack("{s:{s:{s:b}}}", "models", p->models[idx].id, "pinned", pin);
    int rc = patch ? pool_settings_put(p, patch, &changes, field, sizeof(field), err)
                   : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    json_decref(patch);
    json_decref(changes);
    return rc;
}

static int real_admin_model(void *ctx, const char *id, const char *action, json_t **out,
                            struct cairn_err *err)
{
    struct pool *p = ctx;
    *out = NULL;
    int idx = pool_find(p, id);
    if (idx < 0) return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "model '%s' not found", id);
    int rc = CAIRN_OK;
    if (!strcmp(action, "load")) rc = pool_load_async(p, idx, err);
    else if (!strcmp(action, "unload")) rc = pool_unload(p, idx, err);
    else if (!strcmp(action, "pin")) rc = real_admin_pin(p, idx, 1, err);
    else if (!strcmp(action, "unpin")) rc = real_admin_pin(p, idx, 0, err);
    else if (strcmp(action, "get")) rc = cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "no action '%s'", action);
    if (rc == CAIRN_OK) *out = pool_model_json(p, idx);
    return rc;
}

static json_t *real_admin_settings_get(void *ctx)
{
    struct pool *p = ctx;
    pthread_mutex_lock(&p->mu);
    json_t *o = json_pack("{s:s?,s:O}", "path", p->settings_ok ? p->settings_path : NULL, "settings", p->settings);
    pthread_mutex_unlock(&p->mu);
    return o;
}

static int real_admin_settings_put(void *ctx, json_t *patch, json_t **out, char *field, size_t cap,
                                   struct cairn_err *err)
{
    return pool_settings_put(ctx, patch, out, field, cap, err);
}

int api_backend_real_create(const struct api_real_opts *opts, struct api_backend *out,
                            struct cairn_err *err)
{
    struct pool *p;
    int rc = pool_create(opts, &p, err);
    if (rc) return rc;
    memset(out, 0, sizeof(*out));
    out->ctx = p;
    out->list_models = real_list;
    out->get_model = real_get;
    out->put_model = real_put;
    out->peek_model = real_peek;
    out->context_length = real_ctx_len;
    out->render_chat = real_render;
    out->tokenize = real_tokenize;
    out->render_chat_ids = real_render_ids;
    out->token_text = real_token_text;
    out->submit = real_submit;
    out->sampling_defaults = real_sampling_defaults;
    out->cancel = real_cancel;
    out->grammar_vocab = real_grammar_vocab;
    out->stats = real_stats;
    out->cache_clear = real_cache_clear;
    out->tier_stats = real_tier_stats;
    out->destroy = real_destroy;
    out->memory_json = real_memory_json;
    out->devices_json = real_devices_json;
    out->admin_models = real_admin_models;
    out->admin_model = real_admin_model;
    out->admin_settings_get = real_admin_settings_get;
    out->admin_settings_put = real_admin_settings_put;
    out->admin_rescan = real_admin_rescan;
    return CAIRN_OK;
}
