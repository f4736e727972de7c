/* The MTP head against its PyTorch reference, like check-logits: tests/data/mtp/<name>/ are the
 * tiny hybrid oracle checkpoints with random mtp.* tensors, and expected_mtp.safetensors holds
 * scripts/mtp-ref/hybrid_ref.py's MTP logits (float64) for a few prompts (README.md there); the
 * demo model (models/demo, dense qwen3, MLX q8) carries a trained head, and
 * tests/data/demo/expected_mtp.safetensors holds scripts/demo-model/qwen3_min.py's logits for it
 * (float64 on the dequantized weights; train.py export --expected-mtp).
 *
 * Per case: cairn's target forward over the prompt returns the hidden states (model_seq.n_hidden),
 * the head runs over every prompt position (k = 1: first a chunk, then one position per call, so
 * its own KV is read back across calls) and then chains two more drafts from its own output
 * (fed the reference's drafts, so a near-tie in an argmax cannot derail the comparison); every
 * logit row within CAIRN's f32 tolerance of the reference, and the argmax equal wherever the
 * reference's top-2 margin is clear of it. The k = 1 pass is repeated with all cases batched in one
 * model_mtp_forward call. A model without mtp.* weights has no head and says so. */
#include <stdlib.h>

#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "testlib.h"
#include "test_backend.h"

#define TOL 2e-3
#define BS 16
#define BLOCKS_PER_CASE 8
#define MAX_CASES 4

struct ref_case {
    const int32_t *tokens;
    int T;
    int32_t next;
    const float *mtp_logits;   /* [T, V] */
    const int32_t *chain;      /* [n_chain] */
    const float *chain_logits; /* [n_chain, V] */
    const float *margins;      /* [n_chain] */
    int n_chain;
};

