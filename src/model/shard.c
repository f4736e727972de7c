/* Tensor-parallel shard plan and per-tensor rules (see shard.h for the design). Pure
 * arithmetic on the config and tensor names: nothing here touches weights. */
#include "model/shard.h"

#include <string.h>

static int shard_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* n split evenly over the ranks. */
static int shard_split(int n, const struct shard_plan *p, const char *what, int *n_local,
                       int *first, struct cairn_err *err)
{
    if (n <= 0 || n % p->world != 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "tensor parallel: %s (%d) does not divide by --tensor-parallel %d",
                             what, n, p->world);
    *n_local = n / p->world;
    *first = p->rank * *n_local;
    return CAIRN_OK;
}

/* Minor heads (KV heads, DeltaNet key heads) read by groups of n_major / n_minor major heads,
 * whose local range starts at major0 (n_major_l of them): split like the major heads when N
 * divides n_minor, else one replicated head per rank when n_minor divides N. */
static int shard_group(int n_major, int n_major_l, int major0, int n_minor,
                       const struct shard_plan *p, const char *what, int *n_local, int *first,
                       int *copies, struct cairn_err *err)
{
    if (n_minor <= 0 || n_major % n_minor != 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "tensor parallel: %s (%d) do not group %d heads", what, n_minor,
                             n_major);
    if (n_minor % p->world == 0) {
        *n_local = n_minor / p->world;
        *first = p->rank * *n_local;
        *copies = 1;
        return CAIRN_OK;
    }
    if (p->world % n_minor != 0)
        return cairn_err_set(
            err, CAIRN_ERR_INVALID,
            "tensor parallel: %s (%d) neither divide by nor divide --tensor-parallel %d", what,
            n_minor, p->world);
    (void)n_major_l; /* n_major_l divides the group size: all local heads read the one head */
    *n_local = 1;
    *first = major0 / (n_major / n_minor);
    *copies = p->world / n_minor;
    return CAIRN_OK;
}

int shard_plan_make(const struct model_config *c, int world, int rank, struct shard_plan *p,
                    struct cairn_err *err)
{
    memset(p, 0, sizeof(*p));
    if (world < 1 || world > SHARD_MAX_WORLD || rank < 0 || rank >= world)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "tensor parallel: rank %d of world %d is out of range (1..%d)", rank,
                             world, SHARD_MAX_WORLD);
    p->world = world;
    p->rank = rank;
    int rc = shard_split(c->n_heads, p, "num_attention_heads", &p->n_heads, &p->head0, err);
    if (rc == CAIRN_OK)
        rc = shard_group(c->n_heads, p->n_heads, p->head0, c->n_kv_heads, p, "num_key_value_heads",
                         &p->n_kv_heads, &p->kv_head0, &p->kv_copies, err);
    if (rc == CAIRN_OK && c->intermediate_size > 0)
        rc = shard_split(c->intermediate_size, p, "intermediate_size", &p->inter, &p->inter0, err);
    if (rc != CAIRN_OK) return rc;
    p->n_experts = c->n_experts;
    if (c->n_experts > 0) {
        if (c->moe_intermediate_size > 0 && c->moe_intermediate_size % world == 0) {
            p->moe = SHARD_MOE_SPLIT_EXPERTS;
            rc = shard_split(c->moe_intermediate_size, p, "moe_intermediate_size", &p->moe_inter,
                             &p->moe_inter0, err);
        } else if (c->n_experts % world == 0) {
            p->moe = SHARD_MOE_EXPERT_PARALLEL;
            p->moe_inter = c->moe_intermediate_size;
            rc = shard_split(c->n_experts, p, "num_experts", &p->n_experts, &p->expert0, err);
        } else {
            rc = cairn_err_set(err, CAIRN_ERR_INVALID,
                               "tensor parallel: neither moe_intermediate_size (%d) nor "
                               "num_experts (%d) divides by "
                               "--tensor-parallel %d",
                               c->moe_intermediate_size, c->n_experts, world);
        }
        if (rc == CAIRN_OK && c->shared_expert_intermediate_size > 0)
            rc = shard_split(c->shared_expert_intermediate_size, p,
                             "shared_expert_intermediate_size", &p->shared_inter, &p->shared_inter0,
                             err);
        if (rc != CAIRN_OK) return rc;
    }
    int n_gdn = 0;
    for (int i = 0; i < c->n_layers && c->layer_kinds; i++)
        n_gdn += c->layer_kinds[i] == MODEL_LAYER_LINEAR_ATTN;
    if (n_gdn > 0) {
        int copies = 0;
        rc = shard_split(c->linear_num_value_heads, p, "linear_num_value_heads", &p->gdn_v_heads,
                         &p->gdn_v_head0, err);
        if (rc == CAIRN_OK)
            rc = shard_group(c->linear_num_value_heads, p->gdn_v_heads, p->gdn_v_head0,
                             c->linear_num_key_heads, p, "linear_num_key_heads", &p->gdn_k_heads,
                             &p->gdn_k_head0, &copies, err);
    }
    return rc;
}

