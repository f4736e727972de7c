/* The real backend: the model pool over model_load + engine_create, the tokenizer (tok) and the
 * chat template (tmpl), behind struct api_backend.
 *
 * Models are discovered at start (--model-dir: each subfolder with config.json, or one level of
 * org folders; --model: explicit folders) and loaded on first use: get_model takes the model's
 * own lock, so a load blocks only requests for that model (and runs on the API worker, never an
 * HTTP thread). A loaded model is never unloaded while serving.
 *
 * Compiled against the tok/tmpl/engine rooms when their headers are present; until then a stub
 * that says so (the fake backend covers the HTTP/API behaviour meanwhile). */
#include "api/api_backend.h"

#if __has_include("tok/tok.h") && __has_include("tmpl/tmpl.h") && __has_include("engine/sampler.h")
#define API_REAL_BACKEND 1
#endif

#ifdef API_REAL_BACKEND

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/log.h"
#include "model/model.h"
#include "tmpl/tmpl.h"
#include "tok/tok.h"

struct real_model {
    char id[256];
    char dir[1024];
    int64_t created;
    pthread_mutex_t load_mu;   /* held while loading; guards the fields below */
    int loaded;
    struct model *m;
    struct engine *e;
    struct kv_tiers *tiers;    /* hot/SSD tiers of this model, or NULL */
    struct tok *tok;
    struct tmpl *tmpl;         /* NULL: no chat template (completions only) */
    char *bos, *eos;
    int context_length;
    int special_in_content;    /* 1: control-token text in messages becomes control tokens (the
                                  old, injectable behaviour); 0: only the template's markup */
};

struct real {
    struct api_real_opts opts;
    struct real_model *models;
    int n_models, cap_models;
};

static int real_add(struct real *r, const char *id, const char *dir)
{
    char p[1200];
    snprintf(p, sizeof(p), "%s/config.json", dir);
    if (!cairn_file_exists(p)) return 0;
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    if (!cairn_file_exists(p)) {
        LOG_WARN("api", "%s: no tokenizer.json, skipped", dir);
        return 0;
    }
    for (int i = 0; i < r->n_models; i++)
        if (!strcmp(r->models[i].id, id)) {
            LOG_WARN("api", "%s: model id '%s' already taken, skipped", dir, id);
            return 0;
        }
    if (r->n_models == r->cap_models) {
        int cap = r->cap_models ? r->cap_models * 2 : 8;
        struct real_model *m = realloc(r->models, (size_t)cap * sizeof(*m));
        if (!m) return CAIRN_ERR_NOMEM;
        r->models = m;
        r->cap_models = cap;
    }
    struct real_model *m = &r->models[r->n_models++];
    memset(m, 0, sizeof(*m));
    snprintf(m->id, sizeof(m->id), "%s", id);
    snprintf(m->dir, sizeof(m->dir), "%s", dir);
    struct stat st;
    m->created = stat(dir, &st) == 0 ? (int64_t)st.st_mtime : 0;
    pthread_mutex_init(&m->load_mu, NULL);
    return 1;
}

static int real_scan(struct real *r, const char *root)
{
    DIR *d = opendir(root);
    if (!d) return -1;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s", root, de->d_name);
        if (!cairn_dir_exists(p)) continue;
        if (real_add(r, de->d_name, p) > 0) continue;
        DIR *d2 = opendir(p); /* org/name */
        if (!d2) continue;
        struct dirent *e2;
        while ((e2 = readdir(d2))) {
            if (e2->d_name[0] == '.') continue;
            char p2[1400], id[512];
            snprintf(p2, sizeof(p2), "%s/%s", p, e2->d_name);
            snprintf(id, sizeof(id), "%s/%s", de->d_name, e2->d_name);
            if (cairn_dir_exists(p2)) real_add(r, id, p2);
        }
        closedir(d2);
    }
    closedir(d);
    return 0;
}

static int real_list(void *ctx, struct api_model_desc *out, int max)
{
    struct real *r = ctx;
    for (int i = 0; i < r->n_models && i < max; i++) {
        struct real_model *m = &r->models[i];
        memset(&out[i], 0, sizeof(out[i]));
        snprintf(out[i].id, sizeof(out[i].id), "%s", m->id);
        out[i].created = m->created;
        pthread_mutex_lock(&m->load_mu);
        out[i].loaded = m->loaded;
        out[i].context_length = m->context_length;
        pthread_mutex_unlock(&m->load_mu);
    }
    return r->n_models;
}