static const struct safetensors_tensor *find(const struct safetensors *f, int i, const char *what,
                                             enum dtype dt)
{
    char name[64];
    snprintf(name, sizeof(name), "case%d.%s", i, what);
    const struct safetensors_tensor *t = safetensors_find(f, name);
    if (t) CHECK_MSG(t->dtype_ok && t->dtype == dt, "%s: dtype %s", name, t->dtype_str);
    return t && t->dtype_ok && t->dtype == dt ? t : NULL;
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static double max_err(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* model_rel: the checkpoint folder; exp_rel: its reference (both relative to the source tree). */
static void check_model(const char *model_rel, const char *exp_rel)
{
    char dir[1024], exp[1024];
    const char *name = model_rel;
    test_src_path(model_rel, dir, sizeof(dir));
    test_src_path(exp_rel, exp, sizeof(exp));
    struct cairn_err err = {0};
    struct model *m = NULL;
    int rc = model_load(dir, test_cpu_be(), &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", name, err.msg);
    if (rc != CAIRN_OK) return;
    const struct model_info *info = model_get_info(m);
    CHECK_EQ_INT(info->n_mtp_layers, 1);
    int V = info->vocab_size, H = info->hidden_size;
    struct safetensors f;
    CHECK(safetensors_open(exp, &f, &err) == CAIRN_OK);
    struct ref_case cs[MAX_CASES];
    int n_cases = 0;
    for (int i = 0; i < MAX_CASES; i++) {
        const struct safetensors_tensor *tk = find(&f, i, "tokens", DTYPE_I32),
                                        *nx = find(&f, i, "next", DTYPE_I32);
        const struct safetensors_tensor *ml = find(&f, i, "mtp_logits", DTYPE_F32);
        const struct safetensors_tensor *ct = find(&f, i, "chain_tokens", DTYPE_I32);
        const struct safetensors_tensor *cl = find(&f, i, "chain_logits", DTYPE_F32);
        const struct safetensors_tensor *mg = find(&f, i, "chain_margins", DTYPE_F32);
        if (!tk) break;
        CHECK(nx && ml && ct && cl && mg);
        if (!(nx && ml && ct && cl && mg)) break;
        struct ref_case *c = &cs[n_cases++];
        c->tokens = (const int32_t *)tk->data;
        c->T = (int)tk->shape[0];
        c->next = *(const int32_t *)nx->data;
        c->mtp_logits = (const float *)ml->data;
        c->chain = (const int32_t *)ct->data;
        c->chain_logits = (const float *)cl->data;
        c->margins = (const float *)mg->data;
        c->n_chain = (int)ct->shape[0];
        CHECK(ml->shape[0] == c->T && ml->shape[1] == V && cl->shape[0] == c->n_chain);
        CHECK(c->T + c->n_chain <= BLOCKS_PER_CASE * BS);
    }
    CHECK(n_cases >= 2);

    struct kv_pool kv;
    CHECK(model_reserve(m, 128, &err) == CAIRN_OK);
    CHECK(kv_pool_init(&kv, test_cpu_be(), info->n_kv_layers, MAX_CASES * BLOCKS_PER_CASE, BS,
                       info->n_kv_heads, info->head_dim, DTYPE_F32, &err) == CAIRN_OK);
    int32_t table[MAX_CASES][BLOCKS_PER_CASE];
    for (int i = 0; i < MAX_CASES; i++) /* scattered blocks, not in order */
        for (int b = 0; b < BLOCKS_PER_CASE; b++)
            table[i][b] = (MAX_CASES * BLOCKS_PER_CASE - 1) - (b * MAX_CASES + i);
    float *hid[MAX_CASES], *ids_hid = NULL;
    int32_t *ids[MAX_CASES];
    float *lg = malloc(sizeof(float) * (size_t)V * 128),
          *g = malloc(sizeof(float) * (size_t)H * 128);
    uint8_t *state = malloc(info->state_bytes);
    (void)ids_hid;
    for (int i = 0; i < n_cases; i++) {
        struct ref_case *c = &cs[i];
        hid[i] = malloc(sizeof(float) * (size_t)H * (size_t)c->T);
        ids[i] = malloc(sizeof(int32_t) * (size_t)c->T);
        /* target: prompt in chunks of 16, hidden of every token, logits of the last */
        model_state_init(m, state);
        for (int p = 0; p < c->T; p += 16) {
            int n = CAIRN_MIN(16, c->T - p);
            struct model_seq s = {.tokens = c->tokens + p,
                                  .n_tokens = n,
                                  .pos0 = p,
                                  .block_table = table[i],
                                  .state = state,
                                  .n_logits = p + n == c->T,
                                  .logits = lg,
                                  .n_hidden = n,
                                  .hidden = hid[i] + (size_t)p * H};
            rc = model_forward(m, kv_pool_view(&kv), &s, 1, &err);
            CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
        }
        int top = argmax(lg, V);
        if (top != c->next)
            fprintf(stderr, "note: %s case %d: target argmax %d vs reference %d\n", name, i, top,
                    c->next);
        for (int p = 0; p < c->T; p++)
            ids[i][p] = p + 1 < c->T ? c->tokens[p + 1] : c->next;

        /* k = 1 over the prompt: one chunk, then a position per call */
        int first = c->T / 2;
        struct model_mtp_seq q = {.tokens = ids[i],
                                  .hidden = hid[i],
                                  .n_tokens = first,
                                  .pos0 = 0,
                                  .block_table = table[i],
                                  .n_out = first,
                                  .logits = lg,
                                  .hidden_out = g};
        rc = first ? model_mtp_forward(m, kv_pool_view(&kv), &q, 1, &err) : CAIRN_OK;
        CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
        for (int p = first; p < c->T; p++) {
            q = (struct model_mtp_seq){.tokens = ids[i] + p,
                                       .hidden = hid[i] + (size_t)p * H,
                                       .n_tokens = 1,
                                       .pos0 = p,
                                       .block_table = table[i],
                                       .n_out = 1,
                                       .logits = lg + (size_t)p * V,
                                       .hidden_out = g + (size_t)p * H};
            rc = model_mtp_forward(m, kv_pool_view(&kv), &q, 1, &err);
            CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
        }
        double e1 = max_err(lg, c->mtp_logits, (size_t)c->T * V);
        printf("%s case %d: T=%d k=1 max|err| %.3e\n", name, i, c->T, e1);
        CHECK_MSG(e1 <= TOL, "%s case %d: k = 1 logits off by %g", name, i, e1);
        CHECK_EQ_INT(argmax(lg + (size_t)(c->T - 1) * V, V), c->chain[0]);

        /* chained drafts: position T - 1 + j, the reference's draft j - 1, the head's own output */
        float gj[4096];
        CHECK(H <= 4096);
        memcpy(gj, g + (size_t)(c->T - 1) * H, sizeof(float) * (size_t)H);
        for (int j = 1; j < c->n_chain; j++) {
            q = (struct model_mtp_seq){.tokens = &c->chain[j - 1],
                                       .hidden = gj,
                                       .n_tokens = 1,
                                       .pos0 = c->T - 1 + j,
                                       .block_table = table[i],
                                       .n_out = 1,
                                       .logits = lg,
                                       .hidden_out = gj};
            rc = model_mtp_forward(m, kv_pool_view(&kv), &q, 1, &err);
            CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
            double ej = max_err(lg, c->chain_logits + (size_t)j * V, (size_t)V);
            printf("%s case %d: chain step %d max|err| %.3e\n", name, i, j + 1, ej);
            CHECK_MSG(ej <= TOL, "%s case %d: chain step %d logits off by %g", name, i, j + 1, ej);
            if (c->margins[j] > 2 * TOL) CHECK_EQ_INT(argmax(lg, V), c->chain[j]);
        }
    }

    /* all cases' k = 1 pass in one batched call (their KV rewritten in place) */
    struct model_mtp_seq qs[MAX_CASES];
    size_t off = 0;
    int total = 0;
    for (int i = 0; i < n_cases; i++)
        total += cs[i].T;
    float *blg = malloc(sizeof(float) * (size_t)V * (size_t)total);
    for (int i = 0; i < n_cases; i++) {
        qs[i] = (struct model_mtp_seq){.tokens = ids[i],
                                       .hidden = hid[i],
                                       .n_tokens = cs[i].T,
                                       .pos0 = 0,
                                       .block_table = table[i],
                                       .n_out = cs[i].T,
                                       .logits = blg + off};
        off += (size_t)cs[i].T * V;
    }
    rc = model_mtp_forward(m, kv_pool_view(&kv), qs, n_cases, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    off = 0;
    for (int i = 0; i < n_cases; i++) {
        double e = max_err(blg + off, cs[i].mtp_logits, (size_t)cs[i].T * V);
        CHECK_MSG(e <= TOL, "%s case %d batched: off by %g", name, i, e);
        off += (size_t)cs[i].T * V;
    }
    /* bad input is an error, not a crash */
    int32_t bad = V;
    struct model_mtp_seq qb = {
        .tokens = &bad, .hidden = hid[0], .n_tokens = 1, .pos0 = 0, .block_table = table[0]};
    CHECK(model_mtp_forward(m, kv_pool_view(&kv), &qb, 1, &err) == CAIRN_ERR_INVALID);

    for (int i = 0; i < n_cases; i++) {
        free(hid[i]);
        free(ids[i]);
    }
    free(blg);
    free(lg);
    free(g);
    free(state);
    kv_pool_free(&kv);
    safetensors_close(&f);
    model_free(m);
}

/* The oracle checkpoint itself has no mtp.* tensors: no head, no extra KV layer, a clear error. */
static void check_no_head(void)
{
    char dir[1024];
    test_src_path("tests/data/oracle/models/qwen3_5-tiny", dir, sizeof(dir));
    struct cairn_err err = {0};
    struct model *m = NULL;
    CHECK(model_load(dir, test_cpu_be(), &m, &err) == CAIRN_OK);
    if (!m) return;
    const struct model_info *info = model_get_info(m);
    CHECK_EQ_INT(info->n_mtp_layers, 0);
    CHECK_EQ_INT(info->n_kv_layers, 2);
    CHECK(model_reserve(m, 16, &err) == CAIRN_OK);
    struct kv_pool kv;
    CHECK(kv_pool_init(&kv, test_cpu_be(), info->n_kv_layers, 4, BS, info->n_kv_heads,
                       info->head_dim, DTYPE_F32, &err) == CAIRN_OK);
    int32_t tok = 1, table[4] = {0, 1, 2, 3};
    float h[128] = {0};
    CHECK(info->hidden_size <= 128);
    struct model_mtp_seq q = {.tokens = &tok, .hidden = h, .n_tokens = 1, .block_table = table};
    CHECK(model_mtp_forward(m, kv_pool_view(&kv), &q, 1, &err) == CAIRN_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "no MTP head") != NULL);
    kv_pool_free(&kv);
    model_free(m);
}

int main(void)
{
    check_model("tests/data/mtp/qwen3_5-tiny",
                "tests/data/mtp/qwen3_5-tiny/expected_mtp.safetensors");
    check_model("tests/data/mtp/qwen3next-tiny",
                "tests/data/mtp/qwen3next-tiny/expected_mtp.safetensors");
    check_model("models/demo", "tests/data/demo/expected_mtp.safetensors");
    check_no_head();
    return test_summary("test_spec_mtp_ref");
}
