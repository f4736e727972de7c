/* The CUDA backend's lifetime, memory, weights and steps: everything of the op table except the
 * ops themselves (cuda_ops.c, cuda_matmul.c). See cuda_int.h for the design. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "cuda/cuda_int.h"

/* Rows of a quantized weight repacked per upload chunk (host staging buffer of at most
 * CUDA_UPLOAD_CHUNK_BYTES). */
#define CUDA_UPLOAD_CHUNK_BYTES ((size_t)64 << 20)
/* Initial sizes of the workspaces, so that a usual step never grows them. */
#define CUDA_WS_ACT_INIT ((size_t)16 << 20)
#define CUDA_WS_ATTN_INIT ((size_t)16 << 20)

/* ---- errors ---- */

static int cuda_status_of(enum cuda_res_kind kind, int code)
{
    if (kind == CUDA_RES_RT && code == (int)cudaErrorMemoryAllocation) return CAIRN_ERR_NOMEM;
    if (kind == CUDA_RES_BLAS && code == (int)CUBLAS_STATUS_ALLOC_FAILED) return CAIRN_ERR_NOMEM;
    if (kind == CUDA_RES_RT &&
        (code == (int)cudaErrorNoDevice || code == (int)cudaErrorInsufficientDriver ||
         code == (int)cudaErrorInvalidDevice || code == (int)cudaErrorNoKernelImageForDevice))
        return CAIRN_ERR_UNSUPPORTED;
    return CAIRN_ERR_INTERNAL;
}

void cuda_latch(struct cuda_impl *c, const struct cairn_err *err)
{
    if (c && c->err_status == CAIRN_OK) {
        c->err = *err;
        c->err_status = err->status;
    }
}

int cuda_check_result(struct cuda_impl *c, struct cairn_err *err, enum cuda_res_kind kind, int code,
                      const char *text, const char *file, int line)
{
    if (code == 0) return CAIRN_OK;
    const char *name, *desc;
    if (kind == CUDA_RES_RT) {
        name = cudaGetErrorName((cudaError_t)code);
        desc = cudaGetErrorString((cudaError_t)code);
        /* Allocation failures are not sticky: clear them so later calls do not report them. */
        if (code == (int)cudaErrorMemoryAllocation) (void)cudaGetLastError();
    } else if (kind == CUDA_RES_NCCL) {
        name = "NCCL";
        desc = cuda_nccl_error_string(code);
    } else {
        name = cuda_lt.status_name ? cuda_lt.status_name((cublasStatus_t)code) : "cuBLAS error";
        desc = cuda_lt.status_string ? cuda_lt.status_string((cublasStatus_t)code) : "?";
    }
    struct cairn_err e;
    cairn_err_set(&e, cuda_status_of(kind, code), "cuda:%d: %s: %s: %s (%s:%d)", c ? c->device : -1,
                  text, name, desc, file, line);
    if (err) *err = e;
    cuda_latch(c, &e);
    return e.status;
}

int cuda_stream_wait_at(struct cuda_impl *c, struct cairn_err *err, const char *file, int line)
{
    struct cairn_err e;
    if (c->dead) {
        cairn_err_set(&e, CAIRN_ERR_DEVICE, "cuda:%d: %s; this context is not reused: restart the server to use "
                      "the GPU again", c->device, c->dead_why);
        goto fail;
    }
    if (!c->wait_event && cudaEventCreateWithFlags(&c->wait_event, cudaEventDisableTiming) != cudaSuccess) {
        c->wait_event = NULL;
        return cuda_check_result(c, err, CUDA_RES_RT, (int)cudaStreamSynchronize(c->stream),
                                 "cudaStreamSynchronize (no event for a bounded wait)", file, line);
    }
    int st = cuda_check_result(c, err, CUDA_RES_RT, (int)cudaEventRecord(c->wait_event, c->stream),
                               "cudaEventRecord", file, line);
    if (st != CAIRN_OK) return st;
    cuda_prof_step_mark(c->prof_step, c->stream);
    double limit = backend_step_timeout(c->pub), t0 = cairn_now();
    for (;;) {
        cudaError_t r = cudaEventQuery(c->wait_event);
        if (r == cudaSuccess) return CAIRN_OK;
        double dt = cairn_now() - t0;
        if (r != cudaErrorNotReady) {
            snprintf(c->dead_why, sizeof(c->dead_why), "the device failed (%s) while waiting at %s:%d",
                     cudaGetErrorString(r), file, line);
            break;
        }
        if (dt > limit) {
            snprintf(c->dead_why, sizeof(c->dead_why), "a step did not finish within %.3g s (--step-timeout)", limit);
            break;
        }
        if (dt < 0.002) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    c->dead = 1;
    cairn_err_set(&e, CAIRN_ERR_DEVICE, "cuda:%d: %s", c->device, c->dead_why);
    LOG_ERROR("cuda", "%s", e.msg);
fail:
    if (err) *err = e;
    cuda_latch(c, &e);
    return CAIRN_ERR_DEVICE;
}

int cuda_check_launch_at(struct cuda_impl *c, int code, const char *text, const char *file, int line)
{
    int st = cuda_check_result(c, NULL, CUDA_RES_RT, code, text, file, line);
    if (st == CAIRN_OK && c->sync_each_op) st = cuda_stream_wait_at(c, NULL, file, line);
    return st;
}

/* ---- memory ---- */

int cuda_dev_alloc(struct cuda_impl *c, size_t bytes, enum cairn_mem_tag tag, int zero, void **out,
                   struct cairn_err *err)
{
    *out = NULL;
    size_t take = bytes ? bytes : 1;
    uint64_t used = __atomic_add_fetch(&c->mem_used, take, __ATOMIC_RELAXED);
    if (c->mem_limit && used > c->mem_limit) {
        __atomic_sub_fetch(&c->mem_used, take, __ATOMIC_RELAXED);
        return cairn_err_set(err, CAIRN_ERR_NOMEM,
                             "cuda:%d: %zu bytes (%s) would pass CAIRN_CUDA_MEM_LIMIT (%llu bytes, "
                             "%llu in use)", c->device, bytes, cairn_mem_tag_name(tag),
                             (unsigned long long)c->mem_limit,
                             (unsigned long long)(used - take));
    }
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, take);
    if (rc != cudaSuccess) {
        __atomic_sub_fetch(&c->mem_used, take, __ATOMIC_RELAXED);
        int st = cuda_check(NULL, err, rc);
        if (st == CAIRN_ERR_NOMEM)
            cairn_err_set(err, CAIRN_ERR_NOMEM, "cuda:%d: out of device memory allocating %zu bytes "
                          "(%s; cairn holds %llu)", c->device, bytes, cairn_mem_tag_name(tag),
                          (unsigned long long)(used - take));
        return st;
    }
    if (zero) {
        int st = cuda_check(NULL, err, cudaMemsetAsync(p, 0, take, c->stream));
        if (st == CAIRN_OK) st = cuda_stream_wait(c, err);
        if (st != CAIRN_OK) {
            cudaFree(p);
            __atomic_sub_fetch(&c->mem_used, take, __ATOMIC_RELAXED);
            return st;
        }
    }
    cairn_mem_charge(CAIRN_MEM_DEVICE, tag, (int64_t)take);
    *out = p;
    return CAIRN_OK;
}

