/* Op-by-op cases for a backend (tensor/backend.h), after ggml's test-backend-ops: every op of
 * the table over odd shapes and every weight dtype (F32, F16, BF16, MLX q4/q8 with group sizes
 * 32/64/128), KV in BF16 and F32, and attention over several sequences of different context
 * lengths in one call. Each case runs on `be` through its op table (buffers from buf_alloc,
 * inputs by buf_upload, outputs by buf_download) and is compared with a straightforward
 * reference written here in double precision (no cpu/ code), so the same cases check the CPU
 * backend (tests/unit/test_backend_ops.c) and a GPU backend (cuda:0) alike.
 *
 * Tolerances: each op has a stated relative tolerance (f32-accumulation level for the CPU);
 * tol_scale multiplies all of them (1 for the CPU; a GPU with other summation orders may need
 * more, and says how much). Exact ops (copies, gathers, KV stores in F32, routing ids) are
 * compared exactly whatever tol_scale is. */
#ifndef CAIRN_TESTS_SUPPORT_BACKEND_CASES_H
#define CAIRN_TESTS_SUPPORT_BACKEND_CASES_H

#include "tensor/backend.h"

struct backend_cases_result {
    int n_checks;   /* values groups compared (one per case and output) */
    int n_failed;   /* of those, outside tolerance; each is printed to stderr with its case */
};

/* Runs every case on be. Returns CAIRN_OK when all cases ran (res says how many passed), or the
 * status of a backend call that failed (buffer allocation, upload, step_end), with err set. */
int backend_cases_run(struct backend *be, double tol_scale, struct backend_cases_result *res,
                      struct cairn_err *err);

#endif
