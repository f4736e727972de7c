/* Every op of the CUDA backend's table on cuda:0 against a double-precision host reference,
 * over odd shapes and every weight dtype (F32, F16, BF16, MLX q2-q8 with groups 32/64/128),
 * both KV dtypes, decode and prefill rows, split-K and single-split attention, attention rows
 * bit for bit the same alone, in a batch and in a chunk (steps of <= 16 rows); plus the error
 * paths (out of memory, the device budget, a latched error failing one step only). The optional
 * fused ops: matmul_add against the host reference, qk_rope_store against the unfused ops it
 * stands for (rmsnorm, rope, kv_store), both KV dtypes, partial rotary, with and without norms;
 * matmul_fused (RMSNorm and SwiGLU folded into the GEMV) against the host reference of its
 * definition, beside the plain op sequence, and bitwise alone == in a batch of <= 8 rows. The
 * tensor-core matmul for 1..16 rows of dense BF16/F16 weights (cuda_gemm_small.cu): every n,
 * odd row counts, 32 to 14,336 columns, matmul_add, matmul_multi, matmul_fused, and its rows
 * bitwise the same alone and in batches of 1..16 (test_mma, test_mma_invariant). The folds of
 * GEMM-sized steps (n 17..600: the norm and SwiGLU writing the GEMMs' bf16/f16 x, matmul_add's
 * beta = 1) against the same references, with and without CAIRN_CUDA_FUSE_GEMM (test_fuse_gemm).
 *
 * The reference is written here from tensor/backend.h's contract (weights widened with
 * tensor_row_to_f32, gdn_forward of model/gdn.c for DeltaNet), independent of the kernels.
 * Tolerances, relative to the natural scale of each result (sum |w x| for a dot product):
 *   f32-exact paths (GEMV, f32 GEMM, element-wise): 1e-5 (f32 rounding over a few thousand
 *     terms, vs the double reference);
 *   MLX q4/q8 GEMV (x as two int8 digits, cuda_gemv.cu): that plus the digits' own bound,
 *     sum |w| m / 32,512 (m: the largest |x| of each 32- or 16-value block; ref_matmul);
 *   bf16 GEMM (n > 8 rows) and the tensor-core matmul (BF16/F16 weights with cols % 32 == 0,
 *     n <= 16: mma_takes): 8e-3: x rounded to bf16 (2^-9 relative) and, for MLX weights,
 *     the dequantized value rounded to bf16 (another 2^-9), f32 accumulation;
 *   f16 GEMM: 2e-3 (x rounded to f16, 2^-11).
 * GEMV rows are also checked bitwise: alone and in batches of 1..8 rows, the same bits (the
 * tensor-core matmul's in batches of 1..16).
 * Skips (exit 77) on a machine with no usable GPU. A later version runs the shared cases of
 * tests/support/backend_cases.c against the CPU backend as well. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/mem.h"
#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "cuda/cuda_kernels.h" /* CUDA_MOE_DEVICE_MAX_N: where moe_experts changes path */
#include "model/gdn.h"
#include "testlib.h"

/* Matmuls of up to this many rows take the f32 GEMV (cuda.h: CAIRN_CUDA_GEMV_MAX_ROWS). */
#define CUDA_GEMV_MAX_N_TEST 8

static struct backend *be;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Uniform in [-1, 1). */
static float rnd(void) { return (float)((double)rnd_u32() / 2147483648.0 - 1.0); }

static float *rnd_vec(size_t n, float scale)
{
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = rnd() * scale;
    return v;
}

/* ---- device helpers ---- */

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    struct cairn_err err;
    int st = be->ops->buf_alloc(be, bytes, CAIRN_MEM_SCRATCH, &p, &err);
    if (st != CAIRN_OK) {
        fprintf(stderr, "buf_alloc: %s\n", err.msg);
        exit(1);
    }
    return p;
}

static void *dev_from(const void *host, size_t bytes)
{
    void *p = dev_alloc(bytes);
    struct cairn_err err;
    CHECK(be->ops->buf_upload(be, p, host, bytes, &err) == CAIRN_OK);
    return p;
}

static void dev_to(void *host, const void *dev, size_t bytes)
{
    struct cairn_err err;
    CHECK(be->ops->buf_download(be, host, dev, bytes, &err) == CAIRN_OK);
}

static void dev_free(void *p, size_t bytes) { be->ops->buf_free(be, p, bytes, CAIRN_MEM_SCRATCH); }

static void step_begin(void)
{
    struct cairn_err err;
    CHECK(be->ops->step_begin(be, &err) == CAIRN_OK);
}

static int step_end(void)
{
    struct cairn_err err;
    int st = be->ops->step_end(be, &err);
    CHECK_MSG(st == CAIRN_OK, "step_end: %s", err.msg);
    return st;
}

/* max over i of |got - want| / (scale[i] or 1), reported against tol. */
static void check_close(const char *what, const float *got, const double *want, const double *scale,
                        size_t n, double tol)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double s = scale ? scale[i] + 1e-30 : 1.0;
        double e = fabs((double)got[i] - want[i]) / s;
        if (!(e <= worst)) { /* NaN counts as worst */
            worst = isnan(e) ? INFINITY : e;
            at = i;
        }
    }
    CHECK_MSG(worst <= tol, "%s: error %.3g at %zu (got %.7g want %.7g) > tol %.3g", what, worst, at,
              n ? got[at] : 0.0, n ? want[at] : 0.0, tol);
}

/* ---- weights ---- */

struct test_weight {
    struct tensor t;
    void *data;
    uint16_t *scales, *biases;
};

static void weight_make(struct test_weight *w, enum dtype dt, int64_t rows, int64_t cols, int bits,
                        int gs)
{
    memset(w, 0, sizeof(*w));
    w->t.dtype = dt;
    w->t.n_dims = 2;
    w->t.shape[0] = rows;
    w->t.shape[1] = cols;
    size_t n = (size_t)(rows * cols);
    if (dt == DTYPE_F32) {
        float *p = malloc(n * 4);
        for (size_t i = 0; i < n; i++) p[i] = rnd() * 0.5f;
        w->data = p;
    } else if (dt == DTYPE_F16 || dt == DTYPE_BF16) {
        uint16_t *p = malloc(n * 2);
        for (size_t i = 0; i < n; i++) p[i] = dt == DTYPE_F16 ? f32_to_f16(rnd() * 0.5f) : f32_to_bf16(rnd() * 0.5f);
        w->data = p;
    } else {
        size_t words = (size_t)(rows * cols * bits / 32), groups = (size_t)(rows * cols / gs);
        uint32_t *p = malloc(words * 4);
        for (size_t i = 0; i < words; i++) p[i] = rnd_u32() ^ (rnd_u32() << 16);
        w->scales = malloc(groups * 2);
        w->biases = malloc(groups * 2);
        for (size_t i = 0; i < groups; i++) {
            w->scales[i] = f32_to_bf16(rnd() * 0.05f);
            w->biases[i] = f32_to_bf16(rnd() * 0.1f);
        }
        w->data = p;
        w->t.bits = bits;
        w->t.group_size = gs;
        w->t.scales = w->scales;
        w->t.biases = w->biases;
    }
    w->t.data = w->data;
    size_t extra = 0;
    struct cairn_err err;
    int st = be->ops->weight_prepare(be, &w->t, 0, &extra, &err);
    CHECK_MSG(st == CAIRN_OK, "weight_prepare: %s", err.msg);
    CHECK(extra > 0 && w->t.be_data != NULL);
}

static void weight_free(struct test_weight *w)
{
    be->ops->weight_release(be, &w->t);
    CHECK(w->t.be_data == NULL);
    free(w->data);
    free(w->scales);
    free(w->biases);
}

/* want[t][r] = x[t] . w[r] in double; scale = sum |w x|. */
static void ref_matmul(const struct tensor *w, const float *x, int n, double *want, double *scale)
{
    int64_t rows = w->shape[0], cols = w->shape[1];
    float *row = malloc((size_t)cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        tensor_row_to_f32(w, r, row);
        for (int t = 0; t < n; t++) {
            double acc = 0, s = 0;
            for (int64_t i = 0; i < cols; i++) {
                acc += (double)row[i] * x[t * cols + i];
                s += fabs((double)row[i] * x[t * cols + i]);
            }
            want[t * rows + r] = acc;
            scale[t * rows + r] = s;
        }
    }
    /* MLX q4/q8 GEMVs (n <= 8) take x as two int8 digits per value over blocks of the codes of
     * one 16-byte chunk (32 for q4, 16 for q8): each value within m / 32,512 of x, m the
     * block's largest |x| (cuda_gemv.cu). Their bound, sum |w| m / 32,512, is added to the
     * scale as 1e5 times itself, so that the f32 tolerance (1e-5 of the scale) admits it. */
    if (w->dtype == DTYPE_Q && (w->bits == 4 || w->bits == 8) && n <= CUDA_GEMV_MAX_N_TEST) {
        int64_t e = w->bits == 4 ? 32 : 16;
        int64_t nb = (n * cols + e - 1) / e; /* cols % e != 0 takes the scalar kernel: slack only */
        float *m = malloc(sizeof(float) * (size_t)nb);
        for (int64_t b = 0; b < nb; b++) {
            m[b] = 0;
            for (int64_t i = b * e; i < (b + 1) * e && i < n * cols; i++) m[b] = fmaxf(m[b], fabsf(x[i]));
        }
        for (int64_t r = 0; r < rows; r++) {
            tensor_row_to_f32(w, r, row);
            for (int t = 0; t < n; t++) {
                double bound = 0;
                for (int64_t i = 0; i < cols; i++) bound += fabs((double)row[i]) * m[(t * cols + i) / e] / 32512.0;
                scale[t * rows + r] += 1e5 * bound;
            }
        }
        free(m);
    }
    free(row);
}

/* Whether a matmul of n rows over this weight takes the tensor-core kernel (cuda_gemm_small.cu:
 * dense BF16/F16, cols % 32 == 0, n in 1..16; CAIRN_CUDA_MMA=0 off, =2 from 2 rows), whose x is
 * rounded to bf16/f16 as the GEMM's. */
static int mma_takes(enum dtype dt, int64_t cols, int n)
{
    const char *e = getenv("CAIRN_CUDA_MMA");
    int lo = e && strcmp(e, "2") == 0 ? 2 : 1, on = !(e && strcmp(e, "0") == 0);
    /* rows under 8 KiB (CUDA_GEMV_LONG_ROW) keep the GEMV up to 8 rows */
    return on && (dt == DTYPE_BF16 || dt == DTYPE_F16) && cols % 32 == 0 && n >= lo && n <= CUDA_MMA_MAX_N &&
           (cols * 2 >= CUDA_GEMV_LONG_ROW || n > CUDA_GEMV_MAX_N_TEST);
}

static double mm_tol(enum dtype dt, int64_t cols, int n)
{
    if (!mma_takes(dt, cols, n) && (n <= CUDA_GEMV_MAX_N_TEST || dt == DTYPE_F32)) return 1e-5;
    return dt == DTYPE_F16 ? 2e-3 : 8e-3;
}

/* ---- matmul ---- */

static void test_matmul_case(enum dtype dt, int64_t rows, int64_t cols, int bits, int gs, int n)
{
    struct test_weight w;
    weight_make(&w, dt, rows, cols, bits, gs);
    float *x = rnd_vec((size_t)(n * cols), 1.0f);
    double *want = malloc(sizeof(double) * (size_t)(n * rows)), *scale = malloc(sizeof(double) * (size_t)(n * rows));
    float *got = malloc(sizeof(float) * (size_t)(n * rows));
    ref_matmul(&w.t, x, n, want, scale);
    float *dx = dev_from(x, sizeof(float) * (size_t)(n * cols));
    float *dy = dev_alloc(sizeof(float) * (size_t)(n * rows));
    step_begin();
    be->ops->matmul(be, &w.t, dx, dy, n);
    step_end();
    dev_to(got, dy, sizeof(float) * (size_t)(n * rows));
    char what[96];
    snprintf(what, sizeof(what), "matmul %s q%d g%d %lldx%lld n=%d", dtype_name(dt), bits, gs,
             (long long)rows, (long long)cols, n);
    check_close(what, got, want, scale, (size_t)(n * rows), mm_tol(dt, cols, n));

    /* Rows [3, rows - 2) through weight_slice_rows: the same outputs. */
    if (rows > 8) {
        struct tensor view;
        int64_t r0 = 3, nr = rows - 5;
        be->ops->weight_slice_rows(be, &w.t, r0, nr, &view);
        step_begin();
        be->ops->matmul(be, &view, dx, dy, n);
        step_end();
        dev_to(got, dy, sizeof(float) * (size_t)(n * nr));
        double *ws = malloc(sizeof(double) * (size_t)(n * nr)), *ss = malloc(sizeof(double) * (size_t)(n * nr));
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < nr; r++) {
                ws[t * nr + r] = want[t * rows + r0 + r];
                ss[t * nr + r] = scale[t * rows + r0 + r];
            }
        snprintf(what, sizeof(what), "matmul slice %s q%d n=%d", dtype_name(dt), bits, n);
        check_close(what, got, ws, ss, (size_t)(n * nr), mm_tol(dt, cols, n));
        free(ws);
        free(ss);
    }
    dev_free(dx, sizeof(float) * (size_t)(n * cols));
    dev_free(dy, sizeof(float) * (size_t)(n * rows));
    free(x);
    free(want);
    free(scale);
    free(got);
    weight_free(&w);
}

static void test_matmul(void)
{
    static const int ns[] = {1, 3, 8, 9, 33};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(ns); i++) {
        int n = ns[i];
        /* dense: vector path (cols % 8 == 0) and scalar path (odd cols) */
        test_matmul_case(DTYPE_F32, 37, 96, 0, 0, n);
        test_matmul_case(DTYPE_F32, 19, 45, 0, 0, n);
        test_matmul_case(DTYPE_F16, 41, 136, 0, 0, n);
        test_matmul_case(DTYPE_F16, 13, 77, 0, 0, n);
        test_matmul_case(DTYPE_BF16, 67, 264, 0, 0, n);
        test_matmul_case(DTYPE_BF16, 11, 33, 0, 0, n);
        /* rows of >= 8 KiB, too many for the few-rows case: 1-row items at n = 1 (a partial
         * last round of loads: 513 chunks per row) */
        if (n <= 3) test_matmul_case(DTYPE_BF16, 2300, 4104, 0, 0, n);
        /* MLX: q4 / q8 vector paths over every group size, other widths on the scalar path */
        static const int gss[] = {32, 64, 128};
        for (size_t g = 0; g < CAIRN_ARRAY_LEN(gss); g++) {
            test_matmul_case(DTYPE_Q, 35, 256, 4, gss[g], n);
            test_matmul_case(DTYPE_Q, 29, 384, 8, gss[g], n);
        }
        /* n = 1: the pipelined q kernel over two rounds per row (4,096 rows: one item per warp
         * on 132 SMs), and over several items per warp */
        if (n == 1) {
            test_matmul_case(DTYPE_Q, 4096, 2560, 4, 64, n);
            test_matmul_case(DTYPE_Q, 4500, 512, 8, 64, n);
        }
        test_matmul_case(DTYPE_Q, 17, 128, 2, 64, n);
        test_matmul_case(DTYPE_Q, 17, 128, 3, 32, n);
        test_matmul_case(DTYPE_Q, 17, 128, 5, 32, n);
        test_matmul_case(DTYPE_Q, 17, 128, 6, 64, n);
    }
    /* cuBLASLt's algorithm is cached per bucket of row counts (cuda_matmul.c): counts of one
     * bucket in both orders (the first tunes, the others reuse it; 300 and 319 are tuned counts,
     * 40 and 43 the heuristic's), every output against the host reference */
    static const int same_bucket[] = {300, 319, 289, 40, 43, 41};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(same_bucket); i++) {
        test_matmul_case(DTYPE_BF16, 520, 264, 0, 0, same_bucket[i]);
        test_matmul_case(DTYPE_F16, 96, 136, 0, 0, same_bucket[i]);
    }
}

/* matmul_multi over count weights of cols columns (made by the caller, freed here) on n random
 * rows, each output against the host reference; what: the case's name in failures. */
static void check_matmul_multi(const char *what, struct test_weight *w, int count, int64_t cols, int n)
{
    const struct tensor *wt[4];
    float *dy[4];
    CAIRN_ASSERT(count <= 4);
    for (int i = 0; i < count; i++) {
        wt[i] = &w[i].t;
        dy[i] = dev_alloc(sizeof(float) * (size_t)(n * w[i].t.shape[0]));
    }
    float *x = rnd_vec((size_t)(n * cols), 1.0f);
    float *dx = dev_from(x, sizeof(float) * (size_t)(n * cols));
    step_begin();
    be->ops->matmul_multi(be, wt, dy, count, dx, n);
    step_end();
    for (int i = 0; i < count; i++) {
        int64_t rows = w[i].t.shape[0];
        size_t m = (size_t)(n * rows);
        double *want = malloc(m * sizeof(double)), *scale = malloc(m * sizeof(double));
        float *got = malloc(m * sizeof(float));
        ref_matmul(wt[i], x, n, want, scale);
        dev_to(got, dy[i], m * sizeof(float));
        char name[128];
        snprintf(name, sizeof(name), "%s #%d %lldx%lld n=%d", what, i, (long long)rows, (long long)cols, n);
        check_close(name, got, want, scale, m, mm_tol(wt[i]->dtype, cols, n));
        free(want);
        free(scale);
        free(got);
        dev_free(dy[i], m * sizeof(float));
        weight_free(&w[i]);
    }
    dev_free(dx, sizeof(float) * (size_t)(n * cols));
    free(x);
}

/* Weights of different dtypes in one call (each takes its own kernel). */
static void test_matmul_multi(void)
{
    struct test_weight w[3];
    const int64_t rows[3] = {24, 40, 8}, cols = 128;
    weight_make(&w[0], DTYPE_BF16, rows[0], cols, 0, 0);
    weight_make(&w[1], DTYPE_Q, rows[1], cols, 4, 64);
    weight_make(&w[2], DTYPE_F16, rows[2], cols, 0, 0);
    check_matmul_multi("matmul_multi", w, 3, cols, 5);
}

/* matmul_multi through one GEMV launch: q/k/v-like weights of one layout with row counts that
 * are not multiples of the rows a warp takes, and q4 gate/up-like pairs; n = 1, 2, 5, 8. */
static void test_gemv_fused_case(enum dtype dt, int bits, int gs, int count, const int64_t *rows, int64_t cols, int n)
{
    struct test_weight w[4];
    for (int i = 0; i < count; i++) weight_make(&w[i], dt, rows[i], cols, bits, gs);
    char what[64];
    snprintf(what, sizeof(what), "matmul_multi fused %s q%d g%d", dtype_name(dt), bits, gs);
    check_matmul_multi(what, w, count, cols, n);
}

static void test_gemv_fused(void)
{
    static const int ns[] = {1, 2, 5, 8};
    const int64_t qkv[3] = {70, 13, 13}, gu[2] = {45, 45}, many[4] = {1, 2, 3, 300};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(ns); i++) {
        test_gemv_fused_case(DTYPE_BF16, 0, 0, 3, qkv, 520, ns[i]);
        test_gemv_fused_case(DTYPE_F16, 0, 0, 4, many, 136, ns[i]);
        test_gemv_fused_case(DTYPE_Q, 4, 64, 2, gu, 1088, ns[i]);
        test_gemv_fused_case(DTYPE_Q, 8, 32, 3, qkv, 2080, ns[i]);
        test_gemv_fused_case(DTYPE_F32, 0, 0, 2, gu, 4100, ns[i]);
    }
}

/* A GEMV row's result does not depend on the batch: x row t against W gives the same bits
 * alone (n = 1), inside batches of 1..8 rows, and through matmul_multi beside another weight
 * of its layout (other rows per warp item, grid sizes, and for q8 over 14,336 columns more
 * than one launch). Speculative verification and batched == solo decoding rely on it. */
static void test_gemv_invariant_case(enum dtype dt, int64_t rows, int64_t cols, int bits, int gs)
{
    enum { NMAX = CUDA_GEMV_MAX_N_TEST };
    struct test_weight w, w2;
    weight_make(&w, dt, rows, cols, bits, gs);
    weight_make(&w2, dt, 5, cols, bits, gs);
    float *x = rnd_vec((size_t)(NMAX * cols), 1.0f);
    float *dx = dev_from(x, sizeof(float) * (size_t)(NMAX * cols));
    size_t ybytes = sizeof(float) * (size_t)(NMAX * rows);
    float *dy = dev_alloc(ybytes), *dy2 = dev_alloc(sizeof(float) * (size_t)(NMAX * 5));
    float *solo = malloc(ybytes), *got = malloc(ybytes);
    for (int t = 0; t < NMAX; t++) {
        step_begin();
        be->ops->matmul(be, &w.t, dx + (int64_t)t * cols, dy + (int64_t)t * rows, 1);
        step_end();
    }
    dev_to(solo, dy, ybytes);
    char what[96];
    for (int n = 1; n <= NMAX; n++)
        for (int multi = 0; multi <= 1; multi++) {
            const struct tensor *wt[2] = {&w.t, &w2.t};
            float *ys[2] = {dy, dy2};
            step_begin();
            if (multi) be->ops->matmul_multi(be, wt, ys, 2, dx, n);
            else be->ops->matmul(be, &w.t, dx, dy, n);
            step_end();
            dev_to(got, dy, sizeof(float) * (size_t)(n * rows));
            snprintf(what, sizeof(what), "gemv batch-invariant %s q%d g%d %lldx%lld n=%d%s", dtype_name(dt), bits, gs,
                     (long long)rows, (long long)cols, n, multi ? " multi" : "");
            CHECK_MSG(memcmp(got, solo, sizeof(float) * (size_t)(n * rows)) == 0, "%s: not bitwise the solo rows",
                      what);
        }
    dev_free(dx, sizeof(float) * (size_t)(NMAX * cols));
    dev_free(dy, ybytes);
    dev_free(dy2, sizeof(float) * (size_t)(NMAX * 5));
    free(x);
    free(solo);
    free(got);
    weight_free(&w);
    weight_free(&w2);
}

