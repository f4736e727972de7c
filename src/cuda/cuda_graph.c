/* CUDA graphs for decode steps: the ops of a step are recorded instead of launched, and a run
 * of ops seen before is replayed as one graph launch.
 *
 * DESIGN
 * - Why record first: a graph saves the per-kernel launch cost only if it is reused, and reuse
 *   is safe only if every launch of the step would get the same arguments. The op table's
 *   calls say exactly that: each recorded op keeps its arguments by value (weights as their
 *   cuda_wdesc, the attention and KV views copied member by member so that padding stays zero, the attention's context as the bucket its
 *   split plan is made from, cuda_attn_ctx_bucket), so two runs of ops whose records are equal
 *   byte for byte launch the same kernels with the same arguments. Device data (token ids,
 *   positions, block tables, slots, context lengths) is read by the kernels from the step's
 *   buffers, so it may change freely between replays.
 * - Flush: the recorded run is flushed when the step needs its results or does something a
 *   graph cannot hold: a copy in or out (buf_upload/download/copy on the step's thread), sync,
 *   step_end, or an op this file does not record (matmuls of more than CUDA_GRAPH_GEMM_MAX_N rows, the tiled prefill
 *   attention with its host tile list, moe_experts over more than CUDA_MOE_DEVICE_MAX_N tokens,
 *   the tensor-parallel all-reduce): that op and the rest of the step then run eagerly. MoE
 *   routing, the device experts path, the shared expert's gate, DeltaNet and strided copies are
 *   recorded like the dense ops; matmul_fused is one record at GEMV size and its plain ops
 *   (rmsnorm, the matmuls under the rule above, silu_mul) beyond it.
 *   A flush looks the run up in a small cache (CUDA_GRAPH_CACHE runs,
 *   least recently used replaced): a run captured before is one cudaGraphLaunch; a run seen
 *   once before is replayed into a stream capture, instantiated and launched (the first sight
 *   runs eagerly, so every workspace has grown to its size before any capture: nothing syncs
 *   inside a capture); a new run is replayed eagerly and remembered.
 * - Invalidation: freeing device memory (buffers, weights) or growing a workspace bumps
 *   c->g_gen; the next flush drops every cached graph.
 * - Off with CAIRN_CUDA_GRAPHS=0 (ops then launch as they are called).
 * Threading: recording and the cache belong to the step (under c->step_lock); g_gen is atomic
 * because buffers may be freed on any thread. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/log.h"
#include "cuda/cuda.h"
#include "cuda/cuda_int.h"

enum cuda_gop {
    CUDA_G_EMBED = 1,
    CUDA_G_RMSNORM,
    CUDA_G_MATMUL, /* matmul and matmul_multi */
    CUDA_G_ROPE,
    CUDA_G_SILU_MUL,
    CUDA_G_ADD,
    CUDA_G_ADD_BIAS,
    CUDA_G_MUL_SIGMOID,
    CUDA_G_SPLIT_HALVES,
    CUDA_G_GATHER_ROWS,
    CUDA_G_KV_STORE,
    CUDA_G_ATTENTION,
    CUDA_G_QK_ROPE_STORE,
    /* MoE and hybrid layers (issue 15) */
    CUDA_G_ADD_SIGMOID_SCALED,
    CUDA_G_MOE_ROUTE,
    CUDA_G_MOE_EXPERTS, /* the device path only (cuda_moe.c) */
    CUDA_G_GDN,
    CUDA_G_COPY_ROWS,
    CUDA_G_MATMUL_FUSED,
};

