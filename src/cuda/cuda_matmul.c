/* matmul, matmul_multi, matmul_add and matmul_fused of the CUDA backend: y[n, out] = x[n, in] .
 * W[out, in]^T (matmul_add: y += that; matmul_fused: with the RMSNorm before and SwiGLU after,
 * folded into the GEMV or the tensor-core kernel at the bottom of this file).
 *
 * n in mma_min_rows..mma_max_rows (default 1..CUDA_MMA_MAX_N = 16: decode of up to 16 streams,
 * verify chunks; rows under CUDA_GEMV_LONG_ROW bytes from gemv_max_rows + 1, cuda_mm_mma_wants)
 * with dense BF16/F16 weights the small-batch kernel takes (cuda_gemm_small.cu,
 * cuda_k_mma_takes): W streamed once into tensor-core products, x rounded to bf16/f16 as for
 * cuBLASLt below, f32 accumulation; the same bits for a row at any n up to 16. One launch per
 * matmul_multi, the residual add of matmul_add and matmul_fused's SwiGLU in its epilogue
 * (matmul_fused's norm runs as its own kernel there). CAIRN_CUDA_MMA=0 turns it off, =2 keeps
 * the GEMV for n = 1. Why at n = 1 too: it reads the 8B's BF16 rows faster than the GEMV (H200
 * tg128 200 tok/s against 186) and one kernel for 1..16 rows keeps a row's bits the same in
 * every step up to 16 rows (exact_rows, cuda_backend.c). The rest, as before:
 * n <= gemv_max_rows (default CUDA_GEMV_MAX_N = 8, decode and small batches): the GEMV kernel
 * (cuda_gemv.cu) streams W once with x in f32 and every weight type dequantized exactly in
 * registers, so those decodes have f32-level accuracy (the CPU reference's); matmul_multi runs the
 * weights of one layout in one launch, and matmul_add adds in the GEMV's epilogue.
 * Larger n (prefill, big batches): cuBLASLt with f32 accumulation and f32 output:
 *   BF16 W: x converted to bf16 (round to nearest even), BF16 x BF16 -> F32 GEMM;
 *   F16 W:  x converted to f16, F16 x F16 -> F32;
 *   MLX Q W: W dequantized to bf16 (each value scale * code + bias rounded once to bf16) into
 *            one workspace reused by every call (CUDA_WS_DEQ, as large as the largest weight),
 *            then as BF16. Per call rather than a cached bf16 copy of every weight: the copy
 *            would add 2 bytes per weight to the device memory the model holds (an 8B q4 model:
 *            4.5 GB -> 20.5 GB), memory the KV pool and larger models need; dequantizing reads the codes
 *            once and writes 2 bytes per weight (cuda_gemm_prep.cu, at HBM speed), which costs
 *            about half of the GEMM's time at 512 rows and less as the rows grow;
 *   F32 W:  F32 x F32 -> F32 with CUBLAS_COMPUTE_32F (no TF32).
 * Why bf16 activations rather than TF32 or split-bf16: the tensor cores take bf16 at full rate
 * and TF32 at half, and TF32 would need f32 weights (twice the memory). Rounding x to bf16 costs
 * a relative 2^-9 per input, about what the reference's own bf16 run (activations bf16
 * throughout, tests/cuda/bf16_reference.py) has at every layer; cairn keeps the residual stream,
 * norms, attention and softmax in f32, so its error stays below that reference's.
 * When cuBLASLt has no algorithm for a shape or alignment, the GEMV kernel runs over the rows
 * CUDA_GEMV_MAX_N at a time (correct, slower).
 * Algorithms: asking cuBLASLt's heuristic on every call costs host time that can leave the GPU
 * idle between the short GEMMs of a prefill step, so the choice is cached per shape (types, m,
 * k, lda, alignments, device, and the row count's bucket: cuda_mm_n_bucket) for the process. A
 * shape of at least CUDA_MM_TUNE_MIN_N rows gets up to CUDA_MM_N_ALGOS candidates from the
 * heuristic, each timed once on the call's own buffers (CUDA events, CUDA_MM_TUNE_REPS runs after
 * a warm-up), and keeps the fastest; smaller shapes (and any call inside a stream capture) keep
 * the heuristic's first. Why buckets: a server's steps have ever-changing row counts (session
 * 11's 1,000-request run: 445 distinct counts of 256+ rows), and keyed on the exact count every
 * new one paid 8 timed candidates with a sync each, while the 512-entry cache filled with decode
 * sizes alone and every call after asked the heuristic again. An algorithm chosen for one count
 * serves its bucket (8 per octave); one that cuBLASLt refuses for another count of the bucket
 * (a split-K workspace, say) falls back to the heuristic's first for that exact call.
 * CAIRN_CUDA_LT_CACHE=exact keys on the exact count with at most 512 shapes, as before (A/B). The workspace is
 * CUDA_LT_WS_BYTES (32 MiB). matmul_multi converts x once for all its weights.
 * GEMM-sized steps past the small kernels (n > 16: batched decode of many streams, prefill) fold
 * the small kernels between the GEMMs (fuse_gemm; CAIRN_CUDA_FUSE_GEMM=0: the plain sequence):
 * matmul_fused's RMSNorm writes the 16-bit x the GEMMs read (no f32 h, no conversion), its
 * SwiGLU writes y[0] and a 16-bit copy that down_proj's matmul reads in place of converting
 * y[0] (the memo, cuda_int.h: taken only by the very next op), and matmul_add lets cuBLASLt add
 * into y (beta = 1) instead of a workspace and an add kernel. Why: in a 64-row step of the 8B,
 * those kernels were ~1.4 ms of ~3.3 ms outside the GEMMs (README, "129 conversions"), 3-4 us
 * each. The values the GEMMs read are the same bits as the plain sequence's (each the f32 result
 * rounded once to bf16/f16); matmul_add's sum may round differently where cuBLASLt splits K.
 * CAIRN_CUDA_PROFILE=1 times the GEMMs, the conversions and the dequantization (cuda_prof.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "cuda/cuda_int.h"

#define CUDA_MM_N_ALGOS 8     /* candidates asked of the heuristic */
#define CUDA_MM_TUNE_MIN_N 256 /* rows from which a shape's candidates are timed */
#define CUDA_MM_TUNE_REPS 2    /* timed runs per candidate (after one warm-up) */
#define CUDA_MM_CACHE_N 4096   /* shapes remembered (a hash table); past that the heuristic is
                                * asked each call */