void cuda_dev_free(struct cuda_impl *c, void *p, size_t bytes, enum cairn_mem_tag tag)
{
    if (!p) return;
    size_t take = bytes ? bytes : 1;
    /* A failure here means the context is already broken; the next step reports it. */
    (void)cudaFree(p);
    __atomic_sub_fetch(&c->mem_used, take, __ATOMIC_RELAXED);
    cairn_mem_charge(CAIRN_MEM_DEVICE, tag, -(int64_t)take);
}

void *cuda_ws_get(struct cuda_impl *c, enum cuda_ws_slot slot, size_t bytes)
{
    struct cuda_ws *w = &c->ws[slot];
    if (w->bytes >= bytes) return w->ptr;
    struct cairn_err err;
    if (c->g_capturing) { /* cannot happen (cuda_graph.c runs a run eagerly before capturing it) */
        cairn_err_set(&err, CAIRN_ERR_INTERNAL, "cuda: workspace %d would grow inside a graph capture", (int)slot);
        cuda_latch(c, &err);
        return NULL;
    }
    cuda_graphs_invalidate(c); /* graphs name the old workspace */
    /* The old workspace may still be read by queued work. */
    if (cuda_stream_wait(c, NULL) != CAIRN_OK) return NULL;
    cuda_dev_free(c, w->ptr, w->bytes, CAIRN_MEM_SCRATCH);
    w->ptr = NULL;
    w->bytes = 0;
    size_t want = bytes + bytes / 4; /* some headroom: shapes grow in small steps */
    void *p;
    if (cuda_dev_alloc(c, want, CAIRN_MEM_SCRATCH, 0, &p, &err) != CAIRN_OK) {
        cairn_err_prefix(&err, "workspace %d", (int)slot);
        cuda_latch(c, &err);
        return NULL;
    }
    w->ptr = p;
    w->bytes = want;
    return p;
}

static int cuda_mem_stats(struct backend *be, struct backend_mem_stats *out)
{
    struct cuda_impl *c = cuda_impl_of(be);
    size_t free_b = 0, total_b = 0;
    memset(out, 0, sizeof(*out));
    if (cudaSetDevice(c->device) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        return CAIRN_ERR_INTERNAL;
    out->device_total = total_b;
    out->device_free = free_b;
    out->device_used_by_cairn = __atomic_load_n(&c->mem_used, __ATOMIC_RELAXED);
    if (c->mem_limit && c->mem_limit < out->device_total) {
        /* The budget is what cairn may use: report it as the device's size. */
        uint64_t room = c->mem_limit > out->device_used_by_cairn
                            ? c->mem_limit - out->device_used_by_cairn : 0;
        out->device_total = c->mem_limit;
        out->device_free = CAIRN_MIN(out->device_free, room);
    }
    return CAIRN_OK;
}

/* ---- buffers ---- */

static int cuda_buf_alloc(struct backend *be, size_t bytes, enum cairn_mem_tag tag, void **dptr,
                          struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    int st = cuda_check(NULL, err, cudaSetDevice(c->device));
    if (st != CAIRN_OK) return st;
    return cuda_dev_alloc(c, bytes, tag, 1, dptr, err);
}

static void cuda_buf_free(struct backend *be, void *dptr, size_t bytes, enum cairn_mem_tag tag)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (!dptr) return;
    cuda_graphs_invalidate(c);
    (void)cudaSetDevice(c->device);
    cuda_dev_free(c, dptr, bytes, tag);
}

static int cuda_copy(struct backend *be, void *dst, const void *src, size_t bytes,
                     enum cudaMemcpyKind kind, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (!bytes) return CAIRN_OK;
    cuda_graphs_before_copy(be); /* a copy inside a step comes after the ops recorded so far */
    (void)cuda_calls_bump(c);    /* it may write what a matmul memo copied (cuda_int.h) */
    int st = cuda_check(NULL, err, cudaSetDevice(c->device));
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
    if (st == CAIRN_OK) st = cuda_stream_wait(c, err);
    return st;
}

