/* Internal to model/: the loaded model, its layers, the weight-spec list families fill, and
 * the family (architecture) table.
 *
 * DESIGN
 * - A family (arch_*.c) describes its tensors as a list of weight specs (name, kind, shape,
 *   where to bind). model.c binds them from the safetensors set (checking names, dtypes,
 *   shapes, MLX quantization); synth.c writes random tensors from the same list. So a new
 *   family writes its list once and gets loading, error messages and synth-model for free.
 * - Each layer has a kind (config.h: full attention, linear attention) and the forward pass
 *   (forward.c) dispatches per kind: attention is generic here (q/k norm, qkv bias, partial
 *   rotary are flags); other mixers and MoE FFNs plug in through the family's hooks.
 * - Activations are contiguous f32 [n_tokens, dim] in preallocated workspaces (model_reserve),
 *   in the backend's memory (buf_alloc). Everything numeric runs as ops of the model's backend
 *   (tensor/backend.h, through MODEL_OP); model/ never reads or writes activation memory itself.
 *   Weights are prepared by the backend at load (weight_prepare); norm vectors, biases and
 *   inv_freq are device buffers (model_dev_vector).
 * - Per step, forward.c fills host staging arrays (token ids, positions, global KV slots,
 *   sequence offsets, block tables, logit row ids: model_ws.h_i32), uploads them in one
 *   buf_upload, runs the ops, and downloads the logits rows.
 */
#ifndef CAIRN_MODEL_MODEL_INT_H
#define CAIRN_MODEL_MODEL_INT_H

#include <stdint.h>

#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tensor/backend.h"
#include "tensor/tensor.h"

/* Runs op `name` of the model's backend: MODEL_OP(m, matmul, w, x, y, n). */
#define MODEL_OP(m, name, ...) ((m)->be->ops->name((m)->be, __VA_ARGS__))

/* A linear layer y = x W^T (+ b). Vectors (norm weights, biases, DeltaNet parameters) are f32
 * device buffers of the model. */
struct model_linear {
    struct tensor w;  /* [out, in]; data points into the mmap (or an owned copy); be_data: the
                         backend's (weight_prepare) */
    float *bias;      /* [out] f32 device buffer, owned, or NULL */
};

struct model_attn_w {
    struct model_linear q, k, v, o;
    float *q_norm;    /* [head_dim] (qwen3) or NULL */
    float *k_norm;
};

struct model_mlp_w {
    struct model_linear gate, up, down;
};

struct model_layer {
    enum model_layer_kind kind;
    int kv_index;         /* attention-layer ordinal = kv_pool layer; -1 for other kinds */
    float *attn_norm;     /* input_layernorm [hidden] */
    float *ffn_norm;      /* post_attention_layernorm [hidden] */
    struct model_attn_w attn;
    struct model_mlp_w mlp;
    void *ext;            /* family-specific weights (MoE experts, DeltaNet), family-owned */
};

enum model_wspec_kind {
    MODEL_WSPEC_LINEAR = 0, /* NAME.weight [rows, cols] (+ .scales/.biases if MLX-quantized) */
    MODEL_WSPEC_VECTOR,     /* NAME [rows], converted to f32 */
};

enum model_wspec_bias {
    MODEL_BIAS_NONE = 0,
    MODEL_BIAS_REQUIRED,    /* NAME.bias [rows] must exist */
    MODEL_BIAS_OPTIONAL,
};

struct model_wspec {
    char name[160];          /* LINEAR: module path; VECTOR: full tensor name */
    enum model_wspec_kind kind;
    int64_t rows, cols;      /* LINEAR: out, in; VECTOR: rows */
    enum model_wspec_bias bias;
    int optional;            /* may be absent (stays unbound) */
    int stack;               /* LINEAR: may be stored 3-D [stack, rows/stack, cols] (MLX
                                switch_mlp experts), read as [rows, cols] */
    int flat;                /* VECTOR: any shape with `rows` elements (conv1d [C, 1, K] or MLX
                                [C, K, 1]), read flattened row-major */
    float synth_value;       /* synth: VECTOR filled with this (norm weights: 1) if synth_random 0 */
    int synth_random;        /* synth: VECTOR gets small random values instead */
    struct model_linear *lin; /* LINEAR destination */
    float **vec;              /* VECTOR destination */
};

