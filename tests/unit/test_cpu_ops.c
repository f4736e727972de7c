/* cpu room: every op under every ISA this machine supports, against the scalar reference
 * (cpu/ref_ops.c), on odd shapes; the pool's exactly-once execution; ISA selection.
 *
 * Tolerances (stated, relative): matmul |y - ref| <= 2e-5 * Σ|w·x| + 1e-6 (f32 summation order
 * vs the double reference; the AVX-512 VNNI q4/q8 path too); attention, rmsnorm, rope, silu: 1e-5 relative + 1e-6 absolute
 * (attention 2e-5: vector exp, and the tiled kernel's other summation order). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "cpu/cpu.h"
#include "cpu/ref.h"
#include "testlib.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static float rng_f(void) { return (float)((rng_u32() & 0xffffff) / 8388608.0 - 1.0); }

static void fill(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = rng_f();
}

/* A weight [out, in] of dtype (bits/gs for DTYPE_Q); buffers freed by weight_free. */
struct test_w {
    struct tensor t;
    void *data, *packed;
    uint16_t *sc, *bi;
};

static void weight_make(struct test_w *w, enum dtype dt, int64_t out, int64_t in, int bits, int gs)
{
    memset(w, 0, sizeof(*w));
    w->t.dtype = dt;
    w->t.n_dims = 2;
    w->t.shape[0] = out;
    w->t.shape[1] = in;
    if (dt == DTYPE_Q) {
        int64_t words = out * in * bits / 32;
        uint32_t *d = malloc((size_t)words * 4);
        for (int64_t i = 0; i < words; i++) d[i] = rng_u32() ^ (rng_u32() << 21);
        int64_t ng = out * in / gs;
        w->sc = malloc((size_t)ng * 2);
        w->bi = malloc((size_t)ng * 2);
        for (int64_t i = 0; i < ng; i++) {
            w->sc[i] = f32_to_bf16(rng_f() * 0.1f);
            w->bi[i] = f32_to_bf16(rng_f() * 0.5f);
        }
        w->data = d;
        w->t.scales = w->sc;
        w->t.biases = w->bi;
        w->t.bits = bits;
        w->t.group_size = gs;
    } else {
        size_t es = dtype_size(dt);
        uint8_t *d = malloc((size_t)(out * in) * es);
        for (int64_t i = 0; i < out * in; i++) {
            float f = rng_f();
            if (dt == DTYPE_F32) memcpy(d + i * 4, &f, 4);
            else {
                uint16_t h = dt == DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
                memcpy(d + i * 2, &h, 2);
            }
        }
        w->data = d;
    }
    w->t.data = w->data;
    /* as the model room does at load: the packed copy when the active kernels use one */
    size_t pb = cpu_pack_bytes(&w->t);
    if (pb) {
        w->packed = aligned_alloc(64, (pb + 63) / 64 * 64);
        cpu_pack(&w->t, w->packed);
        w->t.be_data = w->packed;
    }
}

static void weight_free(struct test_w *w)
{
    free(w->data);
    free(w->packed);
    free(w->sc);
    free(w->bi);
}

/* Compares cpu_matmul with ref_matmul; returns the number of bad outputs. */
static int check_matmul_tol(const struct test_w *w, int n, const char *what, double tol)
{
    int64_t out = w->t.shape[0], in = w->t.shape[1];
    float *x = malloc((size_t)(n * in) * 4), *y = malloc((size_t)(n * out) * 4);
    float *yr = malloc((size_t)(n * out) * 4), *row = malloc((size_t)in * 4);
    fill(x, n * in);
    for (int64_t i = 0; i < n * out; i++) y[i] = NAN;
    cpu_matmul(&w->t, x, y, n);
    ref_matmul(&w->t, x, yr, n, 0, out, row);
    int bad = 0;
    for (int64_t r = 0; r < out; r++) {
        tensor_row_to_f32(&w->t, r, row);
        for (int t = 0; t < n; t++) {
            double norm = 0;
            for (int64_t i = 0; i < in; i++) norm += fabs((double)row[i] * x[t * in + i]);
            double got = y[t * out + r], want = yr[t * out + r];
            if (!(fabs(got - want) <= tol * norm + 1e-6)) {
                if (bad < 3)
                    fprintf(stderr, "  %s isa=%s out=%lld in=%lld n=%d: y[%d,%lld] %g vs %g\n", what,
                            cpu_isa_name(cpu_isa_get()), (long long)out, (long long)in, n, t,
                            (long long)r, got, want);
                bad++;
            }
        }
    }
    free(x);
    free(y);
    free(yr);
    free(row);
    return bad;
}

static int check_matmul(const struct test_w *w, int n, const char *what)
{
    return check_matmul_tol(w, n, what, 2e-5);
}

