/* Oracle parity with bf16 KV cache at tol 0.1 (all dense oracle models, all cases batched
 * with chunked prefill + decode; see oracle_common.h). */
#include "oracle_common.h"

int main(void)
{
    for (size_t i = 0; i < sizeof(oracle_models) / sizeof(oracle_models[0]); i++)
        oracle_check_model(oracle_models[i], DTYPE_BF16, 0.1, MODEL_CHECK_BATCHED);
    return test_summary("test_model_oracle_bf16");
}