/* engine_detok over tok's streaming detokenizer */
static void *real_detok_new(void *ctx)
{
    return tok_stream_new((const struct tok *)ctx, 1);
}
static int real_detok_feed(void *s, int32_t id, const char **text, size_t *len)
{
    return tok_stream_feed((struct tok_stream *)s, id, text, len);
}
static int real_detok_flush(void *s, const char **text, size_t *len)
{
    return tok_stream_flush((struct tok_stream *)s, text, len);
}
static void real_detok_free(void *s)
{
    tok_stream_free((struct tok_stream *)s);
}

static void real_unload(struct real_model *m)
{
    if (m->e && m->tiers) engine_cache_clear(m->e); /* device blocks -> tiers, kept on disk */
    if (m->e) engine_destroy(m->e);
    kv_tiers_close(m->tiers); /* after the engine: flushes dirty hot blocks to the SSD */
    m->tiers = NULL;
    if (m->m) model_free(m->m);
    if (m->tok) tok_free(m->tok);
    if (m->tmpl) tmpl_free(m->tmpl);
    free(m->bos);
    free(m->eos);
    m->e = NULL;
    m->m = NULL;
    m->tok = NULL;
    m->tmpl = NULL;
    m->bos = m->eos = NULL;
    m->loaded = 0;
}

static void real_sampling_defaults(void *ctx, int idx, struct engine_sampling *s, unsigned given)
{
    struct real *r = ctx;
    const struct model_gen_defaults *g = &model_get_info(r->models[idx].m)->gen;
    unsigned use = g->has & ~given;
    if (use & MODEL_GEN_TEMPERATURE) s->temperature = g->temperature;
    if (use & MODEL_GEN_TOP_P) s->top_p = g->top_p;
    if (use & MODEL_GEN_TOP_K) s->top_k = g->top_k;
    if (use & MODEL_GEN_MIN_P) s->min_p = g->min_p;
    if (use & MODEL_GEN_REPETITION_PENALTY) s->repetition_penalty = g->repetition_penalty;
}

static int real_load(struct real *r, struct real_model *m, struct cairn_err *err)
{
    double t0 = cairn_now();
    int rc = model_load(m->dir, &m->m, err);
    if (rc == 0) rc = tok_load(m->dir, &m->tok, err);
    if (rc == 0) {
        int trc = tmpl_load_from_dir(m->dir, &m->tmpl, &m->bos, &m->eos, err);
        if (trc == CAIRN_ERR_NOT_FOUND) {
            LOG_WARN("api", "%s: no chat template (only /v1/completions will work)", m->id);
            m->tmpl = NULL;
        } else {
            rc = trc;
        }
    }
    if (rc == 0) {
        struct engine_opts o;
        memset(&o, 0, sizeof(o));
        engine_opts_default(&o);
        if (r->opts.kv_bytes) o.kv_bytes = r->opts.kv_bytes;
        if (r->opts.max_batch_tokens) o.max_batch_tokens = r->opts.max_batch_tokens;
        if (r->opts.max_running) o.max_running = r->opts.max_running;
        if (r->opts.max_waiting) o.max_waiting = r->opts.max_waiting;
        o.detok.ctx = m->tok;
        o.detok.stream_new = real_detok_new;
        o.detok.stream_feed = real_detok_feed;
        o.detok.stream_flush = real_detok_flush;
        o.detok.stream_free = real_detok_free;
        o.tiers = r->opts.tiers;
        if (r->opts.tiers_opts) {
            const struct model_info *mi = model_get_info(m->m);
            struct kv_tiers_opts to = *r->opts.tiers_opts;
            memset(&to.sig, 0, sizeof(to.sig));
            snprintf(to.sig.arch, sizeof(to.sig.arch), "%s", mi->model_type);
            to.sig.n_layers = mi->n_layers;
            to.sig.n_kv_layers = mi->n_kv_layers;
            to.sig.n_kv_heads = mi->n_kv_heads;
            to.sig.head_dim = mi->head_dim;
            to.sig.kv_dtype = o.kv_dtype;
            to.sig.block_size = o.block_size;
            to.sig.state_bytes = mi->state_bytes;
            memcpy(to.sig.identity, mi->identity, 32);
            rc = kv_tiers_open(&to, &m->tiers, err);
            if (rc == 0) o.tiers = kv_tiers_ops(m->tiers);
        }
        if (rc == 0) rc = engine_create(m->m, &o, &m->e, err);
        if (rc == 0) {
            const struct model_info *mi = model_get_info(m->m);
            m->context_length = o.context_length > 0 ? o.context_length : mi->max_position;
        }
    }
    if (rc) {
        cairn_err_prefix(err, "%s", m->dir);
        real_unload(m);
        return rc;
    }
    m->loaded = 1;
    LOG_INFO("api", "loaded %s in %.2f s (context %d)", m->id, cairn_now() - t0, m->context_length);
    return CAIRN_OK;
}