struct cuda_mm_key {
    int device;
    int wt, bt;                /* cudaDataType_t of W and of x */
    int64_t m, n, k, lda;
    uint32_t al_a, al_b, al_c; /* alignment hints */
    int acc;                   /* D = A.B + C (beta = 1), else beta = 0 */
};

struct cuda_mm_algo {
    struct cuda_mm_key key;
    cublasLtMatmulAlgo_t algo;
};

static pthread_mutex_t cuda_mm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cuda_mm_algo cuda_mm_cache[CUDA_MM_CACHE_N]; /* open addressing, linear probes */
static unsigned char cuda_mm_used[CUDA_MM_CACHE_N];
static int cuda_mm_n_cache;

/* CAIRN_CUDA_LT_CACHE=exact: the cache before buckets (exact counts, 512 shapes), for A/B. */
static int cuda_mm_exact(void)
{
    static int v = -1;
    if (__atomic_load_n(&v, __ATOMIC_RELAXED) < 0) {
        const char *e = getenv("CAIRN_CUDA_LT_CACHE");
        __atomic_store_n(&v, e && strcmp(e, "exact") == 0, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&v, __ATOMIC_RELAXED);
}

/* The row count a shape is cached under: exact up to 32, then rounded up to 8 steps per octave
 * (33..63 by 4, 256..511 by 32, 4096..8191 by 512). */
static int64_t cuda_mm_n_bucket(int64_t n)
{
    if (n <= 32 || cuda_mm_exact()) return n;
    int64_t step = 1;
    while ((step << 4) <= n) step <<= 1; /* 2^(floor(log2 n) - 3) */
    return (n + step - 1) / step * step;
}

/* Slot of key, or of the empty slot where it would go (the table never fills: see put). */
static int cuda_mm_slot(const struct cuda_mm_key *key)
{
    int i = (int)(XXH3_64bits(key, sizeof(*key)) & (CUDA_MM_CACHE_N - 1));
    while (cuda_mm_used[i] && memcmp(&cuda_mm_cache[i].key, key, sizeof(*key)) != 0)
        i = (i + 1) & (CUDA_MM_CACHE_N - 1);
    return i;
}

static int cuda_mm_cache_get(const struct cuda_mm_key *key, cublasLtMatmulAlgo_t *algo)
{
    pthread_mutex_lock(&cuda_mm_lock);
    int i = cuda_mm_slot(key), found = cuda_mm_used[i];
    if (found) *algo = cuda_mm_cache[i].algo;
    pthread_mutex_unlock(&cuda_mm_lock);
    return found;
}

static void cuda_mm_cache_put(const struct cuda_mm_key *key, const cublasLtMatmulAlgo_t *algo)
{
    pthread_mutex_lock(&cuda_mm_lock);
    int i = cuda_mm_slot(key);
    int cap = cuda_mm_exact() ? 512 : CUDA_MM_CACHE_N * 3 / 4; /* probes stay short */
    if (!cuda_mm_used[i] && cuda_mm_n_cache < cap) {
        cuda_mm_cache[i].key = *key;
        cuda_mm_cache[i].algo = *algo;
        cuda_mm_used[i] = 1;
        cuda_mm_n_cache++;
    }
    pthread_mutex_unlock(&cuda_mm_lock);
}

/* Largest power of two (<= 256) that divides a device address: cuBLASLt's alignment hint. */
static uint32_t cuda_mm_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

/* y (f32, [n][m] row-major = column-major m x n) = W (m rows of k, stride lda elements, type
 * wt) . B (n rows of k, type bt)^T; acc: y += that (beta = 1, C = D = y; the candidates are
 * timed into CUDA_WS_ACC as D, so y is added to once). Returns 0 when cuBLASLt ran it, 1 when
 * it has no algorithm for this case (the caller falls back), -1 with the error latched. */
static int cuda_mm_lt(struct cuda_impl *c, cudaDataType_t wt, const void *w, int64_t lda,
                      cudaDataType_t bt, const void *b, float *y, int64_t m, int64_t n, int64_t k, int acc)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[CUDA_MM_N_ALGOS];
    cublasLtMatmulAlgo_t algo;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int n_res = 0, ret = -1;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    size_t ws_bytes = CUDA_LT_WS_BYTES;
    uint32_t al_a = cuda_mm_align(w), al_b = cuda_mm_align(b), al_c = cuda_mm_align(y);
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    struct cuda_mm_key key;
    memset(res, 0, sizeof(res));
    memset(&algo, 0, sizeof(algo));
    memset(&key, 0, sizeof(key)); /* compared with memcmp: padding zeroed */
    key.device = c->device;
    key.wt = (int)wt;
    key.bt = (int)bt;
    key.m = m;
    key.n = cuda_mm_n_bucket(n);
    key.k = k;
    key.lda = lda;
    key.al_a = al_a;
    key.al_b = al_b;
    key.al_c = al_c;
    key.acc = acc;
    if (cuda_check(c, NULL, cuda_lt.desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))))
        goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))))
        goto cleanup;
    /* Column-major views: W is k x m (ld lda), B is k x n (ld k), Y is m x n (ld m). */
    if (cuda_check(c, NULL, cuda_lt.layout_create(&la, wt, (uint64_t)k, (uint64_t)m, lda))) goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.layout_create(&lb, bt, (uint64_t)k, (uint64_t)n, k))) goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.layout_create(&lc, CUDA_R_32F, (uint64_t)m, (uint64_t)n, m))) goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.pref_create(&pref))) goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                 &ws_bytes, sizeof(ws_bytes))))
        goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                                 &al_a, sizeof(al_a))))
        goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                                 &al_b, sizeof(al_b))))
        goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                                 &al_c, sizeof(al_c))))
        goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                                 &al_c, sizeof(al_c))))
        goto cleanup;
    int cached = cuda_mm_cache_get(&key, &algo);
    if (!cached) {
        cublasStatus_t hs = cuda_lt.heuristic(c->lt, op, la, lb, lc, lc, pref, CUDA_MM_N_ALGOS, res, &n_res);
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && n_res == 0)) {
            ret = 1;
            goto cleanup;
        }
        if (cuda_check(c, NULL, hs)) goto cleanup;
        algo = res[0].algo;
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (n >= CUDA_MM_TUNE_MIN_N && n_res > 1 && cudaStreamIsCapturing(c->stream, &cs) == cudaSuccess &&
            cs == cudaStreamCaptureStatusNone) {
            float *d = y; /* where the candidates write */
            if (acc && !(d = cuda_ws_get(c, CUDA_WS_ACC, sizeof(float) * (size_t)(m * n)))) goto cleanup;
            if (cuda_check(c, NULL, cudaEventCreate(&e0))) goto cleanup;
            if (cuda_check(c, NULL, cudaEventCreate(&e1))) goto cleanup;
            float best = 0;
            for (int i = 0; i < n_res; i++) {
                int ok = 1;
                for (int rep = 0; rep <= CUDA_MM_TUNE_REPS && ok; rep++) {
                    if (rep == 1) ok = cudaEventRecord(e0, c->stream) == cudaSuccess;
                    ok = ok && cuda_lt.matmul(c->lt, op, &alpha, w, la, b, lb, &beta, y, lc, d, lc, &res[i].algo,
                                              c->lt_ws, ws_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
                }
                float ms = 0;
                ok = ok && cudaEventRecord(e1, c->stream) == cudaSuccess &&
                     cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
                if (!ok) { /* a candidate that fails is skipped; a sticky device fault is latched */
                    (void)cudaGetLastError();
                    if (cuda_stream_wait(c, NULL)) goto cleanup;
                    continue;
                }
                if (best == 0 || ms < best) {
                    best = ms;
                    algo = res[i].algo;
                }
            }
        }
        cuda_mm_cache_put(&key, &algo);
    }
    void *prof = cuda_prof_begin(c->stream);
    cublasStatus_t ms = cuda_lt.matmul(c->lt, op, &alpha, w, la, b, lb, &beta, y, lc, y, lc, &algo, c->lt_ws,
                                       ws_bytes, c->stream);
    if (ms != CUBLAS_STATUS_SUCCESS && cached) {
        /* the bucket's algorithm does not take this row count: the heuristic's first for it */
        if (cuda_lt.heuristic(c->lt, op, la, lb, lc, lc, pref, 1, res, &n_res) == CUBLAS_STATUS_SUCCESS &&
            n_res > 0)
            ms = cuda_lt.matmul(c->lt, op, &alpha, w, la, b, lb, &beta, y, lc, y, lc, &res[0].algo, c->lt_ws,
                                ws_bytes, c->stream);
    }
    if (cuda_check(c, NULL, ms)) goto cleanup;
    cuda_prof_end(prof, c->stream, CUDA_PROF_GEMM, 2.0 * (double)m * (double)n * (double)k);
    ret = 0;

