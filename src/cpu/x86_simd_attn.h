/* Attention kernels of the SIMD table, included by x86_simd_ops.h (so compiled once per ISA with
 * its V_* macros, VW and K(name)). Three kernels of one contract (cpu.h, struct cpu_attn):
 *
 * attn (rowwise): one query token × the query heads of one KV head, passing over the whole
 * context a KV block at a time. Decode and small batches use it (cpu_attn.c decides).
 *
 * attn_split (flash-decoding): one query token × all its heads over one split of the context
 * (CPU_ATTN_SPLIT_POS positions), leaving the unnormalized softmax state for cpu_attn.c to combine.
 * It is the rowwise kernel's tile loop (att_range) over every KV head at once, so that K and V
 * are read whole rows in address order, with the next tile's rows prefetched, and the softmax
 * rescale is paid once per CPU_ATTN_SPLIT_TP positions instead of once per block; bf16 rows of
 * 4 or 8 vectors a head are widened by even/odd halves (att_eo_permute: a shift and a mask,
 * no cross-lane widening; 12-17% faster with the K/V in L2). It lets both threads share one
 * token's context. Long-context decode runs it. Both decode kernels stay
 * far from the read bandwidth (README, issue 22: ~27 GB/s per thread on Qwen3's shape with the
 * K/V in L2, ~12 on Llama's head_dim 64, so compute as much as memory is the limit).
 *
 * attn_tile (tiled, flash-attention style): query tokens [t0, t1) × the `group` query heads of
 * KV head kvh as one set of R = (t1 - t0) · group query rows (padded to a multiple of VW),
 * against the context in tiles of CPU_ATTN_TK positions. Per tile, K and V rows are gathered
 * through the block table and widened to f32 once (bf16: shift; f32: copied), then reused by
 * all R rows: S^T[p][r] = K[p] · Q[r] with the rows in vector lanes (Q transposed and scaled
 * once per item, so a K element is a broadcast and no tile is ever transposed), the online
 * softmax vectorized over rows (running max m, sum l, the rescale of O only when the max
 * grew), the causal mask (p > pos[row]) only on tiles past the smallest position of the item,
 * and O[r][:] += Σ_p P^T[p][r] · V[p][:]. Work per item: 4 · R · n_ctx · head_dim flops for
 * (R + 2·head_dim) · n_ctx floats widened, so the K/V bytes read per query fall with R.
 * Register tiles: S ATT_ST_PT positions × ATT_ST_RV row vectors, O ATT_O_RT rows × ATT_O_NV
 * vectors of the head dimension (the ISA file sets them).
 * scratch (cpu_attn_tile_scratch_floats): Q^T [hd][R], O [R][hdp], S^T [TK][R], K [TK][hd],
 * V [TK][hdp], m, l, corr [R], pos [R] (hdp: head_dim rounded up to VW, zero-padded).
 *
 * Numerics: f32 throughout, the same operations as the rowwise kernel in another order
 * (test_cpu_ops, backend_cases: relative error ~1e-6 against the scalar reference). */
#include <limits.h>

/* ---- rowwise and split (decode) ---- */

/* Scores of one K row for the `group` query heads at q0: the row is widened once into HDV
 * registers (HDV = head_dim / VW, a constant so they stay registers). */
CPU_AI void K(att_scores)(const float *q0, const char *krow, int group, int is_f32, float *sc, int bs,
                          float scale, const int HDV)
{
    VF kr[8];
#pragma GCC unroll 8
    for (int u = 0; u < HDV; u++) kr[u] = K(kvload)(krow, u * VW, is_f32);
    for (int g = 0; g < group; g++) {
        const float *q = q0 + (int64_t)g * HDV * VW;
        VF s0 = V_ZERO();
#pragma GCC unroll 8
        for (int u = 0; u < HDV; u++) s0 = V_FMA(V_LOAD(q + u * VW), kr[u], s0);
        sc[g * bs] = V_HSUM(s0) * scale;
    }
}

/* sc[g · bs] = scale · q_g · krow for the group's heads, any head_dim (4 and 8 vectors in
 * registers, the others through memory). */
