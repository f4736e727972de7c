/* Op-by-op cases for a backend against straightforward double-precision references (see
 * backend_cases.h). Every case: host inputs from a fixed generator, device buffers through the
 * backend, one step per op group, outputs downloaded and compared. */
#include "backend_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- harness ---- */

#define BC_MAX_BUFS 64

struct bc {
    struct backend *be;
    double tol_scale;
    struct backend_cases_result *res;
    struct cairn_err *err;
    int rc; /* first backend failure */
    void *bufs[BC_MAX_BUFS];
    size_t sizes[BC_MAX_BUFS];
    int n_bufs;
    uint64_t rng;
};

static float bc_rand(struct bc *c)
{
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(c->rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f; /* [-1, 1) */
}

static void bc_fill(struct bc *c, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = bc_rand(c) * scale;
}

/* Device copy of n bytes of host (NULL: zeroed); NULL after a failure (c->rc set). */
static void *bc_dev(struct bc *c, const void *host, size_t bytes)
{
    if (c->rc != CAIRN_OK || c->n_bufs == BC_MAX_BUFS) {
        if (c->rc == CAIRN_OK)
            c->rc = cairn_err_set(c->err, CAIRN_ERR_INTERNAL, "backend_cases: too many buffers");
        return NULL;
    }
    void *d = NULL;
    c->rc = c->be->ops->buf_alloc(c->be, bytes, CAIRN_MEM_SCRATCH, &d, c->err);
    if (c->rc != CAIRN_OK) return NULL;
    c->bufs[c->n_bufs] = d;
    c->sizes[c->n_bufs++] = bytes;
    if (host) c->rc = c->be->ops->buf_upload(c->be, d, host, bytes, c->err);
    return c->rc == CAIRN_OK ? d : NULL;
}

static void bc_get(struct bc *c, void *host, const void *dev, size_t bytes)
{
    if (c->rc == CAIRN_OK) c->rc = c->be->ops->buf_download(c->be, host, dev, bytes, c->err);
}

static void bc_free_all(struct bc *c)
{
    for (int i = 0; i < c->n_bufs; i++)
        c->be->ops->buf_free(c->be, c->bufs[i], c->sizes[i], CAIRN_MEM_SCRATCH);
    c->n_bufs = 0;
}

static int bc_begin(struct bc *c)
{
    if (c->rc == CAIRN_OK) c->rc = c->be->ops->step_begin(c->be, c->err);
    return c->rc == CAIRN_OK;
}

static void bc_end(struct bc *c)
{
    int rc = c->be->ops->step_end(c->be, c->err);
    if (c->rc == CAIRN_OK) c->rc = rc;
}

/* Compares n values: |got - want| <= tol * tol_scale * scale[i] (scale NULL: 1 + |want|);
 * tol 0: exact. One check. */
static void bc_cmp(struct bc *c, const char *what, const float *got, const double *want,
                   const double *scale, size_t n, double tol)
{
    if (c->rc != CAIRN_OK) return;
    c->res->n_checks++;
    double t = tol * c->tol_scale;
    for (size_t i = 0; i < n; i++) {
        double s = scale ? scale[i] : 1.0 + fabs(want[i]);
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= t * s)) {
            c->res->n_failed++;
            fprintf(stderr, "backend_cases %s: [%zu] got %.9g want %.9g (|d| %.3g > %.3g)\n", what,
                    i, got[i], want[i], d, t * s);
            return;
        }
    }
}

static void bc_cmp_i32(struct bc *c, const char *what, const int32_t *got, const int32_t *want,
                       size_t n)
{
    if (c->rc != CAIRN_OK) return;
    c->res->n_checks++;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            c->res->n_failed++;
            fprintf(stderr, "backend_cases %s: [%zu] got %d want %d\n", what, i, got[i], want[i]);
            return;
        }
}

/* ---- weights ---- */

struct bc_weight {
    struct tensor t; /* host bytes in data/scales/biases; be_data from weight_prepare */
    void *data;
    uint16_t *sc, *bi;
    double *ref; /* [out, in] dequantized, the reference's view */
    int prepared;
};

/* value of MLX affine code: scale * code + bias; codes LSB-first in uint32 words (32/bits each) */
static void bc_weight_make(struct bc *c, struct bc_weight *w, enum dtype dt, int64_t out,
                           int64_t in, int bits, int gs)
{
    memset(w, 0, sizeof(*w));
    w->t.dtype = dt;
    w->t.n_dims = 2;
    w->t.shape[0] = out;
    w->t.shape[1] = in;
    w->ref = malloc(sizeof(double) * (size_t)(out * in));
    if (dt == DTYPE_Q) {
        int per = 32 / bits;
        int64_t words = in / per, groups = in / gs;
        uint32_t *d = calloc((size_t)(out * words), 4);
        w->sc = malloc(sizeof(uint16_t) * (size_t)(out * groups));
        w->bi = malloc(sizeof(uint16_t) * (size_t)(out * groups));
        for (int64_t i = 0; i < out * groups; i++) {
            w->sc[i] = f32_to_bf16(0.02f + 0.01f * fabsf(bc_rand(c)));
            w->bi[i] = f32_to_bf16(0.05f * bc_rand(c));
        }
        for (int64_t r = 0; r < out; r++)
            for (int64_t i = 0; i < in; i++) {
                uint32_t code = (uint32_t)((bc_rand(c) + 1.0f) * 0.5f * (float)(1u << bits)) &
                                ((1u << bits) - 1);
                d[r * words + i / per] |= code << (bits * (i % per));
                int64_t g = r * groups + i / gs;
                w->ref[r * in + i] =
                    (double)bf16_to_f32(w->sc[g]) * code + (double)bf16_to_f32(w->bi[g]);
            }
        w->data = d;
        w->t.bits = bits;
        w->t.group_size = gs;
        w->t.scales = w->sc;
        w->t.biases = w->bi;
    } else {
        size_t es = dtype_size(dt);
        uint8_t *d = malloc((size_t)(out * in) * es);
        for (int64_t i = 0; i < out * in; i++) {
            float f = bc_rand(c) * 0.5f;
            if (dt == DTYPE_F32) {
                memcpy(d + i * 4, &f, 4);
                w->ref[i] = f;
            } else {
                uint16_t h = dt == DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
                memcpy(d + i * 2, &h, 2);
                w->ref[i] = dt == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
            }
        }
        w->data = d;
    }
    w->t.data = w->data;
    size_t extra = 0;
    if (c->rc == CAIRN_OK) c->rc = c->be->ops->weight_prepare(c->be, &w->t, 0, &extra, c->err);
    w->prepared = c->rc == CAIRN_OK;
}