static void test_gemv_invariant(void)
{
    test_gemv_invariant_case(DTYPE_F32, 37, 96, 0, 0);
    test_gemv_invariant_case(DTYPE_F16, 41, 136, 0, 0);
    test_gemv_invariant_case(DTYPE_BF16, 67, 264, 0, 0);
    test_gemv_invariant_case(DTYPE_BF16, 11, 33, 0, 0);   /* scalar kernel */
    test_gemv_invariant_case(DTYPE_BF16, 9, 4104, 0, 0);  /* few long rows: one row per warp at n = 1 */
    test_gemv_invariant_case(DTYPE_BF16, 2300, 4104, 0, 0); /* 8 KiB rows: 1-row items, 16 loads */
    static const int gss[] = {32, 64, 128};
    for (size_t g = 0; g < CAIRN_ARRAY_LEN(gss); g++) {
        test_gemv_invariant_case(DTYPE_Q, 35, 256, 4, gss[g]);
        test_gemv_invariant_case(DTYPE_Q, 29, 384, 8, gss[g]);
    }
    test_gemv_invariant_case(DTYPE_Q, 13, 14336, 8, 64); /* 2 x rows per launch */
    /* the pipelined q kernel at n = 1 (2-row items; per warp as on 132 SMs): */
    test_gemv_invariant_case(DTYPE_Q, 4096, 2560, 4, 64); /* two rounds per row, a ragged last one */
    test_gemv_invariant_case(DTYPE_Q, 8400, 256, 4, 32);  /* two items per warp */
    test_gemv_invariant_case(DTYPE_Q, 4500, 512, 8, 64);  /* one or two items per warp */
    test_gemv_invariant_case(DTYPE_Q, 17, 128, 3, 32);   /* scalar kernel */
}

/* ---- the tensor-core kernel for 1..16 rows (cuda_gemm_small.cu) ---- */

static void test_matmul_add_case(enum dtype dt, int64_t rows, int64_t cols, int bits, int gs, int n);
static void test_matmul_fused_case(enum dtype dt, int64_t rows, int64_t cols, int bits, int gs, int n, int mode);

/* Against the host reference at the GEMM's bf16/f16 tolerance: rows that are not a multiple of
 * the 16-row tile, cols from one 32-column chunk (fewer chunks than warps) to the 8B's 14,336,
 * every n in 1..16 (one and two 8-row tiles of x); matmul_add's epilogue; matmul_multi of q/k/v
 * shapes in one launch; cols not a multiple of 32 fall back (the GEMV / cuBLASLt tolerance).
 * The small shapes take wide blocks (fewer items than SMs), 9000 rows (563 items) narrow ones;
 * at 96 columns (3 chunks) most warps of either width have no chunk. */
static void test_mma(void)
{
    static const int64_t shapes[][2] = {{67, 256}, {16, 32},   {5, 96},    {40, 4096},
                                        {300, 1056}, {21, 14336}, {9000, 96}, {9000, 544}};
    for (int n = 1; n <= CUDA_MMA_MAX_N; n++) {
        for (size_t i = 0; i < CAIRN_ARRAY_LEN(shapes); i++) {
            /* the long rows and the many rows at n = 1, 6, 11, 16 */
            if ((shapes[i][1] > 4096 || shapes[i][0] > 4096) && n % 5 != 1) continue;
            test_matmul_case(DTYPE_BF16, shapes[i][0], shapes[i][1], 0, 0, n);
            test_matmul_add_case(DTYPE_BF16, shapes[i][0], shapes[i][1], 0, 0, n);
        }
        test_matmul_case(DTYPE_F16, 45, 160, 0, 0, n);
        test_matmul_add_case(DTYPE_F16, 45, 160, 0, 0, n);
        test_matmul_case(DTYPE_BF16, 33, 272, 0, 0, n); /* 272 % 32 = 16: falls back */
        const int64_t qkv[3] = {70, 13, 13}, gu[2] = {45, 45};
        test_gemv_fused_case(DTYPE_BF16, 0, 0, 3, qkv, 512, n);
        test_gemv_fused_case(DTYPE_F16, 0, 0, 2, gu, 1024, n);
        if (n % 4 == 1)
            for (int mode = 1; mode <= 7; mode += mode == 3 ? 4 : 1) { /* norm, silu, both, offset */
                test_matmul_fused_case(DTYPE_BF16, 67, 256, 0, 0, n, mode);
                test_matmul_fused_case(DTYPE_F16, 37, 4096, 0, 0, n, mode);
            }
    }
}

/* A row's bits do not depend on the batch in the tensor-core kernel: x row t alone (n = 1) and
 * as row t of every n in 1..16, through matmul, matmul_multi beside another weight (another
 * grid) and matmul_add; matmul_fused with SwiGLU (gate/up paired per item) likewise. */
static void test_mma_invariant_case(enum dtype dt, int64_t rows, int64_t cols)
{
    enum { NMAX = CUDA_MMA_MAX_N };
    struct test_weight w, w2;
    weight_make(&w, dt, rows, cols, 0, 0);
    weight_make(&w2, dt, 37, cols, 0, 0);
    float *x = rnd_vec((size_t)(NMAX * cols), 1.0f);
    float *dx = dev_from(x, sizeof(float) * (size_t)(NMAX * cols));
    size_t ybytes = sizeof(float) * (size_t)(NMAX * rows);
    float *dy = dev_alloc(ybytes), *dy2 = dev_alloc(sizeof(float) * (size_t)(NMAX * 37)), *dh = dev_alloc(ybytes);
    float *solo = malloc(ybytes), *got = malloc(ybytes), *zeros = calloc(1, ybytes);
    for (int t = 0; t < NMAX; t++) {
        step_begin();
        be->ops->matmul(be, &w.t, dx + (int64_t)t * cols, dy + (int64_t)t * rows, 1);
        step_end();
    }
    dev_to(solo, dy, ybytes);
    char what[128];
    for (int n = 1; n <= NMAX; n++)
        for (int how = 0; how <= 2; how++) {
            const struct tensor *wt[2] = {&w.t, &w2.t};
            float *ys[2] = {dy, dy2};
            step_begin();
            if (how == 1) be->ops->matmul_multi(be, wt, ys, 2, dx, n);
            else if (how == 2) { /* y = 0 + x . W^T */
                struct cairn_err err;
                CHECK(be->ops->buf_upload(be, dy, zeros, ybytes, &err) == CAIRN_OK);
                be->ops->matmul_add(be, &w.t, dx, dy, n);
            } else be->ops->matmul(be, &w.t, dx, dy, n);
            step_end();
            dev_to(got, dy, sizeof(float) * (size_t)(n * rows));
            snprintf(what, sizeof(what), "mma batch-invariant %s %lldx%lld n=%d %s", dtype_name(dt), (long long)rows,
                     (long long)cols, n, how == 1 ? "multi" : how == 2 ? "add" : "");
            CHECK_MSG(memcmp(got, solo, sizeof(float) * (size_t)(n * rows)) == 0, "%s: not bitwise the solo rows",
                      what);
        }
    /* SwiGLU folded: w as gate, a second weight of its rows as up */
    struct test_weight wu;
    weight_make(&wu, dt, rows, cols, 0, 0);
    const struct tensor *gu[2] = {&w.t, &wu.t};
    for (int n = 0; n <= NMAX; n++) { /* n = 0: each row alone, into solo */
        for (int t = 0; t < (n ? 1 : NMAX); t++) {
            float *ys[2] = {dy + (int64_t)t * rows, dh + (int64_t)t * rows};
            struct backend_matmul_fused f = {.w = gu, .y = ys, .count = 2, .x = dx + (int64_t)t * cols, .n = n ? n : 1,
                                             .silu_mul = 1};
            step_begin();
            be->ops->matmul_fused(be, &f);
            step_end();
        }
        if (!n) {
            dev_to(solo, dy, ybytes);
            continue;
        }
        dev_to(got, dy, sizeof(float) * (size_t)(n * rows));
        CHECK_MSG(memcmp(got, solo, sizeof(float) * (size_t)(n * rows)) == 0,
                  "mma batch-invariant silu %s %lldx%lld n=%d: not bitwise the solo rows", dtype_name(dt),
                  (long long)rows, (long long)cols, n);
    }
    dev_free(dx, sizeof(float) * (size_t)(NMAX * cols));
    dev_free(dy, ybytes);
    dev_free(dh, ybytes);
    dev_free(dy2, sizeof(float) * (size_t)(NMAX * 37));
    free(x);
    free(solo);
    free(got);
    free(zeros);
    weight_free(&w);
    weight_free(&w2);
    weight_free(&wu);
}

static void test_mma_invariant(void)
{
    /* CAIRN_CUDA_MMA=0 or 2: no 1..16-row invariance; rows under 8 KiB: the GEMV's 1..8 only */
    if (!mma_takes(DTYPE_BF16, 4096, 1)) return;
    test_mma_invariant_case(DTYPE_BF16, 67, 4096);
    test_mma_invariant_case(DTYPE_BF16, 1000, 4096);
    test_mma_invariant_case(DTYPE_BF16, 19, 14336);
    test_mma_invariant_case(DTYPE_F16, 45, 4160);
    /* the cases above take wide blocks (fewer items than SMs), these narrow ones (188 and 138
     * items, beside w2's 3: more than the H200's 132 SMs) */
    test_mma_invariant_case(DTYPE_BF16, 3000, 4096);
    test_mma_invariant_case(DTYPE_F16, 2200, 4160);
}

/* ---- embed ---- */

static void test_embed_case(enum dtype dt, int64_t vocab, int64_t dim, int bits, int gs)
{
    struct test_weight w;
    weight_make(&w, dt, vocab, dim, bits, gs);
    const int32_t ids[] = {0, 5, (int32_t)vocab - 1, 5, 2, 7, 1};
    int n = (int)CAIRN_ARRAY_LEN(ids);
    int32_t *did = dev_from(ids, sizeof(ids));
    float *dout = dev_alloc(sizeof(float) * (size_t)(n * dim));
    step_begin();
    be->ops->embed(be, &w.t, did, n, dout);
    step_end();
    float *got = malloc(sizeof(float) * (size_t)(n * dim)), *row = malloc(sizeof(float) * (size_t)dim);
    double *want = malloc(sizeof(double) * (size_t)(n * dim)), *scale = malloc(sizeof(double) * (size_t)(n * dim));
    dev_to(got, dout, sizeof(float) * (size_t)(n * dim));
    for (int i = 0; i < n; i++) {
        tensor_row_to_f32(&w.t, ids[i], row);
        for (int64_t j = 0; j < dim; j++) {
            want[i * dim + j] = row[j];
            scale[i * dim + j] = 1.0 + fabs(row[j]); /* scale * code + bias may round once more or less (FMA) */
        }
    }
    char what[64];
    snprintf(what, sizeof(what), "embed %s q%d", dtype_name(dt), bits);
    check_close(what, got, want, scale, (size_t)(n * dim), 1e-6);
    free(scale);
    free(got);
    free(row);
    free(want);
    dev_free(did, sizeof(ids));
    dev_free(dout, sizeof(float) * (size_t)(n * dim));
    weight_free(&w);
}

static void test_embed(void)
{
    test_embed_case(DTYPE_F32, 11, 37, 0, 0);
    test_embed_case(DTYPE_F16, 11, 37, 0, 0);
    test_embed_case(DTYPE_BF16, 11, 37, 0, 0);
    test_embed_case(DTYPE_Q, 9, 128, 4, 32);
    test_embed_case(DTYPE_Q, 9, 128, 8, 128);
    test_embed_case(DTYPE_Q, 9, 192, 3, 64);
    test_embed_case(DTYPE_Q, 9, 128, 6, 64);
}

/* ---- element-wise and row ops ---- */

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static void test_rmsnorm_case(int rows, int dim)
{
    size_t n = (size_t)rows * dim;
    float *x = rnd_vec(n, 3.0f), *w = rnd_vec((size_t)dim, 1.0f), *got = malloc(n * 4);
    double *want = malloc(n * sizeof(double));
    float *dx = dev_from(x, n * 4), *dw = dev_from(w, (size_t)dim * 4), *dy = dev_alloc(n * 4);
    for (int variant = 0; variant < 3; variant++) {
        const float *wv = variant == 2 ? NULL : dw;
        float off = variant == 1 ? 1.0f : 0.0f;
        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
            double inv = 1.0 / sqrt(ss / dim + 1e-6);
            for (int i = 0; i < dim; i++)
                want[r * dim + i] = x[r * dim + i] * inv * (wv ? (double)w[i] + off : 1.0);
        }
        step_begin();
        be->ops->rmsnorm(be, dy, dx, wv, rows, dim, 1e-6f, off);
        step_end();
        dev_to(got, dy, n * 4);
        char what[64];
        snprintf(what, sizeof(what), "rmsnorm %dx%d variant %d", rows, dim, variant);
        check_close(what, got, want, NULL, n, 1e-5);
    }
    /* in place */
    step_begin();
    be->ops->rmsnorm(be, dx, dx, dw, rows, dim, 1e-6f, 0.0f);
    step_end();
    dev_to(got, dx, n * 4);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; i++) want[r * dim + i] = x[r * dim + i] * inv * w[i];
    }
    check_close("rmsnorm in place", got, want, NULL, n, 1e-5);
    dev_free(dx, n * 4);
    dev_free(dw, (size_t)dim * 4);
    dev_free(dy, n * 4);
    free(x);
    free(w);
    free(got);
    free(want);
}

/* The element-wise kernel (odd dims, or too wide for registers), the warp-per-row kernel
 * (head_dim rows) and the block-per-row kernel (hidden rows, widths that are not a multiple of
 * its thread count). */
static void test_rmsnorm(void)
{
    static const int cases[][2] = {{5, 77}, {33, 64}, {3, 128}, {9, 512}, {1, 2048}, {2, 4096},
                                   {3, 1028}, {1, 16384}, {1, 16388}, {2, 516}};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(cases); i++) test_rmsnorm_case(cases[i][0], cases[i][1]);
}

static void test_rope(void)
{
    const int nt = 5, nh = 3, hd = 64;
    const int32_t pos[5] = {0, 1, 17, 4095, 131071};
    size_t n = (size_t)nt * nh * hd;
    for (int rot = 32; rot <= hd; rot += 32) {
        float *x = rnd_vec(n, 1.0f), *got = malloc(n * 4), *inv = malloc(sizeof(float) * (size_t)(rot / 2));
        double *want = malloc(n * sizeof(double));
        for (int i = 0; i < rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / rot);
        for (size_t i = 0; i < n; i++) want[i] = x[i];
        for (int t = 0; t < nt; t++)
            for (int h = 0; h < nh; h++) {
                const float *v = x + ((size_t)t * nh + h) * hd;
                double *o = want + ((size_t)t * nh + h) * hd;
                for (int i = 0; i < rot / 2; i++) {
                    double ang = (double)pos[t] * inv[i];
                    double c = (float)cos(ang), s = (float)sin(ang);
                    o[i] = v[i] * c - v[i + rot / 2] * s;
                    o[i + rot / 2] = v[i + rot / 2] * c + v[i] * s;
                }
            }
        float *dx = dev_from(x, n * 4), *dinv = dev_from(inv, sizeof(float) * (size_t)(rot / 2));
        int32_t *dpos = dev_from(pos, sizeof(pos));
        step_begin();
        be->ops->rope(be, dx, nt, nh, hd, rot, dpos, dinv);
        step_end();
        dev_to(got, dx, n * 4);
        check_close(rot == hd ? "rope" : "rope partial", got, want, NULL, n, 2e-6);
        dev_free(dx, n * 4);
        dev_free(dinv, sizeof(float) * (size_t)(rot / 2));
        dev_free(dpos, sizeof(pos));
        free(x);
        free(got);
        free(inv);
        free(want);
    }
}

static void test_elementwise(void)
{
    const int rows = 7, dim = 53;
    const int64_t n = rows * dim;
    float *a = rnd_vec((size_t)n, 4.0f), *b = rnd_vec((size_t)n, 4.0f), *bias = rnd_vec((size_t)dim, 1.0f);
    float *g = rnd_vec((size_t)rows, 3.0f), *got = malloc((size_t)n * 4);
    double *want = malloc((size_t)n * sizeof(double));
    float *da = dev_from(a, (size_t)n * 4), *db = dev_from(b, (size_t)n * 4), *dy = dev_alloc((size_t)n * 4);
    float *dbias = dev_from(bias, (size_t)dim * 4), *dg = dev_from(g, (size_t)rows * 4);

    step_begin();
    be->ops->silu_mul(be, dy, da, db, n);
    step_end();
    dev_to(got, dy, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) want[i] = a[i] * ref_sigmoid(a[i]) * b[i];
    check_close("silu_mul", got, want, NULL, (size_t)n, 1e-5);

    CHECK(be->ops->buf_copy(be, dy, da, (size_t)n * 4, NULL) == CAIRN_OK);
    step_begin();
    be->ops->add(be, dy, db, n);
    be->ops->add_bias(be, dy, dbias, rows, dim);
    step_end();
    dev_to(got, dy, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) want[i] = (double)a[i] + b[i] + bias[i % dim];
    check_close("add + add_bias", got, want, NULL, (size_t)n, 1e-5);

    CHECK(be->ops->buf_copy(be, dy, da, (size_t)n * 4, NULL) == CAIRN_OK);
    step_begin();
    be->ops->mul_sigmoid(be, dy, db, n);
    step_end();
    dev_to(got, dy, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) want[i] = a[i] * ref_sigmoid(b[i]);
    check_close("mul_sigmoid", got, want, NULL, (size_t)n, 1e-5);

    CHECK(be->ops->buf_copy(be, dy, da, (size_t)n * 4, NULL) == CAIRN_OK);
    step_begin();
    be->ops->add_sigmoid_scaled(be, dy, db, dg, rows, dim);
    step_end();
    dev_to(got, dy, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) want[i] = a[i] + ref_sigmoid(g[i / dim]) * b[i];
    check_close("add_sigmoid_scaled", got, want, NULL, (size_t)n, 1e-5);

    /* split_halves over rows of 2 * 13 (n is 7 * 53: use the first 7 * 26 floats) */
    const int width = 13;
    float *h1 = dev_alloc((size_t)rows * width * 4), *h2 = dev_alloc((size_t)rows * width * 4);
    step_begin();
    be->ops->split_halves(be, h1, h2, da, rows, width);
    step_end();
    float got2[7 * 13];
    double want2[7 * 13];
    dev_to(got2, h1, sizeof(got2));
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < width; j++) want2[r * width + j] = a[r * 2 * width + j];
    check_close("split_halves a", got2, want2, NULL, CAIRN_ARRAY_LEN(got2), 0);
    dev_to(got2, h2, sizeof(got2));
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < width; j++) want2[r * width + j] = a[r * 2 * width + width + j];
    check_close("split_halves b", got2, want2, NULL, CAIRN_ARRAY_LEN(got2), 0);

    const int32_t sel[4] = {6, 0, 6, 3};
    int32_t *dsel = dev_from(sel, sizeof(sel));
    step_begin();
    be->ops->gather_rows(be, dy, da, dsel, 4, dim);
    step_end();
    dev_to(got, dy, sizeof(float) * 4 * dim);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < dim; j++) want[i * dim + j] = a[sel[i] * dim + j];
    check_close("gather_rows", got, want, NULL, (size_t)(4 * dim), 0);

    dev_free(h1, (size_t)rows * width * 4);
    dev_free(h2, (size_t)rows * width * 4);
    dev_free(dsel, sizeof(sel));
    dev_free(da, (size_t)n * 4);
    dev_free(db, (size_t)n * 4);
    dev_free(dy, (size_t)n * 4);
    dev_free(dbias, (size_t)dim * 4);
    dev_free(dg, (size_t)rows * 4);
    free(a);
    free(b);
    free(bias);
    free(g);
    free(got);
    free(want);
}

/* ---- kv_store + attention ---- */

/* Whether a step takes the tensor-core prefill kernel (cuda_attn_prefill.cu): BF16 KV, head_dim
 * 64 or 128, a GQA group of <= 64, a prefill step (>= 8 rows per sequence, > 16 rows), CAIRN_CUDA_ATTN
 * unset or auto. That kernel rounds q and the softmax weights to bf16: its reference rounds q
 * the same way, and its bound is 2^-9 of max |v| (v in [-1, 1)) for the weights plus f32
 * rounding, checked at 4e-3 of 1 + |want|. */
