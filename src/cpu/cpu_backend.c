/* The CPU backend: tensor/backend.h's op table over the cpu room's kernels.
 *
 * DESIGN
 * - Device memory is host memory (host_visible = 1): buffers are cairn_mem_alloc'd (64-byte
 *   aligned, zeroed, accounted under the caller's tag); upload/download/copy are memcpy.
 * - weight_prepare packs MLX q4/q8 linears for the VNNI kernels when that path is active
 *   (cpu_pack.c): be_data = the packed copy (accounted under CAIRN_MEM_WEIGHTS, with its size
 *   in a 64-byte header in front so weight_release frees what was allocated even if the ISA
 *   changed since). With BACKEND_WEIGHT_RELEASE_HOST the file's pages of the codes, scales and
 *   biases are then dropped (MADV_DONTNEED on a private read-only mapping: a later read, e.g.
 *   an embedding lookup, faults them back in from the page cache), so resident memory holds
 *   each weight once. Other weights are used in place (be_data NULL).
 * - Steps: step_begin takes cpu_lock (the one compute pool serves one step at a time, and a
 *   step uses it whole), step_end releases it. Ops run to completion on the pool, so there is
 *   nothing to latch: step_end and sync succeed, except for a simulated tensor-parallel rank
 *   whose all-reduce failed (cpu_tp.c, the only op that can: another rank never came).
 * - attention loops over the step's sequences and runs cpu_attention on each (the same kernel
 *   as one sequence at a time); moe_* and gdn are cpu_moe.c and cpu_gdn.c.
 * - The pool is process-wide: the first open starts it (cpu_init), the last close stops it. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "cpu/cpu.h"
#include "cpu/cpu_int.h"

#define CPU_BE_PACK_HDR 64 /* bytes in front of a packed copy: its allocation size */

/* cpu_be_mu guards cpu_be_refs (backends open) */
static pthread_mutex_t cpu_be_mu = PTHREAD_MUTEX_INITIALIZER;
static int cpu_be_refs;

static void cpu_be_destroy(struct backend *be)
{
    free(be);
    pthread_mutex_lock(&cpu_be_mu);
    if (--cpu_be_refs == 0) cpu_shutdown();
    pthread_mutex_unlock(&cpu_be_mu);
}

static int cpu_be_mem_stats(struct backend *be, struct backend_mem_stats *out)
{
    memset(out, 0, sizeof(*out));
    return CAIRN_OK;
}

/* ---- buffers ---- */

static int cpu_be_buf_alloc(struct backend *be, size_t bytes, enum cairn_mem_tag tag, void **dptr,
                            struct cairn_err *err)
{
    *dptr = cairn_mem_alloc(bytes ? bytes : 1, tag);
    if (!*dptr)
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "cpu: cannot allocate %zu bytes (%s)", bytes,
                             cairn_mem_tag_name(tag));
    return CAIRN_OK;
}

static void cpu_be_buf_free(struct backend *be, void *dptr, size_t bytes, enum cairn_mem_tag tag)
{
    if (dptr) cairn_mem_free(dptr, bytes ? bytes : 1, tag);
}

static int cpu_be_copy(struct backend *be, void *dst, const void *src, size_t bytes,
                       struct cairn_err *err)
{
    if (bytes) memmove(dst, src, bytes);
    return CAIRN_OK;
}

static int cpu_be_zero(struct backend *be, void *dst, size_t bytes, struct cairn_err *err)
{
    if (bytes) memset(dst, 0, bytes);
    return CAIRN_OK;
}

/* ---- weights ---- */

/* Drops the whole pages inside [p, p + bytes) from this process (see DESIGN). */
static void cpu_be_drop_pages(const void *p, size_t bytes)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, e = a + bytes;
    a = (a + page - 1) / page * page;
    e = e / page * page;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

static int cpu_be_weight_prepare(struct backend *be, struct tensor *w, int hint_release,
                                 size_t *extra_bytes, struct cairn_err *err)
{
    *extra_bytes = 0;
    w->be_data = NULL;
    if (hint_release & BACKEND_WEIGHT_LOOKUP_ONLY) return CAIRN_OK;
    size_t bytes = cpu_pack_bytes(w);
    if (!bytes) return CAIRN_OK;
    uint8_t *p = cairn_mem_alloc(bytes + CPU_BE_PACK_HDR, CAIRN_MEM_WEIGHTS);
    if (!p)
        return cairn_err_set(err, CAIRN_ERR_NOMEM,
                             "cpu: out of memory packing a [%lld, %lld] q%d weight (%zu bytes)",
                             (long long)w->shape[0], (long long)w->shape[1], w->bits, bytes);
    size_t total = bytes + CPU_BE_PACK_HDR;
    memcpy(p, &total, sizeof(total));
    cpu_pack(w, p + CPU_BE_PACK_HDR);
    w->be_data = p + CPU_BE_PACK_HDR;
    *extra_bytes = total;
    if (hint_release & BACKEND_WEIGHT_RELEASE_HOST) {
        size_t groups_bytes = (size_t)(w->shape[0] * (w->shape[1] / w->group_size)) * 2;
        cpu_be_drop_pages(w->data, (size_t)(w->shape[0] * w->shape[1] * w->bits / 8));
        cpu_be_drop_pages(w->scales, groups_bytes);
        cpu_be_drop_pages(w->biases, groups_bytes);
    }
    return CAIRN_OK;
}