static int cuda_buf_upload(struct backend *be, void *dst, const void *src, size_t bytes,
                           struct cairn_err *err)
{
    return cuda_copy(be, dst, src, bytes, cudaMemcpyHostToDevice, err);
}

static int cuda_buf_download(struct backend *be, void *dst, const void *src, size_t bytes,
                             struct cairn_err *err)
{
    return cuda_copy(be, dst, src, bytes, cudaMemcpyDeviceToHost, err);
}

static int cuda_buf_copy(struct backend *be, void *dst, const void *src, size_t bytes,
                         struct cairn_err *err)
{
    return cuda_copy(be, dst, src, bytes, cudaMemcpyDeviceToDevice, err);
}

static int cuda_buf_zero(struct backend *be, void *dst, size_t bytes, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (!bytes) return CAIRN_OK;
    cuda_graphs_before_copy(be); /* ordered like a copy: after the ops recorded so far */
    (void)cuda_calls_bump(c);
    int st = cuda_check(NULL, err, cudaSetDevice(c->device));
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaMemsetAsync(dst, 0, bytes, c->stream));
    if (st == CAIRN_OK) st = cuda_stream_wait(c, err); /* bounded, like every wait (cuda_int.h) */
    return st;
}

/* ---- pinned host memory (tensor/backend.h host_pin) ---- */

/* The copies above are cudaMemcpyAsync from the caller's buffer: from a registered buffer the
 * driver DMAs directly, from a pageable one it stages through its own bounce buffers (the
 * 6 GB/s of a hot-tier hit before issue 15). */
static int cuda_host_pin(struct backend *be, void *ptr, size_t bytes, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    /* NULL impl in cuda_check: a refused pin is not a device failure, so nothing is latched */
    int st = cuda_check(NULL, err, cudaSetDevice(c->device));
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaHostRegister(ptr, bytes, cudaHostRegisterDefault));
    if (st != CAIRN_OK) (void)cudaGetLastError(); /* later launch checks must not see it */
    return st;
}

static void cuda_host_unpin(struct backend *be, void *ptr)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cairn_err err = {0};
    int st = cuda_check(NULL, &err, cudaSetDevice(c->device));
    if (st == CAIRN_OK) st = cuda_check(NULL, &err, cudaHostUnregister(ptr));
    if (st != CAIRN_OK) {
        (void)cudaGetLastError();
        LOG_WARN("cuda", "%s", err.msg);
    }
}

/* ---- sample (tensor/backend.h; the kernel is cuda_sample.cu) ---- */

/* The kernel's row record (cuda_sample.cu's cuda_sample_row_dev, same layout). */
struct cuda_sample_row_rec {
    int row;
    float temperature;
    float min_p;
    int logprobs;
    int top_logprobs;
    int edit0;
    int n_edits;
    int top_k;
    float top_p;
    int pad;
    double u;
};

static int cuda_op_sample(struct backend *be, float *logits, int vocab, const struct backend_sample_row *rows, int n,
                          struct backend_sample_out *out, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (n <= 0) return CAIRN_OK;
    (void)cuda_calls_bump(c);
    CAIRN_ASSERT(cuda_k_sample_row_bytes() == sizeof(struct cuda_sample_row_rec));
    int n_edits = 0;
    for (int i = 0; i < n; i++) {
        CAIRN_ASSERT(rows[i].top_logprobs >= 0 && rows[i].top_logprobs <= BACKEND_SAMPLE_MAX_TOP);
        CAIRN_ASSERT(rows[i].top_k >= 0 && rows[i].top_k <= be->sample_top_k);
        n_edits += rows[i].n_edits;
    }
    /* one staging area: [rows][edits] go up, [out] comes back */
    size_t rows_b = sizeof(struct cuda_sample_row_rec) * (size_t)n;
    size_t edits_b = (sizeof(struct backend_logit_edit) * (size_t)n_edits + 15) & ~(size_t)15;
    size_t out_b = sizeof(struct backend_sample_out) * (size_t)n;
    size_t up_b = rows_b + edits_b, total = up_b + out_b;
    if (c->sample_host_bytes < total) {
        size_t cap = total + total / 2 + 4096;
        void *h = realloc(c->sample_host, cap);
        if (!h) return cairn_err_set(err, CAIRN_ERR_NOMEM, "cuda: sample: cannot grow the host staging");
        c->sample_host = h;
        c->sample_host_bytes = cap;
    }
    uint8_t *h = c->sample_host;
    struct cuda_sample_row_rec *rec = (struct cuda_sample_row_rec *)h;
    struct backend_logit_edit *ed = (struct backend_logit_edit *)(h + rows_b);
    int e0 = 0;
    for (int i = 0; i < n; i++) {
        const struct backend_sample_row *r = &rows[i];
        rec[i] = (struct cuda_sample_row_rec){r->row,     r->temperature, r->min_p, r->logprobs, r->top_logprobs,
                                              e0,         r->n_edits,     r->top_k, r->top_p,  0,
                                              r->u};
        if (r->n_edits) memcpy(ed + e0, r->edits, sizeof(*ed) * (size_t)r->n_edits);
        e0 += r->n_edits;
    }
    cuda_graphs_before_copy(be); /* after the ops recorded so far (the logits) */
    int st = cuda_check(NULL, err, cudaSetDevice(c->device));
    uint8_t *d = NULL;
    if (st == CAIRN_OK) {
        d = cuda_ws_get(c, CUDA_WS_SAMPLE, total);
        if (!d) st = cairn_err_set(err, CAIRN_ERR_NOMEM, "cuda: sample: no device staging");
    }
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaMemcpyAsync(d, h, up_b, cudaMemcpyHostToDevice, c->stream));
    if (st == CAIRN_OK)
        st = cuda_check(NULL, err, (cudaError_t)cuda_k_sample(c->stream, logits, vocab, d, d + rows_b, n, d + up_b));
    if (st == CAIRN_OK)
        st = cuda_check(NULL, err, cudaMemcpyAsync(h + up_b, d + up_b, out_b, cudaMemcpyDeviceToHost, c->stream));
    if (st == CAIRN_OK) st = cuda_stream_wait(c, err);
    if (st == CAIRN_OK) memcpy(out, h + up_b, out_b);
    return st;
}