CPU_AI void K(att_scores_row)(const float *q0, const char *krow, int group, int hd, int is_f32, float *sc,
                              int bs, float scale)
{
    if (hd == 4 * VW) {
        K(att_scores)(q0, krow, group, is_f32, sc, bs, scale, 4);
        return;
    }
    if (hd == 8 * VW) {
        K(att_scores)(q0, krow, group, is_f32, sc, bs, scale, 8);
        return;
    }
    for (int g = 0; g < group; g++) {
        const float *q = q0 + (int64_t)g * hd;
        VF s0 = V_ZERO();
        int i = 0;
        for (; i + VW <= hd; i += VW) s0 = V_FMA(V_LOAD(q + i), K(kvload)(krow, i, is_f32), s0);
        float s = V_HSUM(s0);
        for (; i < hd; i++) s += q[i] * K(kvload1)(krow, i, is_f32);
        sc[g * bs] = s * scale;
    }
}

/* One head's online-softmax step over np scores sg of a tile: sg becomes e^(s - m_new), l and
 * m are updated and acc [hd] rescaled when the max grew. */
CPU_AI void K(att_softmax)(float *sg, int np, float *m, float *l, float *acc, int hd)
{
    float mx = *m;
    for (int pp = 0; pp < np; pp++) mx = sg[pp] > mx ? sg[pp] : mx;
    float corr = *m == -INFINITY ? 0.0f : expf(*m - mx);
    VF vmx = V_SET1(mx), vsum = V_ZERO();
    int pp = 0;
    for (; pp + VW <= np; pp += VW) {
        VF e = K(vexp)(V_SUB(V_LOAD(sg + pp), vmx));
        V_STORE(sg + pp, e);
        vsum = V_ADD(vsum, e);
    }
    float sum = V_HSUM(vsum);
    for (; pp < np; pp++) {
        sg[pp] = expf(sg[pp] - mx);
        sum += sg[pp];
    }
    *l = *l * corr + sum;
    *m = mx;
    if (corr != 1.0f) {
        VF vc = V_SET1(corr);
        int i = 0;
        for (; i + VW <= hd; i += VW) V_STORE(acc + i, V_MUL(V_LOAD(acc + i), vc));
        for (; i < hd; i++) acc[i] *= corr;
    }
}

/* acc0/acc1 (NV vectors of two heads; acc1 unused unless two) += Σ_p s0/s1[p] · V[p] over np
 * positions of a block: the accumulators stay in registers and share each widened V load. */
CPU_AI void K(att_pv)(float *acc0, float *acc1, int two, const float *s0, const float *s1, const char *v,
                      int64_t v_stride, int np, int is_f32, const int NV)
{
    VF r0[8], r1[8];
#pragma GCC unroll 8
    for (int u = 0; u < NV; u++) {
        r0[u] = V_LOAD(acc0 + u * VW);
        r1[u] = two ? V_LOAD(acc1 + u * VW) : V_ZERO();
    }
    for (int pp = 0; pp < np; pp++) {
        const char *vrow = v + (size_t)pp * (size_t)v_stride;
        VF w0 = V_SET1(s0[pp]), w1 = V_SET1(s1[pp]);
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) {
            VF vv = K(kvload)(vrow, u * VW, is_f32);
            r0[u] = V_FMA(w0, vv, r0[u]);
            r1[u] = V_FMA(w1, vv, r1[u]);
        }
    }
#pragma GCC unroll 8
    for (int u = 0; u < NV; u++) {
        V_STORE(acc0 + u * VW, r0[u]);
        if (two) V_STORE(acc1 + u * VW, r1[u]);
    }
}

#define ATT_PV_VECS 8

/* acc [group][hd] += P · V over np positions of one KV head's V slice vb (rows v_stride bytes
 * apart), P = sc [group][ss]: for each pair of heads and each slice of up to ATT_PV_VECS vectors
 * of the head dimension (the whole of it at 4 or 8 vectors), the two accumulators stay in
 * registers over the positions and share each widened V load; the head dimension's tail past
 * the last vector is scalar. Each acc element gets the same FMAs in the same order whatever
 * the slicing. */