static void test_matmul(void)
{
    /* n >= CPU_UNPACK_MIN_TOKENS takes the unpacked path; 70 crosses a token block */
    static const int ns[] = {1, 3, 17, 70};
    static const int64_t dense_shapes[][2] = {{1, 16}, {1, 5}, {7, 100}, {33, 256}, {5, 1000}, {64, 64}, {21, 5000}};
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    for (size_t d = 0; d < CAIRN_ARRAY_LEN(dts); d++)
        for (size_t s = 0; s < CAIRN_ARRAY_LEN(dense_shapes); s++)
            for (size_t k = 0; k < CAIRN_ARRAY_LEN(ns); k++) {
                struct test_w w;
                weight_make(&w, dts[d], dense_shapes[s][0], dense_shapes[s][1], 0, 0);
                CHECK_MSG(check_matmul(&w, ns[k], dtype_name(dts[d])) == 0, "%s %lldx%lld n=%d",
                          dtype_name(dts[d]), (long long)dense_shapes[s][0],
                          (long long)dense_shapes[s][1], ns[k]);
                weight_free(&w);
            }
    static const int gss[] = {32, 64, 128};
    for (int bits = 2; bits <= 8; bits++)
        for (size_t g = 0; g < CAIRN_ARRAY_LEN(gss); g++)
            for (size_t k = 0; k < CAIRN_ARRAY_LEN(ns); k++) {
                int64_t in = gss[g] * (bits == 4 || bits == 8 ? 3 : 2), out = k == 0 ? 1 : 13;
                struct test_w w;
                weight_make(&w, DTYPE_Q, out, in, bits, gss[g]);
                CHECK_MSG(check_matmul(&w, ns[k], "Q") == 0, "q%d g%d %lldx%lld n=%d", bits, gss[g],
                          (long long)out, (long long)in, ns[k]);
                weight_free(&w);
            }
}

/* q4/q8 on the VNNI path (packed weights, int8-digit activations; AVX-512 VNNI or AVX-VNNI):
 * 2e-5 of Σ|w·x| like every matmul. Shapes cross its tiles: rows in blocks of 16 (21 leaves
 * 5), up to 7 tokens per tile and 63 per token block (70), groups of 32 to 128; from 8 tokens
 * pairs of blocks in tiles of up to 3 tokens (80 and 272 rows: an odd block left) and the
 * guided row split over several chunks (272). */
static void test_matmul_q16(void)
{
    static const int ns[] = {1, 2, 3, 5, 17, 70};
    static const int gss[] = {32, 64, 128};
    static const int n_groups[] = {1, 3, 37};
    static const int64_t outs[] = {1, 21, 80, 272};
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t g = 0; g < CAIRN_ARRAY_LEN(gss); g++)
            for (size_t k = 0; k < CAIRN_ARRAY_LEN(ns); k++)
                for (size_t ng = 0; ng < CAIRN_ARRAY_LEN(n_groups); ng++) {
                    struct test_w w;
                    int64_t out = outs[(k + ng) % CAIRN_ARRAY_LEN(outs)];
                    weight_make(&w, DTYPE_Q, out, (int64_t)gss[g] * n_groups[ng], bits, gss[g]);
                    CHECK_MSG(w.t.be_data != NULL, "q%d g%d packed", bits, gss[g]);
                    CHECK_MSG(check_matmul_tol(&w, ns[k], "Q vnni", 2e-5) == 0, "vnni q%d g%d %lldx%lld n=%d",
                              bits, gss[g], (long long)out, (long long)gss[g] * n_groups[ng], ns[k]);
                    weight_free(&w);
                }
}

/* CAIRN_CPU_QACT=fast: the VNNI tiles multiply the first activation digit alone, x0 =
 * round(x/d) with d = max|x|/127 of the (token, group), so each input is off by at most d/2:
 * every output within Σ_g (d_g/2)·Σ_{i in g} |w_i| (plus the f32 slack of the exact path) of
 * the double reference, and, so that the mode is known to be on, some outputs farther off than
 * the three-digit path's 2e-5 of Σ|w·x|. */
