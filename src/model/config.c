/* config.json parsing: see config.h for what is understood. */
#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"

static const struct {
    const char *model_type;
    enum model_arch arch;
} model_arch_table[] = {
    {"llama", MODEL_ARCH_LLAMA},
    {"mistral", MODEL_ARCH_LLAMA},
    {"qwen2", MODEL_ARCH_QWEN2},
    {"qwen3", MODEL_ARCH_QWEN3},
    {"qwen3_moe", MODEL_ARCH_QWEN3_MOE},
    {"qwen3_next", MODEL_ARCH_QWEN3_NEXT},
    {"qwen3_5", MODEL_ARCH_QWEN3_5},
    {"qwen3_5_text", MODEL_ARCH_QWEN3_5},
    {"qwen3_5_moe", MODEL_ARCH_QWEN3_5_MOE},
    {"qwen3_5_moe_text", MODEL_ARCH_QWEN3_5_MOE},
};

int model_arch_from_type(const char *model_type)
{
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(model_arch_table); i++)
        if (strcmp(model_type, model_arch_table[i].model_type) == 0) return (int)model_arch_table[i].arch;
    return -1;
}

const char *model_arch_name(enum model_arch arch)
{
    switch (arch) {
    case MODEL_ARCH_LLAMA: return "llama";
    case MODEL_ARCH_QWEN2: return "qwen2";
    case MODEL_ARCH_QWEN3: return "qwen3";
    case MODEL_ARCH_QWEN3_MOE: return "qwen3_moe";
    case MODEL_ARCH_QWEN3_NEXT: return "qwen3_next";
    case MODEL_ARCH_QWEN3_5: return "qwen3_5";
    case MODEL_ARCH_QWEN3_5_MOE: return "qwen3_5_moe";
    }
    return "?";
}

/* Integer field (also accepts an integral real); def when absent or null. -1 status when the
 * value has the wrong type. */
static int config_int(const json_t *o, const char *key, int def, int *out)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < -2147483647LL || i > 2147483647LL) return -1;
        *out = (int)i;
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || fabs(d) > 2147483647.0) return -1;
        *out = (int)d;
        return 0;
    }
    return -1;
}

static int config_num(const json_t *o, const char *key, double def, double *out)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return -1;
    *out = json_number_value(v);
    return 0;
}

static int config_bool(const json_t *o, const char *key, int def, int *out)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return -1;
    *out = json_is_true(v);
    return 0;
}

/* eos_token_id: int or list of ints; returns count or -1 on a bad value. */
static int config_ids(const json_t *v, int32_t *ids, int max)
{
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        ids[0] = (int32_t)json_integer_value(v);
        return 1;
    }
    if (!json_is_array(v)) return -1;
    int n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e)) return -1;
        if (n < max) ids[n++] = (int32_t)json_integer_value(e);
    }
    return n;
}

static int config_parse_quant(struct model_config *cfg, const json_t *q, const char *name,
                              struct cairn_err *err)
{
    if (!json_is_object(q)) return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: quantization is not an object", name);
    /* Only MLX affine quantization; say which other scheme this is (GPTQ/AWQ/fp8 write
     * quant_method, newer MLX writes mode "mxfp4"/...). */
    const json_t *qm = json_object_get(q, "quant_method"), *mode = json_object_get(q, "mode");
    if (json_is_string(qm) && strcmp(json_string_value(qm), "mlx") != 0)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s: quantization method '%s' is not supported (MLX affine only)",
                             name, json_string_value(qm));
    if (json_is_string(mode) && strcmp(json_string_value(mode), "affine") != 0)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s: quantization mode '%s' is not supported (affine only)", name,
                             json_string_value(mode));
    if (config_int(q, "group_size", 64, &cfg->q_group_size) != 0 || config_int(q, "bits", 4, &cfg->q_bits) != 0)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: quantization group_size/bits must be integers", name);
    if (cfg->q_bits < 2 || cfg->q_bits > 8 || cfg->q_group_size < 8 || cfg->q_group_size > 4096)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s: quantization bits=%d group_size=%d not supported",
                             name, cfg->q_bits, cfg->q_group_size);
    size_t n = json_object_size(q);
    cfg->q_overrides = calloc(n ? n : 1, sizeof(*cfg->q_overrides));
    if (!cfg->q_overrides) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)q, k, v) {
        if (!json_is_object(v) && !json_is_false(v) && !json_is_true(v)) continue; /* group_size, bits, mode */
        struct model_quant_override *o = &cfg->q_overrides[cfg->n_q_overrides];
        o->module = strdup(k);
        if (!o->module) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        cfg->n_q_overrides++;
        o->quantized = !json_is_false(v);
        o->group_size = cfg->q_group_size;
        o->bits = cfg->q_bits;
        if (json_is_object(v) &&
            (config_int(v, "group_size", cfg->q_group_size, &o->group_size) != 0 ||
             config_int(v, "bits", cfg->q_bits, &o->bits) != 0 || o->bits < 2 || o->bits > 8))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: quantization override '%s' is malformed", name, k);
    }
    return CAIRN_OK;
}