CPU_AI void K(att_pv_group_t)(float *acc, const float *sc, const char *vb, int64_t v_stride, int np, int group,
                              int hd, int ss, const int is_f32)
{
    const size_t esz = is_f32 ? 4 : 2;
    const int hv = hd / VW * VW;
    for (int g = 0; g < group; g += 2) {
        const int two = g + 1 < group;
        float *a0 = acc + (size_t)g * hd, *a1 = two ? a0 + hd : a0;
        const float *s0 = sc + (size_t)g * ss, *s1 = two ? s0 + ss : s0;
        int i0 = 0;
        if (hv == 4 * VW) {
            K(att_pv)(a0, a1, two, s0, s1, vb, v_stride, np, is_f32, 4);
            i0 = hv;
        }
        for (; i0 + ATT_PV_VECS * VW <= hv; i0 += ATT_PV_VECS * VW)
            K(att_pv)(a0 + i0, a1 + i0, two, s0, s1, vb + (size_t)i0 * esz, v_stride, np, is_f32, ATT_PV_VECS);
        for (; i0 < hv; i0 += VW)
            K(att_pv)(a0 + i0, a1 + i0, two, s0, s1, vb + (size_t)i0 * esz, v_stride, np, is_f32, 1);
    }
    for (int pp = 0; pp < np; pp++) {
        const char *vrow = vb + (size_t)pp * (size_t)v_stride;
        for (int i = hv; i < hd; i++) {
            float vv = K(kvload1)(vrow, i, is_f32);
            for (int g = 0; g < group; g++) acc[(size_t)g * hd + i] += sc[g * ss + pp] * vv;
        }
    }
}

/* att_pv_group_t with the KV dtype a constant of each copy (no test per load). */
static void K(att_pv_group)(float *acc, const float *sc, const char *vb, int64_t v_stride, int np, int group, int hd,
                            int ss, int is_f32)
{
    if (is_f32) K(att_pv_group_t)(acc, sc, vb, v_stride, np, group, hd, ss, 1);
    else K(att_pv_group_t)(acc, sc, vb, v_stride, np, group, hd, ss, 0);
}

/* ---- the split kernel's bf16 path: rows widened by even/odd halves ----
 * A bf16 chunk of 2·VW elements becomes two f32 vectors, the even elements (shift) and the odd
 * ones (mask), with no cross-lane widening (vpmovzxwd). Q and the accumulators are kept in the
 * same order (per chunk u: VW even elements, then VW odd ones; att_eo_permute), so a score is
 * the same dot product summed in another order and each accumulator element gets the same FMAs
 * in the same order. Head dimensions of 4 or 8 vectors (HD2 = 2 or 4 chunks). */

/* dst = src [hd] in even/odd order (back = 0), or back (back = 1). */
CPU_AI void K(att_eo_permute)(float *dst, const float *src, int hd, int back)
{
    for (int c = 0; c < hd; c += 2 * VW)
        for (int i = 0; i < VW; i++) {
            if (back) {
                dst[c + 2 * i] = src[c + i];
                dst[c + 2 * i + 1] = src[c + VW + i];
            } else {
                dst[c + i] = src[c + 2 * i];
                dst[c + VW + i] = src[c + 2 * i + 1];
            }
        }
}

/* sc[g · ss] = scale · q_g · krow for the group's heads, q in even/odd order; HD2 chunks of 2·VW. */
CPU_AI void K(att_scores_eo)(const float *qp0, const char *krow, int group, float *sc, int ss, float scale,
                             const int HD2)
{
    VF ke[4], ko[4];
#pragma GCC unroll 4
    for (int u = 0; u < HD2; u++) V_LOAD_BF16_EO((const uint16_t *)krow + u * 2 * VW, ke[u], ko[u]);
    for (int g = 0; g < group; g++) {
        const float *q = qp0 + (int64_t)g * HD2 * 2 * VW;
        VF s0 = V_ZERO(), s1 = V_ZERO();
#pragma GCC unroll 4
        for (int u = 0; u < HD2; u++) {
            s0 = V_FMA(V_LOAD(q + 2 * u * VW), ke[u], s0);
            s1 = V_FMA(V_LOAD(q + (2 * u + 1) * VW), ko[u], s1);
        }
        sc[g * ss] = V_HSUM(V_ADD(s0, s1)) * scale;
    }
}

/* acc [group][hd] (even/odd order) += P · V over np positions of one KV head's bf16 V slice,
 * pairs of heads sharing each widened row, the whole head dimension (HD2 chunks) in registers. */