/* ---- rules ---- */

static void shard_rule_one(struct shard_rule *r, enum shard_kind kind, int64_t full, int64_t off,
                           int64_t len)
{
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->count = 1;
    r->n_pieces = 1;
    r->piece[0].off = off;
    r->piece[0].len = len;
    r->full = full;
}

static void shard_rule_add(struct shard_rule *r, int64_t off, int64_t len)
{
    r->piece[r->n_pieces].off = off;
    r->piece[r->n_pieces].len = len;
    r->n_pieces++;
}

/* DeltaNet channels of [q (key dim) | k (key dim) | v (value dim)], `per` values per channel
 * (1 for the qkv projection, conv_kernel for the flattened conv1d weight). */
static void shard_rule_gdn_qkv(const struct shard_plan *p, const struct model_config *c,
                               int64_t full, int64_t per, struct shard_rule *r)
{
    int64_t dk = c->linear_key_head_dim, dv = c->linear_value_head_dim,
            kd = dk * c->linear_num_key_heads;
    shard_rule_one(r, SHARD_ROWS, full, p->gdn_k_head0 * dk * per, p->gdn_k_heads * dk * per);
    shard_rule_add(r, (kd + p->gdn_k_head0 * dk) * per, p->gdn_k_heads * dk * per);
    shard_rule_add(r, (2 * kd + p->gdn_v_head0 * dv) * per, p->gdn_v_heads * dv * per);
}

/* qwen3_next's packed projections: per key head a block of `per_head` rows holding its q, k (dk
 * each) then its g = n_v / n_k value heads' v and z (dv each) for qkvz, or their b then a (1
 * each) for ba. The rank keeps its key heads' blocks, and of each only its value heads. */
static void shard_rule_gdn_packed(const struct shard_plan *p, const struct model_config *c,
                                  int64_t full, int qkvz, struct shard_rule *r)
{
    int64_t dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    int64_t g = c->linear_num_value_heads / c->linear_num_key_heads;
    int64_t vsub = p->gdn_v_heads / p->gdn_k_heads, vsub0 = p->gdn_v_head0 % g;
    int64_t per_head = qkvz ? 2 * dk + 2 * g * dv : 2 * g;
    memset(r, 0, sizeof(*r));
    r->kind = SHARD_ROWS;
    r->full = full;
    r->base = p->gdn_k_head0 * per_head;
    r->count = p->gdn_k_heads;
    r->stride = per_head;
    if (qkvz) {
        shard_rule_add(r, 0, dk);
        shard_rule_add(r, dk, dk);
        shard_rule_add(r, 2 * dk + vsub0 * dv, vsub * dv);
        shard_rule_add(r, 2 * dk + g * dv + vsub0 * dv, vsub * dv);
    } else {
        shard_rule_add(r, vsub0, vsub);
        shard_rule_add(r, g + vsub0, vsub);
    }
}

/* Rules of the FFN linears; returns 0 if name is none of them. */
static int shard_rule_ffn(const struct shard_plan *p, const struct model_config *c,
                          const char *name, int64_t rows, int64_t cols, struct shard_rule *r,
                          struct cairn_err *err)
{
    int gate_up = shard_ends_with(name, ".gate_proj") || shard_ends_with(name, ".up_proj");
    int down = shard_ends_with(name, ".down_proj");
    if (shard_ends_with(name, ".mlp.gate") || shard_ends_with(name, ".mlp.shared_expert_gate")) {
        shard_rule_one(r, SHARD_REPLICATED, rows, 0, rows); /* router, shared-expert gate */
        return 1;
    }
    if (!gate_up && !down) return 0;
    int64_t off, len;
    if (strstr(name, ".mlp.shared_expert.")) {
        off = p->shared_inter0;
        len = p->shared_inter;
    } else if (strstr(name, ".mlp.switch_mlp.") || strstr(name, ".mlp.experts.")) {
        if (p->moe != SHARD_MOE_SPLIT_EXPERTS) {
            cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                          "tensor parallel: %s: expert-parallel MoE (moe_intermediate_size %d does "
                          "not divide by "
                          "%d) is planned but not run yet",
                          name, c->moe_intermediate_size, p->world);
            return -1;
        }
        off = p->moe_inter0;
        len = p->moe_inter;
        if (gate_up &&
            strstr(name, ".mlp.switch_mlp.")) { /* [E * inter, hidden]: each expert's slice */
            shard_rule_one(r, SHARD_ROWS, rows, off, len);
            r->count = c->n_experts;
            r->stride = c->moe_intermediate_size;
            return 1;
        }
    } else {
        off = p->inter0;
        len = p->inter;
    }
    if (gate_up)
        shard_rule_one(r, SHARD_ROWS, rows, off, len);
    else
        shard_rule_one(r, SHARD_COLS, cols, off, len);
    return 1;
}