static void bc_weight_free(struct bc *c, struct bc_weight *w)
{
    if (w->prepared) c->be->ops->weight_release(c->be, &w->t);
    free(w->data);
    free(w->sc);
    free(w->bi);
    free(w->ref);
}

/* y[n, out] = x . W^T in double, and scale[n, out] = sum |w x| + 1e-3 (the rounding bound's size).
 */
static void bc_ref_matmul(const double *W, int64_t out, int64_t in, const float *x, int n,
                          double *y, double *scale)
{
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < out; r++) {
            double s = 0, a = 0;
            for (int64_t i = 0; i < in; i++) {
                s += W[r * in + i] * x[(int64_t)t * in + i];
                a += fabs(W[r * in + i] * x[(int64_t)t * in + i]);
            }
            y[(int64_t)t * out + r] = s;
            if (scale) scale[(int64_t)t * out + r] = a + 1e-3;
        }
}

/* ---- cases ---- */

#define BC_TOL_MM 2e-5  /* matmul: relative to sum |w x| (f32 accumulation; int8 digits on VNNI) */
#define BC_TOL_EW 2e-6  /* element-wise and row ops: relative to 1 + |ref| */
#define BC_TOL_ATT 2e-5 /* attention (online softmax in f32) */
#define BC_TOL_GDN 1e-4 /* the DeltaNet recurrence in f32 over several tokens */

static void bc_case_matmul(struct bc *c)
{
    static const struct {
        enum dtype dt;
        int bits, gs;
        int64_t out, in;
    } ws[] = {
        {DTYPE_F32, 0, 0, 37, 100}, {DTYPE_F16, 0, 0, 21, 67},   {DTYPE_BF16, 0, 0, 33, 130},
        {DTYPE_Q, 4, 32, 21, 96},   {DTYPE_Q, 4, 64, 37, 192},   {DTYPE_Q, 4, 128, 16, 256},
        {DTYPE_Q, 8, 32, 19, 64},   {DTYPE_Q, 8, 64, 48, 192},   {DTYPE_Q, 8, 128, 5, 384},
        {DTYPE_Q, 2, 64, 11, 128},  {DTYPE_BF16, 0, 0, 1, 4096},
    };
    static const int ns[] = {1, 3, 9};
    for (size_t k = 0; k < sizeof(ws) / sizeof(ws[0]) && c->rc == CAIRN_OK; k++) {
        struct bc_weight w;
        bc_weight_make(c, &w, ws[k].dt, ws[k].out, ws[k].in, ws[k].bits, ws[k].gs);
        for (size_t j = 0; j < sizeof(ns) / sizeof(ns[0]) && c->rc == CAIRN_OK; j++) {
            int n = ns[j];
            size_t nx = (size_t)n * (size_t)ws[k].in, ny = (size_t)n * (size_t)ws[k].out;
            float *x = malloc(nx * 4), *y = malloc(ny * 4);
            double *yr = malloc(ny * 8), *sc = malloc(ny * 8);
            bc_fill(c, x, nx, 1.0f);
            float *dx = bc_dev(c, x, nx * 4), *dy = bc_dev(c, NULL, ny * 4);
            if (bc_begin(c)) {
                c->be->ops->matmul(c->be, &w.t, dx, dy, n);
                bc_end(c);
            }
            bc_get(c, y, dy, ny * 4);
            bc_ref_matmul(w.ref, ws[k].out, ws[k].in, x, n, yr, sc);
            char what[96];
            if (ws[k].dt == DTYPE_Q)
                snprintf(what, sizeof(what), "matmul q%d g%d %lldx%lld n=%d", ws[k].bits, ws[k].gs,
                         (long long)ws[k].out, (long long)ws[k].in, n);
            else
                snprintf(what, sizeof(what), "matmul %s %lldx%lld n=%d", dtype_name(ws[k].dt),
                         (long long)ws[k].out, (long long)ws[k].in, n);
            bc_cmp(c, what, y, yr, sc, ny, BC_TOL_MM);
            free(x);
            free(y);
            free(yr);
            free(sc);
            bc_free_all(c);
        }
        bc_weight_free(c, &w);
    }
}

static void bc_case_matmul_multi(struct bc *c)
{
    /* q/k/v-like (same input width), then a mixed set the backend must run one by one */
    static const struct {
        enum dtype dt;
        int bits, gs;
        int64_t out;
    } sets[2][3] = {
        {{DTYPE_Q, 4, 64, 40}, {DTYPE_Q, 4, 64, 16}, {DTYPE_Q, 4, 64, 24}},
        {{DTYPE_Q, 8, 64, 33}, {DTYPE_BF16, 0, 0, 7}, {DTYPE_Q, 4, 32, 20}},
    };
    const int64_t in = 192;
    const int n = 5;
    for (int s = 0; s < 2 && c->rc == CAIRN_OK; s++) {
        struct bc_weight w[3];
        float *x = malloc((size_t)n * in * 4), *dy[3], *y = malloc((size_t)n * 40 * 4);
        double *yr = malloc((size_t)n * 40 * 8), *sc = malloc((size_t)n * 40 * 8);
        bc_fill(c, x, (size_t)n * in, 1.0f);
        const struct tensor *tw[3];
        for (int i = 0; i < 3; i++) {
            bc_weight_make(c, &w[i], sets[s][i].dt, sets[s][i].out, in, sets[s][i].bits,
                           sets[s][i].gs);
            tw[i] = &w[i].t;
            dy[i] = bc_dev(c, NULL, (size_t)n * (size_t)sets[s][i].out * 4);
        }
        float *dx = bc_dev(c, x, (size_t)n * in * 4);
        if (bc_begin(c)) {
            c->be->ops->matmul_multi(c->be, tw, dy, 3, dx, n);
            bc_end(c);
        }
        for (int i = 0; i < 3; i++) {
            size_t ny = (size_t)n * (size_t)sets[s][i].out;
            bc_get(c, y, dy[i], ny * 4);
            bc_ref_matmul(w[i].ref, sets[s][i].out, in, x, n, yr, sc);
            char what[64];
            snprintf(what, sizeof(what), "matmul_multi set %d weight %d", s, i);
            bc_cmp(c, what, y, yr, sc, ny, BC_TOL_MM);
            bc_weight_free(c, &w[i]);
        }
        bc_free_all(c);
        free(x);
        free(y);
        free(yr);
        free(sc);
    }
}