/* One recorded op: zeroed before it is filled, so that records compare with memcmp. */
struct cuda_grec {
    int op;
    union {
        struct {
            const struct tensor *w;
            struct cuda_wdesc d;
            const int32_t *ids;
            int n;
            float *out;
        } embed;
        struct {
            float *y;
            const float *x, *w;
            int n_rows, dim;
            float eps, w_offset;
        } rmsnorm;
        struct {
            const struct tensor *w[CUDA_GEMV_MAX_W];
            struct cuda_wdesc d[CUDA_GEMV_MAX_W];
            float *y[CUDA_GEMV_MAX_W];
            int count, n, multi; /* multi: 0 matmul, 1 matmul_multi, 2 matmul_add */
            const float *x;
        } mm;
        struct { /* backend_matmul_fused field by field, its arrays by value */
            const struct tensor *w[CUDA_GEMV_MAX_W];
            struct cuda_wdesc d[CUDA_GEMV_MAX_W];
            float *y[CUDA_GEMV_MAX_W];
            const float *x, *norm;
            float *h;
            int count, n, silu_mul;
            float eps, w_offset;
        } mmf;
        struct {
            float *x;
            int n_tokens, n_heads, head_dim, rot_dim;
            const int32_t *pos;
            const float *inv_freq;
        } rope;
        struct { /* silu_mul(out, a, b), add(out, a), mul_sigmoid(out, a) */
            float *out;
            const float *a, *b;
            int64_t n;
        } ew;
        struct {
            float *y;
            const float *b;
            int n_rows, dim;
        } bias;
        struct {
            float *a, *b;
            const float *src;
            int n_rows, width;
        } split;
        struct {
            float *dst;
            const float *src;
            const int32_t *rows;
            int n, dim;
        } gather;
        struct {
            struct backend_kv_view kv;
            int layer, n_tokens;
            const int32_t *slots;
            const float *k, *v;
        } kvs;
        struct { /* backend_qk_rope_store field by field */
            float *q, *k;
            const float *v, *q_norm, *k_norm, *inv_freq;
            const int32_t *pos, *slots;
            int n_tokens, n_heads, rot_dim, layer;
            float eps, w_offset;
            struct backend_kv_view kv; /* no padding */
        } qkr;
        struct { /* backend_attn field by field (its padding would not compare) */
            const float *q;
            float *out;
            const int32_t *pos, *seq_off, *block_tables, *seq_off_host, *ctx_len_host;
            int n_tokens, n_seqs, n_heads, bt_stride, layer, ctx_bucket;
            float scale;
            struct backend_kv_view kv; /* no padding */
        } attn;
        struct {
            float *y;
            const float *x, *g;
            int n_rows, dim;
        } asig;
        struct {
            const float *logits;
            int n, n_experts, top_k, norm_topk;
            int32_t *ids;
            float *w;
        } route;
        struct backend_moe moe; /* member by member (padding stays zero) */
        struct backend_gdn gdn; /* member by member */
        struct {
            float *dst;
            const float *src;
            int64_t dst_stride, src_stride;
            int n_rows, width;
        } crows;
    } u;
};

struct cuda_graph_entry {
    uint64_t hash;          /* of the records */
    int n_rec;              /* 0: free slot */
    struct cuda_grec *recs; /* a copy of the run */
    cudaGraphExec_t exec;   /* NULL: seen once, not captured yet */
    uint64_t last_use;
};

struct cuda_graphs {
    int recording;                 /* this step's ops are recorded */
    pthread_t step_thread;         /* the thread of the step being recorded */
    struct cuda_grec *recs;
    int n_rec, cap;
    struct cuda_graph_entry cache[CUDA_GRAPH_CACHE];
    uint64_t tick;
    uint64_t gen_seen;             /* c->g_gen when the cache was last checked */
    uint64_t n_launch, n_capture, n_eager; /* flushes by outcome (debug log at close) */
    int gemm_max_rows;             /* cuBLASLt matmuls of up to this many rows are recorded too */
};

/* Batched decode (9..256 rows) runs its matmuls through cuBLASLt: recorded like the GEMVs, a
 * 64-row step of an 8B is one graph launch instead of ~500 launches and ~130 cuBLASLt calls
 * (~5.7 ms of host time per step, more than the GPU's). Larger steps (prefill chunks) stay
 * eager: their GPU time dwarfs the launches. CAIRN_CUDA_GRAPH_GEMM=0 records GEMV sizes only. */
#define CUDA_GRAPH_GEMM_MAX_N 256

int cuda_graphs_init(struct cuda_impl *c)
{
    const char *s = getenv("CAIRN_CUDA_GRAPHS");
    if (s && strcmp(s, "0") == 0) return CAIRN_OK;
    c->graphs = calloc(1, sizeof(*c->graphs));
    if (!c->graphs) return CAIRN_ERR_NOMEM;
    s = getenv("CAIRN_CUDA_GRAPH_GEMM");
    c->graphs->gemm_max_rows = s && strcmp(s, "0") == 0 ? 0 : CUDA_GRAPH_GEMM_MAX_N;
    return CAIRN_OK;
}

static void cuda_graph_entry_clear(struct cuda_graph_entry *e)
{
    if (e->exec) (void)cudaGraphExecDestroy(e->exec);
    free(e->recs);
    memset(e, 0, sizeof(*e));
}

void cuda_graphs_free(struct cuda_impl *c)
{
    struct cuda_graphs *g = c->graphs;
    if (!g) return;
    LOG_DEBUG("cuda", "cuda:%d: graphs: %llu launched, %llu captured, %llu runs eager", c->device,
              (unsigned long long)g->n_launch, (unsigned long long)g->n_capture,
              (unsigned long long)g->n_eager);
    for (int i = 0; i < CUDA_GRAPH_CACHE; i++) cuda_graph_entry_clear(&g->cache[i]);
    free(g->recs);
    free(g);
    c->graphs = NULL;
}

void cuda_graphs_counts(struct backend *be, uint64_t *n_launch, uint64_t *n_capture, uint64_t *n_eager)
{
    struct cuda_graphs *g = cuda_impl_of(be)->graphs;
    *n_launch = g ? g->n_launch : 0;
    *n_capture = g ? g->n_capture : 0;
    *n_eager = g ? g->n_eager : 0;
}

void cuda_graphs_invalidate(struct cuda_impl *c)
{
    __atomic_add_fetch(&c->g_gen, 1, __ATOMIC_RELAXED);
}