static int real_get(void *ctx, const char *id, int *idx, struct cairn_err *err)
{
    struct real *r = ctx;
    for (int i = 0; i < r->n_models; i++) {
        struct real_model *m = &r->models[i];
        if (strcmp(m->id, id)) continue;
        pthread_mutex_lock(&m->load_mu);
        int rc = m->loaded ? CAIRN_OK : real_load(r, m, err);
        pthread_mutex_unlock(&m->load_mu);
        if (rc == CAIRN_OK) *idx = i;
        return rc == CAIRN_ERR_NOT_FOUND ? CAIRN_ERR_IO : rc; /* NOT_FOUND means "no such id" */
    }
    return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "model '%s' not found", id);
}

static int real_ctx_len(void *ctx, int idx)
{
    return ((struct real *)ctx)->models[idx].context_length;
}

static int real_render(void *ctx, int idx, json_t *messages, json_t *tools, json_t *kwargs,
                       int add_generation_prompt, char **out, struct cairn_err *err)
{
    struct real_model *m = &((struct real *)ctx)->models[idx];
    if (!m->tmpl)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model '%s' has no chat template: use /v1/completions", m->id);
    size_t len;
    return tmpl_render_chat(m->tmpl, messages, tools, add_generation_prompt, m->bos, m->eos, kwargs, out, &len, err);
}

static int real_tokenize(void *ctx, int idx, const char *text, size_t len, int add_special,
                         int32_t **ids, int *n_ids, struct cairn_err *err)
{
    struct real_model *m = &((struct real *)ctx)->models[idx];
    size_t n = 0;
    int rc = tok_encode(m->tok, text, len, add_special, ids, &n, err);
    *n_ids = (int)n;
    return rc;
}

/* render_chat + tokenize, with the data spans of the rendered prompt tokenized as plain text */
static int real_render_ids(void *ctx, int idx, json_t *messages, json_t *tools, json_t *kwargs,
                           int add_generation_prompt, char **out, int32_t **ids, int *n_ids,
                           struct cairn_err *err)
{
    struct real_model *m = &((struct real *)ctx)->models[idx];
    if (!m->tmpl)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model '%s' has no chat template: use /v1/completions", m->id);
    size_t len, n_sp = 0, n = 0;
    struct cairn_span *sp = NULL;
    int rc = tmpl_render_chat_spans(m->tmpl, messages, tools, add_generation_prompt, m->bos, m->eos,
                                    kwargs, out, &len, m->special_in_content ? NULL : &sp, &n_sp, err);
    if (rc == 0) rc = tok_encode_plain(m->tok, *out, len, 0, sp, n_sp, ids, &n, err);
    free(sp);
    *n_ids = (int)n;
    return rc;
}

static int real_token_text(void *ctx, int idx, int32_t id, char *buf, size_t cap)
{
    struct real_model *m = &((struct real *)ctx)->models[idx];
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
    return engine_submit(((struct real *)ctx)->models[idx].e, req, id, err);
}

static void real_cancel(void *ctx, int idx, uint64_t id)
{
    engine_cancel(((struct real *)ctx)->models[idx].e, id);
}

static int real_stats(void *ctx, int idx, struct engine_stats *st)
{
    struct real_model *m = &((struct real *)ctx)->models[idx];
    if (!m->loaded) return 0;
    engine_get_stats(m->e, st);
    return 1;
}

static int real_tier_stats(void *ctx, int idx, struct kv_tiers_stats *st)
{
    struct real_model *m = &((struct real *)ctx)->models[idx];
    if (!m->loaded || !m->tiers) return 0;
    kv_tiers_stats(m->tiers, st);
    return 1;
}