int model_config_quant_for(const struct model_config *cfg, const char *module, int *bits,
                           int *group_size)
{
    for (int i = 0; i < cfg->n_q_overrides; i++) {
        if (strcmp(cfg->q_overrides[i].module, module) == 0) {
            *bits = cfg->q_overrides[i].bits;
            *group_size = cfg->q_overrides[i].group_size;
            return cfg->q_overrides[i].quantized;
        }
    }
    *bits = cfg->q_bits;
    *group_size = cfg->q_group_size;
    return cfg->q_bits > 0;
}

static int config_parse_rope(struct model_config *cfg, const json_t *root, const char *name,
                             struct cairn_err *err)
{
    /* Newer files: everything under rope_parameters. Older: rope_theta at the root and an
     * optional rope_scaling object. */
    const json_t *rp = json_object_get(root, "rope_parameters");
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (rp && !json_is_object(rp)) rp = NULL;
    if (rs && !json_is_object(rs)) rs = NULL;
    const json_t *src = rp ? rp : rs;
    if (config_num(root, "rope_theta", 10000.0, &cfg->rope_theta) != 0 ||
        (rp && config_num(rp, "rope_theta", cfg->rope_theta, &cfg->rope_theta) != 0))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: rope_theta is not a number", name);
    if (config_num(root, "partial_rotary_factor", 1.0, &cfg->partial_rotary_factor) != 0 ||
        (rp && config_num(rp, "partial_rotary_factor", cfg->partial_rotary_factor, &cfg->partial_rotary_factor) != 0))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: partial_rotary_factor is not a number", name);
    cfg->rope_type = MODEL_ROPE_DEFAULT;
    cfg->rope_factor = 1.0;
    cfg->rope_attn_factor = 1.0;
    if (src) {
        json_t *t = json_object_get(src, "rope_type");
        if (!t) t = json_object_get(src, "type");
        const char *ts = json_is_string(t) ? json_string_value(t) : "default";
        if (strcmp(ts, "default") == 0) {
            cfg->rope_type = MODEL_ROPE_DEFAULT;
        } else if (strcmp(ts, "linear") == 0) {
            cfg->rope_type = MODEL_ROPE_LINEAR;
        } else if (strcmp(ts, "llama3") == 0) {
            cfg->rope_type = MODEL_ROPE_LLAMA3;
        } else if (strcmp(ts, "yarn") == 0) {
            cfg->rope_type = MODEL_ROPE_YARN;
        } else {
            return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s: rope type '%s' is not supported", name, ts);
        }
        if (config_num(src, "factor", 1.0, &cfg->rope_factor) != 0 ||
            config_num(src, "low_freq_factor", 1.0, &cfg->rope_low_freq_factor) != 0 ||
            config_num(src, "high_freq_factor", 4.0, &cfg->rope_high_freq_factor) != 0 ||
            config_int(src, "original_max_position_embeddings",
                       cfg->rope_type == MODEL_ROPE_YARN ? cfg->max_position : 8192, &cfg->rope_orig_max_position) != 0)
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: malformed RoPE scaling parameters", name);
        if (cfg->rope_type == MODEL_ROPE_YARN) {
            double af = 0, ms = 0, ms_all = 0;
            if (config_num(src, "beta_fast", 32.0, &cfg->rope_beta_fast) != 0 ||
                config_num(src, "beta_slow", 1.0, &cfg->rope_beta_slow) != 0 ||
                config_bool(src, "truncate", 1, &cfg->rope_truncate) != 0 ||
                config_num(src, "attention_factor", 0.0, &af) != 0 || config_num(src, "mscale", 0.0, &ms) != 0 ||
                config_num(src, "mscale_all_dim", 0.0, &ms_all) != 0 || cfg->rope_orig_max_position <= 0)
                return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: malformed yarn RoPE parameters", name);
            /* As transformers: attention_factor if given, else 0.1 * mscale * ln(factor) + 1
             * (ratio of two such terms when mscale and mscale_all_dim are both set). */
            double f = cfg->rope_factor;
#define CONFIG_YARN_MSCALE(scale, m) ((scale) <= 1 ? 1.0 : 0.1 * (m) * log(scale) + 1.0)
            if (af > 0) cfg->rope_attn_factor = af;
            else if (ms != 0 && ms_all != 0) cfg->rope_attn_factor = CONFIG_YARN_MSCALE(f, ms) / CONFIG_YARN_MSCALE(f, ms_all);
            else cfg->rope_attn_factor = CONFIG_YARN_MSCALE(f, 1.0);
#undef CONFIG_YARN_MSCALE
        }
        if (cfg->rope_type != MODEL_ROPE_DEFAULT && !(cfg->rope_factor > 0))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: RoPE scaling factor must be > 0", name);
        if (cfg->rope_type == MODEL_ROPE_LLAMA3 &&
            (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) || cfg->rope_orig_max_position <= 0))
            return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: llama3 RoPE needs high_freq_factor > low_freq_factor", name);
    }
    if (!(cfg->rope_theta > 0))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: rope_theta must be > 0", name);
    if (!(cfg->partial_rotary_factor > 0 && cfg->partial_rotary_factor <= 1))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: partial_rotary_factor must be in (0, 1]", name);
    cfg->rot_dim = (int)(cfg->head_dim * cfg->partial_rotary_factor);
    cfg->rot_dim &= ~1;
    if (cfg->rot_dim <= 0) return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: rotary dimension is 0", name);
    return CAIRN_OK;
}

