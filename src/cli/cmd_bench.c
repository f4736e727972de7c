/* cairn bench: throughput figures.
 *
 *   cairn bench --matmul OUTxIN --dtype bf16|f16|f32|q4|q8|qB [-n N] [--group G] [-t T] [--reps R]
 *       synthetic matmul (no model) on the CPU: time per call, weight GB/s, GFLOP/s, and how they
 *       compare with the machine probes (decode roofline = weight bytes/s ÷ read bandwidth).
 *   cairn bench --model DIR [-p 512[,4096,...]] [-n 128] [-t T] [--batch B] [--reps R]
 *               [--chunk C] [--device D]
 *       prefill and decode tokens/s on a model (median of reps) on --device (default auto),
 *       decode roofline, prefill GFLOP/s vs the FMA peak. -p takes several prompt lengths: each
 *       is prefilled (in chunks of --chunk tokens, default the whole prompt) and reported in
 *       the JSON's "prefill" array; decode runs after the first. On the CPU each prefill also
 *       reports the share of its time spent in attention (cpu_attn_timer, on only while a
 *       timed prefill runs). On a GPU (--device cuda) the decode
 *       roofline and the adjacent ratio are against the device's copy bandwidth, probed once
 *       in the run (cuda_probe_copy_bandwidth; JSON "device_copy_gbs"), not the host probes;
 *       timing starts after an untimed warm-up of each length (one-time algorithm timing and
 *       graph capture), and prefill_fma_peak_pct (a host figure) is 0. A MoE model also gets
 *       the bytes a step reads under its routing (moe_step_bytes: at most batch x top_k experts
 *       per layer, one row of an untied embedding) and that roofline
 *       (moe_decode_roofline_pct_median); the plain roofline counts every expert.
 *       --tensor-parallel N (> 1, or CAIRN_TP_FORCE=1): the model sharded over GPUs 0..N-1 (NCCL)
 *       or N simulated CPU ranks; every rank runs the same steps on its own thread and rank 0
 *       times and reports them; the GPU roofline is against N x the device's copy bandwidth.
 *   cairn bench --allreduce HIDDEN --tensor-parallel N [-p ROWS] [-n ITERS] [--reps R] [--device D]
 *       the tensor-parallel all-reduce of [ROWS (default 1), HIDDEN] f32 alone (bench_allreduce.c):
 *       microseconds per call and per layer (two per layer), bus bandwidth.
 *   cairn bench --attn HEADS:KV_HEADS:HEAD_DIM [-p N] [--chunk C] [-t T] [--reps R]
 *       synthetic attention (no model) on the CPU: one layer's causal prefill of -p tokens in
 *       chunks of C (default all) over bf16 paged KV, the rowwise and the tiled kernel
 *       (CAIRN_CPU_ATTN) in alternation, median time and GFLOP/s of each.
 * All print the CPU probes: read-only sum and STREAM triad bandwidth, FMA peak. --json prints
 * one JSON object instead of text. The ISA is the best available or CAIRN_CPU_ISA.
 *
 * The probes and the matmul mode measure the CPU itself, so they call cpu/ directly (the one
 * place outside cpu/ that does); the model mode runs through the backend like everything else. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "cpu/cpu.h"
#include "model/model.h"
#include "model/model_run.h"
#include "model/model_tp.h"
#ifdef CAIRN_HAVE_CUDA
#include "cuda/cuda.h"
#endif

#define BENCH_MAX_PROMPTS 16

struct bench_opts {
    const char *model;
    const char *matmul;
    const char *attn;
    const char *dtype;
    const char *device;
    int n_prompt, n_gen, n_threads, batch, reps, group, n_cols, json;
    int prompts[BENCH_MAX_PROMPTS]; /* -p: the prompt lengths; prompts[0] == n_prompt */
    int n_prompts, chunk;
    int probe_mb;
};

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t bench_rng = 0x2545f4914f6cdd1dull;
static uint32_t bench_rand(void)
{
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return (uint32_t)(bench_rng >> 16);
}

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: cairn bench --matmul OUTxIN --dtype bf16|f16|f32|q4|q8|qB [-n N] [--group G]\n"
            "                   [-t THREADS] [--reps R] [--json]\n"
            "       cairn bench --attn HEADS:KV_HEADS:HEAD_DIM [-p N] [--chunk C] [-t THREADS] [--reps R]\n"
            "                   [--json]\n"
            "       cairn bench --model DIR [-p 512[,4096,...]] [-n 128] [-t THREADS] [--batch B] [--reps R]\n"
            "                   [--chunk C] [--json] [--device auto|cpu|cuda[:N]] [--tensor-parallel N]\n"
            "       cairn bench --allreduce HIDDEN --tensor-parallel N [-p ROWS] [-n ITERS] [--reps R]\n"
            "                   [--device cpu|cuda] [--json]   one all-reduce of [ROWS, HIDDEN] f32\n"
            "options: --probe-mb MB  size of the bandwidth probe buffer (default 512)\n"
            "env: CAIRN_CPU_ISA=scalar|avx2|avx512 forces the kernels; CAIRN_CPU_ATTN=auto|rowwise|tiled|split|legacy\n"
            "     the attention kernel of --model\n");
}

