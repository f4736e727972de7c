/* synth-model: random-weight checkpoints from a config (see synth.h). The tensor list comes
 * from the family's weight specs, the same list the loader binds, so whatever synth writes
 * the loader accepts. */
#include "model/synth.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "model/model_int.h"

static uint64_t model_synth_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t model_synth_name_seed(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull ^ model_synth_mix(seed + 0x9e3779b97f4a7c15ull);
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return model_synth_mix(h);
}

/* Approximately standard normal: Irwin-Hall sum of 4 uniforms, rescaled (cheap; the weights
 * only need to be random and of the right scale). */
static void model_synth_fill(uint64_t *state, float *out, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = model_synth_mix(*state += 0x9e3779b97f4a7c15ull);
        float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) +
                  (float)(r >> 48);
        out[i] = (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f * scale;
    }
}

void model_synth_quantize_row(const float *x, int64_t n, int bits, int group_size, uint32_t *words,
                              uint16_t *scales, uint16_t *biases)
{
    uint32_t maxq = (1u << bits) - 1;
    memset(words, 0, sizeof(uint32_t) * (size_t)(n * bits / 32));
    for (int64_t g = 0; g < n / group_size; g++) {
        const float *v = x + g * group_size;
        float lo = v[0], hi = v[0];
        for (int i = 1; i < group_size; i++) {
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
        float scale = (hi - lo) / (float)maxq;
        if (!(scale > 1e-12f)) scale = 1e-12f;
        /* Dequantization uses the bf16-rounded scale and bias: quantize against those. */
        uint16_t sb = f32_to_bf16(scale), bb = f32_to_bf16(lo);
        float s = bf16_to_f32(sb), b = bf16_to_f32(bb);
        if (!(s > 0)) s = 1e-12f;
        scales[g] = sb;
        biases[g] = bb;
        for (int i = 0; i < group_size; i++) {
            float qf = roundf((v[i] - b) / s);
            uint32_t q = qf < 0 ? 0 : qf > (float)maxq ? maxq : (uint32_t)qf;
            int64_t bit = (g * group_size + i) * bits;
            words[bit / 32] |= q << (bit % 32);
            if ((bit % 32) + bits > 32) words[bit / 32 + 1] |= q >> (32 - bit % 32);
        }
    }
}

static int model_synth_quantizable(const struct model_synth_opts *o, const struct model_wspec *s)
{
    return o->bits > 0 && s->kind == MODEL_WSPEC_LINEAR && s->cols % o->group_size == 0 &&
           (s->cols * o->bits) % 32 == 0;
}

/* Bytes of every tensor a spec writes (weight or codes + scales + biases, bias). */
static uint64_t model_synth_spec_bytes(const struct model_synth_opts *o,
                                       const struct model_wspec *s)
{
    if (s->kind == MODEL_WSPEC_VECTOR) return 2 * (uint64_t)s->rows;
    uint64_t b;
    if (model_synth_quantizable(o, s))
        b = (uint64_t)s->rows * (uint64_t)(s->cols * o->bits / 32) * 4 +
            2 * 2 * (uint64_t)s->rows * (uint64_t)(s->cols / o->group_size);
    else
        b = 2 * (uint64_t)s->rows * (uint64_t)s->cols;
    if (s->bias == MODEL_BIAS_REQUIRED) b += 2 * (uint64_t)s->rows;
    return b;
}

/* Adds "tensor": "file" for every tensor of spec s to the index's weight_map. */
static void model_synth_index_add(json_t *wm, const struct model_synth_opts *o,
                                  const struct model_wspec *s, const char *file)
{
    char name[200];
    if (s->kind == MODEL_WSPEC_VECTOR) {
        json_object_set_new(wm, s->name, json_string(file));
        return;
    }
    static const char *const sfx[] = {"weight", "scales", "biases", "bias"};
    for (int k = 0; k < 4; k++) {
        if ((k == 1 || k == 2) && !model_synth_quantizable(o, s)) continue;
        if (k == 3 && s->bias != MODEL_BIAS_REQUIRED) continue;
        snprintf(name, sizeof(name), "%s.%s", s->name, sfx[k]);
        json_object_set_new(wm, name, json_string(file));
    }
}

static int model_synth_declare(struct safetensors_writer *w, const struct model_synth_opts *o,
                               const struct model_specs *sp, int i0, int i1, struct cairn_err *err)
{
    char name[200];
    int rc = CAIRN_OK;
    for (int i = i0; i < i1 && rc == CAIRN_OK; i++) {
        const struct model_wspec *s = &sp->v[i];
        if (s->kind == MODEL_WSPEC_VECTOR) {
            rc = safetensors_writer_tensor(w, s->name, DTYPE_BF16, 1, &s->rows, err);
            continue;
        }
        snprintf(name, sizeof(name), "%s.weight", s->name);
        if (model_synth_quantizable(o, s)) {
            int64_t ws[2] = {s->rows, s->cols * o->bits / 32},
                    ss[2] = {s->rows, s->cols / o->group_size};
            rc = safetensors_writer_tensor(w, name, DTYPE_U32, 2, ws, err);
            snprintf(name, sizeof(name), "%s.scales", s->name);
            if (rc == CAIRN_OK) rc = safetensors_writer_tensor(w, name, DTYPE_BF16, 2, ss, err);
            snprintf(name, sizeof(name), "%s.biases", s->name);
            if (rc == CAIRN_OK) rc = safetensors_writer_tensor(w, name, DTYPE_BF16, 2, ss, err);
        } else {
            int64_t sh[2] = {s->rows, s->cols};
            rc = safetensors_writer_tensor(w, name, DTYPE_BF16, 2, sh, err);
        }
        if (rc == CAIRN_OK && s->bias == MODEL_BIAS_REQUIRED) {
            snprintf(name, sizeof(name), "%s.bias", s->name);
            rc = safetensors_writer_tensor(w, name, DTYPE_BF16, 1, &s->rows, err);
        }
    }
    return rc;
}

static int model_synth_write_bf16(struct safetensors_writer *w, const float *x, int64_t n,
                                  uint16_t *tmp, struct cairn_err *err)
{
    for (int64_t i = 0; i < n; i++)
        tmp[i] = f32_to_bf16(x[i]);
    return safetensors_writer_write(w, tmp, (size_t)n * 2, err);
}

static int model_synth_write_data(struct safetensors_writer *w, const struct model_synth_opts *o,
                                  const struct model_specs *sp, int i0, int i1,
                                  struct cairn_err *err)
{
    int64_t max_cols = 1, max_rows = 1;
    for (int i = 0; i < sp->n; i++) {
        max_cols = CAIRN_MAX(max_cols,
                             sp->v[i].kind == MODEL_WSPEC_LINEAR ? sp->v[i].cols : sp->v[i].rows);
        max_rows = CAIRN_MAX(max_rows, sp->v[i].rows);
    }
    int64_t gs = o->group_size > 0 ? o->group_size : 1;
    float *row = malloc(sizeof(float) * (size_t)max_cols);
    uint16_t *tmp = malloc(sizeof(uint16_t) * (size_t)CAIRN_MAX(max_cols, max_rows));
    uint32_t *words = malloc(sizeof(uint32_t) * (size_t)(max_cols));
    size_t qbuf_elems = 0;
    for (int i = 0; i < sp->n; i++)
        if (model_synth_quantizable(o, &sp->v[i]))
            qbuf_elems =
                CAIRN_MAX(qbuf_elems, (size_t)sp->v[i].rows * (size_t)(sp->v[i].cols / gs));
    uint16_t *scales = malloc(sizeof(uint16_t) * (qbuf_elems ? qbuf_elems : 1));
    uint16_t *biases = malloc(sizeof(uint16_t) * (qbuf_elems ? qbuf_elems : 1));
    int rc = CAIRN_OK;
    if (!row || !tmp || !words || !scales || !biases) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "synth-model: out of memory");
        goto done;
    }
    for (int i = i0; i < i1 && rc == CAIRN_OK; i++) {
        const struct model_wspec *s = &sp->v[i];
        uint64_t st = model_synth_name_seed(o->seed, s->name);
        if (s->kind == MODEL_WSPEC_VECTOR) {
            if (s->synth_random)
                model_synth_fill(&st, row, s->rows, 0.02f);
            else
                for (int64_t j = 0; j < s->rows; j++)
                    row[j] = s->synth_value;
            rc = model_synth_write_bf16(w, row, s->rows, tmp, err);
            continue;
        }
        float scale = 1.0f / sqrtf((float)s->cols);
        if (model_synth_quantizable(o, s)) {
            int64_t groups = s->cols / o->group_size, nw = s->cols * o->bits / 32;
            for (int64_t r = 0; r < s->rows && rc == CAIRN_OK; r++) {
                model_synth_fill(&st, row, s->cols, scale);
                model_synth_quantize_row(row, s->cols, o->bits, o->group_size, words,
                                         scales + r * groups, biases + r * groups);
                rc = safetensors_writer_write(w, words, sizeof(uint32_t) * (size_t)nw, err);
            }
            if (rc == CAIRN_OK)
                rc = safetensors_writer_write(w, scales, 2 * (size_t)(s->rows * groups), err);
            if (rc == CAIRN_OK)
                rc = safetensors_writer_write(w, biases, 2 * (size_t)(s->rows * groups), err);
        } else {
            for (int64_t r = 0; r < s->rows && rc == CAIRN_OK; r++) {
                model_synth_fill(&st, row, s->cols, scale);
                rc = model_synth_write_bf16(w, row, s->cols, tmp, err);
            }
        }
        if (rc == CAIRN_OK && s->bias == MODEL_BIAS_REQUIRED) {
            model_synth_fill(&st, row, s->rows, 0.02f);
            rc = model_synth_write_bf16(w, row, s->rows, tmp, err);
        }
    }
