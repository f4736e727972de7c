/* config.json (+ generation_config.json) of a Hugging Face / MLX checkpoint, parsed into one
 * flat struct that every architecture reads.
 *
 * What is understood:
 * - model_type -> architecture through the table in config.c (llama, mistral, qwen2, qwen3,
 *   qwen3_moe, qwen3_next, qwen3_5[_text], qwen3_5_moe[_text]); `text_config` nesting (the
 *   multimodal wrappers) is followed for the text model's fields.
 * - RoPE: rope_theta / rope_scaling at the root (older files) or in rope_parameters (newer);
 *   types default, linear, llama3, yarn; partial_rotary_factor (root or rope_parameters).
 * - head_dim (may differ from hidden/heads), tie_word_embeddings, attention_bias, mlp_bias.
 * - layer_types ("full_attention" / "linear_attention") -> per-layer kind.
 * - MoE and Gated DeltaNet sizes (parsed for the families that need them); MTP head layers.
 * - quantization / quantization_config: group_size, bits, and per-module overrides.
 * - eos from generation_config.json (int or list), else config.json; bos likewise. */
#ifndef CAIRN_MODEL_CONFIG_H
#define CAIRN_MODEL_CONFIG_H

#include <stdint.h>

#include "base/status.h"
#include "model/model.h"

enum model_layer_kind {
    MODEL_LAYER_ATTN = 0,    /* full (softmax) attention with KV cache */
    MODEL_LAYER_LINEAR_ATTN, /* Gated DeltaNet linear attention with recurrent state */
};

enum model_rope_type {
    MODEL_ROPE_DEFAULT = 0,
    MODEL_ROPE_LINEAR,
    MODEL_ROPE_LLAMA3,
    MODEL_ROPE_YARN,
};

struct model_quant_override {
    char *module;  /* e.g. "model.layers.0.mlp.down_proj" */
    int quantized; /* 0: the module stays unquantized (config said false) */
    int group_size;
    int bits;
};

struct model_config {
    enum model_arch arch;
    char model_type[48];
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int max_position;
    float rms_eps;
    int tie_word_embeddings;
    int attention_bias; /* q/k/v (and o) projections have a bias */
    int mlp_bias;
    int sliding_window;      /* > 0 if config asks for sliding-window attention (not applied yet) */
    enum model_layer_kind *layer_kinds; /* [n_layers], owned */

    /* RoPE */
    enum model_rope_type rope_type;
    double rope_theta;
    double rope_factor;           /* linear, llama3 */
    double rope_low_freq_factor;  /* llama3 */
    double rope_high_freq_factor; /* llama3 */
    int rope_orig_max_position;   /* llama3/yarn original_max_position_embeddings */
    double rope_beta_fast;        /* yarn (32) */
    double rope_beta_slow;        /* yarn (1) */
    int rope_truncate;            /* yarn: round the correction range (default 1) */
    double rope_attn_factor;      /* yarn: cos/sin are scaled by this, i.e. attention scores by
                                     its square; 1 for the other types */
    double partial_rotary_factor; /* 1.0 unless set */
    int rot_dim;                  /* head_dim * partial_rotary_factor, even */

    /* MoE (qwen3_moe, qwen3_next, qwen3_5_moe) */
    int n_experts;
    int n_experts_per_tok;
    int moe_intermediate_size;
    int shared_expert_intermediate_size;
    int norm_topk_prob;
    int decoder_sparse_step;
    int *mlp_only_layers; /* owned */
    int n_mlp_only_layers;

    /* Gated DeltaNet (qwen3_next, qwen3_5) */
    int linear_conv_kernel_dim;
    int linear_key_head_dim;
    int linear_value_head_dim;
    int linear_num_key_heads;
    int linear_num_value_heads;

    /* MTP head (qwen3_next, qwen3_5, dense checkpoints such as the demo model):
     * mtp_num_hidden_layers (qwen3_5) or num_nextn_predict_layers (qwen3_next's and DeepSeek's
     * name); 0 when absent. The weights (mtp.*) may still be missing (stripped
     * conversions): the family then loads the model without a head. */
    int n_mtp_layers;

    /* MLX quantization (0 when absent) */
    int q_group_size;
    int q_bits;
    struct model_quant_override *q_overrides; /* owned */
    int n_q_overrides;

    int32_t eos_ids[MODEL_MAX_EOS];
    int n_eos;
    int32_t bos_id; /* -1 if none */
    struct model_gen_defaults gen; /* generation_config.json sampling defaults */
};

/* Parses config.json text (and generation_config.json text, may be NULL). `name` is used in
 * error messages. An unknown model_type fails with CAIRN_ERR_UNSUPPORTED naming it. Free with
 * model_config_free. */
int model_config_parse(const char *config_json, const char *gen_config_json, const char *name,
                       struct model_config *cfg, struct cairn_err *err);
/* Reads dir/config.json and dir/generation_config.json (optional). */
int model_config_load(const char *dir, struct model_config *cfg, struct cairn_err *err);
void model_config_free(struct model_config *cfg);

/* Quantization expected for a module path (override, else default). Returns 1 if quantized
 * (bits/group_size set), 0 if not. */
int model_config_quant_for(const struct model_config *cfg, const char *module, int *bits,
                           int *group_size);

/* Architecture name table: model_type -> arch. NULL / -1 if unknown. */
int model_arch_from_type(const char *model_type);
const char *model_arch_name(enum model_arch arch);

/* inv_freq[rot_dim/2] for the configured RoPE (default, linear, llama3 scaling). */
void model_config_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

#endif
