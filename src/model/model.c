/* Model loading: config, family lookup, binding every weight spec from the safetensors set
 * (dtype/shape checks, MLX quantization, f32 conversion of small vectors into device buffers),
 * identity hash, preparing every weight on the model's backend, workspace reservation. A
 * tensor-parallel rank (model_load_shard) binds its share of each weight (shard_bind.c) and
 * then runs with its local sizes. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/log.h"
#include "base/mem.h"
#include "model/model_identity.h"
#include "model/model_int.h"
#include "model/shard.h"

static void model_ws_free(struct model *m);

const struct model_family *model_family_get(enum model_arch arch)
{
    switch (arch) {
    case MODEL_ARCH_LLAMA:
    case MODEL_ARCH_QWEN2:
    case MODEL_ARCH_QWEN3:
        return &model_family_llama;
    case MODEL_ARCH_QWEN3_MOE:
        return &model_family_qwen3_moe;
    case MODEL_ARCH_QWEN3_NEXT:
    case MODEL_ARCH_QWEN3_5:
    case MODEL_ARCH_QWEN3_5_MOE:
        return &model_family_qwen3_hybrid;
    }
    return NULL;
}

/* ---- spec lists ---- */

static struct model_wspec *model_specs_push(struct model_specs *s)
{
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        struct model_wspec *v = realloc(s->v, sizeof(*v) * (size_t)cap);
        if (!v) return NULL;
        s->v = v;
        s->cap = cap;
    }
    struct model_wspec *w = &s->v[s->n++];
    memset(w, 0, sizeof(*w));
    return w;
}

struct model_wspec *model_specs_linear(struct model_specs *s, struct model_linear *dst,
                                       int64_t rows, int64_t cols, enum model_wspec_bias bias,
                                       const char *fmt, ...)
{
    struct model_wspec *w = model_specs_push(s);
    if (!w) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof(w->name), fmt, ap);
    va_end(ap);
    w->kind = MODEL_WSPEC_LINEAR;
    w->rows = rows;
    w->cols = cols;
    w->bias = bias;
    w->lin = dst;
    return w;
}

struct model_wspec *model_specs_vector(struct model_specs *s, float **dst, int64_t rows,
                                       float synth_value, const char *fmt, ...)
{
    struct model_wspec *w = model_specs_push(s);
    if (!w) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof(w->name), fmt, ap);
    va_end(ap);
    w->kind = MODEL_WSPEC_VECTOR;
    w->rows = rows;
    w->synth_value = synth_value;
    w->vec = dst;
    return w;
}

void model_specs_free(struct model_specs *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

void *model_alloc_owned(struct model *m, size_t bytes)
{
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        struct model_owned *o = realloc(m->owned, sizeof(*o) * (size_t)cap);
        if (!o) return NULL;
        m->owned = o;
        m->cap_owned = cap;
    }
    void *p = cairn_mem_alloc(bytes ? bytes : 1, CAIRN_MEM_WEIGHTS);
    if (!p) return NULL;
    m->owned[m->n_owned].p = p;
    m->owned[m->n_owned].bytes = bytes ? bytes : 1;
    m->n_owned++;
    return p;
}

float *model_dev_vector(struct model *m, const float *host, size_t n, struct cairn_err *err)
{
    if (m->n_dev == m->cap_dev) {
        int cap = m->cap_dev ? m->cap_dev * 2 : 64;
        struct model_dev_buf *d = realloc(m->dev, sizeof(*d) * (size_t)cap);
        if (!d) {
            cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            return NULL;
        }
        m->dev = d;
        m->cap_dev = cap;
    }
    size_t bytes = (n ? n : 1) * sizeof(float);
    void *p = NULL;
    if (m->be->ops->buf_alloc(m->be, bytes, CAIRN_MEM_WEIGHTS, &p, err) != CAIRN_OK) return NULL;
    if (n && m->be->ops->buf_upload(m->be, p, host, n * sizeof(float), err) != CAIRN_OK) {
        m->be->ops->buf_free(m->be, p, bytes, CAIRN_MEM_WEIGHTS);
        return NULL;
    }
    m->dev[m->n_dev].p = p;
    m->dev[m->n_dev].bytes = bytes;
    m->n_dev++;
    return p;
}

