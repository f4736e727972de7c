/* The model pool: discovery, the pool thread (loads, unloads, TTL, eviction, parked requests'
 * retries and deadlines), pool_get / pool_put and settings. Requests are in pool_req.c. See
 * pool.h for the design and the lock order. */
#include "api/pool.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "api/pool_int.h"
#include "api/settings.h"
#include "base/file.h"
#include "base/log.h"
#include "model/config.h"
#include "model/model_group.h"
#include "tensor/backend.h"

const char *pool_state_name(enum pool_state s)
{
    switch (s) {
    case POOL_UNLOADED: return "unloaded";
    case POOL_LOADING: return "loading";
    case POOL_LOADED: return "loaded";
    case POOL_UNLOADING: return "unloading";
    }
    return "?";
}

/* ---- discovery ---- */

static int pool_has_config(const char *dir)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    return cairn_file_exists(path);
}

/* A folder skipped at start is a warning; on every rescan after that (each few seconds while the
 * dashboard lists models) the same folder would say it again: debug. */
#define POOL_SKIP_LEVEL(p) ((p)->t_rescan > 0 ? CAIRN_LOG_DEBUG : CAIRN_LOG_WARN)

/* Adds the model folder dir as id: 1 added (or back from gone), 0 not a model or taken. */
static int pool_add(struct pool *p, const char *id, const char *dir)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (!cairn_file_exists(path)) return 0;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (!cairn_file_exists(path)) {
        cairn_log(POOL_SKIP_LEVEL(p), "pool", "%s: no tokenizer.json, skipped", dir);
        return 0;
    }
    struct stat st;
    for (int i = 0; i < p->n_models; i++)
        if (!strcmp(p->models[i].id, id)) {
            struct pool_model *g = &p->models[i];
            if (g->gone && g->state == POOL_UNLOADED) { /* came back (rescan) */
                snprintf(g->dir, sizeof(g->dir), "%s", dir);
                g->created = stat(dir, &st) == 0 ? (int64_t)st.st_mtime : 0;
                g->gone = 0;
                return 1;
            }
            if (strcmp(g->dir, dir)) cairn_log(POOL_SKIP_LEVEL(p), "pool", "%s: model id '%s' already taken, skipped", dir, id);
            return 0;
        }
    if (p->n_models == POOL_MAX_MODELS) {
        cairn_log(POOL_SKIP_LEVEL(p), "pool", "%s: more than %d models, skipped", dir, POOL_MAX_MODELS);
        return 0;
    }
    struct pool_model *m = &p->models[p->n_models];
    memset(m, 0, sizeof(*m));
    snprintf(m->id, sizeof(m->id), "%s", id);
    snprintf(m->dir, sizeof(m->dir), "%s", dir);
    m->created = stat(dir, &st) == 0 ? (int64_t)st.st_mtime : 0;
    char owner[300];
    snprintf(owner, sizeof(owner), "model %s", id);
    engine_guard_hold_init(&m->hold, owner, 0);
    snprintf(owner, sizeof(owner), "model %s (device)", id);
    engine_guard_hold_init(&m->dhold, owner, 0);
    /* the slot is whole before a lock-free lister can see it */
    __atomic_store_n(&p->n_models, p->n_models + 1, __ATOMIC_RELEASE);
    return 1;
}

int pool_visible(struct pool *p, int idx)
{
    return !__atomic_load_n(&p->models[idx].gone, __ATOMIC_RELAXED);
}

/* Adds every model folder under root; returns -1 if root can't be read, else the number added.
 * Under pool->mu once the pool runs. */
static int pool_scan(struct pool *p, const char *root)
{
    DIR *d = opendir(root);
    if (!d) return -1;
    int n_added = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", root, de->d_name);
        if (!cairn_dir_exists(path)) continue;
        int r = pool_add(p, de->d_name, path);
        if (r > 0) n_added++;
        if (r > 0 || (r == 0 && pool_has_config(path))) continue;
        DIR *d2 = opendir(path); /* org/name */
        if (!d2) continue;
        struct dirent *e2;
        while ((e2 = readdir(d2))) {
            if (e2->d_name[0] == '.') continue;
            char p2[1400], id[512];
            snprintf(p2, sizeof(p2), "%s/%s", path, e2->d_name);
            snprintf(id, sizeof(id), "%s/%s", de->d_name, e2->d_name);
            if (cairn_dir_exists(p2) && pool_add(p, id, p2) > 0) n_added++;
        }
        closedir(d2);
    }
    closedir(d);
    return n_added;
}

int pool_rescan(struct pool *p, int force, double min_interval_s, int *added, int *removed)
{
    int n_added = 0, n_removed = 0;
    pthread_mutex_lock(&p->mu);
    double now = cairn_now();
    if (p->opts.model_dir && (force || now - p->t_rescan >= min_interval_s)) {
        p->t_rescan = now;
        /* a folder under --model-dir that lost its config.json: gone while it is unloaded
         * (a loaded one keeps serving; the next rescan after its unload hides it) */
        size_t root_len = strlen(p->opts.model_dir);
        for (int i = 0; i < p->n_models; i++) {
            struct pool_model *m = &p->models[i];
            if (m->gone || m->state != POOL_UNLOADED || m->want_load || m->n_users) continue;
            if (strncmp(m->dir, p->opts.model_dir, root_len) || pool_has_config(m->dir)) continue;
            __atomic_store_n(&m->gone, 1, __ATOMIC_RELAXED);
            n_removed++;
            LOG_INFO("pool", "rescan: %s is gone (%s)", m->id, m->dir);
        }
        int r = pool_scan(p, p->opts.model_dir);
        if (r < 0) LOG_WARN("pool", "rescan: cannot read --model-dir %s", p->opts.model_dir);
        else n_added = r;
        if (n_added) LOG_INFO("pool", "rescan: %d new models", n_added);
    }
    pthread_mutex_unlock(&p->mu);
    if (added) *added = n_added;
    if (removed) *removed = n_removed;
    return CAIRN_OK;
}

