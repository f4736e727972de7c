/* Every op of the backend table (tensor/backend.h) on the CPU backend against the
 * straightforward references of tests/support/backend_cases.c (odd shapes, every weight dtype,
 * bf16 and f32 KV, several sequences per attention call), under each ISA the machine has
 * (scalar, avx2, avx512; the VNNI q4/q8 path on and off), at the cases' stated tolerances
 * (tol_scale 1). A GPU backend runs the same cases (backend_cases_run on cuda:0). */
#include <stdlib.h>
#include <string.h>

#include "backend_cases.h"
#include "cpu/cpu.h"
#include "testlib.h"

static void run_cases(struct backend *be, const char *label)
{
    struct backend_cases_result r;
    struct cairn_err err = {0};
    int rc = backend_cases_run(be, 1.0, &r, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", label, err.msg);
    CHECK_MSG(r.n_failed == 0, "%s: %d of %d op checks failed", label, r.n_failed, r.n_checks);
    CHECK_MSG(r.n_checks >= 60, "%s: only %d op checks ran", label, r.n_checks);
    printf("%-22s %d op checks, %d failed\n", label, r.n_checks, r.n_failed);
    test_n_pass += r.n_checks - r.n_failed;
}

/* backend_open by name: cpu and auto (the CPU without a usable GPU), cuda refused in a build
 * without CUDA, malformed names refused with the expected forms named. */
static void test_open_names(void)
{
    struct backend *be = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(backend_open("auto", 1, &be, &err), CAIRN_OK);
    if (be && !backend_cuda_compiled()) CHECK_EQ_STR(be->name, "cpu");
    backend_close(be);
    be = NULL;
    CHECK_EQ_INT(backend_open(NULL, 1, &be, &err), CAIRN_OK); /* NULL: auto */
    backend_close(be);
    if (!backend_cuda_compiled()) {
        static const char *const cuda[] = {"cuda", "cuda:0", "cuda:3"};
        for (size_t i = 0; i < CAIRN_ARRAY_LEN(cuda); i++) {
            be = (struct backend *)1;
            memset(&err, 0, sizeof(err));
            CHECK_EQ_INT(backend_open(cuda[i], 1, &be, &err), CAIRN_ERR_UNSUPPORTED);
            CHECK(be == NULL);
            CHECK_MSG(strstr(err.msg, "without CUDA") != NULL, "%s: %s", cuda[i], err.msg);
        }
    }
    static const char *const bad[] = {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cpu ", "CPU", "cuda:99999"};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(bad); i++) {
        memset(&err, 0, sizeof(err));
        CHECK_MSG(backend_open(bad[i], 1, &be, &err) == CAIRN_ERR_INVALID, "'%s'", bad[i]);
        CHECK_MSG(strstr(err.msg, "expected auto, cpu, cuda or cuda:N") != NULL, "'%s': %s", bad[i], err.msg);
    }
}

int main(void)
{
    test_open_names();
    struct backend *be = NULL;
    struct cairn_err err = {0};
    CHECK_MSG(backend_open("cpu", 0, &be, &err) == CAIRN_OK, "%s", err.msg);
    if (!be) return test_summary("test_backend_ops");
    CHECK(be->kind == BACKEND_CPU && be->host_visible);
    /* Packing depends on the VNNI switch at prepare time: the cases prepare their own weights. */
    for (int isa = 0; isa < CPU_ISA_N; isa++) {
        if (!cpu_isa_supported((enum cpu_isa)isa)) continue;
        for (int vnni = 1; vnni >= 0; vnni--) {
            setenv("CAIRN_CPU_VNNI", vnni ? "1" : "0", 1);
            CHECK(cpu_isa_set((enum cpu_isa)isa) == CAIRN_OK);
            char label[64];
            snprintf(label, sizeof(label), "cpu %s%s", cpu_isa_name((enum cpu_isa)isa),
                     cpu_vnni_active() ? " vnni" : "");
            run_cases(be, label);
            if (!cpu_vnni_active()) break; /* VNNI off is the same run */
        }
    }
    unsetenv("CAIRN_CPU_VNNI");
    backend_close(be);
    return test_summary("test_backend_ops");
}