static void bench_print_probe(const struct cpu_probe *p, int json)
{
    if (json)
        printf("\"isa\": \"%s\", \"vnni_q\": %s, \"threads\": %d, \"read_gbs\": %.2f, \"triad_gbs\": %.2f, "
               "\"fma_peak_gflops\": %.1f",
               cpu_isa_name(cpu_isa_get()), cpu_vnni_active() ? "true" : "false", p->n_threads, p->read_gbs,
               p->triad_gbs, p->fma_gflops);
    else
        printf("isa %s%s, %d threads\nprobe: read %.2f GB/s, triad %.2f GB/s, FMA peak %.1f GFLOP/s\n",
               cpu_isa_name(cpu_isa_get()), cpu_vnni_active() ? " (q4/q8: packed, VNNI)" : "", p->n_threads,
               p->read_gbs, p->triad_gbs, p->fma_gflops);
}

/* Synthetic matmul: a random weight, n activation rows. */
/* CPU seconds of the whole process so far (every thread). */
static double bench_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_matmul(const struct bench_opts *o, const struct cpu_probe *probe)
{
    long long out = 0, in = 0;
    if (sscanf(o->matmul, "%lldx%lld", &out, &in) != 2 || out <= 0 || in <= 0) {
        fprintf(stderr, "cairn bench: --matmul wants OUTxIN, got '%s'\n", o->matmul);
        return 2;
    }
    struct tensor w = {.n_dims = 2, .shape = {out, in}};
    size_t wbytes = 0;
    void *data = NULL;
    uint16_t *sc = NULL, *bi = NULL;
    if (strcmp(o->dtype, "bf16") == 0 || strcmp(o->dtype, "f16") == 0 || strcmp(o->dtype, "f32") == 0) {
        w.dtype = o->dtype[0] == 'b' ? DTYPE_BF16 : strcmp(o->dtype, "f16") == 0 ? DTYPE_F16 : DTYPE_F32;
        size_t es = dtype_size(w.dtype);
        wbytes = (size_t)out * (size_t)in * es;
        data = cairn_xmalloc(wbytes);
        for (size_t i = 0; i < (size_t)out * (size_t)in; i++) {
            float f = (float)((int)(bench_rand() % 2001) - 1000) * 1e-3f;
            if (es == 4) memcpy((char *)data + i * 4, &f, 4);
            else {
                uint16_t h = w.dtype == DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
                memcpy((char *)data + i * 2, &h, 2);
            }
        }
    } else if (o->dtype[0] == 'q' && atoi(o->dtype + 1) >= 2 && atoi(o->dtype + 1) <= 8) {
        w.dtype = DTYPE_Q;
        w.bits = atoi(o->dtype + 1);
        w.group_size = o->group;
        if (in % o->group || (in * w.bits) % 32) {
            fprintf(stderr, "cairn bench: IN must be a multiple of the group size (%d)\n", o->group);
            return 2;
        }
        size_t words = (size_t)out * (size_t)in * (size_t)w.bits / 32, groups = (size_t)out * (size_t)in / (size_t)o->group;
        data = cairn_xmalloc(words * 4);
        for (size_t i = 0; i < words; i++) ((uint32_t *)data)[i] = bench_rand() ^ (bench_rand() << 16);
        sc = cairn_xmalloc(groups * 2);
        bi = cairn_xmalloc(groups * 2);
        for (size_t i = 0; i < groups; i++) {
            sc[i] = f32_to_bf16(0.01f);
            bi[i] = f32_to_bf16(-0.05f);
        }
        w.scales = sc;
        w.biases = bi;
        wbytes = words * 4 + groups * 4;
    } else {
        fprintf(stderr, "cairn bench: unknown --dtype '%s'\n", o->dtype);
        return 2;
    }
    w.data = data;
    size_t packed_bytes = cpu_pack_bytes(&w); /* as the model room packs at load */
    void *packed = packed_bytes ? cairn_xmalloc(packed_bytes) : NULL;
    if (packed) {
        cpu_pack(&w, packed);
        w.be_data = packed;
    }
    int n = o->n_cols;
    float *x = cairn_xmalloc((size_t)n * (size_t)in * 4), *y = cairn_xmalloc((size_t)n * (size_t)out * 4);
    for (size_t i = 0; i < (size_t)n * (size_t)in; i++) x[i] = (float)((int)(bench_rand() % 2001) - 1000) * 1e-3f;
    int reps = o->reps > 0 ? o->reps : (n == 1 ? 50 : 10);
    double *times = cairn_xmalloc((size_t)reps * sizeof(double));
    double *ratios = cairn_xmalloc((size_t)reps * sizeof(double));
    double *cpu_times = cairn_xmalloc((size_t)reps * sizeof(double));
    cpu_matmul(&w, x, y, n); /* warm-up: pages in, pool awake */
    double best = 1e30;
    /* The machine may be shared: each group of 5 calls is bracketed by read probes and its
     * weight bandwidth compared with theirs (adjacent roofline ratio). */
    for (int r = 0; r < reps; r++) {
        double bw0 = r % 5 == 0 ? cpu_probe_read_now((size_t)o->probe_mb << 20) : 0;
        double c0 = bench_cpu_seconds(), t0 = cairn_now();
        cpu_matmul(&w, x, y, n);
        times[r] = cairn_now() - t0;
        cpu_times[r] = bench_cpu_seconds() - c0;
        if (times[r] < best) best = times[r];
        static double bw_last;
        if (bw0 > 0) bw_last = bw0;
        ratios[r] = bw_last > 0 ? wbytes / times[r] / 1e9 / bw_last : 0;
    }
    double med = bench_median(times, reps);
    double adj_med = bench_median(ratios, reps), adj_best = 0;
    for (int r = 0; r < reps; r++) adj_best = ratios[r] > adj_best ? ratios[r] : adj_best;
    double flops = 2.0 * (double)out * (double)in * n;
    double gbs_med = wbytes / med / 1e9, gbs_best = wbytes / best / 1e9;
    double gf_med = flops / med / 1e9, gf_best = flops / best / 1e9;
    if (o->json) {
        printf("{\"mode\": \"matmul\", \"out\": %lld, \"in\": %lld, \"n\": %d, \"dtype\": \"%s\", "
               "\"weight_bytes\": %zu, \"reps\": %d, \"ms_median\": %.4f, \"ms_best\": %.4f, "
               "\"weight_gbs_median\": %.2f, \"weight_gbs_best\": %.2f, \"gflops_median\": %.2f, "
               "\"gflops_best\": %.2f, \"roofline_pct_best\": %.1f, \"fma_peak_pct_best\": %.1f, "
               "\"roofline_adjacent_pct_median\": %.1f, \"roofline_adjacent_pct_best\": %.1f, ",
               out, in, n, o->dtype, wbytes, reps, med * 1e3, best * 1e3, gbs_med, gbs_best, gf_med,
               gf_best, 100.0 * gbs_best / probe->read_gbs, 100.0 * gf_best / probe->fma_gflops,
               100.0 * adj_med, 100.0 * adj_best);
        bench_print_probe(probe, 1);
        printf("}\n");
    } else {
        bench_print_probe(probe, 0);
        printf("matmul %lldx%lld %s n=%d (%zu weight bytes), %d reps:\n", out, in, o->dtype, n, wbytes, reps);
        printf("  time     median %.3f ms, best %.3f ms\n", med * 1e3, best * 1e3);
        /* CPU time of the process (all threads, spinning included): on a shared machine it
         * moves less than wall time when other work takes the cores */
        printf("  cpu time median %.3f ms per call\n", bench_median(cpu_times, reps) * 1e3);
        printf("  weights  median %.2f GB/s, best %.2f GB/s = %.1f%% of read bandwidth\n", gbs_med,
               gbs_best, 100.0 * gbs_best / probe->read_gbs);
        printf("  compute  median %.2f GFLOP/s, best %.2f GFLOP/s = %.1f%% of FMA peak\n", gf_med,
               gf_best, 100.0 * gf_best / probe->fma_gflops);
        printf("  vs adjacent read probe: median %.1f%%, best %.1f%%\n", 100.0 * adj_med, 100.0 * adj_best);
    }
    free(ratios);
    free(cpu_times);
    free(times);
    free(x);
    free(y);
    free(data);
    free(packed);
    free(sc);
    free(bi);
    return 0;
}


