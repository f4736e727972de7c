/* Oracle parity of the MoE and hybrid families (qwen3_moe, qwen3_next, qwen3_5 bf16 and MLX q4,
 * qwen3_5_moe). The oracle's reference math was float32 here; f32 KV at tol 2e-3 in every mode
 * (whole, chunked prefill then decode over shuffled blocks, batched), bf16 KV at tol 0.1. The
 * 300-token case runs the recurrence across many prefill chunks. */
#include "oracle_common.h"

static const char *const hybrid_models[] = {
    "qwen3-moe-tiny", "qwen3next-tiny", "qwen3_5-tiny", "qwen3_5-tiny-mlx-q4-g64", "qwen3_5-moe-tiny",
};

int main(void)
{
    for (size_t i = 0; i < sizeof(hybrid_models) / sizeof(hybrid_models[0]); i++) {
        oracle_check_model(hybrid_models[i], DTYPE_F32, 2e-3, 0);
        oracle_check_model(hybrid_models[i], DTYPE_BF16, 0.1, MODEL_CHECK_BATCHED);
    }
    return test_summary("test_model_oracle_hybrid");
}