CPU_AI void K(att_pv_eo)(float *acc, const float *sc, const char *vb, int64_t v_stride, int np, int group, int ss,
                         const int HD2)
{
    for (int g = 0; g < group; g += 2) {
        const int two = g + 1 < group;
        float *a0 = acc + (size_t)g * HD2 * 2 * VW, *a1 = two ? a0 + HD2 * 2 * VW : a0;
        const float *s0 = sc + (size_t)g * ss, *s1 = two ? s0 + ss : s0;
        VF r0[8], r1[8];
#pragma GCC unroll 8
        for (int u = 0; u < 2 * HD2; u++) {
            r0[u] = V_LOAD(a0 + u * VW);
            r1[u] = two ? V_LOAD(a1 + u * VW) : V_ZERO();
        }
        for (int pp = 0; pp < np; pp++) {
            const uint16_t *vrow = (const uint16_t *)(vb + (size_t)pp * (size_t)v_stride);
            VF w0 = V_SET1(s0[pp]), w1 = V_SET1(s1[pp]);
#pragma GCC unroll 4
            for (int u = 0; u < HD2; u++) {
                VF ve, vo;
                V_LOAD_BF16_EO(vrow + u * 2 * VW, ve, vo);
                r0[2 * u] = V_FMA(w0, ve, r0[2 * u]);
                r0[2 * u + 1] = V_FMA(w0, vo, r0[2 * u + 1]);
                r1[2 * u] = V_FMA(w1, ve, r1[2 * u]);
                r1[2 * u + 1] = V_FMA(w1, vo, r1[2 * u + 1]);
            }
        }
#pragma GCC unroll 8
        for (int u = 0; u < 2 * HD2; u++) {
            V_STORE(a0 + u * VW, r0[u]);
            if (two) V_STORE(a1 + u * VW, r1[u]);
        }
    }
}

/* The K (v = 0) or V row of position p, from KV head kvh0's slice on; the rows after it in
 * its block follow row_bytes apart. */
CPU_AI const char *K(att_rows)(const struct cpu_attn *a, int v, int p, size_t row_bytes, size_t kvh0_bytes)
{
    const struct backend_kv_view *kv = a->kv;
    const int blk = a->block_table[p / kv->block_size];
    const void *base = v ? cpu_kv_v(kv, blk, a->layer) : cpu_kv_k(kv, blk, a->layer);
    return (const char *)base + (size_t)(p % kv->block_size) * row_bytes + kvh0_bytes;
}

/* The end of the block piece that starts at p, within [p, p1). */
CPU_AI int K(att_seg_end)(int p, int p1, int bs)
{
    const int e = (p / bs + 1) * bs;
    return e < p1 ? e : p1;
}

/* Lines [0, bytes) of the K or V rows of positions [p, p1), into L2: the split kernel's
 * read-ahead (a sequence's blocks lie anywhere in the pool, so the hardware prefetcher loses the
 * stream at every block, and it does not cross 4 KiB pages). */
CPU_AI void K(att_prefetch)(const struct cpu_attn *a, int v, int p, int p1, size_t row_bytes, size_t kvh0_bytes,
                            size_t bytes)
{
    while (p < p1) {
        const int e = K(att_seg_end)(p, p1, a->kv->block_size);
        const char *r = K(att_rows)(a, v, p, row_bytes, kvh0_bytes);
        for (int i = 0; i < e - p; i++)
            for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(r + (size_t)i * row_bytes + off, _MM_HINT_T1);
        p = e;
    }
}

/* Query token t, the nh = (kvh1 - kvh0) · group query heads of KV heads [kvh0, kvh1), over
 * context positions [c0, c1): updates acc [nh][hd], m [nh], l [nh] (running max and sum; acc
 * not yet divided by l). Walks the context a tile of tp positions at a time ([c0 + i·tp, ...);
 * rowwise: tp = block_size, c0 = 0, so a tile is a block), each tile in pieces of one block:
 * 1. scores sc [nh][tp] of the tile, position by position, the K row's slice of each KV head
 *    widened once for its group (so a split over all KV heads reads K in address order);
 * 2. per head, the online-softmax rescale once per tile (not per position);
 * 3. acc += P · V, KV head by KV head (one V read per group).
 * prefetch: the tile's V rows are fetched before 1 and the next tile's K rows during 3.
 * A head's arithmetic does not depend on kvh0, kvh1 or prefetch. */
