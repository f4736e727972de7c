/* The llama family: llama, mistral, qwen2 (qkv bias), qwen3 (per-head q/k RMSNorm before RoPE).
 * Pre-norm decoder: x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)); SwiGLU MLP. The forward pass
 * itself is the generic one in forward.c; this file only lists the tensors. */
#include <stdio.h>

#include "model/model_int.h"

int model_llama_specs_attn(struct model *m, struct model_specs *s, int i)
{
    char pfx[64];
    model_layer_name(m, i, pfx, sizeof(pfx));
    const struct model_config *c = &m->cfg;
    int64_t hid = c->hidden_size, hd = c->head_dim, qd = (int64_t)c->n_heads * hd;
    int64_t kvd = (int64_t)c->n_kv_heads * hd;
    enum model_wspec_bias qkv_bias = c->attention_bias ? MODEL_BIAS_REQUIRED : MODEL_BIAS_NONE;
    /* qwen2 has q/k/v bias but no o_proj bias; llama's attention_bias covers all four. */
    enum model_wspec_bias o_bias =
        (c->attention_bias && c->arch != MODEL_ARCH_QWEN2) ? MODEL_BIAS_REQUIRED : MODEL_BIAS_NONE;
    int qk_norm = c->arch != MODEL_ARCH_LLAMA && c->arch != MODEL_ARCH_QWEN2;
    struct model_layer *L = &m->layers[i];
    int ok = 1;
    ok &= model_specs_linear(s, &L->attn.q, qd * (m->attn_gated ? 2 : 1), hid, qkv_bias,
                             "%s.self_attn.q_proj", pfx) != NULL;
    ok &= model_specs_linear(s, &L->attn.k, kvd, hid, qkv_bias, "%s.self_attn.k_proj", pfx) != NULL;
    ok &= model_specs_linear(s, &L->attn.v, kvd, hid, qkv_bias, "%s.self_attn.v_proj", pfx) != NULL;
    ok &= model_specs_linear(s, &L->attn.o, hid, qd, o_bias, "%s.self_attn.o_proj", pfx) != NULL;
    if (qk_norm) {
        ok &= model_specs_vector(s, &L->attn.q_norm, hd, 1.0f, "%s.self_attn.q_norm.weight", pfx) != NULL;
        ok &= model_specs_vector(s, &L->attn.k_norm, hd, 1.0f, "%s.self_attn.k_norm.weight", pfx) != NULL;
    }
    return ok ? CAIRN_OK : CAIRN_ERR_NOMEM;
}

int model_llama_specs_layer_norms(struct model *m, struct model_specs *s, int i, float norm_synth)
{
    char pfx[64];
    model_layer_name(m, i, pfx, sizeof(pfx));
    struct model_layer *L = &m->layers[i];
    int64_t hid = m->cfg.hidden_size;
    int ok = model_specs_vector(s, &L->attn_norm, hid, norm_synth, "%s.input_layernorm.weight", pfx) != NULL;
    ok &= model_specs_vector(s, &L->ffn_norm, hid, norm_synth, "%s.post_attention_layernorm.weight", pfx) !=
          NULL;
    return ok ? CAIRN_OK : CAIRN_ERR_NOMEM;
}

int model_llama_specs_mlp(struct model *m, struct model_specs *s, int i, enum model_wspec_bias bias)
{
    char pfx[64];
    model_layer_name(m, i, pfx, sizeof(pfx));
    struct model_layer *L = &m->layers[i];
    int64_t hid = m->cfg.hidden_size, inter = m->cfg.intermediate_size;
    int ok = model_specs_linear(s, &L->mlp.gate, inter, hid, bias, "%s.mlp.gate_proj", pfx) != NULL;
    ok &= model_specs_linear(s, &L->mlp.up, inter, hid, bias, "%s.mlp.up_proj", pfx) != NULL;
    ok &= model_specs_linear(s, &L->mlp.down, hid, inter, bias, "%s.mlp.down_proj", pfx) != NULL;
    return ok ? CAIRN_OK : CAIRN_ERR_NOMEM;
}

int model_llama_specs_ends(struct model *m, struct model_specs *s, float norm_synth)
{
    const struct model_config *c = &m->cfg;
    int64_t hid = c->hidden_size;
    int ok = model_specs_linear(s, &m->embed, c->vocab_size, hid, MODEL_BIAS_NONE, "model.embed_tokens") != NULL;
    ok &= model_specs_vector(s, &m->final_norm, hid, norm_synth, "model.norm.weight") != NULL;
    if (!c->tie_word_embeddings)
        ok &= model_specs_linear(s, &m->lm_head, c->vocab_size, hid, MODEL_BIAS_NONE, "lm_head") != NULL;
    return ok ? CAIRN_OK : CAIRN_ERR_NOMEM;
}

static int llama_specs(struct model *m, struct model_specs *s, struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    enum model_wspec_bias mlp_bias = c->mlp_bias ? MODEL_BIAS_REQUIRED : MODEL_BIAS_NONE;
    if (c->intermediate_size <= 0)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "config.json: intermediate_size missing");
    int ok = model_llama_specs_ends(m, s, 1.0f) == CAIRN_OK;
    for (int i = 0; i < c->n_layers && ok; i++) {
        if (m->layers[i].kind != MODEL_LAYER_ATTN)
            return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "config.json: layer %d: %s has only attention layers", i,
                                 c->model_type);
        ok &= model_llama_specs_layer_norms(m, s, i, 1.0f) == CAIRN_OK;
        ok &= model_llama_specs_attn(m, s, i) == CAIRN_OK;
        ok &= model_llama_specs_mlp(m, s, i, mlp_bias) == CAIRN_OK;
    }
    if (!ok) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    return CAIRN_OK;
}

const struct model_family model_family_llama = {
    .name = "llama",
    .specs = llama_specs,
};
