/* Mixture-of-experts feed-forward: routing, grouping tokens by expert, SwiGLU experts. */
#include "model/moe.h"

#include <math.h>
#include <string.h>

#include "cpu/cpu.h"

size_t moe_scratch_floats(const struct moe_params *p, int max_tokens)
{
    size_t n = (size_t)max_tokens;
    int inter = p->inter > p->shared_inter ? p->inter : p->shared_inter;
    return n * (size_t)p->n_experts      /* router probabilities */
           + n * (size_t)p->top_k         /* chosen weights */
           + n * (size_t)p->hidden * 2    /* gathered x, expert output */
           + n * (size_t)inter * 2;       /* gate, up */
}

size_t moe_scratch_ints(const struct moe_params *p, int max_tokens)
{
    return (size_t)max_tokens * (size_t)p->top_k * 2 /* chosen ids; token list per expert */;
}

void moe_row_slice(const struct tensor *w, int64_t row0, int64_t rows, struct tensor *view)
{
    *view = *w;
    view->shape[0] = rows;
    int64_t cols = w->shape[1];
    if (w->dtype == DTYPE_Q) {
        int64_t words = cols * w->bits / 32, groups = cols / w->group_size;
        view->data = (const uint32_t *)w->data + row0 * words;
        view->scales = w->scales + row0 * groups;
        view->biases = w->biases + row0 * groups;
        view->packed = cpu_packed_rows(w, row0);
    } else {
        view->data = (const uint8_t *)w->data + (size_t)(row0 * cols) * dtype_size(w->dtype);
    }
}

/* y[n, hidden] = down(silu(gate(x)) * up(x)) */
static void moe_swiglu(const struct moe_expert *ex, int inter, const float *x, int n, float *g,
                       float *u, float *y)
{
    cpu_matmul(&ex->gate, x, g, n);
    cpu_matmul(&ex->up, x, u, n);
    cpu_silu_mul(g, g, u, (int64_t)n * inter);
    cpu_matmul(&ex->down, g, y, n);
}

void moe_forward(const struct moe_params *p, const float *x, int n, float *out, float *fscratch,
                 int *iscratch)
{
    int E = p->n_experts, K = p->top_k, H = p->hidden;
    int inter = p->inter > p->shared_inter ? p->inter : p->shared_inter;
    float *probs = fscratch;
    float *chosen_w = probs + (size_t)n * E;
    float *xg = chosen_w + (size_t)n * K;
    float *yg = xg + (size_t)n * H;
    float *g = yg + (size_t)n * H;
    float *u = g + (size_t)n * inter;
    int *chosen = iscratch;
    int *list = iscratch + (size_t)n * K;

    /* Router: softmax in f32, then top-k by probability (ties: lower expert id first). */
    cpu_matmul(&p->router, x, probs, n);
    for (int t = 0; t < n; t++) {
        float *pr = probs + (size_t)t * E;
        float m = pr[0];
        for (int e = 1; e < E; e++) m = pr[e] > m ? pr[e] : m;
        double sum = 0;
        for (int e = 0; e < E; e++) {
            pr[e] = expf(pr[e] - m);
            sum += pr[e];
        }
        for (int e = 0; e < E; e++) pr[e] = (float)(pr[e] / sum);
        double wsum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= chosen[t * K + j] == e;
                if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
            }
            chosen[t * K + k] = best;
            chosen_w[t * K + k] = pr[best];
            wsum += pr[best];
        }
        if (p->norm_topk_prob)
            for (int k = 0; k < K; k++) chosen_w[t * K + k] = (float)(chosen_w[t * K + k] / wsum);
    }

    memset(out, 0, sizeof(float) * (size_t)n * H);
    for (int e = 0; e < E; e++) {
        /* Gather the tokens routed to expert e, run it once, scatter-add weighted. */
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (chosen[t * K + k] == e) list[cnt++] = t * K + k;
        if (!cnt) continue;
        for (int i = 0; i < cnt; i++)
            memcpy(xg + (size_t)i * H, x + (size_t)(list[i] / K) * H, sizeof(float) * H);
        moe_swiglu(&p->experts[e], p->inter, xg, cnt, g, u, yg);
        for (int i = 0; i < cnt; i++) {
            float w = chosen_w[list[i]];
            float *o = out + (size_t)(list[i] / K) * H;
            const float *y = yg + (size_t)i * H;
            for (int j = 0; j < H; j++) o[j] += w * y[j];
        }
    }

    if (p->has_shared) {
        moe_swiglu(&p->shared, p->shared_inter, x, n, g, u, yg);
        cpu_matmul(&p->shared_gate, x, xg, n); /* [n, 1] */
        for (int t = 0; t < n; t++) {
            float s = 1.0f / (1.0f + expf(-xg[t]));
            for (int j = 0; j < H; j++) out[(size_t)t * H + j] += s * yg[(size_t)t * H + j];
        }
    }
}