static int bench_model(const struct bench_opts *o, const struct cpu_probe *probe, struct backend *be);
static int bench_model_tp(const struct bench_opts *o, const struct cpu_probe *probe, struct backend_tp *tp);

/* Synthetic attention: bf16 KV of P random positions in blocks of 16 (block table in order), the
 * prompt's queries in chunks, rowwise and tiled alternating within each rep. */
static int bench_attn(const struct bench_opts *o, const struct cpu_probe *probe)
{
    int H = 0, KV = 0, D = 0;
    if (sscanf(o->attn, "%d:%d:%d", &H, &KV, &D) != 3 || H < 1 || KV < 1 || D < 1 || H % KV || D > 1024) {
        fprintf(stderr, "cairn bench: --attn wants HEADS:KV_HEADS:HEAD_DIM (heads a multiple of KV heads), got '%s'\n",
                o->attn);
        return 2;
    }
    const int P = o->n_prompt, C = o->chunk > 0 && o->chunk < P ? o->chunk : P, bs = 16;
    const int n_blocks = (P + bs - 1) / bs, reps = o->reps > 0 ? o->reps : 5;
    struct backend_kv_view kv = {.n_blocks = n_blocks, .n_layers = 1, .block_size = bs, .n_kv_heads = KV,
                                 .head_dim = D, .dtype = DTYPE_BF16};
    kv.layer_block_bytes = (size_t)bs * KV * D * 2;
    kv.block_bytes = kv.layer_block_bytes;
    kv.k = cairn_xmalloc(kv.block_bytes * (size_t)n_blocks);
    kv.v = cairn_xmalloc(kv.block_bytes * (size_t)n_blocks);
    int32_t *pos = cairn_xmalloc(sizeof(int32_t) * (size_t)P), *bt = cairn_xmalloc(sizeof(int32_t) * (size_t)n_blocks);
    size_t qn = (size_t)C * H * D, kn = (size_t)C * KV * D;
    float *q = cairn_xmalloc(qn * 4), *out = cairn_xmalloc(qn * 4), *k = cairn_xmalloc(kn * 4), *v = cairn_xmalloc(kn * 4);
    for (int i = 0; i < n_blocks; i++) bt[i] = i;
    for (int i = 0; i < P; i++) pos[i] = i;
    for (size_t i = 0; i < qn; i++) q[i] = (float)((int)(bench_rand() % 2001) - 1000) * 1e-3f;
    for (int c0 = 0; c0 < P; c0 += C) { /* slots == positions */
        int n = P - c0 < C ? P - c0 : C;
        for (size_t i = 0; i < kn; i++) {
            k[i] = (float)((int)(bench_rand() % 2001) - 1000) * 1e-3f;
            v[i] = (float)((int)(bench_rand() % 2001) - 1000) * 1e-3f;
        }
        cpu_kv_store(&kv, 0, pos + c0, n, k, v);
    }
    double flops = 0;
    for (int i = 0; i < P; i++) flops += 4.0 * H * D * (i + 1);
    static const enum cpu_attn_mode modes[2] = {CPU_ATTN_ROWWISE, CPU_ATTN_TILED};
    const enum cpu_attn_mode saved = cpu_attn_mode_get();
    double *t = cairn_xmalloc(sizeof(double) * 2 * (size_t)reps), med[2], best[2] = {1e30, 1e30};
    for (int r = 0; r < reps; r++)
        for (int md = 0; md < 2; md++) {
            cpu_attn_mode_set(modes[md]);
            double t0 = cairn_now();
            for (int c0 = 0; c0 < P; c0 += C) {
                struct cpu_attn a = {.q = q, .out = out, .n_tokens = P - c0 < C ? P - c0 : C, .n_heads = H,
                                     .pos = pos + c0, .kv = &kv, .layer = 0, .block_table = bt,
                                     .scale = 1.0f / sqrtf((float)D)};
                cpu_attention(&a);
            }
            t[md * reps + r] = cairn_now() - t0;
            best[md] = t[md * reps + r] < best[md] ? t[md * reps + r] : best[md];
        }
    cpu_attn_mode_set(saved);
    for (int md = 0; md < 2; md++) med[md] = bench_median(t + md * reps, reps);
    if (o->json) {
        printf("{\"mode\": \"attn\", \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"prompt\": %d, "
               "\"chunk\": %d, \"reps\": %d, \"rowwise_ms_median\": %.3f, \"tiled_ms_median\": %.3f, "
               "\"rowwise_gflops_best\": %.2f, \"tiled_gflops_best\": %.2f, \"tiled_speedup_median\": %.3f, ",
               H, KV, D, P, C, reps, med[0] * 1e3, med[1] * 1e3, flops / best[0] / 1e9, flops / best[1] / 1e9,
               med[0] / med[1]);
        bench_print_probe(probe, 1);
        printf("}\n");
    } else {
        bench_print_probe(probe, 0);
        printf("attention %d/%d heads, dim %d, prompt %d in chunks of %d (bf16 KV), %d reps:\n", H, KV, D, P, C,
               reps);
        for (int md = 0; md < 2; md++)
            printf("  %-8s median %.2f ms, best %.1f GFLOP/s = %.1f%% of FMA peak\n", cpu_attn_mode_name(modes[md]),
                   med[md] * 1e3, flops / best[md] / 1e9, 100.0 * flops / best[md] / 1e9 / probe->fma_gflops);
        printf("  tiled / rowwise speed: %.2fx (medians)\n", med[0] / med[1]);
    }
    free(t);
    free(q);
    free(out);
    free(k);
    free(v);
    free(pos);
    free(bt);
    free(kv.k);
    free(kv.v);
    return 0;
}

