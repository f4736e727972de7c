/* moe_experts for a batch of up to CUDA_MOE_DEVICE_MAX_N tokens on the device alone
 * (cuda_moe.cu's kernels sort the slots by expert there): no read-back of the routing, so a
 * decode step's launches do not depend on which experts it picks.
 *
 * DESIGN
 * - The kernels find expert e's rows through device tables of row-0 pointers, one per layer and
 *   projection (cuda_moe_table). A table is built the first time a layer is seen (keyed by the
 *   address of its gate tensors) and checked against the experts' current pointers on every call
 *   (3 x n_experts compares on the host): a layer whose weights were freed and whose tensors
 *   reappear at the same address with other data gets a fresh upload, never stale pointers.
 * - Building uploads the table (allocation and copy: the first sight of a step runs eagerly,
 *   cuda_graph.c, so a capture only ever sees checked tables); a full cache replaces its oldest
 *   table and drops every cached graph (they may name it).
 * - A layer whose experts differ in layout (type, size, row bytes, bits, group size) is not
 *   tabled: the caller runs the grouped path. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_int.h"

#define CUDA_MOE_TABLES 256 /* MoE layers (with MTP heads, of every loaded model) kept */

struct cuda_moe_table {
    const struct tensor *gate, *up, *down; /* key: the layer's expert arrays */
    int n_experts;
    const void **host;                     /* [3][n_experts] row-0 pointers as uploaded */
    void *dev;                             /* device copy, 3 * n_experts pointers */
    uint64_t built;                        /* build order, for replacement */
};

struct cuda_moe_tables {
    struct cuda_moe_table t[CUDA_MOE_TABLES];
    uint64_t n_built;
};

static void cuda_moe_table_clear(struct cuda_impl *c, struct cuda_moe_table *t)
{
    if (t->dev) cuda_dev_free(c, t->dev, 3 * (size_t)t->n_experts * sizeof(void *), CAIRN_MEM_SCRATCH);
    free(t->host);
    memset(t, 0, sizeof(*t));
}

void cuda_moe_free(struct cuda_impl *c)
{
    if (!c->moe_tables) return;
    for (int i = 0; i < CUDA_MOE_TABLES; i++) cuda_moe_table_clear(c, &c->moe_tables->t[i]);
    free(c->moe_tables);
    c->moe_tables = NULL;
}

static int cuda_moe_same_layout(const struct cuda_wdesc *a, const struct cuda_wdesc *b)
{
    return a->type == b->type && a->rows == b->rows && a->cols == b->cols && a->row_bytes == b->row_bytes &&
           (a->type != CUDA_W_Q || (a->bits == b->bits && a->group_size == b->group_size));
}

/* Writes the experts' row-0 pointers to ptrs [3][E]; 0 if the experts differ in layout. */
static int cuda_moe_pointers(const struct backend_moe *m, const void **ptrs)
{
    const struct tensor *proj[3] = {m->gate, m->up, m->down};
    for (int p = 0; p < 3; p++) {
        struct cuda_wdesc d0 = cuda_wdesc_of(&proj[p][0]);
        for (int e = 0; e < m->n_experts; e++) {
            struct cuda_wdesc d = cuda_wdesc_of(&proj[p][e]);
            if (!cuda_moe_same_layout(&d0, &d)) return 0;
            ptrs[(size_t)p * m->n_experts + e] = d.data;
        }
    }
    return 1;
}

/* The checked table of m's layer (built or refreshed), or NULL: not tabled (layouts differ) or
 * an error latched. */
