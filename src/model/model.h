/* Models: load a Hugging Face / MLX checkpoint folder and run the batched forward pass.
 *
 * A model is loaded on a backend (tensor/backend.h: the CPU or a GPU), which prepares every
 * weight (the CPU's packed copy, a GPU's device copy) and holds the workspaces; the forward pass
 * runs only that backend's ops. A `struct model` owns the mmap'd safetensors files, the parsed
 * config and any converted weights. model_forward runs one step for several sequences at once:
 * each sequence appends its tokens to its own KV blocks (through its block table into a shared
 * paged KV, seen as a backend_kv_view: kv_pool_view) and, for hybrid models, advances its
 * recurrent state. Matmuls run over all sequences' tokens together; attention over all
 * sequences in one op.
 *
 * Threading: model_load/free anywhere; model_forward from one thread at a time per model (the
 * engine's scheduler thread). Models on one backend take turns per step (the backend's
 * step_begin/step_end). */
#ifndef CAIRN_MODEL_MODEL_H
#define CAIRN_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/backend.h"

enum model_arch {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_QWEN3,
    MODEL_ARCH_QWEN3_MOE,
    MODEL_ARCH_QWEN3_NEXT,
    MODEL_ARCH_QWEN3_5,     /* qwen3_5 / qwen3_5_text */
    MODEL_ARCH_QWEN3_5_MOE,
};

#define MODEL_MAX_EOS 8

/* Sampling defaults from generation_config.json (Hugging Face semantics: do_sample false means
 * greedy, i.e. temperature 0). Only the fields whose MODEL_GEN_* bit is in `has` were given. */
#define MODEL_GEN_TEMPERATURE 1u
#define MODEL_GEN_TOP_P 2u
#define MODEL_GEN_TOP_K 4u
#define MODEL_GEN_MIN_P 8u
#define MODEL_GEN_REPETITION_PENALTY 16u
struct model_gen_defaults {
    unsigned has;
    float temperature;
    float top_p;
    int top_k;
    float min_p;
    float repetition_penalty;
};

/* What other rooms need to know about a loaded model. */
struct model_info {
    enum model_arch arch;
    char model_type[48];     /* config.json model_type, e.g. "qwen3" */
    int vocab_size;
    int hidden_size;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int n_kv_layers;         /* layers that keep KV (full attention, the MTP head's included); the
                              * KV view's n_layers */
    int n_mtp_layers;        /* MTP head layers loaded (mtp.* weights, model_mtp_forward); 0: none */
    int max_position;        /* max_position_embeddings */
    int32_t eos_ids[MODEL_MAX_EOS]; /* from generation_config.json, else config.json */
    int n_eos;
    int32_t bos_id;          /* -1 if none */
    struct model_gen_defaults gen; /* sampling defaults of generation_config.json */
    size_t state_bytes;      /* recurrent state per sequence; 0 for pure-attention models */
    uint64_t n_params;
    uint64_t weight_bytes;   /* bytes of weights as stored */
    /* MoE: what a decode step reads of the weights depends on the routing (bench's roofline) */
    int n_experts;           /* routed experts per MoE layer; 0: dense */
    int n_experts_per_tok;
    uint64_t routed_expert_bytes; /* of weight_bytes: every routed expert of every layer */
    uint64_t untied_embed_bytes;  /* of weight_bytes: an untied embedding table (one row read
                                   * per token); 0 when the LM head reads it */
    uint8_t identity[32];    /* SHA-256 over tensor names, dtypes, shapes and every byte (model_identity.h) */
};

struct model;

/* Loads dir/config.json, dir/generation_config.json (optional) and the safetensors weights
 * (model.safetensors, or the shards listed in model.safetensors.index.json) onto backend be,
 * which must outlive the model. Errors name the file, the tensor and expected vs actual
 * shape/dtype. Caller frees with model_free (before closing be). */
int model_load(const char *dir, struct backend *be, struct model **out, struct cairn_err *err);
/* model_load that reports its progress for another thread to read (relaxed atomics):
 * bytes_total is the stored size of the weights the backend prepares (set once the files are
 * open), bytes_done what it has prepared so far (uploaded to a GPU, packed on the CPU). */
struct model_load_progress {
    uint64_t bytes_done;
    uint64_t bytes_total;
};
int model_load_watch(const char *dir, struct backend *be, struct model_load_progress *pr,
                     struct model **out, struct cairn_err *err);
/* Loads rank `rank` of a tensor-parallel group of `world` (model/shard.h says what each rank
 * holds): be must be that rank's backend in its group (be->tp_rank, tp_world; the CPU's
 * simulated ranks: cpu_backend_tp_join). The rank's model reports its local sizes (n_heads,
 * n_kv_heads: its KV pool's; state_bytes) and the same identity as the whole model. Every rank's
 * model_forward must be called with the same steps, each from its own thread: the all-reduces
 * inside meet across ranks. Replicated lm_head: every rank's logits are the whole model's.
 * world 1 on a backend in no group is model_load (in a group of one: the identity shard, with
 * its all-reduces). Shapes that do not divide by world fail with CAIRN_ERR_INVALID. A rank
 * loads without the MTP head (mtp.* weights are left unread; info.n_mtp_layers 0): it does not
 * run sharded yet. */
