/* Tensor parallelism proved on the CPU (issue 23): every oracle family (dense, MoE, hybrid;
 * BF16 and MLX) runs as N = 2 and N = 4 simulated ranks, each a CPU backend of one group
 * (cpu/cpu_tp.c) holding only its shard of the weights (model_load_shard, model/shard.h), each
 * driven by its own thread through the same model_forward a GPU rank runs; the row-parallel
 * partial sums meet in the seam's allreduce (host memory here, NCCL on CUDA).
 *
 * Checked per model and N, on every rank (the lm_head is replicated, so every rank has the
 * logits):
 * - the oracle (check-logits' whole-prefill and batched modes: the batched one mixes prefill
 *   chunks and decodes of all cases in a step, so batched == solo is checked too), f32 KV at the
 *   single-device CPU tolerance 2e-3;
 * - the unsharded model on the same 40 tokens: max |Δlogit| <= 1e-4 (the only difference is f32
 *   summation order of the split dot products);
 * - combinations that cannot be split fail to load with the reason, worked out by hand from
 *   each config.json below (e.g. qwen2: intermediate 320 / 2 = 160 input columns of down_proj,
 *   not whole groups of 64). */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "testlib.h"
#include "test_backend.h"

#include "cpu/cpu.h"
#include "model/check.h"
#include "model/model.h"
#include "model/model_run.h"

#define TP_MAX 4
#define TP_DIRECT_TOKENS 40

struct tp_case {
    const char *model;
    int world;
    const char *refuse; /* NULL: must run; else a part of the load error */
};

static const struct tp_case tp_cases[] = {
    {"llama-tiny", 2, NULL},
    {"llama-tiny", 4, NULL}, /* 2 KV heads on 4 ranks: each KV head on two ranks */
    {"llama-tiny-mlx-q4-g32", 2,
     "cut its groups"},                 /* down_proj: 352 / 2 = 176 columns, groups of 32 */
    {"llama-tiny-mlx-q4-g64", 2, NULL}, /* down_proj (352 % 64 != 0) stays BF16 */
    {"llama-tiny-mlx-q8-g64", 2, NULL},
    {"llama-tiny-mlx-q8-g64", 4, "cut its groups"}, /* o_proj: 128 / 4 = 32 columns, groups of 64 */
    {"llama-medium", 2, NULL},                      /* 1 KV head, replicated */
    {"llama-medium", 4, "num_attention_heads (2)"},
    {"llama-medium-mlx-q4-g64", 2, NULL},
    {"llama31-rope-tiny", 4, NULL},
    {"qwen2-tiny", 2, NULL}, /* q/k/v biases split with their rows */
    {"qwen2-tiny", 4, NULL},
    {"qwen2-tiny-mlx-q4-g64", 2, "cut its groups"}, /* down_proj: 320 / 2 = 160 columns */
    {"qwen3-tiny", 2, NULL},
    {"qwen3-tiny", 4, NULL},
    {"qwen3-tiny-mlx-q4-g64", 2, NULL},
    {"qwen3-tiny-mlx-q8-g64", 2, NULL},
    {"qwen3-tiny-mlx-q4-g64", 4, "cut its groups"}, /* down_proj: 384 / 4 = 96 columns */
    {"qwen3-moe-tiny", 2, NULL},
    {"qwen3-moe-tiny", 4, NULL},
    {"qwen3next-tiny", 2, NULL},
    {"qwen3next-tiny", 4, NULL}, /* 2 DeltaNet key heads on 4 ranks: replicated */
    {"qwen3_5-tiny", 2, NULL},
    {"qwen3_5-tiny", 4, NULL},
    {"qwen3_5-tiny-mlx-q4-g64", 2, NULL},
    {"qwen3_5-moe-tiny", 2, NULL},
    {"qwen3_5-moe-tiny", 4, NULL},
};

struct tp_rank {
    struct model *m;
    const char *exp;
    const int32_t *tokens;
    float *logits; /* [TP_DIRECT_TOKENS, vocab] */
    struct model_check_result res;
    int rc;
    struct cairn_err err;
};

/* All TP_DIRECT_TOKENS tokens in one prefill, every position's logits. */
static int tp_direct(struct model *m, const int32_t *tokens, float *logits, struct cairn_err *err)
{
    struct model_run run;
    struct model_run_opts o = {.n_seqs = 1,
                               .max_ctx = TP_DIRECT_TOKENS,
                               .max_step = TP_DIRECT_TOKENS,
                               .block_size = 16,
                               .kv_dtype = DTYPE_F32};
    int rc = model_run_open(&run, m, &o, err);
    if (rc != CAIRN_OK) return rc;
    struct model_run_item it = {.seq = 0,
                                .tokens = tokens,
                                .n_tokens = TP_DIRECT_TOKENS,
                                .n_logits = TP_DIRECT_TOKENS,
                                .logits = logits};
    rc = model_run_step(&run, &it, 1, err);
    model_run_close(&run);
    return rc;
}

static void *tp_rank_main(void *arg)
{
    struct tp_rank *r = arg;
    struct model_check_opts o = {.tol = 2e-3,
                                 .kv_dtype = DTYPE_F32,
                                 .chunk = 32,
                                 .block_size = 16,
                                 .modes = MODEL_CHECK_WHOLE | MODEL_CHECK_BATCHED};
    r->rc = model_check_run(r->m, r->exp, &o, &r->res, &r->err);
    if (r->rc == CAIRN_OK) r->rc = tp_direct(r->m, r->tokens, r->logits, &r->err);
    return NULL;
}

