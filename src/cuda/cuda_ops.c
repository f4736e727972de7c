/* The ops of the CUDA backend other than matmul: argument checks, launch, and the error latch
 * (cuda_int.h). Each launches the kernel of the same name (cuda_kernels.h) on the backend's
 * stream; nothing here waits for the GPU except moe_experts over more than CUDA_MOE_DEVICE_MAX_N
 * tokens (a prefill), which reads the routing back to group tokens by expert (per expert
 * gather, GEMM, scatter); smaller batches take cuda_moe.c's path, on the device alone. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_int.h"

/* Skips the op when the step has already failed; else launches `call` and latches its error. */
#define CUDA_OP(be, call)                                                                          \
    do {                                                                                           \
        struct cuda_impl *c_ = cuda_impl_of(be);                                                   \
        if (c_->err_status != CAIRN_OK) break;                                                     \
        (void)cuda_check_launch(c_, (call));                                           \
    } while (0)

#define CUDA_S(be) (cuda_impl_of(be)->stream)

void cuda_op_embed(struct backend *be, const struct tensor *w, const int32_t *ids, int n, float *out)
{
    struct cuda_wdesc d = cuda_wdesc_of(w);
    CUDA_OP(be, cuda_k_embed(CUDA_S(be), &d, ids, n, out));
}

void cuda_op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n_rows,
                     int dim, float eps, float w_offset)
{
    CUDA_OP(be, cuda_k_rmsnorm(CUDA_S(be), y, x, w, n_rows, dim, eps, w_offset));
}

void cuda_op_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_dim,
                  int rot_dim, const int32_t *pos, const float *inv_freq)
{
    CAIRN_ASSERT(rot_dim >= 0 && rot_dim <= head_dim && rot_dim % 2 == 0);
    CUDA_OP(be, cuda_k_rope(CUDA_S(be), x, n_tokens, n_heads, head_dim, rot_dim, pos, inv_freq));
}

void cuda_op_silu_mul(struct backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    CUDA_OP(be, cuda_k_silu_mul(CUDA_S(be), out, gate, up, n));
}

void cuda_op_add(struct backend *be, float *y, const float *x, int64_t n)
{
    CUDA_OP(be, cuda_k_add(CUDA_S(be), y, x, n));
}

void cuda_op_add_bias(struct backend *be, float *y, const float *b, int n_rows, int dim)
{
    CUDA_OP(be, cuda_k_add_bias(CUDA_S(be), y, b, n_rows, dim));
}

void cuda_op_mul_sigmoid(struct backend *be, float *y, const float *g, int64_t n)
{
    CUDA_OP(be, cuda_k_mul_sigmoid(CUDA_S(be), y, g, n));
}

void cuda_op_add_sigmoid_scaled(struct backend *be, float *y, const float *x, const float *g,
                                int n_rows, int dim)
{
    CUDA_OP(be, cuda_k_add_sigmoid_scaled(CUDA_S(be), y, x, g, n_rows, dim));
}

void cuda_op_split_halves(struct backend *be, float *a, float *b, const float *src, int n_rows,
                          int width)
{
    CUDA_OP(be, cuda_k_split_halves(CUDA_S(be), a, b, src, n_rows, width));
}

void cuda_op_gather_rows(struct backend *be, float *dst, const float *src, const int32_t *rows,
                         int n, int dim)
{
    CUDA_OP(be, cuda_k_gather_rows(CUDA_S(be), dst, src, rows, n, dim));
}

void cuda_op_kv_store(struct backend *be, const struct backend_kv_view *kv, int layer,
                      const int32_t *slots, int n_tokens, const float *k, const float *v)
{
    CAIRN_ASSERT(kv->dtype == DTYPE_BF16 || kv->dtype == DTYPE_F32);
    CAIRN_ASSERT(layer >= 0 && layer < kv->n_layers);
    CUDA_OP(be, cuda_k_kv_store(CUDA_S(be), kv, layer, slots, n_tokens, k, v));
}