void cuda_graphs_step_begin(struct cuda_impl *c)
{
    struct cuda_graphs *g = c->graphs;
    if (!g) return;
    g->recording = 1;
    g->step_thread = pthread_self();
    g->n_rec = 0;
}

/* Runs the records eagerly on the stream (inside a capture: into the graph). */
static void cuda_graph_replay(struct backend *be, const struct cuda_grec *recs, int n)
{
    for (int i = 0; i < n; i++) {
        const struct cuda_grec *r = &recs[i];
        switch (r->op) {
        case CUDA_G_EMBED:
            cuda_op_embed(be, r->u.embed.w, r->u.embed.ids, r->u.embed.n, r->u.embed.out);
            break;
        case CUDA_G_RMSNORM:
            cuda_op_rmsnorm(be, r->u.rmsnorm.y, r->u.rmsnorm.x, r->u.rmsnorm.w, r->u.rmsnorm.n_rows,
                            r->u.rmsnorm.dim, r->u.rmsnorm.eps, r->u.rmsnorm.w_offset);
            break;
        case CUDA_G_MATMUL:
            if (r->u.mm.multi == 1)
                cuda_op_matmul_multi(be, r->u.mm.w, r->u.mm.y, r->u.mm.count, r->u.mm.x, r->u.mm.n);
            else if (r->u.mm.multi == 2)
                cuda_op_matmul_add(be, r->u.mm.w[0], r->u.mm.x, r->u.mm.y[0], r->u.mm.n);
            else
                cuda_op_matmul(be, r->u.mm.w[0], r->u.mm.x, r->u.mm.y[0], r->u.mm.n);
            break;
        case CUDA_G_MATMUL_FUSED: {
            struct backend_matmul_fused f = {
                .w = r->u.mmf.w,
                .y = r->u.mmf.y,
                .count = r->u.mmf.count,
                .x = r->u.mmf.x,
                .n = r->u.mmf.n,
                .norm = r->u.mmf.norm,
                .eps = r->u.mmf.eps,
                .w_offset = r->u.mmf.w_offset,
                .h = r->u.mmf.h,
                .silu_mul = r->u.mmf.silu_mul,
            };
            cuda_op_matmul_fused(be, &f);
            break;
        }
        case CUDA_G_ROPE:
            cuda_op_rope(be, r->u.rope.x, r->u.rope.n_tokens, r->u.rope.n_heads, r->u.rope.head_dim,
                         r->u.rope.rot_dim, r->u.rope.pos, r->u.rope.inv_freq);
            break;
        case CUDA_G_SILU_MUL: cuda_op_silu_mul(be, r->u.ew.out, r->u.ew.a, r->u.ew.b, r->u.ew.n); break;
        case CUDA_G_ADD: cuda_op_add(be, r->u.ew.out, r->u.ew.a, r->u.ew.n); break;
        case CUDA_G_MUL_SIGMOID: cuda_op_mul_sigmoid(be, r->u.ew.out, r->u.ew.a, r->u.ew.n); break;
        case CUDA_G_ADD_BIAS:
            cuda_op_add_bias(be, r->u.bias.y, r->u.bias.b, r->u.bias.n_rows, r->u.bias.dim);
            break;
        case CUDA_G_SPLIT_HALVES:
            cuda_op_split_halves(be, r->u.split.a, r->u.split.b, r->u.split.src, r->u.split.n_rows,
                                 r->u.split.width);
            break;
        case CUDA_G_GATHER_ROWS:
            cuda_op_gather_rows(be, r->u.gather.dst, r->u.gather.src, r->u.gather.rows, r->u.gather.n,
                                r->u.gather.dim);
            break;
        case CUDA_G_KV_STORE:
            cuda_op_kv_store(be, &r->u.kvs.kv, r->u.kvs.layer, r->u.kvs.slots, r->u.kvs.n_tokens, r->u.kvs.k,
                             r->u.kvs.v);
            break;
        case CUDA_G_ATTENTION: {
            struct backend_attn a = {
                .q = r->u.attn.q, .out = r->u.attn.out, .n_tokens = r->u.attn.n_tokens,
                .n_seqs = r->u.attn.n_seqs, .n_heads = r->u.attn.n_heads, .pos = r->u.attn.pos,
                .seq_off = r->u.attn.seq_off, .block_tables = r->u.attn.block_tables,
                .bt_stride = r->u.attn.bt_stride, .seq_off_host = r->u.attn.seq_off_host,
                .ctx_len_host = r->u.attn.ctx_len_host, .kv = &r->u.attn.kv, .layer = r->u.attn.layer,
                .scale = r->u.attn.scale,
            };
            cuda_op_attention(be, &a);
            break;
        }
        case CUDA_G_QK_ROPE_STORE: {
            struct backend_qk_rope_store q = {
                .q = r->u.qkr.q, .k = r->u.qkr.k, .v = r->u.qkr.v, .q_norm = r->u.qkr.q_norm,
                .k_norm = r->u.qkr.k_norm, .pos = r->u.qkr.pos, .inv_freq = r->u.qkr.inv_freq,
                .slots = r->u.qkr.slots, .kv = &r->u.qkr.kv, .n_tokens = r->u.qkr.n_tokens,
                .n_heads = r->u.qkr.n_heads, .rot_dim = r->u.qkr.rot_dim, .layer = r->u.qkr.layer,
                .eps = r->u.qkr.eps, .w_offset = r->u.qkr.w_offset,
            };
            cuda_op_qk_rope_store(be, &q);
            break;
        }
        case CUDA_G_ADD_SIGMOID_SCALED:
            cuda_op_add_sigmoid_scaled(be, r->u.asig.y, r->u.asig.x, r->u.asig.g, r->u.asig.n_rows, r->u.asig.dim);
            break;
        case CUDA_G_MOE_ROUTE:
            cuda_op_moe_route(be, r->u.route.logits, r->u.route.n, r->u.route.n_experts, r->u.route.top_k,
                              r->u.route.norm_topk, r->u.route.ids, r->u.route.w);
            break;
        case CUDA_G_MOE_EXPERTS: cuda_op_moe_experts(be, &r->u.moe); break;
        case CUDA_G_GDN: cuda_op_gdn(be, &r->u.gdn); break;
        case CUDA_G_COPY_ROWS:
            cuda_op_copy_rows(be, r->u.crows.dst, r->u.crows.dst_stride, r->u.crows.src, r->u.crows.src_stride,
                              r->u.crows.n_rows, r->u.crows.width);
            break;
        default: CAIRN_ASSERT(!"cuda graphs: unknown record");
        }
    }
}