static int attn_flash_expected(enum dtype kdt, int hd, int group, int n_tok, int n_seqs)
{
    const char *mode = getenv("CAIRN_CUDA_ATTN");
    if (mode && strcmp(mode, "auto") != 0) return 0;
    return kdt == DTYPE_BF16 && (hd == 64 || hd == 128) && group <= 64 && n_tok >= 8 * n_seqs &&
           n_tok > CUDA_ATTN_EXACT_ROWS; /* smaller steps stay on split-K (batch invariance) */
}
#define ATTN_FLASH_TOL 4e-3

/* Sequences s with ctx[s] positions, whose last rows[s] are the step's query rows; all their
 * K/V are stored in one kv_store (the earlier positions stand for a cached prefix). */
static void test_attn_case(enum dtype kdt, int hd, int n_heads, int n_kv, int block_size, int n_seqs,
                           const int *ctx, const int *rows)
{
    const int n_layers = 2, layer = 1;
    int bt_stride = 0, n_blocks = 0, n_tok = 0, n_kvtok = 0, max_ctx = 0;
    for (int s = 0; s < n_seqs; s++) {
        int nb = (ctx[s] + block_size - 1) / block_size;
        max_ctx = CAIRN_MAX(max_ctx, ctx[s]);
        bt_stride = CAIRN_MAX(bt_stride, nb);
        n_blocks += nb;
        n_tok += rows[s];
        n_kvtok += ctx[s];
    }
    n_blocks += 3; /* unused blocks too */
    size_t esz = dtype_size(kdt);
    struct backend_kv_view kv = {
        .n_blocks = n_blocks, .n_layers = n_layers, .block_size = block_size, .n_kv_heads = n_kv,
        .head_dim = hd, .dtype = kdt,
    };
    kv.layer_block_bytes = (size_t)block_size * n_kv * hd * esz;
    kv.block_bytes = kv.layer_block_bytes * n_layers;
    size_t pool_bytes = kv.block_bytes * (size_t)n_blocks;
    kv.k = dev_alloc(pool_bytes);
    kv.v = dev_alloc(pool_bytes);
    uint8_t *hk = calloc(1, pool_bytes), *hv = calloc(1, pool_bytes);

    /* Block tables: a shuffled permutation of the pool. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rnd_u32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *bt = calloc((size_t)n_seqs * bt_stride, sizeof(int32_t));
    for (int s = 0, used = 0; s < n_seqs; s++)
        for (int j = 0; j < (ctx[s] + block_size - 1) / block_size; j++) bt[s * bt_stride + j] = perm[used++];

    /* K/V of every position; slots; the reference pool built on the host. */
    int row_f = n_kv * hd;
    float *k = rnd_vec((size_t)n_kvtok * row_f, 1.0f), *v = rnd_vec((size_t)n_kvtok * row_f, 1.0f);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)n_kvtok);
    for (int s = 0, t = 0; s < n_seqs; s++)
        for (int p = 0; p < ctx[s]; p++, t++) {
            int blk = bt[s * bt_stride + p / block_size], off = p % block_size;
            slots[t] = blk * block_size + off;
            size_t at = (size_t)blk * kv.block_bytes + (size_t)layer * kv.layer_block_bytes;
            for (int e = 0; e < row_f; e++) {
                size_t idx = (size_t)off * row_f + e;
                float kf = k[(size_t)t * row_f + e], vf = v[(size_t)t * row_f + e];
                if (kdt == DTYPE_F32) {
                    ((float *)(hk + at))[idx] = kf;
                    ((float *)(hv + at))[idx] = vf;
                } else {
                    ((uint16_t *)(hk + at))[idx] = f32_to_bf16(kf);
                    ((uint16_t *)(hv + at))[idx] = f32_to_bf16(vf);
                }
            }
        }
    float *dk = dev_from(k, sizeof(float) * (size_t)n_kvtok * row_f);
    float *dv = dev_from(v, sizeof(float) * (size_t)n_kvtok * row_f);
    int32_t *dslots = dev_from(slots, sizeof(int32_t) * (size_t)n_kvtok);
    step_begin();
    be->ops->kv_store(be, &kv, layer, dslots, n_kvtok, dk, dv);
    step_end();
    uint8_t *gk = malloc(pool_bytes), *gv = malloc(pool_bytes);
    dev_to(gk, kv.k, pool_bytes);
    dev_to(gv, kv.v, pool_bytes);
    CHECK_MSG(memcmp(gk, hk, pool_bytes) == 0 && memcmp(gv, hv, pool_bytes) == 0,
              "kv_store %s: pool differs from the reference", dtype_name(kdt));

    /* Query rows and their metadata. */
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_tok), *seq_off = malloc(sizeof(int32_t) * (size_t)(n_seqs + 1));
    int32_t *ctx_len = malloc(sizeof(int32_t) * (size_t)n_seqs);
    seq_off[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < rows[s]; i++) pos[seq_off[s] + i] = ctx[s] - rows[s] + i;
        seq_off[s + 1] = seq_off[s] + rows[s];
        ctx_len[s] = ctx[s];
    }
    size_t qn = (size_t)n_tok * n_heads * hd;
    float *q = rnd_vec(qn, 1.0f), *got = malloc(qn * 4);
    double *want = malloc(qn * sizeof(double)), *p = malloc(sizeof(double) * (size_t)max_ctx);
    float scale = 1.0f / sqrtf((float)hd);
    int group = n_heads / n_kv;
    int flash = attn_flash_expected(kdt, hd, group, n_tok, n_seqs);
    float *qref = malloc(qn * 4); /* q as the kernel reads it */
    for (size_t i = 0; i < qn; i++) qref[i] = flash ? bf16_to_f32(f32_to_bf16(q[i])) : q[i];
    for (int s = 0; s < n_seqs; s++)
        for (int r = seq_off[s]; r < seq_off[s + 1]; r++)
            for (int h = 0; h < n_heads; h++) {
                const float *qr = qref + ((size_t)r * n_heads + h) * hd;
                double m = -INFINITY, l = 0;
                for (int pp = 0; pp <= pos[r]; pp++) {
                    int blk = bt[s * bt_stride + pp / block_size], off = pp % block_size;
                    size_t at = (size_t)blk * kv.block_bytes + (size_t)layer * kv.layer_block_bytes;
                    double dot = 0;
                    for (int d = 0; d < hd; d++) {
                        size_t idx = ((size_t)off * n_kv + h / group) * hd + d;
                        double kk = kdt == DTYPE_F32 ? ((float *)(hk + at))[idx] : bf16_to_f32(((uint16_t *)(hk + at))[idx]);
                        dot += qr[d] * kk;
                    }
                    p[pp] = dot * scale;
                    m = fmax(m, p[pp]);
                }
                double *o = want + ((size_t)r * n_heads + h) * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int pp = 0; pp <= pos[r]; pp++) {
                    int blk = bt[s * bt_stride + pp / block_size], off = pp % block_size;
                    size_t at = (size_t)blk * kv.block_bytes + (size_t)layer * kv.layer_block_bytes;
                    double e = exp(p[pp] - m);
                    l += e;
                    for (int d = 0; d < hd; d++) {
                        size_t idx = ((size_t)off * n_kv + h / group) * hd + d;
                        double vv = kdt == DTYPE_F32 ? ((float *)(hv + at))[idx] : bf16_to_f32(((uint16_t *)(hv + at))[idx]);
                        o[d] += e * vv;
                    }
                }
                for (int d = 0; d < hd; d++) o[d] /= l;
            }
    float *dq = dev_from(q, qn * 4), *dout = dev_alloc(qn * 4);
    int32_t *dpos = dev_from(pos, sizeof(int32_t) * (size_t)n_tok);
    int32_t *dso = dev_from(seq_off, sizeof(int32_t) * (size_t)(n_seqs + 1));
    int32_t *dbt = dev_from(bt, sizeof(int32_t) * (size_t)n_seqs * bt_stride);
    struct backend_attn a = {
        .q = dq, .out = dout, .n_tokens = n_tok, .n_seqs = n_seqs, .n_heads = n_heads, .pos = dpos,
        .seq_off = dso, .block_tables = dbt, .bt_stride = bt_stride, .seq_off_host = seq_off,
        .ctx_len_host = ctx_len, .kv = &kv, .layer = layer, .scale = scale,
    };
    /* three times (with graphs on: eager, captured, replayed); the decode kernel's counters are
     * back to 0 after each call */
    for (int rep = 0; rep < 3; rep++) {
        if (rep) {
            float *nan = malloc(qn * 4);
            for (size_t i = 0; i < qn; i++) nan[i] = NAN;
            struct cairn_err err;
            CHECK(be->ops->buf_upload(be, dout, nan, qn * 4, &err) == CAIRN_OK);
            free(nan);
        }
        step_begin();
        be->ops->attention(be, &a);
        step_end();
    }
    dev_to(got, dout, qn * 4);
    char what[160];
    const char *mode = getenv("CAIRN_CUDA_ATTN"), *dec = getenv("CAIRN_CUDA_ATTN_DEC");
    snprintf(what, sizeof(what), "attention[%s, dec %s] %s hd=%d heads=%d/%d bs=%d seqs=%d rows=%d",
             mode ? mode : "auto", dec ? dec : "default", dtype_name(kdt), hd, n_heads, n_kv, block_size, n_seqs,
             n_tok);
    check_close(what, got, want, NULL, qn, flash ? ATTN_FLASH_TOL : 2e-5);
    free(qref);

    dev_free(dq, qn * 4);
    dev_free(dout, qn * 4);
    dev_free(dpos, sizeof(int32_t) * (size_t)n_tok);
    dev_free(dso, sizeof(int32_t) * (size_t)(n_seqs + 1));
    dev_free(dbt, sizeof(int32_t) * (size_t)n_seqs * bt_stride);
    dev_free(dk, sizeof(float) * (size_t)n_kvtok * row_f);
    dev_free(dv, sizeof(float) * (size_t)n_kvtok * row_f);
    dev_free(dslots, sizeof(int32_t) * (size_t)n_kvtok);
    dev_free(kv.k, pool_bytes);
    dev_free(kv.v, pool_bytes);
    free(hk);
    free(hv);
    free(gk);
    free(gv);
    free(perm);
    free(bt);
    free(k);
    free(v);
    free(slots);
    free(pos);
    free(seq_off);
    free(ctx_len);
    free(q);
    free(got);
    free(want);
    free(p);
}

/* Reopens the backend with the variable `name` = value (NULL: unset, the default). */
static void reopen_with_env(const char *name, const char *value)
{
    struct cairn_err err;
    be->ops->destroy(be);
    be = NULL;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    int st = cuda_backend_open(0, &be, &err);
    if (st != CAIRN_OK) {
        fprintf(stderr, "reopen: %s\n", err.msg);
        exit(1);
    }
}

/* Reopens the backend with CAIRN_CUDA_ATTN=mode (NULL: the default). */
static void reopen_with_attn(const char *mode)
{
    reopen_with_env("CAIRN_CUDA_ATTN", mode);
}

static void test_attention(void)
{
    /* each case through the default choice, then forced split-K, then forced tiled */
    static const char *const modes[] = {NULL, "split", "tiled"};
    for (int i = 0; i < 6; i++) {
        if (i % 2 == 0) reopen_with_attn(modes[i / 2]);
        enum dtype kdt = i % 2 ? DTYPE_BF16 : DTYPE_F32;
        /* prefill from 0, a decode row deep in its context, a chunk over a cached prefix */
        const int ctx3[3] = {37, 301, 25}, rows3[3] = {37, 1, 5};
        test_attn_case(kdt, 64, 6, 2, 16, 3, ctx3, rows3);
        /* many rows: one split per row */
        const int ctx1[1] = {100}, rows1[1] = {100};
        test_attn_case(kdt, 64, 6, 2, 16, 1, ctx1, rows1);
        /* long decode: split-K over several splits; odd head_dim and block size; MHA */
        const int ctxd[2] = {1001, 700}, rowsd[2] = {1, 1};
        test_attn_case(kdt, 80, 4, 4, 5, 2, ctxd, rowsd);
        test_attn_case(kdt, 128, 8, 1, 16, 2, ctxd, rowsd);
        /* K rows not 16-byte aligned: the element-wise loads */
        test_attn_case(kdt, 34, 4, 2, 16, 3, ctx3, rows3);
    }
    reopen_with_attn(NULL);
}

/* Prefill chunks for the tensor-core kernel (and, with F32 KV or CAIRN_CUDA_ATTN=tiled, the
 * f32 tiled kernel on the same cases): chunks of >= 64 and >= 128 queries, cached prefixes that
 * end inside a block, head_dim 64/128, GQA groups 1, 3, 4, 8, odd block sizes, several
 * sequences in one call (one with decode rows beside a chunk), contexts of several KV tiles. */
static void test_attn_prefill(void)
{
    static const char *const modes[] = {NULL, "tiled"};
    for (int mi = 0; mi < 2; mi++) {
        reopen_with_attn(modes[mi]);
        for (int i = 0; i < 2; i++) {
            enum dtype kdt = i ? DTYPE_F32 : DTYPE_BF16;
            /* GQA 4, hd 128: a 128-query chunk over a 172-position prefix (172 % 16 = 12) */
            const int c1[1] = {300}, r1[1] = {128};
            test_attn_case(kdt, 128, 32, 8, 16, 1, c1, r1);
            /* MHA, hd 64: two sequences, a 64-query chunk over 136 and a whole 97-token prompt */
            const int c2[2] = {200, 97}, r2[2] = {64, 97};
            test_attn_case(kdt, 64, 8, 8, 16, 2, c2, r2);
            /* GQA 8, hd 128, block 32: three sequences (prefix 387 % 32 = 3, 1, 0) */
            const int c3[3] = {517, 130, 64}, r3[3] = {130, 129, 64};
            test_attn_case(kdt, 128, 8, 1, 32, 3, c3, r3);
            /* GQA 4, hd 64, block 7: a 256-query chunk deep in a 1000-position context */
            const int c4[1] = {1000}, r4[1] = {256};
            test_attn_case(kdt, 64, 16, 4, 7, 1, c4, r4);
            /* GQA 3 (21 tokens per tile), hd 128: tiles end inside the chunks */
            const int c5[2] = {150, 70}, r5[2] = {150, 70};
            test_attn_case(kdt, 128, 6, 2, 16, 2, c5, r5);
            /* a 200-query chunk beside two decode rows in one step */
            const int c6[3] = {400, 90, 33}, r6[3] = {200, 1, 1};
            test_attn_case(kdt, 128, 16, 4, 16, 3, c6, r6);
        }
    }
    reopen_with_attn(NULL);
}

/* The decode kernel (BF16 KV, head_dim 64/128, 1/2/4/8 query heads per KV head): contexts of
 * one position, of one partial pass, of several passes per split and of many splits; a batch
 * where some rows need one split and others many; a short chunk (3 rows) through split-K; the
 * model shapes (8B, 1B, Qwen3-30B-A3B) about the context where the fast version's fixed
 * one-pass splits end (32 passes: 1024 positions at head_dim 128, 2048 at 64), and a long
 * context of many passes per split. */
static void test_attn_decode_case(void)
{
    const int ctx3[3] = {1, 600, 77}, rows3[3] = {1, 1, 1};
    test_attn_case(DTYPE_BF16, 64, 8, 2, 16, 3, ctx3, rows3);
    const int ctx2[2] = {4000, 33}, rows2[2] = {1, 1};
    test_attn_case(DTYPE_BF16, 128, 8, 4, 16, 2, ctx2, rows2);
    const int ctx1[1] = {130}, rows1[1] = {1};
    test_attn_case(DTYPE_BF16, 64, 4, 4, 5, 1, ctx1, rows1);
    test_attn_case(DTYPE_BF16, 128, 16, 2, 16, 1, ctx1, rows1);
    const int ctxc[2] = {200, 9}, rowsc[2] = {3, 2};
    test_attn_case(DTYPE_BF16, 64, 8, 2, 16, 2, ctxc, rowsc);
    int ctx8[8], rows8[8];
    for (int i = 0; i < 8; i++) {
        ctx8[i] = 50 + 211 * i;
        rows8[i] = 1;
    }
    test_attn_case(DTYPE_BF16, 64, 32, 8, 16, 8, ctx8, rows8);
    const int ctxm[3] = {600, 1, 33}, rowsm[3] = {1, 1, 1};
    test_attn_case(DTYPE_BF16, 128, 32, 4, 16, 3, ctxm, rowsm); /* group 8 */
    const int ctxf[2] = {1024, 640}, ctxp[3] = {1025, 97, 1024}, rowsp[3] = {1, 1, 1};
    test_attn_case(DTYPE_BF16, 128, 32, 8, 16, 2, ctxf, rowsp); /* fixed one-pass splits */
    test_attn_case(DTYPE_BF16, 128, 32, 8, 16, 3, ctxp, rowsp); /* per-row splits */
    const int ctx1b[2] = {2048, 5}, ctx1p[2] = {2049, 2048};
    test_attn_case(DTYPE_BF16, 64, 32, 8, 16, 2, ctx1b, rowsp);
    test_attn_case(DTYPE_BF16, 64, 32, 8, 16, 2, ctx1p, rowsp);
    const int ctxl[1] = {20000};
    test_attn_case(DTYPE_BF16, 64, 8, 2, 16, 1, ctxl, rowsp); /* 10 passes per split, 32 splits */
    const int ctxg[3] = {300, 700, 3}, rowsg[3] = {2, 1, 3}; /* rows of sequence r are not row r */
    test_attn_case(DTYPE_BF16, 128, 16, 4, 16, 3, ctxg, rowsg);
}

/* test_attn_decode_case with each version of the decode kernel (CAIRN_CUDA_ATTN_DEC). */
static void test_attn_decode(void)
{
    static const char *const decs[] = {NULL, "tuned", "legacy"};
    for (int i = 0; i < 3; i++) {
        reopen_with_env("CAIRN_CUDA_ATTN_DEC", decs[i]);
        test_attn_decode_case();
    }
    reopen_with_env("CAIRN_CUDA_ATTN_DEC", NULL);
}

/* ---- decode attention replayed for other contexts (what CUDA graphs do) ----
 * A graph of a decode step is captured once and replayed while the contexts change within
 * their bucket (cuda_attn_ctx_bucket): the launch's split plan is the bucket's (for a context
 * up to 255 positions longer than the real one), the real lengths are device data, and the
 * record drops the block-table stride of a sequence alone. Each case runs n_steps steps over the same
 * buffers, step i with the contexts ctx[i * n_seqs + s] (one bucket) and `rows` query rows per
 * sequence (its last positions), each checked against the host reference of its own inputs:
 * with graphs on, step 0 runs eagerly, step 1 is captured, the others replay it for shorter
 * and longer contexts. A sequence's table row holds its blocks up to the step's context and
 * garbage (huge block ids) past it, up to the stride of the longest step. zero_stride passes a
 * sequence alone with bt_stride 0, as the graph record does, with graphs off too. */