/* -p N[,N...]: up to BENCH_MAX_PROMPTS positive lengths. */
static int bench_parse_prompts(const char *v, struct bench_opts *o)
{
    o->n_prompts = 0;
    for (const char *s = v; *s;) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s || n < 1 || n > (1 << 24) || (*end && *end != ',') || o->n_prompts == BENCH_MAX_PROMPTS) {
            fprintf(stderr, "cairn bench: -p wants up to %d positive lengths separated by commas, got '%s'\n",
                    BENCH_MAX_PROMPTS, v);
            return 2;
        }
        o->prompts[o->n_prompts++] = (int)n;
        s = *end ? end + 1 : end;
    }
    if (o->n_prompts == 0) {
        fprintf(stderr, "cairn bench: -p needs a length\n");
        return 2;
    }
    o->n_prompt = o->prompts[0];
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o = {.n_prompt = 512, .n_gen = 128, .batch = 1, .group = 64, .n_cols = 1,
                           .dtype = "bf16", .probe_mb = 512, .device = "auto"};
    int n_set = 0, n_tp = 1, p_set = 0; /* n_tp: --tensor-parallel */
    const char *allreduce = NULL;       /* --allreduce HIDDEN (bench_allreduce.c) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bench_usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            o.json = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "cairn bench: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--model") == 0) o.model = v;
        else if (strcmp(a, "--matmul") == 0) o.matmul = v;
        else if (strcmp(a, "--attn") == 0) o.attn = v;
        else if (strcmp(a, "--dtype") == 0) o.dtype = v;
        else if (strcmp(a, "--allreduce") == 0) allreduce = v;
        else if (strcmp(a, "-p") == 0) {
            if (bench_parse_prompts(v, &o) != 0) return 2;
            p_set = 1;
        } else if (strcmp(a, "--chunk") == 0) o.chunk = atoi(v);
        else if (strcmp(a, "-n") == 0) {
            o.n_gen = atoi(v);
            o.n_cols = atoi(v);
            n_set = 1;
        } else if (strcmp(a, "-t") == 0 || strcmp(a, "--threads") == 0) o.n_threads = atoi(v);
        else if (strcmp(a, "--batch") == 0) o.batch = atoi(v);
        else if (strcmp(a, "--reps") == 0) o.reps = atoi(v);
        else if (strcmp(a, "--group") == 0) o.group = atoi(v);
        else if (strcmp(a, "--probe-mb") == 0) o.probe_mb = atoi(v);
        else if (strcmp(a, "--device") == 0) o.device = v;
        else if (strcmp(a, "--tensor-parallel") == 0) {
            if (cli_tp_parse("bench", v, &n_tp) != 0) return 2;
        }
        else {
            fprintf(stderr, "cairn bench: unknown option '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
        i++;
    }
    if (allreduce)
        return bench_allreduce(o.device, n_tp, atoi(allreduce), p_set ? o.n_prompt : 1, n_set ? o.n_gen : 100,
                               o.reps > 0 ? o.reps : 5, o.json);
    if (!o.model && !o.matmul && !o.attn) {
        bench_usage(stderr);
        return 2;
    }
    if (o.matmul && !n_set) o.n_cols = 1;
    if (o.n_prompts == 0) o.prompts[o.n_prompts++] = o.n_prompt;
    if (o.n_cols < 1 || o.n_gen < 1 || o.n_prompt < 1 || o.batch < 1 || o.group < 1 || o.probe_mb < 1 ||
        o.chunk < 0) {
        fprintf(stderr, "cairn bench: counts must be positive\n");
        return 2;
    }
    if (cli_tp_wanted(n_tp) && (o.matmul || o.attn)) {
        fprintf(stderr, "cairn bench: --tensor-parallel runs with --model only\n");
        return 2;
    }
    struct cairn_err err = {0};
    /* The CPU backend holds the pool the probes and the matmul mode run on; the model runs on
     * --device (a second handle on the same CPU pool when that is the CPU). */
    struct backend *host = NULL, *be = NULL;
    if ((o.matmul || o.attn) && strcmp(o.device, "auto") != 0 && strcmp(o.device, "cpu") != 0) {
        fprintf(stderr, "cairn bench: --matmul runs on the CPU only (--device %s)\n", o.device);
        return 2;
    }
    if (cli_device_open("bench", "cpu", o.n_threads, &host) != 0) return 1;
    struct backend_tp *tp = NULL; /* --tensor-parallel: the model runs sharded over it */
    if (o.model && cli_tp_open("bench", o.device, n_tp, &tp) != 0) {
        backend_close(host);
        return 2;
    }
    if (o.model && !tp && cli_device_open("bench", o.device, o.n_threads, &be) != 0) {
        backend_close(host);
        return 2;
    }
    struct cpu_probe probe;
    int rc = 1;
    if (cpu_probe_run((size_t)o.probe_mb << 20, 5, &probe, &err) != CAIRN_OK)
        fprintf(stderr, "cairn bench: %s\n", err.msg);
    else
        rc = o.matmul ? bench_matmul(&o, &probe)
             : o.attn ? bench_attn(&o, &probe)
             : tp     ? bench_model_tp(&o, &probe, tp)
                      : bench_model(&o, &probe, be);
    cpu_probe_release();
    backend_close(be);
    backend_tp_close(tp);
    backend_close(host);
    return rc;
}