static void test_matmul_q16_fast(void)
{
    static const int ns[] = {1, 3, 17, 70};
    static const int gss[] = {32, 64, 128};
    long coarse = 0;
    CHECK(cpu_vnni_digits() == 1);
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t g = 0; g < CAIRN_ARRAY_LEN(gss); g++)
            for (size_t k = 0; k < CAIRN_ARRAY_LEN(ns); k++) {
                struct test_w w;
                const int n = ns[k], gs = gss[g];
                const int64_t out = k % 2 ? 21 : 80, in = (int64_t)gs * 5;
                weight_make(&w, DTYPE_Q, out, in, bits, gs);
                CHECK_MSG(w.t.be_data != NULL, "q%d g%d packed", bits, gs);
                float *x = malloc((size_t)(n * in) * 4), *y = malloc((size_t)(n * out) * 4);
                float *yr = malloc((size_t)(n * out) * 4), *row = malloc((size_t)in * 4);
                fill(x, n * in);
                cpu_matmul(&w.t, x, y, n);
                ref_matmul(&w.t, x, yr, n, 0, out, row);
                int bad = 0;
                for (int64_t r = 0; r < out; r++) {
                    tensor_row_to_f32(&w.t, r, row);
                    for (int t = 0; t < n; t++) {
                        double norm = 0, bound = 0;
                        for (int64_t g0 = 0; g0 < in; g0 += gs) {
                            double mx = 0, sw = 0;
                            for (int64_t i = g0; i < g0 + gs; i++) {
                                mx = fmax(mx, fabs((double)x[t * in + i]));
                                sw += fabs((double)row[i]);
                                norm += fabs((double)row[i] * x[t * in + i]);
                            }
                            bound += mx / 127.0 / 2.0 * sw;
                        }
                        double err = fabs((double)y[t * out + r] - yr[t * out + r]);
                        if (!(err <= bound * (1 + 1e-5) + 2e-5 * norm + 1e-6) && bad++ < 3)
                            fprintf(stderr, "  q%d fast isa=%s %lldx%lld n=%d: y[%d,%lld] off %g > bound %g\n", bits,
                                    cpu_isa_name(cpu_isa_get()), (long long)out, (long long)in, n, t, (long long)r,
                                    err, bound);
                        coarse += err > 2e-5 * norm + 1e-6;
                    }
                }
                CHECK_MSG(bad == 0, "vnni fast q%d g%d %lldx%lld n=%d: %d outputs past the one-digit bound", bits, gs,
                          (long long)out, (long long)in, n, bad);
                free(x);
                free(y);
                free(yr);
                free(row);
                weight_free(&w);
            }
    CHECK_MSG(coarse > 0, "CAIRN_CPU_QACT=fast: no output coarser than the three-digit path (mode off?)");
}

/* cpu_matmul_multi gives each weight exactly what cpu_matmul gives it alone (same kernels, same
 * summation order), for weights that can share a round and for ones that cannot. */
static void test_matmul_multi(void)
{
    struct {
        enum dtype dt;
        int64_t out, in;
        int bits, gs;
    } sets[][3] = {
        {{DTYPE_Q, 40, 256, 4, 64}, {DTYPE_Q, 16, 256, 4, 64}, {DTYPE_Q, 16, 256, 4, 64}},
        {{DTYPE_Q, 33, 192, 8, 64}, {DTYPE_Q, 48, 192, 8, 64}, {DTYPE_Q, 1, 192, 8, 64}},
        {{DTYPE_BF16, 70, 100, 0, 0}, {DTYPE_BF16, 5, 100, 0, 0}, {DTYPE_BF16, 64, 100, 0, 0}},
        {{DTYPE_Q, 32, 256, 4, 64}, {DTYPE_Q, 32, 256, 8, 64}, {DTYPE_BF16, 9, 256, 0, 0}}, /* mixed */
    };
    for (size_t si = 0; si < CAIRN_ARRAY_LEN(sets); si++)
        for (int n = 1; n <= 9; n += 4) {
            struct test_w w[3];
            const struct tensor *wt[3];
            float *y[3], *yref[3];
            int64_t in = sets[si][0].in;
            float *x = malloc((size_t)(n * in) * 4);
            fill(x, n * in);
            for (int i = 0; i < 3; i++) {
                weight_make(&w[i], sets[si][i].dt, sets[si][i].out, in, sets[si][i].bits, sets[si][i].gs);
                wt[i] = &w[i].t;
                y[i] = malloc((size_t)(n * sets[si][i].out) * 4);
                yref[i] = malloc((size_t)(n * sets[si][i].out) * 4);
                cpu_matmul(wt[i], x, yref[i], n);
            }
            cpu_matmul_multi(wt, y, 3, x, n);
            for (int i = 0; i < 3; i++) {
                CHECK_MSG(memcmp(y[i], yref[i], (size_t)(n * sets[si][i].out) * 4) == 0,
                          "multi set %zu weight %d n=%d isa %s", si, i, n, cpu_isa_name(cpu_isa_get()));
                weight_free(&w[i]);
                free(y[i]);
                free(yref[i]);
            }
            free(x);
        }
}

static int close_rel(const float *a, const float *b, int64_t n, double rel, double abs_tol)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= rel * fabs((double)b[i]) + abs_tol)) {
            if (bad < 3) fprintf(stderr, "  [%lld] %g vs %g\n", (long long)i, a[i], b[i]);
            bad++;
        }
    return bad;
}