/* Captures the records into a graph and instantiates it; NULL (error latched) if it fails. */
static cudaGraphExec_t cuda_graph_capture(struct backend *be, const struct cuda_grec *recs, int n)
{
    struct cuda_impl *c = cuda_impl_of(be);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (cuda_check(c, NULL, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal)))
        return NULL;
    c->g_capturing = 1;
    cuda_graph_replay(be, recs, n);
    c->g_capturing = 0;
    cudaError_t rc = cudaStreamEndCapture(c->stream, &graph);
    if (c->err_status == CAIRN_OK) (void)cuda_check(c, NULL, rc);
    if (c->err_status == CAIRN_OK)
        (void)cuda_check(c, NULL, cudaGraphInstantiate(&exec, graph, 0));
    if (graph) (void)cudaGraphDestroy(graph);
    if (c->err_status != CAIRN_OK && exec) {
        (void)cudaGraphExecDestroy(exec);
        exec = NULL;
    }
    return exec;
}

/* The token rows of a recorded run, for the step profile: its embedding's, else its first
 * matmul's; -1 when it has neither. */
static int cuda_graph_rows(const struct cuda_grec *recs, int n)
{
    for (int i = 0; i < n; i++)
        if (recs[i].op == CUDA_G_EMBED) return recs[i].u.embed.n;
    for (int i = 0; i < n; i++)
        if (recs[i].op == CUDA_G_MATMUL) return recs[i].u.mm.n;
    return -1;
}

/* Launches the recorded run (see DESIGN) and empties the record list. */
static void cuda_graph_flush(struct backend *be)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_graphs *g = c->graphs;
    int n = g->n_rec;
    g->n_rec = 0;
    if (!n || c->err_status != CAIRN_OK) return;
    uint64_t gen = __atomic_load_n(&c->g_gen, __ATOMIC_RELAXED);
    if (gen != g->gen_seen) {
        for (int i = 0; i < CUDA_GRAPH_CACHE; i++) cuda_graph_entry_clear(&g->cache[i]);
        g->gen_seen = gen;
    }
    size_t bytes = (size_t)n * sizeof(struct cuda_grec);
    uint64_t h = XXH3_64bits(g->recs, bytes);
    struct cuda_graph_entry *e = NULL, *victim = &g->cache[0];
    for (int i = 0; i < CUDA_GRAPH_CACHE; i++) {
        struct cuda_graph_entry *x = &g->cache[i];
        if (x->n_rec == n && x->hash == h && memcmp(x->recs, g->recs, bytes) == 0) {
            e = x;
            break;
        }
        if (x->n_rec == 0 || (victim->n_rec != 0 && x->last_use < victim->last_use)) victim = x;
    }
    g->tick++;
    if (c->prof_step)
        cuda_prof_step_launch(c->prof_step, c->stream, cuda_graph_rows(g->recs, n), e && e->exec);
    if (e && e->exec) {
        e->last_use = g->tick;
        g->n_launch++;
        (void)cuda_check(c, NULL, cudaGraphLaunch(e->exec, c->stream));
        return;
    }
    if (e) { /* the second sight: capture it */
        e->last_use = g->tick;
        e->exec = cuda_graph_capture(be, g->recs, n);
        if (e->exec) {
            g->n_capture++;
            (void)cuda_check(c, NULL, cudaGraphLaunch(e->exec, c->stream));
        }
        return;
    }
    /* the first sight: run it eagerly, remember it */
    cuda_graph_replay(be, g->recs, n);
    g->n_eager++;
    if (c->err_status != CAIRN_OK) return;
    struct cuda_grec *copy = malloc(bytes);
    if (!copy) return; /* not remembered: it runs eagerly again next time */
    memcpy(copy, g->recs, bytes);
    cuda_graph_entry_clear(victim);
    victim->hash = h;
    victim->n_rec = n;
    victim->recs = copy;
    victim->last_use = g->tick;
}