static void test_attn_replay_case(enum dtype kdt, int hd, int n_heads, int n_kv, int block_size, int n_seqs,
                                  int rows, int n_steps, const int *ctx, int zero_stride)
{
    const int n_layers = 2, layer = 1;
    int *cap = calloc((size_t)n_seqs, sizeof(int)), *t0 = malloc(sizeof(int) * (size_t)n_seqs);
    int bt_stride = 0, n_blocks = 3, n_kvtok = 0, max_cap = 0; /* 3 blocks no table names */
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < n_steps; i++) cap[s] = CAIRN_MAX(cap[s], ctx[i * n_seqs + s]);
        int nb = (cap[s] + block_size - 1) / block_size;
        bt_stride = CAIRN_MAX(bt_stride, nb);
        n_blocks += nb;
        t0[s] = n_kvtok;
        n_kvtok += cap[s];
        max_cap = CAIRN_MAX(max_cap, cap[s]);
    }
    struct backend_kv_view kv = {
        .n_blocks = n_blocks, .n_layers = n_layers, .block_size = block_size, .n_kv_heads = n_kv,
        .head_dim = hd, .dtype = kdt,
    };
    kv.layer_block_bytes = (size_t)block_size * n_kv * hd * dtype_size(kdt);
    kv.block_bytes = kv.layer_block_bytes * n_layers;
    size_t pool_bytes = kv.block_bytes * (size_t)n_blocks;
    kv.k = dev_alloc(pool_bytes);
    kv.v = dev_alloc(pool_bytes);
    /* each sequence's blocks: a shuffled permutation of the pool */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(rnd_u32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)n_seqs * bt_stride); /* [s][j] */
    for (int s = 0, used = 0; s < n_seqs; s++)
        for (int j = 0; j < bt_stride; j++)
            blocks[s * bt_stride + j] = j < (cap[s] + block_size - 1) / block_size ? perm[used++] : -1;
    int kv_f = n_kv * hd;
    float *k = rnd_vec((size_t)n_kvtok * kv_f, 1.0f), *v = rnd_vec((size_t)n_kvtok * kv_f, 1.0f);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)n_kvtok);
    for (int s = 0; s < n_seqs; s++)
        for (int p = 0; p < cap[s]; p++) {
            slots[t0[s] + p] = blocks[s * bt_stride + p / block_size] * block_size + p % block_size;
            if (kdt == DTYPE_BF16) /* the values the pool holds */
                for (int e = 0; e < kv_f; e++) {
                    size_t i = (size_t)(t0[s] + p) * kv_f + e;
                    k[i] = bf16_to_f32(f32_to_bf16(k[i]));
                    v[i] = bf16_to_f32(f32_to_bf16(v[i]));
                }
        }
    float *dk = dev_from(k, sizeof(float) * (size_t)n_kvtok * kv_f);
    float *dv = dev_from(v, sizeof(float) * (size_t)n_kvtok * kv_f);
    int32_t *dslots = dev_from(slots, sizeof(int32_t) * (size_t)n_kvtok);
    step_begin();
    be->ops->kv_store(be, &kv, layer, dslots, n_kvtok, dk, dv);
    step_end();

    /* the step's buffers, host and device, the same in every step (a graph's record holds them) */
    int n_tok = n_seqs * rows;
    size_t qn = (size_t)n_tok * n_heads * hd;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_tok), *seq_off = malloc(sizeof(int32_t) * (size_t)(n_seqs + 1));
    int32_t *ctx_len = malloc(sizeof(int32_t) * (size_t)n_seqs), *bt = malloc(sizeof(int32_t) * (size_t)n_seqs * bt_stride);
    float *got = malloc(qn * 4), *nan = malloc(qn * 4);
    double *want = malloc(qn * sizeof(double)), *p = malloc(sizeof(double) * (size_t)max_cap);
    for (size_t i = 0; i < qn; i++) nan[i] = NAN;
    for (int s = 0; s <= n_seqs; s++) seq_off[s] = s * rows;
    float *dq = dev_alloc(qn * 4), *dout = dev_alloc(qn * 4);
    int32_t *dpos = dev_alloc(sizeof(int32_t) * (size_t)n_tok), *dso = dev_from(seq_off, sizeof(int32_t) * (size_t)(n_seqs + 1));
    int32_t *dbt = dev_alloc(sizeof(int32_t) * (size_t)n_seqs * bt_stride);
    struct backend_attn a = {
        .q = dq, .out = dout, .n_tokens = n_tok, .n_seqs = n_seqs, .n_heads = n_heads, .pos = dpos,
        .seq_off = dso, .block_tables = dbt, .bt_stride = n_seqs == 1 && zero_stride ? 0 : bt_stride,
        .seq_off_host = seq_off, .ctx_len_host = ctx_len, .kv = &kv, .layer = layer, .scale = 1.0f / sqrtf((float)hd),
    };
    const char *dec = getenv("CAIRN_CUDA_ATTN_DEC");
    int group = n_heads / n_kv;
    uint64_t l0 = 0, c0 = 0, e0 = 0, l1, c1, e1;
    for (int step = -1; step < n_steps; step++) { /* step -1: step 0's inputs, unchecked */
        const int *cs = ctx + (step < 0 ? 0 : step) * n_seqs;
        for (int s = 0; s < n_seqs; s++) {
            CAIRN_ASSERT(cs[s] >= rows);
            ctx_len[s] = cs[s];
            for (int i = 0; i < rows; i++) pos[s * rows + i] = cs[s] - rows + i;
            int nb = (cs[s] + block_size - 1) / block_size;
            for (int j = 0; j < bt_stride; j++) /* past the context: ids far past the pool */
                bt[s * bt_stride + j] = j < nb ? blocks[s * bt_stride + j] : 0x3fffff00 + j;
        }
        float *q = rnd_vec(qn, 1.0f);
        struct cairn_err err;
        CHECK(be->ops->buf_upload(be, dq, q, qn * 4, &err) == CAIRN_OK);
        CHECK(be->ops->buf_upload(be, dpos, pos, sizeof(int32_t) * (size_t)n_tok, &err) == CAIRN_OK);
        CHECK(be->ops->buf_upload(be, dbt, bt, sizeof(int32_t) * (size_t)n_seqs * bt_stride, &err) == CAIRN_OK);
        CHECK(be->ops->buf_upload(be, dout, nan, qn * 4, &err) == CAIRN_OK);
        step_begin();
        be->ops->attention(be, &a);
        step_end();
        if (step < 0) { /* the workspace has grown (which drops the graphs); drop them again so
                         * that step 0 runs eagerly, step 1 is captured, the others replay */
            dev_free(dev_alloc(256), 256);
            cuda_graphs_counts(be, &l0, &c0, &e0);
            free(q);
            continue;
        }
        dev_to(got, dout, qn * 4);
        for (int r = 0; r < n_tok; r++)
            for (int h = 0; h < n_heads; h++) {
                int s = r / rows, kvh = h / group;
                const float *qr = q + ((size_t)r * n_heads + h) * hd;
                double m = -INFINITY, l = 0, *o = want + ((size_t)r * n_heads + h) * hd;
                for (int pp = 0; pp <= pos[r]; pp++) {
                    const float *kr = k + ((size_t)(t0[s] + pp) * n_kv + kvh) * hd;
                    double dot = 0;
                    for (int d = 0; d < hd; d++) dot += (double)qr[d] * kr[d];
                    p[pp] = dot * a.scale;
                    m = fmax(m, p[pp]);
                }
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int pp = 0; pp <= pos[r]; pp++) {
                    const float *vr = v + ((size_t)(t0[s] + pp) * n_kv + kvh) * hd;
                    double e = exp(p[pp] - m);
                    l += e;
                    for (int d = 0; d < hd; d++) o[d] += e * vr[d];
                }
                for (int d = 0; d < hd; d++) o[d] /= l;
            }
        char what[192];
        snprintf(what, sizeof(what), "attention replay [dec %s] %s hd=%d heads=%d/%d bs=%d seqs=%d rows=%d%s step %d ctx0=%d",
                 dec ? dec : "default", dtype_name(kdt), hd, n_heads, n_kv, block_size, n_seqs, rows,
                 a.bt_stride ? "" : " stride 0", step, cs[0]);
        check_close(what, got, want, NULL, qn, 2e-5);
        free(q);
    }
    cuda_graphs_counts(be, &l1, &c1, &e1);
    const char *env = getenv("CAIRN_CUDA_GRAPHS");
    if (!(env && strcmp(env, "0") == 0)) { /* the steps after the capture were replays */
        CHECK_EQ_INT((long long)(e1 - e0), 1);
        CHECK_EQ_INT((long long)(c1 - c0), 1);
        CHECK_EQ_INT((long long)(l1 - l0), n_steps - 2);
    }
    dev_free(dq, qn * 4);
    dev_free(dout, qn * 4);
    dev_free(dpos, sizeof(int32_t) * (size_t)n_tok);
    dev_free(dso, sizeof(int32_t) * (size_t)(n_seqs + 1));
    dev_free(dbt, sizeof(int32_t) * (size_t)n_seqs * bt_stride);
    dev_free(dk, sizeof(float) * (size_t)n_kvtok * kv_f);
    dev_free(dv, sizeof(float) * (size_t)n_kvtok * kv_f);
    dev_free(dslots, sizeof(int32_t) * (size_t)n_kvtok);
    dev_free(kv.k, pool_bytes);
    dev_free(kv.v, pool_bytes);
    free(cap);
    free(t0);
    free(perm);
    free(blocks);
    free(k);
    free(v);
    free(slots);
    free(pos);
    free(seq_off);
    free(ctx_len);
    free(bt);
    free(got);
    free(nan);
    free(want);
    free(p);
}

/* The replay cases for both KV dtypes (F32: the generic split-K kernel): contexts in one bucket
 * shorter and longer than the captured step's, up to the bucket's end and down to its first
 * position, hd 64 and 128, one sequence (with its stride and with 0, as the graph record
 * passes it) and several, a 4-row verify chunk, a step of more rows than CUDA_ATTN_EXACT_ROWS
 * (a plan for throughput), buckets with the fast kernel's fixed one-pass splits and beyond. */
static void test_attn_replay_cases(int with_f32)
{
    for (int i = 0; i < 2; i++) {
        enum dtype kdt = i ? DTYPE_F32 : DTYPE_BF16;
        if (i && !with_f32) break;
        const int c1[6] = {600, 530, 700, 513, 768, 640}; /* bucket 768 */
        for (int z = 0; z < 2; z++) test_attn_replay_case(kdt, 128, 32, 8, 16, 1, 1, 6, c1, z);
        const int c2[5] = {130, 100, 256, 1, 190}; /* bucket 256 */
        test_attn_replay_case(kdt, 64, 8, 2, 5, 1, 1, 5, c2, 1);
        const int c3[4] = {1500, 1300, 1536, 1281}; /* bucket 1536: hd 64 fixed splits */
        test_attn_replay_case(kdt, 64, 32, 8, 16, 1, 1, 4, c3, 1);
        const int c4[4] = {900, 800, 1024, 769}; /* a 4-row chunk, group 8 */
        test_attn_replay_case(kdt, 128, 16, 2, 16, 1, 4, 4, c4, 1);
        const int c5[4 * 3] = {600, 40, 300, 530, 41, 301, 700, 1, 299, 768, 100, 513};
        test_attn_replay_case(kdt, 128, 32, 8, 16, 3, 1, 4, c5, 0);
        const int c6[3 * 3] = {2100, 5, 700, 2200, 6, 701, 2049, 300, 2}; /* bucket 2304: per-row splits */
        test_attn_replay_case(kdt, 64, 32, 8, 16, 3, 1, 3, c6, 0);
        enum { NB = CUDA_ATTN_EXACT_ROWS + 4, NS = 4 };
        int c7[NS * NB];
        for (int st = 0; st < NS; st++)
            for (int s = 0; s < NB; s++) c7[st * NB + s] = s == 0 ? 260 + 80 * st : 1 + (37 * s + 11 * st) % 500;
        test_attn_replay_case(kdt, 128, 8, 2, 16, NB, 1, NS, c7, 0);
    }
}

/* The replay cases with each version of the decode kernel (F32 KV once: it takes none). */
static void test_attn_replay(void)
{
    static const char *const decs[] = {"fast", "tuned", "legacy"};
    for (int i = 0; i < 3; i++) {
        reopen_with_env("CAIRN_CUDA_ATTN_DEC", decs[i]);
        test_attn_replay_cases(i == 0);
    }
    reopen_with_env("CAIRN_CUDA_ATTN_DEC", NULL);
}

/* ---- batch invariance of attention (issue 20: greedy equal with and without speculation) ----
 * Steps of at most CUDA_ATTN_EXACT_ROWS rows plan their splits per row (cuda_attn.cu), so a
 * row's output must be the same bits alone, beside other sequences of other lengths, and as row
 * j of a chunk (a verify chunk of k + 1 rows), for both KV dtypes and the decode kernel's and the
 * generic kernel's shapes. One pool holds n_seqs sequences; each call picks rows out of them. */
struct attn_inv_pool {
    struct backend_kv_view kv;
    int n_seqs, bt_stride, layer;
    const int *ctx;
    int32_t *bt;      /* host [n_seqs][bt_stride] */
    size_t pool_bytes;
};

/* The q row of (sequence s, position p): the same values in every call that asks for it. */
static void attn_inv_q(int s, int p, int n, float *q)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)s << 32 | (uint32_t)p);
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        q[i] = (float)((double)(uint32_t)(x >> 33) / 2147483648.0 - 1.0);
    }
}

/* Attention over rows (seq[i], first[i] .. first[i] + n[i] - 1) for i < n_parts; out_host gets
 * [rows][n_heads * hd]. */
static void attn_inv_call(struct attn_inv_pool *P, int n_heads, int n_parts, const int *seq,
                          const int *first, const int *n, float *out_host)
{
    int hd = P->kv.head_dim, n_tok = 0, row_f = n_heads * hd;
    for (int i = 0; i < n_parts; i++) n_tok += n[i];
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_tok), *so = malloc(sizeof(int32_t) * (size_t)(n_parts + 1));
    int32_t *ctx_len = malloc(sizeof(int32_t) * (size_t)n_parts);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)n_parts * P->bt_stride);
    float *q = malloc(sizeof(float) * (size_t)n_tok * row_f);
    so[0] = 0;
    for (int i = 0; i < n_parts; i++) {
        for (int j = 0; j < n[i]; j++) {
            int p = first[i] + j, r = so[i] + j;
            pos[r] = p;
            attn_inv_q(seq[i], p, row_f, q + (size_t)r * row_f);
        }
        so[i + 1] = so[i] + n[i];
        ctx_len[i] = first[i] + n[i];
        memcpy(bt + (size_t)i * P->bt_stride, P->bt + (size_t)seq[i] * P->bt_stride, sizeof(int32_t) * P->bt_stride);
    }
    float *dq = dev_from(q, sizeof(float) * (size_t)n_tok * row_f), *dout = dev_alloc(sizeof(float) * (size_t)n_tok * row_f);
    int32_t *dpos = dev_from(pos, sizeof(int32_t) * (size_t)n_tok);
    int32_t *dso = dev_from(so, sizeof(int32_t) * (size_t)(n_parts + 1));
    int32_t *dbt = dev_from(bt, sizeof(int32_t) * (size_t)n_parts * P->bt_stride);
    struct backend_attn a = {
        .q = dq, .out = dout, .n_tokens = n_tok, .n_seqs = n_parts, .n_heads = n_heads, .pos = dpos,
        .seq_off = dso, .block_tables = dbt, .bt_stride = P->bt_stride, .seq_off_host = so,
        .ctx_len_host = ctx_len, .kv = &P->kv, .layer = P->layer, .scale = 1.0f / sqrtf((float)hd),
    };
    step_begin();
    be->ops->attention(be, &a);
    step_end();
    dev_to(out_host, dout, sizeof(float) * (size_t)n_tok * row_f);
    dev_free(dq, sizeof(float) * (size_t)n_tok * row_f);
    dev_free(dout, sizeof(float) * (size_t)n_tok * row_f);
    dev_free(dpos, sizeof(int32_t) * (size_t)n_tok);
    dev_free(dso, sizeof(int32_t) * (size_t)(n_parts + 1));
    dev_free(dbt, sizeof(int32_t) * (size_t)n_parts * P->bt_stride);
    free(pos);
    free(so);
    free(ctx_len);
    free(bt);
    free(q);
}

static void test_attn_invariance_case(enum dtype kdt, int hd, int n_heads, int n_kv)
{
    enum { NS = 8 };
    static const int ctx[NS] = {700, 37, 1500, 256, 3000, 90, 1200, 513};
    const int block_size = 16, n_layers = 2;
    struct attn_inv_pool P = {.n_seqs = NS, .layer = 1, .ctx = ctx};
    int n_blocks = 0;
    for (int s = 0; s < NS; s++) {
        int nb = (ctx[s] + block_size - 1) / block_size;
        P.bt_stride = CAIRN_MAX(P.bt_stride, nb);
        n_blocks += nb;
    }
    size_t esz = dtype_size(kdt);
    P.kv = (struct backend_kv_view){.n_blocks = n_blocks, .n_layers = n_layers, .block_size = block_size,
                                    .n_kv_heads = n_kv, .head_dim = hd, .dtype = kdt};
    P.kv.layer_block_bytes = (size_t)block_size * n_kv * hd * esz;
    P.kv.block_bytes = P.kv.layer_block_bytes * n_layers;
    P.pool_bytes = P.kv.block_bytes * (size_t)n_blocks;
    P.kv.k = dev_alloc(P.pool_bytes);
    P.kv.v = dev_alloc(P.pool_bytes);
    P.bt = calloc((size_t)NS * P.bt_stride, sizeof(int32_t));
    int n_kvtok = 0;
    for (int s = 0, used = 0; s < NS; s++) {
        for (int j = 0; j < (ctx[s] + block_size - 1) / block_size; j++) P.bt[s * P.bt_stride + j] = used++;
        n_kvtok += ctx[s];
    }
    int kv_f = n_kv * hd, row_f = n_heads * hd;
    float *k = rnd_vec((size_t)n_kvtok * kv_f, 1.0f), *v = rnd_vec((size_t)n_kvtok * kv_f, 1.0f);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)n_kvtok);
    for (int s = 0, t = 0; s < NS; s++)
        for (int p = 0; p < ctx[s]; p++, t++)
            slots[t] = P.bt[s * P.bt_stride + p / block_size] * block_size + p % block_size;
    float *dk = dev_from(k, sizeof(float) * (size_t)n_kvtok * kv_f), *dv = dev_from(v, sizeof(float) * (size_t)n_kvtok * kv_f);
    int32_t *dslots = dev_from(slots, sizeof(int32_t) * (size_t)n_kvtok);
    step_begin();
    be->ops->kv_store(be, &P.kv, P.layer, dslots, n_kvtok, dk, dv);
    step_end();

    /* rows of sequence 0 at positions 684..699: each alone first */
    enum { CH = CUDA_ATTN_EXACT_ROWS };
    const int p_last = ctx[0] - 1;
    float *alone = malloc(sizeof(float) * CH * row_f), *got = malloc(sizeof(float) * CH * NS * row_f);
    for (int j = 0; j < CH; j++) {
        int s0 = 0, f = p_last - (CH - 1) + j, one = 1;
        attn_inv_call(&P, n_heads, 1, &s0, &f, &one, alone + (size_t)j * row_f);
    }
    char what[160];
    snprintf(what, sizeof(what), "attention invariance %s hd=%d heads=%d/%d", dtype_name(kdt), hd, n_heads, n_kv);
    /* (a) the last row beside 7 other decodes of other lengths */
    {
        int seq[NS], f[NS], n[NS];
        for (int s = 0; s < NS; s++) {
            seq[s] = s;
            f[s] = ctx[s] - 1;
            n[s] = 1;
        }
        attn_inv_call(&P, n_heads, NS, seq, f, n, got);
        CHECK_MSG(memcmp(got, alone + (size_t)(CH - 1) * row_f, sizeof(float) * row_f) == 0,
                  "%s: a decode row beside 7 others differs from the row alone", what);
    }
    /* (b) every row of a chunk of CH rows (a verify chunk of k + 1 = 16) */
    {
        int s0 = 0, f = p_last - (CH - 1), n = CH, bad = -1;
        attn_inv_call(&P, n_heads, 1, &s0, &f, &n, got);
        for (int j = CH - 1; j >= 0; j--)
            if (memcmp(got + (size_t)j * row_f, alone + (size_t)j * row_f, sizeof(float) * row_f)) bad = j;
        CHECK_MSG(bad < 0, "%s: row %d of a %d-row chunk differs from the row alone", what, bad, CH);
    }
    /* (c) a chunk of 4 (rows 4..7) between decodes of three other sequences */
    {
        int seq[4] = {4, 0, 2, 6}, f[4] = {ctx[4] - 1, p_last - 3, ctx[2] - 1, ctx[6] - 1}, n[4] = {1, 4, 1, 1};
        int bad = -1;
        attn_inv_call(&P, n_heads, 4, seq, f, n, got);
        for (int j = 3; j >= 0; j--)
            if (memcmp(got + (size_t)(1 + j) * row_f, alone + (size_t)(CH - 4 + j) * row_f, sizeof(float) * row_f))
                bad = j;
        CHECK_MSG(bad < 0, "%s: row %d of a 4-row chunk among decodes differs from the row alone", what, bad);
    }
    /* (d) a step of CH rows: a chunk of CH - 7 (the last rows) beside decodes of the 7 others */
    {
        int seq[NS], f[NS], n[NS], bad = -1;
        seq[0] = 0, f[0] = p_last - (CH - 8), n[0] = CH - 7;
        for (int s = 1; s < NS; s++) {
            seq[s] = s;
            f[s] = ctx[s] - 1;
            n[s] = 1;
        }
        attn_inv_call(&P, n_heads, NS, seq, f, n, got);
        for (int j = CH - 8; j >= 0; j--)
            if (memcmp(got + (size_t)j * row_f, alone + (size_t)(7 + j) * row_f, sizeof(float) * row_f)) bad = j;
        CHECK_MSG(bad < 0, "%s: row %d of a %d-row chunk in a %d-row step differs from the row alone", what, bad,
                  CH - 7, CH);
    }
    /* the values themselves are checked by test_attn_case; here the rows must not be zero or NaN */
    int finite = 1;
    for (int i = 0; i < CH * row_f; i++) finite &= isfinite(alone[i]) && alone[i] != 0.0f;
    CHECK_MSG(finite, "%s: a row alone is not finite and non-zero", what);
    free(alone);
    free(got);
    free(P.bt);
    free(k);
    free(v);
    free(slots);
    dev_free(dk, sizeof(float) * (size_t)n_kvtok * kv_f);
    dev_free(dv, sizeof(float) * (size_t)n_kvtok * kv_f);
    dev_free(dslots, sizeof(int32_t) * (size_t)n_kvtok);
    dev_free(P.kv.k, P.pool_bytes);
    dev_free(P.kv.v, P.pool_bytes);
}

static void test_attn_invariance(void)
{
    for (int i = 0; i < 2; i++) {
        enum dtype kdt = i ? DTYPE_F32 : DTYPE_BF16;
        test_attn_invariance_case(kdt, 128, 32, 8); /* BF16: the decode kernel, group 4 */
        test_attn_invariance_case(kdt, 64, 8, 2);   /* group 4, hd 64 (the demo's shape) */
        test_attn_invariance_case(kdt, 80, 4, 4);   /* the generic split-K kernel */
    }
    test_attn_invariance_case(DTYPE_BF16, 128, 32, 4); /* group 8 */
    /* the tuned decode kernel too (CAIRN_CUDA_ATTN_DEC=tuned; the default is fast) */
    reopen_with_env("CAIRN_CUDA_ATTN_DEC", "tuned");
    test_attn_invariance_case(DTYPE_BF16, 128, 32, 8);
    test_attn_invariance_case(DTYPE_BF16, 64, 8, 2);
    reopen_with_env("CAIRN_CUDA_ATTN_DEC", NULL);
}