static void test_elementwise(void)
{
    static const int dims[] = {1, 7, 64, 100, 1000};
    for (size_t d = 0; d < CAIRN_ARRAY_LEN(dims); d++) {
        int dim = dims[d], rows = 5;
        int64_t n = (int64_t)rows * dim;
        float *x = malloc((size_t)n * 4), *w = malloc((size_t)dim * 4);
        float *y = malloc((size_t)n * 4), *yr = malloc((size_t)n * 4), *u = malloc((size_t)n * 4);
        fill(x, n);
        fill(w, dim);
        fill(u, n);
        cpu_rmsnorm(y, x, w, rows, dim, 1e-6f, 0.0f);
        ref_rmsnorm(yr, x, w, rows, dim, 1e-6f, 0.0f);
        CHECK_MSG(close_rel(y, yr, n, 1e-5, 1e-6) == 0, "rmsnorm dim %d", dim);
        cpu_rmsnorm(y, x, w, rows, dim, 1e-6f, 1.0f);
        ref_rmsnorm(yr, x, w, rows, dim, 1e-6f, 1.0f);
        CHECK_MSG(close_rel(y, yr, n, 1e-5, 1e-6) == 0, "rmsnorm offset dim %d", dim);
        cpu_rmsnorm(y, x, NULL, rows, dim, 1e-6f, 0.0f);
        ref_rmsnorm(yr, x, NULL, rows, dim, 1e-6f, 0.0f);
        CHECK_MSG(close_rel(y, yr, n, 1e-5, 1e-6) == 0, "rmsnorm no weight dim %d", dim);
        memcpy(y, x, (size_t)n * 4); /* in place */
        cpu_rmsnorm(y, y, w, rows, dim, 1e-6f, 0.0f);
        ref_rmsnorm(yr, x, w, rows, dim, 1e-6f, 0.0f);
        CHECK_MSG(close_rel(y, yr, n, 1e-5, 1e-6) == 0, "rmsnorm aliased dim %d", dim);

        for (int64_t i = 0; i < n; i++) x[i] *= 12; /* exercise the exp range */
        cpu_silu_mul(y, x, u, n);
        ref_silu_mul(yr, x, u, n);
        CHECK_MSG(close_rel(y, yr, n, 1e-5, 1e-6) == 0, "silu_mul n %lld", (long long)n);
        memcpy(y, x, (size_t)n * 4);
        cpu_silu_mul(y, y, u, n);
        CHECK_MSG(close_rel(y, yr, n, 1e-5, 1e-6) == 0, "silu_mul aliased n %lld", (long long)n);

        memcpy(y, x, (size_t)n * 4);
        cpu_add(y, u, n);
        for (int64_t i = 0; i < n; i++) yr[i] = x[i] + u[i];
        CHECK_MSG(close_rel(y, yr, n, 0, 0) == 0, "add n %lld", (long long)n);
        memcpy(y, x, (size_t)n * 4);
        cpu_add_bias(y, w, rows, dim);
        for (int64_t i = 0; i < n; i++) yr[i] = x[i] + w[i % dim];
        CHECK_MSG(close_rel(y, yr, n, 0, 0) == 0, "add_bias dim %d", dim);
        free(x);
        free(w);
        free(y);
        free(yr);
        free(u);
    }
    /* A big add/silu so the threaded split runs. */
    int64_t n = 300001;
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4), *c = malloc((size_t)n * 4), *r = malloc((size_t)n * 4);
    fill(a, n);
    fill(b, n);
    cpu_silu_mul(c, a, b, n);
    ref_silu_mul(r, a, b, n);
    CHECK(close_rel(c, r, n, 1e-5, 1e-6) == 0);
    memcpy(c, a, (size_t)n * 4);
    cpu_add(c, b, n);
    for (int64_t i = 0; i < n; i++) r[i] = a[i] + b[i];
    CHECK(close_rel(c, r, n, 0, 0) == 0);
    free(a);
    free(b);
    free(c);
    free(r);
}

static void test_rope(void)
{
    static const int cfg[][4] = {{17, 4, 64, 64}, {3, 6, 128, 64}, {5, 2, 20, 10}, {1, 3, 80, 80}};
    for (size_t c = 0; c < CAIRN_ARRAY_LEN(cfg); c++) {
        int nt = cfg[c][0], nh = cfg[c][1], hd = cfg[c][2], rd = cfg[c][3];
        int64_t n = (int64_t)nt * nh * hd;
        float *x = malloc((size_t)n * 4), *xr = malloc((size_t)n * 4), inv[256];
        int32_t pos[32];
        fill(x, n);
        memcpy(xr, x, (size_t)n * 4);
        for (int i = 0; i < rd / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / rd);
        for (int t = 0; t < nt; t++) pos[t] = 3 * t + 1000 * (int)c;
        cpu_rope(x, nt, nh, hd, rd, pos, inv);
        ref_rope(xr, nt, nh, hd, rd, pos, inv);
        CHECK_MSG(close_rel(x, xr, n, 1e-5, 1e-6) == 0, "rope cfg %zu", c);
        free(x);
        free(xr);
    }
}