/* Flushes and stops recording for the rest of the step (an op the graphs do not hold). */
static void cuda_graph_go_eager(struct backend *be)
{
    struct cuda_graphs *g = cuda_impl_of(be)->graphs;
    if (!g || !g->recording) return;
    cuda_graph_flush(be);
    g->recording = 0;
}

void cuda_graphs_before_copy(struct backend *be)
{
    struct cuda_graphs *g = cuda_impl_of(be)->graphs;
    if (g && g->recording && g->n_rec && pthread_equal(g->step_thread, pthread_self())) cuda_graph_flush(be);
}

void cuda_graphs_step_end(struct backend *be)
{
    struct cuda_graphs *g = cuda_impl_of(be)->graphs;
    if (!g || !g->recording) return;
    cuda_graph_flush(be);
    g->recording = 0;
}

/* A zeroed record appended to the step's run; NULL when the op is to run now (not recording,
 * an error latched, or no memory to record: then the run so far is flushed). */
static struct cuda_grec *cuda_graph_rec(struct backend *be, int op)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_graphs *g = c->graphs;
    if (!g || !g->recording || c->err_status != CAIRN_OK) return NULL;
    if (g->n_rec == g->cap) {
        int cap = g->cap ? 2 * g->cap : 512;
        struct cuda_grec *r = realloc(g->recs, (size_t)cap * sizeof(*r));
        if (!r) {
            cuda_graph_go_eager(be);
            return NULL;
        }
        g->recs = r;
        g->cap = cap;
    }
    struct cuda_grec *r = &g->recs[g->n_rec++];
    memset(r, 0, sizeof(*r));
    r->op = op;
    return r;
}

/* ---- the op table entries while graphs are on: record, or run ---- */

/* A weight's view, member by member (the record's padding stays zero). */
static void cuda_grec_wdesc(struct cuda_wdesc *dst, const struct tensor *w)
{
    struct cuda_wdesc d = cuda_wdesc_of(w);
    dst->type = d.type;
    dst->rows = d.rows;
    dst->cols = d.cols;
    dst->data = d.data;
    dst->row_bytes = d.row_bytes;
    dst->bits = d.bits;
    dst->group_size = d.group_size;
}

static void cuda_gop_embed(struct backend *be, const struct tensor *w, const int32_t *ids, int n, float *out)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_EMBED);
    if (!r) {
        cuda_op_embed(be, w, ids, n, out);
        return;
    }
    r->u.embed.w = w;
    cuda_grec_wdesc(&r->u.embed.d, w);
    r->u.embed.ids = ids;
    r->u.embed.n = n;
    r->u.embed.out = out;
}

static void cuda_gop_rmsnorm(struct backend *be, float *y, const float *x, const float *w, int n_rows, int dim,
                             float eps, float w_offset)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_RMSNORM);
    if (!r) {
        cuda_op_rmsnorm(be, y, x, w, n_rows, dim, eps, w_offset);
        return;
    }
    r->u.rmsnorm.y = y;
    r->u.rmsnorm.x = x;
    r->u.rmsnorm.w = w;
    r->u.rmsnorm.n_rows = n_rows;
    r->u.rmsnorm.dim = dim;
    r->u.rmsnorm.eps = eps;
    r->u.rmsnorm.w_offset = w_offset;
}

/* matmuls of GEMV size and cuBLASLt ones of up to gemm_max_rows rows are recorded (cuBLASLt
 * calls are capturable: user workspace, and cuda_matmul.c neither tunes nor syncs inside a
 * capture; the first sight of a run is eager, so its shapes' algorithms and the dequant/convert
 * workspaces are settled before any capture); larger ones run eagerly */
static void cuda_gop_matmul_any(struct backend *be, const struct tensor *const *w, float *const *y, int count,
                                const float *x, int n, int multi)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_grec *r = NULL;
    if (count <= CUDA_GEMV_MAX_W && (n <= c->gemv_max_rows || (c->graphs && n <= c->graphs->gemm_max_rows)))
        r = cuda_graph_rec(be, CUDA_G_MATMUL);
    else cuda_graph_go_eager(be);
    if (!r) {
        if (multi == 1) cuda_op_matmul_multi(be, w, y, count, x, n);
        else if (multi == 2) cuda_op_matmul_add(be, w[0], x, y[0], n);
        else cuda_op_matmul(be, w[0], x, y[0], n);
        return;
    }
    for (int i = 0; i < count; i++) {
        r->u.mm.w[i] = w[i];
        cuda_grec_wdesc(&r->u.mm.d[i], w[i]);
        r->u.mm.y[i] = y[i];
    }
    r->u.mm.count = count;
    r->u.mm.n = n;
    r->u.mm.multi = multi;
    r->u.mm.x = x;
}

