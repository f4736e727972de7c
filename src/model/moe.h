/* Mixture-of-experts feed-forward (qwen3_moe, qwen3_next, qwen3_5_moe).
 *
 * router softmax over experts -> top-k (renormalised when norm_topk_prob) -> per-expert SwiGLU
 * down(silu(gate(x)) * up(x)), weighted sum; plus an optional shared expert scaled by
 * sigmoid(shared_gate(x)). Tokens are grouped by expert so each expert runs one matmul over all
 * tokens routed to it. Experts are tensor views: per-expert checkpoints (experts.E.*) and MLX's
 * stacked switch_mlp layout both become one view per expert at load. */
#ifndef CAIRN_MODEL_MOE_H
#define CAIRN_MODEL_MOE_H

#include <stddef.h>

#include "tensor/tensor.h"

struct moe_expert {
    struct tensor gate; /* [inter, hidden] */
    struct tensor up;   /* [inter, hidden] */
    struct tensor down; /* [hidden, inter] */
};

struct moe_params {
    int hidden;
    int n_experts;
    int top_k;
    int norm_topk_prob;
    int inter;                  /* moe_intermediate_size */
    struct tensor router;       /* [n_experts, hidden] */
    struct moe_expert *experts; /* [n_experts] */
    int has_shared;
    int shared_inter;
    struct moe_expert shared;
    struct tensor shared_gate;  /* [1, hidden] */
};

/* Scratch sizes for up to max_tokens tokens. */
size_t moe_scratch_floats(const struct moe_params *p, int max_tokens);
size_t moe_scratch_ints(const struct moe_params *p, int max_tokens);

/* out[n, hidden] = moe(x[n, hidden]). out must not alias x. */
void moe_forward(const struct moe_params *p, const float *x, int n, float *out, float *fscratch,
                 int *iscratch);

/* View of rows [row0, row0 + rows) of a 2-D weight (any dtype): one expert of a stacked
 * [n_experts * out, in] weight (MLX switch_mlp, read flattened). */
void moe_row_slice(const struct tensor *w, int64_t row0, int64_t rows, struct tensor *view);

#endif
