/* Loaded models share one CPU backend and its one compute pool: two models stepping on two
 * threads (as two schedulers do) while a third model is loaded (which packs its q4/q8 weights on
 * the pool) must each still match the oracle logits, as they do alone. Without the pool's lock
 * (cpu_lock, taken by the backend's step_begin/step_end and by cpu_pack) their rounds and
 * prepared activations mix and the logits are wrong or the run crashes. */
#include <pthread.h>

#include "tensor/backend.h"
#include "testlib.h"

#include "model/check.h"
#include "model/model.h"

static struct backend *conc_be; /* opened by main before the threads start */

struct job {
    const char *name;
    int rounds;
    int failed; /* runs over tolerance, or -1 on an error */
    double max_abs;
};

static void oracle_dir(const char *name, char *dir, size_t n)
{
    char rel[512];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    test_src_path(rel, dir, n);
}

static void *run_checks(void *arg)
{
    struct job *j = arg;
    char dir[1024], exp[1100];
    oracle_dir(j->name, dir, sizeof(dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", dir);
    struct cairn_err err = {0};
    struct model *m = NULL;
    if (model_load(dir, conc_be, &m, &err) != CAIRN_OK) {
        j->failed = -1;
        return NULL;
    }
    for (int i = 0; i < j->rounds; i++) {
        struct model_check_opts o = {.tol = 2e-3, .kv_dtype = DTYPE_F32, .chunk = 32, .block_size = 16,
                                     .modes = MODEL_CHECK_BATCHED};
        struct model_check_result r;
        if (model_check_run(m, exp, &o, &r, &err) != CAIRN_OK) {
            j->failed = -1;
            break;
        }
        j->failed += r.n_failed;
        if (r.max_abs > j->max_abs) j->max_abs = r.max_abs;
    }
    model_free(m);
    return NULL;
}

int main(void)
{
    struct cairn_err err = {0};
    CHECK_MSG(backend_open("cpu", 2, &conc_be, &err) == CAIRN_OK, "%s", err.msg);
    if (!conc_be) return test_summary("test_model_concurrent");
    struct job jobs[] = {
        {.name = "qwen3-tiny-mlx-q4-g64", .rounds = 3},
        {.name = "llama-tiny-mlx-q8-g64", .rounds = 3},
        {.name = "llama-medium-mlx-q4-g64", .rounds = 1}, /* mostly loading while the others run */
    };
    pthread_t th[3];
    for (int i = 0; i < 3; i++) CHECK(pthread_create(&th[i], NULL, run_checks, &jobs[i]) == 0);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(jobs[i].failed == 0, "%s: %d runs failed (max |dlogit| %g)", jobs[i].name, jobs[i].failed,
                  jobs[i].max_abs);
        printf("%-26s concurrent: max|dlogit| %.3e\n", jobs[i].name, jobs[i].max_abs);
    }
    backend_close(conc_be);
    return test_summary("test_model_concurrent");
}
