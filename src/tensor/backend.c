/* Opening a backend by name (tensor/backend.h): "cpu", "cuda", "cuda:N" or "auto"; and
 * tensor-parallel groups of them (backend_tp_open).
 *
 * The CUDA backend is compiled in only when the build defines CAIRN_HAVE_CUDA (CMake found the
 * toolkit); its entry point is cuda_backend_open in cuda/cuda.h. Without it "cuda" fails with
 * CAIRN_ERR_UNSUPPORTED and "auto" is the CPU. With it, "auto" tries cuda:0 and falls back to
 * the CPU with an info line saying why (no driver, no device). Also the step-stall test hook. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "cpu/cpu.h"
#include "tensor/backend.h"
#ifdef CAIRN_HAVE_CUDA
#include "cuda/cuda.h"
#endif

int backend_cuda_compiled(void)
{
#ifdef CAIRN_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

/* "cuda" -> 0, "cuda:N" -> N; -1 if name is not a CUDA device name. */
static int backend_cuda_index(const char *name)
{
    if (strcmp(name, "cuda") == 0) return 0;
    if (strncmp(name, "cuda:", 5) != 0 || !name[5]) return -1;
    char *end;
    long n = strtol(name + 5, &end, 10);
    if (*end || n < 0 || n > 1024 || name[5] < '0' || name[5] > '9') return -1;
    return (int)n;
}

static int backend_open_cuda(int device, struct backend **out, struct cairn_err *err)
{
#ifdef CAIRN_HAVE_CUDA
    return cuda_backend_open(device, out, err);
#else
    (void)device;
    (void)out;
    return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "this cairn was built without CUDA");
#endif
}

int backend_open(const char *name, int n_threads, struct backend **out, struct cairn_err *err)
{
    *out = NULL;
    if (!name || !*name) name = "auto";
    if (strcmp(name, "cpu") == 0) return cpu_backend_open(n_threads, out, err);
    int dev = backend_cuda_index(name);
    if (dev >= 0) return backend_open_cuda(dev, out, err);
    if (strcmp(name, "auto") != 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "device '%s': expected auto, cpu, cuda or cuda:N", name);
    if (backend_cuda_compiled()) {
        struct cairn_err cerr = {0};
        if (backend_open_cuda(0, out, &cerr) == CAIRN_OK) return CAIRN_OK;
        LOG_INFO("backend", "device auto: cuda:0 is not usable (%s); running on the CPU", cerr.msg);
    }
    return cpu_backend_open(n_threads, out, err);
}

/* xg, yg [n, hidden] (gathered rows, expert output), g, u [n, inter], the token list [n * top_k]
 * (int32), as cpu/cpu_moe.c lays it out; other backends take the same amount. */
size_t backend_moe_scratch_floats(int n, int hidden, int inter, int top_k)
{
    size_t N = (size_t)(n > 0 ? n : 0);
    return N * (size_t)hidden * 2 + N * (size_t)inter * 2 + N * (size_t)top_k + 16;
}

void backend_close(struct backend *be)
{
    if (be) be->ops->destroy(be);
}

int backend_test_stall(const struct backend *be, const char *model_type, struct cairn_err *err)
{
    static int fired; /* one stall per process: a reloaded model then serves */
    const char *delay = getenv("CAIRN_TEST_STEP_DELAY_MS");
    if (delay && *delay) { /* every step: a slow device, so a test's stream outlasts its checks */
        long d = atol(delay);
        struct timespec dt = {d / 1000, (d % 1000) * 1000000L};
        if (d > 0) nanosleep(&dt, NULL);
    }
    const char *ms = getenv("CAIRN_TEST_STALL_MS");
    if (!ms || !*ms || __atomic_load_n(&fired, __ATOMIC_RELAXED)) return CAIRN_OK;
    const char *arch = getenv("CAIRN_TEST_STALL_ARCH");
    if (arch && *arch && (!model_type || strcmp(arch, model_type) != 0)) return CAIRN_OK;
    if (__atomic_exchange_n(&fired, 1, __ATOMIC_ACQ_REL)) return CAIRN_OK;
    double stall = atof(ms) / 1000.0, limit = backend_step_timeout(be);
    double wait = stall < limit ? stall : limit;
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    nanosleep(&ts, NULL);
    if (stall < limit) return CAIRN_OK;
    return cairn_err_set(err, CAIRN_ERR_DEVICE, "%s: the step did not finish within %.3g s (--step-timeout; "
                         "injected stall)", be ? be->name : "backend", limit);
}