static void cuda_gop_matmul(struct backend *be, const struct tensor *w, const float *x, float *y, int n)
{
    cuda_gop_matmul_any(be, &w, &y, 1, x, n, 0);
}

static void cuda_gop_matmul_multi(struct backend *be, const struct tensor *const *w, float *const *y, int count,
                                  const float *x, int n)
{
    cuda_gop_matmul_any(be, w, y, count, x, n, 1);
}

static void cuda_gop_matmul_add(struct backend *be, const struct tensor *w, const float *x, float *y, int n)
{
    cuda_gop_matmul_any(be, &w, &y, 1, x, n, 2);
}

static void cuda_gop_silu_mul(struct backend *be, float *out, const float *gate, const float *up,
                              int64_t n);

/* One record at GEMV size or the tensor-core kernel's (the fold is one kernel), and at GEMM
 * size up to gemm_max_rows rows with fuse_gemm (cuda_op_matmul_fused's norm and SwiGLU then
 * write the GEMMs' 16-bit inputs; a batched decode step stays one graph); larger ones eagerly.
 * With CAIRN_CUDA_FUSE_GEMM=0 a GEMM-sized step is what cuda_op_matmul_fused runs then, the norm,
 * the matmuls and SwiGLU as their own ops, each recorded by its own rule. */
static void cuda_gop_matmul_fused(struct backend *be, const struct backend_matmul_fused *f)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_grec *r = NULL;
    int big = f->n > cuda_mm_small_rows(c) && f->n > 0 && f->count > 0;
    if (big && c->fuse_gemm && (!c->graphs || f->n > c->graphs->gemm_max_rows)) {
        cuda_graph_go_eager(be);
        cuda_op_matmul_fused(be, f);
        return;
    }
    if (big && !c->fuse_gemm) {
        const float *x = f->x;
        if (f->norm) {
            cuda_gop_rmsnorm(be, f->h, x, f->norm, f->n, (int)f->w[0]->shape[1], f->eps,
                             f->w_offset);
            x = f->h;
        }
        cuda_gop_matmul_any(be, f->w, f->y, f->count, x, f->n, 1);
        if (f->silu_mul)
            cuda_gop_silu_mul(be, f->y[0], f->y[0], f->y[1], (int64_t)f->n * f->w[0]->shape[0]);
        return;
    }
    if (f->count <= CUDA_GEMV_MAX_W) r = cuda_graph_rec(be, CUDA_G_MATMUL_FUSED);
    else cuda_graph_go_eager(be);
    if (!r) {
        cuda_op_matmul_fused(be, f);
        return;
    }
    for (int i = 0; i < f->count; i++) {
        r->u.mmf.w[i] = f->w[i];
        cuda_grec_wdesc(&r->u.mmf.d[i], f->w[i]);
        r->u.mmf.y[i] = f->y[i];
    }
    r->u.mmf.x = f->x;
    r->u.mmf.norm = f->norm;
    r->u.mmf.h = f->h;
    r->u.mmf.count = f->count;
    r->u.mmf.n = f->n;
    r->u.mmf.silu_mul = f->silu_mul;
    r->u.mmf.eps = f->eps;
    r->u.mmf.w_offset = f->w_offset;
}

static void cuda_gop_qk_rope_store(struct backend *be, const struct backend_qk_rope_store *q)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_QK_ROPE_STORE);
    if (!r) {
        cuda_op_qk_rope_store(be, q);
        return;
    }
    r->u.qkr.q = q->q;
    r->u.qkr.k = q->k;
    r->u.qkr.v = q->v;
    r->u.qkr.q_norm = q->q_norm;
    r->u.qkr.k_norm = q->k_norm;
    r->u.qkr.inv_freq = q->inv_freq;
    r->u.qkr.pos = q->pos;
    r->u.qkr.slots = q->slots;
    r->u.qkr.n_tokens = q->n_tokens;
    r->u.qkr.n_heads = q->n_heads;
    r->u.qkr.rot_dim = q->rot_dim;
    r->u.qkr.layer = q->layer;
    r->u.qkr.eps = q->eps;
    r->u.qkr.w_offset = q->w_offset;
    r->u.qkr.kv = *q->kv;
}

static void cuda_gop_rope(struct backend *be, float *x, int n_tokens, int n_heads, int head_dim, int rot_dim,
                          const int32_t *pos, const float *inv_freq)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_ROPE);
    if (!r) {
        cuda_op_rope(be, x, n_tokens, n_heads, head_dim, rot_dim, pos, inv_freq);
        return;
    }
    r->u.rope.x = x;
    r->u.rope.n_tokens = n_tokens;
    r->u.rope.n_heads = n_heads;
    r->u.rope.head_dim = head_dim;
    r->u.rope.rot_dim = rot_dim;
    r->u.rope.pos = pos;
    r->u.rope.inv_freq = inv_freq;
}