/* ---- settings ---- */

json_t *pool_setting(struct pool *p, int idx, const char *key)
{
    return api_settings_lookup(p->settings, idx >= 0 ? p->models[idx].id : NULL, key);
}

double pool_ttl(struct pool *p, int idx)
{
    if (p->opts.has_ttl) return p->opts.ttl_s;
    json_t *v = pool_setting(p, idx, "ttl");
    return json_is_number(v) ? json_number_value(v) : 0;
}

int pool_pinned(struct pool *p, int idx)
{
    return json_is_true(pool_setting(p, idx, "pinned"));
}

int pool_find(struct pool *p, const char *id)
{
    int found = -1;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_models && found < 0; i++)
        if (!p->models[i].gone && !strcmp(p->models[i].id, id)) found = i;
    for (int i = 0; i < p->n_models && found < 0; i++) {
        if (p->models[i].gone) continue;
        json_t *a = json_object_get(json_object_get(json_object_get(p->settings, "models"), p->models[i].id), "alias");
        if (json_is_string(a) && !strcmp(json_string_value(a), id)) found = i;
    }
    pthread_mutex_unlock(&p->mu);
    return found;
}

int pool_settings_put(struct pool *p, json_t *patch, json_t **changes, char *field, size_t cap,
                      struct cairn_err *err)
{
    *changes = NULL;
    field[0] = 0;
    if (!json_is_object(patch)) return cairn_err_set(err, CAIRN_ERR_INVALID, "settings must be a JSON object");
    /* the patch's shape first (nulls remove keys), then the merged result's values */
    const char *k;
    json_t *v;
    json_object_foreach(patch, k, v) {
        if (strcmp(k, "global") && strcmp(k, "models") && strcmp(k, "version")) {
            snprintf(field, cap, "%.200s", k);
            return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: unknown key (expected global, models)", field);
        }
        if (strcmp(k, "version") && !json_is_object(v)) {
            snprintf(field, cap, "%s", k);
            return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be an object", k);
        }
    }
    json_t *ms = json_object_get(patch, "models");
    json_object_foreach(ms, k, v) {
        if (!json_is_object(v) && !json_is_null(v)) {
            snprintf(field, cap, "models.%.200s", k);
            return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be an object or null", field);
        }
    }
    pthread_mutex_lock(&p->mu);
    /* start from the file as it is now: another server may have changed it since we read it */
    json_t *next = NULL;
    char *text = NULL, f2[300];
    size_t n = 0;
    if (p->settings_ok && cairn_file_read_all(p->settings_path, 4u << 20, &text, &n, NULL) == CAIRN_OK)
        api_settings_parse(text, n, &next, f2, sizeof(f2), NULL);
    free(text);
    if (!next) next = json_deep_copy(p->settings);
    int rc = next ? api_settings_merge(next, patch, err) : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    if (rc == CAIRN_OK) rc = api_settings_validate(next, field, cap, err);
    if (rc == CAIRN_OK && p->settings_ok) rc = api_settings_save(p->settings_path, next, err);
    if (rc == CAIRN_OK) {
        json_t *applied = json_array(), *later = json_array();
        json_t *g = json_object_get(patch, "global");
        json_object_foreach(g, k, v) json_array_append_new(api_settings_is_live(k) ? applied : later, json_sprintf("global.%s", k));
        const char *id;
        json_t *m;
        json_object_foreach(ms, id, m) json_object_foreach(m, k, v)
            json_array_append_new(api_settings_is_live(k) ? applied : later, json_sprintf("models.%s.%s", id, k));
        *changes = json_pack("{s:o,s:o}", "applied", applied, "on_next_load", later);
        json_decref(p->settings);
        p->settings = next;
        next = NULL;
    }
    pthread_cond_signal(&p->cv_work); /* ttl or pinned may have changed */
    pthread_mutex_unlock(&p->mu);
    json_decref(next);
    engine_guard_kick(p->guard);
    return rc;
}

/* ---- get / put ---- */