/* Attention over a scattered block table, GQA 1..8, f32 and bf16 KV, head dims from 20 to 320
 * (not multiples of 8 or 16 too), under every kernel choice (CAIRN_CPU_ATTN's rowwise, tiled,
 * split, legacy, auto), against ref_attention. Query chunks: a whole prefill of up to 300 tokens (several
 * K/V tiles), chunks after cached prefixes that are not block- or tile-aligned, decode. */
static void test_attention(int big)
{
    static const int cfg[][6] = {
        /* n_heads, n_kv_heads, head_dim, block_size, kv dtype (0 f32, 1 bf16), long cases */
        {6, 2, 64, 16, 0, 0}, {6, 2, 64, 16, 1, 1}, {4, 4, 20, 5, 0, 1}, {8, 1, 128, 32, 1, 0},
        {2, 1, 48, 7, 1, 0}, {4, 2, 192, 16, 1, 0}, {2, 1, 320, 8, 0, 0}, /* V in 8-vector slices; K rows past 256 floats */
        {16, 8, 128, 16, 1, 1}, {8, 2, 36, 16, 0, 1}, {8, 8, 72, 16, 1, 0}, /* GQA 2 (Qwen3), 4, 1 */
    };
    static const enum cpu_attn_mode modes[] = {CPU_ATTN_AUTO, CPU_ATTN_ROWWISE, CPU_ATTN_TILED, CPU_ATTN_SPLIT,
                                               CPU_ATTN_LEGACY};
    /* Cases (first position, tokens): prefill from 0, chunks at unaligned prefixes, a decode
     * token; with `big` (and the config's flag), a 77-token chunk after 45 cached, a 300-token
     * prefill and a 130-token chunk after 170 cached (several K/V tiles of 64). */
    static const int cases[][2] = {{0, 17}, {30, 3}, {69, 1}, {45, 77}, {0, 300}, {170, 130}};
    for (size_t c = 0; c < CAIRN_ARRAY_LEN(cfg); c++) {
        const int long_cases = big && cfg[c][5];
        const size_t n_cases = long_cases ? CAIRN_ARRAY_LEN(cases) : 3;
        const int max_pos = long_cases ? 300 : 70;
        int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], bs = cfg[c][3];
        enum dtype dt = cfg[c][4] ? DTYPE_BF16 : DTYPE_F32;
        int n_blocks = (max_pos + bs - 1) / bs + 3;
        /* Paged KV as the kernels see it: 2 layers of n_blocks blocks (tensor/backend.h). */
        struct backend_kv_view kv = {.n_blocks = n_blocks, .n_layers = 2, .block_size = bs, .n_kv_heads = nkv,
                                     .head_dim = hd, .dtype = dt};
        kv.layer_block_bytes = (size_t)bs * (size_t)nkv * (size_t)hd * dtype_size(dt);
        kv.block_bytes = 2 * kv.layer_block_bytes;
        kv.k = calloc((size_t)n_blocks, kv.block_bytes);
        kv.v = calloc((size_t)n_blocks, kv.block_bytes);
        int32_t *table = malloc(sizeof(int32_t) * (size_t)n_blocks);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)max_pos), *slots = malloc(sizeof(int32_t) * (size_t)max_pos);
        CHECK(kv.k && kv.v && table && pos && slots);
        for (int j = 0; j < n_blocks; j++) table[j] = (j * 5 + 2) % n_blocks; /* scattered */
        /* Fill positions [0, max_pos) of layer 1 through the table. */
        int64_t kvrow = (int64_t)nkv * hd;
        float *k = malloc((size_t)(max_pos * kvrow) * 4), *v = malloc((size_t)(max_pos * kvrow) * 4);
        fill(k, max_pos * kvrow);
        fill(v, max_pos * kvrow);
        for (int64_t i = 0; i < max_pos * kvrow; i++) k[i] *= 3;
        for (int p = 0; p < max_pos; p++) {
            pos[p] = p;
            slots[p] = table[p / bs] * bs + p % bs; /* global slot through the table */
        }
        cpu_kv_store(&kv, 1, slots, max_pos, k, v);
        for (size_t q = 0; q < n_cases; q++) {
            int p0 = cases[q][0], nt = cases[q][1];
            int64_t n = (int64_t)nt * nh * hd;
            float *qv = malloc((size_t)n * 4), *o = malloc((size_t)n * 4), *orf = malloc((size_t)n * 4);
            float scratch[512]; /* ref_attention: head_dim floats */
            fill(qv, n);
            struct cpu_attn a = {.q = qv, .out = orf, .n_tokens = nt, .n_heads = nh, .pos = pos + p0,
                                 .kv = &kv, .layer = 1, .block_table = table,
                                 .scale = 1.0f / sqrtf((float)hd)};
            ref_attention(&a, 0, nt, scratch);
            a.out = o;
            for (size_t md = 0; md < CAIRN_ARRAY_LEN(modes); md++) {
                cpu_attn_mode_set(modes[md]);
                for (int64_t i = 0; i < n; i++) o[i] = NAN; /* every output written */
                cpu_attention(&a);
                CHECK_MSG(close_rel(o, orf, n, 2e-5, 2e-6) == 0, "attention cfg %zu case %zu mode %s", c, q,
                          cpu_attn_mode_name(modes[md]));
            }
            cpu_attn_mode_set(CPU_ATTN_AUTO);
            free(qv);
            free(o);
            free(orf);
        }
        free(k);
        free(v);
        free(kv.k);
        free(kv.v);
        free(table);
        free(pos);
        free(slots);
    }
}

