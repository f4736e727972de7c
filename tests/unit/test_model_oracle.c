/* Oracle parity with f32 KV cache at tol 2e-3 on all dense oracle models: all cases batched
 * with 32-token prefill chunks + decode steps over a shuffled block table, and for the BF16
 * checkpoints also each case as one whole prefill (the MLX variants run the same code with
 * other weights; the third mode, each case alone chunked, runs in integ_model_cli and
 * `cairn check-logits`). Kept to what fits the suite's time under ASan. See oracle_common.h.
 * The kernels are the ones `cairn serve` picks (the CPU backend: the best ISA, and q4/q8 packed
 * for the VNNI kernels where present); tests/integration/cpu_isa_oracle.sh runs every ISA. */
#include "oracle_common.h"

int main(void)
{
    for (size_t i = 0; i < sizeof(oracle_models) / sizeof(oracle_models[0]); i++) {
        unsigned modes = MODEL_CHECK_BATCHED;
        if (!strstr(oracle_models[i], "-mlx-")) modes |= MODEL_CHECK_WHOLE;
        oracle_check_model(oracle_models[i], DTYPE_F32, 2e-3, modes);
    }
    return test_summary("test_model_oracle");
}