void model_config_rope_inv_freq(const struct model_config *cfg, float *inv_freq)
{
    int half = cfg->rot_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(cfg->rope_theta, (double)(2 * i) / cfg->rot_dim);
        if (cfg->rope_type == MODEL_ROPE_LINEAR) {
            f /= cfg->rope_factor;
        } else if (cfg->rope_type == MODEL_ROPE_LLAMA3) {
            /* Long wavelengths are scaled by 1/factor, short ones kept, the band between
             * interpolated (Llama 3.1). */
            double old = cfg->rope_orig_max_position;
            double low_wl = old / cfg->rope_low_freq_factor, high_wl = old / cfg->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = f / cfg->rope_factor;
            } else if (wl >= high_wl) {
                double s = (old / wl - cfg->rope_low_freq_factor) /
                           (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
                f = (1.0 - s) * f / cfg->rope_factor + s * f;
            }
        }
        inv_freq[i] = (float)f;
    }
    if (cfg->rope_type == MODEL_ROPE_YARN) {
        /* YaRN (as transformers' _compute_yarn_parameters): dims that rotate fewer than
         * beta_slow times over the original context are interpolated (1/factor), dims that
         * rotate more than beta_fast times extrapolated (kept), a linear ramp between. */
        double dim = cfg->rot_dim, base = cfg->rope_theta, orig = cfg->rope_orig_max_position;
        double lo = dim * log(orig / (cfg->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
        double hi = dim * log(orig / (cfg->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
        if (cfg->rope_truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        lo = lo < 0 ? 0 : lo;
        hi = hi > dim - 1 ? dim - 1 : hi;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            double pos_freq = pow(base, (double)(2 * i) / dim);
            double extra = 1.0 / pos_freq, inter = 1.0 / (cfg->rope_factor * pos_freq);
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra_w = 1.0 - ramp; /* 1 = keep (high frequency) */
            inv_freq[i] = (float)(inter * (1.0 - extra_w) + extra * extra_w);
        }
    }
}

/* Sampling defaults a server applies to requests that leave them out; out-of-range values are
 * ignored. */
static void config_gen_defaults(json_t *gen, struct model_gen_defaults *g)
{
    json_t *v;
    memset(g, 0, sizeof(*g));
    if ((v = json_object_get(gen, "temperature")) && json_is_number(v) && json_number_value(v) >= 0) {
        g->temperature = (float)json_number_value(v);
        g->has |= MODEL_GEN_TEMPERATURE;
    }
    if ((v = json_object_get(gen, "do_sample")) && json_is_false(v)) {
        g->temperature = 0; /* no sampling means greedy, whatever the temperature */
        g->has |= MODEL_GEN_TEMPERATURE;
    }
    if ((v = json_object_get(gen, "top_p")) && json_is_number(v) && json_number_value(v) > 0 &&
        json_number_value(v) <= 1) {
        g->top_p = (float)json_number_value(v);
        g->has |= MODEL_GEN_TOP_P;
    }
    if ((v = json_object_get(gen, "top_k")) && json_is_integer(v) && json_integer_value(v) >= 0 &&
        json_integer_value(v) < (1 << 30)) {
        g->top_k = (int)json_integer_value(v);
        g->has |= MODEL_GEN_TOP_K;
    }
    if ((v = json_object_get(gen, "min_p")) && json_is_number(v) && json_number_value(v) >= 0 &&
        json_number_value(v) <= 1) {
        g->min_p = (float)json_number_value(v);
        g->has |= MODEL_GEN_MIN_P;
    }
    if ((v = json_object_get(gen, "repetition_penalty")) && json_is_number(v) && json_number_value(v) > 0) {
        g->repetition_penalty = (float)json_number_value(v);
        g->has |= MODEL_GEN_REPETITION_PENALTY;
    }
}

int model_config_parse(const char *config_json, const char *gen_config_json, const char *name,
                       struct model_config *cfg, struct cairn_err *err)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->bos_id = -1;
    json_error_t jerr;
    json_t *root = json_loads(config_json, 0, &jerr), *gen = NULL;
    int rc = CAIRN_OK;
    if (!root || !json_is_object(root)) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: not a JSON object%s%s", name, root ? "" : ": ",
                           root ? "" : jerr.text);
        goto done;
    }
    /* Multimodal wrappers keep the language model's fields in text_config. */
    const json_t *tc = json_object_get(root, "text_config");
    const json_t *c = json_is_object(tc) ? tc : root;
    json_t *mt = json_object_get(c, "model_type");
    if (!json_is_string(mt)) mt = json_object_get(root, "model_type");
    if (!json_is_string(mt)) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: no model_type", name);
        goto done;
    }
    snprintf(cfg->model_type, sizeof(cfg->model_type), "%s", json_string_value(mt));
    int arch = model_arch_from_type(cfg->model_type);
    if (arch < 0) {
        rc = cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s: unsupported architecture (model_type '%s')", name,
                           cfg->model_type);
        goto done;
    }
    cfg->arch = (enum model_arch)arch;
    double eps;
    if (config_int(c, "vocab_size", 0, &cfg->vocab_size) || config_int(c, "hidden_size", 0, &cfg->hidden_size) ||
        config_int(c, "intermediate_size", 0, &cfg->intermediate_size) ||
        config_int(c, "num_hidden_layers", 0, &cfg->n_layers) ||
        config_int(c, "num_attention_heads", 0, &cfg->n_heads) ||
        config_int(c, "max_position_embeddings", 4096, &cfg->max_position) ||
        config_num(c, "rms_norm_eps", 1e-6, &eps) ||
        config_bool(c, "tie_word_embeddings", 0, &cfg->tie_word_embeddings) ||
        config_bool(c, "attention_bias", cfg->arch == MODEL_ARCH_QWEN2, &cfg->attention_bias) ||
        config_bool(c, "mlp_bias", 0, &cfg->mlp_bias)) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: a size field has the wrong type", name);
        goto done;
    }
    /* tie_word_embeddings sometimes sits at the root of wrapped configs only. */
    if (c != root && !json_object_get(c, "tie_word_embeddings"))
        config_bool(root, "tie_word_embeddings", 0, &cfg->tie_word_embeddings);
    cfg->rms_eps = (float)eps;
    if (config_int(c, "num_key_value_heads", cfg->n_heads, &cfg->n_kv_heads) ||
        config_int(c, "head_dim", cfg->n_heads > 0 ? cfg->hidden_size / cfg->n_heads : 0, &cfg->head_dim)) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: num_key_value_heads/head_dim has the wrong type", name);
        goto done;
    }
    if (cfg->vocab_size <= 0 || cfg->hidden_size <= 0 || cfg->n_layers <= 0 || cfg->n_heads <= 0 ||
        cfg->n_kv_heads <= 0 || cfg->head_dim <= 0 || cfg->n_heads % cfg->n_kv_heads != 0 ||
        cfg->n_layers > 1024 || cfg->head_dim > 1024 || cfg->hidden_size > (1 << 20) ||
        cfg->vocab_size > (1 << 24) || cfg->n_heads > 1024 || cfg->intermediate_size < 0 ||
        cfg->intermediate_size > (1 << 22)) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT,
                           "%s: implausible sizes (vocab %d, hidden %d, layers %d, heads %d/%d, head_dim %d)",
                           name, cfg->vocab_size, cfg->hidden_size, cfg->n_layers, cfg->n_heads,
                           cfg->n_kv_heads, cfg->head_dim);
        goto done;
    }
    rc = config_parse_rope(cfg, c, name, err);
    if (rc != CAIRN_OK) goto done;

    /* Sliding-window attention (mistral v0.1, qwen2 with use_sliding_window) is not
     * implemented: say so, results are exact up to the window. */
    int use_sw = 1;
    if (config_int(c, "sliding_window", 0, &cfg->sliding_window) != 0) cfg->sliding_window = 0;
    config_bool(c, "use_sliding_window", cfg->arch == MODEL_ARCH_LLAMA, &use_sw);
    if (!use_sw) cfg->sliding_window = 0;
    if (cfg->sliding_window > 0 && cfg->sliding_window < cfg->max_position)
        LOG_WARN("model", "%s: sliding_window %d is not applied; attention is full (exact for contexts up to %d)",
                 name, cfg->sliding_window, cfg->sliding_window);

    /* Per-layer kinds. */
    cfg->layer_kinds = calloc((size_t)cfg->n_layers, sizeof(*cfg->layer_kinds));
    if (!cfg->layer_kinds) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto done;
    }
    const json_t *lt = json_object_get(c, "layer_types");
    if (json_is_array(lt)) {
        if ((int)json_array_size(lt) != cfg->n_layers) {
            rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: layer_types has %zu entries for %d layers", name,
                               json_array_size(lt), cfg->n_layers);
            goto done;
        }
        for (int i = 0; i < cfg->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && (strcmp(s, "full_attention") == 0 || strcmp(s, "attention") == 0)) {
                cfg->layer_kinds[i] = MODEL_LAYER_ATTN;
            } else if (s && strcmp(s, "linear_attention") == 0) {
                cfg->layer_kinds[i] = MODEL_LAYER_LINEAR_ATTN;
            } else {
                rc = cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "%s: layer_types[%d] '%s' is not supported", name, i,
                                   s ? s : "(not a string)");
                goto done;
            }
        }
    }

    /* MoE and Gated DeltaNet sizes: parsed for every family, used by those that need them. */
    if (config_int(c, "num_experts", 0, &cfg->n_experts) ||
        (cfg->n_experts == 0 && config_int(c, "num_local_experts", 0, &cfg->n_experts)) ||
        config_int(c, "num_experts_per_tok", 0, &cfg->n_experts_per_tok) ||
        config_int(c, "moe_intermediate_size", 0, &cfg->moe_intermediate_size) ||
        config_int(c, "shared_expert_intermediate_size", 0, &cfg->shared_expert_intermediate_size) ||
        /* qwen3_moe's config defaults to raw top-k weights; qwen3_next defaults to renormalised
           ones and qwen3_5_moe always renormalises (its config has no such field). */
        config_bool(c, "norm_topk_prob", cfg->arch != MODEL_ARCH_QWEN3_MOE, &cfg->norm_topk_prob) ||
        config_int(c, "decoder_sparse_step", 1, &cfg->decoder_sparse_step) ||
        config_int(c, "linear_conv_kernel_dim", 0, &cfg->linear_conv_kernel_dim) ||
        config_int(c, "linear_key_head_dim", 0, &cfg->linear_key_head_dim) ||
        config_int(c, "linear_value_head_dim", 0, &cfg->linear_value_head_dim) ||
        config_int(c, "linear_num_key_heads", 0, &cfg->linear_num_key_heads) ||
        config_int(c, "linear_num_value_heads", 0, &cfg->linear_num_value_heads) ||
        config_int(c, "mtp_num_hidden_layers", 0, &cfg->n_mtp_layers) ||
        (cfg->n_mtp_layers == 0 && config_int(c, "num_nextn_predict_layers", 0, &cfg->n_mtp_layers))) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: a MoE / linear-attention field has the wrong type", name);
        goto done;
    }
    if (cfg->n_mtp_layers < 0 || cfg->n_mtp_layers > 16) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: mtp_num_hidden_layers %d out of range", name, cfg->n_mtp_layers);
        goto done;
    }
    const json_t *mol = json_object_get(c, "mlp_only_layers");
    if (json_is_array(mol) && json_array_size(mol) > 0) {
        cfg->mlp_only_layers = calloc(json_array_size(mol), sizeof(int));
        if (!cfg->mlp_only_layers) {
            rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            goto done;
        }
        size_t i;
        json_t *e;
        json_array_foreach(mol, i, e) {
            if (json_is_integer(e)) cfg->mlp_only_layers[cfg->n_mlp_only_layers++] = (int)json_integer_value(e);
        }
    }

    /* MLX quantization: at the root (also mirrored as quantization_config). */
    const json_t *q = json_object_get(root, "quantization");
    if (!q) q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q)) {
        rc = config_parse_quant(cfg, q, name, err);
        if (rc != CAIRN_OK) goto done;
    }

    /* eos / bos: generation_config.json wins. */
    int n = config_ids(json_object_get(c, "eos_token_id"), cfg->eos_ids, MODEL_MAX_EOS);
    if (n == 0 && c != root) n = config_ids(json_object_get(root, "eos_token_id"), cfg->eos_ids, MODEL_MAX_EOS);
    if (n < 0) {
        rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: eos_token_id must be an int or a list of ints", name);
        goto done;
    }
    cfg->n_eos = n;
    int bos = -1;
    json_t *jb = json_object_get(c, "bos_token_id");
    if (json_is_integer(jb)) bos = (int)json_integer_value(jb);
    if (gen_config_json) {
        gen = json_loads(gen_config_json, 0, &jerr);
        if (!json_is_object(gen)) {
            LOG_WARN("model", "%s: generation_config.json is not a JSON object; ignored", name);
        } else {
            int32_t ids[MODEL_MAX_EOS];
            int ng = config_ids(json_object_get(gen, "eos_token_id"), ids, MODEL_MAX_EOS);
            if (ng > 0) {
                memcpy(cfg->eos_ids, ids, sizeof(ids[0]) * (size_t)ng);
                cfg->n_eos = ng;
            }
            jb = json_object_get(gen, "bos_token_id");
            if (json_is_integer(jb)) bos = (int)json_integer_value(jb);
            config_gen_defaults(gen, &cfg->gen);
        }
    }
    cfg->bos_id = bos;