cleanup:
    if (e0) (void)cudaEventDestroy(e0);
    if (e1) (void)cudaEventDestroy(e1);
    if (pref) (void)cuda_lt.pref_destroy(pref);
    if (lc) (void)cuda_lt.layout_destroy(lc);
    if (lb) (void)cuda_lt.layout_destroy(lb);
    if (la) (void)cuda_lt.layout_destroy(la);
    if (op) (void)cuda_lt.desc_destroy(op);
    return ret;
}

/* The GEMV kernel over n rows of x, CUDA_GEMV_MAX_N at a time. */
static void cuda_mm_gemv_rows(struct cuda_impl *c, const struct cuda_wdesc *d, const float *x,
                              float *y, int n, int accumulate)
{
    for (int t0 = 0; t0 < n && c->err_status == CAIRN_OK; t0 += CUDA_GEMV_MAX_N) {
        int nt = CAIRN_MIN(CUDA_GEMV_MAX_N, n - t0);
        (void)cuda_check_launch(c, cuda_k_gemv(c->stream, d, x + (int64_t)t0 * d->cols,
                                               y + (int64_t)t0 * d->rows, nt, c->n_sms, accumulate));
    }
}

/* x converted for a GEMM against a weight of type wtype (BF16 for MLX weights), or NULL with
 * the error latched. */
