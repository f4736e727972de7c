/* Recurrent state of hybrid models: a snapshot taken at a token boundary, restored after the
 * sequence went elsewhere, continues exactly like running straight through. */
#include <stdlib.h>

#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "testlib.h"
#include "test_backend.h"

#define N_PREFIX 40
#define N_DECODE 12

static struct model *m;
static struct kv_pool kv;
static int32_t table[64];

/* Runs tokens[0..n) at positions pos0.. in chunks of `chunk`, logits of every token into out. */
static void run(void *state, const int32_t *tokens, int n, int pos0, int chunk, float *out)
{
    int V = model_get_info(m)->vocab_size;
    for (int i = 0; i < n; i += chunk) {
        int len = n - i < chunk ? n - i : chunk;
        struct model_seq s = {.tokens = tokens + i, .n_tokens = len, .pos0 = pos0 + i, .block_table = table,
                              .state = state, .n_logits = out ? len : 0, .logits = out ? out + (size_t)i * V : NULL};
        struct cairn_err err;
        int rc = model_forward(m, kv_pool_view(&kv), &s, 1, &err);
        CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    }
}

int main(void)
{
    char dir[1024], exp[1200];
    test_src_path("tests/data/oracle/models/qwen3_5-tiny", dir, sizeof(dir));
    snprintf(exp, sizeof(exp), "%s/expected.safetensors", dir);
    struct cairn_err err;
    CHECK(model_load(dir, test_cpu_be(), &m, &err) == CAIRN_OK);
    const struct model_info *info = model_get_info(m);
    CHECK(info->state_bytes > 0);
    CHECK(model_reserve(m, 64, &err) == CAIRN_OK);
    CHECK(kv_pool_init(&kv, test_cpu_be(), info->n_kv_layers, 64, 16, info->n_kv_heads, info->head_dim, DTYPE_F32, &err) == CAIRN_OK);
    for (int i = 0; i < 64; i++) table[i] = 63 - i;

    /* Real token ids from the oracle's long case. */
    struct safetensors f;
    CHECK(safetensors_open(exp, &f, &err) == CAIRN_OK);
    const struct safetensors_tensor *t = safetensors_find(&f, "case2.tokens");
    CHECK(t && t->shape[0] >= N_PREFIX + N_DECODE);
    int32_t toks[N_PREFIX + N_DECODE], junk[5] = {1, 2, 3, 4, 5};
    memcpy(toks, t->data, sizeof(toks));

    int V = info->vocab_size;
    size_t sb = info->state_bytes;
    uint8_t *st = malloc(sb), *snap = malloc(sb), *snap32 = malloc(sb);
    float *straight = malloc(sizeof(float) * V * N_DECODE), *resumed = malloc(sizeof(float) * V * N_DECODE);

    /* Straight through: prefix (snapshots at 32 and 40), then decode one token at a time. */
    model_state_init(m, st);
    run(st, toks, 32, 0, 32, NULL);
    memcpy(snap32, st, sb);
    run(st, toks + 32, N_PREFIX - 32, 32, 8, NULL);
    memcpy(snap, st, sb);
    run(st, toks + N_PREFIX, N_DECODE, N_PREFIX, 1, straight);

    /* Go elsewhere from the same point, then restore the snapshot and continue. */
    memcpy(st, snap, sb);
    run(st, junk, 5, N_PREFIX, 1, NULL);
    CHECK(memcmp(st, snap, sb) != 0); /* the detour really changed the state */
    memcpy(st, snap, sb);
    run(st, toks + N_PREFIX, N_DECODE, N_PREFIX, 1, resumed);
    CHECK_MSG(memcmp(straight, resumed, sizeof(float) * V * N_DECODE) == 0, "restored run differs");

    /* Restore the earlier snapshot, re-feed tokens 32..40 in another chunking, continue. */
    memcpy(st, snap32, sb);
    run(st, toks + 32, N_PREFIX - 32, 32, 3, NULL);
    run(st, toks + N_PREFIX, N_DECODE, N_PREFIX, 1, resumed);
    double max_d = 0;
    for (int i = 0; i < V * N_DECODE; i++) {
        double d = fabs((double)straight[i] - resumed[i]);
        if (d > max_d) max_d = d;
    }
    CHECK_MSG(max_d < 1e-4, "re-fed run differs by %g", max_d);

    /* A fresh state is not the snapshot: without restore the continuation differs. */
    model_state_init(m, st);
    run(st, toks + N_PREFIX, 1, N_PREFIX, 1, resumed);
    CHECK(memcmp(straight, resumed, sizeof(float) * V) != 0);

    free(st);
    free(snap);
    free(snap32);
    free(straight);
    free(resumed);
    safetensors_close(&f);
    kv_pool_free(&kv);
    model_free(m);
    return test_summary("test_hybrid_state");
}