static void tp_run_case(const struct tp_case *c)
{
    char dir[1024], rel[512], exp[1100];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", c->model);
    test_src_path(rel, dir, sizeof(dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", dir);
    struct cairn_err err = {0};
    struct cpu_tp_group *g = NULL;
    struct backend *be[TP_MAX] = {0};
    struct tp_rank rk[TP_MAX];
    memset(rk, 0, sizeof(rk));
    int rc = cpu_tp_group_create(c->world, &g, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    int loaded = 0;
    for (int r = 0; r < c->world && rc == CAIRN_OK; r++) {
        rc = backend_open("cpu", 0, &be[r], &err);
        if (rc == CAIRN_OK) rc = cpu_backend_tp_join(be[r], g, r, &err);
        if (rc == CAIRN_OK) rc = model_load_shard(dir, be[r], r, c->world, &rk[r].m, &err);
        loaded += rc == CAIRN_OK;
    }
    if (c->refuse) {
        CHECK_MSG(rc != CAIRN_OK && loaded == 0 && strstr(err.msg, c->refuse),
                  "%s tp %d: expected a load error with '%s', got rc %d: %s", c->model, c->world,
                  c->refuse, rc, err.msg);
        printf("%-26s tp %d  refused: %s\n", c->model, c->world, err.msg);
        goto done;
    }
    CHECK_MSG(rc == CAIRN_OK, "%s tp %d: %s", c->model, c->world, err.msg);
    if (rc != CAIRN_OK) goto done;
    const struct model_info *in0 = model_get_info(rk[0].m);
    int V = in0->vocab_size;
    int32_t tokens[TP_DIRECT_TOKENS];
    for (int i = 0; i < TP_DIRECT_TOKENS; i++)
        tokens[i] = (int32_t)((i * 7919 + 3) % V);
    /* the unsharded reference on the same tokens */
    struct model *whole = NULL;
    float *ref = calloc((size_t)TP_DIRECT_TOKENS * (size_t)V, sizeof(float));
    rc = model_load(dir, test_cpu_be(), &whole, &err);
    if (rc == CAIRN_OK) rc = model_reserve(whole, TP_DIRECT_TOKENS, &err);
    if (rc == CAIRN_OK) rc = tp_direct(whole, tokens, ref, &err);
    CHECK_MSG(rc == CAIRN_OK && ref, "%s unsharded: %s", c->model, err.msg);
    int n_heads_whole = whole ? model_get_info(whole)->n_heads : 0;
    model_free(whole);
    pthread_t th[TP_MAX];
    for (int r = 0; r < c->world; r++) {
        rk[r].exp = exp;
        rk[r].tokens = tokens;
        rk[r].logits = calloc((size_t)TP_DIRECT_TOKENS * (size_t)V, sizeof(float));
        CHECK(rk[r].logits != NULL);
        CHECK(memcmp(model_get_info(rk[r].m)->identity, in0->identity, 32) == 0);
        CHECK_EQ_INT(model_get_info(rk[r].m)->n_heads * c->world, n_heads_whole);
    }
    for (int r = 0; r < c->world; r++)
        CHECK(pthread_create(&th[r], NULL, tp_rank_main, &rk[r]) == 0);
    for (int r = 0; r < c->world; r++)
        pthread_join(th[r], NULL);
    double max_whole = 0;
    for (int r = 0; r < c->world; r++) {
        struct tp_rank *k = &rk[r];
        CHECK_MSG(k->rc == CAIRN_OK, "%s tp %d rank %d: %s", c->model, c->world, r, k->err.msg);
        if (k->rc != CAIRN_OK) continue;
        CHECK_MSG(k->res.n_failed == 0 && k->res.n_runs >= 2 * k->res.n_cases &&
                      k->res.n_cases >= 2,
                  "%s tp %d rank %d: %d of %d oracle runs failed (max %g)", c->model, c->world, r,
                  k->res.n_failed, k->res.n_runs, k->res.max_abs);
        for (size_t i = 0; ref && i < (size_t)TP_DIRECT_TOKENS * (size_t)V; i++)
            max_whole = fmax(max_whole, fabs((double)k->logits[i] - (double)ref[i]));
        /* every rank got the same bits out of the all-reduce, so the same logits */
        CHECK(memcmp(k->logits, rk[0].logits,
                     sizeof(float) * (size_t)TP_DIRECT_TOKENS * (size_t)V) == 0);
    }
    CHECK_MSG(max_whole <= 1e-4, "%s tp %d: max |logit - unsharded| = %g > 1e-4", c->model,
              c->world, max_whole);
    printf("%-26s tp %d  oracle max|dlogit| %.3e (%d runs)  vs unsharded %.3e\n", c->model,
           c->world, rk[0].res.max_abs, rk[0].res.n_runs, max_whole);
    free(ref);
done:
    for (int r = 0; r < c->world; r++) {
        model_free(rk[r].m);
        free(rk[r].logits);
        backend_close(be[r]);
    }
    cpu_tp_group_free(g);
}

int main(void)
{
    for (size_t i = 0; i < sizeof(tp_cases) / sizeof(tp_cases[0]); i++)
        tp_run_case(&tp_cases[i]);
    return test_summary("test_tp_cpu");
}