struct model_specs {
    struct model_wspec *v;
    int n, cap;
};

/* Appends a spec; the name is printf-formatted. Returns the spec or NULL on OOM. */
struct model_wspec *model_specs_linear(struct model_specs *s, struct model_linear *dst,
                                       int64_t rows, int64_t cols, enum model_wspec_bias bias,
                                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
struct model_wspec *model_specs_vector(struct model_specs *s, float **dst, int64_t rows,
                                       float synth_value, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void model_specs_free(struct model_specs *s);

struct model;

/* An architecture family. Hooks left NULL get the generic behaviour. */
struct model_family {
    const char *name;
    /* Lists every tensor (except lm_head when tied, which model.c handles). */
    int (*specs)(struct model *m, struct model_specs *s, struct cairn_err *err);
    /* Called after binding: checks, derived fields. */
    int (*post_bind)(struct model *m, struct cairn_err *err);
    /* Extra workspace floats for max_tokens (MoE, DeltaNet scratch). */
    size_t (*ws_extra_floats)(const struct model *m, int max_tokens);
    /* FFN of layer il: out[n, hidden] from h[n, hidden] (device). NULL: dense SwiGLU MLP. */
    void (*ffn)(struct model *m, int il, const float *h, float *out, int n_tokens);
    /* Linear-attention mixer (MODEL_LAYER_LINEAR_ATTN). */
    int (*linear_attn)(struct model *m, int il, const struct model_seq *seqs, int n_seqs,
                       const float *h, float *out, struct cairn_err *err);
    void (*free_ext)(struct model *m);
};

/* Family of an architecture, or NULL if not implemented yet. */
const struct model_family *model_family_get(enum model_arch arch);

/* Families (arch_*.c). */
extern const struct model_family model_family_llama; /* llama, mistral, qwen2, qwen3 */
extern const struct model_family model_family_qwen3_moe;
extern const struct model_family model_family_qwen3_hybrid; /* qwen3_next, qwen3_5, qwen3_5_moe */

/* Attention specs of layer i (llama family layout, q/k norm for the qwen3 kinds). q_proj has
 * 2 * n_heads * head_dim rows when the model's attention is gated. */
int model_llama_specs_attn(struct model *m, struct model_specs *s, int i);
/* input_layernorm and post_attention_layernorm of layer i; norm_synth is what synth-model fills
 * them with (1, or 0 for zero-centred norms). */
int model_llama_specs_layer_norms(struct model *m, struct model_specs *s, int i, float norm_synth);
/* Dense SwiGLU MLP of layer i (intermediate_size). */
int model_llama_specs_mlp(struct model *m, struct model_specs *s, int i, int64_t inter, enum model_wspec_bias bias);
/* embed_tokens, the final norm and lm_head (unless tied). */
int model_llama_specs_ends(struct model *m, struct model_specs *s, float norm_synth);

/* Workspaces. Float buffers are device memory of the model's backend (one buf_alloc under
 * CAIRN_MEM_SCRATCH); h_i32 is the host staging whose used part goes to i32 in one buf_upload
 * per step. i32 layout of a step of T tokens, n sequences and n_sel selected rows (logit rows,
 * then hidden-state rows: model_seq.n_hidden):
 *   tok [T] | pos [T] | slots [T] | seq_off [n + 1] | rows [n_sel] | block tables [n][bt_stride]
 * tok, pos, ... point into i32 (device) at those offsets, set by each step. */
#define MODEL_LOGIT_ROWS_MAX 256 /* the most rows of one lm_head chunk (model.c) */

struct model_ws {
    int max_tokens;
    int logit_rows;     /* rows of `logits` */
    float *x;           /* [T, hidden] residual stream */
    float *h;           /* [T, hidden] normed input of a sub-layer */
    float *out;         /* [T, hidden] sub-layer output */
    float *q;           /* [T, n_heads * head_dim] */
    float *q_raw;       /* [T, n_heads * 2 * head_dim] gated q_proj output, or NULL */
    float *k;           /* [T, n_kv_heads * head_dim] */
    float *v;
    float *att;         /* [T, n_heads * head_dim] */
    float *gate;        /* [T, intermediate] */
    float *up;
    float *qgate;       /* [T, n_heads * head_dim] output gate of gated attention, or NULL */
    float *sel;         /* [T, hidden] rows whose logits are wanted */
    float *logits;      /* [logit_rows, vocab] */
    float *extra;       /* family scratch */
    float *mtp_cat;     /* [T, 2 * hidden] the MTP head's fc input, or NULL (no head) */
    void *mem;          /* the float buffers: one device allocation */
    size_t mem_bytes;
    int32_t *i32;       /* device, i32_cap ints (layout above) */
    int32_t *h_i32;     /* host staging, same layout and size */
    size_t i32_cap;
    int32_t *h_ctx_len; /* host [max_tokens]: last position + 1 of each sequence */
    struct backend_sample_row *h_sample_rows; /* host [logit_rows]: one chunk's sampled rows */
    struct backend_sample_out *h_sample_out;  /* host [logit_rows]: their results */
    double t_issue_s, t_wait_s; /* the last model_forward's split (model_last_step_times) */
    /* This step's device arrays (into i32) and host copy of seq_off (into h_i32). */
    const int32_t *tok, *pos, *slots, *seq_off, *rows, *bt;
    const int32_t *h_seq_off;
    int bt_stride;
};

/* A device buffer of the model, freed with it. */
struct model_dev_buf {
    void *p;
    size_t bytes;
};

struct model_owned {
    void *p;
    size_t bytes;
};

/* The MTP head (mtp.*: qwen3_next / qwen3_5, and dense llama-family checkpoints that carry one; mtp.c): its decoder layer is m->layers[il], past
 * the target's, a full-attention layer with its own KV layer (kv_index after the target's). */
struct model_mtp {
    int il;                       /* its layer index (= cfg.n_layers) */
    struct model_linear fc;       /* [hidden, 2 * hidden] over cat(embedding, hidden) */
    float *norm_emb;              /* pre_fc_norm_embedding [hidden], device */
    float *norm_hid;              /* pre_fc_norm_hidden [hidden] */
    float *norm;                  /* mtp.norm [hidden] */
    struct model_seq *stage;      /* [cap_stage] model_mtp_forward's staging view, grow-only */
    int cap_stage;
};

struct model {
    struct backend *be;           /* the backend it was loaded on (not owned) */
    struct model_info info;
    struct model_config cfg;
    const struct model_family *fam;
    struct safetensors_set st;
    struct model_linear embed;
    struct model_linear lm_head;  /* a copy of embed when tied */
    float *final_norm;            /* device */
    struct model_layer *layers;   /* [n_layers] */
    float *inv_freq;              /* [rot_dim / 2], device */
    struct model_owned *owned;    /* converted weights (host), freed with the model */
    int n_owned, cap_owned;
    struct model_dev_buf *dev;    /* device vectors, freed with the model */
    int n_dev, cap_dev;
    struct tensor **prepared;     /* weights weight_prepare'd, released with the model */
    int n_prepared, cap_prepared;
    struct model_ws ws;
    int ws_ok;
    int n_q_derived;              /* linears whose bits/group came from shapes, not config */
    float norm_offset;            /* 1 for zero-centred RMSNorm weights (qwen3_next, qwen3_5) */
    int attn_gated;               /* q_proj also yields a sigmoid output gate per head */
    void *ext;                    /* family-owned (MoE experts, DeltaNet weights) */
    int tp_world;                 /* tensor-parallel ranks (0: loaded whole); cfg holds the rank's
                                     local sizes (model_load_shard) */
    int n_mtp;                    /* MTP layers loaded (0: no head); layers[] has n_layers + this */
    struct model_mtp mtp;         /* valid when n_mtp > 0 */
};

/* Allocates (accounted under CAIRN_MEM_WEIGHTS) host memory freed with the model. */
void *model_alloc_owned(struct model *m, size_t bytes);
/* A device copy of n host floats (CAIRN_MEM_WEIGHTS), freed with the model; NULL on failure
 * (err set). */
float *model_dev_vector(struct model *m, const float *host, size_t n, struct cairn_err *err);

int model_has_tensor(struct model *m, const char *name);
/* Rows (shape[0]) of a checkpoint tensor, or -1 when it is absent: sizes a layer from its weights
 * where config.json does not give them (the dense MTP head's MLP width). */
int64_t model_tensor_rows(struct model *m, const char *name);
/* "model.layers.<il>" for the target's layers, "mtp.layers.<il - n_layers>" past them. */
void model_layer_name(const struct model *m, int il, char *buf, size_t n);
/* MTP head's specs (mtp.c): fc, its norms and layer il = cfg.n_layers (norms, attention, FFN via
 * the family's own spec helpers, which the caller runs for that layer). norm_synth: the value
 * synthetic norms get (0 for the zero-centred norms of the hybrids, 1 for plain ones). */
int model_mtp_specs(struct model *m, struct model_specs *s, float norm_synth);
void model_mtp_free(struct model *m);

/* Binds one spec from the safetensors set (the loader's checks and conversions). */
int model_bind_spec(struct model *m, const struct model_wspec *s, struct cairn_err *err);
/* The 1-D tensor `name` of `rows` floats (any shape with that many when flat) as a malloc'd
 * host f32 array the caller frees; *out NULL (and CAIRN_OK) when optional and absent. */
int model_vector_host(struct model *m, const char *name, int64_t rows, int optional, int flat, float **out,
                      struct cairn_err *err);
struct shard_plan;
/* Binds the rank's share of spec s under plan p (shard_bind.c): model_bind_spec, then slices. */
int shard_bind_spec(struct model *m, const struct shard_plan *p, const struct model_wspec *s,
                    struct cairn_err *err);
/* Sums a row-parallel partial output [n] over the tensor-parallel ranks (not called for a model
 * loaded whole; a group of one still calls it, so that path can be checked on one GPU): after
 * o_proj, down_proj, the MoE FFN and the DeltaNet out_proj. */
static inline void model_tp_allreduce(struct model *m, float *buf, int64_t n)
{
    if (m->tp_world >= 1) MODEL_OP(m, allreduce, buf, n);
}

/* Forward building blocks (forward.c), on device buffers. */
void model_linear_apply(struct model *m, const struct model_linear *l, const float *x, float *y, int n_tokens);
/* Grows the i32 staging (host and device) to at least `need` ints (grow-only); outside a step. */
int model_i32_reserve(struct model *m, size_t need, struct cairn_err *err);
/* One decoder layer il over this step's T tokens of ws.x (mixer by kind, then FFN), in place. */
int model_layer_forward(struct model *m, int il, const struct backend_kv_view *kv, const struct model_seq *seqs,
                        int n_seqs, struct cairn_err *err);
/* Fills the host staging of a step (model_ws layout) and sets ws's step pointers; returns the
 * ints to upload. Row ids: the last n_logits tokens of each sequence, then its last n_hidden. */
int model_stage(struct model *m, const struct backend_kv_view *kv, const struct model_seq *seqs, int n_seqs,
                int bt_stride, int T, int n_sel);
/* Ints of staging a step needs (for model_i32_reserve). */
size_t model_stage_ints(int T, int n_seqs, int bt_stride, int n_sel);
/* The block-table stride of a step whose longest sequence needs `blocks` entries: with several
 * sequences rounded up to MODEL_BT_STRIDE_TOKENS positions' worth. The stride is part of what a
 * CUDA graph of the step is keyed on (cuda_graph.c); exact, it changed every block_size tokens of
 * the longest sequence, so a serving batch's decode graphs were seldom replayed. Rounded, it moves
 * once per 256 positions, like the attention's context bucket. The padding entries are 0, past
 * every row's context (never read). A sequence alone keeps the exact stride (its graph record
 * drops the stride). */
#define MODEL_BT_STRIDE_TOKENS 256
int model_bt_stride(int blocks, int n_seqs, int block_size);
/* Dense SwiGLU MLP of layer il (the default FFN). */
void model_mlp_forward(struct model *m, int il, const float *h, float *out, int n_tokens);

#endif
