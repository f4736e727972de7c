/* Tensor-parallel shard plan: for a model config and a world size N, what rank r holds of every
 * weight, and the rank-local sizes its forward pass runs with (issue 23).
 *
 * DESIGN (Megatron-style, as vLLM and SGLang shard these families)
 * - Column-parallel (split the OUTPUT rows; the rank's output is its slice, no communication):
 *   q/k/v_proj (by attention head), gate/up_proj (by intermediate column), the experts' gate/up,
 *   the shared expert's gate/up, the DeltaNet input projections (by key/value head).
 * - Row-parallel (split the INPUT columns; each rank's output is a partial sum over its slice,
 *   all-reduced once per sub-layer): o_proj, down_proj, the experts' and shared expert's down,
 *   the DeltaNet out_proj. A row-parallel bias is added on rank 0 only, so the sum has it once.
 *   Per layer that is two all-reduces of [T, hidden]: after the mixer and after the FFN.
 * - Replicated: embed_tokens, lm_head (every rank computes the full logits: vocab-parallel
 *   lm_head would need an all-gather of [T, vocab] and saves memory only; left for later), all
 *   RMSNorm weights, q/k norms, the MoE router and shared_expert_gate, the DeltaNet gated-norm
 *   weight, the MTP head's fc and norms.
 * - KV heads: n_kv_heads / N per rank when N divides n_kv_heads; when N > n_kv_heads and
 *   n_kv_heads divides N, each rank holds the ONE KV head its query heads read (replicated on
 *   N / n_kv_heads ranks). Query heads must divide by N. The rank's KV pool has its local heads.
 * - DeltaNet (qwen3_next, qwen3_5): value heads split by N; key heads like KV heads (split, or
 *   replicated when N > key heads), so each rank runs the recurrence of its own heads with no
 *   communication; its recurrent state is its heads' share.
 * - MoE, two plans; shard_plan_make picks by this rule:
 *   SPLIT_EXPERTS (chosen whenever moe_intermediate_size divides by N): every rank holds 1/N of
 *     every expert's intermediate columns. Each token's top-k experts then cost every rank the
 *     same bytes, which is what batch-1 decode latency follows; the price is narrower matmuls.
 *   EXPERT_PARALLEL (fallback when only n_experts divides by N): rank r holds experts
 *     [r*E/N, (r+1)*E/N) whole. At small batch the step waits on the rank that drew the most of
 *     the top-k experts. Planned only: the forward does not run it yet (load error says so).
 *   Unmeasured on several GPUs (none were lent): the rule is the argument above, not a benchmark.
 * - MLX q4/q8 weights: column-parallel cuts whole rows (always aligned); row-parallel cuts input
 *   columns and must cut at quantization-group boundaries: shard_check_cols refuses otherwise.
 * Every shape that does not divide fails with a clear error naming the size and N.
 *
 * A rule (struct shard_rule) says which rows (or columns) of a tensor a rank keeps: `count`
 * repetitions, `stride` apart from `base`, of up to SHARD_MAX_PIECES pieces each, kept in that
 * order (qwen3_next's per-key-head [q | k | v | z] packing, MLX's stacked experts). */
#ifndef CAIRN_MODEL_SHARD_H
#define CAIRN_MODEL_SHARD_H

#include <stdint.h>

#include "base/status.h"
#include "model/config.h"

#define SHARD_MAX_WORLD 64

enum shard_moe_mode {
    SHARD_MOE_NONE = 0,        /* no MoE layers */
    SHARD_MOE_SPLIT_EXPERTS,   /* each expert's intermediate split across ranks */
    SHARD_MOE_EXPERT_PARALLEL, /* whole experts split across ranks (planned, not executed) */
};

struct shard_plan {
    int world, rank;
    /* attention */
    int n_heads, head0;       /* local query heads, first global one */
    int n_kv_heads, kv_head0; /* local KV heads, first global one */
    int kv_copies;            /* ranks holding each KV head (1: split, > 1: replicated) */
    /* dense MLP */
    int inter, inter0; /* local intermediate columns, first global one */
    /* MoE */
    enum shard_moe_mode moe;
    int moe_inter, moe_inter0;       /* SPLIT_EXPERTS: local columns of every expert */
    int n_experts, expert0;          /* EXPERT_PARALLEL: local experts (else all) */
    int shared_inter, shared_inter0; /* shared expert, split like the dense MLP */
    /* Gated DeltaNet */
    int gdn_k_heads, gdn_k_head0;
    int gdn_v_heads, gdn_v_head0;
};

/* Plans rank `rank` of `world` for config c. world 1 is the identity plan. Errors
 * (CAIRN_ERR_INVALID) name the size that does not divide. */
int shard_plan_make(const struct model_config *c, int world, int rank, struct shard_plan *p,
                    struct cairn_err *err);

enum shard_kind {
    SHARD_REPLICATED = 0,
    SHARD_ROWS, /* column-parallel: keep these output rows (and bias entries) */
    SHARD_COLS, /* row-parallel: keep these input columns; bias on rank 0 only */
};

#define SHARD_MAX_PIECES 4

struct shard_rule {
    enum shard_kind kind;
    int64_t base, count, stride; /* repetition r starts at base + r * stride */
    int n_pieces;
    struct {
        int64_t off, len; /* relative to the repetition's start */
    } piece[SHARD_MAX_PIECES];
    int64_t full;  /* rows (ROWS) or columns (COLS) of the whole tensor */
    int64_t local; /* what the rank keeps: count * sum of piece lengths */
};

/* The rule of the tensor named `name` (a linear's module path, e.g.
 * "model.layers.3.self_attn.o_proj", or a vector's full name) of `rows` x `cols` (vectors: cols
 * 1, rows = elements) under plan p. An unknown name is an error (CAIRN_ERR_UNSUPPORTED), never a
 * silent replication. */
int shard_rule_for(const struct shard_plan *p, const struct model_config *c, const char *name,
                   int64_t rows, int64_t cols, struct shard_rule *r, struct cairn_err *err);

/* Whether a row-parallel cut of columns [off, off + len) keeps whole groups of an MLX weight of
 * group_size gs and `bits`: CAIRN_OK, or CAIRN_ERR_INVALID naming the tensor. */
int shard_check_cols(const char *name, int64_t off, int64_t len, int gs, int bits,
                     struct cairn_err *err);

/* Writes the rank-local sizes of plan p into c (heads, intermediate sizes, DeltaNet heads): what
 * the rank's forward pass and KV pool run with. */
void shard_localize_config(const struct shard_plan *p, struct model_config *c);

#endif