done:
    free(row);
    free(tmp);
    free(words);
    free(scales);
    free(biases);
    return rc;
}

/* config.json for the output: the input with quantization set (or removed). */
static int model_synth_write_config(const struct model_synth_opts *o, const char *text,
                                    struct cairn_err *err)
{
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root) return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: %s", o->config_path, jerr.text);
    json_object_del(root, "quantization");
    json_object_del(root, "quantization_config");
    if (o->bits > 0) {
        json_t *q = json_pack("{s:i, s:i}", "group_size", o->group_size, "bits", o->bits);
        json_object_set(root, "quantization", q);
        json_object_set_new(root, "quantization_config", q);
    }
    char *out = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!out) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", o->out_dir);
    int rc = cairn_file_write_atomic(path, out, strlen(out), err);
    free(out);
    return rc;
}

static int model_synth_copy_tokenizer(const struct model_synth_opts *o, struct cairn_err *err)
{
    static const char *const files[] = {"tokenizer.json",
                                        "tokenizer_config.json",
                                        "special_tokens_map.json",
                                        "generation_config.json",
                                        "chat_template.jinja",
                                        "chat_template.json",
                                        "vocab.json",
                                        "merges.txt",
                                        "tokenizer.model"};
    int n = 0;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(files); i++) {
        char src[4096], dst[4096];
        snprintf(src, sizeof(src), "%s/%s", o->tokenizer_dir, files[i]);
        snprintf(dst, sizeof(dst), "%s/%s", o->out_dir, files[i]);
        if (!cairn_file_exists(src)) continue;
        char *data;
        size_t len;
        int rc = cairn_file_read_all(src, 1u << 30, &data, &len, err);
        if (rc == CAIRN_OK) rc = cairn_file_write_atomic(dst, data, len, err);
        if (rc == CAIRN_OK) free(data);
        if (rc != CAIRN_OK) return rc;
        n++;
    }
    if (n == 0)
        return cairn_err_set(err, CAIRN_ERR_NOT_FOUND,
                             "%s: no tokenizer files (tokenizer.json, ...)", o->tokenizer_dir);
    return CAIRN_OK;
}