/* ---- CUDA graphs ----
 * A decode-like run of ops (rmsnorm, matmul_multi over two weights, silu_mul, matmul, add)
 * stepped five times with new input values each time: the first run is eager, the second
 * captured, the others replay the graph; every step's output must match the host reference
 * of its own inputs. Then a weight is freed and made again (the graphs are dropped): the same
 * run is right again. With CAIRN_CUDA_GRAPHS=0 the counts stay 0 and the results the same. */
static void graph_ref(const struct tensor *wg, const struct tensor *wu, const struct tensor *wd, const float *x,
                      const float *nw, int dim, int inter, double *want, double *scale)
{
    double ss = 0;
    float *h = malloc(sizeof(float) * (size_t)dim), *a = malloc(sizeof(float) * (size_t)inter);
    double *g = malloc(sizeof(double) * (size_t)inter), *u = malloc(sizeof(double) * (size_t)inter);
    double *sg = malloc(sizeof(double) * (size_t)inter);
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / dim + 1e-5);
    for (int i = 0; i < dim; i++) h[i] = (float)(x[i] * inv * nw[i]);
    ref_matmul(wg, h, 1, g, sg);
    ref_matmul(wu, h, 1, u, sg);
    for (int i = 0; i < inter; i++) a[i] = (float)(g[i] / (1.0 + exp(-g[i])) * u[i]);
    ref_matmul(wd, a, 1, want, scale);
    for (int i = 0; i < dim; i++) {
        want[i] += x[i];
        scale[i] += fabs(x[i]) + 1e-3;
    }
    free(h);
    free(a);
    free(g);
    free(u);
    free(sg);
}

static void test_graphs(void)
{
    const int dim = 256, inter = 640;
    struct test_weight wg, wu, wd;
    weight_make(&wg, DTYPE_BF16, inter, dim, 0, 0);
    weight_make(&wu, DTYPE_Q, inter, dim, 4, 64);
    weight_make(&wd, DTYPE_BF16, dim, inter, 0, 0);
    float *nw = rnd_vec((size_t)dim, 1.0f);
    float *dnw = dev_from(nw, sizeof(float) * (size_t)dim);
    float *dx = dev_alloc(sizeof(float) * (size_t)dim), *dh = dev_alloc(sizeof(float) * (size_t)dim);
    float *dg = dev_alloc(sizeof(float) * (size_t)inter), *du = dev_alloc(sizeof(float) * (size_t)inter);
    float *dout = dev_alloc(sizeof(float) * (size_t)dim);
    float got[256];
    double want[256], scale[256];
    uint64_t l0, c0, e0, l1, c1, e1;
    cuda_graphs_counts(be, &l0, &c0, &e0);
    for (int it = 0; it < 7; it++) {
        if (it == 5) { /* a weight freed and made again: cached graphs must not be used */
            weight_free(&wd);
            weight_make(&wd, DTYPE_BF16, dim, inter, 0, 0);
        }
        float *x = rnd_vec((size_t)dim, 2.0f);
        struct cairn_err err;
        CHECK(be->ops->buf_upload(be, dx, x, sizeof(float) * (size_t)dim, &err) == CAIRN_OK);
        const struct tensor *gu[2] = {&wg.t, &wu.t};
        float *gu_out[2] = {dg, du};
        step_begin();
        be->ops->rmsnorm(be, dh, dx, dnw, 1, dim, 1e-5f, 0.0f);
        be->ops->matmul_multi(be, gu, gu_out, 2, dh, 1);
        be->ops->silu_mul(be, dg, dg, du, inter);
        be->ops->matmul(be, &wd.t, dg, dout, 1);
        be->ops->add(be, dout, dx, dim);
        step_end();
        dev_to(got, dout, sizeof(got));
        graph_ref(&wg.t, &wu.t, &wd.t, x, nw, dim, inter, want, scale);
        char what[64];
        snprintf(what, sizeof(what), "graph step %d", it);
        check_close(what, got, want, scale, (size_t)dim, mm_tol(DTYPE_BF16, inter, 1));
        free(x);
    }
    cuda_graphs_counts(be, &l1, &c1, &e1);
    const char *env = getenv("CAIRN_CUDA_GRAPHS");
    if (env && strcmp(env, "0") == 0) {
        CHECK(l1 == 0 && c1 == 0 && e1 == 0);
    } else {
        /* steps 0 and 5 eager, 1 and 6 captured, 2-4 launched */
        CHECK_EQ_INT((long long)(e1 - e0), 2);
        CHECK_EQ_INT((long long)(c1 - c0), 2);
        CHECK_EQ_INT((long long)(l1 - l0), 3);
    }
    dev_free(dnw, sizeof(float) * (size_t)dim);
    dev_free(dx, sizeof(float) * (size_t)dim);
    dev_free(dh, sizeof(float) * (size_t)dim);
    dev_free(dg, sizeof(float) * (size_t)inter);
    dev_free(du, sizeof(float) * (size_t)inter);
    dev_free(dout, sizeof(float) * (size_t)dim);
    free(nw);
    weight_free(&wg);
    weight_free(&wu);
    weight_free(&wd);
}

/* ---- MoE ---- */

/* Routing as backend.h says: softmax, top_k by probability (ties: lower id), renormalised. */
static void ref_route(const float *logits, int n, int E, int K, int norm, int32_t *ids, double *w)
{
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * E;
        double m = l[0], sum = 0;
        for (int e = 1; e < E; e++) m = fmax(m, l[e]);
        for (int e = 0; e < E; e++) sum += exp(l[e] - m);
        double wsum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= ids[t * K + j] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            ids[t * K + k] = best;
            w[t * K + k] = exp(l[best] - m) / sum;
            wsum += w[t * K + k];
        }
        if (norm)
            for (int k = 0; k < K; k++) w[t * K + k] /= wsum;
    }
}

static void test_moe_route(void)
{
    /* a small case, Qwen3-30B-A3B's 128 experts / top 8 and Qwen3-Next's 512 / top 10 (with ties);
     * then logits of a few values (many ties), the largest top_k, a row of one value (every
     * expert tied) */
    static const int shapes[][3] = {{7, 10, 3}, {5, 128, 8}, {3, 512, 10}, {6, 64, 6}, {4, 512, 32}, {3, 33, 5}};
    for (size_t si = 0; si < CAIRN_ARRAY_LEN(shapes); si++) {
        const int n = shapes[si][0], E = shapes[si][1], K = shapes[si][2];
        float *logits = rnd_vec((size_t)n * E, 3.0f);
        if (E >= 128 && si < 3)
            logits[E + 5] = logits[E + 9] = 40.0f; /* a tie at the top: the lower id first */
        if (si >= 3)
            for (int i = 0; i < n * E; i++) logits[i] = floorf(logits[i]); /* 7 values */
        if (si >= 3)
            for (int e = 0; e < E; e++) logits[e] = 0.5f; /* row 0: every expert ties */
        float *dl = dev_from(logits, sizeof(float) * (size_t)n * E);
        int32_t *dids = dev_alloc(sizeof(int32_t) * n * K);
        float *dw = dev_alloc(sizeof(float) * n * K);
        int32_t *ids = calloc((size_t)n * K, sizeof(int32_t)),
                *want_ids = calloc((size_t)n * K, sizeof(int32_t));
        float *w = calloc((size_t)n * K, sizeof(float));
        double *want_w = calloc((size_t)n * K, sizeof(double));
        for (int norm = 0; norm < 2; norm++) {
            step_begin();
            be->ops->moe_route(be, dl, n, E, K, norm, dids, dw);
            step_end();
            dev_to(ids, dids, sizeof(int32_t) * n * K);
            dev_to(w, dw, sizeof(float) * n * K);
            ref_route(logits, n, E, K, norm, want_ids, want_w);
            CHECK_MSG(memcmp(ids, want_ids, sizeof(int32_t) * n * K) == 0,
                      "moe_route ids (E %d, K %d, norm %d)", E, K, norm);
            check_close("moe_route w", w, want_w, NULL, (size_t)n * K, 1e-6);
        }
        dev_free(dl, sizeof(float) * (size_t)n * E);
        dev_free(dids, sizeof(int32_t) * n * K);
        dev_free(dw, sizeof(float) * n * K);
        free(logits);
        free(ids);
        free(want_ids);
        free(w);
        free(want_w);
    }
}

/* One MoE layer's experts for the tests: stacked [E * inter, hidden] gate/up and
 * [E * hidden, inter] down sliced per expert (MLX), or one tensor per expert (HF). */
struct test_moe_w {
    int E, H, I, stacked;
    struct test_weight sg, su, sd;            /* stacked */
    struct test_weight pg[16], pu[16], pd[16]; /* per expert */
    struct tensor g[16], u[16], d[16];        /* what backend_moe points at */
};

static void moe_w_make(struct test_moe_w *mw, enum dtype dt, int bits, int gs, int E, int H, int I, int stacked)
{
    CAIRN_ASSERT(E <= 16);
    mw->E = E, mw->H = H, mw->I = I, mw->stacked = stacked;
    if (stacked) {
        weight_make(&mw->sg, dt, (int64_t)E * I, H, bits, gs);
        weight_make(&mw->su, dt, (int64_t)E * I, H, bits, gs);
        weight_make(&mw->sd, dt, (int64_t)E * H, I, bits, gs);
        for (int e = 0; e < E; e++) {
            be->ops->weight_slice_rows(be, &mw->sg.t, (int64_t)e * I, I, &mw->g[e]);
            be->ops->weight_slice_rows(be, &mw->su.t, (int64_t)e * I, I, &mw->u[e]);
            be->ops->weight_slice_rows(be, &mw->sd.t, (int64_t)e * H, H, &mw->d[e]);
        }
    } else {
        for (int e = 0; e < E; e++) {
            weight_make(&mw->pg[e], dt, I, H, bits, gs);
            weight_make(&mw->pu[e], dt, I, H, bits, gs);
            weight_make(&mw->pd[e], dt, H, I, bits, gs);
            mw->g[e] = mw->pg[e].t, mw->u[e] = mw->pu[e].t, mw->d[e] = mw->pd[e].t;
        }
    }
}

static void moe_w_free(struct test_moe_w *mw)
{
    if (mw->stacked) {
        weight_free(&mw->sg);
        weight_free(&mw->su);
        weight_free(&mw->sd);
    } else {
        for (int e = 0; e < mw->E; e++) {
            weight_free(&mw->pg[e]);
            weight_free(&mw->pu[e]);
            weight_free(&mw->pd[e]);
        }
    }
}

/* want[t] = sum_k w[t,k] * expert_{ids[t,k]}(x[t]) in double from the weights' f32 rows; scale
 * the same sum of |terms| (the error scale of each output). */
static void moe_ref(const struct test_moe_w *mw, int n, int K, const float *x, const int32_t *ids, const float *w,
                    double *want, double *scale)
{
    int H = mw->H, I = mw->I;
    float *row = malloc(sizeof(float) * (size_t)(H > I ? H : I)), *act = malloc(sizeof(float) * (size_t)I);
    memset(want, 0, sizeof(double) * (size_t)n * H);
    memset(scale, 0, sizeof(double) * (size_t)n * H);
    for (int t = 0; t < n; t++)
        for (int k = 0; k < K; k++) {
            int e = ids[t * K + k];
            for (int i = 0; i < I; i++) {
                double a = 0, b = 0;
                tensor_row_to_f32(&mw->g[e], i, row);
                for (int j = 0; j < H; j++) a += (double)row[j] * x[t * H + j];
                tensor_row_to_f32(&mw->u[e], i, row);
                for (int j = 0; j < H; j++) b += (double)row[j] * x[t * H + j];
                act[i] = (float)(a * ref_sigmoid(a) * b);
            }
            for (int j = 0; j < H; j++) {
                double acc = 0, sc = 0;
                tensor_row_to_f32(&mw->d[e], j, row);
                for (int i = 0; i < I; i++) {
                    acc += (double)row[i] * act[i];
                    sc += fabs((double)row[i] * act[i]);
                }
                want[t * H + j] += w[t * K + k] * acc;
                scale[t * H + j] += w[t * K + k] * sc;
            }
        }
    free(row);
    free(act);
}

/* n tokens routed to top_k distinct experts of E (weights summing to 1), or, for the grouped
 * path's GEMM case, most tokens on experts 0 and 1. */
static void moe_route_rnd(int n, int E, int K, int32_t *ids, float *w)
{
    for (int t = 0; t < n; t++) {
        float sum = 0;
        for (int k = 0; k < K; k++) {
            int32_t e;
            int taken;
            do {
                e = (int32_t)(rnd_u32() % (uint32_t)E);
                taken = 0;
                for (int j = 0; j < k; j++) taken |= ids[t * K + j] == e;
            } while (taken);
            ids[t * K + k] = e;
            w[t * K + k] = 0.2f + (float)(rnd_u32() % 100) / 100.0f;
            sum += w[t * K + k];
        }
        for (int k = 0; k < K; k++) w[t * K + k] /= sum;
    }
    if (n > 16) /* most tokens on experts 0 and 1 */
        for (int t = 0; t < n; t += 2) ids[t * K] = 0, ids[t * K + 1] = 1 + t % (E - 1);
}

/* moe_experts of n tokens (x [n, H], ids / w [n, K] on the host) into got [n, H]. */
static void moe_run(const struct test_moe_w *mw, int n, int K, const float *x, const int32_t *ids, const float *w,
                    float *got)
{
    int H = mw->H, I = mw->I;
    size_t scratch = backend_moe_scratch_floats(n, H, I, K);
    float *dx = dev_from(x, sizeof(float) * (size_t)n * H), *dout = dev_alloc(sizeof(float) * (size_t)n * H);
    int32_t *dids = dev_from(ids, sizeof(int32_t) * (size_t)n * K);
    float *dw = dev_from(w, sizeof(float) * (size_t)n * K), *ds = dev_alloc(scratch * 4);
    struct backend_moe m = {
        .x = dx, .out = dout, .n = n, .hidden = H, .inter = I, .n_experts = mw->E, .top_k = K,
        .ids = dids, .w = dw, .gate = mw->g, .up = mw->u, .down = mw->d, .scratch = ds,
    };
    step_begin();
    be->ops->moe_experts(be, &m);
    step_end();
    dev_to(got, dout, sizeof(float) * (size_t)n * H);
    dev_free(dx, sizeof(float) * (size_t)n * H);
    dev_free(dout, sizeof(float) * (size_t)n * H);
    dev_free(dids, sizeof(int32_t) * (size_t)n * K);
    dev_free(dw, sizeof(float) * (size_t)n * K);
    dev_free(ds, scratch * 4);
}

static void test_moe_experts_case(enum dtype dt, int bits, int gs, int E, int K, int H, int I, int stacked, int n)
{
    struct test_moe_w mw;
    moe_w_make(&mw, dt, bits, gs, E, H, I, stacked);
    float *x = rnd_vec((size_t)n * H, 1.0f);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * K);
    float *w = malloc(sizeof(float) * (size_t)n * K);
    moe_route_rnd(n, E, K, ids, w);
    float *got = malloc(sizeof(float) * (size_t)n * H);
    moe_run(&mw, n, K, x, ids, w, got);
    double *want = malloc(sizeof(double) * (size_t)n * H), *scale = malloc(sizeof(double) * (size_t)n * H);
    moe_ref(&mw, n, K, x, ids, w, want, scale);
    char what[96];
    snprintf(what, sizeof(what), "moe_experts %s%s E=%d K=%d %dx%d %s n=%d", dtype_name(dt),
             dt == DTYPE_Q ? (bits == 4 ? "4" : bits == 8 ? "8" : "?") : "", E, K, H, I,
             stacked ? "stacked" : "per-expert", n);
    /* a decode-sized batch: f32 products and sums (cuda_moe.cu); more: the GEMM path's bf16
     * inputs, twice over (gate/up then down) */
    check_close(what, got, want, scale, (size_t)n * H, n > CUDA_MOE_DEVICE_MAX_N ? 2e-2 : 1e-4);
    moe_w_free(&mw);
    free(x);
    free(ids);
    free(w);
    free(got);
    free(want);
    free(scale);
}

/* Batch invariance of the experts: a token alone (n = 1: cuda_moe.cu's unsorted path) must give
 * the bits it gets as row 1 of a batch of 3 (the sorted path, sharing experts with row 0). */
static void test_moe_invariant_case(enum dtype dt, int bits, int gs, int E, int K, int H, int I)
{
    const int n = 3;
    struct test_moe_w mw;
    moe_w_make(&mw, dt, bits, gs, E, H, I, 1);
    float *x = rnd_vec((size_t)n * H, 1.0f);
    int32_t ids[3 * 16];
    float w[3 * 16];
    CAIRN_ASSERT(K <= 16);
    moe_route_rnd(n, E, K, ids, w);
    ids[0] = ids[K + K - 1]; /* row 0 shares an expert with row 1 (ids stay distinct in row 0) */
    for (int k = 1; k < K; k++)
        if (ids[k] == ids[0]) ids[k] = ids[K + K - 1] == ids[K] ? ids[K + 1] : ids[K];
    float *all = malloc(sizeof(float) * (size_t)n * H), *one = malloc(sizeof(float) * (size_t)H);
    moe_run(&mw, n, K, x, ids, w, all);
    moe_run(&mw, 1, K, x + H, ids + K, w + K, one);
    CHECK_MSG(memcmp(one, all + H, sizeof(float) * (size_t)H) == 0,
              "moe_experts batch-invariant %s%d E=%d K=%d %dx%d: n = 1 is not bitwise row 1 of n = 3",
              dtype_name(dt), bits, E, K, H, I);
    moe_w_free(&mw);
    free(x);
    free(all);
    free(one);
}

/* A decode-like MoE step (route, experts, the shared expert's sigmoid gate) five times with new
 * router logits each time, so every step picks other experts: with graphs on the first runs
 * eagerly, the second is captured, the rest replay the graph, and each step must match the
 * reference of its own routing (the routing is device data, never read back). */
static void test_moe_graph(void)
{
    const int E = 8, K = 3, H = 64, I = 32, n = 2;
    struct test_moe_w mw;
    moe_w_make(&mw, DTYPE_BF16, 0, 0, E, H, I, 1);
    float *x = rnd_vec((size_t)n * H, 1.0f), *sh = rnd_vec((size_t)n * H, 1.0f), *gl = rnd_vec((size_t)n, 1.0f);
    float *dx = dev_from(x, sizeof(float) * (size_t)n * H), *dsh = dev_from(sh, sizeof(float) * (size_t)n * H);
    float *dgl = dev_from(gl, sizeof(float) * (size_t)n), *dout = dev_alloc(sizeof(float) * (size_t)n * H);
    float *dlog = dev_alloc(sizeof(float) * (size_t)n * E), *dw = dev_alloc(sizeof(float) * (size_t)n * K);
    int32_t *dids = dev_alloc(sizeof(int32_t) * (size_t)n * K);
    size_t scratch = backend_moe_scratch_floats(n, H, I, K);
    float *ds = dev_alloc(scratch * 4);
    struct backend_moe m = {
        .x = dx, .out = dout, .n = n, .hidden = H, .inter = I, .n_experts = E, .top_k = K,
        .ids = dids, .w = dw, .gate = mw.g, .up = mw.u, .down = mw.d, .scratch = ds,
    };
    uint64_t l0, c0, e0, l1, c1, e1;
    cuda_graphs_counts(be, &l0, &c0, &e0);
    int32_t ids[2 * 3], prev[2 * 3] = {0};
    int n_changed = 0;
    for (int it = 0; it < 5; it++) {
        float *logits = rnd_vec((size_t)n * E, 3.0f);
        struct cairn_err err;
        CHECK(be->ops->buf_upload(be, dlog, logits, sizeof(float) * (size_t)n * E, &err) == CAIRN_OK);
        step_begin();
        be->ops->moe_route(be, dlog, n, E, K, 1, dids, dw);
        be->ops->moe_experts(be, &m);
        be->ops->add_sigmoid_scaled(be, dout, dsh, dgl, n, H);
        step_end();
        float got[2 * 64];
        dev_to(got, dout, sizeof(got));
        double wd[2 * 3], want[2 * 64], scale[2 * 64];
        float wf[2 * 3];
        ref_route(logits, n, E, K, 1, ids, wd);
        for (int i = 0; i < n * K; i++) wf[i] = (float)wd[i];
        n_changed += it > 0 && memcmp(ids, prev, sizeof(ids)) != 0;
        memcpy(prev, ids, sizeof(ids));
        moe_ref(&mw, n, K, x, ids, wf, want, scale);
        for (int t = 0; t < n; t++)
            for (int j = 0; j < H; j++) {
                double gsig = 1.0 / (1.0 + exp(-(double)gl[t]));
                want[t * H + j] += gsig * sh[t * H + j];
                scale[t * H + j] += fabs(gsig * sh[t * H + j]) + 1e-6;
            }
        char what[64];
        snprintf(what, sizeof(what), "moe graph step %d", it);
        check_close(what, got, want, scale, (size_t)n * H, 1e-4);
        free(logits);
    }
    CHECK(n_changed >= 2); /* the steps did route differently */
    cuda_graphs_counts(be, &l1, &c1, &e1);
    const char *env = getenv("CAIRN_CUDA_GRAPHS");
    if (!env || strcmp(env, "0") != 0) {
        CHECK_EQ_INT((long long)(e1 - e0), 1);
        CHECK_EQ_INT((long long)(c1 - c0), 1);
        CHECK_EQ_INT((long long)(l1 - l0), 3);
    }
    dev_free(dx, sizeof(float) * (size_t)n * H);
    dev_free(dsh, sizeof(float) * (size_t)n * H);
    dev_free(dgl, sizeof(float) * (size_t)n);
    dev_free(dout, sizeof(float) * (size_t)n * H);
    dev_free(dlog, sizeof(float) * (size_t)n * E);
    dev_free(dw, sizeof(float) * (size_t)n * K);
    dev_free(dids, sizeof(int32_t) * (size_t)n * K);
    dev_free(ds, scratch * 4);
    moe_w_free(&mw);
    free(x);
    free(sh);
    free(gl);
}

