/* CAIRN_CUDA_PROFILE=1: GPU time of the prefill-side ops by kind (cuda_kernels.h), printed to
 * stderr when the process exits. A region is bracketed by two events on the op's stream and
 * waited for at its end, so the ops are serialized with the host while profiling (the figures
 * are each kind's GPU time; the step's wall time grows by the lost overlap). Off (the default),
 * each call is one load of a flag. Regions inside a stream capture are not timed. A .cu file
 * (C linkage through cuda_kernels.h), so that kernel launchers and C callers both reach it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_common.cuh"

struct cuda_prof_region {
    cudaEvent_t e0, e1;
};

static const char *const cuda_prof_names[CUDA_PROF_N] = {"gemm", "act->bf16", "dequant",
                                                         "attention (flash)"};

static pthread_once_t cuda_prof_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t cuda_prof_lock = PTHREAD_MUTEX_INITIALIZER;
static int cuda_prof_enabled;
static double cuda_prof_ms[CUDA_PROF_N];
static double cuda_prof_flops[CUDA_PROF_N];
static long cuda_prof_calls[CUDA_PROF_N];

static void cuda_prof_report(void)
{
    double total = 0;
    for (int k = 0; k < CUDA_PROF_N; k++)
        total += cuda_prof_ms[k];
    fprintf(stderr, "cuda profile: %.1f ms of GPU time in the timed ops\n", total);
    for (int k = 0; k < CUDA_PROF_N; k++) {
        if (!cuda_prof_calls[k]) continue;
        fprintf(stderr, "cuda profile: %-18s %9.1f ms %6ld calls", cuda_prof_names[k],
                cuda_prof_ms[k], cuda_prof_calls[k]);
        if (cuda_prof_flops[k] > 0 && cuda_prof_ms[k] > 0)
            fprintf(stderr, " %7.1f TFLOP/s", cuda_prof_flops[k] / (cuda_prof_ms[k] * 1e9));
        fputc('\n', stderr);
    }
}

static void cuda_prof_init(void)
{
    const char *s = getenv("CAIRN_CUDA_PROFILE");
    cuda_prof_enabled = s && *s && strcmp(s, "0") != 0;
    if (cuda_prof_enabled) atexit(cuda_prof_report);
}

extern "C" void *cuda_prof_begin(cudaStream_t s)
{
    pthread_once(&cuda_prof_once, cuda_prof_init);
    if (!cuda_prof_enabled) return NULL;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return NULL;
    struct cuda_prof_region *r = (struct cuda_prof_region *)calloc(1, sizeof(*r));
    if (!r) return NULL;
    if (cudaEventCreate(&r->e0) != cudaSuccess) {
        free(r);
        return NULL;
    }
    if (cudaEventCreate(&r->e1) != cudaSuccess) {
        (void)cudaEventDestroy(r->e0);
        free(r);
        return NULL;
    }
    (void)cudaEventRecord(r->e0, s);
    return r;
}

extern "C" void cuda_prof_end(void *region, cudaStream_t s, enum cuda_prof_kind kind, double flops)
{
    struct cuda_prof_region *r = (struct cuda_prof_region *)region;
    if (!r) return;
    float ms = 0;
    if (cudaEventRecord(r->e1, s) == cudaSuccess && cudaEventSynchronize(r->e1) == cudaSuccess &&
        cudaEventElapsedTime(&ms, r->e0, r->e1) == cudaSuccess) {
        pthread_mutex_lock(&cuda_prof_lock);
        cuda_prof_ms[kind] += ms;
        cuda_prof_flops[kind] += flops;
        cuda_prof_calls[kind]++;
        pthread_mutex_unlock(&cuda_prof_lock);
    }
    (void)cudaEventDestroy(r->e0);
    (void)cudaEventDestroy(r->e1);
    free(r);
}