/* The split (flash-decoding) kernel of one decode token against ref_attention: head_dim 64 and
 * 128, GQA 1/2/4/8, contexts around a block and a split boundary up to several splits (5000),
 * blocks of 16 and 64 in a scattered table, f32 and bf16 KV, forced (split) and as auto picks
 * it. `full`: the whole grid, else the first context of each shape. Each output is kept per
 * (ISA, case) on the first run and later runs (other thread counts) must give the same bits,
 * as must the token inside a 3-token call (a sequence's result depends on neither). */
#define SPLIT_CASES 192
static float *split_bits[CPU_ISA_N][SPLIT_CASES];

static void test_attention_split(int full)
{
    static const int hds[] = {64, 128}, groups[] = {1, 2, 4, 8}, bss[] = {16, 64};
    static const int ctxs[] = {1000, 1, 15, 16, 17, 5000};
    const int nkv = 2, max_ctx = 5000, isa = (int)cpu_isa_get();
    int shape = 0;
    for (size_t ih = 0; ih < CAIRN_ARRAY_LEN(hds); ih++)
        for (size_t ig = 0; ig < CAIRN_ARRAY_LEN(groups); ig++)
            for (size_t ib = 0; ib < CAIRN_ARRAY_LEN(bss); ib++)
                for (int dti = 0; dti < 2; dti++) {
                    const int hd = hds[ih], nh = nkv * groups[ig], bs = bss[ib];
                    const enum dtype dt = dti ? DTYPE_BF16 : DTYPE_F32;
                    const int n_blocks = (max_ctx + bs - 1) / bs + 1;
                    struct backend_kv_view kv = {.n_blocks = n_blocks, .n_layers = 2, .block_size = bs,
                                                 .n_kv_heads = nkv, .head_dim = hd, .dtype = dt};
                    kv.layer_block_bytes = (size_t)bs * nkv * hd * dtype_size(dt);
                    kv.block_bytes = 2 * kv.layer_block_bytes;
                    kv.k = calloc((size_t)n_blocks, kv.block_bytes);
                    kv.v = calloc((size_t)n_blocks, kv.block_bytes);
                    const int64_t kvrow = (int64_t)nkv * hd;
                    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_blocks);
                    int32_t *slots = malloc(sizeof(int32_t) * (size_t)max_ctx), pos[3];
                    float *k = malloc((size_t)(max_ctx * kvrow) * 4), *v = malloc((size_t)(max_ctx * kvrow) * 4);
                    const int64_t qn = 3 * (int64_t)nh * hd;
                    float *q = malloc((size_t)qn * 4), *o = malloc((size_t)qn * 4), *o3 = malloc((size_t)qn * 4);
                    float *orf = malloc((size_t)qn * 4), scratch[512];
                    CHECK(kv.k && kv.v && table && slots && k && v && q && o && o3 && orf);
                    for (int j = 0; j < n_blocks; j++) table[j] = (j * 7 + 3) % n_blocks;
                    rng_state = 0x2545f4914f6cdd1dull + (uint64_t)shape; /* the same inputs on every run */
                    fill(k, max_ctx * kvrow);
                    fill(v, max_ctx * kvrow);
                    for (int64_t i = 0; i < max_ctx * kvrow; i++) k[i] *= 3;
                    for (int p = 0; p < max_ctx; p++) slots[p] = table[p / bs] * bs + p % bs;
                    cpu_kv_store(&kv, 1, slots, max_ctx, k, v);
                    fill(q, qn);
                    for (size_t ic = 0; ic < (full ? CAIRN_ARRAY_LEN(ctxs) : 1); ic++) {
                        const int n_ctx = ctxs[ic], ci = shape * (int)CAIRN_ARRAY_LEN(ctxs) + (int)ic;
                        pos[0] = n_ctx - 1;
                        struct cpu_attn a = {.q = q, .out = orf, .n_tokens = 1, .n_heads = nh, .pos = pos, .kv = &kv,
                                             .layer = 1, .block_table = table, .scale = 1.0f / sqrtf((float)hd)};
                        ref_attention(&a, 0, 1, scratch);
                        const int64_t n = (int64_t)nh * hd;
                        a.out = o;
                        cpu_attn_mode_set(CPU_ATTN_AUTO);
                        cpu_attention(&a);
                        CHECK_MSG(close_rel(o, orf, n, 2e-5, 2e-6) == 0, "split auto hd %d group %d bs %d %s ctx %d",
                                  hd, groups[ig], bs, dtype_name(dt), n_ctx);
                        cpu_attn_mode_set(CPU_ATTN_SPLIT);
                        for (int64_t i = 0; i < n; i++) o[i] = NAN;
                        cpu_attention(&a);
                        CHECK_MSG(close_rel(o, orf, n, 2e-5, 2e-6) == 0, "split hd %d group %d bs %d %s ctx %d", hd,
                                  groups[ig], bs, dtype_name(dt), n_ctx);
                        /* the same token last of three (positions n_ctx - 3.., clamped at 0) */
                        if (n_ctx >= 3) {
                            pos[2] = n_ctx - 1, pos[1] = n_ctx - 2, pos[0] = n_ctx - 3;
                            memcpy(q + 2 * n, q, sizeof(float) * (size_t)n);
                            struct cpu_attn a3 = a;
                            a3.n_tokens = 3;
                            a3.out = o3;
                            cpu_attention(&a3);
                            CHECK_MSG(memcmp(o3 + 2 * n, o, sizeof(float) * (size_t)n) == 0,
                                      "split: a token's bits depend on the call, hd %d ctx %d", hd, n_ctx);
                            fill(q + n, 2 * n);
                        }
                        CAIRN_ASSERT(ci < SPLIT_CASES);
                        if (!split_bits[isa][ci]) {
                            split_bits[isa][ci] = malloc(sizeof(float) * (size_t)n);
                            memcpy(split_bits[isa][ci], o, sizeof(float) * (size_t)n);
                        } else {
                            CHECK_MSG(memcmp(split_bits[isa][ci], o, sizeof(float) * (size_t)n) == 0,
                                      "split: bits depend on the thread count, hd %d ctx %d (%d threads)", hd, n_ctx,
                                      cpu_n_threads());
                        }
                    }
                    cpu_attn_mode_set(CPU_ATTN_AUTO);
                    shape++;
                    free(k);
                    free(v);
                    free(q);
                    free(o);
                    free(o3);
                    free(orf);
                    free(kv.k);
                    free(kv.v);
                    free(table);
                    free(slots);
                }
}