static void test_moe(void)
{
    test_moe_route();
    /* the device path (sorted on the GPU): every weight kind, both layouts, odd sizes (f16 36
     * wide: the element-by-element kernel), top_k 1..8, experts shared by more than
     * CUDA_MOE_NT (8) slots (n = 40 of 4 experts), unused experts */
    test_moe_experts_case(DTYPE_BF16, 0, 0, 8, 8, 64, 96, 1, 1);
    test_moe_experts_case(DTYPE_BF16, 0, 0, 6, 2, 64, 96, 0, 5);
    test_moe_experts_case(DTYPE_F32, 0, 0, 5, 3, 40, 24, 1, 3);
    test_moe_experts_case(DTYPE_F16, 0, 0, 4, 2, 36, 20, 0, 2);
    test_moe_experts_case(DTYPE_Q, 4, 32, 4, 2, 64, 96, 1, 5);
    test_moe_experts_case(DTYPE_Q, 8, 64, 5, 1, 128, 64, 0, 8);
    test_moe_experts_case(DTYPE_Q, 4, 64, 16, 4, 64, 128, 1, 1);
    test_moe_experts_case(DTYPE_BF16, 0, 0, 4, 2, 64, 96, 1, 40);
    test_moe_experts_case(DTYPE_Q, 4, 32, 4, 2, 64, 96, 0, 12);
    /* more tokens than CUDA_MOE_DEVICE_MAX_N: grouped on the host, per-expert GEMMs */
    test_moe_experts_case(DTYPE_BF16, 0, 0, 4, 2, 64, 96, 1, 150);
    test_moe_experts_case(DTYPE_Q, 4, 32, 6, 2, 64, 96, 0, 130);
    /* one token (the unsorted path) in every kind it takes, top_k over its 8 experts a pass,
     * an odd count of chunks per lane, and a layout it leaves to the sorted path (scalar) */
    test_moe_experts_case(DTYPE_F32, 0, 0, 5, 3, 40, 24, 0, 1);
    test_moe_experts_case(DTYPE_F16, 0, 0, 6, 2, 264, 40, 1, 1);
    test_moe_experts_case(DTYPE_BF16, 0, 0, 16, 10, 520, 200, 1, 1);
    test_moe_experts_case(DTYPE_Q, 8, 64, 5, 3, 128, 64, 0, 1);
    test_moe_experts_case(DTYPE_Q, 4, 32, 12, 9, 96, 160, 1, 1);
    test_moe_experts_case(DTYPE_BF16, 0, 0, 4, 2, 36, 20, 0, 1);
    test_moe_invariant_case(DTYPE_BF16, 0, 0, 9, 8, 2048, 768); /* the 30B-A3B shape */
    test_moe_invariant_case(DTYPE_BF16, 0, 0, 16, 10, 520, 200);
    test_moe_invariant_case(DTYPE_F32, 0, 0, 6, 3, 40, 24);
    test_moe_invariant_case(DTYPE_F16, 0, 0, 6, 2, 264, 40);
    test_moe_invariant_case(DTYPE_Q, 4, 64, 12, 4, 256, 128);
    test_moe_invariant_case(DTYPE_Q, 8, 32, 8, 3, 128, 96);
    /* the staged one-token q kernels: Qwen3-Next's expert shape (down rows of 16 q4 chunks, two
     * a warp), rows of 48 chunks (a warp a row, two chunks a lane), a q8 h over the shared-memory
     * limit (down falls back to the first kernel) */
    test_moe_experts_case(DTYPE_Q, 4, 64, 16, 10, 2048, 512, 1, 1);
    test_moe_invariant_case(DTYPE_Q, 4, 64, 16, 10, 2048, 512);
    test_moe_invariant_case(DTYPE_Q, 4, 32, 9, 6, 256, 1536);
    test_moe_experts_case(DTYPE_Q, 4, 32, 9, 6, 256, 1536, 0, 1);
    test_moe_invariant_case(DTYPE_Q, 8, 64, 16, 16, 128, 1024);
    test_moe_graph();
}

/* ---- gated DeltaNet ---- */

/* Decode steps of one DeltaNet layer (a strided copy, then gdn on the device state) five times
 * with new inputs: with graphs on, eager, captured, then replayed; the state carries from step
 * to step, and each step's output and state must match the CPU op run on the same sequence. */
static void test_gdn_graph(void)
{
    struct gdn_dims dims = {.n_k_heads = 2, .n_v_heads = 4, .head_k_dim = 64, .head_v_dim = 32, .conv_kernel = 4};
    int cd = gdn_conv_dim(&dims), vd = gdn_value_dim(&dims), nv = dims.n_v_heads;
    size_t sf = gdn_state_floats(&dims);
    float *conv_w = rnd_vec((size_t)cd * dims.conv_kernel, 0.5f), *a_log = rnd_vec((size_t)nv, 1.0f);
    float *dt_bias = rnd_vec((size_t)nv, 1.0f), *norm_w = rnd_vec((size_t)dims.head_v_dim, 1.0f);
    float *state = rnd_vec(sf, 0.3f);
    float *d_conv = dev_from(conv_w, sizeof(float) * (size_t)cd * dims.conv_kernel);
    float *d_alog = dev_from(a_log, sizeof(float) * nv), *d_dtb = dev_from(dt_bias, sizeof(float) * nv);
    float *d_nw = dev_from(norm_w, sizeof(float) * dims.head_v_dim), *d_state = dev_from(state, sf * 4);
    /* inputs land in a staging row and are copied into place by copy_rows, as qwen3_next's
     * unpacking does: [qkv | z | b | a] */
    size_t in_floats = (size_t)cd + vd + 2 * nv;
    float *d_in = dev_alloc(sizeof(float) * in_floats), *d_qkv = dev_alloc(sizeof(float) * (size_t)cd);
    float *d_z = dev_alloc(sizeof(float) * (size_t)vd), *d_b = dev_alloc(sizeof(float) * nv);
    float *d_a = dev_alloc(sizeof(float) * nv), *d_out = dev_alloc(sizeof(float) * (size_t)vd);
    struct backend_gdn g = {
        .n_k_heads = dims.n_k_heads, .n_v_heads = nv, .head_k_dim = dims.head_k_dim,
        .head_v_dim = dims.head_v_dim, .conv_kernel = dims.conv_kernel, .eps = 1e-6f,
        .conv_w = d_conv, .a_log = d_alog, .dt_bias = d_dtb, .norm_w = d_nw, .state = d_state,
        .qkv = d_qkv, .z = d_z, .b = d_b, .a = d_a, .n = 1, .out = d_out,
    };
    uint64_t l0, c0, e0, l1, c1, e1;
    cuda_graphs_counts(be, &l0, &c0, &e0);
    float *got = malloc(sizeof(float) * (size_t)vd), *ref = malloc(sizeof(float) * (size_t)vd);
    float *gstate = malloc(sf * 4);
    double *want = malloc(sizeof(double) * sf);
    for (int it = 0; it < 5; it++) {
        float *in = rnd_vec(in_floats, 1.0f);
        struct cairn_err err;
        CHECK(be->ops->buf_upload(be, d_in, in, sizeof(float) * in_floats, &err) == CAIRN_OK);
        step_begin();
        be->ops->copy_rows(be, d_qkv, cd, d_in, (int64_t)in_floats, 1, cd);
        be->ops->copy_rows(be, d_z, vd, d_in + cd, (int64_t)in_floats, 1, vd);
        be->ops->copy_rows(be, d_b, nv, d_in + cd + vd, (int64_t)in_floats, 1, nv);
        be->ops->copy_rows(be, d_a, nv, d_in + cd + vd + nv, (int64_t)in_floats, 1, nv);
        be->ops->gdn(be, &g);
        step_end();
        dev_to(got, d_out, sizeof(float) * (size_t)vd);
        dev_to(gstate, d_state, sf * 4);
        struct backend_gdn hg = g;
        hg.conv_w = conv_w, hg.a_log = a_log, hg.dt_bias = dt_bias, hg.norm_w = norm_w;
        hg.state = state, hg.qkv = in, hg.z = in + cd, hg.b = in + cd + vd, hg.a = in + cd + vd + nv, hg.out = ref;
        cpu_gdn(&hg);
        for (int i = 0; i < vd; i++) want[i] = ref[i];
        char what[64];
        snprintf(what, sizeof(what), "gdn graph step %d out", it);
        check_close(what, got, want, NULL, (size_t)vd, 1e-4);
        for (size_t i = 0; i < sf; i++) want[i] = state[i];
        snprintf(what, sizeof(what), "gdn graph step %d state", it);
        check_close(what, gstate, want, NULL, sf, 1e-5);
        free(in);
    }
    cuda_graphs_counts(be, &l1, &c1, &e1);
    const char *env = getenv("CAIRN_CUDA_GRAPHS");
    if (!env || strcmp(env, "0") != 0) {
        CHECK_EQ_INT((long long)(e1 - e0), 1);
        CHECK_EQ_INT((long long)(c1 - c0), 1);
        CHECK_EQ_INT((long long)(l1 - l0), 3);
    }
    dev_free(d_conv, sizeof(float) * (size_t)cd * dims.conv_kernel);
    dev_free(d_alog, sizeof(float) * nv);
    dev_free(d_dtb, sizeof(float) * nv);
    dev_free(d_nw, sizeof(float) * dims.head_v_dim);
    dev_free(d_state, sf * 4);
    dev_free(d_in, sizeof(float) * in_floats);
    dev_free(d_qkv, sizeof(float) * (size_t)cd);
    dev_free(d_z, sizeof(float) * (size_t)vd);
    dev_free(d_b, sizeof(float) * nv);
    dev_free(d_a, sizeof(float) * nv);
    dev_free(d_out, sizeof(float) * (size_t)vd);
    free(conv_w);
    free(a_log);
    free(dt_bias);
    free(norm_w);
    free(state);
    free(got);
    free(ref);
    free(gstate);
    free(want);
}

static void test_gdn_case(struct gdn_dims dims, int n)
{
    int cd = gdn_conv_dim(&dims), vd = gdn_value_dim(&dims), nv = dims.n_v_heads;
    size_t sf = gdn_state_floats(&dims);
    float *conv_w = rnd_vec((size_t)cd * dims.conv_kernel, 0.5f), *a_log = rnd_vec((size_t)nv, 1.0f);
    float *dt_bias = rnd_vec((size_t)nv, 1.0f), *norm_w = rnd_vec((size_t)dims.head_v_dim, 1.0f);
    float *state = rnd_vec(sf, 0.3f), *qkv = rnd_vec((size_t)n * cd, 1.0f), *z = rnd_vec((size_t)n * vd, 1.0f);
    float *b = rnd_vec((size_t)n * nv, 2.0f), *a = rnd_vec((size_t)n * nv, 2.0f);
    float *d_conv = dev_from(conv_w, sizeof(float) * (size_t)cd * dims.conv_kernel);
    float *d_alog = dev_from(a_log, sizeof(float) * nv), *d_dtb = dev_from(dt_bias, sizeof(float) * nv);
    float *d_nw = dev_from(norm_w, sizeof(float) * dims.head_v_dim), *d_state = dev_from(state, sf * 4);
    float *d_qkv = dev_from(qkv, sizeof(float) * (size_t)n * cd), *d_z = dev_from(z, sizeof(float) * (size_t)n * vd);
    float *d_b = dev_from(b, sizeof(float) * (size_t)n * nv), *d_a = dev_from(a, sizeof(float) * (size_t)n * nv);
    float *d_out = dev_alloc(sizeof(float) * (size_t)n * vd);
    struct backend_gdn g = {
        .n_k_heads = dims.n_k_heads, .n_v_heads = nv, .head_k_dim = dims.head_k_dim,
        .head_v_dim = dims.head_v_dim, .conv_kernel = dims.conv_kernel, .eps = 1e-6f,
        .conv_w = d_conv, .a_log = d_alog, .dt_bias = d_dtb, .norm_w = d_nw, .state = d_state,
        .qkv = d_qkv, .z = d_z, .b = d_b, .a = d_a, .n = n, .out = d_out,
    };
    step_begin();
    be->ops->gdn(be, &g);
    step_end();
    float *out = malloc(sizeof(float) * (size_t)n * vd), *gstate = malloc(sf * 4);
    dev_to(out, d_out, sizeof(float) * (size_t)n * vd);
    dev_to(gstate, d_state, sf * 4);
    /* The CPU backend's op (same semantics, host pointers) is the reference. */
    float *ref_out = malloc(sizeof(float) * (size_t)n * vd);
    struct backend_gdn hg = g;
    hg.conv_w = conv_w, hg.a_log = a_log, hg.dt_bias = dt_bias, hg.norm_w = norm_w;
    hg.state = state, hg.qkv = qkv, hg.z = z, hg.b = b, hg.a = a, hg.out = ref_out;
    cpu_gdn(&hg);
    double *want = malloc(sizeof(double) * (sf > (size_t)n * vd ? sf : (size_t)n * vd));
    for (size_t i = 0; i < (size_t)n * vd; i++) want[i] = ref_out[i];
    char what[96];
    snprintf(what, sizeof(what), "gdn out n=%d (k %dx%d, v %dx%d, conv %d)", n, dims.n_k_heads, dims.head_k_dim,
             dims.n_v_heads, dims.head_v_dim, dims.conv_kernel);
    check_close(what, out, want, NULL, (size_t)n * vd, 1e-4);
    for (size_t i = 0; i < sf; i++) want[i] = state[i];
    snprintf(what, sizeof(what), "gdn state n=%d (k dim %d, v dim %d)", n, dims.head_k_dim, dims.head_v_dim);
    check_close(what, gstate, want, NULL, sf, 1e-5);
    float *cq = malloc(sizeof(float) * (size_t)n * cd);
    dev_to(cq, d_qkv, sizeof(float) * (size_t)n * cd);
    for (size_t i = 0; i < (size_t)n * cd; i++) want[i] = qkv[i];
    check_close("gdn conv in place", cq, want, NULL, (size_t)n * cd, 1e-5);
    dev_free(d_conv, sizeof(float) * (size_t)cd * dims.conv_kernel);
    dev_free(d_alog, sizeof(float) * nv);
    dev_free(d_dtb, sizeof(float) * nv);
    dev_free(d_nw, sizeof(float) * dims.head_v_dim);
    dev_free(d_state, sf * 4);
    dev_free(d_qkv, sizeof(float) * (size_t)n * cd);
    dev_free(d_z, sizeof(float) * (size_t)n * vd);
    dev_free(d_b, sizeof(float) * (size_t)n * nv);
    dev_free(d_a, sizeof(float) * (size_t)n * nv);
    dev_free(d_out, sizeof(float) * (size_t)n * vd);
    free(conv_w);
    free(a_log);
    free(dt_bias);
    free(norm_w);
    free(state);
    free(qkv);
    free(z);
    free(b);
    free(a);
    free(out);
    free(gstate);
    free(ref_out);
    free(want);
    free(cq);
}

/* ---- errors, memory accounting, the probe ---- */

static void test_errors_and_memory(void)
{
    struct cairn_err err;
    struct backend_mem_stats st0, st1;
    CHECK(be->ops->mem_stats(be, &st0) == CAIRN_OK);
    CHECK(st0.device_total > 0 && st0.device_free <= st0.device_total);
    uint64_t tag0 = cairn_mem_used_in(CAIRN_MEM_DEVICE, CAIRN_MEM_KV);
    void *p = NULL;
    CHECK(be->ops->buf_alloc(be, (size_t)1 << 20, CAIRN_MEM_KV, &p, &err) == CAIRN_OK);
    CHECK(be->ops->mem_stats(be, &st1) == CAIRN_OK);
    CHECK_EQ_INT(st1.device_used_by_cairn - st0.device_used_by_cairn, (long long)1 << 20);
    CHECK_EQ_INT(cairn_mem_used_in(CAIRN_MEM_DEVICE, CAIRN_MEM_KV) - tag0, (long long)1 << 20);
    /* zeroed */
    uint8_t buf[4096];
    memset(buf, 0xff, sizeof(buf));
    dev_to(buf, p, sizeof(buf));
    int zero = 1;
    for (size_t i = 0; i < sizeof(buf); i++) zero &= buf[i] == 0;
    CHECK(zero);
    be->ops->buf_free(be, p, (size_t)1 << 20, CAIRN_MEM_KV);
    CHECK_EQ_INT(cairn_mem_used_in(CAIRN_MEM_DEVICE, CAIRN_MEM_KV), tag0);

    /* more than the device has: NOMEM, and the backend keeps working */
    p = NULL;
    int rc = be->ops->buf_alloc(be, (size_t)1 << 50, CAIRN_MEM_SCRATCH, &p, &err);
    CHECK_EQ_INT(rc, CAIRN_ERR_NOMEM);
    CHECK(p == NULL && strstr(err.msg, "out of device memory") != NULL);
    CHECK(be->ops->mem_stats(be, &st1) == CAIRN_OK);
    CHECK_EQ_INT(st1.device_used_by_cairn, st0.device_used_by_cairn);

    /* a latched error fails its step only */
    struct backend_kv_view kv = {.n_blocks = 1, .n_layers = 1, .block_size = 16, .n_kv_heads = 1,
                                 .head_dim = 512, .dtype = DTYPE_F32};
    struct backend_attn a = {.n_tokens = 1, .n_seqs = 1, .n_heads = 1, .kv = &kv};
    int32_t ctx1 = 1, so[2] = {0, 1};
    a.ctx_len_host = &ctx1;
    a.seq_off_host = so;
    CHECK(be->ops->step_begin(be, &err) == CAIRN_OK);
    be->ops->attention(be, &a);
    rc = be->ops->step_end(be, &err);
    CHECK_EQ_INT(rc, CAIRN_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "head_dim 512") != NULL);
    float one = 1.0f, *d1 = dev_from(&one, 4), back = 0;
    step_begin();
    be->ops->add(be, d1, d1, 1);
    step_end();
    dev_to(&back, d1, 4);
    CHECK(back == 2.0f);
    dev_free(d1, 4);

    /* unsupported weight dtype */
    struct tensor t = {.dtype = DTYPE_I32, .n_dims = 2, .shape = {2, 2}, .data = buf};
    size_t extra = 0;
    CHECK_EQ_INT(be->ops->weight_prepare(be, &t, 0, &extra, &err), CAIRN_ERR_UNSUPPORTED);

    /* the device budget of CAIRN_CUDA_MEM_LIMIT */
    setenv("CAIRN_CUDA_MEM_LIMIT", "200M", 1);
    struct backend *capped = NULL;
    rc = cuda_backend_open(0, &capped, &err);
    unsetenv("CAIRN_CUDA_MEM_LIMIT");
    CHECK_MSG(rc == CAIRN_OK, "open with a limit: %s", err.msg);
    if (capped) {
        p = NULL;
        rc = capped->ops->buf_alloc(capped, (size_t)300 << 20, CAIRN_MEM_KV, &p, &err);
        CHECK_EQ_INT(rc, CAIRN_ERR_NOMEM);
        CHECK(strstr(err.msg, "CAIRN_CUDA_MEM_LIMIT") != NULL);
        struct backend_mem_stats cs;
        CHECK(capped->ops->mem_stats(capped, &cs) == CAIRN_OK);
        CHECK_EQ_INT(cs.device_total, 200ll << 20);
        capped->ops->destroy(capped);
    }

    double gbs = 0;
    CHECK(cuda_probe_copy_bandwidth(0, (size_t)256 << 20, &gbs, &err) == CAIRN_OK);
    printf("device-to-device copy: %.0f GB/s\n", gbs);
    CHECK(gbs > 100); /* any GPU this build runs on (sm_90+) copies at > 1 TB/s */
}

/* ---- GEMV microbenchmark (test_cuda_ops --bench-gemv; not part of the test) ----
 * The decode matmul shapes of the 8B (llama-3.1-8b.json) and 1B, per weight type: weight bytes
 * streamed per second against the device's copy bandwidth (read + write per second, as
 * cuda_probe_copy_bandwidth counts it; a GEMV only reads, so its bound is that figure). Each
 * shape runs BENCH_REPS back-to-back matmuls in one step (wall time over the step / reps). */