static const uint16_t *cuda_mm_convert_x(struct cuda_impl *c, enum cuda_wtype wtype, const float *x,
                                         int64_t elems)
{
    uint16_t *xb = cuda_ws_get(c, CUDA_WS_ACT, (size_t)elems * 2);
    if (!xb) return NULL;
    void *prof = cuda_prof_begin(c->stream);
    int rc = wtype == CUDA_W_F16 ? cuda_check_launch(c, cuda_k_f32_to_f16(c->stream, xb, x, elems))
                                 : cuda_check_launch(c, cuda_k_act_bf16(c->stream, xb, x, elems));
    cuda_prof_end(prof, c->stream, CUDA_PROF_ACT, 0);
    return rc == CAIRN_OK ? xb : NULL;
}

/* The memo (cuda_int.h) as the matmul entered now finds it, cleared for every later op: every
 * matmul entry takes it, whether or not it reads it. */
static struct cuda_mm_memo cuda_mm_memo_take(struct cuda_impl *c)
{
    struct cuda_mm_memo m = c->mm_memo;
    memset(&c->mm_memo, 0, sizeof(c->mm_memo));
    if (m.src && (m.seq != __atomic_load_n(&c->n_calls, __ATOMIC_RELAXED) || m.copy != c->ws[CUDA_WS_ACT].ptr))
        m.src = NULL; /* a CUDA call since (any op), or the workspace moved */
    return m;
}