/* ---- binding ---- */

/* "model.safetensors" or "model.safetensors.index.json" for messages about a missing tensor. */
static const char *model_where(const struct model *m)
{
    return m->st.n_files > 1 ? "model.safetensors.index.json" : "model.safetensors";
}

static void model_shape_str(const struct safetensors_tensor *t, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->n_dims && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "] %s", t->dtype_str);
}

static int model_tensor_err(struct model *m, const struct safetensors_tensor *t, const char *expect,
                            struct cairn_err *err)
{
    char got[128];
    model_shape_str(t, got, sizeof(got));
    return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s/%s: tensor '%s': expected %s, got %s", m->st.dir,
                         safetensors_set_file_name(&m->st, t), t->name, expect, got);
}

static const struct safetensors_tensor *model_find(struct model *m, const char *name)
{
    return safetensors_set_find(&m->st, name);
}

void model_layer_name(const struct model *m, int il, char *buf, size_t n)
{
    if (il < m->cfg.n_layers) snprintf(buf, n, "model.layers.%d", il);
    else snprintf(buf, n, "mtp.layers.%d", il - m->cfg.n_layers);
}

int model_has_tensor(struct model *m, const char *name)
{
    return model_find(m, name) != NULL;
}

int64_t model_tensor_rows(struct model *m, const char *name)
{
    const struct safetensors_tensor *t = model_find(m, name);
    return t && t->n_dims >= 1 ? t->shape[0] : -1;
}

/* A stacked [stack, r, c] tensor (MLX switch_mlp experts) read as 2-D [stack * r, c]: expert e
 * is then rows [e * r, (e + 1) * r). Returns t itself when there is nothing to flatten. */
static const struct safetensors_tensor *model_flatten_stack(const struct safetensors_tensor *t, int stack,
                                                            struct safetensors_tensor *tmp)
{
    if (!t || stack <= 1 || t->n_dims != 3 || t->shape[0] != stack) return t;
    *tmp = *t;
    tmp->n_dims = 2;
    tmp->shape[0] = t->shape[0] * t->shape[1];
    tmp->shape[1] = t->shape[2];
    return tmp;
}

/* Data pointer with the element alignment the kernels need (copies if the file's is odd). */
static const void *model_aligned(struct model *m, const struct safetensors_tensor *t)
{
    size_t a = t->elem_bytes ? t->elem_bytes : 1;
    if (((uintptr_t)t->data % a) == 0) return t->data;
    void *p = model_alloc_owned(m, t->n_bytes);
    if (p) memcpy(p, t->data, t->n_bytes);
    return p;
}