/* ---- weights ---- */

static int cuda_wtype_of(enum dtype t, enum cuda_wtype *out)
{
    switch (t) {
    case DTYPE_F32: *out = CUDA_W_F32; return 1;
    case DTYPE_F16: *out = CUDA_W_F16; return 1;
    case DTYPE_BF16: *out = CUDA_W_BF16; return 1;
    case DTYPE_Q: *out = CUDA_W_Q; return 1;
    default: return 0;
    }
}

/* Rows and columns of a weight: 2-D [rows, cols], or a 1-D vector as one row. */
static void cuda_w_dims(const struct tensor *w, int64_t *rows, int64_t *cols)
{
    if (w->n_dims >= 2) {
        *cols = w->shape[w->n_dims - 1];
        *rows = tensor_n_elems(w) / (*cols ? *cols : 1);
    } else {
        *rows = 1;
        *cols = w->n_dims == 1 ? w->shape[0] : 1;
    }
}

static size_t cuda_w_row_bytes(const struct tensor *w, int64_t cols)
{
    if (w->dtype == DTYPE_Q) return cuda_q_row_bytes(cols, w->bits, w->group_size);
    return (size_t)cols * dtype_size(w->dtype);
}

struct cuda_wdesc cuda_wdesc_of(const struct tensor *w)
{
    struct cuda_wdesc d;
    memset(&d, 0, sizeof(d));
    CAIRN_ASSERT(w->be_data != NULL); /* weight_prepare'd on this backend */
    CAIRN_ASSERT(cuda_wtype_of(w->dtype, &d.type));
    cuda_w_dims(w, &d.rows, &d.cols);
    d.data = w->be_data;
    d.row_bytes = cuda_w_row_bytes(w, d.cols);
    d.bits = w->bits;
    d.group_size = w->group_size;
    return d;
}

/* Repacks rows [r0, r1) of an MLX quantized weight into the CUDA_W_Q row layout at dst. */
static void cuda_q_repack(const struct tensor *w, int64_t cols, int64_t r0, int64_t r1, uint8_t *dst)
{
    size_t code_bytes = cuda_q_scales_off(cols, w->bits);
    int64_t groups = cols / w->group_size;
    size_t rb = cuda_q_row_bytes(cols, w->bits, w->group_size);
    for (int64_t r = r0; r < r1; r++) {
        uint8_t *d = dst + (size_t)(r - r0) * rb;
        memcpy(d, (const uint8_t *)w->data + (size_t)r * code_bytes, code_bytes);
        memcpy(d + code_bytes, w->scales + r * groups, (size_t)groups * 2);
        memcpy(d + code_bytes + (size_t)groups * 2, w->biases + r * groups, (size_t)groups * 2);
        size_t used = code_bytes + (size_t)groups * 4;
        memset(d + used, 0, rb - used);
    }
}

/* Drops the whole pages inside [p, p + bytes) of a private file mapping from this process. */
static void cuda_drop_host_pages(const void *p, size_t bytes)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, e = a + bytes;
    a = (a + page - 1) / page * page;
    e = e / page * page;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

static int cuda_weight_prepare(struct backend *be, struct tensor *w, int hint_release,
                               size_t *extra_bytes, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    enum cuda_wtype wt;
    int64_t rows, cols;
    uint8_t *stage = NULL;
    void *d = NULL;
    int st;
    *extra_bytes = 0;
    if (!cuda_wtype_of(w->dtype, &wt))
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "cuda: weights of dtype %s are not supported",
                             dtype_name(w->dtype));
    cuda_w_dims(w, &rows, &cols);
    if (wt == CUDA_W_Q &&
        (w->bits < 2 || w->bits > 8 || (w->group_size != 32 && w->group_size != 64 &&
                                        w->group_size != 128) || cols % w->group_size ||
         (cols * w->bits) % 32 || !w->scales || !w->biases))
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                             "cuda: quantized weight with bits %d, group size %d, %lld columns is "
                             "not supported", w->bits, w->group_size, (long long)cols);
    size_t rb = cuda_w_row_bytes(w, cols), bytes = (size_t)rows * rb;
    st = cuda_check(NULL, err, cudaSetDevice(c->device));
    if (st == CAIRN_OK) st = cuda_dev_alloc(c, bytes, CAIRN_MEM_WEIGHTS, 0, &d, err);
    if (st != CAIRN_OK) goto cleanup;
    if (wt != CUDA_W_Q) {
        st = cuda_copy(be, d, w->data, bytes, cudaMemcpyHostToDevice, err);
        goto cleanup;
    }
    int64_t chunk_rows = (int64_t)(CUDA_UPLOAD_CHUNK_BYTES / rb);
    chunk_rows = chunk_rows < 1 ? 1 : CAIRN_MIN(chunk_rows, rows);
    stage = malloc((size_t)chunk_rows * rb);
    if (!stage) {
        st = cairn_err_set(err, CAIRN_ERR_NOMEM, "cuda: no host memory to stage a weight upload");
        goto cleanup;
    }
    for (int64_t r0 = 0; r0 < rows && st == CAIRN_OK; r0 += chunk_rows) {
        int64_t r1 = CAIRN_MIN(rows, r0 + chunk_rows);
        cuda_q_repack(w, cols, r0, r1, stage);
        st = cuda_copy(be, (uint8_t *)d + (size_t)r0 * rb, stage, (size_t)(r1 - r0) * rb,
                       cudaMemcpyHostToDevice, err);
    }