/* x's 16-bit copy for a GEMM against a weight of type wtype: the memo's when it holds exactly
 * that, else converted now (cuda_mm_convert_x); NULL with the error latched. */
static const uint16_t *cuda_mm_x16(struct cuda_impl *c, const struct cuda_mm_memo *m, enum cuda_wtype wtype,
                                   const float *x, int64_t elems)
{
    if (m && m->src == x && m->elems == elems && m->f16 == (wtype == CUDA_W_F16)) return m->copy;
    return cuda_mm_convert_x(c, wtype, x, elems);
}

/* y = x . W^T (acc: y += x . W^T) through cuBLASLt for n > gemv_max_rows; xb: x converted by
 * cuda_mm_convert_x (unused for F32 weights). When cuBLASLt has no algorithm, the GEMV over x;
 * with x NULL (the caller has only xb) it returns 1 for the caller to do that, else 0. */
static int cuda_mm_gemm(struct cuda_impl *c, const struct cuda_wdesc *d, const float *x, const uint16_t *xb,
                        float *y, int n, int acc)
{
    int rc;
    if (d->type == CUDA_W_F32) {
        rc = cuda_mm_lt(c, CUDA_R_32F, d->data, (int64_t)(d->row_bytes / 4), CUDA_R_32F, x, y, d->rows, n, d->cols,
                        acc);
    } else {
        const void *wp = d->data;
        int64_t lda = (int64_t)(d->row_bytes / 2);
        if (d->type == CUDA_W_Q) {
            /* Dequantized per call into one reused workspace: see the file comment. */
            uint16_t *wb = cuda_ws_get(c, CUDA_WS_DEQ, (size_t)(d->rows * d->cols) * 2);
            if (!wb) return 0;
            void *prof = cuda_prof_begin(c->stream);
            if (cuda_check_launch(c, cuda_k_dequant_q_bf16(c->stream, d, wb))) return 0;
            cuda_prof_end(prof, c->stream, CUDA_PROF_DEQUANT, 0);
            wp = wb;
            lda = d->cols;
        }
        cudaDataType_t t = d->type == CUDA_W_F16 ? CUDA_R_16F : CUDA_R_16BF;
        rc = cuda_mm_lt(c, t, wp, lda, t, xb, y, d->rows, n, d->cols, acc);
    }
    if (rc != 1) return 0;
    if (!x) return 1;
    cuda_mm_gemv_rows(c, d, x, y, n, acc);
    return 0;
}

/* The small-batch tensor-core kernel for count weights of one layout when n is in its range and
 * it takes them: 1 when it ran (or its launch error is latched), 0 when the caller runs the
 * other kernels. */
/* Whether n rows over d go to the tensor-core kernel by the row-count rule (cuda_k_mma_takes
 * still decides the layout): n in mma_min_rows..mma_max_rows, but rows shorter than
 * CUDA_GEMV_LONG_ROW bytes keep the GEMV up to gemv_max_rows. Why: at one row the kernel wins on
 * the 8B's 8 KiB rows (tg128 200 against 183) and loses on the 1B's 4 KiB ones (839 against 930,
 * H200, one call); the backend's exact_rows drops to the GEMV's for such weights. */
static int cuda_mm_mma_wants(const struct cuda_impl *c, const struct cuda_wdesc *d, int n)
{
    if (n < c->mma_min_rows || n > c->mma_max_rows) return 0;
    return d->row_bytes >= CUDA_GEMV_LONG_ROW || n > c->gemv_max_rows;
}

static int cuda_mm_mma(struct cuda_impl *c, const struct cuda_wdesc *d, float *const *y, int count, const float *x,
                       int n, int accumulate, int silu)
{
    if (!cuda_mm_mma_wants(c, d, n)) return 0;
    int rc = cuda_k_mma(c->stream, d, y, count, x, n, c->n_sms, accumulate, silu);
    if (rc == CUDA_MMA_NO) return 0;
    (void)cuda_check_launch(c, rc);
    return 1;
}

int cuda_mm_small_rows(const struct cuda_impl *c)
{
    return CAIRN_MAX(c->gemv_max_rows, c->mma_max_rows);
}