int model_vector_host(struct model *m, const char *name, int64_t rows, int optional, int flat, float **out,
                      struct cairn_err *err)
{
    const struct safetensors_tensor *t = model_find(m, name);
    *out = NULL;
    if (!t) {
        if (optional) return CAIRN_OK;
        return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "%s/%s: missing tensor '%s' (expected [%lld])", m->st.dir,
                             model_where(m), name, (long long)rows);
    }
    char expect[64];
    snprintf(expect, sizeof(expect), "[%lld] F32/F16/BF16", (long long)rows);
    int64_t n_elems = 1;
    for (int d = 0; d < t->n_dims; d++) n_elems *= t->shape[d];
    int shape_ok = flat ? n_elems == rows : (t->n_dims == 1 && t->shape[0] == rows);
    if (!shape_ok || !t->dtype_ok ||
        (t->dtype != DTYPE_F32 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_BF16))
        return model_tensor_err(m, t, expect, err);
    float *v = malloc((size_t)(rows > 0 ? rows : 1) * sizeof(float));
    if (!v) return cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", name);
    const uint8_t *d = t->data;
    for (int64_t i = 0; i < rows; i++) {
        if (t->dtype == DTYPE_F32) {
            memcpy(&v[i], d + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, d + 2 * i, 2);
            v[i] = t->dtype == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    *out = v;
    return CAIRN_OK;
}

/* A 1-D tensor of `rows` floats (F32/F16/BF16) converted to an owned f32 device vector. */
static int model_bind_vector(struct model *m, const char *name, int64_t rows, float **out,
                             int optional, int flat, struct cairn_err *err)
{
    float *v = NULL;
    *out = NULL;
    int rc = model_vector_host(m, name, rows, optional, flat, &v, err);
    if (rc != CAIRN_OK || !v) return rc;
    *out = model_dev_vector(m, v, (size_t)rows, err);
    free(v);
    if (!*out) {
        cairn_err_prefix(err, "%s", name);
        return err ? err->status : CAIRN_ERR_NOMEM;
    }
    return CAIRN_OK;
}

/* MLX scales/biases as bf16 (converted from f16/f32 if stored so). */
static const uint16_t *model_bf16_view(struct model *m, const struct safetensors_tensor *t)
{
    if (t->dtype == DTYPE_BF16 && ((uintptr_t)t->data % 2) == 0) return (const uint16_t *)t->data;
    uint16_t *p = model_alloc_owned(m, (size_t)t->n_elems * 2);
    if (!p) return NULL;
    const uint8_t *d = t->data;
    for (uint64_t i = 0; i < t->n_elems; i++) {
        float f;
        uint16_t h;
        if (t->dtype == DTYPE_F32) {
            memcpy(&f, d + 4 * i, 4);
        } else {
            memcpy(&h, d + 2 * i, 2);
            f = t->dtype == DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        p[i] = f32_to_bf16(f);
    }
    return p;
}

static int model_bind_quant(struct model *m, const struct model_wspec *s,
                            const struct safetensors_tensor *w, const struct safetensors_tensor *sc,
                            struct cairn_err *err)
{
    char name[200], expect[256];
    snprintf(name, sizeof(name), "%s.biases", s->name);
    struct safetensors_tensor bi_flat;
    const struct safetensors_tensor *bi = model_flatten_stack(model_find(m, name), s->stack, &bi_flat);
    if (!bi)
        return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "%s/%s: missing tensor '%s' (quantized '%s' has .scales)",
                             m->st.dir, model_where(m), name, s->name);
    int cfg_bits = 0, cfg_gs = 0;
    model_config_quant_for(&m->cfg, s->name, &cfg_bits, &cfg_gs);
    int64_t rows = s->rows, cols = s->cols;
    snprintf(expect, sizeof(expect), "U32 [%lld, in*bits/32] for in=%lld", (long long)rows, (long long)cols);
    if (w->n_dims != 2 || w->shape[0] != rows || !w->dtype_ok || (w->dtype != DTYPE_U32 && w->dtype != DTYPE_I32) ||
        w->shape[1] <= 0)
        return model_tensor_err(m, w, expect, err);
    snprintf(expect, sizeof(expect), "[%lld, in/group_size] BF16/F16/F32", (long long)rows);
    if (sc->n_dims != 2 || sc->shape[0] != rows || sc->shape[1] <= 0 || !sc->dtype_ok ||
        (sc->dtype != DTYPE_BF16 && sc->dtype != DTYPE_F16 && sc->dtype != DTYPE_F32))
        return model_tensor_err(m, sc, expect, err);
    char got[128];
    model_shape_str(sc, got, sizeof(got));
    snprintf(expect, sizeof(expect), "the shape and dtype of .scales (%s)", got);
    if (bi->n_dims != 2 || bi->shape[0] != rows || bi->shape[1] != sc->shape[1] || bi->dtype != sc->dtype ||
        !bi->dtype_ok)
        return model_tensor_err(m, bi, expect, err);
    int64_t words = w->shape[1], groups = sc->shape[1];
    int bits = cfg_bits, gs = cfg_gs;
    int consistent = bits >= 2 && bits <= 8 && gs > 0 && cols % gs == 0 && cols / gs == groups &&
                     (cols * bits) % 32 == 0 && cols * bits / 32 == words;
    if (!consistent) {
        /* Derive from the packed shapes: words = in*bits/32, groups = in/group_size. */
        int dbits = (words * 32) % cols == 0 ? (int)(words * 32 / cols) : 0;
        int dgs = cols % groups == 0 ? (int)(cols / groups) : 0;
        if (dbits < 2 || dbits > 8 || dgs <= 0) {
            snprintf(expect, sizeof(expect), "U32 [%lld, %lld*bits/32] with bits 2..8 (config: bits %d, group %d)",
                     (long long)rows, (long long)cols, cfg_bits, cfg_gs);
            return model_tensor_err(m, w, expect, err);
        }
        if (m->n_q_derived++ == 0)
            LOG_INFO("model", "%s: bits=%d group_size=%d derived from packed shapes (config says bits=%d group_size=%d)",
                     s->name, dbits, dgs, cfg_bits, cfg_gs);
        bits = dbits;
        gs = dgs;
    }
    struct tensor *t = &s->lin->w;
    memset(t, 0, sizeof(*t));
    t->dtype = DTYPE_Q;
    t->n_dims = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->bits = bits;
    t->group_size = gs;
    t->data = model_aligned(m, w);
    t->scales = model_bf16_view(m, sc);
    t->biases = model_bf16_view(m, bi);
    if (!t->data || !t->scales || !t->biases) return cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", s->name);
    return CAIRN_OK;
}

int model_bind_spec(struct model *m, const struct model_wspec *s, struct cairn_err *err)
{
    if (s->kind == MODEL_WSPEC_VECTOR) return model_bind_vector(m, s->name, s->rows, s->vec, s->optional, s->flat, err);
    char name[200], expect[256];
    snprintf(name, sizeof(name), "%s.weight", s->name);
    struct safetensors_tensor w_flat, sc_flat;
    const struct safetensors_tensor *w = model_flatten_stack(model_find(m, name), s->stack, &w_flat);
    memset(s->lin, 0, sizeof(*s->lin));
    if (!w) {
        if (s->optional) return CAIRN_OK;
        return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "%s/%s: missing tensor '%s' (expected [%lld, %lld])", m->st.dir,
                             model_where(m), name, (long long)s->rows, (long long)s->cols);
    }
    snprintf(name, sizeof(name), "%s.scales", s->name);
    const struct safetensors_tensor *sc = model_flatten_stack(model_find(m, name), s->stack, &sc_flat);
    int rc;
    if (sc) {
        rc = model_bind_quant(m, s, w, sc, err);
    } else {
        snprintf(expect, sizeof(expect), "[%lld, %lld] F32/F16/BF16", (long long)s->rows, (long long)s->cols);
        if (w->n_dims != 2 || w->shape[0] != s->rows || w->shape[1] != s->cols || !w->dtype_ok ||
            (w->dtype != DTYPE_F32 && w->dtype != DTYPE_F16 && w->dtype != DTYPE_BF16)) {
            if (w->dtype_ok && w->dtype == DTYPE_U32)
                snprintf(expect + strlen(expect), sizeof(expect) - strlen(expect), " (U32 needs .scales/.biases)");
            return model_tensor_err(m, w, expect, err);
        }
        struct tensor *t = &s->lin->w;
        t->dtype = w->dtype;
        t->n_dims = 2;
        t->shape[0] = s->rows;
        t->shape[1] = s->cols;
        t->data = model_aligned(m, w);
        rc = t->data ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    if (rc != CAIRN_OK || s->bias == MODEL_BIAS_NONE) return rc;
    snprintf(name, sizeof(name), "%s.bias", s->name);
    return model_bind_vector(m, name, s->rows, &s->lin->bias, s->bias == MODEL_BIAS_OPTIONAL, 0, err);
}

/* ---- load / free ---- */

static void model_fill_info(struct model *m)
{
    struct model_info *in = &m->info;
    const struct model_config *c = &m->cfg;
    in->arch = c->arch;
    snprintf(in->model_type, sizeof(in->model_type), "%s", c->model_type);
    in->vocab_size = c->vocab_size;
    in->hidden_size = c->hidden_size;
    in->n_layers = c->n_layers;
    in->n_heads = c->n_heads;
    in->n_kv_heads = c->n_kv_heads;
    in->head_dim = c->head_dim;
    in->max_position = c->max_position;
    memcpy(in->eos_ids, c->eos_ids, sizeof(in->eos_ids));
    in->n_eos = c->n_eos;
    in->bos_id = c->bos_id;
    in->gen = c->gen;
    in->n_experts = c->n_experts;
    in->n_experts_per_tok = c->n_experts_per_tok;
    for (int i = 0; i < m->st.n_tensors; i++) {
        const struct safetensors_tensor *t = m->st.index[i];
        in->weight_bytes += t->n_bytes;
        if (strstr(t->name, ".mlp.experts.") || strstr(t->name, ".mlp.switch_mlp.")) in->routed_expert_bytes += t->n_bytes;
        if (!c->tie_word_embeddings && strncmp(t->name, "model.embed_tokens.", 19) == 0)
            in->untied_embed_bytes += t->n_bytes;
        size_t len = strlen(t->name);
        /* Quantized: count logical elements of .weight, skip .scales/.biases. */
        if (len > 7 && (strcmp(t->name + len - 7, ".scales") == 0 || strcmp(t->name + len - 7, ".biases") == 0))
            continue;
        uint64_t n = t->n_elems;
        if (t->dtype_ok && t->dtype == DTYPE_U32 && t->n_dims == 2) {
            char sname[512];
            snprintf(sname, sizeof(sname), "%.*s.scales", (int)(len - 7), t->name);
            if (len > 7 && strcmp(t->name + len - 7, ".weight") == 0 && safetensors_set_find(&m->st, sname)) {
                /* words * 32 / bits logical values; bits unknown here: use the layer's tensor */
                n = 0;
            }
        }
        in->n_params += n;
    }
}

static int model_note_prepared(struct model *m, struct tensor *t)
{
    if (m->n_prepared == m->cap_prepared) {
        int cap = m->cap_prepared ? m->cap_prepared * 2 : 64;
        struct tensor **p = realloc(m->prepared, sizeof(*p) * (size_t)cap);
        if (!p) return CAIRN_ERR_NOMEM;
        m->prepared = p;
        m->cap_prepared = cap;
    }
    m->prepared[m->n_prepared++] = t;
    return CAIRN_OK;
}

/* Every bound linear goes through the backend's weight_prepare (the CPU packs MLX q4/q8 for its
 * VNNI kernel; a GPU uploads). An untied embedding is only looked up (LOOKUP_ONLY: the CPU
 * leaves it unpacked). When all of a weight's bytes are pages of the mmap'd files, the backend
 * may drop them once it has its own copy (RELEASE_HOST): resident memory then holds the weights
 * once; owned copies (converted scales, realigned data) are never dropped. */
static uint64_t model_spec_bytes(const struct model *m, const struct model_wspec *sp)
{
    char name[600];
    snprintf(name, sizeof(name), "%s.weight", sp->name);
    const struct safetensors_tensor *t = safetensors_set_find(&m->st, name);
    return t ? t->n_bytes : 0;
}

static int model_prepare_weights(struct model *m, const struct model_specs *s, struct model_load_progress *pr,
                                 struct cairn_err *err)
{
    if (pr) {
        uint64_t total = 0;
        for (int i = 0; i < s->n; i++)
            if (s->v[i].kind == MODEL_WSPEC_LINEAR && s->v[i].lin->w.data) total += model_spec_bytes(m, &s->v[i]);
        __atomic_store_n(&pr->bytes_total, total, __ATOMIC_RELAXED);
    }
    for (int i = 0; i < s->n; i++) {
        const struct model_wspec *sp = &s->v[i];
        if (sp->kind != MODEL_WSPEC_LINEAR || !sp->lin->w.data) continue;
        struct tensor *t = &sp->lin->w;
        int flags = 0;
        if (sp->lin == &m->embed && !m->cfg.tie_word_embeddings) flags |= BACKEND_WEIGHT_LOOKUP_ONLY;
        if (safetensors_set_maps(&m->st, t->data) &&
            (t->dtype != DTYPE_Q || (safetensors_set_maps(&m->st, t->scales) && safetensors_set_maps(&m->st, t->biases))))
            flags |= BACKEND_WEIGHT_RELEASE_HOST;
        size_t extra = 0;
        int rc = m->be->ops->weight_prepare(m->be, t, flags, &extra, err);
        if (rc != CAIRN_OK) {
            cairn_err_prefix(err, "%s", sp->name);
            return rc;
        }
        if (model_note_prepared(m, t) != CAIRN_OK) {
            m->be->ops->weight_release(m->be, t);
            return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        }
        if (pr) __atomic_fetch_add(&pr->bytes_done, model_spec_bytes(m, sp), __ATOMIC_RELAXED);
    }
    return CAIRN_OK;
}

/* Adds the logical element count of quantized linears (known after binding). */
static void model_count_quant(struct model *m, const struct model_specs *s)
{
    for (int i = 0; i < s->n; i++) {
        const struct model_wspec *w = &s->v[i];
        if (w->kind == MODEL_WSPEC_LINEAR && w->lin->w.dtype == DTYPE_Q)
            m->info.n_params += (uint64_t)w->rows * (uint64_t)w->cols;
    }
}

int model_load(const char *dir, struct backend *be, struct model **out, struct cairn_err *err)
{
    return model_load_watch(dir, be, NULL, out, err);
}

/* Loads the whole model, or (shard != NULL) the rank's share of it under that plan. */
static int model_load_impl(const char *dir, struct backend *be, struct model_load_progress *pr,
                           const struct shard_plan *shard, struct model **out, struct cairn_err *err)
{
    *out = NULL;
    if (!be) return cairn_err_set(err, CAIRN_ERR_INVALID, "model_load: no backend");
    struct model *m = calloc(1, sizeof(*m));
    if (!m) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    m->be = be;
    struct model_specs specs = {0};
    int rc = model_config_load(dir, &m->cfg, err);
    if (rc != CAIRN_OK) goto fail_cfg;
    m->fam = model_family_get(m->cfg.arch);
    if (!m->fam) {
        rc = cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s/config.json: architecture '%s' is not supported yet",
                           dir, m->cfg.model_type);
        goto fail;
    }
    rc = safetensors_set_open(dir, &m->st, err);
    if (rc != CAIRN_OK) goto fail;
    if (shard && m->cfg.n_mtp_layers > 0) { /* model_group.h: the head does not run sharded */
        LOG_INFO("model", "%s: tensor parallel: loading without its MTP head", dir);
        m->cfg.n_mtp_layers = 0;
    }
    /* the MTP head's layers (if any) follow the target's: full attention, KV layers after its */
    m->layers = calloc((size_t)(m->cfg.n_layers + m->cfg.n_mtp_layers), sizeof(*m->layers));
    if (!m->layers) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    int n_kv = 0;
    for (int i = 0; i < m->cfg.n_layers + m->cfg.n_mtp_layers; i++) {
        m->layers[i].kind = i < m->cfg.n_layers ? m->cfg.layer_kinds[i] : MODEL_LAYER_ATTN;
        m->layers[i].kv_index = m->layers[i].kind == MODEL_LAYER_ATTN ? n_kv++ : -1;
    }
    rc = m->fam->specs(m, &specs, err);
    if (rc != CAIRN_OK) goto fail;
    /* the family sets n_mtp when it found the head's weights */
    n_kv -= m->cfg.n_mtp_layers - m->n_mtp;
    m->info.n_kv_layers = n_kv;
    m->info.n_mtp_layers = m->n_mtp;
    for (int i = 0; i < specs.n; i++) {
        rc = shard ? shard_bind_spec(m, shard, &specs.v[i], err) : model_bind_spec(m, &specs.v[i], err);
        if (rc != CAIRN_OK) goto fail;
    }
    if (shard) {
        /* from here on the rank runs with its local sizes (heads, intermediate, DeltaNet heads) */
        shard_localize_config(shard, &m->cfg);
        m->tp_world = shard->world;
    }
    if (m->n_q_derived > 1)
        LOG_INFO("model", "%s: quantization of %d linears in all derived from packed shapes", dir, m->n_q_derived);
    /* reads the files: before the backend drops pages of prepared weights */
    rc = model_identity_compute(&m->st, NULL, m->info.identity, NULL, err);
    if (rc != CAIRN_OK) goto fail;
    rc = model_prepare_weights(m, &specs, pr, err);
    if (rc != CAIRN_OK) goto fail;
    if (m->cfg.tie_word_embeddings) m->lm_head = m->embed;
    if (m->fam->post_bind) {
        rc = m->fam->post_bind(m, err);
        if (rc != CAIRN_OK) goto fail;
    }
    {
        size_t n_freq = (size_t)(m->cfg.rot_dim / 2);
        float *freq = malloc(sizeof(float) * (n_freq ? n_freq : 1));
        if (!freq) {
            rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            goto fail;
        }
        model_config_rope_inv_freq(&m->cfg, freq);
        m->inv_freq = model_dev_vector(m, freq, n_freq, err);
        free(freq);
        if (!m->inv_freq) {
            rc = err ? err->status : CAIRN_ERR_NOMEM;
            goto fail;
        }
    }
    model_fill_info(m);
    model_count_quant(m, &specs);
    model_specs_free(&specs);
    char hex[65];
    cairn_hex(m->info.identity, 8, hex);
    LOG_INFO("model", "loaded %s: %s, %d layers (%d with KV), hidden %d, vocab %d, %llu params, id %s%s", dir,
             m->cfg.model_type, m->cfg.n_layers, n_kv, m->cfg.hidden_size, m->cfg.vocab_size,
             (unsigned long long)m->info.n_params, hex, m->n_mtp ? ", MTP head" : "");
    *out = m;
    return CAIRN_OK;
fail:
    model_specs_free(&specs);
    model_free(m);
    return rc;
fail_cfg:
    free(m);
    return rc;
}