int model_load_shard(const char *dir, struct backend *be, int rank, int world, struct model **out,
                     struct cairn_err *err);
void model_free(struct model *m);
const struct model_info *model_get_info(const struct model *m);
/* The backend the model runs on (for its KV pool: kv_pool_init). */
struct backend *model_backend(const struct model *m);

/* One sequence's part of a forward step. */
struct model_seq {
    const int32_t *tokens;      /* [n_tokens] to process now */
    int n_tokens;
    int pos0;                   /* absolute position of tokens[0] = tokens already in KV */
    const int32_t *block_table; /* pool block ids covering positions [0, pos0 + n_tokens) */
    void *state;                /* state_bytes of recurrent state, or NULL if state_bytes == 0 */
    int n_logits;               /* logits wanted for the last n_logits tokens (0..n_tokens) */
    float *logits;              /* [n_logits, vocab_size], written by model_forward */
    int n_hidden;               /* hidden states wanted for the last n_hidden tokens (0..n_tokens):
                                 * the last layer's output after the final norm, what an MTP head
                                 * reads (model_mtp_forward); 0 for plain decoding */
    float *hidden;              /* [n_hidden, hidden_size] host, written by model_forward */
    /* Sampling on the backend (its optional sample op, tensor/backend.h): with n_logits == 1
     * and `sample` set, the row is sampled there by *sample (its `row` is ignored) and the result
     * written to *sample_out; `logits` is then not written (it may be NULL). Only where
     * model_can_sample(m). */
    const struct backend_sample_row *sample;
    struct backend_sample_out *sample_out;
};
/* Whether the model's backend has the sample op (model_seq.sample may be set). */
int model_can_sample(const struct model *m);
/* Host time of the last model_forward: issue_s from the call until the first result was asked
 * of the backend (staging and issuing the ops), wait_s the rest (the device finishing the step,
 * the results' copies and device sampling). */
void model_last_step_times(const struct model *m, double *issue_s, double *wait_s);

/* Preallocates workspaces for up to max_tokens tokens (all sequences) per step, so that
 * model_forward allocates nothing (except growing the block-table staging, grow-only, the
 * first time a longer context comes). model_forward fails with CAIRN_ERR_LIMIT past it. */
int model_reserve(struct model *m, int max_tokens, struct cairn_err *err);
/* kv: the paged KV in the model's backend (kv_pool_view of a pool on model_backend(m)); may be
 * NULL for a model without attention layers. */
int model_forward(struct model *m, const struct backend_kv_view *kv, const struct model_seq *seqs, int n_seqs,
                  struct cairn_err *err);

/* The MTP head (info.n_mtp_layers > 0): one draft step per sequence over its KV layer
 * n_kv_layers - 1, through the same block table as the sequence (positions are shared with the
 * target's: the head's KV at position p sits in the block of p).
 *
 * Semantics (vLLM's qwen3_next_mtp.py): at position p the head reads hidden[p] (the target's hidden
 * state at p after its final norm, or the head's own output of the step before when chaining)
 * and tokens[p] = the token AFTER position p, and predicts the token after that:
 *   x = fc(cat(norm_e(embed(token)), norm_h(hidden))); x = layer(x) at position p (its attention
 *   reads the head's KV of positions 0..p); out = norm(x); logits = lm_head(out).
 * A sequence's items cover positions pos0 .. pos0 + n_tokens - 1; their KV is written. */
struct model_mtp_seq {
    const int32_t *tokens;      /* [n_tokens]: token after each position */
    const float *hidden;        /* [n_tokens, hidden_size] host */
    int n_tokens;
    int pos0;
    const int32_t *block_table; /* covering positions [0, pos0 + n_tokens) */
    int n_out;                  /* outputs wanted for the last n_out tokens (0..n_tokens) */
    float *logits;              /* [n_out, vocab_size] or NULL */
    float *hidden_out;          /* [n_out, hidden_size] the head's normed output (chaining), or NULL */
};
/* Runs the head for n_seqs sequences in one step (within model_reserve's tokens).
 * CAIRN_ERR_UNSUPPORTED if the model has no head. */
int model_mtp_forward(struct model *m, const struct backend_kv_view *kv, const struct model_mtp_seq *seqs,
                      int n_seqs, struct cairn_err *err);

/* Recurrent state of a fresh sequence: state_bytes in the model's backend memory (device memory
 * on a GPU), zeroed through the backend (kept as a function in case a model needs more). */
void model_state_init(const struct model *m, void *state);

#endif
