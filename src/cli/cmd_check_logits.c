/* cairn check-logits MODEL_DIR EXPECTED.safetensors [--tol T] [--kv f32|bf16] [--chunk N]
 *                    [--block-size B] [--device auto|cpu|cuda[:N]] [--tensor-parallel N]
 * Runs every oracle case through the paged, batched forward (whole prefill, chunked prefill +
 * decode, all cases batched) and compares logits. Exit 0 if all pass, 1 on a mismatch, 2 on
 * a usage or load error.
 *
 * --tensor-parallel N > 1 (or CAIRN_TP_FORCE=1 with N = 1: the same path as a group of one,
 * for tests/cuda/tp1.sh) shards the model over N ranks (model/model_tp.h): GPUs 0..N-1 with
 * NCCL on --device cuda, simulated ranks on --device cpu. Every rank runs the whole check on
 * its own thread (the same steps, so their all-reduces meet); rank 0 reports, and the check
 * fails if any rank's does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/check.h"
#include "model/model.h"
#include "model/model_tp.h"

static void check_logits_usage(FILE *f)
{
    fprintf(f,
            "usage: cairn check-logits MODEL_DIR EXPECTED.safetensors [--tol T] [--kv f32|bf16]\n"
            "                          [--chunk N] [--block-size B] [--device auto|cpu|cuda[:N]]\n"
            "                          [--tensor-parallel N]\n");
}

struct check_logits_tp {
    const char *expected;
    struct model_check_opts o;
    struct model_check_result res[BACKEND_TP_MAX];
};

static int check_logits_rank(struct model *m, int rank, void *ctx, struct cairn_err *err)
{
    struct check_logits_tp *t = ctx;
    struct model_check_opts o = t->o;
    if (rank != 0) o.out = NULL; /* rank 0 reports the cases */
    return model_check_run(m, t->expected, &o, &t->res[rank], err);
}

/* The check on a tensor-parallel group; fills *r with rank 0's result (failed runs: the most
 * any rank had). Returns 2 on a usage, load or run error, else 0. */
static int check_logits_tp(const char *dir, const char *expected, const char *device, int n_tp,
                           const struct model_check_opts *o, struct model_check_result *r)
{
    struct cairn_err err = {0};
    struct backend_tp *g = NULL;
    struct model_tp *t = NULL;
    struct check_logits_tp *ctx = calloc(1, sizeof(*ctx));
    int rc = ctx ? backend_tp_open(device, n_tp, &g, &err)
                 : cairn_err_set(&err, CAIRN_ERR_NOMEM, "out of memory");
    if (rc == CAIRN_OK) rc = model_tp_load(dir, g, &t, &err);
    if (rc == CAIRN_OK) {
        ctx->expected = expected;
        ctx->o = *o;
        rc = model_tp_run(t, check_logits_rank, ctx, &err);
    }
    if (rc == CAIRN_OK) {
        *r = ctx->res[0];
        for (int k = 1; k < n_tp; k++)
            r->n_failed = CAIRN_MAX(r->n_failed, ctx->res[k].n_failed);
        fprintf(stdout, "tensor parallel: %d ranks on %s\n", n_tp, g->bes[0]->name);
    } else {
        fprintf(stderr, "check-logits: --tensor-parallel %d: %s\n", n_tp, err.msg);
    }
    model_tp_free(t);
    backend_tp_close(g);
    free(ctx);
    return rc == CAIRN_OK ? 0 : 2;
}

static int check_logits_report(const struct model_check_result *r,
                               const struct model_check_opts *o);

int cmd_check_logits(int argc, char **argv)
{
    struct model_check_opts o = {
        .tol = 2e-3, .kv_dtype = DTYPE_F32, .chunk = 32, .block_size = 16, .out = stdout};
    const char *pos[2] = {0}, *device = "auto";
    int n_pos = 0, n_tp = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            check_logits_usage(stdout);
            return 0;
        } else if (strcmp(a, "--tol") == 0 && i + 1 < argc) {
            o.tol = atof(argv[++i]);
        } else if (strcmp(a, "--kv") == 0 && i + 1 < argc) {
            const char *k = argv[++i];
            if (strcmp(k, "f32") == 0)
                o.kv_dtype = DTYPE_F32;
            else if (strcmp(k, "bf16") == 0)
                o.kv_dtype = DTYPE_BF16;
            else {
                fprintf(stderr, "check-logits: --kv must be f32 or bf16\n");
                return 2;
            }
        } else if (strcmp(a, "--chunk") == 0 && i + 1 < argc) {
            o.chunk = atoi(argv[++i]);
        } else if (strcmp(a, "--block-size") == 0 && i + 1 < argc) {
            o.block_size = atoi(argv[++i]);
        } else if (strcmp(a, "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else if (strcmp(a, "--tensor-parallel") == 0 && i + 1 < argc) {
            if (cli_tp_parse("check-logits", argv[++i], &n_tp) != 0) return 2;
        } else if (a[0] == '-') {
            fprintf(stderr, "check-logits: unknown option %s\n", a);
            check_logits_usage(stderr);
            return 2;
        } else if (n_pos < 2) {
            pos[n_pos++] = a;
        } else {
            check_logits_usage(stderr);
            return 2;
        }
    }
    if (n_pos != 2 || !(o.tol > 0) || o.chunk <= 0 || o.block_size <= 0) {
        check_logits_usage(stderr);
        return 2;
    }
    struct cairn_err err = {0};
    struct model_check_result r;
    if (cli_tp_wanted(n_tp)) {
        if (check_logits_tp(pos[0], pos[1], device, n_tp, &o, &r) != 0) return 2;
        return check_logits_report(&r, &o);
    }
    struct backend *be = NULL;
    if (cli_device_open("check-logits", device, 0, &be) != 0) return 2;
    struct model *m = NULL;
    if (model_load(pos[0], be, &m, &err) != CAIRN_OK) {
        fprintf(stderr, "check-logits: %s\n", err.msg);
        backend_close(be);
        return 2;
    }
    int rc = model_check_run(m, pos[1], &o, &r, &err);
    model_free(m);
    backend_close(be);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "check-logits: %s\n", err.msg);
        return 2;
    }
    return check_logits_report(&r, &o);
}

static int check_logits_report(const struct model_check_result *r, const struct model_check_opts *o)
{
    printf(
        "%s: %d cases, %d runs, %d failed; max |dlogit| %.3e (tol %.1e, kv %s); greedy %ld/%ld\n",
        r->n_failed ? "FAIL" : "PASS", r->n_cases, r->n_runs, r->n_failed, r->max_abs, o->tol,
        o->kv_dtype == DTYPE_F32 ? "f32" : "bf16", r->n_greedy - r->n_greedy_bad, r->n_greedy);
    return r->n_failed ? 1 : 0;
}