static void cpu_be_weight_release(struct backend *be, struct tensor *w)
{
    if (!w->be_data) return;
    uint8_t *p = (uint8_t *)w->be_data - CPU_BE_PACK_HDR;
    size_t total;
    memcpy(&total, p, sizeof(total));
    cairn_mem_free(p, total, CAIRN_MEM_WEIGHTS);
    w->be_data = NULL;
}

static void cpu_be_weight_slice_rows(struct backend *be, const struct tensor *w, int64_t row0,
                                     int64_t rows, struct tensor *view)
{
    CAIRN_ASSERT(w->n_dims == 2 && row0 >= 0 && rows >= 0 && row0 + rows <= w->shape[0]);
    *view = *w;
    view->shape[0] = rows;
    int64_t cols = w->shape[1];
    if (w->dtype == DTYPE_Q) {
        int64_t words = cols * w->bits / 32, groups = cols / w->group_size;
        view->data = (const uint32_t *)w->data + row0 * words;
        view->scales = w->scales + row0 * groups;
        view->biases = w->biases + row0 * groups;
        view->be_data = cpu_packed_rows(w, row0);
    } else {
        view->data = (const uint8_t *)w->data + (size_t)(row0 * cols) * dtype_size(w->dtype);
        view->be_data = NULL;
    }
}

/* ---- steps ---- */

static int cpu_be_step_begin(struct backend *be, struct cairn_err *err)
{
    cpu_lock();
    return CAIRN_OK;
}

static int cpu_be_step_end(struct backend *be, struct cairn_err *err)
{
    cpu_unlock();
    return cpu_tp_take_error(be, err); /* a simulated rank's failed all-reduce (cpu_tp.c) */
}

static int cpu_be_sync(struct backend *be, struct cairn_err *err)
{
    return CAIRN_OK;
}

/* ---- ops ---- */

static void cpu_be_matmul(struct backend *be, const struct tensor *w, const float *x, float *y,
                          int n)
{
    cpu_matmul(w, x, y, n);
}

static void cpu_be_matmul_multi(struct backend *be, const struct tensor *const *w, float *const *y,
                                int count, const float *x, int n)
{
    cpu_matmul_multi(w, y, count, x, n);
}

static void cpu_be_embed(struct backend *be, const struct tensor *w, const int32_t *ids, int n,
                         float *out)
{
    cpu_embed(w, ids, n, out);
}

static void cpu_be_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n_rows,
                           int dim, float eps, float w_offset)
{
    cpu_rmsnorm(y, x, w, n_rows, dim, eps, w_offset);
}

static void cpu_be_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_dim,
                        int rot_dim, const int32_t *pos, const float *inv_freq)
{
    cpu_rope(x, n_tokens, n_heads, head_dim, rot_dim, pos, inv_freq);
}

static void cpu_be_silu_mul(struct backend *be, float *out, const float *gate, const float *up,
                            int64_t n)
{
    cpu_silu_mul(out, gate, up, n);
}

static void cpu_be_add(struct backend *be, float *y, const float *x, int64_t n)
{
    cpu_add(y, x, n);
}

static void cpu_be_add_bias(struct backend *be, float *y, const float *b, int n_rows, int dim)
{
    cpu_add_bias(y, b, n_rows, dim);
}

/* The small gating ops run on the calling thread: they are a sliver of a step. */
static void cpu_be_mul_sigmoid(struct backend *be, float *y, const float *g, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] *= 1.0f / (1.0f + expf(-g[i]));
}

static void cpu_be_add_sigmoid_scaled(struct backend *be, float *y, const float *x, const float *g,
                                      int n_rows, int dim)
{
    for (int t = 0; t < n_rows; t++) {
        float s = 1.0f / (1.0f + expf(-g[t]));
        for (int j = 0; j < dim; j++)
            y[(size_t)t * dim + j] += s * x[(size_t)t * dim + j];
    }
}

static void cpu_be_split_halves(struct backend *be, float *a, float *b, const float *src,
                                int n_rows, int width)
{
    for (int r = 0; r < n_rows; r++) {
        memcpy(a + (size_t)r * width, src + (size_t)r * 2 * width, sizeof(float) * (size_t)width);
        memcpy(b + (size_t)r * width, src + (size_t)r * 2 * width + width,
               sizeof(float) * (size_t)width);
    }
}