int model_load_watch(const char *dir, struct backend *be, struct model_load_progress *pr,
                     struct model **out, struct cairn_err *err)
{
    return model_load_impl(dir, be, pr, NULL, out, err);
}

int model_load_shard(const char *dir, struct backend *be, int rank, int world, struct model **out,
                     struct cairn_err *err)
{
    *out = NULL;
    if (world == 1 && rank == 0 && be && be->tp_world == 0) /* not in a group: the whole model */
        return model_load_impl(dir, be, NULL, NULL, out, err);
    if (!be || be->tp_world != world || be->tp_rank != rank || !be->ops->allreduce)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "model_load_shard: backend %s is not rank %d of a tensor-parallel group of %d",
                             be ? be->name : "(none)", rank, world);
    struct model_config cfg;
    int rc = model_config_load(dir, &cfg, err);
    if (rc != CAIRN_OK) return rc;
    struct shard_plan plan;
    rc = shard_plan_make(&cfg, world, rank, &plan, err);
    model_config_free(&cfg);
    if (rc != CAIRN_OK) {
        cairn_err_prefix(err, "%s", dir);
        return rc;
    }
    return model_load_impl(dir, be, NULL, &plan, out, err);
}

void model_free(struct model *m)
{
    if (!m) return;
    /* prepared tensors live in layers and family structs: release them first */
    for (int i = 0; i < m->n_prepared; i++) m->be->ops->weight_release(m->be, m->prepared[i]);
    free(m->prepared);
    if (m->fam && m->fam->free_ext) m->fam->free_ext(m);
    model_mtp_free(m);
    model_ws_free(m);
    for (int i = 0; i < m->n_dev; i++) m->be->ops->buf_free(m->be, m->dev[i].p, m->dev[i].bytes, CAIRN_MEM_WEIGHTS);
    free(m->dev);
    for (int i = 0; i < m->n_owned; i++) cairn_mem_free(m->owned[i].p, m->owned[i].bytes, CAIRN_MEM_WEIGHTS);
    free(m->owned);
    free(m->layers);
    safetensors_set_close(&m->st);
    model_config_free(&m->cfg);
    free(m);
}