static int cuda_gop_ew(struct backend *be, int op, float *out, const float *a, const float *b, int64_t n)
{
    struct cuda_grec *r = cuda_graph_rec(be, op);
    if (!r) return 0;
    r->u.ew.out = out;
    r->u.ew.a = a;
    r->u.ew.b = b;
    r->u.ew.n = n;
    return 1;
}

static void cuda_gop_silu_mul(struct backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    if (!cuda_gop_ew(be, CUDA_G_SILU_MUL, out, gate, up, n)) cuda_op_silu_mul(be, out, gate, up, n);
}

static void cuda_gop_add(struct backend *be, float *y, const float *x, int64_t n)
{
    if (!cuda_gop_ew(be, CUDA_G_ADD, y, x, NULL, n)) cuda_op_add(be, y, x, n);
}

static void cuda_gop_mul_sigmoid(struct backend *be, float *y, const float *g, int64_t n)
{
    if (!cuda_gop_ew(be, CUDA_G_MUL_SIGMOID, y, g, NULL, n)) cuda_op_mul_sigmoid(be, y, g, n);
}

static void cuda_gop_add_bias(struct backend *be, float *y, const float *b, int n_rows, int dim)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_ADD_BIAS);
    if (!r) {
        cuda_op_add_bias(be, y, b, n_rows, dim);
        return;
    }
    r->u.bias.y = y;
    r->u.bias.b = b;
    r->u.bias.n_rows = n_rows;
    r->u.bias.dim = dim;
}

static void cuda_gop_split_halves(struct backend *be, float *a, float *b, const float *src, int n_rows, int width)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_SPLIT_HALVES);
    if (!r) {
        cuda_op_split_halves(be, a, b, src, n_rows, width);
        return;
    }
    r->u.split.a = a;
    r->u.split.b = b;
    r->u.split.src = src;
    r->u.split.n_rows = n_rows;
    r->u.split.width = width;
}

static void cuda_gop_gather_rows(struct backend *be, float *dst, const float *src, const int32_t *rows, int n,
                                 int dim)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_GATHER_ROWS);
    if (!r) {
        cuda_op_gather_rows(be, dst, src, rows, n, dim);
        return;
    }
    r->u.gather.dst = dst;
    r->u.gather.src = src;
    r->u.gather.rows = rows;
    r->u.gather.n = n;
    r->u.gather.dim = dim;
}

static void cuda_gop_kv_store(struct backend *be, const struct backend_kv_view *kv, int layer,
                              const int32_t *slots, int n_tokens, const float *k, const float *v)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_KV_STORE);
    if (!r) {
        cuda_op_kv_store(be, kv, layer, slots, n_tokens, k, v);
        return;
    }
    r->u.kvs.kv = *kv;
    r->u.kvs.layer = layer;
    r->u.kvs.n_tokens = n_tokens;
    r->u.kvs.slots = slots;
    r->u.kvs.k = k;
    r->u.kvs.v = v;
}

/* Only the split-K kernels: their launch depends on the context through its bucket alone. */
static void cuda_gop_attention(struct backend *be, const struct backend_attn *a)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_grec *r = NULL;
    if (cuda_attn_split_path(c, a)) r = cuda_graph_rec(be, CUDA_G_ATTENTION);
    else cuda_graph_go_eager(be);
    if (!r) {
        cuda_op_attention(be, a);
        return;
    }
    /* The host arrays' pointers are the step staging's (the same every step); their contents
     * count only through the bucket the split plan is made from. */
    r->u.attn.q = a->q;
    r->u.attn.out = a->out;
    r->u.attn.pos = a->pos;
    r->u.attn.seq_off = a->seq_off;
    r->u.attn.block_tables = a->block_tables;
    r->u.attn.seq_off_host = a->seq_off_host;
    r->u.attn.ctx_len_host = a->ctx_len_host;
    r->u.attn.n_tokens = a->n_tokens;
    r->u.attn.n_seqs = a->n_seqs;
    r->u.attn.n_heads = a->n_heads;
    r->u.attn.bt_stride = a->n_seqs == 1 ? 0 : a->bt_stride; /* unused with one sequence */
    r->u.attn.layer = a->layer;
    r->u.attn.ctx_bucket = cuda_attn_ctx_bucket(a);
    r->u.attn.scale = a->scale;
    r->u.attn.kv = *a->kv;
}

/* ---- MoE and hybrid layers: every launch depends only on the recorded arguments (the routing
 * and the recurrent state are device data), except moe_experts over more tokens than
 * CUDA_MOE_DEVICE_MAX_N or on a layer cuda_moe.c cannot table: that reads the routing back
 * (a sync), so it runs eagerly. ---- */

static void cuda_gop_add_sigmoid_scaled(struct backend *be, float *y, const float *x, const float *g,
                                        int n_rows, int dim)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_ADD_SIGMOID_SCALED);
    if (!r) {
        cuda_op_add_sigmoid_scaled(be, y, x, g, n_rows, dim);
        return;
    }
    r->u.asig.y = y;
    r->u.asig.x = x;
    r->u.asig.g = g;
    r->u.asig.n_rows = n_rows;
    r->u.asig.dim = dim;
}