/* Prefill FLOPs of P tokens: 2 per parameter per token except the LM head (one row of logits),
 * plus attention (QK and PV: 4 · heads · head_dim per (query, key) pair, causal). */
static double bench_prefill_flops(const struct model_info *info, int P)
{
    double lm = (double)info->vocab_size * info->hidden_size;
    double body = (double)info->n_params - lm > 0 ? (double)info->n_params - lm : (double)info->n_params;
    double attn = 4.0 * info->n_kv_layers * info->n_heads * info->head_dim * ((double)P * (P + 1) / 2);
    return 2.0 * body * P + 2.0 * lm + attn;
}

/* Sequence 0 prefilled with P tokens in chunks, timed; *attn_s: the time in attention on the
 * CPU (0 on other devices). */
static int bench_prefill(struct model_run *run, const int32_t *tokens, int P, int chunk, float *logits,
                         int cpu, double *secs, double *attn_s, struct cairn_err *err)
{
    model_run_reset(run, 0);
    if (cpu) { /* process-wide: only the reporting rank of a group touches it */
        cpu_attn_timer_reset();
        cpu_attn_timer_enable(1);
    }
    double t0 = cairn_now();
    int rc = model_run_prefill(run, 0, tokens, P, chunk > 0 && chunk < P ? chunk : P, logits, err);
    *secs = cairn_now() - t0;
    if (cpu) cpu_attn_timer_enable(0);
    *attn_s = cpu ? cpu_attn_timer_seconds() : 0;
    return rc;
}

struct bench_len_stats {
    double tps_med, tps_best, gf_best, attn_share_med;
};

/* Medians and bests of prompt length i over reps (lt, ls: [length][rep] seconds and shares;
 * reordered by the medians). */
static void bench_len(const struct bench_opts *o, const struct model_info *info, double *lt, double *ls, int reps,
                      int i, struct bench_len_stats *L)
{
    double *t = lt + (size_t)i * reps, *sh = ls + (size_t)i * reps, best = 1e30;
    for (int r = 0; r < reps; r++) best = t[r] < best ? t[r] : best;
    L->tps_best = o->prompts[i] / best;
    L->tps_med = o->prompts[i] / bench_median(t, reps);
    L->gf_best = bench_prefill_flops(info, o->prompts[i]) / best / 1e9;
    L->attn_share_med = bench_median(sh, reps);
}

/* Model mode: prefill of each -p length on one sequence, then (after the first length) -n
 * decode steps of --batch sequences (one token each, one logit row each), repeated --reps times;
 * medians and bests reported. */
/* The longest -p length. */
static int bench_prompt_max(const struct bench_opts *o)
{
    int P_max = 0;
    for (int i = 0; i < o->n_prompts; i++) P_max = o->prompts[i] > P_max ? o->prompts[i] : P_max;
    return P_max;
}

/* The random tokens of a run: [P_max + batch] (caller frees). Drawn once, before any rank
 * thread starts, so every rank of a group steps over the same tokens. */
