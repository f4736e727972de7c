/* matmul and matmul_multi of the CUDA backend: y[n, out] = x[n, in] . W[out, in]^T.
 *
 * n <= gemv_max_rows (default CUDA_GEMV_MAX_N = 8, decode and small batches): the GEMV kernel
 * (cuda_gemv.cu) streams W once with x in f32 and every weight type dequantized exactly in
 * registers, so decode has f32-level accuracy (the CPU reference's); matmul_multi runs the
 * weights of one layout in one launch.
 * Larger n (prefill, big batches): cuBLASLt with f32 accumulation and f32 output:
 *   BF16 W: x converted to bf16 (round to nearest even), BF16 x BF16 -> F32 GEMM;
 *   F16 W:  x converted to f16, F16 x F16 -> F32;
 *   MLX Q W: W dequantized to bf16 (each value scale * code + bias rounded once to bf16), then
 *            as BF16;
 *   F32 W:  F32 x F32 -> F32 with CUBLAS_COMPUTE_32F (no TF32).
 * Why bf16 activations rather than TF32 or split-bf16: the tensor cores take bf16 at full rate
 * and TF32 at half, and TF32 would need f32 weights (twice the memory). Rounding x to bf16 costs
 * a relative 2^-9 per input, about what the reference's own bf16 run (activations bf16
 * throughout, tests/cuda/bf16_reference.py) has at every layer; cairn keeps the residual stream,
 * norms, attention and softmax in f32, so its error stays below that reference's.
 * When cuBLASLt has no algorithm for a shape or alignment, the GEMV kernel runs over the rows
 * CUDA_GEMV_MAX_N at a time (correct, slower). */
#include <string.h>

#include "cuda/cuda_int.h"

/* Largest power of two (<= 256) that divides a device address: cuBLASLt's alignment hint. */
static uint32_t cuda_mm_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

/* y (f32, [n][m] row-major = column-major m x n) = W (m rows of k, stride lda elements, type
 * wt) . B (n rows of k, type bt)^T. Returns 0 when cuBLASLt ran it, 1 when it has no algorithm
 * for this case (the caller falls back), -1 with the error latched. */
static int cuda_mm_lt(struct cuda_impl *c, cudaDataType_t wt, const void *w, int64_t lda,
                      cudaDataType_t bt, const void *b, float *y, int64_t m, int64_t n, int64_t k)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0, ret = -1;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    size_t ws_bytes = CUDA_LT_WS_BYTES;
    uint32_t al_a = cuda_mm_align(w), al_b = cuda_mm_align(b), al_c = cuda_mm_align(y);
    const float alpha = 1.0f, beta = 0.0f;
    memset(&res, 0, sizeof(res));
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
    cublasStatus_t hs = cuda_lt.heuristic(c->lt, op, la, lb, lc, lc, pref, 1, &res, &n_res);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && n_res == 0)) {
        ret = 1;
        goto cleanup;
    }
    if (cuda_check(c, NULL, hs)) goto cleanup;
    if (cuda_check(c, NULL, cuda_lt.matmul(c->lt, op, &alpha, w, la, b, lb, &beta, y, lc, y, lc, &res.algo,
                                           c->lt_ws, ws_bytes, c->stream)))
        goto cleanup;
    ret = 0;

cleanup:
    if (pref) (void)cuda_lt.pref_destroy(pref);
    if (lc) (void)cuda_lt.layout_destroy(lc);
    if (lb) (void)cuda_lt.layout_destroy(lb);
    if (la) (void)cuda_lt.layout_destroy(la);
    if (op) (void)cuda_lt.desc_destroy(op);
    return ret;
}

/* The GEMV kernel over n rows of x, CUDA_GEMV_MAX_N at a time. */
static void cuda_mm_gemv_rows(struct cuda_impl *c, const struct cuda_wdesc *d, const float *x,
                              float *y, int n)
{
    for (int t0 = 0; t0 < n && c->err_status == CAIRN_OK; t0 += CUDA_GEMV_MAX_N) {
        int nt = CAIRN_MIN(CUDA_GEMV_MAX_N, n - t0);
        (void)cuda_check_launch(c, cuda_k_gemv(c->stream, d, x + (int64_t)t0 * d->cols,
                                               y + (int64_t)t0 * d->rows, nt, c->n_sms));
    }
}

void cuda_op_matmul(struct backend *be, const struct tensor *w, const float *x, float *y, int n)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (c->err_status != CAIRN_OK || n <= 0) return;
    struct cuda_wdesc d = cuda_wdesc_of(w);
    CAIRN_ASSERT(w->n_dims == 2);
    if (n <= c->gemv_max_rows) {
        cuda_mm_gemv_rows(c, &d, x, y, n);
        return;
    }
    int64_t elems = (int64_t)n * d.cols;
    int rc;
    if (d.type == CUDA_W_F32) {
        rc = cuda_mm_lt(c, CUDA_R_32F, d.data, (int64_t)(d.row_bytes / 4), CUDA_R_32F, x, y, d.rows, n, d.cols);
    } else {
        uint16_t *xb = cuda_ws_get(c, CUDA_WS_ACT, (size_t)elems * 2);
        if (!xb) return;
        const void *wp = d.data;
        int64_t lda = (int64_t)(d.row_bytes / 2);
        if (d.type == CUDA_W_Q) {
            uint16_t *wb = cuda_ws_get(c, CUDA_WS_DEQ, (size_t)(d.rows * d.cols) * 2);
            if (!wb) return;
            if (cuda_check_launch(c, cuda_k_dequant_bf16(c->stream, &d, wb))) return;
            wp = wb;
            lda = d.cols;
        }
        if (d.type == CUDA_W_F16) {
            if (cuda_check_launch(c, cuda_k_f32_to_f16(c->stream, xb, x, elems))) return;
            rc = cuda_mm_lt(c, CUDA_R_16F, wp, lda, CUDA_R_16F, xb, y, d.rows, n, d.cols);
        } else {
            if (cuda_check_launch(c, cuda_k_f32_to_bf16(c->stream, xb, x, elems))) return;
            rc = cuda_mm_lt(c, CUDA_R_16BF, wp, lda, CUDA_R_16BF, xb, y, d.rows, n, d.cols);
        }
    }
    if (rc == 1) cuda_mm_gemv_rows(c, &d, x, y, n);
}

/* GEMV-sized steps: runs of weights of one layout (q/k/v, gate/up) share one launch, so the
 * small k/v projections fill the GPU together with q, and the step has fewer launches. */
void cuda_op_matmul_multi(struct backend *be, const struct tensor *const *w, float *const *y,
                          int count, const float *x, int n)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (c->err_status != CAIRN_OK || n <= 0) return;
    if (n > c->gemv_max_rows || count > CUDA_GEMV_MAX_W) {
        for (int i = 0; i < count; i++) cuda_op_matmul(be, w[i], x, y[i], n);
        return;
    }
    struct cuda_wdesc d[CUDA_GEMV_MAX_W];
    for (int i = 0; i < count; i++) {
        CAIRN_ASSERT(w[i]->n_dims == 2);
        d[i] = cuda_wdesc_of(w[i]);
    }
    for (int i0 = 0; i0 < count && c->err_status == CAIRN_OK;) {
        int i1 = i0 + 1;
        while (i1 < count && cuda_k_gemv_fusable(&d[i0], &d[i1])) i1++;
        (void)cuda_check_launch(c, cuda_k_gemv_multi(c->stream, d + i0, y + i0, i1 - i0, x, n, c->n_sms));
        i0 = i1;
    }
}