done:
    json_decref(root);
    json_decref(gen);
    if (rc != CAIRN_OK) model_config_free(cfg);
    return rc;
}

int model_config_load(const char *dir, struct model_config *cfg, struct cairn_err *err)
{
    char path[4096], gpath[4096];
    char *text = NULL, *gtext = NULL;
    size_t len;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    snprintf(gpath, sizeof(gpath), "%s/generation_config.json", dir);
    int rc = cairn_file_read_all(path, 16u << 20, &text, &len, err);
    if (rc != CAIRN_OK) return rc;
    if (cairn_file_exists(gpath) && cairn_file_read_all(gpath, 16u << 20, &gtext, &len, NULL) != CAIRN_OK)
        gtext = NULL;
    rc = model_config_parse(text, gtext, path, cfg, err);
    free(text);
    free(gtext);
    return rc;
}

void model_config_free(struct model_config *cfg)
{
    free(cfg->layer_kinds);
    free(cfg->mlp_only_layers);
    for (int i = 0; i < cfg->n_q_overrides; i++) free(cfg->q_overrides[i].module);
    free(cfg->q_overrides);
    cfg->layer_kinds = NULL;
    cfg->mlp_only_layers = NULL;
    cfg->q_overrides = NULL;
    cfg->n_q_overrides = 0;
}
