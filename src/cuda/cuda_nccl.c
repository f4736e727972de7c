/* NCCL for tensor parallel across the GPUs of one host: communicators for a group of CUDA
 * backends, and the seam's allreduce (tensor/backend.h) as ncclAllReduce on the rank's stream.
 *
 * DESIGN
 * - One process, one host thread and one CUDA stream per GPU (each rank's model_forward runs
 *   on its own thread, model/model.h model_load_shard). Why not one process per GPU: the
 *   engine, prefix cache and tiers then stay one (one logical block per position, one SSD
 *   tier, one HTTP server) without a second IPC protocol; NCCL supports one thread per
 *   communicator in a process.
 * - libnccl.so.2 is loaded with dlopen on first use, like cuBLASLt (cuda_lt.c): a CPU-only run
 *   of a CUDA build never pays for it and a machine without NCCL can still serve on one GPU.
 * - Start-up is bounded: the communicators are created non-blocking (config.blocking = 0) in
 *   one group and polled with ncclCommGetAsyncError until every one is ready, for at most
 *   timeout_s (60 s by default); past that they are aborted and the error says so.
 * - NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set in the process environment
 *   before any communicator exists (on the lent machines NVLS can take the host's GPUs out of
 *   service). Nothing here calls cuMulticastCreate.
 * - allreduce: in place, f32 sum, on the rank's stream, ordered with its kernels. With graphs
 *   on (cuda_graph.c) the step goes eager at the first all-reduce. Errors latch like any op's;
 *   a non-blocking communicator may answer ncclInProgress for an enqueued call, which is fine.
 *
 * - Built without nccl.h (NCCL is a package of its own): cuda_tp_init says so and fails.
 *
 * Threading: cuda_tp_init / cuda_tp_free from one thread while no rank runs a step; allreduce on
 * the rank's step thread under its step lock. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "cuda/cuda_int.h"

#ifdef CAIRN_HAVE_NCCL

#ifndef CAIRN_CUDA_LIBDIR
#define CAIRN_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif
#define CUDA_NCCL_SONAME "libnccl.so.2"
#define CUDA_TP_TIMEOUT_S 60

struct cuda_nccl_api {
    __typeof__(&ncclGetUniqueId) get_unique_id;
    __typeof__(&ncclCommInitRankConfig) init_rank_config;
    __typeof__(&ncclCommGetAsyncError) get_async_error;
    __typeof__(&ncclCommAbort) abort;
    __typeof__(&ncclCommDestroy) destroy;
    __typeof__(&ncclAllReduce) all_reduce;
    __typeof__(&ncclGroupStart) group_start;
    __typeof__(&ncclGroupEnd) group_end;
    __typeof__(&ncclGetErrorString) error_string;
};
static struct cuda_nccl_api cuda_nccl;

static pthread_once_t cuda_nccl_once = PTHREAD_ONCE_INIT;
static int cuda_nccl_status = CAIRN_ERR_UNSUPPORTED;
static char cuda_nccl_msg[256];

#define CUDA_NCCL_SYM(field, name)                                                                 \
    do {                                                                                           \
        *(void **)&cuda_nccl.field = dlsym(h, #name);                                              \
        if (!cuda_nccl.field) {                                                                    \
            snprintf(cuda_nccl_msg, sizeof(cuda_nccl_msg), "NCCL has no symbol %s", #name);        \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void cuda_nccl_load_once(void)
{
    static const char *const paths[] = {CUDA_NCCL_SONAME, (CAIRN_CUDA_LIBDIR "/" CUDA_NCCL_SONAME),
                                        ("/usr/local/cuda/lib64/" CUDA_NCCL_SONAME)};
    void *h = NULL;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(paths) && !h; i++)
        h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(cuda_nccl_msg, sizeof(cuda_nccl_msg), "cannot load %s: %s", CUDA_NCCL_SONAME,
                 why ? why : "not found");
        return;
    }
    CUDA_NCCL_SYM(get_unique_id, ncclGetUniqueId);
    CUDA_NCCL_SYM(init_rank_config, ncclCommInitRankConfig);
    CUDA_NCCL_SYM(get_async_error, ncclCommGetAsyncError);
    CUDA_NCCL_SYM(abort, ncclCommAbort);
    CUDA_NCCL_SYM(destroy, ncclCommDestroy);
    CUDA_NCCL_SYM(all_reduce, ncclAllReduce);
    CUDA_NCCL_SYM(group_start, ncclGroupStart);
    CUDA_NCCL_SYM(group_end, ncclGroupEnd);
    CUDA_NCCL_SYM(error_string, ncclGetErrorString);
    cuda_nccl_status = CAIRN_OK; /* stays loaded for the process */
}

