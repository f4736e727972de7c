/* MoE FFN layers shared by the MoE families (internal to model/). */
#ifndef CAIRN_MODEL_ARCH_MOE_H
#define CAIRN_MODEL_ARCH_MOE_H

#include "model/model_int.h"
#include "model/moe.h"

struct moe_layer_w {
    struct model_linear router;
    struct model_linear *experts; /* [n_experts * 3]: gate, up, down of each expert */
    int stacked;                  /* MLX switch_mlp: one [E * out, in] linear per projection */
    struct model_linear stack[3];
    struct model_linear shared[3];
    struct model_linear shared_gate;
    struct moe_expert *views;     /* [n_experts], filled by moe_layer_bind */
    struct moe_params p;
};

/* Whether layer il uses the MoE FFN (mlp_only_layers, decoder_sparse_step). */
int moe_layer_is_sparse(const struct model_config *c, int il);
/* Lists the layer's router, experts (HF per-expert names) and shared expert (if sized). */
int moe_layer_specs(struct model *m, struct model_specs *s, int il, struct moe_layer_w *w,
                    struct cairn_err *err);
/* After binding: builds the moe_params views. */
int moe_layer_bind(struct model *m, struct moe_layer_w *w, struct cairn_err *err);
void moe_layer_free(struct moe_layer_w *w);
size_t moe_layer_ws_floats(const struct model *m, int max_tokens);
/* Runs the layer's MoE FFN using the family scratch (ws.extra). */
void moe_layer_forward(struct model *m, const struct moe_layer_w *w, const float *h, float *out,
                       int n);

#endif