int pool_get(struct pool *p, int idx, struct cairn_err *err)
{
    struct pool_model *m = &p->models[idx];
    int rc = CAIRN_OK;
    pthread_mutex_lock(&p->mu);
    uint64_t failures = m->n_load_failures;
    for (;;) {
        if (p->stopping) {
            rc = cairn_err_set(err, CAIRN_ERR_CANCELLED, "the server is shutting down");
            break;
        }
        if (m->state == POOL_LOADED) {
            m->n_users++;
            m->last_used = cairn_now();
            break;
        }
        if (m->n_load_failures != failures) {
            rc = cairn_err_set(err, m->load_error_code, "%s", m->load_error);
            break;
        }
        if (m->state == POOL_UNLOADED && !m->want_load) {
            m->want_load = 1;
            m->want_order = ++p->next_order;
            pthread_cond_signal(&p->cv_work);
        }
        pthread_cond_wait(&p->cv, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void pool_put(struct pool *p, int idx)
{
    struct pool_model *m = &p->models[idx];
    pthread_mutex_lock(&p->mu);
    if (m->n_users > 0) m->n_users--; /* last_used was set by pool_get (and requests' ends) */
    pthread_cond_signal(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    engine_guard_kick(p->guard);
}

int pool_load_async(struct pool *p, int idx, struct cairn_err *err)
{
    struct pool_model *m = &p->models[idx];
    pthread_mutex_lock(&p->mu);
    if (m->state == POOL_UNLOADED && !m->want_load) {
        m->want_load = 1;
        m->want_order = ++p->next_order;
        pthread_cond_signal(&p->cv_work);
    }
    pthread_mutex_unlock(&p->mu);
    return CAIRN_OK;
}

int pool_model_failure(struct pool *p, int idx, char *why, size_t n)
{
    struct pool_model *m = &p->models[idx];
    if (m->state == POOL_LOADED && m->e && engine_failed(m->e, why, n)) return 1;
    if (!m->failure[0] || m->state == POOL_LOADED || m->state == POOL_LOADING) return 0;
    if (why && n) snprintf(why, n, "%s", m->failure);
    return 1;
}

/* Unloads a loaded model whose engine failed once its last request is gone (pinned or not).
 * Pool thread, under pool->mu. Returns 1 if it unloaded one. */
static int pool_unload_failed(struct pool *p)
{
    for (int i = 0; i < p->n_models; i++) {
        struct pool_model *m = &p->models[i];
        char why[sizeof(m->failure)];
        if (m->state != POOL_LOADED || m->n_users || m->n_active || !engine_failed(m->e, why, sizeof(why)))
            continue;
        snprintf(m->failure, sizeof(m->failure), "%s", why);
        m->n_failures++;
        pool_unload_locked(p, i, "its device stalled or failed");
        return 1;
    }
    return 0;
}

/* An idle model: loaded, no users, no requests, not pinned. Under pool->mu. */
static int pool_idle(struct pool *p, int i)
{
    const struct pool_model *m = &p->models[i];
    return m->state == POOL_LOADED && m->n_users == 0 && m->n_active == 0 && !pool_pinned(p, i);
}

int pool_unload(struct pool *p, int idx, struct cairn_err *err)
{
    struct pool_model *m = &p->models[idx];
    int rc = CAIRN_OK;
    pthread_mutex_lock(&p->mu);
    if (m->state == POOL_LOADED && !pool_idle(p, idx)) {
        rc = pool_pinned(p, idx)
                 ? cairn_err_set(err, CAIRN_ERR_BUSY, "model '%s' is pinned: unpin it first", m->id)
                 : cairn_err_set(err, CAIRN_ERR_BUSY, "model '%s' has %d running or queued requests", m->id,
                                 m->n_active + m->n_users);
    } else if (m->state == POOL_LOADED) {
        m->want_unload = 1; /* the pool thread unloads it (if it is still idle then) */
        pthread_cond_signal(&p->cv_work);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* ---- load / unload (pool thread) ---- */

static void pool_model_release(struct pool_model *m)
{
    if (m->e && m->tiers) engine_cache_clear(m->e); /* device blocks -> tiers, kept on disk */
    if (m->e) engine_destroy(m->e);
    kv_tiers_close(m->tiers); /* after the engine: flushes dirty hot blocks to the SSD */
    if (m->m) model_free(m->m);
    model_group_free(m->grp);
    m->grp = NULL;
    if (m->tok) tok_free(m->tok);
    if (m->tmpl) tmpl_free(m->tmpl);
    grammar_vocab_free(m->gvocab); /* after engine_destroy: no request uses it any more */
    m->gvocab = NULL;
    free(m->bos);
    free(m->eos);
    m->tiers = NULL;
    m->e = NULL;
    m->m = NULL;
    m->tok = NULL;
    m->tmpl = NULL;
    m->bos = m->eos = NULL;
    if (m->mapped_charged) cairn_mem_charge(CAIRN_MEM_HOST, CAIRN_MEM_MAPPED, -(int64_t)m->mapped_charged);
    m->mapped_charged = 0;
}

/* Unloads model idx. Called with pool->mu held (on the pool thread or pool_unload); drops it
 * while the engine stops. */
void pool_unload_locked(struct pool *p, int idx, const char *why)
{
    struct pool_model *m = &p->models[idx];
    m->state = POOL_UNLOADING;
    m->t_state = cairn_now();
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    LOG_INFO("pool", "unloading %s (%s)", m->id, why);
    pool_model_release(m);
    engine_guard_release(p->guard, &m->hold);
    if (p->dguard) engine_guard_release(p->dguard, &m->dhold);
    pthread_mutex_lock(&p->mu);
    m->state = POOL_UNLOADED;
    m->t_state = cairn_now();
    pthread_cond_broadcast(&p->cv);
}

/* Sum of the safetensors files of a folder: what the weights take once their pages are in. */
static uint64_t pool_weight_file_bytes(const char *dir)
{
    uint64_t n = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        char path[1400];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (stat(path, &st) == 0) n += (uint64_t)st.st_size;
    }
    closedir(d);
    return n;
}

/* Engine options of a model (settings at load time). Under pool->mu. */
static void pool_engine_opts(struct pool *p, int idx, struct engine_opts *o)
{
    memset(o, 0, sizeof(*o));
    engine_opts_default(o);
    if (p->opts.kv_bytes) o->kv_bytes = p->opts.kv_bytes;
    else if (p->models[idx].kv_bytes_device) o->kv_bytes = p->models[idx].kv_bytes_device;
    if (p->opts.max_batch_tokens) o->max_batch_tokens = p->opts.max_batch_tokens;
    if (p->opts.max_running) o->max_running = p->opts.max_running;
    if (p->opts.max_waiting) o->max_waiting = p->opts.max_waiting;
    o->speculative = (enum engine_spec_mode)p->opts.speculative;
    o->spec_ngram_min = p->opts.spec_ngram_min;
    o->spec_k_max = p->opts.spec_k_max;
    o->spec_cost_slope = p->opts.spec_cost_slope;
    o->spec_draft_cost = p->opts.spec_draft_cost;
    json_t *v = pool_setting(p, idx, "context_length");
    if (json_is_integer(v)) o->context_length = (int)json_integer_value(v);
    v = pool_setting(p, idx, "kv_dtype");
    if (json_is_string(v) && !strcmp(json_string_value(v), "f32")) o->kv_dtype = DTYPE_F32;
    if (!o->snapshot_bytes) o->snapshot_bytes = o->kv_bytes / 2;
}

static int pool_use_tiers(struct pool *p, int idx)
{
    return p->opts.tiers_opts && !json_is_false(pool_setting(p, idx, "tiers"));
}

/* The sizes the guard needs from a config.json, before the model loads: the layers with KV and
 * a hybrid's recurrent state per sequence (float conv + delta state of each Gated DeltaNet
 * layer, as model/gdn.h lays it out). */
static void pool_config_info(const struct model_config *c, struct model_info *mi)
{
    memset(mi, 0, sizeof(*mi));
    mi->n_layers = c->n_layers;
    mi->n_kv_heads = c->n_kv_heads;
    mi->head_dim = c->head_dim;
    mi->vocab_size = c->vocab_size;
    uint64_t key_dim = (uint64_t)c->linear_num_key_heads * (uint64_t)c->linear_key_head_dim;
    uint64_t value_dim = (uint64_t)c->linear_num_value_heads * (uint64_t)c->linear_value_head_dim;
    uint64_t conv_cols = c->linear_conv_kernel_dim > 1 ? (uint64_t)c->linear_conv_kernel_dim - 1 : 0;
    uint64_t per_layer = (2 * key_dim + value_dim) * conv_cols +
                         (uint64_t)c->linear_num_value_heads * (uint64_t)c->linear_key_head_dim * (uint64_t)c->linear_value_head_dim;
    for (int i = 0; i < c->n_layers; i++) {
        enum model_layer_kind k = c->layer_kinds ? c->layer_kinds[i] : MODEL_LAYER_ATTN;
        if (k == MODEL_LAYER_ATTN) mi->n_kv_layers++;
        else if (k == MODEL_LAYER_LINEAR_ATTN) mi->state_bytes += (size_t)(per_layer * sizeof(float));
    }
}

/* What a load of model idx will hold, before it runs. Under pool->mu. */
void pool_load_estimate(struct pool *p, int idx, uint64_t host[CAIRN_MEM_N_TAGS], uint64_t dev[CAIRN_MEM_N_TAGS])
{
    struct pool_model *m = &p->models[idx];
    struct engine_opts o;
    pool_engine_opts(p, idx, &o);
    uint64_t all[CAIRN_MEM_N_TAGS] = {0};
    memset(host, 0, sizeof(uint64_t) * CAIRN_MEM_N_TAGS);
    if (dev) memset(dev, 0, sizeof(uint64_t) * CAIRN_MEM_N_TAGS);
    uint64_t files = pool_weight_file_bytes(m->dir), run_states = 0;
    all[CAIRN_MEM_KV] = o.kv_bytes;
    struct model_config c;
    memset(&c, 0, sizeof(c));
    if (model_config_load(m->dir, &c, NULL) == CAIRN_OK) {
        /* logits of every running sequence + a forward workspace of max_batch_tokens rows */
        uint64_t rows = (uint64_t)o.max_batch_tokens;
        uint64_t width = 6ull * (uint64_t)c.hidden_size + 3ull * (uint64_t)c.intermediate_size;
        all[CAIRN_MEM_SCRATCH] = 4ull * (uint64_t)o.max_running * (uint64_t)c.vocab_size + 4ull * rows * width;
        struct model_info mi;
        pool_config_info(&c, &mi);
        uint64_t per_block = engine_guard_kv_bytes(&mi, o.block_size, o.kv_dtype, o.block_size);
        uint64_t n_blocks = per_block ? o.kv_bytes / per_block : 0;
        all[CAIRN_MEM_STATE] = engine_guard_snapshot_bytes(mi.state_bytes, o.snapshot_bytes, o.max_running, n_blocks);
        run_states = (uint64_t)o.max_running * mi.state_bytes;
        model_config_free(&c);
    }
    if (p->dguard && dev) {
        /* a device holds the uploaded weights, the KV pool, snapshots and workspaces; the host
         * the mapped files (read while they upload) and the hot tier */
        dev[CAIRN_MEM_WEIGHTS] = files;
        dev[CAIRN_MEM_KV] = all[CAIRN_MEM_KV];
        dev[CAIRN_MEM_STATE] = all[CAIRN_MEM_STATE] + run_states; /* + the engine's state slots */
        dev[CAIRN_MEM_SCRATCH] = all[CAIRN_MEM_SCRATCH];
    } else {
        memcpy(host, all, sizeof(all));
    }
    host[CAIRN_MEM_MAPPED] = files;
    if (pool_use_tiers(p, idx)) {
        /* a device model's hot tier lives in pinned slabs: up to two of them beyond the budget
         * (kv_tiers_slab_bytes) */
        uint64_t hot = p->opts.tiers_opts->hot_max_bytes;
        host[CAIRN_MEM_HOT] = hot + (p->dguard && dev && hot ? 2 * kv_tiers_slab_bytes(hot) : 0);
    }
}

/* A device without --kv-cache-size: sizes model idx's KV pool from what the device budget has
 * left (limit less every other hold) after its weights and workspaces and, for a hybrid, the
 * snapshots that pool brings (engine.c's rule, kv_bytes / 2 of them), in whole blocks, at least
 * one block per running sequence (below that the reservation fails: evict or 507 with the
 * numbers). Returns 1 when the pool holds a full context of one sequence, 0 when it is smaller
 * (the caller then evicts an idle model first, if there is one: a prompt longer than a small
 * pool gets the engine's 507). Under pool->mu. */
static int pool_size_device_kv(struct pool *p, int idx)
{
    struct pool_model *m = &p->models[idx];
    if (!p->dguard || p->opts.kv_bytes) return 1;
    struct model_config c;
    memset(&c, 0, sizeof(c));
    if (model_config_load(m->dir, &c, NULL) != CAIRN_OK) return 1; /* the load reports it */
    struct model_info mi;
    pool_config_info(&c, &mi);
    struct engine_opts o;
    m->kv_bytes_device = 1; /* the estimate's other categories do not depend on it */
    pool_engine_opts(p, idx, &o);
    int ctx = o.context_length > 0 && o.context_length < c.max_position ? o.context_length : c.max_position;
    model_config_free(&c);
    uint64_t host[CAIRN_MEM_N_TAGS], dev[CAIRN_MEM_N_TAGS];
    pool_load_estimate(p, idx, host, dev);
    uint64_t fixed = 0;
    for (int t = 0; t < CAIRN_MEM_N_TAGS; t++)
        if (t != CAIRN_MEM_KV && t != CAIRN_MEM_STATE) fixed += dev[t];
    struct engine_guard_stats gs;
    engine_guard_get_stats(p->dguard, &gs);
    uint64_t avail = gs.limit > gs.reserved ? gs.limit - gs.reserved : 0;
    uint64_t left = avail > fixed ? avail - fixed : 0;
    uint64_t per_block = engine_guard_kv_bytes(&mi, o.block_size, o.kv_dtype, o.block_size);
    uint64_t kv = left;
    for (int i = 0; i < 64 && kv > 0; i++) { /* a hybrid's snapshots grow with the pool */
        uint64_t n_blocks = per_block ? kv / per_block : 0;
        uint64_t snap = engine_guard_snapshot_bytes(mi.state_bytes, kv / 2, o.max_running, n_blocks);
        if (kv + snap <= left) break;
        uint64_t over = kv + snap - left;
        kv = kv > over + kv / 64 ? kv - over - kv / 64 : 0;
    }
    if (per_block) kv = kv / per_block * per_block; /* whole blocks: what the engine will hold */
    uint64_t min_kv = per_block * (uint64_t)o.max_running;
    if (kv < min_kv) kv = min_kv;
    m->kv_bytes_device = kv ? kv : 1;
    return kv >= engine_guard_kv_bytes(&mi, o.block_size, o.kv_dtype, ctx > 0 ? ctx : o.block_size);
}

/* kv_tier_pinner over a backend's host_pin / host_unpin (ctx = the backend). The tier's slab
 * pool logs a refused pin once; the backend's reason goes to the debug log here. */
static int pool_host_pin(void *ctx, void *ptr, size_t bytes)
{
    struct backend *be = ctx;
    struct cairn_err err = {0};
    if (be->ops->host_pin(be, ptr, bytes, &err) == CAIRN_OK) return 0;
    LOG_DEBUG("pool", "pinning %zu bytes for the hot tier: %s", bytes, err.msg);
    return -1;
}

static void pool_host_unpin(void *ctx, void *ptr)
{
    struct backend *be = ctx;
    be->ops->host_unpin(be, ptr);
}

/* Loads model idx on the pool thread (pool->mu not held). */
static int pool_do_load(struct pool *p, int idx, const struct engine_opts *eo, int use_tiers,
                        struct cairn_err *err)
{
    struct pool_model *m = &p->models[idx];
    struct engine_opts o = *eo;
    __atomic_store_n(&m->progress.bytes_done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&m->progress.bytes_total, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&m->phase, "weights", __ATOMIC_RELAXED);
    int rc = p->opts.tp ? model_group_load(m->dir, p->opts.tp, &m->grp, err)
                        : model_load_watch(m->dir, p->opts.device, &m->progress, &m->m, err);
    if (rc == 0) {
        __atomic_store_n(&m->phase, "tokenizer", __ATOMIC_RELAXED);
        rc = tok_load(m->dir, &m->tok, err);
    }
    if (rc == 0) {
        __atomic_store_n(&m->phase, "chat template", __ATOMIC_RELAXED);
        int trc = tmpl_load_from_dir(m->dir, &m->tmpl, &m->bos, &m->eos, err);
        if (trc == CAIRN_ERR_NOT_FOUND) {
            LOG_WARN("pool", "%s: no chat template (only /v1/completions will work)", m->id);
            m->tmpl = NULL;
        } else {
            rc = trc;
        }
    }
    if (rc == 0) {
        __atomic_store_n(&m->phase, "engine", __ATOMIC_RELAXED);
        pool_detok_opts(m, &o);
        if (use_tiers) {
            const struct model_info *mi = pool_model_info(m);
            struct kv_tiers_opts to = *p->opts.tiers_opts;
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
            /* Hot-tier blocks in pinned slabs where the backend can pin (a GPU): hot hits then
             * upload at DMA speed. The backend outlives the tiers (pool_model_release closes
             * them before model_free). A group model gets none: tiers are refused under tensor
             * parallel (cmd_serve), and its backend has no host memory of its own to pin. */
            struct backend *be = m->m ? model_backend(m->m) : NULL;
            memset(&to.pin, 0, sizeof(to.pin));
            if (be && be->ops->host_pin && be->ops->host_unpin)
                to.pin = (struct kv_tier_pinner){.ctx = be, .pin = pool_host_pin, .unpin = pool_host_unpin};
            rc = kv_tiers_open(&to, &m->tiers, err);
            if (rc == 0) o.tiers = kv_tiers_ops(m->tiers);
        }
        if (rc == 0) rc = m->grp ? engine_create_group(m->grp, &o, &m->e, err) : engine_create(m->m, &o, &m->e, err);
        if (rc == 0) {
            const struct model_info *mi = pool_model_info(m);
            m->context_length = o.context_length > 0 && o.context_length < mi->max_position ? o.context_length
                                                                                           : mi->max_position;
        }
    }
    if (rc) {
        cairn_err_prefix(err, "%s", m->dir);
        pool_model_release(m);
    }
    return rc;
}

/* Evicts the least recently used idle model other than `except`; device: only one that holds
 * device memory. Under pool->mu (dropped while unloading). Returns 1 if one was unloaded. */
static int pool_evict_lru_in(struct pool *p, int except, int device, const char *why)
{
    int best = -1;
    for (int i = 0; i < p->n_models; i++) {
        if (i == except || !pool_idle(p, i)) continue;
        if (device && !engine_guard_hold_total(&p->models[i].dhold)) continue;
        if (best < 0 || p->models[i].last_used < p->models[best].last_used) best = i;
    }
    if (best < 0) return 0;
    p->n_evictions++;
    pool_unload_locked(p, best, why);
    return 1;
}

static int pool_evict_lru(struct pool *p, int except, const char *why)
{
    return pool_evict_lru_in(p, except, 0, why);
}

/* Something may free memory by waiting: a busy model, or transient holds. Under pool->mu. */
static int pool_may_free(struct pool *p, int except)
{
    for (int i = 0; i < p->n_models; i++) {
        const struct pool_model *m = &p->models[i];
        if (i != except && m->state == POOL_LOADED && !pool_pinned(p, i) && (m->n_users || m->n_active)) return 1;
    }
    struct engine_guard_stats st;
    engine_guard_get_stats(p->guard, &st);
    return st.transient > 0;
}

static int pool_n_loaded(struct pool *p)
{
    int n = 0;
    for (int i = 0; i < p->n_models; i++) n += p->models[i].state != POOL_UNLOADED;
    return n;
}

static void pool_load_fail(struct pool *p, int idx, int code, const char *msg)
{
    struct pool_model *m = &p->models[idx];
    snprintf(m->load_error, sizeof(m->load_error), "%s", msg);
    m->load_error_code = code;
    m->n_load_failures++;
    m->state = POOL_UNLOADED;
    m->phase = NULL;
    m->t_state = cairn_now();
    LOG_WARN("pool", "loading %s failed: %s", m->id, msg);
    pthread_cond_broadcast(&p->cv);
}

/* Admits and loads model idx. Under pool->mu (dropped while waiting and loading). */
static void pool_admit_and_load(struct pool *p, int idx)
{
    struct pool_model *m = &p->models[idx];
    m->want_load = 0;
    m->state = POOL_LOADING;
    m->phase = "waiting for memory";
    m->t_state = cairn_now();
    pthread_cond_broadcast(&p->cv);
    double wait = p->opts.memory_wait_s > 0 ? p->opts.memory_wait_s : 60;
    double deadline = cairn_now() + wait;
    uint64_t need[CAIRN_MEM_N_TAGS], dneed[CAIRN_MEM_N_TAGS];
    pool_load_estimate(p, idx, need, dneed);
    struct cairn_err err = {0};
    for (;;) {
        if (p->stopping) {
            pool_load_fail(p, idx, CAIRN_ERR_CANCELLED, "the server is shutting down");
            return;
        }
        if (p->dguard && !p->opts.kv_bytes) { /* what is left changes as models go */
            int full = pool_size_device_kv(p, idx);
            if (!full && pool_evict_lru_in(p, idx, 1, "device memory for a full context")) continue;
            pool_load_estimate(p, idx, need, dneed);
        }
        int max = p->opts.max_loaded_models;
        if (max > 0 && pool_n_loaded(p) > max) { /* this one counts as loading */
            if (pool_evict_lru(p, idx, "--max-loaded-models")) continue;
        } else {
            struct engine_guard_deny deny;
            if (engine_guard_reserve(p->guard, &m->hold, need, &deny, &err) == CAIRN_OK) {
                if (!p->dguard || engine_guard_reserve(p->dguard, &m->dhold, dneed, &deny, &err) == CAIRN_OK) break;
                engine_guard_release(p->guard, &m->hold); /* all or nothing over both budgets */
                if (pool_evict_lru_in(p, idx, 1, "device memory for another model")) continue;
            } else if (pool_evict_lru(p, idx, "memory for another model")) {
                continue;
            }
        }
        if (!pool_may_free(p, idx) || cairn_now() >= deadline) {
            char msg[600];
            if (max > 0 && pool_n_loaded(p) > max)
                snprintf(msg, sizeof(msg), "cannot load '%.200s': --max-loaded-models %d reached and no loaded model is "
                         "idle (busy or pinned)", m->id, max);
            else
                snprintf(msg, sizeof(msg), "cannot load '%.120s': %.300s; no idle model to unload (raise "
                         "--max-%s-memory, lower --kv-cache-size, or unpin models)", m->id, err.msg,
                         strstr(err.msg, "of device memory") ? "device" : "process");
            pool_load_fail(p, idx, max > 0 && pool_n_loaded(p) > max ? CAIRN_ERR_BUSY : CAIRN_ERR_NOMEM, msg);
            return;
        }
        pthread_mutex_unlock(&p->mu);
        engine_guard_wait(p->guard, 0.25);
        pthread_mutex_lock(&p->mu);
    }
    struct engine_opts o;
    pool_engine_opts(p, idx, &o);
    int use_tiers = pool_use_tiers(p, idx);
    pthread_mutex_unlock(&p->mu);

    double t0 = cairn_now();
    uint64_t w0 = cairn_mem_used(CAIRN_MEM_WEIGHTS), k0 = cairn_mem_used(CAIRN_MEM_KV);
    uint64_t s0 = cairn_mem_used(CAIRN_MEM_SCRATCH);
    uint64_t d0[CAIRN_MEM_N_TAGS];
    for (int t = 0; t < CAIRN_MEM_N_TAGS; t++) d0[t] = cairn_mem_used_in(CAIRN_MEM_DEVICE, (enum cairn_mem_tag)t);
    int rc = pool_do_load(p, idx, &o, use_tiers, &err);
    if (rc == CAIRN_OK) {
        /* the hold becomes what was measured (loads run one at a time on this thread) */
        const struct model_info *mi = pool_model_info(m);
        uint64_t owned = cairn_mem_used(CAIRN_MEM_WEIGHTS) - w0;
        /* weights the backend copied to the device: their file pages were released after the
         * upload (RELEASE_HOST), so the host keeps only the rest of the mapping */
        uint64_t dw = p->dguard ? cairn_mem_used_in(CAIRN_MEM_DEVICE, CAIRN_MEM_WEIGHTS) : 0;
        uint64_t uploaded = dw > d0[CAIRN_MEM_WEIGHTS] ? dw - d0[CAIRN_MEM_WEIGHTS] : 0;
        uint64_t mapped = mi->weight_bytes > owned + uploaded ? mi->weight_bytes - owned - uploaded : 0;
        uint64_t scratch = cairn_mem_used(CAIRN_MEM_SCRATCH) - s0;
        uint64_t kv = cairn_mem_used(CAIRN_MEM_KV) - k0;
        uint64_t per_block = engine_guard_kv_bytes(mi, o.block_size, o.kv_dtype, o.block_size);
        uint64_t n_blocks = per_block ? kv / per_block : 0;
        uint64_t snap = engine_guard_snapshot_bytes(mi->state_bytes, o.snapshot_bytes, o.max_running, n_blocks);
        engine_guard_set(p->guard, &m->hold, CAIRN_MEM_WEIGHTS, owned);
        engine_guard_set(p->guard, &m->hold, CAIRN_MEM_MAPPED, mapped);
        engine_guard_set(p->guard, &m->hold, CAIRN_MEM_KV, kv);
        engine_guard_set(p->guard, &m->hold, CAIRN_MEM_SCRATCH, scratch);
        engine_guard_set(p->guard, &m->hold, CAIRN_MEM_STATE, p->dguard ? 0 : snap);
        if (p->dguard) {
            /* what the backend charged to the device domain during the load; a backend that
             * charges nothing there (the test seam on the CPU) keeps the estimate */
            uint64_t dm[CAIRN_MEM_N_TAGS], dsum = 0;
            for (int t = 0; t < CAIRN_MEM_N_TAGS; t++) {
                uint64_t now_t = cairn_mem_used_in(CAIRN_MEM_DEVICE, (enum cairn_mem_tag)t);
                dm[t] = now_t > d0[t] ? now_t - d0[t] : 0;
                dsum += dm[t];
            }
            /* recurrent states live in device memory too (kv/kv_state.h): the engine's slots
             * are measured, the snapshots are allocated as blocks fill, so the hold keeps
             * their budget from the start */
            uint64_t states = snap + (uint64_t)o.max_running * mi->state_bytes;
            if (dsum && dm[CAIRN_MEM_STATE] < states) dm[CAIRN_MEM_STATE] = states;
            for (int t = 0; t < CAIRN_MEM_N_TAGS && dsum; t++)
                engine_guard_set(p->dguard, &m->dhold, (enum cairn_mem_tag)t, dm[t]);
        }
        m->mapped_charged = mapped;
        cairn_mem_charge(CAIRN_MEM_HOST, CAIRN_MEM_MAPPED, (int64_t)mapped);
    } else {
        engine_guard_release(p->guard, &m->hold);
        if (p->dguard) engine_guard_release(p->dguard, &m->dhold);
    }
    pthread_mutex_lock(&p->mu);
    if (rc) {
        pool_load_fail(p, idx, rc == CAIRN_ERR_NOT_FOUND ? CAIRN_ERR_IO : rc, err.msg);
        return;
    }
    m->state = POOL_LOADED;
    m->phase = NULL;
    m->failure[0] = 0; /* a failed model serves again */
    m->load_s = cairn_now() - t0;
    m->t_state = m->last_used = cairn_now();
    m->n_loads++;
    LOG_INFO("pool", "loaded %s in %.2f s (context %d, holds %.1f MiB host, %.1f MiB device)", m->id, m->load_s,
             m->context_length, (double)engine_guard_hold_total(&m->hold) / 1048576.0,
             (double)engine_guard_hold_total(&m->dhold) / 1048576.0);
    pthread_cond_broadcast(&p->cv);
}

static void *pool_thread_main(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        int next = -1;
        for (int i = 0; i < p->n_models; i++)
            if (p->models[i].want_load && (next < 0 || p->models[i].want_order < p->models[next].want_order))
                next = i;
        if (next >= 0) {
            pool_admit_and_load(p, next);
            continue;
        }
        double now = cairn_now();
        int did = pool_unload_failed(p);
        for (int i = 0; i < p->n_models && !did; i++) {
            if (!p->models[i].want_unload) continue;
            p->models[i].want_unload = 0;
            if (pool_idle(p, i)) {
                pool_unload_locked(p, i, "admin");
                did = 1;
            }
        }
        for (int i = 0; i < p->n_models && !did; i++) {
            double ttl = pool_ttl(p, i);
            if (ttl > 0 && pool_idle(p, i) && now - p->models[i].last_used >= ttl) {
                p->n_ttl_unloads++;
                pool_unload_locked(p, i, "ttl");
                did = 1;
            }
        }
        if (did) continue;
        if (pool_parked_step(p)) continue; /* may evict for parked requests, or time them out */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&p->cv_work, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Evicts an idle model for parked requests (pool thread, under pool->mu). */
int pool_evict_for_parked(struct pool *p)
{
    return pool_evict_lru(p, -1, "memory for waiting requests");
}

/* ---- create / destroy ---- */

/* The device budget: a backend with its own memory (not host-visible), or the test seam
 * (opts.device_budget). --max-device-memory, a percentage of the device's total, or the default
 * engine_guard_default_device_limit. */
static int pool_device_budget(struct pool *p, struct cairn_err *err)
{
    const struct api_real_opts *o = &p->opts;
    struct backend *be = o->device;
    int is_device = be && !be->host_visible;
    if (!is_device && !o->device_budget) return CAIRN_OK;
    struct backend_mem_stats ms;
    memset(&ms, 0, sizeof(ms));
    if (be && be->ops && be->ops->mem_stats) be->ops->mem_stats(be, &ms);
    uint64_t limit = o->max_device_memory;
    if (!limit && o->max_device_memory_pct > 0) limit = (uint64_t)((double)ms.device_total * o->max_device_memory_pct / 100.0);
    if (!limit) limit = engine_guard_default_device_limit(ms.device_total);
    /* tensor parallel: each model's weights and KV are spread over the ranks, so the budget (and
     * every estimate against it) is the group's: N x rank 0's */
    if (o->tp && o->tp->world > 1) limit *= (uint64_t)o->tp->world;
    if (!limit)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "the device's memory size is unknown: give --max-device-memory SIZE");
    int rc = engine_guard_create(CAIRN_MEM_DEVICE, limit, &p->dguard, err);
    if (rc == CAIRN_OK)
        LOG_INFO("pool", "device memory limit %.2f GiB (%s, %.2f GiB in all)", (double)limit / (1024.0 * 1024 * 1024),
                 be ? be->name : "?", (double)ms.device_total / (1024.0 * 1024 * 1024));
    return rc;
}

int pool_create(const struct api_real_opts *opts, struct pool **out, struct cairn_err *err)
{
    *out = NULL;
    struct pool *p = calloc(1, sizeof(*p));
    if (!p) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    p->opts = *opts;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->gvocab_mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    p->next_req_id = 1;
    p->models = calloc(POOL_MAX_MODELS, sizeof(*p->models));
    if (!p->models) {
        free(p);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    int rc = engine_guard_create(CAIRN_MEM_HOST, opts->max_process_memory, &p->guard, err);
    if (rc) goto fail;
    rc = pool_device_budget(p, err);
    if (rc) goto fail;
    if (opts->model_dir && pool_scan(p, opts->model_dir) < 0) {
        rc = cairn_err_set(err, CAIRN_ERR_IO, "cannot read --model-dir %s", opts->model_dir);
        goto fail;
    }
    for (int i = 0; i < opts->n_models; i++) {
        char dir[1024];
        snprintf(dir, sizeof(dir), "%s", opts->models[i]);
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
        const char *base = strrchr(dir, '/');
        base = base ? base + 1 : dir;
        if (pool_add(p, base, dir) <= 0) {
            rc = cairn_err_set(err, CAIRN_ERR_NOT_FOUND,
                               "--model %s: not a model folder (needs config.json and tokenizer.json)", opts->models[i]);
            goto fail;
        }
    }
    if (p->n_models == 0) {
        rc = cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "no models found (a model folder has config.json and tokenizer.json)");
        goto fail;
    }
    struct cairn_err e2 = {0};
    p->settings_ok = api_settings_path(opts->settings_path, p->settings_path, sizeof(p->settings_path), &e2) == 0;
    if (!p->settings_ok) LOG_WARN("pool", "%s: settings are not kept", e2.msg);
    if (p->settings_ok) {
        rc = api_settings_load(p->settings_path, &p->settings, err);
        if (rc) goto fail;
        LOG_INFO("pool", "settings: %s", p->settings_path);
    } else {
        p->settings = json_object();
    }
    if (p->opts.device) { /* the stall watchdog's bound: the flag, else the global setting */
        json_t *st = pool_setting(p, -1, "step_timeout");
        double t = p->opts.step_timeout_s > 0 ? p->opts.step_timeout_s : json_is_number(st) ? json_number_value(st) : 0;
        if (t > 0) p->opts.device->step_timeout_s = t;
        for (int r = 0; t > 0 && p->opts.tp && r < p->opts.tp->world; r++) p->opts.tp->bes[r]->step_timeout_s = t;
    }
    if (pthread_create(&p->thread, NULL, pool_thread_main, p) != 0) {
        rc = cairn_err_set(err, CAIRN_ERR_INTERNAL, "cannot start the model pool thread");
        goto fail;
    }
    p->thread_started = 1;
    LOG_INFO("pool", "%d models; memory limit %.2f GiB", p->n_models,
             (double)engine_guard_limit(p->guard) / (1024.0 * 1024 * 1024));
    p->t_rescan = cairn_now();
    *out = p;
    return CAIRN_OK;
fail:
    pool_destroy(p);
    return rc;
}

void pool_destroy(struct pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->thread_started) pthread_join(p->thread, NULL);
    pool_reqs_cancel_all(p); /* parked requests get DONE; running ones end with their engine */
    for (int i = 0; i < p->n_models; i++) {
        pool_model_release(&p->models[i]);
        if (p->guard) engine_guard_release(p->guard, &p->models[i].hold);
        if (p->dguard) engine_guard_release(p->dguard, &p->models[i].dhold);
    }
    free(p->models);
    json_decref(p->settings);
    engine_guard_free(p->guard);
    engine_guard_free(p->dguard);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->gvocab_mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->cv_work);
    free(p);
}

const struct model_info *pool_model_info(const struct pool_model *m)
{
    return m->grp ? model_group_info(m->grp) : m->m ? model_get_info(m->m) : NULL;
}

json_t *pool_devices_json(const struct pool *p)
{
    json_t *o = json_object(), *d = json_array();
    const struct backend_tp *tp = p->opts.tp;
    json_object_set_new(o, "tensor_parallel", json_integer(tp ? tp->world : 1));
    json_object_set_new(o, "sharded", json_boolean(tp != NULL)); /* a rank group (of one: CAIRN_TP_FORCE) */
    if (tp)
        for (int r = 0; r < tp->world; r++) json_array_append_new(d, json_string(tp->bes[r]->name));
    else if (p->opts.device)
        json_array_append_new(d, json_string(p->opts.device->name));
    json_object_set_new(o, "devices", d);
    return o;
}