/* d[i] = the descriptors of count 2-D weights (count <= CUDA_GEMV_MAX_W: the small kernels'). */
static void cuda_mm_descs_of(const struct tensor *const *w, int count, struct cuda_wdesc *d)
{
    for (int i = 0; i < count; i++) {
        CAIRN_ASSERT(w[i]->n_dims == 2);
        d[i] = cuda_wdesc_of(w[i]);
    }
}

/* y = x . W^T, or y += that (acc), past the small kernels: x's 16-bit copy from the memo m
 * (NULL: none) or converted, then cuBLASLt. */
static void cuda_mm_big(struct cuda_impl *c, const struct cuda_mm_memo *m, const struct cuda_wdesc *d,
                        const float *x, float *y, int n, int acc)
{
    const uint16_t *xb = NULL;
    if (d->type != CUDA_W_F32 && !(xb = cuda_mm_x16(c, m, d->type, x, (int64_t)n * d->cols))) return;
    (void)cuda_mm_gemm(c, d, x, xb, y, n, acc);
}

void cuda_op_matmul(struct backend *be, const struct tensor *w, const float *x, float *y, int n)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_mm_memo m = cuda_mm_memo_take(c);
    if (c->err_status != CAIRN_OK || n <= 0) return;
    struct cuda_wdesc d = cuda_wdesc_of(w);
    CAIRN_ASSERT(w->n_dims == 2);
    if (cuda_mm_mma(c, &d, &y, 1, x, n, 0, 0)) return;
    if (n <= c->gemv_max_rows) {
        cuda_mm_gemv_rows(c, &d, x, y, n, 0);
        return;
    }
    cuda_mm_big(c, &m, &d, x, y, n, 0);
}

/* y += x . W^T: the GEMV adds in its epilogue (decode: no add kernel, y read once). GEMM-sized
 * steps past the small kernels (fuse_gemm): cuBLASLt adds itself (beta = 1 into y; its
 * algorithm tuning times the candidates into a scratch D, cuda_mm_lt). CAIRN_CUDA_FUSE_GEMM=0:
 * multiplied into a workspace and added by a kernel, as matmul then add would. */
void cuda_op_matmul_add(struct backend *be, const struct tensor *w, const float *x, float *y, int n)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_mm_memo m = cuda_mm_memo_take(c);
    if (c->err_status != CAIRN_OK || n <= 0) return;
    CAIRN_ASSERT(w->n_dims == 2);
    if (c->fuse) {
        struct cuda_wdesc d = cuda_wdesc_of(w);
        if (cuda_mm_mma(c, &d, &y, 1, x, n, 1, 0)) return;
        if (n <= c->gemv_max_rows) {
            cuda_mm_gemv_rows(c, &d, x, y, n, 1);
            return;
        }
        if (c->fuse_gemm && n > cuda_mm_small_rows(c)) {
            cuda_mm_big(c, &m, &d, x, y, n, 1);
            return;
        }
    }
    size_t bytes = sizeof(float) * (size_t)n * (size_t)w->shape[0];
    float *t = cuda_ws_get(c, CUDA_WS_ACC, bytes);
    if (!t) return;
    cuda_op_matmul(be, w, x, t, n);
    if (c->err_status == CAIRN_OK) (void)cuda_check_launch(c, cuda_k_add(c->stream, y, t, (int64_t)n * w->shape[0]));
}

/* GEMV-sized steps: runs of weights of one layout (q/k/v, gate/up) share one launch, so the
 * small k/v projections fill the GPU together with q, and the step has fewer launches. */
void cuda_op_matmul_multi(struct backend *be, const struct tensor *const *w, float *const *y,
                          int count, const float *x, int n)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_mm_memo m = cuda_mm_memo_take(c);
    if (c->err_status != CAIRN_OK || n <= 0 || count <= 0) return;
    if (count <= CUDA_GEMV_MAX_W && n <= cuda_mm_small_rows(c)) {
        struct cuda_wdesc d[CUDA_GEMV_MAX_W];
        cuda_mm_descs_of(w, count, d);
        if (cuda_mm_mma(c, d, y, count, x, n, 0, 0)) return;
        if (n <= c->gemv_max_rows) {
            /* GEMV-sized: runs of fusable weights share one launch. */
            for (int i0 = 0; i0 < count && c->err_status == CAIRN_OK;) {
                int i1 = i0 + 1;
                while (i1 < count && cuda_k_gemv_fusable(&d[i0], &d[i1])) i1++;
                (void)cuda_check_launch(c, cuda_k_gemv_multi(c->stream, d + i0, y + i0, i1 - i0, x, n, c->n_sms, 0));
                i0 = i1;
            }
            return;
        }
    }
    /* GEMM-sized: one conversion of x serves every weight that wants the same 16-bit type. */
    struct cuda_wdesc d[4];
    int same = count <= 4;
    for (int i = 0; i < count && same; i++) {
        CAIRN_ASSERT(w[i]->n_dims == 2);
        d[i] = cuda_wdesc_of(w[i]);
        same = d[i].type != CUDA_W_F32 && (d[i].type == CUDA_W_F16) == (d[0].type == CUDA_W_F16) &&
               d[i].cols == d[0].cols;
    }
    if (!same) {
        for (int i = 0; i < count; i++) cuda_op_matmul(be, w[i], x, y[i], n);
        return;
    }
    const uint16_t *xb = cuda_mm_x16(c, &m, d[0].type, x, (int64_t)n * d[0].cols);
    for (int i = 0; i < count && xb && c->err_status == CAIRN_OK; i++) (void)cuda_mm_gemm(c, &d[i], x, xb, y[i], n, 0);
}