/* The attention mode's names, and CAIRN_CPU_ATTN as cpu_init reads it. */
static void test_attn_mode(void)
{
    CHECK_EQ_INT(cpu_attn_mode_parse("auto"), CPU_ATTN_AUTO);
    CHECK_EQ_INT(cpu_attn_mode_parse("rowwise"), CPU_ATTN_ROWWISE);
    CHECK_EQ_INT(cpu_attn_mode_parse("tiled"), CPU_ATTN_TILED);
    CHECK_EQ_INT(cpu_attn_mode_parse("split"), CPU_ATTN_SPLIT);
    CHECK_EQ_INT(cpu_attn_mode_parse("legacy"), CPU_ATTN_LEGACY);
    CHECK_EQ_INT(cpu_attn_mode_parse("flash"), -1);
    struct cairn_err err = {0};
    setenv("CAIRN_CPU_ATTN", "tiled", 1);
    CHECK(cpu_init(2, &err) == CAIRN_OK);
    CHECK_EQ_INT(cpu_attn_mode_get(), CPU_ATTN_TILED);
    setenv("CAIRN_CPU_ATTN", "bogus", 1);
    CHECK(cpu_init(2, &err) == CAIRN_ERR_INVALID);
    CHECK(strstr(err.msg, "CAIRN_CPU_ATTN") != NULL);
    unsetenv("CAIRN_CPU_ATTN");
    CHECK(cpu_init(2, &err) == CAIRN_OK);
    CHECK_EQ_INT(cpu_attn_mode_get(), CPU_ATTN_AUTO);
}

/* ---- pool ---- */

static _Atomic int pool_counts[16];
static _Atomic int pool_bad_nth;

static void pool_fn(void *ctx, int ith, int nth)
{
    int want = *(const int *)ctx;
    if (nth != want || ith < 0 || ith >= nth) atomic_fetch_add(&pool_bad_nth, 1);
    else atomic_fetch_add(&pool_counts[ith], 1);
}

static void test_pool(void)
{
    static const int sizes[] = {1, 2, 3, 5};
    for (size_t s = 0; s < CAIRN_ARRAY_LEN(sizes); s++) {
        struct cairn_err err = {0};
        CHECK(cpu_init(sizes[s], &err) == CAIRN_OK);
        CHECK_EQ_INT(cpu_n_threads(), sizes[s]);
        for (int i = 0; i < 16; i++) atomic_store(&pool_counts[i], 0);
        atomic_store(&pool_bad_nth, 0);
        int nth = sizes[s], rounds = 20000;
        for (int r = 0; r < rounds; r++) cpu_parallel(pool_fn, &nth);
        CHECK_EQ_INT(atomic_load(&pool_bad_nth), 0);
        for (int i = 0; i < nth; i++) CHECK_EQ_INT(atomic_load(&pool_counts[i]), rounds);
        for (int i = nth; i < 16; i++) CHECK_EQ_INT(atomic_load(&pool_counts[i]), 0);
    }
    cpu_shutdown();
    CHECK_EQ_INT(cpu_n_threads(), 1);
}

