/* The tensor-parallel shard plan (model/shard.h) on configs shaped like real checkpoints,
 * without weights: per-rank sizes, the rules' rows and columns, the MoE plan rule, and the
 * errors for shapes that do not divide. Expected values are worked out by hand from the
 * layouts (Llama-3-8B's heads, MLX stacked experts, qwen3_next's per-key-head packing); the
 * numerical proof that the rules are right is test_tp_cpu (every oracle family, N = 2 and 4). */
#include <string.h>

#include "testlib.h"

#include "model/shard.h"

static enum model_layer_kind kinds_hybrid[2] = {MODEL_LAYER_LINEAR_ATTN, MODEL_LAYER_ATTN};

/* Llama-3-8B: 32 heads of 128, 8 KV heads, intermediate 14336. */
static struct model_config llama8b(void)
{
    struct model_config c;
    memset(&c, 0, sizeof(c));
    c.arch = MODEL_ARCH_LLAMA;
    c.hidden_size = 4096;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.intermediate_size = 14336;
    c.n_layers = 1;
    return c;
}

static void test_dense(void)
{
    struct model_config c = llama8b();
    struct shard_plan p;
    struct shard_rule r;
    struct cairn_err err = {0};
    CHECK(shard_plan_make(&c, 2, 1, &p, &err) == CAIRN_OK);
    CHECK_EQ_INT(p.n_heads, 16);
    CHECK_EQ_INT(p.head0, 16);
    CHECK_EQ_INT(p.n_kv_heads, 4);
    CHECK_EQ_INT(p.kv_head0, 4);
    CHECK_EQ_INT(p.kv_copies, 1);
    CHECK_EQ_INT(p.inter, 7168);
    CHECK_EQ_INT(p.inter0, 7168);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.self_attn.q_proj", 4096, 4096, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_ROWS && r.count == 1 && r.n_pieces == 1);
    CHECK_EQ_INT(r.piece[0].off, 2048);
    CHECK_EQ_INT(r.local, 2048);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.self_attn.v_proj", 1024, 4096, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_ROWS && r.piece[0].off == 512 && r.local == 512);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.self_attn.o_proj", 4096, 4096, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_COLS && r.piece[0].off == 2048 && r.local == 2048 && r.full == 4096);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.mlp.down_proj", 4096, 14336, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_COLS && r.piece[0].off == 7168 && r.local == 7168);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.input_layernorm.weight", 4096, 1, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_REPLICATED);
    CHECK(shard_rule_for(&p, &c, "lm_head", 128256, 4096, &r, &err) == CAIRN_OK);
    CHECK(r.kind == SHARD_REPLICATED);
    /* 16 ranks over 8 KV heads: rank 5 has query heads 10, 11, which read KV head 2 */
    CHECK(shard_plan_make(&c, 16, 5, &p, &err) == CAIRN_OK);
    CHECK_EQ_INT(p.n_heads, 2);
    CHECK_EQ_INT(p.n_kv_heads, 1);
    CHECK_EQ_INT(p.kv_head0, 2);
    CHECK_EQ_INT(p.kv_copies, 2);
    /* world 1: the whole tensor */
    CHECK(shard_plan_make(&c, 1, 0, &p, &err) == CAIRN_OK);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.self_attn.o_proj", 4096, 4096, &r, &err) ==
          CAIRN_OK);
    CHECK(r.piece[0].off == 0 && r.local == 4096);
}

static void test_errors(void)
{
    struct model_config c = llama8b();
    struct shard_plan p;
    struct shard_rule r;
    struct cairn_err err = {0};
    CHECK(shard_plan_make(&c, 3, 0, &p, &err) == CAIRN_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "num_attention_heads (32)") && strstr(err.msg, "3"), "%s", err.msg);
    c.n_heads = 6;
    c.n_kv_heads = 3;
    CHECK(shard_plan_make(&c, 2, 0, &p, &err) == CAIRN_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "num_key_value_heads (3)"), "%s", err.msg);
    c = llama8b();
    c.intermediate_size = 14335;
    CHECK(shard_plan_make(&c, 2, 0, &p, &err) == CAIRN_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "intermediate_size (14335)"), "%s", err.msg);
    CHECK(shard_plan_make(&c, 2, 2, &p, &err) == CAIRN_ERR_INVALID);
    c = llama8b();
    CHECK(shard_plan_make(&c, 2, 0, &p, &err) == CAIRN_OK);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.self_attn.rotary_emb.inv_freq", 64, 1, &r, &err) ==
          CAIRN_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "no shard rule"), "%s", err.msg);
    /* MLX row-parallel cuts: whole groups only */
    CHECK(shard_check_cols("x", 64, 64, 64, 4, &err) == CAIRN_OK);
    CHECK(shard_check_cols("x", 0, 96, 64, 4, &err) == CAIRN_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "cut its groups of 64"), "%s", err.msg);
    CHECK(shard_check_cols("x", 32, 32, 64, 8, &err) == CAIRN_ERR_INVALID);
}