static int32_t *bench_tokens(const struct bench_opts *o, int vocab)
{
    int n = bench_prompt_max(o) + o->batch;
    int32_t *t = cairn_xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) t[i] = (int32_t)(bench_rand() % (uint32_t)vocab);
    return t;
}

/* The model mode on a loaded model m on be. world > 1: m is one rank of a tensor-parallel group
 * of world ranks, each running this on its own thread with the same steps; only rank 0
 * (report) probes, times and prints: the all-reduces make its steps the group's. Returns 0 or
 * 1 (after a message). */
static int bench_model_on(const struct bench_opts *o, const struct cpu_probe *probe, struct model *m,
                          struct backend *be, const int32_t *tokens, int world, int report)
{
    struct cairn_err err = {0};
    struct model_run run = {0};
    int rc = 1;
    float *logits = NULL;
    double *pt = NULL, *dt = NULL, *bw = NULL, *lt = NULL, *ls = NULL;
    struct model_run_item *items = NULL;
    const struct model_info *info = model_get_info(m);
    const int B = o->batch, P = o->n_prompt, N = o->n_gen, NP = o->n_prompts;
    const int reps = o->reps > 0 ? o->reps : 3;
    const int cpu = be->kind == BACKEND_CPU && report; /* the attention timer is process-wide */
    const int host_probe = be->kind == BACKEND_CPU;
    int P_max = bench_prompt_max(o);
    int step = o->chunk > 0 && o->chunk < P_max ? o->chunk : P_max;
    struct model_run_opts ro = {.n_seqs = B, .max_ctx = (P_max > P + N ? P_max : P + N), .max_step = step > B ? step : B,
                                .block_size = 16, .kv_dtype = DTYPE_BF16};
    if (model_run_open(&run, m, &ro, &err) != CAIRN_OK) {
        fprintf(stderr, "cairn bench: %s\n", err.msg);
        goto cleanup;
    }
    logits = cairn_xmalloc((size_t)B * (size_t)info->vocab_size * sizeof(float));
    items = cairn_xcalloc((size_t)B, sizeof(*items));
    pt = cairn_xmalloc((size_t)reps * sizeof(double));
    dt = cairn_xmalloc((size_t)reps * sizeof(double));
    bw = cairn_xmalloc((size_t)reps * sizeof(double));
    lt = cairn_xcalloc((size_t)reps * (size_t)NP, sizeof(double)); /* [length][rep]: prefill seconds */
    ls = cairn_xcalloc((size_t)reps * (size_t)NP, sizeof(double)); /* [length][rep]: attention share */
    /* On a GPU the roofline is against the device's own copy bandwidth, probed here (the
     * host's read probe says nothing about HBM); 0: the host probes are used. */
    double dev_gbs = 0;
#ifdef CAIRN_HAVE_CUDA
    if (be->kind == BACKEND_CUDA && report) {
        int dev = 0;
        if (strncmp(be->name, "cuda:", 5) == 0) dev = atoi(be->name + 5);
        if (cuda_probe_copy_bandwidth(dev, (size_t)o->probe_mb << 20, &dev_gbs, &err) != CAIRN_OK) {
            fprintf(stderr, "cairn bench: device copy probe: %s\n", err.msg);
            goto cleanup;
        }
    }
#endif
    /* A device backend does one-time work on the first call of each shape (cuBLASLt algorithm
     * timing, CUDA graph capture): one untimed prefill of every length and a few decode steps
     * first, so that the medians measure the steady state. The CPU has no such work (and a
     * long CPU prefill costs minutes), so it starts timing at once. */
    for (int i = 0; i < NP && !host_probe; i++) {
        double s_warm, a_warm;
        if (bench_prefill(&run, tokens, o->prompts[i], o->chunk, logits, cpu, &s_warm, &a_warm, &err) != CAIRN_OK) {
            fprintf(stderr, "cairn bench: warm-up prefill: %s\n", err.msg);
            goto cleanup;
        }
        for (int st = 0; st < 3 && i == NP - 1; st++) {
            items[0] = (struct model_run_item){.seq = 0, .tokens = tokens + P, .n_tokens = 1, .n_logits = 1,
                                               .logits = logits};
            if (model_run_step(&run, items, 1, &err) != CAIRN_OK) {
                fprintf(stderr, "cairn bench: warm-up decode: %s\n", err.msg);
                goto cleanup;
            }
        }
    }
    for (int r = 0; r < reps; r++) {
        /* The first length: sequence 0 timed, then the other sequences of the decode batch. */
        double attn_s;
        if (bench_prefill(&run, tokens, P, o->chunk, logits, cpu, &pt[r], &attn_s, &err) != CAIRN_OK) {
            fprintf(stderr, "cairn bench: prefill: %s\n", err.msg);
            goto cleanup;
        }
        lt[r] = pt[r];
        ls[r] = attn_s / pt[r];
        for (int b = 1; b < B; b++) {
            model_run_reset(&run, b);
            if (model_run_prefill(&run, b, tokens, P, o->chunk > 0 && o->chunk < P ? o->chunk : P, logits, &err) !=
                CAIRN_OK) {
                fprintf(stderr, "cairn bench: prefill: %s\n", err.msg);
                goto cleanup;
            }
        }
        /* Shared machine: a read probe right before and after each decode run. */
        /* (not with simulated CPU ranks: the probe runs on the CPU pool outside a step, which the
         * other ranks' steps hold: the start-up probe stands for it) */
        int adj = report && dev_gbs <= 0 && world == 1;
        double bw0 = adj ? cpu_probe_read_now((size_t)o->probe_mb << 20) : dev_gbs > 0 ? dev_gbs : probe->read_gbs;
        double t0 = cairn_now();
        for (int st = 0; st < N; st++) {
            for (int b = 0; b < B; b++)
                items[b] = (struct model_run_item){.seq = b, .tokens = tokens + P + b, .n_tokens = 1, .n_logits = 1,
                                                   .logits = logits + (size_t)b * info->vocab_size};
            if (model_run_step(&run, items, B, &err) != CAIRN_OK) {
                fprintf(stderr, "cairn bench: decode: %s\n", err.msg);
                goto cleanup;
            }
        }
        dt[r] = cairn_now() - t0;
        bw[r] = adj ? 0.5 * (bw0 + cpu_probe_read_now((size_t)o->probe_mb << 20)) : bw0;
        /* The other lengths, sequence 0 alone. */
        for (int i = 1; i < NP; i++) {
            double *sec = &lt[(size_t)i * reps + r];
            if (bench_prefill(&run, tokens, o->prompts[i], o->chunk, logits, cpu, sec, &attn_s, &err) != CAIRN_OK) {
                fprintf(stderr, "cairn bench: prefill of %d: %s\n", o->prompts[i], err.msg);
                goto cleanup;
            }
            ls[(size_t)i * reps + r] = attn_s / *sec;
        }
    }
    if (!report) {
        rc = 0;
        goto cleanup;
    }
    double p_best = 1e30, d_best = 1e30;
    for (int r = 0; r < reps; r++) {
        if (pt[r] < p_best) p_best = pt[r];
        if (dt[r] < d_best) d_best = dt[r];
    }
    double p_med = bench_median(pt, reps), d_med = bench_median(dt, reps);
    double pp_med = P / p_med, pp_best = P / p_best;
    double tg_med = (double)B * N / d_med, tg_best = (double)B * N / d_best;
    /* Bytes one decode step reads: every weight once (tied embeddings are read whole by the
     * LM head; for untied models this counts the embedding table too: an upper bound) plus each
     * sequence's KV up to its position (mean position P + N/2). */
    /* tensor parallel: a rank reads its shard of the weights (weight_bytes is the whole model's)
     * and its KV heads (info's are the rank's); the roofline is the ranks' summed bandwidth */
    double kv_per_tok = (double)info->n_kv_layers * info->n_kv_heads * world * info->head_dim * 2.0 * 2.0;
    double step_bytes = (double)info->weight_bytes + B * kv_per_tok * (P + N / 2.0);
    double steps_best = N / d_best, steps_med = N / d_med;
    double roof_gbs = (dev_gbs > 0 ? dev_gbs : probe->read_gbs) * (be->kind == BACKEND_CPU ? 1 : world);
    double roof_best = 100.0 * step_bytes * steps_best / 1e9 / roof_gbs;
    double roof_med = 100.0 * step_bytes * steps_med / 1e9 / roof_gbs;
    double p_flops = bench_prefill_flops(info, P);
    double gf_best = p_flops / p_best / 1e9, gf_med = p_flops / p_med / 1e9;
    double adj_best = 0;
    for (int r = 0; r < reps; r++) {
        double ratio = bw[r] > 0 ? step_bytes * (N / dt[r]) / 1e9 / bw[r] : 0;
        if (ratio > adj_best) adj_best = ratio;
        bw[r] = ratio;
    }
    double adj_med = bench_median(bw, reps);
    /* MoE: the bytes a step reads, routing included: at most B * top_k distinct experts of each
     * layer (exactly top_k at batch 1), and one row of an untied embedding table */
    double act_bytes = 0, act_med = 0;
    if (info->n_experts > 0) {
        double used = CAIRN_MIN((double)info->n_experts, (double)B * info->n_experts_per_tok) / info->n_experts;
        act_bytes = step_bytes - (double)info->routed_expert_bytes * (1.0 - used) - (double)info->untied_embed_bytes;
        act_med = 100.0 * act_bytes * steps_med / 1e9 / roof_gbs;
    }
    if (o->json) {
        printf("{\"mode\": \"model\", \"model\": \"%s\", \"model_type\": \"%s\", \"weight_bytes\": %llu, "
               "\"n_params\": %llu, \"prompt\": %d, \"gen\": %d, \"batch\": %d, \"reps\": %d, "
               "\"pp_tps_median\": %.2f, \"pp_tps_best\": %.2f, \"tg_tps_median\": %.2f, "
               "\"tg_tps_best\": %.2f, \"decode_roofline_pct_median\": %.1f, "
               "\"decode_roofline_pct_best\": %.1f, \"prefill_gflops_median\": %.2f, "
               "\"prefill_gflops_best\": %.2f, \"prefill_fma_peak_pct_best\": %.1f, "
               "\"decode_roofline_adjacent_pct_median\": %.1f, \"decode_roofline_adjacent_pct_best\": %.1f, ",
               o->model, info->model_type, (unsigned long long)info->weight_bytes,
               (unsigned long long)info->n_params, P, N, B, reps, pp_med, pp_best, tg_med, tg_best,
               roof_med, roof_best, gf_med, gf_best, cpu ? 100.0 * gf_best / probe->fma_gflops : 0.0,
               100.0 * adj_med, 100.0 * adj_best);
        if (dev_gbs > 0) printf("\"device\": \"%s\", \"device_copy_gbs\": %.2f, ", be->name, dev_gbs);
        if (world > 1) printf("\"tensor_parallel\": %d, ", world);
        if (act_bytes > 0)
            printf("\"moe_step_bytes\": %.0f, \"moe_decode_roofline_pct_median\": %.1f, ", act_bytes, act_med);
        printf("\"chunk\": %d, \"attn_kernel\": \"%s\", \"prefill\": [", o->chunk > 0 ? o->chunk : 0,
               cpu ? cpu_attn_mode_name(cpu_attn_mode_get()) : be->name);
        for (int i = 0; i < NP; i++) {
            struct bench_len_stats L;
            bench_len(o, info, lt, ls, reps, i, &L);
            printf("%s{\"prompt\": %d, \"pp_tps_median\": %.2f, \"pp_tps_best\": %.2f, "
                   "\"prefill_gflops_best\": %.2f, \"attn_share_median\": %.3f}",
                   i ? ", " : "", o->prompts[i], L.tps_med, L.tps_best, L.gf_best, L.attn_share_med);
        }
        printf("], ");
        bench_print_probe(probe, 1);
        printf("}\n");
    } else {
        bench_print_probe(probe, 0);
        printf("model %s (%s, %.1f M params, %.1f MB weights), %d reps\n", o->model, info->model_type,
               info->n_params / 1e6, info->weight_bytes / 1e6, reps);
        for (int i = 0; i < NP; i++) {
            struct bench_len_stats L;
            bench_len(o, info, lt, ls, reps, i, &L);
            printf("  prefill pp%-8d median %.2f tok/s, best %.2f tok/s; %.1f GFLOP/s best", o->prompts[i],
                   L.tps_med, L.tps_best, L.gf_best);
            if (cpu) printf(" = %.1f%% of the host's FMA peak", 100.0 * L.gf_best / probe->fma_gflops);
            if (cpu) printf("; attention %.1f%% of it (median)", 100.0 * L.attn_share_med);
            printf("\n");
        }
        if (o->chunk > 0) printf("  prefill chunk:     %d tokens per step\n", o->chunk);
        printf("  decode  tg%d x%d:   median %.2f tok/s, best %.2f tok/s\n", N, B, tg_med, tg_best);
        if (dev_gbs > 0) printf("  device %s: copy bandwidth %.2f GB/s\n", be->name, dev_gbs);
        if (world > 1)
            printf("  tensor parallel:   %d ranks (%s%s)\n", world, be->name,
                   be->kind == BACKEND_CPU ? ", simulated: one CPU" : "; roofline against the ranks' summed bandwidth");
        /* a MoE model reads only the routed experts: its roofline is the MoE line below; this one
         * counts every weight, as if every expert were read */
        printf("  decode roofline:   %.1f MB/step%s; best %.1f%%, median %.1f%% of %s bandwidth\n",
               step_bytes / 1e6, act_bytes > 0 ? " (every weight, as if all experts were read)" : "", roof_best,
               roof_med, dev_gbs > 0 ? "the device's copy" : "read");
        printf("  vs adjacent probes: best %.1f%%, median %.1f%% (read probe just before/after each run)\n",
               100.0 * adj_best, 100.0 * adj_med);
        if (act_bytes > 0)
            printf("  MoE roofline:      %.1f MB/step the routing reads; median %.1f%% of the bandwidth\n",
                   act_bytes / 1e6, act_med);
    }
    rc = 0;
cleanup:
    free(items);
    free(lt);
    free(ls);
    free(pt);
    free(dt);
    free(bw);
    free(logits);
    model_run_close(&run);
    return rc;
}