#define BENCH_REPS 50

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A weight with cheap pseudo-random bytes (values do not matter for timing). */
static void bench_weight(struct test_weight *w, enum dtype dt, int64_t rows, int64_t cols, int bits, int gs)
{
    memset(w, 0, sizeof(*w));
    w->t.dtype = dt;
    w->t.n_dims = 2;
    w->t.shape[0] = rows;
    w->t.shape[1] = cols;
    size_t bytes = dt == DTYPE_Q ? (size_t)(rows * cols * bits / 8) : (size_t)(rows * cols) * dtype_size(dt);
    uint32_t *p = malloc(bytes);
    for (size_t i = 0; i < bytes / 4; i++) p[i] = (uint32_t)(i * 2654435761u) & 0x3f7f3f7fu; /* finite bf16 pairs */
    w->data = p;
    if (dt == DTYPE_Q) {
        size_t groups = (size_t)(rows * cols / gs);
        w->scales = malloc(groups * 2);
        w->biases = malloc(groups * 2);
        for (size_t i = 0; i < groups; i++) w->scales[i] = w->biases[i] = f32_to_bf16(0.01f);
        w->t.bits = bits;
        w->t.group_size = gs;
        w->t.scales = w->scales;
        w->t.biases = w->biases;
    }
    w->t.data = w->data;
    size_t extra = 0;
    struct cairn_err err;
    CHECK_MSG(be->ops->weight_prepare(be, &w->t, 0, &extra, &err) == CAIRN_OK, "weight_prepare: %s", err.msg);
}

static void bench_gemv_case(enum dtype dt, int bits, int gs, int64_t rows, int64_t cols, int n, double copy_gbs)
{
    struct test_weight w;
    bench_weight(&w, dt, rows, cols, bits, gs);
    float *x = rnd_vec((size_t)(n * cols), 1.0f);
    float *dx = dev_from(x, sizeof(float) * (size_t)(n * cols));
    float *dy = dev_alloc(sizeof(float) * (size_t)(n * rows));
    step_begin(); /* warm-up */
    be->ops->matmul(be, &w.t, dx, dy, n);
    step_end();
    double t0 = bench_now();
    step_begin();
    for (int i = 0; i < BENCH_REPS; i++) be->ops->matmul(be, &w.t, dx, dy, n);
    step_end();
    double us = (bench_now() - t0) / BENCH_REPS * 1e6;
    size_t wbytes = dt == DTYPE_Q ? (size_t)rows * (size_t)(cols * bits / 8 + cols / gs * 4)
                                  : (size_t)(rows * cols) * dtype_size(dt);
    double gbs = (double)wbytes / (us * 1e-6) / 1e9;
    printf("gemv %-5s q%d g%-3d %6lld x %-6lld n=%d: %8.1f us %7.0f GB/s %5.1f %% of copy\n", dtype_name(dt),
           bits, gs, (long long)rows, (long long)cols, n, us, gbs, 100.0 * gbs / copy_gbs);
    dev_free(dx, sizeof(float) * (size_t)(n * cols));
    dev_free(dy, sizeof(float) * (size_t)(n * rows));
    free(x);
    weight_free(&w);
}

/* A decode sub-layer's matmul round with its RMSNorm (and SwiGLU: gate/up of `rows` each) as
 * matmul_fused, and as the plain ops it replaces (rmsnorm, matmul_multi, silu_mul), n = 1. */
static void bench_fused_case(enum dtype dt, int bits, int gs, const int64_t *rows, int count, int64_t cols,
                             int silu, int n, double copy_gbs)
{
    struct test_weight w[3];
    const struct tensor *wt[3];
    float *dy[3];
    size_t wbytes = 0;
    for (int i = 0; i < count; i++) {
        bench_weight(&w[i], dt, rows[i], cols, bits, gs);
        wt[i] = &w[i].t;
        dy[i] = dev_alloc(sizeof(float) * (size_t)(n * rows[i]));
        wbytes += dt == DTYPE_Q ? (size_t)rows[i] * (size_t)(cols * bits / 8 + cols / gs * 4)
                                : (size_t)(rows[i] * cols) * dtype_size(dt);
    }
    float *x = rnd_vec((size_t)(n * cols), 1.0f), *g = rnd_vec((size_t)cols, 0.5f);
    float *dx = dev_from(x, sizeof(float) * (size_t)(n * cols)), *dg = dev_from(g, sizeof(float) * (size_t)cols);
    float *dh = dev_alloc(sizeof(float) * (size_t)(n * cols));
    double us[2];
    for (int plain = 0; plain <= 1; plain++) {
        double t0 = 0;
        for (int rep = -1; rep < BENCH_REPS; rep++) { /* rep -1: warm-up, its own step */
            if (rep <= 0) {
                if (rep == 0) t0 = bench_now();
                step_begin();
            }
            if (plain) {
                be->ops->rmsnorm(be, dh, dx, dg, n, (int)cols, 1e-5f, 0.0f);
                be->ops->matmul_multi(be, wt, dy, count, dh, n);
                if (silu) be->ops->silu_mul(be, dy[0], dy[0], dy[1], (int64_t)n * rows[0]);
            } else {
                struct backend_matmul_fused f = {.w = wt, .y = dy, .count = count, .x = dx, .n = n, .norm = dg,
                                                 .eps = 1e-5f, .h = dh, .silu_mul = silu};
                be->ops->matmul_fused(be, &f);
            }
            if (rep == -1 || rep == BENCH_REPS - 1) step_end();
        }
        us[plain] = (bench_now() - t0) / BENCH_REPS * 1e6;
    }
    double gbs = (double)wbytes / (us[0] * 1e-6) / 1e9;
    printf("fused %-5s q%d g%-3d %6lld rows x %-6lld %s n=%d: %8.1f us (plain ops %8.1f) %5.1f %% of copy\n",
           dtype_name(dt), bits, gs, (long long)(rows[0] + (count > 1 ? rows[1] : 0) + (count > 2 ? rows[2] : 0)),
           (long long)cols, silu ? "norm+silu" : "norm     ", n, us[0], us[1], 100.0 * gbs / copy_gbs);
    for (int i = 0; i < count; i++) {
        dev_free(dy[i], sizeof(float) * (size_t)(n * rows[i]));
        weight_free(&w[i]);
    }
    dev_free(dx, sizeof(float) * (size_t)(n * cols));
    dev_free(dg, sizeof(float) * (size_t)cols);
    dev_free(dh, sizeof(float) * (size_t)(n * cols));
    free(x);
    free(g);
}

/* q_only (--bench-gemv q): the 8B's MLX q4/q8 shapes alone (A/B runs of the q kernel). */
static void bench_gemv(int q_only)
{
    struct cairn_err err;
    double copy_gbs = 0;
    CHECK(cuda_probe_copy_bandwidth(0, (size_t)1 << 30, &copy_gbs, &err) == CAIRN_OK);
    printf("device-to-device copy: %.0f GB/s\n", copy_gbs);
    static const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096},
                                        {2048, 2048}, {8192, 2048}, {2048, 8192}, {512, 2048}};
    static const int ns[] = {1, 8};
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(ns); k++)
        for (size_t i = 0; i < CAIRN_ARRAY_LEN(shapes); i++) {
            if (!q_only) bench_gemv_case(DTYPE_BF16, 0, 0, shapes[i][0], shapes[i][1], ns[k], copy_gbs);
            if (i >= 4) continue; /* the 1B shapes: BF16 only */
            bench_gemv_case(DTYPE_Q, 8, 64, shapes[i][0], shapes[i][1], ns[k], copy_gbs);
            bench_gemv_case(DTYPE_Q, 4, 64, shapes[i][0], shapes[i][1], ns[k], copy_gbs);
        }
    /* the 8B's and the 1B's q/k/v (norm) and gate/up (norm + SwiGLU) rounds */
    static const int64_t qkv8[3] = {4096, 1024, 1024}, gu8[2] = {14336, 14336}, qkv1[3] = {2048, 512, 512},
                         gu1[2] = {8192, 8192};
    static const int kinds[][2] = {{0, 0}, {8, 64}, {4, 64}};
    for (size_t k = q_only ? 1 : 0; k < CAIRN_ARRAY_LEN(kinds); k++) {
        enum dtype dt = kinds[k][0] ? DTYPE_Q : DTYPE_BF16;
        bench_fused_case(dt, kinds[k][0], kinds[k][1], qkv8, 3, 4096, 0, 1, copy_gbs);
        bench_fused_case(dt, kinds[k][0], kinds[k][1], gu8, 2, 4096, 1, 1, copy_gbs);
    }
    if (q_only) return;
    bench_fused_case(DTYPE_BF16, 0, 0, qkv1, 3, 2048, 0, 1, copy_gbs);
    bench_fused_case(DTYPE_BF16, 0, 0, gu1, 2, 2048, 1, 1, copy_gbs);
}

/* test_cuda_ops --bench-mma: the 8B BF16's decode matmuls at 1..16 rows (the tensor-core kernel
 * by default; CAIRN_CUDA_MMA=0: the GEMV up to 8 rows and cuBLASLt above, for comparison), and
 * its q/k/v and gate/up rounds as matmul_fused (the norm as its own kernel at these 8 KiB rows). */
static void bench_mma(void)
{
    struct cairn_err err;
    double copy_gbs = 0;
    CHECK(cuda_probe_copy_bandwidth(0, (size_t)1 << 30, &copy_gbs, &err) == CAIRN_OK);
    printf("device-to-device copy: %.0f GB/s; CAIRN_CUDA_MMA=%s\n", copy_gbs,
           getenv("CAIRN_CUDA_MMA") ? getenv("CAIRN_CUDA_MMA") : "(default)");
    /* the 1B's down_proj (2048 x 8192) too: 128 items, wide blocks */
    static const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}, {2048, 8192}};
    static const int ns[] = {1, 2, 4, 8, 12, 16};
    static const int64_t qkv8[3] = {4096, 1024, 1024}, gu8[2] = {14336, 14336};
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(ns); k++) {
        for (size_t i = 0; i < CAIRN_ARRAY_LEN(shapes); i++)
            bench_gemv_case(DTYPE_BF16, 0, 0, shapes[i][0], shapes[i][1], ns[k], copy_gbs);
        bench_fused_case(DTYPE_BF16, 0, 0, qkv8, 3, 4096, 0, ns[k], copy_gbs);
        bench_fused_case(DTYPE_BF16, 0, 0, gu8, 2, 4096, 1, ns[k], copy_gbs);
    }
}

/* ---- the optional fused ops (tensor/backend.h) against their unfused definitions ---- */

/* matmul_add: y0 + x . W^T for every weight kind (vector and scalar GEMV paths, the GEMM path
 * at n > 8), against the host reference; the scale adds |y0| to sum |w x|. */
static void test_matmul_add_case(enum dtype dt, int64_t rows, int64_t cols, int bits, int gs, int n)
{
    struct test_weight w;
    weight_make(&w, dt, rows, cols, bits, gs);
    size_t m = (size_t)(n * rows);
    float *x = rnd_vec((size_t)(n * cols), 1.0f), *y0 = rnd_vec(m, 4.0f), *got = malloc(m * sizeof(float));
    double *want = malloc(m * sizeof(double)), *scale = malloc(m * sizeof(double));
    ref_matmul(&w.t, x, n, want, scale);
    for (size_t i = 0; i < m; i++) {
        want[i] += y0[i];
        scale[i] += fabs(y0[i]);
    }
    float *dx = dev_from(x, sizeof(float) * (size_t)(n * cols)), *dy = dev_from(y0, m * sizeof(float));
    step_begin();
    be->ops->matmul_add(be, &w.t, dx, dy, n);
    step_end();
    dev_to(got, dy, m * sizeof(float));
    char what[96];
    snprintf(what, sizeof(what), "matmul_add %s q%d g%d %lldx%lld n=%d", dtype_name(dt), bits, gs, (long long)rows,
             (long long)cols, n);
    check_close(what, got, want, scale, m, mm_tol(dt, cols, n));
    dev_free(dx, sizeof(float) * (size_t)(n * cols));
    dev_free(dy, m * sizeof(float));
    free(x);
    free(y0);
    free(got);
    free(want);
    free(scale);
    weight_free(&w);
}

static void test_matmul_add(void)
{
    CHECK(be->ops->matmul_add != NULL);
    if (!be->ops->matmul_add) return;
    static const int ns[] = {1, 2, 5, 8, 9};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(ns); i++) {
        int n = ns[i];
        test_matmul_add_case(DTYPE_F32, 37, 96, 0, 0, n);
        test_matmul_add_case(DTYPE_F16, 41, 136, 0, 0, n);
        test_matmul_add_case(DTYPE_BF16, 67, 264, 0, 0, n);
        test_matmul_add_case(DTYPE_BF16, 11, 33, 0, 0, n); /* scalar kernel */
        test_matmul_add_case(DTYPE_BF16, 9, 4104, 0, 0, n); /* few long rows: one row per warp */
        static const int gss[] = {32, 64, 128};
        for (size_t g = 0; g < CAIRN_ARRAY_LEN(gss); g++) {
            test_matmul_add_case(DTYPE_Q, 35, 256, 4, gss[g], n);
            test_matmul_add_case(DTYPE_Q, 29, 384, 8, gss[g], n);
        }
        test_matmul_add_case(DTYPE_Q, 17, 128, 3, 32, n);
    }
}

/* matmul_fused (the RMSNorm before and SwiGLU after, folded into the GEMV) against its
 * definition: x normed on the host in double (h = x / rms(x) * (g + w_offset), rounded to f32),
 * then the host reference matmul of h (ref_matmul, whose scale carries the q4/q8 digits' bound
 * for h), then silu(gate) * up, whose scale is 1.1 |up| scale_gate + |silu(gate)| scale_up
 * (|silu'| < 1.1). The plain op sequence the fused op stands for (rmsnorm, matmul_multi,
 * silu_mul) runs on the same inputs against the same reference. n > 8 takes the plain ops
 * inside the op (GEMM tolerances), the scalar GEMV's layouts too. mode: bit 1 norm, bit 2
 * silu_mul (count 2, equal rows), bit 4 a norm weight offset of 1 (gemma-style). */
static void fused_ref(const struct test_weight *w, int count, const float *x, const float *g, float off, int n,
                      int64_t cols, int mode, float *h, double **want, double **scale)
{
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * cols;
        double ss = 0;
        for (int64_t i = 0; i < cols; i++) ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / (double)cols + 1e-5);
        for (int64_t i = 0; i < cols; i++)
            h[(size_t)t * cols + i] = (mode & 1) ? (float)(xr[i] * inv * ((double)g[i] + off)) : xr[i];
    }
    for (int i = 0; i < count; i++) ref_matmul(&w[i].t, h, n, want[i], scale[i]);
    if (mode & 2) {
        size_t m = (size_t)(n * w[0].t.shape[0]);
        for (size_t k = 0; k < m; k++) {
            double gt = want[0][k], u = want[1][k], sg = gt / (1.0 + exp(-gt));
            scale[0][k] = 1.1 * fabs(u) * scale[0][k] + fabs(sg) * scale[1][k];
            want[0][k] = sg * u;
        }
    }
}

static void test_matmul_fused_case(enum dtype dt, int64_t rows, int64_t cols, int bits, int gs, int n, int mode)
{
    int silu = (mode & 2) != 0, count = silu ? 2 : 3;
    const int64_t rws[3] = {rows, silu ? rows : rows / 3 + 1, silu ? rows : 5};
    struct test_weight w[3];
    const struct tensor *wt[3];
    float *dy[3];
    double *want[3], *scale[3];
    float off = (mode & 4) ? 1.0f : 0.0f;
    for (int i = 0; i < count; i++) {
        weight_make(&w[i], dt, rws[i], cols, bits, gs);
        wt[i] = &w[i].t;
        dy[i] = dev_alloc(sizeof(float) * (size_t)(n * rws[i]));
        want[i] = malloc(sizeof(double) * (size_t)(n * rws[i]));
        scale[i] = malloc(sizeof(double) * (size_t)(n * rws[i]));
    }
    float *x = rnd_vec((size_t)(n * cols), 1.0f), *g = rnd_vec((size_t)cols, 0.5f);
    if (!(mode & 4))
        for (int64_t i = 0; i < cols; i++) g[i] += 1.0f;
    float *h = malloc(sizeof(float) * (size_t)(n * cols));
    fused_ref(w, count, x, g, off, n, cols, mode, h, want, scale);
    size_t xb = sizeof(float) * (size_t)(n * cols);
    float *dx = dev_from(x, xb), *dg = dev_from(g, sizeof(float) * (size_t)cols), *dh = dev_alloc(xb);
    float *got = malloc(sizeof(float) * (size_t)(n * rows));
    for (int plain = 0; plain <= 1; plain++) {
        step_begin();
        if (plain) {
            const float *in = dx;
            if (mode & 1) {
                be->ops->rmsnorm(be, dh, dx, dg, n, (int)cols, 1e-5f, off);
                in = dh;
            }
            be->ops->matmul_multi(be, wt, dy, count, in, n);
            if (silu) be->ops->silu_mul(be, dy[0], dy[0], dy[1], (int64_t)n * rows);
        } else {
            struct backend_matmul_fused f = {.w = wt, .y = dy, .count = count, .x = dx, .n = n,
                                             .norm = (mode & 1) ? dg : NULL, .eps = 1e-5f, .w_offset = off,
                                             .h = dh, .silu_mul = silu};
            be->ops->matmul_fused(be, &f);
        }
        step_end();
        for (int i = 0; i < (silu ? 1 : count); i++) {
            dev_to(got, dy[i], sizeof(float) * (size_t)(n * rws[i]));
            char what[160];
            snprintf(what, sizeof(what), "matmul_fused%s %s q%d g%d %lldx%lld n=%d norm=%d silu=%d off=%g #%d",
                     plain ? " (plain ops)" : "", dtype_name(dt), bits, gs, (long long)rws[i], (long long)cols, n,
                     mode & 1, silu, off, i);
            check_close(what, got, want[i], scale[i], (size_t)(n * rws[i]), mm_tol(dt, cols, n));
        }
    }
    for (int i = 0; i < count; i++) {
        dev_free(dy[i], sizeof(float) * (size_t)(n * rws[i]));
        free(want[i]);
        free(scale[i]);
        weight_free(&w[i]);
    }
    dev_free(dx, xb);
    dev_free(dh, xb);
    dev_free(dg, sizeof(float) * (size_t)cols);
    free(x);
    free(g);
    free(h);
    free(got);
}

/* A fused GEMV row's bits do not depend on the batch (as test_gemv_invariant for the plain one):
 * norm + SwiGLU over gate/up, and norm alone over two weights of one launch, for x row t alone
 * (n = 1) and inside batches of 1..8. */
static void test_matmul_fused_invariant_case(enum dtype dt, int64_t rows, int64_t cols, int bits, int gs)
{
    enum { NMAX = CUDA_GEMV_MAX_N_TEST };
    struct test_weight w[2];
    for (int i = 0; i < 2; i++) weight_make(&w[i], dt, rows, cols, bits, gs);
    const struct tensor *wt[2] = {&w[0].t, &w[1].t};
    float *x = rnd_vec((size_t)(NMAX * cols), 1.0f), *g = rnd_vec((size_t)cols, 0.5f);
    size_t xb = sizeof(float) * (size_t)(NMAX * cols), yb = sizeof(float) * (size_t)(NMAX * rows);
    float *dx = dev_from(x, xb), *dg = dev_from(g, sizeof(float) * (size_t)cols), *dh = dev_alloc(xb);
    float *dy[2] = {dev_alloc(yb), dev_alloc(yb)};
    float *solo = malloc(yb), *got = malloc(yb);
    for (int silu = 0; silu <= 1; silu++) {
        for (int n = 0; n <= NMAX; n++) { /* n = 0: each row alone, into solo */
            for (int t = 0; t < (n ? 1 : NMAX); t++) {
                float *ys[2] = {dy[0] + (int64_t)t * rows, dy[1] + (int64_t)t * rows};
                struct backend_matmul_fused f = {.w = wt, .y = ys, .count = 2, .x = dx + (int64_t)t * cols,
                                                 .n = n ? n : 1, .norm = dg, .eps = 1e-5f, .w_offset = 1.0f,
                                                 .h = dh, .silu_mul = silu};
                step_begin();
                be->ops->matmul_fused(be, &f);
                step_end();
            }
            if (!n) {
                dev_to(solo, dy[0], yb);
                continue;
            }
            dev_to(got, dy[0], sizeof(float) * (size_t)(n * rows));
            CHECK_MSG(memcmp(got, solo, sizeof(float) * (size_t)(n * rows)) == 0,
                      "matmul_fused batch-invariant %s q%d g%d %lldx%lld n=%d silu=%d: not bitwise the solo rows",
                      dtype_name(dt), bits, gs, (long long)rows, (long long)cols, n, silu);
        }
    }
    dev_free(dx, xb);
    dev_free(dh, xb);
    dev_free(dg, sizeof(float) * (size_t)cols);
    dev_free(dy[0], yb);
    dev_free(dy[1], yb);
    free(x);
    free(g);
    free(solo);
    free(got);
    weight_free(&w[0]);
    weight_free(&w[1]);
}

