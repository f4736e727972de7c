/* MLX's stacked expert layout (mlp.switch_mlp.{gate,up,down}_proj with a leading expert
 * dimension): a copy of the qwen3-moe oracle checkpoint rewritten with stacked experts must
 * still match the oracle logits; and a per-expert view of a stacked quantized weight must be
 * exactly the matching rows. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/check.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "testlib.h"
#include "test_backend.h"

static int is_expert(const char *name, int *layer, int *e, char *proj)
{
    return sscanf(name, "model.layers.%d.mlp.experts.%d.%15[a-z_].weight", layer, e, proj) == 3;
}

/* Writes dir/model.safetensors: src with every expert weight stacked per layer and proj. */
static int write_stacked(const struct safetensors *src, const char *path, int n_layers, int n_exp)
{
    struct cairn_err err;
    struct safetensors_writer *w;
    if (safetensors_writer_open(path, &w, &err) != CAIRN_OK) return -1;
    static const char *const projs[3] = {"gate_proj", "up_proj", "down_proj"};
    char name[256];
    for (int i = 0; i < src->n_tensors; i++) {
        const struct safetensors_tensor *t = &src->tensors[i];
        int l, e;
        char proj[16];
        if (!is_expert(t->name, &l, &e, proj))
            safetensors_writer_tensor(w, t->name, t->dtype, t->n_dims, t->shape, &err);
    }
    for (int l = 0; l < n_layers; l++)
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.0.%s.weight", l, projs[j]);
            const struct safetensors_tensor *t0 = safetensors_find(src, name);
            if (!t0) return -1;
            int64_t shape[3] = {n_exp, t0->shape[0], t0->shape[1]};
            snprintf(name, sizeof(name), "model.layers.%d.mlp.switch_mlp.%s.weight", l, projs[j]);
            safetensors_writer_tensor(w, name, t0->dtype, 3, shape, &err);
        }
    if (safetensors_writer_begin(w, &err) != CAIRN_OK) return -1;
    for (int i = 0; i < src->n_tensors; i++) {
        const struct safetensors_tensor *t = &src->tensors[i];
        int l, e;
        char proj[16];
        if (!is_expert(t->name, &l, &e, proj)) safetensors_writer_write(w, t->data, t->n_bytes, &err);
    }
    for (int l = 0; l < n_layers; l++)
        for (int j = 0; j < 3; j++)
            for (int e = 0; e < n_exp; e++) {
                snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%d.%s.weight", l, e, projs[j]);
                const struct safetensors_tensor *t = safetensors_find(src, name);
                if (!t) return -1;
                safetensors_writer_write(w, t->data, t->n_bytes, &err);
            }
    return safetensors_writer_commit(w, &err) == CAIRN_OK ? 0 : -1;
}