static void test_moe(void)
{
    struct model_config c = llama8b();
    c.arch = MODEL_ARCH_QWEN3_MOE;
    c.n_experts = 4;
    c.n_experts_per_tok = 2;
    c.moe_intermediate_size = 64;
    struct shard_plan p;
    struct shard_rule r;
    struct cairn_err err = {0};
    CHECK(shard_plan_make(&c, 2, 1, &p, &err) == CAIRN_OK);
    CHECK(p.moe == SHARD_MOE_SPLIT_EXPERTS && p.moe_inter == 32 && p.moe_inter0 == 32);
    /* MLX stacked [E * inter, hidden]: rows 32..63 of each expert's 64 */
    CHECK(shard_rule_for(&p, &c, "model.layers.0.mlp.switch_mlp.up_proj", 256, 4096, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_ROWS && r.count == 4 && r.stride == 64 && r.piece[0].off == 32 &&
          r.piece[0].len == 32);
    CHECK_EQ_INT(r.local, 128);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.mlp.switch_mlp.down_proj", 4 * 4096, 64, &r,
                         &err) == CAIRN_OK);
    CHECK(r.kind == SHARD_COLS && r.piece[0].off == 32 && r.local == 32);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.mlp.gate", 4, 4096, &r, &err) == CAIRN_OK);
    CHECK(r.kind == SHARD_REPLICATED);
    /* 100 columns do not split 8 ways, 8 experts do: expert parallel, planned but not run */
    c.n_experts = 8;
    c.moe_intermediate_size = 100;
    CHECK(shard_plan_make(&c, 8, 3, &p, &err) == CAIRN_OK);
    CHECK(p.moe == SHARD_MOE_EXPERT_PARALLEL && p.n_experts == 1 && p.expert0 == 3);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.mlp.experts.3.gate_proj", 100, 4096, &r, &err) ==
          CAIRN_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "expert-parallel"), "%s", err.msg);
    c.n_experts = 6;
    c.moe_intermediate_size = 102; /* neither 102 columns nor 6 experts split 4 ways */
    CHECK(shard_plan_make(&c, 4, 0, &p, &err) == CAIRN_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "num_experts (6)"), "%s", err.msg);
}

static void test_gdn(void)
{
    struct model_config c = llama8b();
    c.arch = MODEL_ARCH_QWEN3_NEXT;
    c.n_layers = 2;
    c.layer_kinds = kinds_hybrid;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.intermediate_size = 256;
    c.linear_num_key_heads = 2;
    c.linear_num_value_heads = 4;
    c.linear_key_head_dim = 32;
    c.linear_value_head_dim = 32;
    c.linear_conv_kernel_dim = 4;
    struct shard_plan p;
    struct shard_rule r;
    struct cairn_err err = {0};
    /* 4 ranks: rank 3 has value head 3, the second of key head 1's two */
    CHECK(shard_plan_make(&c, 4, 3, &p, &err) == CAIRN_OK);
    CHECK(p.gdn_v_heads == 1 && p.gdn_v_head0 == 3 && p.gdn_k_heads == 1 && p.gdn_k_head0 == 1);
    /* qkvz per key head: q 32 | k 32 | v of 2 heads 64 | z of 2 heads 64 = 192 rows */
    CHECK(shard_rule_for(&p, &c, "model.layers.0.linear_attn.in_proj_qkvz", 384, 4096, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_ROWS && r.base == 192 && r.count == 1 && r.n_pieces == 4);
    CHECK(r.piece[0].off == 0 && r.piece[0].len == 32 && r.piece[1].off == 32 &&
          r.piece[1].len == 32);
    CHECK(r.piece[2].off == 96 && r.piece[2].len == 32 && r.piece[3].off == 160 &&
          r.piece[3].len == 32);
    CHECK_EQ_INT(r.local, 128);
    /* ba per key head: b of 2 | a of 2 */
    CHECK(shard_rule_for(&p, &c, "model.layers.0.linear_attn.in_proj_ba", 8, 4096, &r, &err) ==
          CAIRN_OK);
    CHECK(r.base == 4 && r.piece[0].off == 1 && r.piece[0].len == 1 && r.piece[1].off == 3 &&
          r.local == 2);
    /* conv1d over [q 64 | k 64 | v 128] channels, 4 taps each */
    CHECK(shard_rule_for(&p, &c, "model.layers.0.linear_attn.conv1d.weight", 256 * 4, 1, &r,
                         &err) == CAIRN_OK);
    CHECK(r.piece[0].off == 32 * 4 && r.piece[1].off == (64 + 32) * 4 &&
          r.piece[2].off == (128 + 96) * 4);
    CHECK_EQ_INT(r.local, (32 + 32 + 32) * 4);
    CHECK(shard_rule_for(&p, &c, "model.layers.0.linear_attn.out_proj", 4096, 128, &r, &err) ==
          CAIRN_OK);
    CHECK(r.kind == SHARD_COLS && r.piece[0].off == 96 && r.local == 32);
    c.linear_num_value_heads = 6;
    c.linear_num_key_heads = 3;
    CHECK(shard_plan_make(&c, 4, 0, &p, &err) == CAIRN_ERR_INVALID);
    CHECK_MSG(strstr(err.msg, "linear_num_value_heads (6)"), "%s", err.msg);
}

int main(void)
{
    test_dense();
    test_errors();
    test_moe();
    test_gdn();
    return test_summary("test_shard_plan");
}