int model_synth(const struct model_synth_opts *o, struct cairn_err *err)
{
    if (o->bits != 0 &&
        (o->bits < 2 || o->bits > 8 || o->group_size <= 0 || o->group_size % 32 != 0))
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "synth-model: bits %d / group size %d not supported", o->bits,
                             o->group_size);
    char *text = NULL;
    size_t len;
    struct model m;
    memset(&m, 0, sizeof(m));
    struct model_specs sp = {0};
    struct safetensors_writer *w = NULL;
    int rc = cairn_file_read_all(o->config_path, 16u << 20, &text, &len, err);
    if (rc != CAIRN_OK) return rc;
    rc = model_config_parse(text, NULL, o->config_path, &m.cfg, err);
    if (rc != CAIRN_OK) goto done;
    m.cfg.q_bits = 0; /* the input's quantization, if any, is replaced */
    m.fam = model_family_get(m.cfg.arch);
    if (!m.fam) {
        rc = cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported yet",
                           o->config_path, m.cfg.model_type);
        goto done;
    }
    m.layers = calloc((size_t)m.cfg.n_layers, sizeof(*m.layers));
    if (!m.layers) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < m.cfg.n_layers; i++)
        m.layers[i].kind = m.cfg.layer_kinds[i];
    rc = m.fam->specs(&m, &sp, err);
    if (rc != CAIRN_OK) goto done;
    rc = cairn_mkdir_p(o->out_dir, err);
    if (rc != CAIRN_OK) goto done;
    /* Shards: consecutive specs up to shard_bytes each (one spec's tensors stay together). */
    uint64_t limit = o->shard_bytes ? o->shard_bytes : UINT64_MAX, total = 0, cur = 0;
    int n_shards = sp.n > 0 ? 1 : 0;
    for (int i = 0; i < sp.n; i++) {
        uint64_t b = model_synth_spec_bytes(o, &sp.v[i]);
        if (cur > 0 && cur + b > limit) {
            n_shards++;
            cur = 0;
        }
        cur += b;
        total += b;
    }
    json_t *index = n_shards > 1 ? json_object() : NULL, *wm = n_shards > 1 ? json_object() : NULL;
    int i0 = 0;
    for (int k = 0; k < n_shards && rc == CAIRN_OK; k++) {
        char file[64], path[4200];
        int i1 = i0;
        cur = 0;
        while (i1 < sp.n && (i1 == i0 || cur + model_synth_spec_bytes(o, &sp.v[i1]) <= limit))
            cur += model_synth_spec_bytes(o, &sp.v[i1++]);
        if (n_shards > 1)
            snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        else
            snprintf(file, sizeof(file), "model.safetensors");
        snprintf(path, sizeof(path), "%s/%s", o->out_dir, file);
        rc = safetensors_writer_open(path, &w, err);
        if (rc == CAIRN_OK) rc = safetensors_writer_meta(w, "format", o->bits ? "mlx" : "pt", err);
        if (rc == CAIRN_OK) rc = model_synth_declare(w, o, &sp, i0, i1, err);
        if (rc == CAIRN_OK) rc = safetensors_writer_begin(w, err);
        if (rc == CAIRN_OK) rc = model_synth_write_data(w, o, &sp, i0, i1, err);
        if (rc == CAIRN_OK) {
            rc = safetensors_writer_commit(w, err);
            w = NULL;
        }
        for (int i = i0; wm && i < i1; i++)
            model_synth_index_add(wm, o, &sp.v[i], file);
        i0 = i1;
    }
    if (rc == CAIRN_OK && index) {
        json_object_set_new(index, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total));
        json_object_set(index, "weight_map", wm);
        char *itext = json_dumps(index, JSON_INDENT(2) | JSON_PRESERVE_ORDER), path[4200];
        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", o->out_dir);
        rc = itext ? cairn_file_write_atomic(path, itext, strlen(itext), err)
                   : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        free(itext);
    }
    json_decref(wm);
    json_decref(index);
    if (rc == CAIRN_OK) rc = model_synth_write_config(o, text, err);
    if (rc == CAIRN_OK && o->tokenizer_dir) rc = model_synth_copy_tokenizer(o, err);
done:
    safetensors_writer_abort(w);
    if (m.fam && m.fam->free_ext) m.fam->free_ext(&m); /* specs() may have allocated ext */
    model_specs_free(&sp);
    free(m.layers);
    model_config_free(&m.cfg);
    free(text);
    return rc;
}