static void K(att_range)(const struct cpu_attn *a, int t, int kvh0, int kvh1, int c0, int c1, int tp, float *acc,
                         float *m, float *l, float *sc, const float *qp, int prefetch)
{
    const struct backend_kv_view *kv = a->kv;
    const int hd = kv->head_dim, group = a->n_heads / kv->n_kv_heads, bs = kv->block_size;
    const int is_f32 = kv->dtype == DTYPE_F32, nkv = kvh1 - kvh0, nh = nkv * group;
    const size_t esz = is_f32 ? 4 : 2, row_bytes = (size_t)kv->n_kv_heads * (size_t)hd * esz;
    const size_t head_bytes = (size_t)hd * esz, slice_bytes = (size_t)nkv * head_bytes;
    const size_t kvh0_bytes = (size_t)kvh0 * head_bytes;
    const float *q0 = a->q + ((int64_t)t * a->n_heads + (int64_t)kvh0 * group) * hd;
    for (int p0 = c0; p0 < c1; p0 += tp) {
        const int p1 = c1 - p0 < tp ? c1 : p0 + tp, np = p1 - p0;
        if (prefetch) K(att_prefetch)(a, 1, p0, p1, row_bytes, kvh0_bytes, slice_bytes);
        for (int p = p0, e; p < p1; p = e) {
            e = K(att_seg_end)(p, p1, bs);
            const char *kb = K(att_rows)(a, 0, p, row_bytes, kvh0_bytes);
            float *sp = sc + (p - p0);
            for (int pp = 0; pp < e - p; pp++) {
                const char *krow = kb + (size_t)pp * row_bytes;
                for (int h = 0; h < nh; h += group) {
                    const char *kh = krow + (size_t)(h / group) * head_bytes;
                    float *sh = sp + (size_t)h * tp + pp;
                    if (qp && hd == 4 * VW) K(att_scores_eo)(qp + (int64_t)h * hd, kh, group, sh, tp, a->scale, 2);
                    else if (qp) K(att_scores_eo)(qp + (int64_t)h * hd, kh, group, sh, tp, a->scale, 4);
                    else K(att_scores_row)(q0 + (int64_t)h * hd, kh, group, hd, is_f32, sh, tp, a->scale);
                }
            }
        }
        for (int h = 0; h < nh; h++) K(att_softmax)(sc + (size_t)h * tp, np, &m[h], &l[h], acc + (size_t)h * hd, hd);
        /* the next tile's K rows, spread over the KV heads' V passes */
        const int n1 = c1 - p1 < tp ? c1 - p1 : tp;
        for (int j = 0; j < nkv; j++) {
            if (prefetch && n1 > 0)
                K(att_prefetch)(a, 0, p1 + j * n1 / nkv, p1 + (j + 1) * n1 / nkv, row_bytes, kvh0_bytes, slice_bytes);
            for (int p = p0, e; p < p1; p = e) {
                e = K(att_seg_end)(p, p1, bs);
                float *aj = acc + (size_t)j * group * hd;
                const float *sj = sc + (size_t)j * group * tp + (p - p0);
                const char *vj = K(att_rows)(a, 1, p, row_bytes, kvh0_bytes) + (size_t)j * head_bytes;
                if (qp && hd == 4 * VW) K(att_pv_eo)(aj, sj, vj, (int64_t)row_bytes, e - p, group, tp, 2);
                else if (qp) K(att_pv_eo)(aj, sj, vj, (int64_t)row_bytes, e - p, group, tp, 4);
                else K(att_pv_group)(aj, sj, vj, (int64_t)row_bytes, e - p, group, hd, tp, is_f32);
            }
        }
    }
}

/* Rowwise: query token t, the `group` query heads of KV head kvh, over its whole context.
 * scratch (cpu_attn_scratch_floats): acc [group][hd], sc [group][block_size], m [group], l [group]. */