cleanup:
    free(stage);
    /* a matmul weight the tensor-core kernel does not take keeps the GEMV (8 rows) and
     * cuBLASLt (more), and one with rows shorter than CUDA_GEMV_LONG_ROW bytes keeps the GEMV up
     * to 8 rows (cuda_mm_mma_wants): the backend's exact rows drop to the GEMV's (a 3-D expert
     * stack too) */
    if (st == CAIRN_OK && c->mma_max_rows && c->mma_min_rows == 1 && be->exact_rows > CUDA_GEMV_MAX_N &&
        (w->n_dims > 2 || (w->n_dims == 2 && ((wt != CUDA_W_BF16 && wt != CUDA_W_F16) || cols % 32 != 0 ||
                                              (size_t)cols * 2 < CUDA_GEMV_LONG_ROW))))
        be->exact_rows = CAIRN_MAX(1, CAIRN_MIN(c->gemv_max_rows, CUDA_GEMV_MAX_N));
    if (st != CAIRN_OK) {
        cuda_dev_free(c, d, bytes, CAIRN_MEM_WEIGHTS);
        cairn_err_prefix(err, "uploading a %lld x %lld %s weight", (long long)rows, (long long)cols,
                         dtype_name(w->dtype));
        return st;
    }
    /* RELEASE_HOST: the host bytes are pages of the read-only file mapping and the device has
     * its copy now: drop them from this process (a later host read, e.g. a lookup, faults them
     * back from the page cache), so the host budget need not count the mapping (api/pool.c). */
    if (hint_release & BACKEND_WEIGHT_RELEASE_HOST) {
        if (wt == CUDA_W_Q) {
            size_t groups_bytes = (size_t)rows * (size_t)(cols / w->group_size) * 2;
            cuda_drop_host_pages(w->data, (size_t)rows * (size_t)cols * (size_t)w->bits / 8);
            cuda_drop_host_pages(w->scales, groups_bytes);
            cuda_drop_host_pages(w->biases, groups_bytes);
        } else {
            cuda_drop_host_pages(w->data, bytes);
        }
    }
    w->be_data = d;
    *extra_bytes = bytes;
    return CAIRN_OK;
}

static void cuda_weight_release(struct backend *be, struct tensor *w)
{
    struct cuda_impl *c = cuda_impl_of(be);
    int64_t rows, cols;
    if (!w->be_data) return;
    cuda_graphs_invalidate(c);
    cuda_w_dims(w, &rows, &cols);
    (void)cudaSetDevice(c->device);
    cuda_dev_free(c, w->be_data, (size_t)rows * cuda_w_row_bytes(w, cols), CAIRN_MEM_WEIGHTS);
    w->be_data = NULL;
}

static void cuda_weight_slice_rows(struct backend *be, const struct tensor *w, int64_t row0,
                                   int64_t rows, struct tensor *view)
{
    CAIRN_ASSERT(w->n_dims == 2 && row0 >= 0 && rows >= 0 && row0 + rows <= w->shape[0]);
    int64_t cols = w->shape[1];
    *view = *w;
    view->shape[0] = rows;
    if (w->dtype == DTYPE_Q) {
        int64_t words = cols * w->bits / 32, groups = cols / w->group_size;
        view->data = (const uint32_t *)w->data + row0 * words;
        view->scales = w->scales + row0 * groups;
        view->biases = w->biases + row0 * groups;
    } else {
        view->data = (const uint8_t *)w->data + (size_t)(row0 * cols) * dtype_size(w->dtype);
    }
    if (w->be_data)
        view->be_data = (uint8_t *)w->be_data + (size_t)row0 * cuda_w_row_bytes(w, cols);
}

/* ---- steps ---- */

static int cuda_take_latched(struct cuda_impl *c, struct cairn_err *err)
{
    int st = c->err_status;
    if (st != CAIRN_OK) {
        if (err) *err = c->err;
        c->err_status = CAIRN_OK;
    }
    return st;
}

static int cuda_sync(struct backend *be, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    cuda_graphs_before_copy(be);
    (void)cuda_stream_wait(c, NULL);
    return cuda_take_latched(c, err);
}

static int cuda_step_begin(struct backend *be, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    pthread_mutex_lock(&c->step_lock);
    c->err_status = CAIRN_OK;
    (void)cuda_calls_bump(c); /* no matmul memo (cuda_int.h) outlives a step: every graph run starts without one */
    if (c->dead) { /* a timed-out or faulted context runs nothing more */
        int dst = cuda_stream_wait(c, err);
        c->err_status = CAIRN_OK;
        pthread_mutex_unlock(&c->step_lock);
        return dst;
    }
    int st = cuda_check(NULL, err, cudaSetDevice(c->device));
    if (st != CAIRN_OK) pthread_mutex_unlock(&c->step_lock);
    else {
        cuda_graphs_step_begin(c);
        cuda_prof_step_begin(c->prof_step);
    }
    return st;
}