static void bc_case_embed(struct bc *c)
{
    static const struct {
        enum dtype dt;
        int bits, gs;
    } ws[] = {{DTYPE_F32, 0, 0},
              {DTYPE_BF16, 0, 0},
              {DTYPE_F16, 0, 0},
              {DTYPE_Q, 4, 32},
              {DTYPE_Q, 8, 64}};
    const int64_t V = 29, D = 128;
    const int n = 7;
    int32_t ids[7] = {0, 28, 5, 5, 17, 1, 27};
    for (size_t k = 0; k < sizeof(ws) / sizeof(ws[0]) && c->rc == CAIRN_OK; k++) {
        struct bc_weight w;
        bc_weight_make(c, &w, ws[k].dt, V, D, ws[k].bits, ws[k].gs);
        int32_t *dids = bc_dev(c, ids, sizeof(ids));
        float *dout = bc_dev(c, NULL, (size_t)n * D * 4), out[7 * 128];
        if (bc_begin(c)) {
            c->be->ops->embed(c->be, &w.t, dids, n, dout);
            bc_end(c);
        }
        bc_get(c, out, dout, sizeof(out));
        double want[7 * 128];
        for (int t = 0; t < n; t++)
            for (int64_t i = 0; i < D; i++)
                want[t * D + i] = w.ref[ids[t] * D + i];
        char what[48];
        snprintf(what, sizeof(what), "embed %s%d", dtype_name(ws[k].dt), ws[k].bits);
        bc_cmp(c, what, out, want, NULL, (size_t)n * D, BC_TOL_EW);
        bc_free_all(c);
        bc_weight_free(c, &w);
    }
}

static void bc_case_rows(struct bc *c)
{
    enum { R = 5, DIM = 67, N = R * DIM };
    float x[N], g[N], u[N], b[DIM], w[DIM], out[N], gate[R];
    double want[N];
    bc_fill(c, x, N, 2.0f);
    bc_fill(c, g, N, 3.0f);
    bc_fill(c, u, N, 1.0f);
    bc_fill(c, b, DIM, 1.0f);
    bc_fill(c, w, DIM, 1.0f);
    bc_fill(c, gate, R, 4.0f);
    /* rmsnorm: with weight (offsets 0 and 1, in place) and without */
    for (int v = 0; v < 3 && c->rc == CAIRN_OK; v++) {
        float eps = 1e-6f, off = v == 1 ? 1.0f : 0.0f;
        float *dx = bc_dev(c, x, sizeof(x)), *dw = v == 2 ? NULL : bc_dev(c, w, sizeof(w));
        float *dy = v == 1 ? dx : bc_dev(c, NULL, sizeof(x));
        if (bc_begin(c)) {
            c->be->ops->rmsnorm(c->be, dy, dx, dw, R, DIM, eps, off);
            bc_end(c);
        }
        bc_get(c, out, dy, sizeof(out));
        for (int r = 0; r < R; r++) {
            double ss = 0;
            for (int i = 0; i < DIM; i++)
                ss += (double)x[r * DIM + i] * x[r * DIM + i];
            double inv = 1.0 / sqrt(ss / DIM + eps);
            for (int i = 0; i < DIM; i++)
                want[r * DIM + i] = x[r * DIM + i] * inv * (v == 2 ? 1.0 : (double)w[i] + off);
        }
        char what[32];
        snprintf(what, sizeof(what), "rmsnorm variant %d", v);
        bc_cmp(c, what, out, want, NULL, N, BC_TOL_EW);
        bc_free_all(c);
    }
    /* element-wise ops, each on fresh copies: silu_mul (out aliases gate), add, add_bias,
     * mul_sigmoid, add_sigmoid_scaled */
    for (int op = 0; op < 5 && c->rc == CAIRN_OK; op++) {
        float *dy = bc_dev(c, op == 0 ? g : x, sizeof(x)), *dg = bc_dev(c, g, sizeof(g));
        float *du = bc_dev(c, u, sizeof(u)), *db = bc_dev(c, b, sizeof(b)),
              *dgate = bc_dev(c, gate, sizeof(gate));
        static const char *const names[5] = {"silu_mul", "add", "add_bias", "mul_sigmoid",
                                             "add_sigmoid_scaled"};
        if (bc_begin(c)) {
            switch (op) {
            case 0:
                c->be->ops->silu_mul(c->be, dy, dy, du, N);
                break;
            case 1:
                c->be->ops->add(c->be, dy, du, N);
                break;
            case 2:
                c->be->ops->add_bias(c->be, dy, db, R, DIM);
                break;
            case 3:
                c->be->ops->mul_sigmoid(c->be, dy, dg, N);
                break;
            case 4:
                c->be->ops->add_sigmoid_scaled(c->be, dy, du, dgate, R, DIM);
                break;
            }
            bc_end(c);
        }
        bc_get(c, out, dy, sizeof(out));
        for (int i = 0; i < N; i++) {
            double gi = g[i], xi = x[i], ui = u[i];
            switch (op) {
            case 0:
                want[i] = gi / (1.0 + exp(-gi)) * ui;
                break;
            case 1:
                want[i] = xi + ui;
                break;
            case 2:
                want[i] = xi + b[i % DIM];
                break;
            case 3:
                want[i] = xi / (1.0 + exp(-gi));
                break;
            case 4:
                want[i] = xi + ui / (1.0 + exp(-(double)gate[i / DIM]));
                break;
            }
        }
        bc_cmp(c, names[op], out, want, NULL, N, BC_TOL_EW);
        bc_free_all(c);
    }
}

static void bc_case_copies(struct bc *c)
{
    enum { R = 6, W = 13 };
    float src[R * 2 * W], a[R * W], b[R * W], big[R * 40];
    double want_a[R * W], want_b[R * W], want_big[R * 40];
    bc_fill(c, src, R * 2 * W, 5.0f);
    /* split_halves */
    float *ds = bc_dev(c, src, sizeof(src)), *da = bc_dev(c, NULL, sizeof(a)),
          *db = bc_dev(c, NULL, sizeof(b));
    /* gather_rows: rows 4, 0, 4, 5 of src seen as [R, 2W] */
    int32_t rows[4] = {4, 0, 4, 5};
    int32_t *drows = bc_dev(c, rows, sizeof(rows));
    float *dg = bc_dev(c, NULL, 4 * 2 * W * 4), g[4 * 2 * W];
    /* copy_rows: columns [3, 3 + 9) of each src row to columns [20, 29) of a 40-wide dst */
    float *dbig = bc_dev(c, NULL, sizeof(big));
    if (bc_begin(c)) {
        c->be->ops->split_halves(c->be, da, db, ds, R, W);
        c->be->ops->gather_rows(c->be, dg, ds, drows, 4, 2 * W);
        c->be->ops->copy_rows(c->be, dbig + 20, 40, ds + 3, 2 * W, R, 9);
        bc_end(c);
    }
    bc_get(c, a, da, sizeof(a));
    bc_get(c, b, db, sizeof(b));
    bc_get(c, g, dg, sizeof(g));
    bc_get(c, big, dbig, sizeof(big));
    double want_g[4 * 2 * W];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < W; i++) {
            want_a[r * W + i] = src[r * 2 * W + i];
            want_b[r * W + i] = src[r * 2 * W + W + i];
        }
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 2 * W; i++)
            want_g[k * 2 * W + i] = src[rows[k] * 2 * W + i];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 40; i++)
            want_big[r * 40 + i] = i >= 20 && i < 29 ? src[r * 2 * W + 3 + i - 20] : 0.0;
    bc_cmp(c, "split_halves a", a, want_a, NULL, R * W, 0);
    bc_cmp(c, "split_halves b", b, want_b, NULL, R * W, 0);
    bc_cmp(c, "gather_rows", g, want_g, NULL, 4 * 2 * W, 0);
    bc_cmp(c, "copy_rows", big, want_big, NULL, R * 40, 0);
    bc_free_all(c);
}