static struct cuda_moe_table *cuda_moe_table_get(struct cuda_impl *c, const struct backend_moe *m)
{
    struct cairn_err e;
    if (!c->moe_tables && !(c->moe_tables = calloc(1, sizeof(*c->moe_tables)))) goto nomem;
    struct cuda_moe_tables *ts = c->moe_tables;
    struct cuda_moe_table *t = NULL, *victim = &ts->t[0];
    for (int i = 0; i < CUDA_MOE_TABLES && !t; i++) {
        struct cuda_moe_table *x = &ts->t[i];
        if (x->gate == m->gate && x->up == m->up && x->down == m->down && x->n_experts == m->n_experts) t = x;
        else if (!x->gate || (victim->gate && x->built < victim->built)) victim = x;
    }
    size_t n_ptrs = 3 * (size_t)m->n_experts;
    if (t) {
        /* still the same weights? be_data is what cuda_wdesc_of puts in .data: comparing it
         * directly keeps this at 3 x n_experts loads (building the descriptors here cost about
         * 100 us of host time per decode step on a 12-layer 128-expert model) */
        const struct tensor *proj[3] = {m->gate, m->up, m->down};
        int same = 1;
        for (int p = 0; p < 3 && same; p++) {
            const void *const *h = t->host + (size_t)p * m->n_experts;
            for (int i = 0; i < m->n_experts; i++) same &= proj[p][i].be_data == h[i];
        }
        if (same) return t;
    } else {
        t = victim;
        if (t->gate) cuda_graphs_invalidate(c); /* graphs may name the table it held */
        cuda_moe_table_clear(c, t);
        t->host = malloc(n_ptrs * sizeof(void *));
        if (!t->host) goto nomem;
        if (cuda_dev_alloc(c, n_ptrs * sizeof(void *), CAIRN_MEM_SCRATCH, 0, &t->dev, &e) != CAIRN_OK) {
            free(t->host);
            t->host = NULL;
            cuda_latch(c, &e);
            return NULL;
        }
        t->gate = m->gate, t->up = m->up, t->down = m->down, t->n_experts = m->n_experts;
    }
    if (c->g_capturing) { /* cannot happen: the run was replayed eagerly before its capture */
        cairn_err_set(&e, CAIRN_ERR_INTERNAL, "cuda: moe_experts: an expert table changed inside a graph capture");
        cuda_latch(c, &e);
        return NULL;
    }
    if (!cuda_moe_pointers(m, t->host)) {
        cuda_moe_table_clear(c, t);
        return NULL;
    }
    t->built = ++ts->n_built;
    /* pageable source: staged before the call returns, so host may change afterwards */
    if (cuda_check(c, NULL, cudaMemcpyAsync(t->dev, t->host, n_ptrs * sizeof(void *), cudaMemcpyHostToDevice,
                                            c->stream)))
        return NULL;
    return t;
nomem:
    cairn_err_set(&e, CAIRN_ERR_NOMEM, "cuda: moe_experts: no host memory for an expert table");
    cuda_latch(c, &e);
    return NULL;
}

int cuda_moe_tabled(struct backend *be, const struct backend_moe *m)
{
    struct cuda_impl *c = cuda_impl_of(be);
    return c->err_status == CAIRN_OK && m->n_experts <= CUDA_MOE_MAX_EXPERTS && cuda_moe_table_get(c, m) != NULL;
}

int cuda_moe_experts_device(struct backend *be, const struct backend_moe *m)
{
    struct cuda_impl *c = cuda_impl_of(be);
    CAIRN_ASSERT(m->n >= 1 && m->n <= CUDA_MOE_DEVICE_MAX_N);
    if (m->n_experts > CUDA_MOE_MAX_EXPERTS) return 0;
    struct cuda_moe_table *t = cuda_moe_table_get(c, m);
    if (!t) return c->err_status != CAIRN_OK; /* latched: handled; else not tabled */
    /* scratch: h [slots, inter] | ys [slots, hidden] | list [slots] | off [E + 1] | act [E] |
     * n_act, each part 16-byte aligned (the kernels read h rows as float4) */
    size_t slots = (size_t)m->n * (size_t)m->top_k, E = (size_t)m->n_experts;
    size_t f_h = (slots * (size_t)m->inter + 3) & ~(size_t)3, f_y = (slots * (size_t)m->hidden + 3) & ~(size_t)3;
    size_t i_list = (slots + 3) & ~(size_t)3, i_off = (E + 1 + 3) & ~(size_t)3, i_act = (E + 3) & ~(size_t)3;
    size_t bytes = (f_h + f_y + i_list + i_off + i_act + 4) * 4;
    uint8_t *p = cuda_ws_get(c, CUDA_WS_MOE_DEV, bytes);
    if (!p) return 1;
    struct cuda_moe_ws ws = {.x = m->x};
    ws.h = (float *)p;
    ws.ys = ws.h + f_h;
    ws.list = (int32_t *)(ws.ys + f_y);
    ws.off = ws.list + i_list;
    ws.act = ws.off + i_off;
    ws.n_act = ws.act + i_act;
    const void *const *tab = t->dev;
    struct cuda_moe_set set = {
        .gate = cuda_wdesc_of(&m->gate[0]),
        .up = cuda_wdesc_of(&m->up[0]),
        .down = cuda_wdesc_of(&m->down[0]),
        .gate_data = tab,
        .up_data = tab + m->n_experts,
        .down_data = tab + 2 * (size_t)m->n_experts,
        .n_experts = m->n_experts,
    };
    /* CAIRN_CUDA_MOE=legacy1: one token takes its first kernels (for A/B; read once) */
    static int legacy1 = -1;
    if (legacy1 < 0) {
        const char *s = getenv("CAIRN_CUDA_MOE");
        legacy1 = s && strcmp(s, "legacy1") == 0;
    }
    (void)cuda_check_launch(c, cuda_k_moe_grouped(c->stream, &set, &ws, m->ids, m->w, m->out, m->n, m->top_k,
                                                  c->moe_old ? 0 : legacy1 ? 1 : 2, c->n_sms));
    return 1;
}