/* One launch for the q/k norms, both ropes and the KV write; the plain ops where the kernel
 * does not apply (a head wider than its shared row) or with CAIRN_CUDA_FUSE=0. */
void cuda_op_qk_rope_store(struct backend *be, const struct backend_qk_rope_store *r)
{
    struct cuda_impl *c = cuda_impl_of(be);
    const struct backend_kv_view *kv = r->kv;
    int hd = kv->head_dim;
    CAIRN_ASSERT(kv->dtype == DTYPE_BF16 || kv->dtype == DTYPE_F32);
    CAIRN_ASSERT(r->layer >= 0 && r->layer < kv->n_layers);
    CAIRN_ASSERT(r->rot_dim >= 0 && r->rot_dim <= hd && r->rot_dim % 2 == 0);
    if (c->fuse && hd <= CUDA_QKR_MAX_DIM) {
        CUDA_OP(be, cuda_k_qk_rope_store(CUDA_S(be), r));
        return;
    }
    int T = r->n_tokens, nh = r->n_heads, nkv = kv->n_kv_heads;
    if (r->q_norm) cuda_op_rmsnorm(be, r->q, r->q, r->q_norm, T * nh, hd, r->eps, r->w_offset);
    if (r->k_norm) cuda_op_rmsnorm(be, r->k, r->k, r->k_norm, T * nkv, hd, r->eps, r->w_offset);
    cuda_op_rope(be, r->q, T, nh, hd, r->rot_dim, r->pos, r->inv_freq);
    cuda_op_rope(be, r->k, T, nkv, hd, r->rot_dim, r->pos, r->inv_freq);
    cuda_op_kv_store(be, kv, r->layer, r->slots, T, r->k, r->v);
}

/* Context bucket: split plans change every CUDA_ATTN_CTX_BUCKET positions, not every step
 * (a graph of a decode step stays valid that long; the kernels stop at each row's own
 * context, read from its position). */
#define CUDA_ATTN_CTX_BUCKET 256

int cuda_attn_ctx_bucket(const struct backend_attn *a)
{
    int max_ctx = 0;
    for (int s = 0; s < a->n_seqs; s++) max_ctx = CAIRN_MAX(max_ctx, a->ctx_len_host[s]);
    return (max_ctx + CUDA_ATTN_CTX_BUCKET - 1) / CUDA_ATTN_CTX_BUCKET * CUDA_ATTN_CTX_BUCKET;
}

/* Several sequences: the stride (model_stage pads every row to it, and the graph record keeps
 * it). A sequence alone: the record drops the stride (it grows every block_size positions,
 * which would end the graph), so the launch may be replayed for any context in the bucket, the
 * shortest of which is bucket - CUDA_ATTN_CTX_BUCKET + 1 positions. */
int cuda_attn_bt_min(const struct backend_attn *a)
{
    if (a->n_seqs != 1) return a->bt_stride;
    int lo = cuda_attn_ctx_bucket(a) - CUDA_ATTN_CTX_BUCKET + 1, bs = a->kv->block_size;
    int n = lo < 1 ? 1 : (lo + bs - 1) / bs;
    return CAIRN_MAX(n, a->bt_stride); /* eager: the real stride */
}

int cuda_attn_split_path(struct cuda_impl *c, const struct backend_attn *a)
{
    return a->n_tokens > 0 && a->kv->head_dim <= CUDA_ATTN_HEAD_DIM_MAX && !cuda_attn_tiled(a, c->attn_mode);
}