static void bc_case_rope(struct bc *c)
{
    enum { T = 5, H = 3, HD = 24 };
    static const int rots[] = {24, 16};
    for (size_t k = 0; k < 2 && c->rc == CAIRN_OK; k++) {
        int rot = rots[k];
        float x[T * H * HD], out[T * H * HD], inv[HD / 2];
        int32_t pos[T] = {0, 1, 7, 100, 4095};
        bc_fill(c, x, T * H * HD, 1.0f);
        for (int i = 0; i < rot / 2; i++)
            inv[i] = (float)pow(10000.0, -2.0 * i / rot);
        float *dx = bc_dev(c, x, sizeof(x)),
              *dinv = bc_dev(c, inv, sizeof(float) * (size_t)(rot / 2));
        int32_t *dpos = bc_dev(c, pos, sizeof(pos));
        if (bc_begin(c)) {
            c->be->ops->rope(c->be, dx, T, H, HD, rot, dpos, dinv);
            bc_end(c);
        }
        bc_get(c, out, dx, sizeof(out));
        double want[T * H * HD];
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *v = x + (t * H + h) * HD;
                double *o = want + (t * H + h) * HD;
                for (int i = 0; i < HD; i++)
                    o[i] = v[i];
                for (int i = 0; i < rot / 2; i++) { /* rotate-half: pairs (i, i + rot/2) */
                    double ang = (double)pos[t] * inv[i], cs = cos(ang), sn = sin(ang);
                    o[i] = v[i] * cs - v[i + rot / 2] * sn;
                    o[i + rot / 2] = v[i + rot / 2] * cs + v[i] * sn;
                }
            }
        char what[32];
        snprintf(what, sizeof(what), "rope rot_dim %d", rot);
        /* angles up to 4095 rad: f32 argument reduction costs ~1e-4 absolute */
        bc_cmp(c, what, out, want, NULL, T * H * HD, 2e-4);
        bc_free_all(c);
    }
}