int shard_rule_for(const struct shard_plan *p, const struct model_config *c, const char *name,
                   int64_t rows, int64_t cols, struct shard_rule *r, struct cairn_err *err)
{
    int64_t hd = c->head_dim;
    int ffn = shard_rule_ffn(p, c, name, rows, cols, r, err);
    if (ffn < 0) return err ? err->status : CAIRN_ERR_UNSUPPORTED;
    if (ffn > 0) {
        /* done */
    } else if (strcmp(name, "model.embed_tokens") == 0 || strcmp(name, "lm_head") == 0 ||
               strcmp(name, "mtp.fc") == 0 || strstr(name, "norm") != NULL) {
        shard_rule_one(r, SHARD_REPLICATED, rows, 0, rows); /* norms (all kinds), ends, MTP fc */
    } else if (shard_ends_with(name, ".self_attn.q_proj")) {
        int64_t per = rows / c->n_heads; /* head_dim, or 2 * head_dim with the output gate */
        shard_rule_one(r, SHARD_ROWS, rows, p->head0 * per, p->n_heads * per);
    } else if (shard_ends_with(name, ".self_attn.k_proj") ||
               shard_ends_with(name, ".self_attn.v_proj")) {
        shard_rule_one(r, SHARD_ROWS, rows, p->kv_head0 * hd, p->n_kv_heads * hd);
    } else if (shard_ends_with(name, ".self_attn.o_proj")) {
        shard_rule_one(r, SHARD_COLS, cols, p->head0 * hd, p->n_heads * hd);
    } else if (shard_ends_with(name, ".linear_attn.in_proj_qkv")) {
        shard_rule_gdn_qkv(p, c, rows, 1, r);
    } else if (shard_ends_with(name, ".linear_attn.conv1d.weight")) {
        shard_rule_gdn_qkv(p, c, rows, c->linear_conv_kernel_dim, r);
    } else if (shard_ends_with(name, ".linear_attn.in_proj_qkvz")) {
        shard_rule_gdn_packed(p, c, rows, 1, r);
    } else if (shard_ends_with(name, ".linear_attn.in_proj_ba")) {
        shard_rule_gdn_packed(p, c, rows, 0, r);
    } else if (shard_ends_with(name, ".linear_attn.in_proj_z")) {
        int64_t dv = c->linear_value_head_dim;
        shard_rule_one(r, SHARD_ROWS, rows, p->gdn_v_head0 * dv, p->gdn_v_heads * dv);
    } else if (shard_ends_with(name, ".linear_attn.in_proj_b") ||
               shard_ends_with(name, ".linear_attn.in_proj_a") ||
               shard_ends_with(name, ".linear_attn.A_log") ||
               shard_ends_with(name, ".linear_attn.dt_bias")) {
        shard_rule_one(r, SHARD_ROWS, rows, p->gdn_v_head0, p->gdn_v_heads);
    } else if (shard_ends_with(name, ".linear_attn.out_proj")) {
        int64_t dv = c->linear_value_head_dim;
        shard_rule_one(r, SHARD_COLS, cols, p->gdn_v_head0 * dv, p->gdn_v_heads * dv);
    } else {
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                             "tensor parallel: no shard rule for tensor '%s'", name);
    }
    /* every piece of every repetition inside the tensor */
    int64_t sum = 0, end = 0;
    for (int i = 0; i < r->n_pieces; i++) {
        sum += r->piece[i].len;
        int64_t e = r->base + (r->count - 1) * r->stride + r->piece[i].off + r->piece[i].len;
        end = e > end ? e : end;
        if (r->piece[i].off < 0 || r->piece[i].len <= 0) end = INT64_MAX;
    }
    r->local = r->count * sum;
    if (end > r->full || r->count <= 0)
        return cairn_err_set(
            err, CAIRN_ERR_FORMAT,
            "tensor parallel: tensor '%s' [%lld, %lld] is smaller than its shard rule needs", name,
            (long long)rows, (long long)cols);
    return CAIRN_OK;
}

int shard_check_cols(const char *name, int64_t off, int64_t len, int gs, int bits,
                     struct cairn_err *err)
{
    int whole_groups = gs > 0 && off % gs == 0 && len % gs == 0;
    int whole_words = (off * bits) % 32 == 0 && (len * bits) % 32 == 0;
    if (whole_groups && whole_words) return CAIRN_OK;
    return cairn_err_set(
        err, CAIRN_ERR_INVALID,
        "tensor parallel: '%s': input columns [%lld, %lld) of a %d-bit weight cut its groups of %d "
        "(each rank's share must be whole groups)",
        name, (long long)off, (long long)(off + len), bits, gs);
}

void shard_localize_config(const struct shard_plan *p, struct model_config *c)
{
    c->n_heads = p->n_heads;
    c->n_kv_heads = p->n_kv_heads;
    if (c->intermediate_size > 0) c->intermediate_size = p->inter;
    if (p->moe == SHARD_MOE_SPLIT_EXPERTS) c->moe_intermediate_size = p->moe_inter;
    if (c->shared_expert_intermediate_size > 0)
        c->shared_expert_intermediate_size = p->shared_inter;
    if (p->gdn_v_heads > 0) {
        c->linear_num_value_heads = p->gdn_v_heads;
        c->linear_num_key_heads = p->gdn_k_heads;
    }
}