/* ---- tensor-parallel groups ---- */

static int backend_tp_gpus(void)
{
#ifdef CAIRN_HAVE_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

static int backend_tp_open_cuda(struct backend_tp *tp, struct cairn_err *err)
{
#ifdef CAIRN_HAVE_CUDA
    int n_gpus = backend_tp_gpus();
    if (tp->world > n_gpus)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "tensor parallel over %d GPUs: only %d visible", tp->world, n_gpus);
    for (int r = 0; r < tp->world; r++) {
        int rc = cuda_backend_open(r, &tp->bes[r], err);
        if (rc != CAIRN_OK) return rc;
    }
    const char *t = getenv("CAIRN_TP_INIT_TIMEOUT");
    return cuda_tp_init(tp->bes, tp->world, t ? atoi(t) : 0, (struct cuda_tp **)&tp->group, err);
#else
    (void)tp;
    return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                         "tensor parallel on cuda: this cairn was built without CUDA");
#endif
}

static int backend_tp_open_cpu(struct backend_tp *tp, struct cairn_err *err)
{
    int rc = cpu_tp_group_create(tp->world, (struct cpu_tp_group **)&tp->group, err);
    for (int r = 0; r < tp->world && rc == CAIRN_OK; r++) {
        rc = cpu_backend_open(0, &tp->bes[r], err);
        if (rc == CAIRN_OK) rc = cpu_backend_tp_join(tp->bes[r], tp->group, r, err);
    }
    return rc;
}

int backend_tp_open(const char *device, int world, struct backend_tp **out, struct cairn_err *err)
{
    *out = NULL;
    if (!device || !*device) device = "auto";
    if (world < 1 || world > BACKEND_TP_MAX)
        return cairn_err_set(err, CAIRN_ERR_INVALID,
                             "tensor parallel over %d ranks: expected 1..%d", world,
                             BACKEND_TP_MAX);
    int cuda =
        strcmp(device, "cuda") == 0 || (strcmp(device, "auto") == 0 && backend_tp_gpus() > 0);
    if (!cuda && strcmp(device, "cpu") != 0 && strcmp(device, "auto") != 0)
        return cairn_err_set(
            err, CAIRN_ERR_INVALID,
            "tensor parallel on device %s: give cuda (ranks take GPUs 0..N-1) or cpu", device);
    struct backend_tp *tp = calloc(1, sizeof(*tp));
    if (!tp) return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    tp->world = world;
    tp->kind = cuda ? BACKEND_CUDA : BACKEND_CPU;
    int rc = cuda ? backend_tp_open_cuda(tp, err) : backend_tp_open_cpu(tp, err);
    if (rc != CAIRN_OK) {
        backend_tp_close(tp);
        return rc;
    }
    *out = tp;
    return CAIRN_OK;
}

void backend_tp_close(struct backend_tp *tp)
{
    if (!tp) return;
#ifdef CAIRN_HAVE_CUDA
    if (tp->kind == BACKEND_CUDA) cuda_tp_free(tp->group);
#endif
    for (int r = 0; r < tp->world; r++)
        backend_close(tp->bes[r]);
    if (tp->kind == BACKEND_CPU) cpu_tp_group_free(tp->group);
    free(tp);
}