const struct model_info *model_get_info(const struct model *m)
{
    return &m->info;
}

struct backend *model_backend(const struct model *m)
{
    return m->be;
}

void model_state_init(const struct model *m, void *state)
{
    if (!m->info.state_bytes) return;
    struct cairn_err err = {0};
    /* a device failure here also fails the sequence's next step (step_end) */
    if (m->be->ops->buf_zero(m->be, state, m->info.state_bytes, &err) != CAIRN_OK)
        LOG_WARN("model", "cannot zero a recurrent state: %s", err.msg);
}

/* ---- workspaces ---- */

/* Rows of logits per lm_head chunk: on the CPU 32 (a 128K vocab: 16 MB of logits in host memory);
 * on a device 256, so that a decode step of up to 256 sequences reads lm_head once (at 64 rows a
 * 32-row chunk read its 1 GB (8B, bf16) twice per step: 0.2 ms) */
#define MODEL_LOGIT_ROWS 32
#define MODEL_LOGIT_ROWS_DEVICE MODEL_LOGIT_ROWS_MAX

static void model_ws_free(struct model *m)
{
    struct model_ws *w = &m->ws;
    if (w->mem) m->be->ops->buf_free(m->be, w->mem, w->mem_bytes, CAIRN_MEM_SCRATCH);
    if (w->i32) m->be->ops->buf_free(m->be, w->i32, w->i32_cap * sizeof(int32_t), CAIRN_MEM_SCRATCH);
    if (w->h_i32) cairn_mem_free(w->h_i32, w->i32_cap * sizeof(int32_t), CAIRN_MEM_SCRATCH);
    free(w->h_ctx_len);
    free(w->h_sample_rows);
    free(w->h_sample_out);
    memset(w, 0, sizeof(*w));
    m->ws_ok = 0;
}