/* kv_store and attention over several sequences of different context lengths in one call. */
static void bc_case_attention(struct bc *c, enum dtype kv_dt, int n_heads, int n_kv, int hd, int bs)
{
    enum { NS = 3, LAYERS = 2, LAYER = 1 };
    const int ctx[NS] = {37, 1, 70};    /* last position + 1 of each sequence */
    const int new_tok[NS] = {37, 1, 1}; /* a whole prefill, a first token, a decode at 69 */
    int max_blocks = 0, total_blocks = 0;
    for (int s = 0; s < NS; s++) {
        max_blocks = CAIRN_MAX(max_blocks, (ctx[s] + bs - 1) / bs);
        total_blocks += (ctx[s] + bs - 1) / bs;
    }
    int n_blocks = total_blocks + 2;
    size_t esz = dtype_size(kv_dt), row = (size_t)n_kv * hd;
    struct backend_kv_view kv = {.n_blocks = n_blocks,
                                 .n_layers = LAYERS,
                                 .block_size = bs,
                                 .n_kv_heads = n_kv,
                                 .head_dim = hd,
                                 .dtype = kv_dt};
    kv.layer_block_bytes = (size_t)bs * row * esz;
    kv.block_bytes = LAYERS * kv.layer_block_bytes;
    kv.k = bc_dev(c, NULL, kv.block_bytes * (size_t)n_blocks);
    kv.v = bc_dev(c, NULL, kv.block_bytes * (size_t)n_blocks);
    /* block tables: scattered, from the end of the pool */
    int32_t *bt = calloc((size_t)NS * max_blocks, sizeof(int32_t));
    int next = n_blocks - 1;
    for (int s = 0; s < NS; s++)
        for (int j = 0; j < (ctx[s] + bs - 1) / bs; j++)
            bt[s * max_blocks + j] = next--;
    /* K, V of every position of every sequence (f32), stored in two steps: the past context
     * first (as earlier steps would have), then this step's new tokens. */
    int all = ctx[0] + ctx[1] + ctx[2];
    float *k = malloc(sizeof(float) * (size_t)all * row),
          *v = malloc(sizeof(float) * (size_t)all * row);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)all);
    bc_fill(c, k, (size_t)all * row, 2.0f);
    bc_fill(c, v, (size_t)all * row, 1.0f);
    int off[NS + 1] = {0};
    for (int s = 0; s < NS; s++)
        off[s + 1] = off[s] + ctx[s];
    for (int s = 0; s < NS; s++)
        for (int p = 0; p < ctx[s]; p++)
            slots[off[s] + p] = bt[s * max_blocks + p / bs] * bs + p % bs;
    float *dk = bc_dev(c, k, sizeof(float) * (size_t)all * row),
          *dv = bc_dev(c, v, sizeof(float) * (size_t)all * row);
    int32_t *dslots = bc_dev(c, slots, sizeof(int32_t) * (size_t)all);
    if (bc_begin(c)) {
        c->be->ops->kv_store(c->be, &kv, LAYER, dslots, all, dk, dv);
        bc_end(c);
    }
    /* kv_store check: the stored K/V read back at their slots equal the inputs (bf16-rounded) */
    size_t pool_bytes = kv.block_bytes * (size_t)n_blocks;
    uint8_t *hk = malloc(pool_bytes), *hv = malloc(pool_bytes);
    bc_get(c, hk, kv.k, pool_bytes);
    bc_get(c, hv, kv.v, pool_bytes);
    float *gk = malloc(sizeof(float) * (size_t)all * row),
          *gv = malloc(sizeof(float) * (size_t)all * row);
    double *wk = malloc(sizeof(double) * (size_t)all * row),
           *wv = malloc(sizeof(double) * (size_t)all * row);
    for (int t = 0; t < all; t++) {
        int b = slots[t] / bs, o = slots[t] % bs;
        const uint8_t *kb =
            hk + (size_t)b * kv.block_bytes + LAYER * kv.layer_block_bytes + (size_t)o * row * esz;
        const uint8_t *vb =
            hv + (size_t)b * kv.block_bytes + LAYER * kv.layer_block_bytes + (size_t)o * row * esz;
        for (size_t i = 0; i < row; i++) {
            size_t j = (size_t)t * row + i;
            if (kv_dt == DTYPE_F32) {
                memcpy(&gk[j], kb + 4 * i, 4);
                memcpy(&gv[j], vb + 4 * i, 4);
                wk[j] = k[j];
                wv[j] = v[j];
            } else {
                uint16_t h;
                memcpy(&h, kb + 2 * i, 2);
                gk[j] = bf16_to_f32(h);
                memcpy(&h, vb + 2 * i, 2);
                gv[j] = bf16_to_f32(h);
                wk[j] = bf16_to_f32(f32_to_bf16(k[j]));
                wv[j] = bf16_to_f32(f32_to_bf16(v[j]));
            }
        }
    }
    char what[96];
    snprintf(what, sizeof(what), "kv_store %s K", dtype_name(kv_dt));
    bc_cmp(c, what, gk, wk, NULL, (size_t)all * row, 0);
    snprintf(what, sizeof(what), "kv_store %s V", dtype_name(kv_dt));
    bc_cmp(c, what, gv, wv, NULL, (size_t)all * row, 0);
    /* attention: query rows are each sequence's new tokens */
    int T = new_tok[0] + new_tok[1] + new_tok[2];
    int32_t seq_off[NS + 1] = {0}, pos[64], ctx_len[NS];
    for (int s = 0; s < NS; s++) {
        seq_off[s + 1] = seq_off[s] + new_tok[s];
        ctx_len[s] = ctx[s];
        for (int i = 0; i < new_tok[s]; i++)
            pos[seq_off[s] + i] = ctx[s] - new_tok[s] + i;
    }
    size_t qn = (size_t)T * n_heads * hd;
    float *q = malloc(qn * 4), *out = malloc(qn * 4);
    double *want = malloc(qn * 8);
    bc_fill(c, q, qn, 1.0f);
    float *dq = bc_dev(c, q, qn * 4), *dout = bc_dev(c, NULL, qn * 4);
    int32_t *dpos = bc_dev(c, pos, sizeof(int32_t) * (size_t)T),
            *doff = bc_dev(c, seq_off, sizeof(seq_off));
    int32_t *dbt = bc_dev(c, bt, sizeof(int32_t) * (size_t)NS * max_blocks);
    float scale = 1.0f / sqrtf((float)hd);
    struct backend_attn a = {.q = dq,
                             .out = dout,
                             .n_tokens = T,
                             .n_seqs = NS,
                             .n_heads = n_heads,
                             .pos = dpos,
                             .seq_off = doff,
                             .block_tables = dbt,
                             .bt_stride = max_blocks,
                             .seq_off_host = seq_off,
                             .ctx_len_host = ctx_len,
                             .kv = &kv,
                             .layer = LAYER,
                             .scale = scale};
    if (bc_begin(c)) {
        c->be->ops->attention(c->be, &a);
        bc_end(c);
    }
    bc_get(c, out, dout, qn * 4);
    int group = n_heads / n_kv;
    double *p = malloc(sizeof(double) * 128);
    for (int s = 0; s < NS; s++)
        for (int r = seq_off[s]; r < seq_off[s + 1]; r++)
            for (int h = 0; h < n_heads; h++) {
                const float *qr = q + ((size_t)r * n_heads + h) * hd;
                int kvh = h / group, n_pos = pos[r] + 1;
                double m = -INFINITY, l = 0;
                for (int t = 0; t < n_pos; t++) {
                    const double *kr = wk + ((size_t)(off[s] + t) * row + (size_t)kvh * hd);
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += qr[i] * kr[i];
                    p[t] = d * scale;
                    m = p[t] > m ? p[t] : m;
                }
                for (int t = 0; t < n_pos; t++)
                    l += (p[t] = exp(p[t] - m));
                double *o = want + ((size_t)r * n_heads + h) * hd;
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int t = 0; t < n_pos; t++)
                        acc += p[t] * wv[(size_t)(off[s] + t) * row + (size_t)kvh * hd + i];
                    o[i] = acc / l;
                }
            }
    snprintf(what, sizeof(what), "attention %s heads %d/%d dim %d block %d", dtype_name(kv_dt),
             n_heads, n_kv, hd, bs);
    bc_cmp(c, what, out, want, NULL, qn, BC_TOL_ATT);
    free(p);
    free(q);
    free(out);
    free(want);
    free(hk);
    free(hv);
    free(gk);
    free(gv);
    free(wk);
    free(wv);
    free(k);
    free(v);
    free(slots);
    free(bt);
    bc_free_all(c);
}

/* Prefill-shaped attention: NS sequences, each a chunk of new[s] query tokens after pre[s]
 * cached positions (prefixes not block-aligned; chunks from 1 to 300 tokens), all in one call,
 * against a double-precision softmax over the bf16-rounded (or f32) K/V. */