void cuda_op_attention(struct backend *be, const struct backend_attn *a)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (c->err_status != CAIRN_OK || a->n_tokens <= 0) return;
    CAIRN_ASSERT(a->kv->dtype == DTYPE_BF16 || a->kv->dtype == DTYPE_F32);
    CAIRN_ASSERT(a->kv->n_kv_heads > 0 && a->n_heads % a->kv->n_kv_heads == 0);
    if (a->kv->head_dim > CUDA_ATTN_HEAD_DIM_MAX) {
        struct cairn_err e;
        cairn_err_set(&e, CAIRN_ERR_UNSUPPORTED, "cuda: attention with head_dim %d (at most %d)",
                      a->kv->head_dim, CUDA_ATTN_HEAD_DIM_MAX);
        cuda_latch(c, &e);
        return;
    }
    int max_ctx = 0;
    for (int s = 0; s < a->n_seqs; s++) max_ctx = CAIRN_MAX(max_ctx, a->ctx_len_host[s]);
    if (!cuda_attn_tiled(a, c->attn_mode)) max_ctx = cuda_attn_ctx_bucket(a);
    size_t floats = cuda_attn_ws_floats(a, max_ctx, c->n_sms, c->attn_mode, CUDA_ATTN_COUNTERS);
    float *ws = NULL;
    if (floats) {
        ws = cuda_ws_get(c, CUDA_WS_ATTN, floats * sizeof(float));
        if (!ws) return;
    }
    size_t tiles = 2 * (size_t)(a->n_tokens + a->n_seqs);
    if (c->attn_tiles_cap < tiles) {
        int32_t *t = realloc(c->attn_tiles_host, tiles * sizeof(int32_t));
        if (!t) {
            struct cairn_err e;
            cairn_err_set(&e, CAIRN_ERR_NOMEM, "cuda: attention: no host memory for %zu tiles", tiles / 2);
            cuda_latch(c, &e);
            return;
        }
        c->attn_tiles_host = t;
        c->attn_tiles_cap = tiles;
    }
    (void)cuda_check_launch(c, cuda_k_attention(c->stream, a, max_ctx, cuda_attn_bt_min(a), c->n_sms,
                                                c->attn_mode, c->attn_dec, ws, c->attn_tiles_host,
                                                c->attn_counters, CUDA_ATTN_COUNTERS));
}

void cuda_op_moe_route(struct backend *be, const float *logits, int n, int n_experts, int top_k,
                       int norm_topk, int32_t *ids, float *w)
{
    CAIRN_ASSERT(top_k >= 1 && top_k <= n_experts);
    CUDA_OP(be, cuda_k_moe_route(CUDA_S(be), logits, n, n_experts, top_k, norm_topk, ids, w));
}

/* Grows the two host arrays of moe_experts to `ints` each; 0 with the error latched if not. */
static int cuda_moe_host_reserve(struct cuda_impl *c, size_t ints)
{
    if (c->moe_host_cap >= ints) return 1;
    int32_t *a = realloc(c->moe_ids_host, ints * sizeof(int32_t));
    if (a) c->moe_ids_host = a;
    int32_t *b = a ? realloc(c->moe_list_host, ints * sizeof(int32_t)) : NULL;
    if (b) c->moe_list_host = b;
    if (!a || !b) {
        struct cairn_err e;
        cairn_err_set(&e, CAIRN_ERR_NOMEM, "cuda: moe_experts: no host memory for %zu token ids", ints);
        cuda_latch(c, &e);
        return 0;
    }
    c->moe_host_cap = ints;
    return 1;
}

/* Scratch (m->scratch, floats): xg [n, hidden] | g [n, inter] | u [n, inter] | yg [n, hidden]:
 * an expert takes each token at most once, so n rows bound every expert's batch. */