static int cuda_step_end(struct backend *be, struct cairn_err *err)
{
    struct cuda_impl *c = cuda_impl_of(be);
    cuda_graphs_step_end(be);
    cuda_prof_step_freeze(c->prof_step, c->stream);
    int st = cuda_sync(be, err);
    cuda_prof_step_end(c->prof_step);
    pthread_mutex_unlock(&c->step_lock);
    return st;
}

/* ---- lifetime ---- */

static void cuda_destroy(struct backend *be)
{
    if (!be) return;
    struct cuda_impl *c = cuda_impl_of(be);
    if (c) {
        (void)cudaSetDevice(c->device);
        if (c->stream) (void)cuda_stream_wait(c, NULL); /* bounded; at once when dead */
        if (c->wait_event) (void)cudaEventDestroy(c->wait_event);
        for (int i = 0; i < CUDA_WS_N; i++) cuda_dev_free(c, c->ws[i].ptr, c->ws[i].bytes, CAIRN_MEM_SCRATCH);
        cuda_dev_free(c, c->lt_ws, CUDA_LT_WS_BYTES, CAIRN_MEM_SCRATCH);
        cuda_dev_free(c, c->attn_counters, CUDA_ATTN_COUNTERS * sizeof(int), CAIRN_MEM_SCRATCH);
        cuda_moe_free(c);
        if (c->lt) (void)cuda_lt.destroy(c->lt);
        if (c->stream) (void)cudaStreamDestroy(c->stream);
        cuda_graphs_free(c);
        cuda_prof_step_close(c->prof_step);
        pthread_mutex_destroy(&c->step_lock);
        free(c->moe_ids_host);
        free(c->moe_list_host);
        free(c->attn_tiles_host);
        free(c->sample_host);
        free(c);
    }
    free(be);
}

static const struct backend_ops cuda_backend_ops = {
    .destroy = cuda_destroy,
    .mem_stats = cuda_mem_stats,
    .buf_alloc = cuda_buf_alloc,
    .buf_free = cuda_buf_free,
    .buf_upload = cuda_buf_upload,
    .buf_download = cuda_buf_download,
    .buf_copy = cuda_buf_copy,
    .buf_zero = cuda_buf_zero,
    .host_pin = cuda_host_pin,
    .host_unpin = cuda_host_unpin,
    .weight_prepare = cuda_weight_prepare,
    .weight_release = cuda_weight_release,
    .weight_slice_rows = cuda_weight_slice_rows,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
    .sync = cuda_sync,
    .matmul = cuda_op_matmul,
    .matmul_multi = cuda_op_matmul_multi,
    .embed = cuda_op_embed,
    .rmsnorm = cuda_op_rmsnorm,
    .rope = cuda_op_rope,
    .silu_mul = cuda_op_silu_mul,
    .add = cuda_op_add,
    .add_bias = cuda_op_add_bias,
    .mul_sigmoid = cuda_op_mul_sigmoid,
    .add_sigmoid_scaled = cuda_op_add_sigmoid_scaled,
    .split_halves = cuda_op_split_halves,
    .gather_rows = cuda_op_gather_rows,
    .kv_store = cuda_op_kv_store,
    .attention = cuda_op_attention,
    .moe_route = cuda_op_moe_route,
    .moe_experts = cuda_op_moe_experts,
    .gdn = cuda_op_gdn,
    .copy_rows = cuda_op_copy_rows,
    .matmul_add = cuda_op_matmul_add,
    .qk_rope_store = cuda_op_qk_rope_store,
    .sample = cuda_op_sample,
    .matmul_fused = cuda_op_matmul_fused,
    .allreduce = cuda_nccl_allreduce,
};

/* The same table with the recording entries of cuda_graph.c (CAIRN_CUDA_GRAPHS unset or 1). */
static struct backend_ops cuda_backend_graph_ops;
static pthread_once_t cuda_graph_ops_once = PTHREAD_ONCE_INIT;

static void cuda_graph_ops_fill(void)
{
    cuda_backend_graph_ops = cuda_backend_ops;
    cuda_graphs_fill_ops(&cuda_backend_graph_ops);
}

int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Checks that GPU `device` exists and can run this build's kernels. */
static int cuda_device_usable(int device, struct cudaDeviceProp *prop, struct cairn_err *err)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "cuda: no usable GPU: %s (%s)%s",
                             cudaGetErrorString(rc), cudaGetErrorName(rc),
                             rc == cudaErrorInsufficientDriver
                                 ? "; no NVIDIA driver is loaded, or it is older than this build's "
                                   "CUDA runtime"
                                 : "");
    }
    if (device < 0 || device >= n)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED, "cuda:%d: no such GPU (%d found)", device, n);
    int st = cuda_check(NULL, err, cudaGetDeviceProperties(prop, device));
    if (st != CAIRN_OK) return st;
    if (prop->major < 9)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                             "cuda:%d: %s is compute capability %d.%d; this build's kernels need "
                             "9.0 or newer (sm_90 and its PTX)", device, prop->name, prop->major,
                             prop->minor);
    return CAIRN_OK;
}

