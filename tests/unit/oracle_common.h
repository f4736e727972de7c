/* Shared by test_model_oracle*.c. Oracle parity of the dense forward pass: every dense oracle model
 * (BF16 and MLX q4/q8 variants) through check-logits' three modes (whole prefill, chunked prefill +
 * decode over a shuffled block table, all cases batched), with f32 KV at tol 2e-3 (all modes) and
 * bf16 KV at tol 0.1 (batched mode). */
#ifndef CAIRN_TEST_ORACLE_COMMON_H
#define CAIRN_TEST_ORACLE_COMMON_H
#include "testlib.h"
#include "test_backend.h"

#include "model/check.h"
#include "model/model.h"

static const char *const oracle_models[] = {
    "llama-tiny",
    "llama-tiny-mlx-q4-g32",
    "llama-tiny-mlx-q4-g64",
    "llama-tiny-mlx-q8-g64",
    "llama-medium",
    "llama-medium-mlx-q4-g64",
    "llama31-rope-tiny",
    "qwen2-tiny",
    "qwen2-tiny-mlx-q4-g64",
    "qwen3-tiny",
    "qwen3-tiny-mlx-q4-g64",
    "qwen3-tiny-mlx-q8-g64",
};

static void oracle_check_model(const char *name, enum dtype kv, double tol, unsigned modes)
{
    char dir[1024], rel[512], exp[1100];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    test_src_path(rel, dir, sizeof(dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", dir);
    struct cairn_err err = {0};
    struct model *m = NULL;
    int rc = model_load(dir, test_cpu_be(), &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    if (rc != CAIRN_OK) return;
    const struct {
        enum dtype kv;
        double tol;
    } runs[] = {{kv, tol}};
    for (size_t i = 0; i < 1; i++) {
        struct model_check_opts o = {.tol = runs[i].tol,
                                     .kv_dtype = runs[i].kv,
                                     .chunk = 32,
                                     .block_size = 16,
                                     .modes = modes};
        struct model_check_result r;
        rc = model_check_run(m, exp, &o, &r, &err);
        CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
        CHECK_MSG(r.n_failed == 0, "%s kv %s: %d of %d runs failed (max %g)", name,
                  dtype_name(runs[i].kv), r.n_failed, r.n_runs, r.max_abs);
        CHECK(r.n_runs >= __builtin_popcount(modes ? modes : 7u) * r.n_cases && r.n_cases >= 2);
        printf("%-26s kv %-4s cases %d runs %2d  max|dlogit| %.3e  greedy %ld/%ld\n", name,
               dtype_name(runs[i].kv), r.n_cases, r.n_runs, r.max_abs, r.n_greedy - r.n_greedy_bad,
               r.n_greedy);
    }
    model_free(m);
}

#endif