void cuda_op_moe_experts(struct backend *be, const struct backend_moe *m)
{
    struct cuda_impl *c = cuda_impl_of(be);
    if (c->err_status != CAIRN_OK || m->n <= 0) return;
    /* a decode-sized batch: sorted by expert on the device, no read-back (cuda_moe.c) */
    if (m->n <= CUDA_MOE_DEVICE_MAX_N && !c->moe_host_only && cuda_moe_experts_device(be, m)) return;
    int n = m->n, K = m->top_k, E = m->n_experts, H = m->hidden, I = m->inter;
    size_t n_ids = (size_t)n * K;
    if (!cuda_moe_host_reserve(c, n_ids + 2 * ((size_t)E + 1))) return;
    /* Host: ids [n_ids] read back; sorted [n_ids] entries t * K + k grouped by expert, in
     * (token, k) order within an expert as the CPU groups them; off [E + 1]; cur [E + 1]. */
    int32_t *ids = c->moe_ids_host, *sorted = c->moe_list_host;
    int32_t *off = sorted + n_ids, *cur = off + E + 1;
    if (cuda_check(c, NULL, cudaMemcpyAsync(ids, m->ids, n_ids * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                            c->stream)))
        return;
    if (cuda_stream_wait(c, NULL)) return;
    memset(off, 0, sizeof(int32_t) * ((size_t)E + 1));
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= E) {
            struct cairn_err e;
            cairn_err_set(&e, CAIRN_ERR_INTERNAL, "cuda: moe_experts: expert id %d of entry %zu is not in "
                          "[0, %d)", ids[i], i, E);
            cuda_latch(c, &e);
            return;
        }
        off[ids[i] + 1]++;
    }
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    memcpy(cur, off, sizeof(int32_t) * (size_t)E);
    for (size_t i = 0; i < n_ids; i++) sorted[cur[ids[i]]++] = (int32_t)i;
    int32_t *dev_list = cuda_ws_get(c, CUDA_WS_MOE, n_ids * sizeof(int32_t));
    if (!dev_list) return;
    /* From pageable memory: staged before the call returns, so sorted may be rewritten later. */
    if (cuda_check(c, NULL, cudaMemcpyAsync(dev_list, sorted, n_ids * sizeof(int32_t), cudaMemcpyHostToDevice,
                                            c->stream)))
        return;
    float *xg = m->scratch, *g = xg + (size_t)n * H, *u = g + (size_t)n * I, *yg = u + (size_t)n * I;
    if (cuda_check(c, NULL, cudaMemsetAsync(m->out, 0, sizeof(float) * (size_t)n * H, c->stream))) return;
    for (int e = 0; e < E && c->err_status == CAIRN_OK; e++) {
        int cnt = off[e + 1] - off[e];
        if (!cnt) continue;
        const int32_t *le = dev_list + off[e];
        if (cuda_check_launch(c, cuda_k_moe_gather(c->stream, xg, m->x, le, cnt, K, H))) return;
        cuda_op_matmul(be, &m->gate[e], xg, g, cnt);
        cuda_op_matmul(be, &m->up[e], xg, u, cnt);
        cuda_op_silu_mul(be, g, g, u, (int64_t)cnt * I);
        cuda_op_matmul(be, &m->down[e], g, yg, cnt);
        if (c->err_status != CAIRN_OK) return;
        (void)cuda_check_launch(c, cuda_k_moe_scatter(c->stream, m->out, yg, m->w, le, cnt, K, H));
    }
}

void cuda_op_gdn(struct backend *be, const struct backend_gdn *g)
{
    CAIRN_ASSERT(g->n_k_heads > 0 && g->n_v_heads % g->n_k_heads == 0);
    CUDA_OP(be, cuda_k_gdn(CUDA_S(be), g));
}

/* A strided row copy as one 2-D copy on the stream (the copy engine does the striding). */
void cuda_op_copy_rows(struct backend *be, float *dst, int64_t dst_stride, const float *src,
                       int64_t src_stride, int n_rows, int width)
{
    CAIRN_ASSERT(n_rows >= 0 && width >= 0 && dst_stride >= width && src_stride >= width);
    if (n_rows == 0 || width == 0) return;
    CUDA_OP(be, (int)cudaMemcpy2DAsync(dst, (size_t)dst_stride * sizeof(float), src,
                                       (size_t)src_stride * sizeof(float),
                                       (size_t)width * sizeof(float), (size_t)n_rows,
                                       cudaMemcpyDeviceToDevice, CUDA_S(be)));
}