#define BC_ATT_MAX_SEQS 4
static void bc_case_attention_chunks(struct bc *c, enum dtype kv_dt, int n_heads, int n_kv, int hd, int bs,
                                     int ns, const int *pre, const int *new_tok)
{
    enum { LAYERS = 2, LAYER = 1 };
    int max_blocks = 0, n_blocks = 2, all = 0, T = 0;
    int32_t seq_off[BC_ATT_MAX_SEQS + 1] = {0}, ctx_len[BC_ATT_MAX_SEQS], kv_off[BC_ATT_MAX_SEQS];
    for (int s = 0; s < ns; s++) {
        ctx_len[s] = pre[s] + new_tok[s];
        kv_off[s] = all;
        all += ctx_len[s];
        seq_off[s + 1] = seq_off[s] + new_tok[s];
        max_blocks = CAIRN_MAX(max_blocks, (ctx_len[s] + bs - 1) / bs);
        n_blocks += (ctx_len[s] + bs - 1) / bs;
    }
    T = seq_off[ns];
    size_t esz = dtype_size(kv_dt), row = (size_t)n_kv * hd;
    struct backend_kv_view kv = {.n_blocks = n_blocks, .n_layers = LAYERS, .block_size = bs, .n_kv_heads = n_kv,
                                 .head_dim = hd, .dtype = kv_dt};
    kv.layer_block_bytes = (size_t)bs * row * esz;
    kv.block_bytes = LAYERS * kv.layer_block_bytes;
    kv.k = bc_dev(c, NULL, kv.block_bytes * (size_t)n_blocks);
    kv.v = bc_dev(c, NULL, kv.block_bytes * (size_t)n_blocks);
    /* block tables: sequences interleaved over the pool, odd blocks first */
    int32_t *bt = calloc((size_t)ns * max_blocks, sizeof(int32_t));
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)all), *pos = malloc(sizeof(int32_t) * (size_t)T);
    float *k = malloc(sizeof(float) * (size_t)all * row), *v = malloc(sizeof(float) * (size_t)all * row);
    double *wk = malloc(sizeof(double) * (size_t)all * row), *wv = malloc(sizeof(double) * (size_t)all * row);
    size_t qn = (size_t)T * n_heads * hd;
    float *q = malloc(qn * 4), *out = malloc(qn * 4);
    double *want = malloc(qn * 8), *p = malloc(sizeof(double) * (size_t)all);
    int next = 0;
    for (int j = 0; j < max_blocks; j++)
        for (int s = 0; s < ns; s++)
            if (j < (ctx_len[s] + bs - 1) / bs) {
                int b = next++;
                bt[s * max_blocks + j] = b % 2 ? b / 2 : n_blocks - 1 - b / 2;
            }
    for (int s = 0; s < ns; s++)
        for (int t = 0; t < ctx_len[s]; t++)
            slots[kv_off[s] + t] = bt[s * max_blocks + t / bs] * bs + t % bs;
    bc_fill(c, k, (size_t)all * row, 2.0f);
    bc_fill(c, v, (size_t)all * row, 1.0f);
    for (size_t i = 0; i < (size_t)all * row; i++) {
        wk[i] = kv_dt == DTYPE_F32 ? k[i] : bf16_to_f32(f32_to_bf16(k[i]));
        wv[i] = kv_dt == DTYPE_F32 ? v[i] : bf16_to_f32(f32_to_bf16(v[i]));
    }
    float *dk = bc_dev(c, k, sizeof(float) * (size_t)all * row), *dv = bc_dev(c, v, sizeof(float) * (size_t)all * row);
    int32_t *dslots = bc_dev(c, slots, sizeof(int32_t) * (size_t)all);
    if (bc_begin(c)) {
        c->be->ops->kv_store(c->be, &kv, LAYER, dslots, all, dk, dv);
        bc_end(c);
    }
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < new_tok[s]; i++)
            pos[seq_off[s] + i] = pre[s] + i;
    bc_fill(c, q, qn, 1.0f);
    float *dq = bc_dev(c, q, qn * 4), *dout = bc_dev(c, NULL, qn * 4);
    int32_t *dpos = bc_dev(c, pos, sizeof(int32_t) * (size_t)T), *doff = bc_dev(c, seq_off, sizeof(seq_off));
    int32_t *dbt = bc_dev(c, bt, sizeof(int32_t) * (size_t)ns * max_blocks);
    float scale = 1.0f / sqrtf((float)hd);
    struct backend_attn a = {.q = dq, .out = dout, .n_tokens = T, .n_seqs = ns, .n_heads = n_heads, .pos = dpos,
                             .seq_off = doff, .block_tables = dbt, .bt_stride = max_blocks,
                             .seq_off_host = seq_off, .ctx_len_host = ctx_len, .kv = &kv, .layer = LAYER,
                             .scale = scale};
    if (bc_begin(c)) {
        c->be->ops->attention(c->be, &a);
        bc_end(c);
    }
    bc_get(c, out, dout, qn * 4);
    int group = n_heads / n_kv;
    for (int s = 0; s < ns; s++)
        for (int r = seq_off[s]; r < seq_off[s + 1]; r++)
            for (int h = 0; h < n_heads; h++) {
                const float *qr = q + ((size_t)r * n_heads + h) * hd;
                const double *ks = wk + (size_t)kv_off[s] * row + (size_t)(h / group) * hd;
                const double *vs = wv + (size_t)kv_off[s] * row + (size_t)(h / group) * hd;
                int n_pos = pos[r] + 1;
                double m = -INFINITY, l = 0;
                for (int t = 0; t < n_pos; t++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++)
                        d += qr[i] * ks[(size_t)t * row + i];
                    p[t] = d * scale;
                    m = p[t] > m ? p[t] : m;
                }
                for (int t = 0; t < n_pos; t++)
                    l += (p[t] = exp(p[t] - m));
                double *o = want + ((size_t)r * n_heads + h) * hd;
                for (int i = 0; i < hd; i++)
                    o[i] = 0;
                for (int t = 0; t < n_pos; t++)
                    for (int i = 0; i < hd; i++)
                        o[i] += p[t] * vs[(size_t)t * row + i];
                for (int i = 0; i < hd; i++)
                    o[i] /= l;
            }
    char what[128];
    snprintf(what, sizeof(what), "attention chunks %s heads %d/%d dim %d block %d, chunk %d after %d",
             dtype_name(kv_dt), n_heads, n_kv, hd, bs, new_tok[0], pre[0]);
    bc_cmp(c, what, out, want, NULL, qn, BC_TOL_ATT);
    free(bt);
    free(slots);
    free(pos);
    free(k);
    free(v);
    free(wk);
    free(wv);
    free(q);
    free(out);
    free(want);
    free(p);
    bc_free_all(c);
}

