/* cairn check-logits MODEL_DIR EXPECTED.safetensors [--tol T] [--kv f32|bf16] [--chunk N]
 *                    [--block-size B] [--device auto|cpu|cuda[:N]]
 * Runs every oracle case through the paged, batched forward (whole prefill, chunked prefill +
 * decode, all cases batched) and compares logits. Exit 0 if all pass, 1 on a mismatch, 2 on
 * a usage or load error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/check.h"
#include "model/model.h"

static void check_logits_usage(FILE *f)
{
    fprintf(f,
            "usage: cairn check-logits MODEL_DIR EXPECTED.safetensors [--tol T] [--kv f32|bf16]\n"
            "                          [--chunk N] [--block-size B] [--device auto|cpu|cuda[:N]]\n");
}

int cmd_check_logits(int argc, char **argv)
{
    struct model_check_opts o = {
        .tol = 2e-3, .kv_dtype = DTYPE_F32, .chunk = 32, .block_size = 16, .out = stdout};
    const char *pos[2] = {0}, *device = "auto";
    int n_pos = 0;
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
    struct backend *be = NULL;
    if (cli_device_open("check-logits", device, 0, &be) != 0) return 2;
    struct model *m = NULL;
    if (model_load(pos[0], be, &m, &err) != CAIRN_OK) {
        fprintf(stderr, "check-logits: %s\n", err.msg);
        backend_close(be);
        return 2;
    }
    struct model_check_result r;
    int rc = model_check_run(m, pos[1], &o, &r, &err);
    model_free(m);
    backend_close(be);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "check-logits: %s\n", err.msg);
        return 2;
    }
    printf(
        "%s: %d cases, %d runs, %d failed; max |dlogit| %.3e (tol %.1e, kv %s); greedy %ld/%ld\n",
        r.n_failed ? "FAIL" : "PASS", r.n_cases, r.n_runs, r.n_failed, r.max_abs, o.tol,
        o.kv_dtype == DTYPE_F32 ? "f32" : "bf16", r.n_greedy - r.n_greedy_bad, r.n_greedy);
    return r.n_failed ? 1 : 0;
}
