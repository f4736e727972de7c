/* Forward-pass variants that the hybrid families (qwen3_next, qwen3_5) switch on, checked by
 * equivalence on a loaded qwen3-tiny (no oracle exists for them alone):
 * - zero-centred RMSNorm (weight + 1): norm_offset 1 with every norm weight minus 1 must give
 *   the same logits;
 * - gated attention: q_proj emitting [q | gate] per head with gate rows = 0 (sigmoid = 0.5) must
 *   equal the plain model with o_proj scaled by 0.5;
 * - flat f32 weight specs (conv1d kernels of the DeltaNet layers). */
#include "testlib.h"
#include "test_backend.h"

#include "kv/kv_pool.h"
#include "model/model_int.h"

static const char *qwen3_dir(char *buf, size_t n)
{
    return test_src_path("tests/data/oracle/models/qwen3-tiny", buf, n);
}

static void forward_logits(struct model *m, float *out)
{
    const struct model_info *in = model_get_info(m);
    struct kv_pool kv;
    struct cairn_err err = {0};
    CHECK_EQ_INT(
        kv_pool_init(&kv, test_cpu_be(), in->n_kv_layers, 4, 8, in->n_kv_heads, in->head_dim, DTYPE_F32, &err),
        CAIRN_OK);
    int32_t table[4] = {2, 0, 3, 1}, toks[12] = {3, 17, 99, 512, 1000, 7, 8, 9, 44, 300, 2, 1};
    CHECK_EQ_INT(model_reserve(m, 12, &err), CAIRN_OK);
    /* 10-token prefill then 2 decodes: 3 logit rows in all. */
    struct model_seq s = {
        .tokens = toks, .n_tokens = 10, .block_table = table, .n_logits = 1, .logits = out};
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &s, 1, &err), CAIRN_OK);
    for (int i = 10; i < 12; i++) {
        struct model_seq d = {.tokens = toks + i,
                              .n_tokens = 1,
                              .pos0 = i,
                              .block_table = table,
                              .n_logits = 1,
                              .logits = out + (size_t)(i - 9) * (size_t)in->vocab_size};
        CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &d, 1, &err), CAIRN_OK);
    }
    kv_pool_free(&kv);
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* A dequantized f32 copy of a linear, scaled, owned by m. */
static float *linear_f32(struct model *m, const struct model_linear *l, float scale)
{
    int64_t r = l->w.shape[0], c = l->w.shape[1];
    float *p = model_alloc_owned(m, sizeof(float) * (size_t)(r * c));
    for (int64_t i = 0; i < r; i++) {
        tensor_row_to_f32(&l->w, i, p + i * c);
        for (int64_t j = 0; j < c; j++)
            p[i * c + j] *= scale;
    }
    return p;
}

/* Flat f32 specs (conv kernels of any shape): bound by element count, values converted. */
static void test_flat_spec(struct model *m)
{
    struct model_specs sp = {0};
    float *dst = NULL, *bad = NULL;
    struct model_wspec *w1 =
        model_specs_vector(&sp, &dst, 128 * 384, 1.0f, "model.layers.%d.mlp.down_proj.weight", 1);
    CHECK(w1 != NULL);
    if (w1) w1->flat = 1;
    struct model_wspec *w2 =
        model_specs_vector(&sp, &bad, 128 * 384 + 1, 1.0f, "model.layers.1.mlp.down_proj.weight");
    CHECK(w2 != NULL);
    if (w2) w2->flat = 1;
    struct cairn_err err = {0};
    CHECK_EQ_INT(model_bind_spec(m, &sp.v[0], &err), CAIRN_OK);
    float row[384];
    tensor_row_to_f32(&m->layers[1].mlp.down.w, 5, row);
    CHECK(dst && memcmp(dst + 5 * 384, row, sizeof(row)) == 0);
    CHECK_EQ_INT(model_bind_spec(m, &sp.v[1], &err), CAIRN_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "expected [49153] F32/F16/BF16, got [128, 384] BF16") != NULL, "%s",
              err.msg);
    model_specs_free(&sp);
}

int main(void)
{
    char dir[512];
    struct cairn_err err = {0};
    struct model *ref = NULL, *m = NULL;
    CHECK_EQ_INT(model_load(qwen3_dir(dir, sizeof(dir)), test_cpu_be(), &ref, &err), CAIRN_OK);
    if (!ref) return test_summary("test_model_variants");
    size_t V = (size_t)model_get_info(ref)->vocab_size;
    float *a = calloc(3 * V, sizeof(float)), *b = calloc(3 * V, sizeof(float));
    forward_logits(ref, a);
    test_flat_spec(ref);

    /* zero-centred norms */
    CHECK_EQ_INT(model_load(dir, test_cpu_be(), &m, &err), CAIRN_OK);
    int hid = m->cfg.hidden_size, hd = m->cfg.head_dim;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        for (int i = 0; i < hid; i++)
            L->attn_norm[i] -= 1.0f, L->ffn_norm[i] -= 1.0f;
        for (int i = 0; i < hd; i++)
            L->attn.q_norm[i] -= 1.0f, L->attn.k_norm[i] -= 1.0f;
    }
    for (int i = 0; i < hid; i++)
        m->final_norm[i] -= 1.0f;
    m->norm_offset = 1.0f;
    forward_logits(m, b);
    CHECK_MSG(max_diff(a, b, 3 * V) < 1e-4, "norm offset: %g", max_diff(a, b, 3 * V));
    model_free(m);

    /* gated attention on every layer */
    CHECK_EQ_INT(model_load(dir, test_cpu_be(), &m, &err), CAIRN_OK);
    int nh = m->cfg.n_heads;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        float *q = linear_f32(m, &L->attn.q, 1.0f);
        float *qg = model_alloc_owned(m, sizeof(float) * (size_t)(2 * nh * hd * hid)); /* zeroed */
        for (int h = 0; h < nh; h++)
            memcpy(qg + (size_t)h * 2 * hd * hid, q + (size_t)h * hd * hid,
                   sizeof(float) * (size_t)(hd * hid));
        L->attn.q.w.dtype = DTYPE_F32;
        L->attn.q.w.data = qg;
        L->attn.q.w.shape[0] = 2 * nh * hd;
        /* the reference: o_proj * 0.5 */
        struct model_layer *R = &ref->layers[l];
        float *o = linear_f32(ref, &R->attn.o, 0.5f);
        R->attn.o.w.dtype = DTYPE_F32;
        R->attn.o.w.data = o;
    }
    m->attn_gated = 1;
    m->ws_ok = 0;
    forward_logits(m, b);
    forward_logits(ref, a);
    CHECK_MSG(max_diff(a, b, 3 * V) < 1e-4, "gated attention: %g", max_diff(a, b, 3 * V));
    double spread = 0;
    for (size_t i = 0; i < V; i++)
        spread = fmax(spread, fabs(a[i]));
    CHECK(spread > 0.1); /* logits are not trivially equal */
    model_free(m);
    model_free(ref);
    free(a);
    free(b);
    return test_summary("test_model_variants");
}