/* matmul_fused at GEMM size (n > cuda_mm_small_rows, fuse_gemm): the norm writes the GEMM's
 * 16-bit x itself (cuda_k_rmsnorm_h16; f->h is scratch, backend.h, and is written only if
 * cuBLASLt has no algorithm and the GEMV needs the f32 rows), one x for every weight; SwiGLU
 * writes y[0] and its 16-bit copy, which the memo hands to the next op if it is the matmul that
 * reads y[0] (down_proj). So a dense layer's two norms, three conversions and the residual adds
 * take no kernel of their own. Returns 0 (nothing run) when the weights are not all 16-bit of
 * one kind (F32, F16 beside BF16/Q) with one width, or the rows do not fit the float4 kernels:
 * the caller runs the plain ops. */
static int cuda_mm_fused_gemm(struct cuda_impl *c, struct backend *be, const struct backend_matmul_fused *f,
                              const struct cuda_wdesc *d, const struct cuda_mm_memo *m)
{
    const int f16 = d[0].type == CUDA_W_F16, n = f->n;
    const int64_t in = d[0].cols, out0 = f->w[0]->shape[0];
    for (int i = 0; i < f->count; i++)
        if (d[i].type == CUDA_W_F32 || (d[i].type == CUDA_W_F16) != f16 || d[i].cols != in) return 0;
    if (f->silu_mul && d[1].rows != d[0].rows) return 0;
    const float *x32 = f->x; /* x as f32 for the GEMV fallback; NULL: not made (the norm's) */
    const uint16_t *xb;
    if (f->norm) {
        uint16_t *hb = cuda_ws_get(c, CUDA_WS_ACT, sizeof(uint16_t) * (size_t)(n * in));
        if (!hb) return 1;
        int rc = cuda_k_rmsnorm_h16(c->stream, NULL, hb, f16, f->x, f->norm, n, (int)in, f->eps, f->w_offset);
        if (rc == CUDA_ELEM_UNFUSED) return 0;
        if (cuda_check_launch(c, rc)) return 1;
        xb = hb;
        x32 = NULL;
    } else if (!(xb = cuda_mm_x16(c, m, d[0].type, f->x, n * in))) {
        return 1;
    }
    for (int i = 0; i < f->count && c->err_status == CAIRN_OK; i++) {
        if (!cuda_mm_gemm(c, &d[i], x32, xb, f->y[i], n, 0)) continue;
        /* no algorithm: the normed rows in f32 for the GEMV (the norm again, into h) */
        cuda_op_rmsnorm(be, f->h, f->x, f->norm, n, (int)in, f->eps, f->w_offset);
        x32 = f->h;
        if (c->err_status == CAIRN_OK) cuda_mm_gemv_rows(c, &d[i], x32, f->y[i], n, 0);
    }
    if (!f->silu_mul || c->err_status != CAIRN_OK) return 1;
    const int64_t elems = (int64_t)n * out0;
    uint16_t *hb = cuda_ws_get(c, CUDA_WS_ACT, sizeof(uint16_t) * (size_t)elems); /* x is read by now */
    if (!hb) return 1;
    int rc = cuda_k_silu_mul_h16(c->stream, f->y[0], hb, f16, f->y[0], f->y[1], elems);
    if (rc == CUDA_ELEM_UNFUSED) {
        cuda_op_silu_mul(be, f->y[0], f->y[0], f->y[1], elems);
        return 1;
    }
    if (cuda_check_launch(c, rc)) return 1;
    c->mm_memo = (struct cuda_mm_memo){.src = f->y[0], .copy = hb, .elems = elems, .f16 = f16,
                                       .seq = __atomic_load_n(&c->n_calls, __ATOMIC_RELAXED)};
    return 1;
}