static int real_cache_clear(void *ctx, const char *tier, struct cairn_err *err)
{
    struct real *r = ctx;
    int all = !strcmp(tier, "all"), n = 0;
    const struct kv_tiers_opts *to = r->opts.tiers_opts;
    if (to && (all || !strcmp(tier, "hot") || !strcmp(tier, "ssd"))) {
        /* per-model tiers: for "all" the device goes first (its blocks pass through on_evict) */
        int has_hot = to->hot_max_bytes != 0, has_ssd = to->ssd_dir && *to->ssd_dir;
        if (!all && !(!strcmp(tier, "hot") ? has_hot : has_ssd))
            return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "the %s tier is not enabled", tier);
        enum kv_tier_which which = all ? KV_TIER_ALL : !strcmp(tier, "hot") ? KV_TIER_HOT
                                                                            : KV_TIER_SSD;
        for (int i = 0; i < r->n_models; i++) {
            struct real_model *m = &r->models[i];
            pthread_mutex_lock(&m->load_mu);
            if (m->loaded && all) engine_cache_clear(m->e);
            if (m->loaded && m->tiers) kv_tiers_clear(m->tiers, which, NULL);
            pthread_mutex_unlock(&m->load_mu);
        }
        return all ? 1 + has_hot + has_ssd : 1;
    }
    if (!all && strcmp(tier, "device")) { /* hot / ssd: the tiers room's hook */
        if (!r->opts.tier_clear)
            return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "the %s tier is not enabled", tier);
        int rc = r->opts.tier_clear(r->opts.tier_ctx, tier, err);
        return rc ? rc : 1;
    }
    /* device first: evicted blocks pass through tiers.on_evict, then the lower tiers go */
    for (int i = 0; i < r->n_models; i++) {
        struct real_model *m = &r->models[i];
        pthread_mutex_lock(&m->load_mu);
        if (m->loaded) engine_cache_clear(m->e);
        pthread_mutex_unlock(&m->load_mu);
    }
    n++;
    if (all && r->opts.tier_clear) {
        const char *lower[] = {"hot", "ssd"};
        for (int i = 0; i < 2; i++) {
            struct cairn_err e2;
            int rc = r->opts.tier_clear(r->opts.tier_ctx, lower[i], &e2);
            if (rc == CAIRN_OK) n++;
            else if (rc != CAIRN_ERR_UNSUPPORTED) return cairn_err_set(err, rc, "%s", e2.msg);
        }
    }
    return n;
}

static void real_destroy(void *ctx)
{
    struct real *r = ctx;
    for (int i = 0; i < r->n_models; i++) {
        real_unload(&r->models[i]);
        pthread_mutex_destroy(&r->models[i].load_mu);
    }
    free(r->models);
    free(r);
}

int api_backend_real_create(const struct api_real_opts *opts, struct api_backend *out,
                            struct cairn_err *err)
{
    struct real *r = calloc(1, sizeof(*r));
    if (!r) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    r->opts = *opts;
    if (opts->model_dir && real_scan(r, opts->model_dir) != 0) {
        free(r);
        return cairn_err_set(err, CAIRN_ERR_IO, "cannot read --model-dir %s", opts->model_dir);
    }
    for (int i = 0; i < opts->n_models; i++) {
        char dir[1024];
        snprintf(dir, sizeof(dir), "%s", opts->models[i]);
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
        const char *base = strrchr(dir, '/');
        base = base ? base + 1 : dir;
        if (real_add(r, base, dir) <= 0) {
            real_destroy(r);
            return cairn_err_set(err, CAIRN_ERR_NOT_FOUND,
                                 "--model %s: not a model folder (needs config.json and tokenizer.json)", opts->models[i]);
        }
    }
    if (r->n_models == 0) {
        real_destroy(r);
        return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "no models found (a model folder has config.json and tokenizer.json)");
    }
    memset(out, 0, sizeof(*out));
    out->ctx = r;
    out->list_models = real_list;
    out->get_model = real_get;
    out->context_length = real_ctx_len;
    out->render_chat = real_render;
    out->tokenize = real_tokenize;
    out->render_chat_ids = real_render_ids;
    out->token_text = real_token_text;
    out->submit = real_submit;
    out->sampling_defaults = real_sampling_defaults;
    out->cancel = real_cancel;
    out->stats = real_stats;
    out->cache_clear = real_cache_clear;
    out->tier_stats = real_tier_stats;
    out->destroy = real_destroy;
    return CAIRN_OK;
}

#else /* the tok / tmpl / engine rooms are not here yet */

int api_backend_real_create(const struct api_real_opts *opts, struct api_backend *out,
                            struct cairn_err *err)
{
    (void)opts;
    (void)out;
    return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                         "this build has no tok/tmpl/engine rooms yet: only --fake-backend works");
}

#endif
