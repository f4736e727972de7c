/* Machine probes for `cairn bench`: read bandwidth, STREAM triad, FMA peak of the pool. */
#include <string.h>

#include "base/file.h"
#include "base/mem.h"
#include "cpu/cpu.h"
#include "cpu/cpu_int.h"

struct cpu_probe_job {
    float *a, *b, *c;
    int64_t n;
    int64_t iters;
    int mode; /* 0 read, 1 triad, 2 fma */
    const struct cpu_kernels *k;
    float sink[256];
    int lanes;
};

static const struct cpu_kernels *cpu_probe_kernels(void)
{
    switch (cpu_isa_get()) {
    case CPU_ISA_AVX512: return &cpu_avx512_kernels;
    case CPU_ISA_AVX2: return &cpu_avx2_kernels;
    default: return &cpu_kernels_ref;
    }
}

static void cpu_probe_task(void *ctx, int ith, int nth)
{
    struct cpu_probe_job *j = ctx;
    int64_t b = j->n * ith / nth / 64 * 64, e = ith == nth - 1 ? j->n : j->n * (ith + 1) / nth / 64 * 64;
    if (j->mode == 0) j->sink[ith % 256] = j->k->probe_sum(j->a + b, e - b);
    else if (j->mode == 1) j->k->probe_triad(j->a + b, j->b + b, j->c + b, 0.5f, e - b);
    else {
        int lanes = 1;
        j->sink[ith % 256] = j->k->probe_fma(j->iters, &lanes);
        if (ith == 0) j->lanes = lanes;
    }
}

int cpu_probe_run(size_t bytes, int reps, struct cpu_probe *out, struct cairn_err *err)
{
    static struct cpu_probe_job j; /* big sink array: keep it off the stack */
    memset(&j, 0, sizeof(j));
    memset(out, 0, sizeof(*out));
    j.k = cpu_probe_kernels();
    size_t n = bytes / sizeof(float);
    size_t arr = (n / 3 + 63) / 64 * 64;
    float *buf = cairn_mem_alloc(n * sizeof(float) + 3 * 64 * sizeof(float), CAIRN_MEM_OTHER);
    if (!buf) return cairn_err_set(err, CAIRN_ERR_NOMEM, "probe: cannot allocate %zu bytes", bytes);
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f;
    int nth = cpu_n_threads();
    out->n_threads = nth;
    for (int r = 0; r < reps; r++) {
        j.a = buf;
        j.n = (int64_t)n;
        j.mode = 0;
        double t0 = cairn_now();
        cpu_parallel(cpu_probe_task, &j);
        double dt = cairn_now() - t0;
        if (dt > 0 && n * 4.0 / dt / 1e9 > out->read_gbs) out->read_gbs = n * 4.0 / dt / 1e9;

        j.a = buf;
        j.b = buf + arr;
        j.c = buf + 2 * arr;
        j.n = (int64_t)arr;
        j.mode = 1;
        t0 = cairn_now();
        cpu_parallel(cpu_probe_task, &j);
        dt = cairn_now() - t0;
        if (dt > 0 && arr * 12.0 / dt / 1e9 > out->triad_gbs) out->triad_gbs = arr * 12.0 / dt / 1e9;

        j.mode = 2;
        j.iters = 2000000;
        t0 = cairn_now();
        cpu_parallel(cpu_probe_task, &j);
        dt = cairn_now() - t0;
        double flops = (double)nth * (double)j.iters * CPU_PROBE_FMA_CHAINS * j.lanes * 2.0;
        if (dt > 0 && flops / dt / 1e9 > out->fma_gflops) out->fma_gflops = flops / dt / 1e9;
    }
    cairn_mem_free(buf, n * sizeof(float) + 3 * 64 * sizeof(float), CAIRN_MEM_OTHER);
    return CAIRN_OK;
}

static float *cpu_probe_buf;
static size_t cpu_probe_bytes;

double cpu_probe_read_now(size_t bytes)
{
    static struct cpu_probe_job j;
    if (bytes > cpu_probe_bytes) {
        cpu_probe_release();
        cpu_probe_buf = cairn_mem_alloc(bytes, CAIRN_MEM_OTHER);
        if (!cpu_probe_buf) return 0;
        cpu_probe_bytes = bytes;
        for (size_t i = 0; i < bytes / sizeof(float); i++) cpu_probe_buf[i] = (float)(i & 1023);
    }
    memset(&j, 0, sizeof(j));
    j.k = cpu_probe_kernels();
    j.a = cpu_probe_buf;
    j.n = (int64_t)(bytes / sizeof(float));
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = cairn_now();
        cpu_parallel(cpu_probe_task, &j);
        double dt = cairn_now() - t0;
        if (dt > 0 && (double)bytes / dt / 1e9 > best) best = (double)bytes / dt / 1e9;
    }
    return best;
}

void cpu_probe_release(void)
{
    if (cpu_probe_buf) cairn_mem_free(cpu_probe_buf, cpu_probe_bytes, CAIRN_MEM_OTHER);
    cpu_probe_buf = NULL;
    cpu_probe_bytes = 0;
}
