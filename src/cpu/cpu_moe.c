/* The CPU backend's mixture-of-experts ops (tensor/backend.h moe_route, moe_experts): router
 * softmax and top-k, then each expert run once over the tokens routed to it (rows gathered,
 * SwiGLU by cpu_matmul, results scattered back weighted). Moved from model/moe.c with the same
 * arithmetic in the same order, so results are bit-identical to it.
 *
 * Scratch (backend_moe.scratch, backend_moe_scratch_floats floats, tensor/backend.c):
 *   xg [n, hidden] gathered rows | yg [n, hidden] expert output | g, u [n, inter] | list [n*top_k]
 * A token picks an expert at most once, so at most n rows go to one expert. */
#include <math.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/cpu_int.h"

void cpu_moe_route(const float *logits, int n, int n_experts, int top_k, int norm_topk, int32_t *ids,
                   float *w)
{
    int E = n_experts, K = top_k;
    CAIRN_ASSERT(E > 0 && K > 0 && K <= E);
    float *pr = cpu_shared_scratch((size_t)E);
    for (int t = 0; t < n; t++) {
        /* Softmax in f32 (sum in double), then top-k by probability (ties: lower id first). */
        const float *lg = logits + (size_t)t * E;
        float m = lg[0];
        for (int e = 1; e < E; e++) m = lg[e] > m ? lg[e] : m;
        double sum = 0;
        for (int e = 0; e < E; e++) {
            pr[e] = expf(lg[e] - m);
            sum += pr[e];
        }
        for (int e = 0; e < E; e++) pr[e] = (float)(pr[e] / sum);
        double wsum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= ids[t * K + j] == e;
                if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
            }
            ids[t * K + k] = best;
            w[t * K + k] = pr[best];
            wsum += pr[best];
        }
        if (norm_topk)
            for (int k = 0; k < K; k++) w[t * K + k] = (float)(w[t * K + k] / wsum);
    }
}

void cpu_moe_experts(const struct backend_moe *m)
{
    const int n = m->n, K = m->top_k, H = m->hidden, inter = m->inter;
    float *xg = m->scratch;
    float *yg = xg + (size_t)n * H;
    float *g = yg + (size_t)n * H;
    float *u = g + (size_t)n * inter;
    int32_t *list = (int32_t *)(u + (size_t)n * inter);
    memset(m->out, 0, sizeof(float) * (size_t)n * H);
    for (int e = 0; e < m->n_experts; e++) {
        /* Gather the tokens routed to expert e, run it once, scatter-add weighted. */
        int cnt = 0;
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (m->ids[t * K + k] == e) list[cnt++] = t * K + k;
        if (!cnt) continue;
        for (int i = 0; i < cnt; i++)
            memcpy(xg + (size_t)i * H, m->x + (size_t)(list[i] / K) * H, sizeof(float) * H);
        /* y[cnt, hidden] = down(silu(gate(x)) * up(x)) */
        cpu_matmul(&m->gate[e], xg, g, cnt);
        cpu_matmul(&m->up[e], xg, u, cnt);
        cpu_silu_mul(g, g, u, (int64_t)cnt * inter);
        cpu_matmul(&m->down[e], g, yg, cnt);
        for (int i = 0; i < cnt; i++) {
            float wt = m->w[list[i]];
            float *o = m->out + (size_t)(list[i] / K) * H;
            const float *y = yg + (size_t)i * H;
            for (int j = 0; j < H; j++) o[j] += wt * y[j];
        }
    }
}