int cuda_backend_open(int device, struct backend **out, struct cairn_err *err)
{
    struct cudaDeviceProp prop;
    struct backend *be = NULL;
    struct cuda_impl *c = NULL;
    *out = NULL;
    int st = cuda_device_usable(device, &prop, err);
    if (st != CAIRN_OK) return st;
    be = calloc(1, sizeof(*be));
    c = calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "cuda: out of host memory");
    }
    be->ops = &cuda_backend_ops;
    be->kind = BACKEND_CUDA;
    be->host_visible = 0;
    be->impl = c;
    c->pub = be;
    snprintf(be->name, sizeof(be->name), "cuda:%d", device);
    c->device = device;
    pthread_mutex_init(&c->step_lock, NULL);
    c->n_sms = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    c->l2_bytes = (size_t)prop.l2CacheSize;
    snprintf(c->dev_name, sizeof(c->dev_name), "%s", prop.name);
    c->gemv_max_rows = CUDA_GEMV_MAX_N;
    const char *s = getenv("CAIRN_CUDA_GEMV_MAX_ROWS");
    if (s && *s) c->gemv_max_rows = CAIRN_MAX(0, CAIRN_MIN(CUDA_GEMV_MAX_N, atoi(s)));
    /* the tensor-core kernel for 1..16 rows (CAIRN_CUDA_MMA=0: off, the GEMV up to 8 and
     * cuBLASLt above, as before it; =2: the GEMV keeps n = 1) */
    s = getenv("CAIRN_CUDA_MMA");
    c->mma_min_rows = s && strcmp(s, "2") == 0 ? 2 : 1;
    c->mma_max_rows = s && strcmp(s, "0") == 0 ? 0 : CUDA_MMA_MAX_N;
    s = getenv("CAIRN_CUDA_FUSE");
    c->fuse = !(s && strcmp(s, "0") == 0);
    /* The norm fold by default for MLX q4/q8 weights and dense rows shorter than
     * CUDA_GEMV_LONG_ROW (H200, tg128, one call: 8B q4 322 -> 367 tok/s with both folds, q8 244 ->
     * 269, the 1B's BF16 898 -> 918 with the norm fold on top of SwiGLU's); not for the 8B's BF16
     * rows (8 KiB: 1-row items, which read the norm weight beside every chunk of W: 187 -> 181).
     * CAIRN_CUDA_FUSE_NORM=1 folds it for every weight and row, 0 for none. */
    s = getenv("CAIRN_CUDA_FUSE_NORM");
    c->fuse_norm = !c->fuse || (s && strcmp(s, "0") == 0) ? 0 : s && strcmp(s, "1") == 0 ? 2 : 1;
    s = getenv("CAIRN_CUDA_FUSE_SILU");
    c->fuse_silu = c->fuse && !(s && strcmp(s, "0") == 0);
    s = getenv("CAIRN_CUDA_FUSE_GEMM"); /* cuda_matmul.c: the GEMM-sized folds */
    c->fuse_gemm = c->fuse && !(s && strcmp(s, "0") == 0);
    s = getenv("CAIRN_CUDA_SYNC");
    c->sync_each_op = s && *s && strcmp(s, "0") != 0;
    s = getenv("CAIRN_CUDA_ATTN");
    if (s && *s) {
        if (strcmp(s, "split") == 0) c->attn_mode = CUDA_ATTN_SPLIT;
        else if (strcmp(s, "tiled") == 0) c->attn_mode = CUDA_ATTN_TILED;
        else if (strcmp(s, "auto") != 0) {
            st = cairn_err_set(err, CAIRN_ERR_INVALID, "CAIRN_CUDA_ATTN must be auto, split or tiled, not \"%s\"", s);
            goto cleanup;
        }
    }
    s = getenv("CAIRN_CUDA_ATTN_DEC"); /* decode attention: "fast" (the default), "pipe", "tuned", "legacy" */
    c->attn_dec = CUDA_ATTN_DEC_FAST;
    if (s && *s) {
        if (strcmp(s, "tuned") == 0) c->attn_dec = CUDA_ATTN_DEC_TUNED;
        else if (strcmp(s, "pipe") == 0) c->attn_dec = CUDA_ATTN_DEC_PIPE;
        else if (strcmp(s, "legacy") == 0) c->attn_dec = CUDA_ATTN_DEC_LEGACY;
        else if (strcmp(s, "fast") != 0) {
            st = cairn_err_set(err, CAIRN_ERR_INVALID, "CAIRN_CUDA_ATTN_DEC must be fast, pipe, tuned or legacy, not \"%s\"", s);
            goto cleanup;
        }
    }
    /* the matmuls (the tensor-core kernel or the GEMV) and attention (per-row split plan) are
     * batch-invariant up to this many rows, unless the tiled kernels are forced (they take small
     * steps too). With the tensor-core kernel from n = 1: its 16 rows while every weight is one
     * it takes (cuda_weight_prepare drops to the GEMV's 8 at the first it does not); from n = 2
     * (CAIRN_CUDA_MMA=2) a row's bits differ between n = 1 (GEMV) and n >= 2: 1. */
    int exact_gemv = CAIRN_MAX(1, CAIRN_MIN(c->gemv_max_rows, CUDA_ATTN_EXACT_ROWS));
    c->exact_rows_mma = !c->mma_max_rows ? exact_gemv : c->mma_min_rows > 1 ? 1 : c->mma_max_rows;
    be->exact_rows = c->attn_mode == CUDA_ATTN_TILED ? 1 : c->exact_rows_mma;
    /* top-k rows on the device (cuda_sample.cu): opt-in (CAIRN_CUDA_SAMPLE_TOPK=1) until
     * tests/cuda/test_cuda_sample.c has run it on a GPU */
    s = getenv("CAIRN_CUDA_SAMPLE_TOPK");
    be->sample_top_k = s && strcmp(s, "1") == 0 ? BACKEND_SAMPLE_MAX_TOP_K : 0;
    /* CAIRN_CUDA_MOE: "host", every moe_experts call groups on the host; "old", one token is
     * sorted as a batch instead of taking the unsorted path (cuda_moe.cu) */
    s = getenv("CAIRN_CUDA_MOE");
    c->moe_host_only = s && strcmp(s, "host") == 0;
    c->moe_old = s && strcmp(s, "old") == 0;
    s = getenv("CAIRN_CUDA_MEM_LIMIT");
    if (s && *s && !cairn_parse_size(s, &c->mem_limit)) {
        st = cairn_err_set(err, CAIRN_ERR_INVALID, "CAIRN_CUDA_MEM_LIMIT: cannot parse \"%s\"", s);
        goto cleanup;
    }
    st = cuda_check(NULL, err, cudaSetDevice(device));
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    if (st == CAIRN_OK) c->prof_step = cuda_prof_step_open(); /* NULL unless step profiling is on */
    if (st == CAIRN_OK && !c->sync_each_op) {
        st = cuda_graphs_init(c);
        if (st != CAIRN_OK) cairn_err_set(err, st, "cuda: out of host memory");
        else if (c->graphs) {
            pthread_once(&cuda_graph_ops_once, cuda_graph_ops_fill);
            be->ops = &cuda_backend_graph_ops;
        }
    }
    s = getenv("CAIRN_CUDA_SAMPLE"); /* "0": no sample op, the engine samples downloaded logits */
    if (st == CAIRN_OK && s && strcmp(s, "0") == 0) {
        c->ops_nosample = *be->ops;
        c->ops_nosample.sample = NULL;
        be->ops = &c->ops_nosample;
    }
    if (st == CAIRN_OK) st = cuda_lt_load(err);
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cuda_lt.create(&c->lt));
    if (st == CAIRN_OK) st = cuda_dev_alloc(c, CUDA_LT_WS_BYTES, CAIRN_MEM_SCRATCH, 0, &c->lt_ws, err);
    if (st == CAIRN_OK)
        st = cuda_dev_alloc(c, CUDA_ATTN_COUNTERS * sizeof(int), CAIRN_MEM_SCRATCH, 1,
                            (void **)&c->attn_counters, err);
    if (st == CAIRN_OK) {
        st = cuda_dev_alloc(c, CUDA_WS_ACT_INIT, CAIRN_MEM_SCRATCH, 0, &c->ws[CUDA_WS_ACT].ptr, err);
        if (st == CAIRN_OK) c->ws[CUDA_WS_ACT].bytes = CUDA_WS_ACT_INIT;
    }
    if (st == CAIRN_OK) {
        st = cuda_dev_alloc(c, CUDA_WS_ATTN_INIT, CAIRN_MEM_SCRATCH, 0, &c->ws[CUDA_WS_ATTN].ptr, err);
        if (st == CAIRN_OK) c->ws[CUDA_WS_ATTN].bytes = CUDA_WS_ATTN_INIT;
    }