static int cuda_nccl_load(struct cairn_err *err)
{
    pthread_once(&cuda_nccl_once, cuda_nccl_load_once);
    if (cuda_nccl_status != CAIRN_OK)
        return cairn_err_set(err, cuda_nccl_status, "cuda: tensor parallel needs NCCL: %s",
                             cuda_nccl_msg);
    return CAIRN_OK;
}

const char *cuda_nccl_error_string(int code)
{
    return cuda_nccl.error_string ? cuda_nccl.error_string((ncclResult_t)code) : "NCCL error";
}

struct cuda_tp {
    int world;
    struct backend **bes; /* [world], not owned */
    ncclComm_t *comms;    /* [world] */
};

static double cuda_tp_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Polls every communicator until none is in progress, or the deadline: CAIRN_OK, or an error
 * naming the rank. */
static int cuda_tp_wait_ready(struct cuda_tp *tp, double deadline, int timeout_s,
                              struct cairn_err *err)
{
    for (;;) {
        int pending = 0;
        for (int r = 0; r < tp->world; r++) {
            ncclResult_t st = ncclSuccess;
            int rc = cuda_check(cuda_impl_of(tp->bes[r]), err,
                                cuda_nccl.get_async_error(tp->comms[r], &st));
            if (rc != CAIRN_OK) return rc;
            if (st == ncclInProgress) {
                pending++;
                continue;
            }
            rc = cuda_check(cuda_impl_of(tp->bes[r]), err, st);
            if (rc != CAIRN_OK) return rc;
        }
        if (!pending) return CAIRN_OK;
        if (cuda_tp_now() > deadline)
            return cairn_err_set(err, CAIRN_ERR_INTERNAL,
                                 "cuda: NCCL communicators of %d GPUs not ready after %d s (%d "
                                 "still initialising)",
                                 tp->world, timeout_s, pending);
        usleep(1000);
    }
}

static void cuda_tp_release(struct cuda_tp *tp, int abort)
{
    if (!tp) return;
    for (int r = 0; r < tp->world && tp->comms; r++) {
        if (!tp->comms[r]) continue;
        (void)cudaSetDevice(cuda_impl_of(tp->bes[r])->device);
        if (abort)
            (void)cuda_nccl.abort(tp->comms[r]);
        else
            (void)cuda_nccl.destroy(tp->comms[r]);
        cuda_impl_of(tp->bes[r])->nccl_comm = NULL;
        tp->bes[r]->tp_rank = 0;
        tp->bes[r]->tp_world = 0;
    }
    free(tp->comms);
    free(tp->bes);
    free(tp);
}