static int bench_model(const struct bench_opts *o, const struct cpu_probe *probe, struct backend *be)
{
    struct cairn_err err = {0};
    struct model *m = NULL;
    if (model_load(o->model, be, &m, &err) != CAIRN_OK) {
        fprintf(stderr, "cairn bench: %s\n", err.msg);
        return 1;
    }
    int32_t *tokens = bench_tokens(o, model_get_info(m)->vocab_size);
    int rc = bench_model_on(o, probe, m, be, tokens, 1, 1);
    free(tokens);
    model_free(m);
    return rc;
}

struct bench_tp_ctx {
    const struct bench_opts *o;
    const struct cpu_probe *probe;
    const int32_t *tokens;
    int world;
    int rc[BACKEND_TP_MAX];
};

static int bench_tp_rank(struct model *m, int rank, void *ctx, struct cairn_err *err)
{
    struct bench_tp_ctx *c = ctx;
    (void)err;
    c->rc[rank] = bench_model_on(c->o, c->probe, m, model_backend(m), c->tokens, c->world, rank == 0);
    return CAIRN_OK;
}

/* --tensor-parallel: the model sharded over tp, every rank running the benchmark on its own
 * thread (model_tp_run), rank 0 reporting. */
static int bench_model_tp(const struct bench_opts *o, const struct cpu_probe *probe, struct backend_tp *tp)
{
    struct cairn_err err = {0};
    struct model_tp *t = NULL;
    if (model_tp_load(o->model, tp, &t, &err) != CAIRN_OK) {
        fprintf(stderr, "cairn bench: --tensor-parallel %d: %s\n", tp->world, err.msg);
        return 1;
    }
    struct bench_tp_ctx c = {.o = o, .probe = probe, .world = tp->world};
    c.tokens = bench_tokens(o, model_get_info(t->ranks[0])->vocab_size);
    int rc = model_tp_run(t, bench_tp_rank, &c, &err) == CAIRN_OK ? 0 : 1;
    if (rc) fprintf(stderr, "cairn bench: --tensor-parallel %d: %s\n", tp->world, err.msg);
    for (int r = 0; r < tp->world; r++) rc |= c.rc[r];
    free((void *)c.tokens);
    model_tp_free(t);
    return rc;
}
