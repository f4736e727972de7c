/* MoE FFN layers shared by the MoE families (internal to model/).
 *
 * router softmax over experts -> top-k (renormalised when norm_topk_prob) -> per-expert SwiGLU
 * down(silu(gate(x)) * up(x)), weighted sum (the backend's moe_route and moe_experts ops); plus
 * an optional shared expert scaled by sigmoid(shared_gate(x)) (matmuls, silu_mul and
 * add_sigmoid_scaled). Experts are tensor views: per-expert checkpoints (experts.E.*) and MLX's
 * stacked switch_mlp layout (one [E * out, in] weight per projection, sliced per expert with the
 * backend's weight_slice_rows) both become one view per expert at load. */
#ifndef CAIRN_MODEL_ARCH_MOE_H
#define CAIRN_MODEL_ARCH_MOE_H

#include "model/model_int.h"

struct moe_layer_w {
    struct model_linear router;   /* [n_experts, hidden] */
    struct model_linear *experts; /* [n_experts * 3]: gate, up, down of each expert */
    int stacked;                  /* MLX switch_mlp: one [E * out, in] linear per projection */
    struct model_linear stack[3];
    struct model_linear shared[3]; /* shared expert gate, up, down (shared_expert_intermediate_size) */
    struct model_linear shared_gate; /* [1, hidden] */
    struct tensor *views;         /* [3 * n_experts]: every expert's gate, then up, then down;
                                     filled by moe_layer_bind */
};

/* Whether layer il uses the MoE FFN (mlp_only_layers, decoder_sparse_step). */
int moe_layer_is_sparse(const struct model_config *c, int il);
/* Lists the layer's router, experts (HF per-expert names) and shared expert (if sized). */
int moe_layer_specs(struct model *m, struct model_specs *s, int il, struct moe_layer_w *w,
                    struct cairn_err *err);
/* After binding and weight_prepare: builds the per-expert views. */
int moe_layer_bind(struct model *m, struct moe_layer_w *w, struct cairn_err *err);
void moe_layer_free(struct moe_layer_w *w);
size_t moe_layer_ws_floats(const struct model *m, int max_tokens);
/* Runs the layer's MoE FFN on device buffers, using the family scratch (ws.extra). out[n, hidden]
 * must not alias h. */
void moe_layer_forward(struct model *m, const struct moe_layer_w *w, const float *h, float *out,
                       int n);

#endif