static void cuda_gop_moe_route(struct backend *be, const float *logits, int n, int n_experts, int top_k,
                               int norm_topk, int32_t *ids, float *w)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_MOE_ROUTE);
    if (!r) {
        cuda_op_moe_route(be, logits, n, n_experts, top_k, norm_topk, ids, w);
        return;
    }
    r->u.route.logits = logits;
    r->u.route.n = n;
    r->u.route.n_experts = n_experts;
    r->u.route.top_k = top_k;
    r->u.route.norm_topk = norm_topk;
    r->u.route.ids = ids;
    r->u.route.w = w;
}

static void cuda_gop_moe_experts(struct backend *be, const struct backend_moe *m)
{
    struct cuda_impl *c = cuda_impl_of(be);
    struct cuda_grec *r = NULL;
    if (m->n >= 1 && m->n <= CUDA_MOE_DEVICE_MAX_N && !c->moe_host_only && cuda_moe_tabled(be, m))
        r = cuda_graph_rec(be, CUDA_G_MOE_EXPERTS);
    else
        cuda_graph_go_eager(be);
    if (!r) {
        cuda_op_moe_experts(be, m);
        return;
    }
    struct backend_moe *d = &r->u.moe;
    d->x = m->x;
    d->out = m->out;
    d->n = m->n;
    d->hidden = m->hidden;
    d->inter = m->inter;
    d->n_experts = m->n_experts;
    d->top_k = m->top_k;
    d->ids = m->ids;
    d->w = m->w;
    d->gate = m->gate;
    d->up = m->up;
    d->down = m->down;
    d->scratch = m->scratch;
}

static void cuda_gop_gdn(struct backend *be, const struct backend_gdn *gd)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_GDN);
    if (!r) {
        cuda_op_gdn(be, gd);
        return;
    }
    struct backend_gdn *d = &r->u.gdn;
    d->n_k_heads = gd->n_k_heads;
    d->n_v_heads = gd->n_v_heads;
    d->head_k_dim = gd->head_k_dim;
    d->head_v_dim = gd->head_v_dim;
    d->conv_kernel = gd->conv_kernel;
    d->eps = gd->eps;
    d->conv_w = gd->conv_w;
    d->a_log = gd->a_log;
    d->dt_bias = gd->dt_bias;
    d->norm_w = gd->norm_w;
    d->state = gd->state;
    d->qkv = gd->qkv;
    d->z = gd->z;
    d->b = gd->b;
    d->a = gd->a;
    d->n = gd->n;
    d->out = gd->out;
}

static void cuda_gop_copy_rows(struct backend *be, float *dst, int64_t dst_stride, const float *src,
                               int64_t src_stride, int n_rows, int width)
{
    struct cuda_grec *r = cuda_graph_rec(be, CUDA_G_COPY_ROWS);
    if (!r) {
        cuda_op_copy_rows(be, dst, dst_stride, src, src_stride, n_rows, width);
        return;
    }
    r->u.crows.dst = dst;
    r->u.crows.src = src;
    r->u.crows.dst_stride = dst_stride;
    r->u.crows.src_stride = src_stride;
    r->u.crows.n_rows = n_rows;
    r->u.crows.width = width;
}

/* Not recorded yet (NCCL calls can be captured; left for the multi-GPU runs to measure). */
static void cuda_gop_allreduce(struct backend *be, float *buf, int64_t n)
{
    cuda_graph_go_eager(be);
    cuda_nccl_allreduce(be, buf, n);
}

void cuda_graphs_fill_ops(struct backend_ops *ops)
{
    ops->matmul = cuda_gop_matmul;
    ops->matmul_multi = cuda_gop_matmul_multi;
    ops->embed = cuda_gop_embed;
    ops->rmsnorm = cuda_gop_rmsnorm;
    ops->rope = cuda_gop_rope;
    ops->silu_mul = cuda_gop_silu_mul;
    ops->add = cuda_gop_add;
    ops->add_bias = cuda_gop_add_bias;
    ops->mul_sigmoid = cuda_gop_mul_sigmoid;
    ops->add_sigmoid_scaled = cuda_gop_add_sigmoid_scaled;
    ops->split_halves = cuda_gop_split_halves;
    ops->gather_rows = cuda_gop_gather_rows;
    ops->kv_store = cuda_gop_kv_store;
    ops->attention = cuda_gop_attention;
    ops->moe_route = cuda_gop_moe_route;
    ops->moe_experts = cuda_gop_moe_experts;
    ops->gdn = cuda_gop_gdn;
    ops->copy_rows = cuda_gop_copy_rows;
    ops->matmul_add = cuda_gop_matmul_add;
    ops->qk_rope_store = cuda_gop_qk_rope_store;
    ops->matmul_fused = cuda_gop_matmul_fused;
    ops->allreduce = cuda_gop_allreduce;
}