static void bc_case_moe(struct bc *c)
{
    enum { N = 6, E = 5, K = 2, H = 64, I = 96 };
    /* route: distinct logits per token, with norm_topk on and off */
    float logits[N * E];
    bc_fill(c, logits, N * E, 3.0f);
    for (int norm = 0; norm < 2 && c->rc == CAIRN_OK; norm++) {
        float *dl = bc_dev(c, logits, sizeof(logits)), *dw = bc_dev(c, NULL, N * K * 4), w[N * K];
        int32_t *dids = bc_dev(c, NULL, N * K * 4), ids[N * K], want_ids[N * K];
        if (bc_begin(c)) {
            c->be->ops->moe_route(c->be, dl, N, E, K, norm, dids, dw);
            bc_end(c);
        }
        bc_get(c, ids, dids, sizeof(ids));
        bc_get(c, w, dw, sizeof(w));
        double want_w[N * K];
        for (int t = 0; t < N; t++) {
            double pr[E], mx = logits[t * E], sum = 0;
            for (int e = 1; e < E; e++)
                mx = logits[t * E + e] > mx ? logits[t * E + e] : mx;
            for (int e = 0; e < E; e++)
                sum += (pr[e] = exp(logits[t * E + e] - mx));
            /* The reference ranks all experts by a stable insertion sort (probability down,
             * id up on ties), an algorithm of its own, and takes the first K. */
            int order[E];
            for (int e = 0; e < E; e++) {
                int at = e;
                while (at > 0 && pr[order[at - 1]] < pr[e])
                    at--;
                memmove(order + at + 1, order + at, sizeof(int) * (size_t)(e - at));
                order[at] = e;
            }
            double wsum = 0;
            for (int k = 0; k < K; k++) {
                want_ids[t * K + k] = order[k];
                want_w[t * K + k] = pr[order[k]] / sum;
                wsum += pr[order[k]] / sum;
            }
            if (norm)
                for (int k = 0; k < K; k++)
                    want_w[t * K + k] /= wsum;
        }
        bc_cmp_i32(c, norm ? "moe_route ids (norm)" : "moe_route ids", ids, want_ids, N * K);
        bc_cmp(c, norm ? "moe_route w (norm)" : "moe_route w", w, want_w, NULL, N * K, BC_TOL_EW);
        bc_free_all(c);
    }
    /* experts: BF16 and q4 g32 expert weights; ids/w chosen here (token 3 uses no expert 0) */
    for (int q = 0; q < 2 && c->rc == CAIRN_OK; q++) {
        struct bc_weight gw[E], uw[E], dw[E];
        struct tensor gt[E], ut[E], dt[E];
        for (int e = 0; e < E; e++) {
            bc_weight_make(c, &gw[e], q ? DTYPE_Q : DTYPE_BF16, I, H, 4, 32);
            bc_weight_make(c, &uw[e], q ? DTYPE_Q : DTYPE_BF16, I, H, 4, 32);
            bc_weight_make(c, &dw[e], q ? DTYPE_Q : DTYPE_BF16, H, I, 4, 32);
            gt[e] = gw[e].t;
            ut[e] = uw[e].t;
            dt[e] = dw[e].t;
        }
        int32_t ids[N * K];
        float w[N * K], x[N * H], out[N * H];
        for (int t = 0; t < N; t++) {
            ids[t * K] = (t * 3 + 1) % E;
            ids[t * K + 1] = (t * 3 + 3) % E;
            w[t * K] = 0.25f + 0.1f * (float)t;
            w[t * K + 1] = 0.6f;
        }
        bc_fill(c, x, N * H, 1.0f);
        float *dx = bc_dev(c, x, sizeof(x)), *dout = bc_dev(c, NULL, sizeof(out)),
              *dwt = bc_dev(c, w, sizeof(w));
        int32_t *dids = bc_dev(c, ids, sizeof(ids));
        float *dscr = bc_dev(c, NULL, sizeof(float) * backend_moe_scratch_floats(N, H, I, K));
        struct backend_moe m = {.x = dx,
                                .out = dout,
                                .n = N,
                                .hidden = H,
                                .inter = I,
                                .n_experts = E,
                                .top_k = K,
                                .ids = dids,
                                .w = dwt,
                                .gate = gt,
                                .up = ut,
                                .down = dt,
                                .scratch = dscr};
        if (bc_begin(c)) {
            c->be->ops->moe_experts(c->be, &m);
            bc_end(c);
        }
        bc_get(c, out, dout, sizeof(out));
        double want[N * H], scale[N * H];
        for (int i = 0; i < N * H; i++)
            want[i] = 0, scale[i] = 1e-3;
        for (int t = 0; t < N; t++)
            for (int k = 0; k < K; k++) {
                int e = ids[t * K + k];
                double g[I], u[I], a[I];
                bc_ref_matmul(gw[e].ref, I, H, x + t * H, 1, g, NULL);
                bc_ref_matmul(uw[e].ref, I, H, x + t * H, 1, u, NULL);
                for (int i = 0; i < I; i++)
                    a[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
                for (int j = 0; j < H; j++) {
                    double s = 0, sa = 0;
                    for (int i = 0; i < I; i++) {
                        s += dw[e].ref[j * I + i] * a[i];
                        sa += fabs(dw[e].ref[j * I + i] * a[i]);
                    }
                    want[t * H + j] += w[t * K + k] * s;
                    scale[t * H + j] += fabs(w[t * K + k]) * (sa + 1.0);
                }
            }
        bc_cmp(c, q ? "moe_experts q4" : "moe_experts bf16", out, want, scale, N * H,
               10 * BC_TOL_MM);
        bc_free_all(c);
        for (int e = 0; e < E; e++) {
            bc_weight_free(c, &gw[e]);
            bc_weight_free(c, &uw[e]);
            bc_weight_free(c, &dw[e]);
        }
    }
}

/* Gated DeltaNet, n tokens of one sequence from a non-zero state, against the recurrence in
 * double (model/gdn.h states the math). */
static void bc_case_gdn(struct bc *c)
{
    enum { NK = 2, NV = 4, DK = 8, DV = 6, KER = 4, N = 5 };
    const int kd = NK * DK, vd = NV * DV, cd = 2 * kd + vd, r = NV / NK;
    const size_t n_state = (size_t)cd * (KER - 1) + (size_t)NV * DK * DV;
    float conv_w[cd * KER], a_log[NV], dt_bias[NV], norm_w[DV], qkv[N * cd], z[N * vd], b[N * NV],
        a[N * NV];
    float *state = malloc(n_state * 4), *out = malloc((size_t)N * vd * 4),
          *state_out = malloc(n_state * 4);
    bc_fill(c, conv_w, (size_t)cd * KER, 0.5f);
    bc_fill(c, a_log, NV, 1.0f);
    bc_fill(c, dt_bias, NV, 1.0f);
    bc_fill(c, norm_w, DV, 1.0f);
    bc_fill(c, qkv, (size_t)N * cd, 1.0f);
    bc_fill(c, z, (size_t)N * vd, 1.0f);
    bc_fill(c, b, N * NV, 2.0f);
    bc_fill(c, a, N * NV, 2.0f);
    bc_fill(c, state, n_state, 0.3f);
    float eps = 1e-6f;
    /* Host memory, like the recurrent state the engine keeps (backend.h: the CPU only for now). */
    float *dconv = bc_dev(c, conv_w, sizeof(conv_w)), *dal = bc_dev(c, a_log, sizeof(a_log));
    float *ddt = bc_dev(c, dt_bias, sizeof(dt_bias)), *dnw = bc_dev(c, norm_w, sizeof(norm_w));
    float *dqkv = bc_dev(c, qkv, sizeof(qkv)), *dz = bc_dev(c, z, sizeof(z)),
          *db = bc_dev(c, b, sizeof(b));
    float *da = bc_dev(c, a, sizeof(a)), *dout = bc_dev(c, NULL, (size_t)N * vd * 4);
    float *hstate = malloc(n_state * 4);
    memcpy(hstate, state, n_state * 4);
    struct backend_gdn g = {.n_k_heads = NK,
                            .n_v_heads = NV,
                            .head_k_dim = DK,
                            .head_v_dim = DV,
                            .conv_kernel = KER,
                            .eps = eps,
                            .conv_w = dconv,
                            .a_log = dal,
                            .dt_bias = ddt,
                            .norm_w = dnw,
                            .state = hstate,
                            .qkv = dqkv,
                            .z = dz,
                            .b = db,
                            .a = da,
                            .n = N,
                            .out = dout};
    if (bc_begin(c)) {
        c->be->ops->gdn(c->be, &g);
        bc_end(c);
    }
    bc_get(c, out, dout, (size_t)N * vd * 4);
    memcpy(state_out, hstate, n_state * 4);
    /* reference */
    double *cs = malloc(sizeof(double) * (size_t)cd * (KER - 1)),
           *S = malloc(sizeof(double) * NV * DK * DV);
    for (int i = 0; i < cd * (KER - 1); i++)
        cs[i] = state[i];
    for (int i = 0; i < NV * DK * DV; i++)
        S[i] = state[(size_t)cd * (KER - 1) + i];
    double *want = malloc(sizeof(double) * (size_t)N * vd),
           *want_state = malloc(sizeof(double) * n_state);
    for (int t = 0; t < N; t++) {
        double x[cd];
        for (int ch = 0; ch < cd; ch++) {
            double acc = conv_w[ch * KER + KER - 1] * (double)qkv[t * cd + ch];
            for (int j = 0; j < KER - 1; j++)
                acc += conv_w[ch * KER + j] * cs[ch * (KER - 1) + j];
            for (int j = 0; j < KER - 2; j++)
                cs[ch * (KER - 1) + j] = cs[ch * (KER - 1) + j + 1];
            cs[ch * (KER - 1) + KER - 2] = qkv[t * cd + ch];
            x[ch] = acc / (1.0 + exp(-acc));
        }
        for (int h = 0; h < NV; h++) {
            int kh = h / r;
            double q[DK], k[DK], qs = 0, ks = 0;
            for (int i = 0; i < DK; i++) {
                q[i] = x[kh * DK + i];
                k[i] = x[kd + kh * DK + i];
                qs += q[i] * q[i];
                ks += k[i] * k[i];
            }
            for (int i = 0; i < DK; i++) {
                q[i] /= sqrt(qs + 1e-6) * sqrt((double)DK);
                k[i] /= sqrt(ks + 1e-6);
            }
            double sp = a[t * NV + h] + (double)dt_bias[h];
            sp = sp > 20 ? sp : log1p(exp(sp));
            double decay = exp(-exp((double)a_log[h]) * sp),
                   beta = 1.0 / (1.0 + exp(-(double)b[t * NV + h]));
            double *Sh = S + (size_t)h * DK * DV, kvm[DV], o[DV];
            for (int j = 0; j < DV; j++) {
                kvm[j] = 0;
                for (int i = 0; i < DK; i++) {
                    Sh[i * DV + j] *= decay;
                    kvm[j] += Sh[i * DV + j] * k[i];
                }
                kvm[j] = (x[2 * kd + h * DV + j] - kvm[j]) * beta;
            }
            double ss = 0;
            for (int j = 0; j < DV; j++) {
                o[j] = 0;
                for (int i = 0; i < DK; i++) {
                    Sh[i * DV + j] += k[i] * kvm[j];
                    o[j] += Sh[i * DV + j] * q[i];
                }
                ss += o[j] * o[j];
            }
            double inv = 1.0 / sqrt(ss / DV + eps);
            for (int j = 0; j < DV; j++) {
                double zz = z[t * vd + h * DV + j];
                want[t * vd + h * DV + j] = o[j] * inv * norm_w[j] * zz / (1.0 + exp(-zz));
            }
        }
    }
    for (int i = 0; i < cd * (KER - 1); i++)
        want_state[i] = cs[i];
    for (int i = 0; i < NV * DK * DV; i++)
        want_state[(size_t)cd * (KER - 1) + i] = S[i];
    bc_cmp(c, "gdn out", out, want, NULL, (size_t)N * vd, BC_TOL_GDN);
    bc_cmp(c, "gdn state", state_out, want_state, NULL, n_state, BC_TOL_GDN);
    free(cs);
    free(S);
    free(want);
    free(want_state);
    free(state);
    free(hstate);
    free(out);
    free(state_out);
    bc_free_all(c);
}

int backend_cases_run(struct backend *be, double tol_scale, struct backend_cases_result *res,
                      struct cairn_err *err)
{
    memset(res, 0, sizeof(*res));
    struct bc c = {.be = be, .tol_scale = tol_scale, .res = res, .err = err, .rng = 0x5eed};
    bc_case_matmul(&c);
    bc_case_matmul_multi(&c);
    bc_case_embed(&c);
    bc_case_rows(&c);
    bc_case_copies(&c);
    bc_case_rope(&c);
    static const int att[][4] = {
        /* n_heads, n_kv_heads, head_dim, block_size */
        {6, 2, 64, 16},
        {4, 4, 20, 5},
        {8, 1, 128, 32},
        {2, 1, 48, 7},
    };
    for (size_t i = 0; i < sizeof(att) / sizeof(att[0]); i++) {
        bc_case_attention(&c, DTYPE_F32, att[i][0], att[i][1], att[i][2], att[i][3]);
        bc_case_attention(&c, DTYPE_BF16, att[i][0], att[i][1], att[i][2], att[i][3]);
    }
    /* Prefill chunks (bc_case_attention_chunks): GQA 1/2/4/8, head dims 64/128 and odd ones,
     * chunks of 1..300 tokens after prefixes that are not block-aligned, several sequences. */
    static const struct {
        int dt_bf16, n_heads, n_kv, hd, bs, ns, pre[BC_ATT_MAX_SEQS], new_tok[BC_ATT_MAX_SEQS];
    } chunks[] = {
        {1, 16, 8, 128, 16, 3, {0, 45, 130}, {300, 77, 1}},   /* Qwen3-0.6B: GQA 2, head_dim 128 */
        {0, 8, 2, 64, 16, 2, {37, 0}, {130, 9}},              /* GQA 4 */
        {1, 8, 1, 72, 16, 3, {0, 99, 5}, {64, 33, 2}},        /* GQA 8, head_dim not a multiple of 16 */
        {0, 4, 4, 36, 7, 2, {200, 61}, {17, 100}},            /* GQA 1, odd block size and head_dim */
        {1, 12, 4, 40, 16, 4, {0, 16, 63, 1}, {47, 16, 65, 3}}, /* GQA 3 */
    };
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++)
        bc_case_attention_chunks(&c, chunks[i].dt_bf16 ? DTYPE_BF16 : DTYPE_F32, chunks[i].n_heads,
                                 chunks[i].n_kv, chunks[i].hd, chunks[i].bs, chunks[i].ns, chunks[i].pre,
                                 chunks[i].new_tok);
    bc_case_moe(&c);
    bc_case_gdn(&c);
    bc_free_all(&c);
    return c.rc;
}