static void K(attn)(const struct cpu_attn *a, int t, int kvh, float *scratch)
{
    const struct backend_kv_view *kv = a->kv;
    const int hd = kv->head_dim, group = a->n_heads / kv->n_kv_heads, bs = kv->block_size;
    float *acc = scratch, *sc = acc + (size_t)group * hd, *m = sc + (size_t)group * bs, *l = m + group;
    for (int i = 0; i < group * hd; i++) acc[i] = 0;
    for (int g = 0; g < group; g++) {
        m[g] = -INFINITY;
        l[g] = 0;
    }
    K(att_range)(a, t, kvh, kvh + 1, 0, a->pos[t] + 1, bs, acc, m, l, sc, NULL, 0);
    for (int g = 0; g < group; g++) {
        float *o = a->out + ((int64_t)t * a->n_heads + (int64_t)kvh * group + g) * hd;
        float inv = 1.0f / l[g];
        for (int i = 0; i < hd; i++) o[i] = acc[(size_t)g * hd + i] * inv;
    }
}

/* Split: query token t, all its heads, over context positions [c0, c1) (c0 <= pos[t]): the
 * unnormalized state acc [n_heads][hd], m and l [n_heads], which cpu_attn.c combines over the
 * splits. scratch (cpu_attn_split_scratch_floats): sc [n_heads][CPU_ATTN_SPLIT_TP]. */
static void K(attn_split)(const struct cpu_attn *a, int t, int c0, int c1, float *acc, float *m, float *l,
                          float *scratch)
{
    const int nh = a->n_heads, hd = a->kv->head_dim;
    memset(acc, 0, sizeof(float) * (size_t)nh * (size_t)hd);
    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0;
    }
    /* bf16 at 4 or 8 vectors a head: Q and acc in even/odd order (att_eo_permute) */
    float *qp = NULL;
    if (a->kv->dtype == DTYPE_BF16 && (hd == 4 * VW || hd == 8 * VW)) {
        qp = scratch + (size_t)nh * CPU_ATTN_SPLIT_TP;
        for (int h = 0; h < nh; h++)
            K(att_eo_permute)(qp + (size_t)h * hd, a->q + ((int64_t)t * nh + h) * hd, hd, 0);
    }
    K(att_range)(a, t, 0, a->kv->n_kv_heads, c0, c1, CPU_ATTN_SPLIT_TP, acc, m, l, scratch, qp, 1);
    if (qp) {
        float *tmp = qp; /* Q is no longer needed */
        for (int h = 0; h < nh; h++) {
            K(att_eo_permute)(tmp, acc + (size_t)h * hd, hd, 1);
            memcpy(acc + (size_t)h * hd, tmp, sizeof(float) * (size_t)hd);
        }
    }
}


/* ---- tiled (prefill) ---- */