int model_reserve(struct model *m, int max_tokens, struct cairn_err *err)
{
    if (max_tokens <= 0 || max_tokens > (1 << 20))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "model_reserve: max_tokens %d out of range", max_tokens);
    if (m->ws_ok && m->ws.max_tokens >= max_tokens) return CAIRN_OK;
    const struct model_config *c = &m->cfg;
    size_t T = (size_t)max_tokens, hid = (size_t)c->hidden_size;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t inter = (size_t)CAIRN_MAX(c->intermediate_size, 1);
    size_t rows = CAIRN_MIN(T, (size_t)(m->be->host_visible ? MODEL_LOGIT_ROWS : MODEL_LOGIT_ROWS_DEVICE));
    size_t extra = m->fam->ws_extra_floats ? m->fam->ws_extra_floats(m, max_tokens) : 0;
    size_t gated = m->attn_gated ? 1 : 0; /* gated q_proj rows carry the gate too */
    size_t mtp = m->n_mtp ? 1 : 0;
    size_t floats[] = {T * hid, T * hid, T * hid, T * qd, gated * 2 * T * qd, T * kvd, T * kvd, T * qd, T * inter,
                       T * inter, gated * T * qd, T * hid, rows * (size_t)c->vocab_size, extra, mtp * 2 * T * hid};
    size_t total = 0;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(floats); i++) total += (floats[i] * 4 + 255) & ~(size_t)255;
    void *mem = NULL;
    int32_t *ctx_len = malloc(sizeof(int32_t) * T);
    struct backend_sample_row *srows = malloc(sizeof(*srows) * rows);
    struct backend_sample_out *sout = malloc(sizeof(*sout) * rows);
    if (!ctx_len || !srows || !sout) {
        free(ctx_len);
        free(srows);
        free(sout);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "model_reserve: out of memory");
    }
    int rc = m->be->ops->buf_alloc(m->be, total, CAIRN_MEM_SCRATCH, &mem, err);
    if (rc != CAIRN_OK) {
        free(ctx_len);
        free(srows);
        free(sout);
        cairn_err_prefix(err, "model_reserve");
        return rc;
    }
    model_ws_free(m);
    struct model_ws *w = &m->ws;
    w->mem = mem;
    w->mem_bytes = total;
    w->h_ctx_len = ctx_len;
    w->h_sample_rows = srows;
    w->h_sample_out = sout;
    w->max_tokens = max_tokens;
    w->logit_rows = (int)rows;
    float **ptrs[] = {&w->x, &w->h, &w->out, &w->q, &w->q_raw, &w->k, &w->v, &w->att, &w->gate, &w->up,
                      &w->qgate, &w->sel, &w->logits, &w->extra, &w->mtp_cat};
    size_t off = 0;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(floats); i++) {
        *ptrs[i] = floats[i] ? (float *)((uint8_t *)mem + off) : NULL;
        off += (floats[i] * 4 + 255) & ~(size_t)255;
    }
    /* i32 staging: a step's metadata plus some block-table entries; grows for long contexts */
    rc = model_i32_reserve(m, 5 * T + 1 + 4096, err);
    if (rc != CAIRN_OK) {
        model_ws_free(m);
        return rc;
    }
    m->ws_ok = 1;
    return CAIRN_OK;
}