int cuda_tp_init(struct backend *const *bes, int world, int timeout_s, struct cuda_tp **out,
                 struct cairn_err *err)
{
    *out = NULL;
    if (world < 1 || !bes)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "cuda: tensor parallel over %d GPUs", world);
    for (int r = 0; r < world; r++) {
        if (!bes[r] || bes[r]->kind != BACKEND_CUDA || bes[r]->tp_world)
            return cairn_err_set(err, CAIRN_ERR_INVALID,
                                 "cuda: tensor-parallel rank %d is not a free CUDA backend", r);
        for (int q = 0; q < r; q++)
            if (cuda_impl_of(bes[q])->device == cuda_impl_of(bes[r])->device)
                return cairn_err_set(err, CAIRN_ERR_INVALID,
                                     "cuda: tensor-parallel ranks %d and %d are both GPU %d", q, r,
                                     cuda_impl_of(bes[r])->device);
    }
    if (timeout_s <= 0) timeout_s = CUDA_TP_TIMEOUT_S;
    /* before any communicator: NVLink multicast off (DESIGN) */
    if (setenv("NCCL_NVLS_ENABLE", "0", 1) != 0)
        return cairn_err_set(err, CAIRN_ERR_INTERNAL, "cuda: cannot set NCCL_NVLS_ENABLE=0");
    int rc = cuda_nccl_load(err);
    if (rc != CAIRN_OK) return rc;
    struct cuda_tp *tp = calloc(1, sizeof(*tp));
    if (tp) {
        tp->bes = calloc((size_t)world, sizeof(*tp->bes));
        tp->comms = calloc((size_t)world, sizeof(*tp->comms));
    }
    if (!tp || !tp->bes || !tp->comms) {
        cuda_tp_release(tp, 0);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "cuda: out of memory");
    }
    tp->world = world;
    memcpy(tp->bes, bes, sizeof(*bes) * (size_t)world);
    ncclUniqueId id;
    rc = cuda_check(cuda_impl_of(bes[0]), err, cuda_nccl.get_unique_id(&id));
    double deadline = cuda_tp_now() + timeout_s;
    if (rc == CAIRN_OK) rc = cuda_check(cuda_impl_of(bes[0]), err, cuda_nccl.group_start());
    for (int r = 0; r < world && rc == CAIRN_OK; r++) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0; /* returns at once; readiness is polled (bounded start-up) */
        rc = cuda_check(cuda_impl_of(bes[r]), err, cudaSetDevice(cuda_impl_of(bes[r])->device));
        if (rc == CAIRN_OK) {
            ncclResult_t st = cuda_nccl.init_rank_config(&tp->comms[r], world, id, r, &config);
            if (st != ncclInProgress) rc = cuda_check(cuda_impl_of(bes[r]), err, st);
        }
    }
    if (rc == CAIRN_OK) {
        ncclResult_t st = cuda_nccl.group_end();
        if (st != ncclInProgress) rc = cuda_check(cuda_impl_of(bes[0]), err, st);
    }
    if (rc == CAIRN_OK) rc = cuda_tp_wait_ready(tp, deadline, timeout_s, err);
    if (rc != CAIRN_OK) {
        cuda_tp_release(tp, 1);
        return rc;
    }
    for (int r = 0; r < world; r++) {
        cuda_impl_of(bes[r])->nccl_comm = tp->comms[r];
        bes[r]->tp_rank = r;
        bes[r]->tp_world = world;
    }
    *out = tp;
    return CAIRN_OK;
}

void cuda_tp_free(struct cuda_tp *tp)
{
    cuda_tp_release(tp, 0);
}

void cuda_nccl_allreduce(struct backend *be, float *buf, int64_t n)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (!c->nccl_comm || c->err_status != CAIRN_OK || n <= 0) return; /* world 1 too: tp1.sh */
    ncclResult_t st = cuda_nccl.all_reduce(buf, buf, (size_t)n, ncclFloat32, ncclSum,
                                           (ncclComm_t)c->nccl_comm, c->stream);
    if (st != ncclInProgress) (void)cuda_check(c, NULL, st);
}

#else /* no nccl.h at build time */

const char *cuda_nccl_error_string(int code)
{
    (void)code;
    return "NCCL error";
}

int cuda_tp_init(struct backend *const *bes, int world, int timeout_s, struct cuda_tp **out,
                 struct cairn_err *err)
{
    (void)bes;
    (void)world;
    (void)timeout_s;
    *out = NULL;
    return cairn_err_set(
        err, CAIRN_ERR_UNSUPPORTED,
        "cuda: tensor parallel needs NCCL, and this cairn was built without nccl.h");
}

void cuda_tp_free(struct cuda_tp *tp)
{
    (void)tp;
}

void cuda_nccl_allreduce(struct backend *be, float *buf, int64_t n)
{
    (void)be;
    (void)buf;
    (void)n;
}

#endif