static void test_isa_select(void)
{
    CHECK_EQ_INT(cpu_isa_parse("scalar"), CPU_ISA_SCALAR);
    CHECK_EQ_INT(cpu_isa_parse("avx2"), CPU_ISA_AVX2);
    CHECK_EQ_INT(cpu_isa_parse("avx512"), CPU_ISA_AVX512);
    CHECK_EQ_INT(cpu_isa_parse("neon"), -1);
    CHECK(cpu_isa_supported(CPU_ISA_SCALAR));
    struct cairn_err err = {0};
    char *old = getenv("CAIRN_CPU_ISA") ? strdup(getenv("CAIRN_CPU_ISA")) : NULL;
    setenv("CAIRN_CPU_ISA", "scalar", 1);
    CHECK(cpu_init(2, &err) == CAIRN_OK);
    CHECK_EQ_INT(cpu_isa_get(), CPU_ISA_SCALAR);
    setenv("CAIRN_CPU_ISA", "bogus", 1);
    CHECK(cpu_init(2, &err) == CAIRN_ERR_INVALID);
    unsetenv("CAIRN_CPU_ISA");
    CHECK(cpu_init(2, &err) == CAIRN_OK);
    /* Without the env var the best supported ISA is picked. */
    enum cpu_isa best = cpu_isa_supported(CPU_ISA_AVX512) ? CPU_ISA_AVX512
                      : cpu_isa_supported(CPU_ISA_AVX2)   ? CPU_ISA_AVX2
                                                          : CPU_ISA_SCALAR;
    CHECK_EQ_INT(cpu_isa_get(), best);
    if (old) setenv("CAIRN_CPU_ISA", old, 1);
    free(old);
}

int main(void)
{
    test_isa_select();
    test_attn_mode();
    test_pool();
    static const int threads[] = {1, 2, 3};
    for (int isa = 0; isa < CPU_ISA_N; isa++) {
        if (!cpu_isa_supported((enum cpu_isa)isa)) {
            printf("skip isa %s (not supported here)\n", cpu_isa_name((enum cpu_isa)isa));
            continue;
        }
        for (size_t t = 0; t < CAIRN_ARRAY_LEN(threads); t++) {
            struct cairn_err err = {0};
            CHECK(cpu_init(threads[t], &err) == CAIRN_OK);
            CHECK(cpu_isa_set((enum cpu_isa)isa) == CAIRN_OK);
            int before = test_n_fail;
            test_matmul();
            test_matmul_multi();
            /* AVX-512 with VNNI, or AVX2 with AVX-VNNI: q4/q8 packed for the VNNI kernels */
            if (cpu_pack_bytes(&(struct tensor){.dtype = DTYPE_Q, .n_dims = 2, .shape = {16, 64}, .bits = 4,
                                                .group_size = 64})) {
                test_matmul_q16(); /* test_matmul above ran q4/q8 packed too */
                setenv("CAIRN_CPU_QACT", "fast", 1); /* the opt-in one-digit activations */
                cpu_isa_set((enum cpu_isa)isa);
                test_matmul_q16_fast();
                unsetenv("CAIRN_CPU_QACT");
                cpu_isa_set((enum cpu_isa)isa);
                CHECK(cpu_vnni_digits() == 3);
                setenv("CAIRN_CPU_VNNI", "0", 1); /* and now the f32 MLX tiles */
                cpu_isa_set((enum cpu_isa)isa);   /* re-reads CAIRN_CPU_VNNI */
                test_matmul();
                test_matmul_multi();
                unsetenv("CAIRN_CPU_VNNI");
                cpu_isa_set((enum cpu_isa)isa);
            }
            test_elementwise();
            test_rope();
            /* the long cases once per SIMD ISA (under scalar, cpu_attention is ref_attention) */
            test_attention(threads[t] == 2 && isa != CPU_ISA_SCALAR);
            test_attention_split(threads[t] != 3 && isa != CPU_ISA_SCALAR);
            printf("isa %s threads %d: %s\n", cpu_isa_name((enum cpu_isa)isa), threads[t],
                   test_n_fail == before ? "ok" : "FAILED");
        }
    }
    cpu_shutdown();
    for (int i = 0; i < CPU_ISA_N; i++)
        for (int c = 0; c < SPLIT_CASES; c++) free(split_bits[i][c]);
    return test_summary("test_cpu_ops");
}