static void test_matmul_fused(void)
{
    CHECK(be->ops->matmul_fused != NULL);
    if (!be->ops->matmul_fused) return;
    static const int ns[] = {1, 2, 3, 5, 8, 9};
    static const int modes[] = {1, 2, 3, 7};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(ns); i++)
        for (size_t k = 0; k < CAIRN_ARRAY_LEN(modes); k++) {
            int n = ns[i], mode = modes[k];
            test_matmul_fused_case(DTYPE_F32, 37, 96, 0, 0, n, mode);
            test_matmul_fused_case(DTYPE_F16, 41, 136, 0, 0, n, mode);
            test_matmul_fused_case(DTYPE_BF16, 67, 264, 0, 0, n, mode);
            test_matmul_fused_case(DTYPE_BF16, 11, 33, 0, 0, n, mode);  /* scalar GEMV: the plain ops */
            test_matmul_fused_case(DTYPE_BF16, 9, 4104, 0, 0, n, mode); /* few long rows */
            if (n <= 3) test_matmul_fused_case(DTYPE_BF16, 2300, 4104, 0, 0, n, mode); /* 8 KiB rows */
            static const int gss[] = {32, 64, 128};
            for (size_t g = 0; g < CAIRN_ARRAY_LEN(gss); g++) {
                test_matmul_fused_case(DTYPE_Q, 35, 256, 4, gss[g], n, mode);
                test_matmul_fused_case(DTYPE_Q, 29, 384, 8, gss[g], n, mode);
            }
            test_matmul_fused_case(DTYPE_Q, 17, 128, 3, 32, n, mode); /* scalar GEMV */
            if (n == 8) test_matmul_fused_case(DTYPE_Q, 13, 14336, 8, 64, n, mode); /* 2 x rows per launch */
            if (n == 1) test_matmul_fused_case(DTYPE_Q, 4500, 512, 4, 64, n, mode); /* items per warp: 2-3 */
        }
    /* each fold switched off on its own (the A/B switches of the benchmarks), and the norm fold
     * for BF16 weights too (off by default: cuda_backend.c): the same definition */
    static const char *const offs[][2] = {
        {"CAIRN_CUDA_FUSE_NORM", "0"}, {"CAIRN_CUDA_FUSE_SILU", "0"}, {"CAIRN_CUDA_FUSE_NORM", "1"}};
    for (size_t o = 0; o < CAIRN_ARRAY_LEN(offs); o++) {
        struct cairn_err err;
        setenv(offs[o][0], offs[o][1], 1);
        be->ops->destroy(be);
        int st = cuda_backend_open(0, &be, &err);
        unsetenv(offs[o][0]);
        if (st != CAIRN_OK) {
            fprintf(stderr, "reopen: %s\n", err.msg);
            exit(1);
        }
        for (int n = 1; n <= 8; n += 7) {
            test_matmul_fused_case(DTYPE_BF16, 67, 264, 0, 0, n, 3);
            test_matmul_fused_case(DTYPE_BF16, 2300, 4104, 0, 0, n, 3);
            test_matmul_fused_case(DTYPE_Q, 35, 256, 4, 64, n, 3);
            test_matmul_fused_case(DTYPE_Q, 29, 384, 8, 32, n, 1);
        }
        be->ops->destroy(be);
        st = cuda_backend_open(0, &be, &err);
        if (st != CAIRN_OK) {
            fprintf(stderr, "reopen: %s\n", err.msg);
            exit(1);
        }
    }
    test_matmul_fused_invariant_case(DTYPE_F32, 37, 96, 0, 0);
    test_matmul_fused_invariant_case(DTYPE_F16, 41, 136, 0, 0);
    test_matmul_fused_invariant_case(DTYPE_BF16, 67, 264, 0, 0);
    test_matmul_fused_invariant_case(DTYPE_BF16, 9, 4104, 0, 0);
    test_matmul_fused_invariant_case(DTYPE_BF16, 2300, 4104, 0, 0);
    test_matmul_fused_invariant_case(DTYPE_Q, 35, 256, 4, 64);
    test_matmul_fused_invariant_case(DTYPE_Q, 29, 384, 8, 32);
    test_matmul_fused_invariant_case(DTYPE_Q, 35, 4096, 4, 128);
    test_matmul_fused_invariant_case(DTYPE_Q, 13, 14336, 8, 64);
    test_matmul_fused_invariant_case(DTYPE_Q, 4500, 512, 4, 64); /* several items per warp at n = 1 */
    test_matmul_fused_invariant_case(DTYPE_Q, 2100, 2560, 8, 128);
}

/* GEMM-sized steps (n > 16, cuda_matmul.c's fuse_gemm): a dense MLP's matmul_fused (norm +
 * gate/up + SwiGLU, the norm and SwiGLU writing the GEMMs' 16-bit inputs) then down_proj's
 * matmul_add (cuBLASLt's beta = 1, x from SwiGLU's copy), in one step, three times (graphs: the
 * run eager, captured, replayed). down's reference is taken on the y[0] the GPU wrote (f32), so
 * its tolerance is the GEMM's; with poke, an add into y[0] between the two ops must be seen (the
 * copy is not reused after any other op). */
static void test_fuse_chain_case(enum dtype dt, int bits, int gs, int64_t hid, int64_t inter, int n, int poke)
{
    struct test_weight w[3];
    weight_make(&w[0], dt, inter, hid, bits, gs);
    weight_make(&w[1], dt, inter, hid, bits, gs);
    weight_make(&w[2], dt, hid, inter, bits, gs);
    const struct tensor *gu[2] = {&w[0].t, &w[1].t};
    size_t xe = (size_t)(n * hid), ie = (size_t)(n * inter);
    float *x = rnd_vec(xe, 1.0f), *g = rnd_vec((size_t)hid, 0.5f), *y0 = rnd_vec(xe, 2.0f), *z = rnd_vec(ie, 1.0f);
    for (int64_t i = 0; i < hid; i++) g[i] += 1.0f;
    float *dx = dev_from(x, xe * 4), *dg = dev_from(g, (size_t)hid * 4), *dh = dev_alloc(xe * 4);
    float *dz = dev_from(z, ie * 4), *dr = dev_alloc(xe * 4);
    float *dy[2] = {dev_alloc(ie * 4), dev_alloc(ie * 4)};
    float *act = malloc(ie * 4), *got = malloc(xe * 4);
    double *want = malloc(xe * sizeof(double)), *scale = malloc(xe * sizeof(double));
    struct cairn_err err;
    for (int rep = 0; rep < 3; rep++) {
        CHECK(be->ops->buf_upload(be, dr, y0, xe * 4, &err) == CAIRN_OK);
        struct backend_matmul_fused f = {.w = gu, .y = dy, .count = 2, .x = dx, .n = n, .norm = dg, .eps = 1e-5f,
                                         .w_offset = 0.0f, .h = dh, .silu_mul = 1};
        step_begin();
        be->ops->matmul_fused(be, &f);
        if (poke) be->ops->add(be, dy[0], dz, (int64_t)ie);
        be->ops->matmul_add(be, &w[2].t, dy[0], dr, n);
        step_end();
        dev_to(act, dy[0], ie * 4);
        dev_to(got, dr, xe * 4);
        ref_matmul(&w[2].t, act, n, want, scale);
        for (size_t i = 0; i < xe; i++) {
            want[i] += y0[i];
            scale[i] += fabs(y0[i]);
        }
        char what[128];
        snprintf(what, sizeof(what), "fused MLP %s q%d g%d hid %lld inter %lld n=%d poke=%d rep %d", dtype_name(dt),
                 bits, gs, (long long)hid, (long long)inter, n, poke, rep);
        check_close(what, got, want, scale, xe, mm_tol(dt, inter, n));
    }
    dev_free(dx, xe * 4);
    dev_free(dg, (size_t)hid * 4);
    dev_free(dh, xe * 4);
    dev_free(dz, ie * 4);
    dev_free(dr, xe * 4);
    dev_free(dy[0], ie * 4);
    dev_free(dy[1], ie * 4);
    free(x);
    free(g);
    free(y0);
    free(z);
    free(act);
    free(got);
    free(want);
    free(scale);
    for (int i = 0; i < 3; i++) weight_free(&w[i]);
}

/* The GEMM-sized folds (fuse_gemm) at n in 17..600: matmul_fused (norm, SwiGLU, both, with the
 * gemma offset) and matmul_add for every weight kind, odd shapes (33 columns: the plain norm
 * and conversion, and the GEMV where cuBLASLt has no algorithm for that stride; n * rows % 4 !=
 * 0: SwiGLU's plain kernel), the MLP chain, and with CAIRN_CUDA_FUSE_GEMM=0 the plain sequence
 * against the same references. */
static void test_fuse_gemm_cases(int quick)
{
    static const int ns[] = {17, 33, 100, 257, 600};
    static const int modes[] = {1, 2, 3, 7};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(ns); i++) {
        int n = ns[i];
        if (quick && n != 33 && n != 257) continue;
        for (size_t k = 0; k < CAIRN_ARRAY_LEN(modes); k++) {
            int mode = modes[k];
            if (quick && mode != 3) continue;
            test_matmul_fused_case(DTYPE_F32, 37, 96, 0, 0, n, mode);
            test_matmul_fused_case(DTYPE_F16, 41, 136, 0, 0, n, mode);
            test_matmul_fused_case(DTYPE_BF16, 67, 264, 0, 0, n, mode);
            test_matmul_fused_case(DTYPE_BF16, 11, 33, 0, 0, n, mode);
            test_matmul_fused_case(DTYPE_Q, 35, 256, 4, 64, n, mode);
            test_matmul_fused_case(DTYPE_Q, 29, 384, 8, 32, n, mode);
            if (n == 100) test_matmul_fused_case(DTYPE_BF16, 300, 4096, 0, 0, n, mode); /* the block-row norm */
        }
        test_matmul_add_case(DTYPE_F32, 37, 96, 0, 0, n);
        test_matmul_add_case(DTYPE_F16, 41, 136, 0, 0, n);
        test_matmul_add_case(DTYPE_BF16, 67, 264, 0, 0, n);
        test_matmul_add_case(DTYPE_BF16, 11, 33, 0, 0, n);
        test_matmul_add_case(DTYPE_Q, 35, 256, 4, 128, n);
        test_matmul_add_case(DTYPE_Q, 29, 384, 8, 64, n);
        for (int poke = 0; poke <= 1; poke++) {
            test_fuse_chain_case(DTYPE_BF16, 0, 0, 264, 344, n, poke);
            test_fuse_chain_case(DTYPE_F16, 0, 0, 136, 200, n, poke);
            if (!quick) {
                test_fuse_chain_case(DTYPE_Q, 4, 64, 256, 384, n, poke);
                test_fuse_chain_case(DTYPE_Q, 8, 32, 384, 256, n, poke);
            }
        }
    }
}

static void test_fuse_gemm(void)
{
    test_fuse_gemm_cases(0);
    struct cairn_err err;
    setenv("CAIRN_CUDA_FUSE_GEMM", "0", 1);
    be->ops->destroy(be);
    int st = cuda_backend_open(0, &be, &err);
    unsetenv("CAIRN_CUDA_FUSE_GEMM");
    if (st != CAIRN_OK) {
        fprintf(stderr, "reopen: %s\n", err.msg);
        exit(1);
    }
    test_fuse_gemm_cases(1);
    be->ops->destroy(be);
    st = cuda_backend_open(0, &be, &err);
    if (st != CAIRN_OK) {
        fprintf(stderr, "reopen: %s\n", err.msg);
        exit(1);
    }
}

/* qk_rope_store against rmsnorm(q), rmsnorm(k), rope(q), rope(k), kv_store on the same inputs:
 * q and k as rewritten in place, and both pools. hd: head_dim (80: not a multiple of the
 * kernel's threads), rot < hd: partial rotary; norms: q/k norm weights given (qwen3). */
static void test_qk_rope_store_case(enum dtype kdt, int hd, int rot, int norms)
{
    const int T = 3, nh = 6, nkv = 2, n_layers = 2, layer = 1, block_size = 4, n_blocks = 5;
    const int32_t pos[3] = {0, 37, 131071}, slots[3] = {13, 2, 19};
    size_t esz = dtype_size(kdt), nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd;
    struct backend_kv_view kv[2];
    for (int p = 0; p < 2; p++) {
        kv[p] = (struct backend_kv_view){.n_blocks = n_blocks, .n_layers = n_layers, .block_size = block_size,
                                         .n_kv_heads = nkv, .head_dim = hd, .dtype = kdt};
        kv[p].layer_block_bytes = (size_t)block_size * nkv * hd * esz;
        kv[p].block_bytes = kv[p].layer_block_bytes * n_layers;
        kv[p].k = dev_alloc(kv[p].block_bytes * n_blocks);
        kv[p].v = dev_alloc(kv[p].block_bytes * n_blocks);
    }
    size_t pool = kv[0].block_bytes * n_blocks;
    float *q = rnd_vec(nq, 2.0f), *k = rnd_vec(nk, 2.0f), *v = rnd_vec(nk, 2.0f);
    float *qn = rnd_vec((size_t)hd, 1.0f), *kn = rnd_vec((size_t)hd, 1.0f), *inv = malloc(sizeof(float) * (size_t)(rot / 2));
    for (int i = 0; i < rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / rot);
    float *dq[2], *dk[2], *dv = dev_from(v, nk * 4), *dqn = dev_from(qn, (size_t)hd * 4), *dkn = dev_from(kn, (size_t)hd * 4);
    float *dinv = dev_from(inv, sizeof(float) * (size_t)(rot / 2));
    int32_t *dpos = dev_from(pos, sizeof(pos)), *dslots = dev_from(slots, sizeof(slots));
    for (int p = 0; p < 2; p++) {
        dq[p] = dev_from(q, nq * 4);
        dk[p] = dev_from(k, nk * 4);
    }
    step_begin();
    struct backend_qk_rope_store r = {
        .q = dq[0], .k = dk[0], .v = dv, .q_norm = norms ? dqn : NULL, .k_norm = norms ? dkn : NULL,
        .pos = dpos, .inv_freq = dinv, .slots = dslots, .kv = &kv[0], .n_tokens = T, .n_heads = nh,
        .rot_dim = rot, .layer = layer, .eps = 1e-6f, .w_offset = norms == 2 ? 1.0f : 0.0f,
    };
    be->ops->qk_rope_store(be, &r);
    if (norms) {
        be->ops->rmsnorm(be, dq[1], dq[1], dqn, T * nh, hd, 1e-6f, r.w_offset);
        be->ops->rmsnorm(be, dk[1], dk[1], dkn, T * nkv, hd, 1e-6f, r.w_offset);
    }
    be->ops->rope(be, dq[1], T, nh, hd, rot, dpos, dinv);
    be->ops->rope(be, dk[1], T, nkv, hd, rot, dpos, dinv);
    be->ops->kv_store(be, &kv[1], layer, dslots, T, dk[1], dv);
    step_end();
    char what[96];
    snprintf(what, sizeof(what), "qk_rope_store %s hd=%d rot=%d norms=%d", dtype_name(kdt), hd, rot, norms);
    /* f32 values: equal but for the norm's summation order (1e-5 of values of order 1-10) */
    float *got = malloc(nq * 4), *ref = malloc(nq * 4);
    double *want = malloc(sizeof(double) * (nq > pool ? nq : pool)), *scale = malloc(sizeof(double) * (nq > pool ? nq : pool));
    const float *const outs[2][2] = {{dq[0], dq[1]}, {dk[0], dk[1]}};
    const size_t counts[2] = {nq, nk};
    for (int o = 0; o < 2; o++) {
        dev_to(got, outs[o][0], counts[o] * 4);
        dev_to(ref, outs[o][1], counts[o] * 4);
        for (size_t i = 0; i < counts[o]; i++) {
            want[i] = ref[i];
            scale[i] = 1.0 + fabs(ref[i]);
        }
        char name[128];
        snprintf(name, sizeof(name), "%s: %s", what, o ? "k" : "q");
        check_close(name, got, want, scale, counts[o], 1e-5);
    }
    /* pools: as floats (bf16 values may round to neighbours where the f32 values differ) */
    uint8_t *pg = malloc(pool), *pr = malloc(pool);
    size_t ne = pool / esz;
    float *fg = malloc(ne * 4);
    for (int which = 0; which < 2; which++) {
        dev_to(pg, which ? kv[0].v : kv[0].k, pool);
        dev_to(pr, which ? kv[1].v : kv[1].k, pool);
        for (size_t i = 0; i < ne; i++) {
            double rv = kdt == DTYPE_F32 ? ((float *)pr)[i] : bf16_to_f32(((uint16_t *)pr)[i]);
            fg[i] = kdt == DTYPE_F32 ? ((float *)pg)[i] : bf16_to_f32(((uint16_t *)pg)[i]);
            want[i] = rv;
            scale[i] = 1.0 + fabs(rv);
        }
        char name[128];
        snprintf(name, sizeof(name), "%s: %s pool", what, which ? "v" : "k");
        check_close(name, fg, want, scale, ne, kdt == DTYPE_F32 ? 1e-5 : 8e-3);
    }
    for (int p = 0; p < 2; p++) {
        dev_free(kv[p].k, pool);
        dev_free(kv[p].v, pool);
        dev_free(dq[p], nq * 4);
        dev_free(dk[p], nk * 4);
    }
    dev_free(dv, nk * 4);
    dev_free(dqn, (size_t)hd * 4);
    dev_free(dkn, (size_t)hd * 4);
    dev_free(dinv, sizeof(float) * (size_t)(rot / 2));
    dev_free(dpos, sizeof(pos));
    dev_free(dslots, sizeof(slots));
    free(q), free(k), free(v), free(qn), free(kn), free(inv), free(got), free(ref), free(want), free(scale);
    free(pg), free(pr), free(fg);
}

static void test_qk_rope_store(void)
{
    CHECK(be->ops->qk_rope_store != NULL);
    if (!be->ops->qk_rope_store) return;
    static const enum dtype kdts[] = {DTYPE_F32, DTYPE_BF16};
    for (size_t d = 0; d < CAIRN_ARRAY_LEN(kdts); d++)
        for (int norms = 0; norms <= 2; norms++) {
            test_qk_rope_store_case(kdts[d], 128, 128, norms);
            test_qk_rope_store_case(kdts[d], 64, 32, norms);
            test_qk_rope_store_case(kdts[d], 80, 80, norms);
        }
}

int main(int argc, char **argv)
{
    struct cairn_err err;
    int bench = argc > 1 && strcmp(argv[1], "--bench-gemv") == 0;
    int bench_m = argc > 1 && strcmp(argv[1], "--bench-mma") == 0;
    if (getenv("CAIRN_CUDA_GEMV_MAX_ROWS")) unsetenv("CAIRN_CUDA_GEMV_MAX_ROWS");
    int st = cuda_backend_open(0, &be, &err);
    if (st == CAIRN_ERR_UNSUPPORTED) {
        printf("test_cuda_ops: skipped: %s\n", err.msg);
        return 77;
    }
    CHECK_MSG(st == CAIRN_OK, "cuda_backend_open: %s", err.msg);
    if (st != CAIRN_OK) return test_summary("test_cuda_ops");
    CHECK(be->kind == BACKEND_CUDA && !be->host_visible && strcmp(be->name, "cuda:0") == 0);
    if (bench_m) {
        bench_mma();
        be->ops->destroy(be);
        return test_summary("test_cuda_ops --bench-mma");
    }
    if (bench) {
        bench_gemv(argc > 2 && strcmp(argv[2], "q") == 0);
        be->ops->destroy(be);
        return test_summary("test_cuda_ops --bench-gemv");
    }
    test_matmul();
    test_matmul_multi();
    test_gemv_fused();
    test_gemv_invariant();
    test_matmul_add();
    test_mma();
    test_mma_invariant();
    test_matmul_fused();
    test_fuse_gemm();
    test_qk_rope_store();
    test_embed();
    test_rmsnorm();
    test_rope();
    test_elementwise();
    test_attention();
    test_attn_prefill();
    test_attn_decode();
    test_attn_replay();
    test_attn_invariance();
    test_graphs();
    test_moe();
    test_gdn_graph();
    /* S in registers (head_k_dim <= 128, head_v_dim a multiple of 8 up to 128), the plain kernel for
     * the other shapes; decode (n = 1) and prefill chunks, odd sizes */
    const struct gdn_dims gdn_shapes[] = {
        {.n_k_heads = 2, .n_v_heads = 4, .head_k_dim = 32, .head_v_dim = 48, .conv_kernel = 4},
        {.n_k_heads = 1, .n_v_heads = 2, .head_k_dim = 128, .head_v_dim = 128, .conv_kernel = 4},
        {.n_k_heads = 1, .n_v_heads = 3, .head_k_dim = 40, .head_v_dim = 8, .conv_kernel = 1},
        {.n_k_heads = 2, .n_v_heads = 2, .head_k_dim = 160, .head_v_dim = 20, .conv_kernel = 3},
    };
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(gdn_shapes); i++) {
        test_gdn_case(gdn_shapes[i], 1);
        test_gdn_case(gdn_shapes[i], i == 1 ? 33 : 7);
    }
    test_errors_and_memory();
    be->ops->destroy(be);
    return test_summary("test_cuda_ops");
}