/* S^T rows [p, p + PT) × row lanes [r0, r0 + NRV·VW): st[p][r] = Σ_d kw[p][d] · qt[d][r]. */
CPU_AI void K(att_st_tile)(const float *kw, const float *qt, float *st, int hd, int R, int p, int r0,
                           const int PT, const int NRV)
{
    VF acc[ATT_ST_PT > 4 ? ATT_ST_PT : 4][ATT_ST_RV]; /* PT: ATT_ST_PT, or 4 and 1 for the rest */
#pragma GCC unroll 16
    for (int i = 0; i < PT; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NRV; v++) acc[i][v] = V_ZERO();
    const float *kp = kw + (int64_t)p * hd, *q = qt + r0;
    for (int d = 0; d < hd; d++, q += R) {
        VF qv[ATT_ST_RV];
#pragma GCC unroll 4
        for (int v = 0; v < NRV; v++) qv[v] = V_LOAD(q + v * VW);
#pragma GCC unroll 16
        for (int i = 0; i < PT; i++) {
            VF kb = V_SET1(kp[(int64_t)i * hd + d]);
#pragma GCC unroll 4
            for (int v = 0; v < NRV; v++) acc[i][v] = V_FMA(kb, qv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < PT; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NRV; v++) V_STORE(st + (int64_t)(p + i) * R + r0 + v * VW, acc[i][v]);
}

/* S^T of all np positions for row lanes [r0, r0 + NRV·VW). */
CPU_AI void K(att_st_rows)(const float *kw, const float *qt, float *st, int hd, int R, int np, int r0,
                           const int NRV)
{
    int p = 0;
    for (; p + ATT_ST_PT <= np; p += ATT_ST_PT) K(att_st_tile)(kw, qt, st, hd, R, p, r0, ATT_ST_PT, NRV);
    if (ATT_ST_PT > 4)
        for (; p + 4 <= np; p += 4) K(att_st_tile)(kw, qt, st, hd, R, p, r0, 4, NRV);
    for (; p < np; p++) K(att_st_tile)(kw, qt, st, hd, R, p, r0, 1, NRV);
}

/* O rows [r, r + RT) × columns [d0, d0 + NV·VW) += Σ_p st[p][r] · vw[p][d] over np positions. */
CPU_AI void K(att_o_tile)(float *o, const float *vw, const float *st, int hdp, int R, int r, int d0, int np,
                          const int RT, const int NV)
{
    VF acc[ATT_O_RT][ATT_O_NV];
#pragma GCC unroll 8
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) acc[i][u] = V_LOAD(o + (int64_t)(r + i) * hdp + d0 + u * VW);
    for (int p = 0; p < np; p++) {
        const float *vp = vw + (int64_t)p * hdp + d0, *sp = st + (int64_t)p * R + r;
        VF vv[ATT_O_NV];
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) vv[u] = V_LOAD(vp + u * VW);
#pragma GCC unroll 8
        for (int i = 0; i < RT; i++) {
            VF pb = V_SET1(sp[i]);
#pragma GCC unroll 8
            for (int u = 0; u < NV; u++) acc[i][u] = V_FMA(pb, vv[u], acc[i][u]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RT; i++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) V_STORE(o + (int64_t)(r + i) * hdp + d0 + u * VW, acc[i][u]);
}

/* n floats of a KV row (bf16 or f32) widened into dst, then zeros up to n_pad. */
CPU_AI void K(att_widen)(float *dst, const char *src, int n, int n_pad, int is_f32)
{
    int i = 0;
    for (; i + VW <= n; i += VW) V_STORE(dst + i, K(kvload)(src, i, is_f32));
    for (; i < n; i++) dst[i] = K(kvload1)(src, i, is_f32);
    for (; i < n_pad; i++) dst[i] = 0;
}

/* Masked entries of a tile (position p0 + p past the row's position) set to `val`. */
static void K(att_mask)(float *st, const int32_t *rpos, int R, int p0, int np, float val)
{
    for (int p = 0; p < np; p++)
        for (int r = 0; r < R; r++)
            if (p0 + p > rpos[r]) st[(int64_t)p * R + r] = val;
}

static void K(attn_tile)(const struct cpu_attn *a, int kvh, int t0, int t1, float *scratch)
{
    const struct backend_kv_view *kv = a->kv;
    const int hd = kv->head_dim, group = a->n_heads / kv->n_kv_heads, bs = kv->block_size;
    const int is_f32 = kv->dtype == DTYPE_F32;
    const size_t esz = is_f32 ? 4 : 2, row_bytes = (size_t)kv->n_kv_heads * (size_t)hd * esz;
    const int rows = (t1 - t0) * group, R = (rows + VW - 1) / VW * VW, hdp = (hd + VW - 1) / VW * VW;
    const int TK = CPU_ATTN_TK;
    float *qt = scratch, *o = qt + (size_t)hd * R, *st = o + (size_t)R * hdp, *kw = st + (size_t)TK * R;
    float *vw = kw + (size_t)TK * hd, *m = vw + (size_t)TK * hdp, *l = m + R, *corr = l + R;
    int32_t *rpos = (int32_t *)(corr + R);
    /* Rows r = (t - t0) · group + g; padding rows repeat the last position with Q = 0. */
    int min_pos = INT_MAX, n_ctx = 0;
    for (int r = 0; r < R; r++) {
        int rr = r < rows ? r : rows - 1, t = t0 + rr / group;
        rpos[r] = a->pos[t];
        min_pos = rpos[r] < min_pos ? rpos[r] : min_pos;
        n_ctx = rpos[r] + 1 > n_ctx ? rpos[r] + 1 : n_ctx;
        const float *q = a->q + ((int64_t)t * a->n_heads + (int64_t)kvh * group + rr % group) * hd;
        for (int d = 0; d < hd; d++) qt[(size_t)d * R + r] = r < rows ? q[d] * a->scale : 0.0f;
        m[r] = -INFINITY;
        l[r] = 0;
    }
    memset(o, 0, sizeof(float) * (size_t)R * hdp);
    for (int p0 = 0; p0 < n_ctx; p0 += TK) {
        const int np = n_ctx - p0 < TK ? n_ctx - p0 : TK;
        for (int p = 0; p < np; p++) {
            const int pos = p0 + p, blk = a->block_table[pos / bs];
            const size_t off = (size_t)(pos % bs) * row_bytes + (size_t)kvh * hd * esz;
            K(att_widen)(kw + (size_t)p * hd, (const char *)cpu_kv_k(kv, blk, a->layer) + off, hd, hd, is_f32);
            K(att_widen)(vw + (size_t)p * hdp, (const char *)cpu_kv_v(kv, blk, a->layer) + off, hd, hdp, is_f32);
        }
        /* S^T = K · Q^T */
        int r0 = 0;
        for (; r0 + ATT_ST_RV * VW <= R; r0 += ATT_ST_RV * VW) K(att_st_rows)(kw, qt, st, hd, R, np, r0, ATT_ST_RV);
        for (; r0 < R; r0 += VW) K(att_st_rows)(kw, qt, st, hd, R, np, r0, 1);
        const int diag = p0 + np - 1 > min_pos; /* some row masks part of this tile */
        if (diag) K(att_mask)(st, rpos, R, p0, np, -INFINITY);
        /* Online softmax, rows in lanes: P = e^(S - m_new), l = l · e^(m - m_new) + Σ P. */
        for (int r = 0; r < R; r += VW) {
            VF mo = V_LOAD(m + r), mx = mo, sum = V_ZERO();
            for (int p = 0; p < np; p++) mx = V_MAX(mx, V_LOAD(st + (int64_t)p * R + r));
            VF c = K(vexp)(V_SUB(mo, mx));
            for (int p = 0; p < np; p++) {
                VF e = K(vexp)(V_SUB(V_LOAD(st + (int64_t)p * R + r), mx));
                V_STORE(st + (int64_t)p * R + r, e);
                sum = V_ADD(sum, e);
            }
            V_STORE(l + r, V_FMA(V_LOAD(l + r), c, sum));
            V_STORE(m + r, mx);
            V_STORE(corr + r, c);
        }
        /* vexp clamps at e^-87, not 0: masked entries are zeroed so they add nothing to O (their
         * share of l is below 1e-36 of it) */
        if (diag) K(att_mask)(st, rpos, R, p0, np, 0.0f);
        for (int r = 0; r < rows; r++) {
            if (corr[r] == 1.0f) continue;
            VF vc = V_SET1(corr[r]);
            float *orow = o + (size_t)r * hdp;
            for (int d = 0; d < hdp; d += VW) V_STORE(orow + d, V_MUL(V_LOAD(orow + d), vc));
        }
        /* O += P · V */
        int r = 0;
        for (; r + ATT_O_RT <= rows; r += ATT_O_RT) {
            int d0 = 0;
            for (; d0 + ATT_O_NV * VW <= hdp; d0 += ATT_O_NV * VW)
                K(att_o_tile)(o, vw, st, hdp, R, r, d0, np, ATT_O_RT, ATT_O_NV);
            for (; d0 < hdp; d0 += VW) K(att_o_tile)(o, vw, st, hdp, R, r, d0, np, ATT_O_RT, 1);
        }
        for (; r < rows; r++) {
            int d0 = 0;
            for (; d0 + ATT_O_NV * VW <= hdp; d0 += ATT_O_NV * VW)
                K(att_o_tile)(o, vw, st, hdp, R, r, d0, np, 1, ATT_O_NV);
            for (; d0 < hdp; d0 += VW) K(att_o_tile)(o, vw, st, hdp, R, r, d0, np, 1, 1);
        }
    }
    for (int r = 0; r < rows; r++) {
        float *out = a->out + ((int64_t)(t0 + r / group) * a->n_heads + (int64_t)kvh * group + r % group) * hd;
        const float inv = 1.0f / l[r];
        for (int d = 0; d < hd; d++) out[d] = o[(size_t)r * hdp + d] * inv;
    }
}