/* matmul_fused (tensor/backend.h): GEMV-sized steps fold the RMSNorm into the GEMV's reading of
 * x (by default not for dense rows of CUDA_GEMV_LONG_ROW bytes or more; CAIRN_CUDA_FUSE_NORM=1:
 * always) and SwiGLU into gate/up's epilogue (cuda_k_gemv_fused), each unless switched off
 * (CAIRN_CUDA_FUSE_NORM=0, CAIRN_CUDA_FUSE_SILU=0, CAIRN_CUDA_FUSE=0: the plain sequence, for
 * comparison); what the kernel cannot take (GEMM-sized steps, the scalar GEMV's layouts, mixed
 * layouts) runs as the plain ops. */
void cuda_op_matmul_fused(struct backend *be, const struct backend_matmul_fused *f)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_mm_memo m = cuda_mm_memo_take(c);
    if (c->err_status != CAIRN_OK || f->n <= 0 || f->count <= 0) return;
    CAIRN_ASSERT(f->count <= CUDA_GEMV_MAX_W && (!f->silu_mul || f->count == 2));
    const int64_t in = f->w[0]->shape[1];
    const float *x = f->x;
    struct cuda_wdesc d[CUDA_GEMV_MAX_W];
    cuda_mm_descs_of(f->w, f->count, d);
    if (c->fuse_gemm && f->n > cuda_mm_small_rows(c) && cuda_mm_fused_gemm(c, be, f, d, &m)) return;
    if (f->n >= c->mma_min_rows && f->n <= c->mma_max_rows) {
        /* the tensor-core kernel when it takes the weights: the norm as its own kernel, SwiGLU
         * in its epilogue (unless switched off) */
        const float *xm = f->norm ? f->h : x;
        int silu = f->silu_mul && c->fuse_silu;
        if (cuda_mm_mma_wants(c, &d[0], f->n) && cuda_k_mma_takes(d, f->count, xm, f->n) &&
            (!silu || d[0].rows == d[1].rows)) {
            if (f->norm) cuda_op_rmsnorm(be, f->h, x, f->norm, f->n, (int)in, f->eps, f->w_offset);
            if (c->err_status == CAIRN_OK) (void)cuda_mm_mma(c, d, f->y, f->count, xm, f->n, 0, silu);
            if (f->silu_mul && !silu && c->err_status == CAIRN_OK)
                cuda_op_silu_mul(be, f->y[0], f->y[0], f->y[1], (int64_t)f->n * f->w[0]->shape[0]);
            return;
        }
    }
    int small = f->n <= c->gemv_max_rows;
    /* by default not for dense rows long enough for 1-row items (cuda_backend.c says why) */
    int long_dense = d[0].type != CUDA_W_Q && d[0].row_bytes >= CUDA_GEMV_LONG_ROW;
    int fnorm = f->norm && small && (c->fuse_norm == 2 || (c->fuse_norm == 1 && !long_dense));
    int fsilu = f->silu_mul && c->fuse_silu && small;
    if (f->norm && !fnorm) { /* the norm as its own kernel; the GEMV may still take SwiGLU */
        cuda_op_rmsnorm(be, f->h, x, f->norm, f->n, (int)in, f->eps, f->w_offset);
        x = f->h;
    }
    if (fnorm || fsilu) {
        int rc = cuda_k_gemv_fused(c->stream, d, f->y, f->count, x, f->n, c->n_sms, fnorm ? f->norm : NULL, f->eps,
                                   f->w_offset, fsilu);
        if (rc != CUDA_GEMV_UNFUSED) {
            if (cuda_check_launch(c, rc) == CAIRN_OK && f->silu_mul && !fsilu) /* the norm alone folded */
                cuda_op_silu_mul(be, f->y[0], f->y[0], f->y[1], (int64_t)f->n * f->w[0]->shape[0]);
            return;
        }
        if (fnorm) {
            cuda_op_rmsnorm(be, f->h, x, f->norm, f->n, (int)in, f->eps, f->w_offset);
            x = f->h;
        }
    }
    cuda_op_matmul_multi(be, f->w, f->y, f->count, x, f->n);
    if (f->silu_mul && c->err_status == CAIRN_OK)
        cuda_op_silu_mul(be, f->y[0], f->y[0], f->y[1], (int64_t)f->n * f->w[0]->shape[0]);
}