static void cpu_be_gather_rows(struct backend *be, float *dst, const float *src,
                               const int32_t *rows, int n, int dim)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * dim, src + (size_t)rows[i] * dim, sizeof(float) * (size_t)dim);
}

static void cpu_be_copy_rows(struct backend *be, float *dst, int64_t dst_stride, const float *src,
                             int64_t src_stride, int n_rows, int width)
{
    for (int r = 0; r < n_rows; r++)
        memcpy(dst + r * dst_stride, src + r * src_stride, sizeof(float) * (size_t)width);
}

static void cpu_be_kv_store(struct backend *be, const struct backend_kv_view *kv, int layer,
                            const int32_t *slots, int n_tokens, const float *k, const float *v)
{
    CAIRN_ASSERT(layer >= 0 && layer < kv->n_layers);
    cpu_kv_store(kv, layer, slots, n_tokens, k, v);
}

static void cpu_be_attention(struct backend *be, const struct backend_attn *a)
{
    const int64_t qd = (int64_t)a->n_heads * a->kv->head_dim;
    CAIRN_ASSERT(a->n_heads % a->kv->n_kv_heads == 0 && a->layer >= 0 &&
                 a->layer < a->kv->n_layers);
    for (int s = 0; s < a->n_seqs; s++) {
        int off = a->seq_off[s], n = a->seq_off[s + 1] - off;
        if (n <= 0) continue;
        struct cpu_attn ca = {
            .q = a->q + off * qd,
            .out = a->out + off * qd,
            .n_tokens = n,
            .n_heads = a->n_heads,
            .pos = a->pos + off,
            .kv = a->kv,
            .layer = a->layer,
            .block_table = a->block_tables + (size_t)s * (size_t)a->bt_stride,
            .scale = a->scale,
        };
        cpu_attention(&ca);
    }
}

static void cpu_be_moe_route(struct backend *be, const float *logits, int n, int n_experts,
                             int top_k, int norm_topk, int32_t *ids, float *w)
{
    cpu_moe_route(logits, n, n_experts, top_k, norm_topk, ids, w);
}

static void cpu_be_moe_experts(struct backend *be, const struct backend_moe *m)
{
    cpu_moe_experts(m);
}

static void cpu_be_gdn(struct backend *be, const struct backend_gdn *g)
{
    cpu_gdn(g);
}

static const struct backend_ops cpu_be_ops = {
    .destroy = cpu_be_destroy,
    .mem_stats = cpu_be_mem_stats,
    .buf_alloc = cpu_be_buf_alloc,
    .buf_free = cpu_be_buf_free,
    .buf_upload = cpu_be_copy,
    .buf_download = cpu_be_copy,
    .buf_copy = cpu_be_copy,
    .buf_zero = cpu_be_zero,
    /* host_pin / host_unpin stay NULL: the CPU's device memory is host memory already */
    .weight_prepare = cpu_be_weight_prepare,
    .weight_release = cpu_be_weight_release,
    .weight_slice_rows = cpu_be_weight_slice_rows,
    .step_begin = cpu_be_step_begin,
    .step_end = cpu_be_step_end,
    .sync = cpu_be_sync,
    .matmul = cpu_be_matmul,
    .matmul_multi = cpu_be_matmul_multi,
    .embed = cpu_be_embed,
    .rmsnorm = cpu_be_rmsnorm,
    .rope = cpu_be_rope,
    .silu_mul = cpu_be_silu_mul,
    .add = cpu_be_add,
    .add_bias = cpu_be_add_bias,
    .mul_sigmoid = cpu_be_mul_sigmoid,
    .add_sigmoid_scaled = cpu_be_add_sigmoid_scaled,
    .split_halves = cpu_be_split_halves,
    .gather_rows = cpu_be_gather_rows,
    .kv_store = cpu_be_kv_store,
    .attention = cpu_be_attention,
    .moe_route = cpu_be_moe_route,
    .moe_experts = cpu_be_moe_experts,
    .gdn = cpu_be_gdn,
    .copy_rows = cpu_be_copy_rows,
    .allreduce = cpu_tp_allreduce,
};

int cpu_backend_open(int n_threads, struct backend **out, struct cairn_err *err)
{
    *out = NULL;
    struct backend *be = calloc(1, sizeof(*be));
    if (!be) return cairn_err_set(err, CAIRN_ERR_NOMEM, "cpu: out of memory");
    pthread_mutex_lock(&cpu_be_mu);
    int rc = cpu_be_refs == 0 ? cpu_init(n_threads, err) : CAIRN_OK;
    if (rc == CAIRN_OK) cpu_be_refs++;
    pthread_mutex_unlock(&cpu_be_mu);
    if (rc != CAIRN_OK) {
        free(be);
        return rc;
    }
    be->ops = &cpu_be_ops;
    be->kind = BACKEND_CPU;
    snprintf(be->name, sizeof(be->name), "cpu");
    be->host_visible = 1;
    *out = be;
    return CAIRN_OK;
}