cleanup:
    if (st != CAIRN_OK) {
        cairn_err_prefix(err, "opening cuda:%d", device);
        cuda_destroy(be);
        return st;
    }
    LOG_INFO("cuda", "cuda:%d: %s, %d SMs, %zu KiB shared memory per block, %zu MiB L2%s", device,
                   c->dev_name, c->n_sms, c->smem_optin >> 10, c->l2_bytes >> 20,
                   c->mem_limit ? ", memory capped by CAIRN_CUDA_MEM_LIMIT" : "");
    *out = be;
    return CAIRN_OK;
}

/* ---- bench probe ---- */

/* Copies timed per repetition (best one counts) and the copies before timing starts. */
#define CUDA_PROBE_REPS 10
#define CUDA_PROBE_WARMUP 2

int cuda_probe_copy_bandwidth(int device, size_t bytes, double *gbs, struct cairn_err *err)
{
    struct backend *be = NULL;
    struct cuda_impl *c;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    *gbs = 0;
    int st = cuda_backend_open(device, &be, err);
    if (st != CAIRN_OK) return st;
    c = cuda_impl_of(be);
    st = cuda_dev_alloc(c, bytes, CAIRN_MEM_SCRATCH, 1, &a, err);
    if (st == CAIRN_OK) st = cuda_dev_alloc(c, bytes, CAIRN_MEM_SCRATCH, 1, &b, err);
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaEventCreate(&e0));
    if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaEventCreate(&e1));
    float best_ms = 0;
    for (int i = 0; i < CUDA_PROBE_WARMUP + CUDA_PROBE_REPS && st == CAIRN_OK; i++) {
        float ms = 0;
        st = cuda_check(NULL, err, cudaEventRecord(e0, c->stream));
        if (st == CAIRN_OK)
            st = cuda_check(NULL, err, cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream));
        if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaEventRecord(e1, c->stream));
        if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaEventSynchronize(e1));
        if (st == CAIRN_OK) st = cuda_check(NULL, err, cudaEventElapsedTime(&ms, e0, e1));
        if (st == CAIRN_OK && i >= CUDA_PROBE_WARMUP && ms > 0 && (best_ms == 0 || ms < best_ms))
            best_ms = ms;
    }
    if (st == CAIRN_OK && best_ms > 0) *gbs = 2.0 * (double)bytes / (best_ms * 1e-3) / 1e9;
    if (e0) (void)cudaEventDestroy(e0);
    if (e1) (void)cudaEventDestroy(e1);
    cuda_dev_free(c, a, bytes, CAIRN_MEM_SCRATCH);
    cuda_dev_free(c, b, bytes, CAIRN_MEM_SCRATCH);
    cuda_destroy(be);
    return st;
}
