/* The llama family: llama, mistral, qwen2 (qkv bias), qwen3 (per-head q/k RMSNorm before RoPE).
 * Pre-norm decoder: x += attn(rmsnorm(x)); x += mlp(rmsnorm(x)); SwiGLU MLP. The forward pass
 * itself is the generic one in forward.c; this file only lists the tensors, and those of an MTP
 * head (mtp.*) when the checkpoint carries one (llama_specs_mtp; run by mtp.c). */
#include <stdio.h>

#include "base/log.h"

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

int model_llama_specs_mlp(struct model *m, struct model_specs *s, int i, int64_t inter, enum model_wspec_bias bias)
{
    char pfx[64];
    model_layer_name(m, i, pfx, sizeof(pfx));
    struct model_layer *L = &m->layers[i];
    int64_t hid = m->cfg.hidden_size;
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

/* The MTP head of a dense checkpoint (config.json's num_nextn_predict_layers or
 * mtp_num_hidden_layers = 1 and mtp.fc.weight present; the demo model's, trained by
 * scripts/demo-model/train.py): fc, its norms and mtp.layers.0, a decoder layer of this family
 * (its attention and q/k norms, plain norms, a SwiGLU MLP whose width is its gate_proj's rows:
 * a head may be narrower than the target's layers). Like the hybrids, no weights means no head
 * and more than one head layer loads without one. */
static int llama_specs_mtp(struct model *m, struct model_specs *s, enum model_wspec_bias mlp_bias,
                           struct cairn_err *err)
{
    const struct model_config *c = &m->cfg;
    if (!model_has_tensor(m, "mtp.fc.weight")) return CAIRN_OK;
    if (c->n_mtp_layers != 1) {
        LOG_WARN("model", "%s: %d MTP layers: only one is supported, loading without the MTP head", c->model_type,
                 c->n_mtp_layers);
        return CAIRN_OK;
    }
    int il = c->n_layers;
    int64_t inter = model_tensor_rows(m, "mtp.layers.0.mlp.gate_proj.weight");
    if (inter <= 0 || inter > (1 << 22))
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: mtp.layers.0.mlp.gate_proj.weight is missing or has %lld rows",
                             m->st.dir, (long long)inter);
    int ok = model_mtp_specs(m, s, 1.0f) == CAIRN_OK;
    ok &= model_llama_specs_layer_norms(m, s, il, 1.0f) == CAIRN_OK;
    ok &= model_llama_specs_attn(m, s, il) == CAIRN_OK;
    ok &= model_llama_specs_mlp(m, s, il, inter, mlp_bias) == CAIRN_OK;
    if (!ok) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    m->n_mtp = 1;
    return CAIRN_OK;
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
        ok &= model_llama_specs_mlp(m, s, i, c->intermediate_size, mlp_bias) == CAIRN_OK;
    }
    if (!ok) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    return c->n_mtp_layers > 0 ? llama_specs_mtp(m, s, mlp_bias, err) : CAIRN_OK;
}

const struct model_family model_family_llama = {
    .name = "llama",
    .specs = llama_specs,
};