static void test_stacked_checkpoint(void)
{
    char src_dir[1024], path[1200], tmp[] = "/tmp/cairn_moe_stacked_XXXXXX", cmd[2600];
    test_src_path("tests/data/oracle/models/qwen3-moe-tiny", src_dir, sizeof(src_dir));
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(cmd, sizeof(cmd), "cp %s/config.json %s/", src_dir, tmp);
    CHECK(system(cmd) == 0);
    struct safetensors src;
    struct cairn_err err;
    snprintf(path, sizeof(path), "%s/model.safetensors", src_dir);
    CHECK(safetensors_open(path, &src, &err) == CAIRN_OK);
    snprintf(path, sizeof(path), "%s/model.safetensors", tmp);
    CHECK(write_stacked(&src, path, 2, 8) == 0);
    safetensors_close(&src);

    struct model *m = NULL;
    int rc = model_load(tmp, test_cpu_be(), &m, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    if (rc == CAIRN_OK) {
        snprintf(path, sizeof(path), "%s/expected.safetensors", src_dir);
        struct model_check_opts o = {.tol = 2e-3, .kv_dtype = DTYPE_F32, .chunk = 32, .block_size = 16};
        struct model_check_result r;
        CHECK(model_check_run(m, path, &o, &r, &err) == CAIRN_OK);
        CHECK_MSG(r.n_failed == 0 && r.n_runs >= 3, "%d of %d runs failed (max %g)", r.n_failed, r.n_runs, r.max_abs);
        model_free(m);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

static void test_row_slice_quant(void)
{
    enum { E = 3, OUT = 5, IN = 64, GS = 32, BITS = 4 };
    uint32_t words[E * OUT * IN * BITS / 32];
    uint16_t sc[E * OUT * IN / GS], bi[E * OUT * IN / GS];
    uint64_t seed = 7;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(words); i++) {
        seed = seed * 6364136223846793005ull + 1;
        words[i] = (uint32_t)(seed >> 32);
    }
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(sc); i++) {
        sc[i] = f32_to_bf16(0.01f * (float)(i + 1));
        bi[i] = f32_to_bf16(-0.1f * (float)i);
    }
    struct tensor big = {.dtype = DTYPE_Q, .n_dims = 2, .shape = {E * OUT, IN}, .data = words, .scales = sc,
                         .biases = bi, .bits = BITS, .group_size = GS};
    float a[IN], b[IN];
    for (int e = 0; e < E; e++) {
        struct tensor v;
        test_cpu_be()->ops->weight_slice_rows(test_cpu_be(), &big, (int64_t)e * OUT, OUT, &v);
        CHECK(v.shape[0] == OUT && v.shape[1] == IN);
        for (int r = 0; r < OUT; r++) {
            tensor_row_to_f32(&v, r, a);
            tensor_row_to_f32(&big, (int64_t)e * OUT + r, b);
            CHECK(memcmp(a, b, sizeof(a)) == 0);
        }
    }
}

/* A per-expert view (weight_slice_rows) of a stacked weight the CPU backend packed for its VNNI
 * kernel (weight_prepare) reads its own rows of the packed copy where the expert starts on a
 * 16-row block, and falls back to the MLX layout elsewhere; either way its matmul matches the
 * unpacked view's to f32 tolerance. */
static void test_row_slice_packed(void)
{
    struct cairn_err err = {0};
    struct backend *be = test_cpu_be();
    static const int outs[] = {32, 24};
    for (size_t oi = 0; oi < CAIRN_ARRAY_LEN(outs); oi++) {
        enum { E = 3, IN = 128, GS = 64, BITS = 4 };
        const int out = outs[oi];
        uint32_t *words = malloc((size_t)E * out * IN * BITS / 8);
        uint16_t *sc = malloc((size_t)E * out * IN / GS * 2), *bi = malloc((size_t)E * out * IN / GS * 2);
        uint64_t seed = 11;
        for (int i = 0; i < E * out * IN * BITS / 32; i++) {
            seed = seed * 6364136223846793005ull + 1;
            words[i] = (uint32_t)(seed >> 32);
        }
        for (int i = 0; i < E * out * IN / GS; i++) {
            sc[i] = f32_to_bf16(0.01f * (float)(i % 7 + 1));
            bi[i] = f32_to_bf16(-0.02f * (float)(i % 5));
        }
        struct tensor big = {.dtype = DTYPE_Q, .n_dims = 2, .shape = {(int64_t)E * out, IN}, .data = words,
                             .scales = sc, .biases = bi, .bits = BITS, .group_size = GS};
        size_t extra = 0;
        CHECK(be->ops->weight_prepare(be, &big, 0, &extra, &err) == CAIRN_OK);
        const void *packed = big.be_data;
        float x[2 * IN], y[2 * 32], yref[2 * 32];
        for (int i = 0; i < 2 * IN; i++) x[i] = (float)((i * 37) % 101 - 50) / 50.0f;
        for (int e = 0; e < E; e++) {
            struct tensor v;
            be->ops->weight_slice_rows(be, &big, (int64_t)e * out, out, &v);
            CHECK_MSG((v.be_data != NULL) == (packed && (e * out) % 16 == 0), "out %d expert %d packed view", out, e);
            CHECK(be->ops->step_begin(be, &err) == CAIRN_OK);
            be->ops->matmul(be, &v, x, y, 2);
            v.be_data = NULL;
            be->ops->matmul(be, &v, x, yref, 2);
            CHECK(be->ops->step_end(be, &err) == CAIRN_OK);
            for (int i = 0; i < 2 * out; i++)
                CHECK_MSG(fabsf(y[i] - yref[i]) <= 1e-4f * (1.0f + fabsf(yref[i])), "out %d expert %d y[%d] %g vs %g",
                          out, e, i, y[i], yref[i]);
        }
        printf("row slices of %d rows: %s\n", out, packed ? "packed" : "not packed (no AVX-512 VNNI)");
        be->ops->weight_release(be, &big);
        free(words);
        free(sc);
        free(bi);
    }
}

int main(void)
{
    test_stacked_checkpoint();
    test_row_slice_quant();
    test_row_slice_packed();
    return test_summary("test_model_moe_stacked");
}
