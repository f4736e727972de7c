/* Model loading: errors that must name the right file/tensor/shape, config parsing (RoPE
 * forms, eos, text_config, quantization overrides, hybrid/MoE configs), MLX bits derived from
 * packed shapes, identity, synth-model round trip, model_forward argument checks. */
#include "testlib.h"
#include "test_backend.h"

#include <math.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "base/file.h"
#include "kv/kv_pool.h"
#include "model/check.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/synth.h"

static char tmp_dir[256];

static const char *oracle_dir(const char *name, char *buf, size_t n)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/data/oracle/models/%s", name);
    return test_src_path(rel, buf, n);
}

/* Makes tmp/NAME with the config of oracle model `from` (optionally edited: `find` replaced by
 * `repl`) and returns its path. */
static const char *make_dir(const char *name, const char *from, const char *find, const char *repl)
{
    static char dir[512];
    char src[512], path[600];
    snprintf(dir, sizeof(dir), "%s/%s", tmp_dir, name);
    struct cairn_err err = {0};
    cairn_mkdir_p(dir, &err);
    snprintf(path, sizeof(path), "%s/config.json", oracle_dir(from, src, sizeof(src)));
    char *text;
    size_t len;
    CHECK_EQ_INT(cairn_file_read_all(path, 1 << 20, &text, &len, &err), CAIRN_OK);
    char out[8192];
    snprintf(out, sizeof(out), "%s", text);
    if (find) {
        char *p = strstr(text, find);
        CHECK_MSG(p != NULL, "'%s' not in %s", find, path);
        if (p)
            snprintf(out, sizeof(out), "%.*s%s%s", (int)(p - text), text, repl, p + strlen(find));
    }
    free(text);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    CHECK_EQ_INT(cairn_file_write_atomic(path, out, strlen(out), &err), CAIRN_OK);
    return dir;
}

/* Copies model.safetensors of oracle model `from` into dir, skipping tensor `skip`, and giving
 * tensor `reshape` (if any) its first half only with shape[0] halved. */
static void copy_weights(const char *dir, const char *from, const char *skip, const char *reshape,
                         const char *redtype)
{
    char src[512], path[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", oracle_dir(from, src, sizeof(src)));
    struct safetensors st;
    struct cairn_err err = {0};
    CHECK_EQ_INT(safetensors_open(path, &st, &err), CAIRN_OK);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct safetensors_writer *w;
    CHECK_EQ_INT(safetensors_writer_open(path, &w, &err), CAIRN_OK);
    for (int i = 0; i < st.n_tensors; i++) {
        const struct safetensors_tensor *t = &st.tensors[i];
        if (skip && strcmp(t->name, skip) == 0) continue;
        int64_t shape[8];
        memcpy(shape, t->shape, sizeof(shape));
        enum dtype dt = t->dtype;
        if (reshape && strcmp(t->name, reshape) == 0) shape[0] /= 2;
        if (redtype && strcmp(t->name, redtype) == 0) { /* same bytes as U8 */
            dt = DTYPE_U8;
            shape[t->n_dims - 1] *= (int64_t)t->elem_bytes;
        }
        CHECK_EQ_INT(safetensors_writer_tensor(w, t->name, dt, t->n_dims, shape, &err), CAIRN_OK);
    }
    CHECK_EQ_INT(safetensors_writer_begin(w, &err), CAIRN_OK);
    for (int i = 0; i < st.n_tensors; i++) {
        const struct safetensors_tensor *t = &st.tensors[i];
        if (skip && strcmp(t->name, skip) == 0) continue;
        size_t n = t->n_bytes;
        if (reshape && strcmp(t->name, reshape) == 0) n /= 2;
        CHECK_EQ_INT(safetensors_writer_write(w, t->data, n, &err), CAIRN_OK);
    }
    CHECK_EQ_INT(safetensors_writer_commit(w, &err), CAIRN_OK);
    safetensors_close(&st);
}

/* Writes dir/model.safetensors as the first `keep` bytes of the oracle's, with `patch` (if any)
 * replacing the first occurrence of `at` in the header. */
static void raw_weights(const char *dir, const char *from, long keep, const char *at,
                        const char *patch)
{
    char src[512], path[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", oracle_dir(from, src, sizeof(src)));
    char *data;
    size_t len;
    struct cairn_err err = {0};
    CHECK_EQ_INT(cairn_file_read_all(path, 64 << 20, &data, &len, &err), CAIRN_OK);
    if (at) {
        char *p = memmem(data, len, at, strlen(at));
        CHECK(p != NULL && strlen(patch) == strlen(at));
        if (p) memcpy(p, patch, strlen(patch));
    }
    if (keep < 0) keep = (long)len + keep;
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECK_EQ_INT(cairn_file_write_atomic(path, data, (size_t)keep, &err), CAIRN_OK);
    free(data);
}

static void expect_load_fail(const char *dir, int status, const char *n1, const char *n2,
                             const char *n3)
{
    struct model *m = NULL;
    struct cairn_err err = {0};
    int rc = model_load(dir, test_cpu_be(), &m, &err);
    CHECK_MSG(rc == status, "%s: rc %d (%s), wanted %d", dir, rc, err.msg, status);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i])
            CHECK_MSG(strstr(err.msg, needles[i]) != NULL, "message '%s' lacks '%s'", err.msg,
                      needles[i]);
    if (rc == CAIRN_OK) model_free(m);
}

static void test_load_errors(void)
{
    const char *d;
    d = make_dir("trunc", "llama-tiny", NULL, NULL);
    raw_weights(d, "llama-tiny", 1000, NULL, NULL); /* cut inside the header */
    expect_load_fail(d, CAIRN_ERR_FORMAT, "model.safetensors", "header length", NULL);

    d = make_dir("pastend", "llama-tiny", NULL, NULL);
    raw_weights(d, "llama-tiny", -100, NULL, NULL); /* the last tensor's data is cut */
    expect_load_fail(d, CAIRN_ERR_FORMAT, "model.safetensors", "outside the data area",
                     "model.norm.weight");

    d = make_dir("corrupt", "llama-tiny", NULL, NULL);
    raw_weights(d, "llama-tiny", 1635176, "\"shape\":", "\"shape\"@");
    expect_load_fail(d, CAIRN_ERR_FORMAT, "model.safetensors", "header JSON", NULL);

    d = make_dir("baddtype", "llama-tiny", NULL, NULL);
    raw_weights(d, "llama-tiny", 1635176, "\"BF16\"", "\"BX16\"");
    expect_load_fail(d, CAIRN_ERR_FORMAT, "model.safetensors", "unknown dtype 'BX16'",
                     "lm_head.weight");

    d = make_dir("missing", "llama-tiny", NULL, NULL);
    copy_weights(d, "llama-tiny", "model.layers.1.mlp.up_proj.weight", NULL, NULL);
    expect_load_fail(d, CAIRN_ERR_NOT_FOUND, "model.safetensors",
                     "missing tensor 'model.layers.1.mlp.up_proj.weight'", "[352, 128]");

    d = make_dir("misshaped", "llama-tiny", NULL, NULL);
    copy_weights(d, "llama-tiny", NULL, "model.layers.2.self_attn.q_proj.weight", NULL);
    expect_load_fail(d, CAIRN_ERR_FORMAT, "model.layers.2.self_attn.q_proj.weight",
                     "expected [128, 128]", "got [64, 128] BF16");

    d = make_dir("wrongdtype", "llama-tiny", NULL, NULL);
    copy_weights(d, "llama-tiny", NULL, NULL, "model.layers.0.input_layernorm.weight");
    expect_load_fail(d, CAIRN_ERR_FORMAT, "model.layers.0.input_layernorm.weight",
                     "expected [128] F32/F16/BF16", "got [256] U8");

    d = make_dir("nobiases", "llama-tiny-mlx-q4-g64", NULL, NULL);
    copy_weights(d, "llama-tiny-mlx-q4-g64", "model.layers.0.self_attn.k_proj.biases", NULL, NULL);
    expect_load_fail(d, CAIRN_ERR_NOT_FOUND,
                     "missing tensor 'model.layers.0.self_attn.k_proj.biases'", NULL, NULL);

    d = make_dir("badscales", "llama-tiny-mlx-q4-g64", NULL, NULL);
    copy_weights(d, "llama-tiny-mlx-q4-g64", NULL, "model.layers.1.mlp.up_proj.scales", NULL);
    expect_load_fail(d, CAIRN_ERR_FORMAT, "model.layers.1.mlp.up_proj.scales",
                     "expected [352, in/group_size]", "got [176, 2] BF16");

    d = make_dir("arch", "llama-tiny", "\"model_type\": \"llama\"", "\"model_type\": \"gpt2\"");
    expect_load_fail(d, CAIRN_ERR_UNSUPPORTED, "config.json", "unsupported architecture", "'gpt2'");

    d = make_dir("rope", "llama-tiny", "\"rope_type\": \"default\"", "\"rope_type\": \"dynamic\"");
    expect_load_fail(d, CAIRN_ERR_UNSUPPORTED, "config.json", "rope type 'dynamic'", NULL);

    d = make_dir("noweights", "llama-tiny", NULL, NULL);
    expect_load_fail(d, CAIRN_ERR_NOT_FOUND, "no model.safetensors", NULL, NULL);

    expect_load_fail("/nonexistent-cairn-model", CAIRN_ERR_NOT_FOUND, "config.json", NULL, NULL);

    /* Hybrid and MoE families load (their numerics are tested in test_model_oracle_hybrid);
     * n_kv_layers counts only the full-attention layers, and hybrids keep recurrent state. */
    const char *fams[] = {"qwen3-moe-tiny", "qwen3next-tiny", "qwen3_5-tiny", "qwen3_5-moe-tiny"};
    const int kv_layers[] = {2, 2, 2, 2}, hybrid[] = {0, 1, 1, 1};
    for (int i = 0; i < 4; i++) {
        char dir[512];
        struct model *m = NULL;
        struct cairn_err err = {0};
        CHECK_MSG(model_load(oracle_dir(fams[i], dir, sizeof(dir)), test_cpu_be(), &m, &err) == CAIRN_OK, "%s: %s",
                  fams[i], err.msg);
        if (!m) continue;
        CHECK_EQ_INT(model_get_info(m)->n_kv_layers, kv_layers[i]);
        CHECK_EQ_INT(model_get_info(m)->state_bytes > 0, hybrid[i]);
        model_free(m);
    }
}

static void test_config(void)
{
    struct model_config c;
    struct cairn_err err = {0};
    /* Old style: rope_theta and rope_scaling (llama3) at the root; eos list; gen config wins. */
    const char *llama31 =
        "{\"model_type\":\"llama\",\"vocab_size\":1000,\"hidden_size\":256,\"intermediate_size\":"
        "512,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,\"high_freq_factor\":4.0,"
        "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,\"rope_type\":"
        "\"llama3\"},"
        "\"eos_token_id\":[5,6,7],\"bos_token_id\":1,\"tie_word_embeddings\":true}";
    CHECK_EQ_INT(model_config_parse(llama31, NULL, "c.json", &c, &err), CAIRN_OK);
    CHECK_EQ_INT(c.arch, MODEL_ARCH_LLAMA);
    CHECK_EQ_INT(c.rope_type, MODEL_ROPE_LLAMA3);
    CHECK_NEAR(c.rope_theta, 500000.0, 0);
    CHECK_NEAR(c.rope_factor, 8.0, 0);
    CHECK_EQ_INT(c.rope_orig_max_position, 8192);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.rot_dim, 64);
    CHECK_EQ_INT(c.n_eos, 3);
    CHECK(c.eos_ids[0] == 5 && c.eos_ids[2] == 7);
    CHECK_EQ_INT(c.bos_id, 1);
    CHECK_EQ_INT(c.tie_word_embeddings, 1);
    CHECK_EQ_INT(c.layer_kinds[1], MODEL_LAYER_ATTN);
    /* llama3 scaling: high frequencies kept, low ones divided by factor, the band between
     * interpolated and monotone. */
    float inv[32];
    model_config_rope_inv_freq(&c, inv);
    CHECK_NEAR(inv[0], 1.0, 1e-7);
    double plain31 = 1.0 / pow(500000.0, 62.0 / 64.0);
    CHECK_NEAR(inv[31], plain31 / 8.0, plain31 * 1e-5);
    for (int i = 1; i < 32; i++)
        CHECK(inv[i] < inv[i - 1]);
    model_config_free(&c);
    CHECK_EQ_INT(
        model_config_parse(llama31, "{\"eos_token_id\":9,\"bos_token_id\":3}", "c.json", &c, &err),
        CAIRN_OK);
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 9 && c.bos_id == 3);
    CHECK_EQ_INT(c.gen.has, 0);
    model_config_free(&c);
    /* Sampling defaults: do_sample false wins over temperature; out-of-range values are ignored. */
    CHECK_EQ_INT(model_config_parse(llama31,
                                    "{\"do_sample\":false,\"temperature\":0.6,\"top_p\":0.9,\"top_k\":20,"
                                    "\"min_p\":2,\"repetition_penalty\":1.1}",
                                    "c.json", &c, &err),
                 CAIRN_OK);
    CHECK_EQ_INT(c.gen.has, MODEL_GEN_TEMPERATURE | MODEL_GEN_TOP_P | MODEL_GEN_TOP_K | MODEL_GEN_REPETITION_PENALTY);
    CHECK(c.gen.temperature == 0.0f && c.gen.top_k == 20);
    CHECK_NEAR(c.gen.top_p, 0.9, 1e-6);
    CHECK_NEAR(c.gen.repetition_penalty, 1.1, 1e-6);
    model_config_free(&c);

    /* New style: rope_parameters with linear scaling and partial rotary; head_dim explicit. */
    const char *lin =
        "{\"model_type\":\"qwen3\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"head_dim\":48,"
        "\"rope_parameters\":{\"rope_theta\":1000.0,\"rope_type\":\"linear\",\"factor\":4.0,"
        "\"partial_rotary_factor\":0.5}}";
    CHECK_EQ_INT(model_config_parse(lin, NULL, "c.json", &c, &err), CAIRN_OK);
    CHECK_EQ_INT(c.head_dim, 48);
    CHECK_EQ_INT(c.n_kv_heads, 2);
    CHECK_EQ_INT(c.rot_dim, 24);
    CHECK_EQ_INT(c.rope_type, MODEL_ROPE_LINEAR);
    model_config_rope_inv_freq(&c, inv);
    CHECK_NEAR(inv[0], 0.25, 1e-7);
    CHECK_NEAR(inv[1], 0.25 / pow(1000.0, 2.0 / 24.0), 1e-7);
    CHECK_EQ_INT(c.n_eos, 0);
    CHECK_EQ_INT(c.bos_id, -1);
    model_config_free(&c);

    /* yarn (Qwen3 long context): high frequencies kept, low ones / factor, a ramp between;
     * attention scaled through attn_factor = 0.1 ln(factor) + 1 unless given. */
    const char *yarn =
        "{\"model_type\":\"qwen3\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"head_dim\":128,\"rope_theta\":1000000,"
        "\"max_position_embeddings\":131072,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4."
        "0,"
        "\"original_max_position_embeddings\":32768}}";
    CHECK_EQ_INT(model_config_parse(yarn, NULL, "c.json", &c, &err), CAIRN_OK);
    CHECK_EQ_INT(c.rope_type, MODEL_ROPE_YARN);
    CHECK_NEAR(c.rope_attn_factor, 0.1 * log(4.0) + 1.0, 1e-12);
    float yinv[64];
    model_config_rope_inv_freq(&c, yinv);
    CHECK_NEAR(yinv[0], 1.0, 1e-7);
    CHECK_NEAR(yinv[5], 1.0 / pow(1e6, 10.0 / 128), 1e-7);
    CHECK_NEAR(yinv[63], 1.0 / pow(1e6, 126.0 / 128) / 4, 1e-12);
    int n_mid = 0;
    for (int i = 1; i < 64; i++) {
        CHECK(yinv[i] < yinv[i - 1]);
        double plain = 1.0 / pow(1e6, 2.0 * i / 128);
        n_mid += yinv[i] < plain * 0.999 && yinv[i] > plain / 4 * 1.001;
    }
    CHECK(n_mid > 3); /* the ramp */
    model_config_free(&c);
    const char *yarn2 =
        "{\"model_type\":\"qwen3\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rope_parameters\":{\"rope_type\":"
        "\"yarn\","
        "\"rope_theta\":10000.0,\"factor\":2.0,\"attention_factor\":1.5}}";
    CHECK_EQ_INT(model_config_parse(yarn2, NULL, "c.json", &c, &err), CAIRN_OK);
    CHECK_NEAR(c.rope_attn_factor, 1.5, 0);
    CHECK_EQ_INT(c.rope_orig_max_position, 4096); /* defaults to max_position_embeddings */
    model_config_free(&c);

    /* qwen2: qkv bias without attention_bias in the file. */
    const char *q2 =
        "{\"model_type\":\"qwen2\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":1,\"num_attention_heads\":2}";
    CHECK_EQ_INT(model_config_parse(q2, NULL, "c.json", &c, &err), CAIRN_OK);
    CHECK_EQ_INT(c.attention_bias, 1);
    model_config_free(&c);

    /* text_config nesting, layer_types, MLX quantization with per-module overrides. */
    const char *nested =
        "{\"model_type\":\"qwen3_5\",\"eos_token_id\":4,\"quantization\":{\"group_size\":32,"
        "\"bits\":4,"
        "\"model.layers.0.mlp.down_proj\":{\"group_size\":64,\"bits\":8},"
        "\"model.layers.1.mlp.down_proj\":false},\"text_config\":{\"model_type\":\"qwen3_5_text\","
        "\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":4,"
        "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":64,"
        "\"layer_types\":[\"linear_attention\",\"linear_attention\",\"linear_attention\",\"full_"
        "attention\"],"
        "\"linear_num_value_heads\":4,\"linear_key_head_dim\":32,\"partial_rotary_factor\":0.25,"
        "\"rope_parameters\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"}}}";
    CHECK_EQ_INT(model_config_parse(nested, NULL, "c.json", &c, &err), CAIRN_OK);
    CHECK_EQ_INT(c.arch, MODEL_ARCH_QWEN3_5);
    CHECK_EQ_STR(c.model_type, "qwen3_5_text");
    CHECK_EQ_INT(c.rot_dim, 16);
    CHECK(c.layer_kinds[0] == MODEL_LAYER_LINEAR_ATTN && c.layer_kinds[3] == MODEL_LAYER_ATTN);
    CHECK_EQ_INT(c.linear_num_value_heads, 4);
    CHECK_EQ_INT(c.n_eos, 1);
    int bits, gs;
    CHECK_EQ_INT(model_config_quant_for(&c, "model.layers.0.mlp.down_proj", &bits, &gs), 1);
    CHECK(bits == 8 && gs == 64);
    CHECK_EQ_INT(model_config_quant_for(&c, "model.layers.1.mlp.down_proj", &bits, &gs), 0);
    CHECK_EQ_INT(model_config_quant_for(&c, "model.layers.2.mlp.up_proj", &bits, &gs), 1);
    CHECK(bits == 4 && gs == 32);
    model_config_free(&c);

    /* The hybrid / MoE oracle configs parse with the fields their families will need. */
    char dir[512];
    CHECK_EQ_INT(model_config_load(oracle_dir("qwen3next-tiny", dir, sizeof(dir)), &c, &err),
                 CAIRN_OK);
    CHECK_EQ_INT(c.arch, MODEL_ARCH_QWEN3_NEXT);
    CHECK(c.n_experts == 4 && c.n_experts_per_tok == 2 && c.moe_intermediate_size == 64 &&
          c.shared_expert_intermediate_size == 64 && c.linear_conv_kernel_dim == 4 &&
          c.rot_dim == 16);
    CHECK(c.layer_kinds[0] == MODEL_LAYER_LINEAR_ATTN && c.layer_kinds[1] == MODEL_LAYER_ATTN);
    model_config_free(&c);
    CHECK_EQ_INT(model_config_load(oracle_dir("qwen3-moe-tiny", dir, sizeof(dir)), &c, &err),
                 CAIRN_OK);
    CHECK(c.arch == MODEL_ARCH_QWEN3_MOE && c.n_experts == 8 && c.norm_topk_prob == 1);
    model_config_free(&c);
    CHECK_EQ_INT(model_config_load(oracle_dir("qwen3_5-moe-tiny", dir, sizeof(dir)), &c, &err),
                 CAIRN_OK);
    CHECK(c.arch == MODEL_ARCH_QWEN3_5_MOE && c.n_experts == 4);
    model_config_free(&c);

    /* Other quantization schemes: a clear UNSUPPORTED naming them. */
    CHECK_EQ_INT(model_config_parse(
                     "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
                     "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"quantization_config\":"
                     "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128}}",
                     NULL, "c.json", &c, &err),
                 CAIRN_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "'gptq'") != NULL);
    CHECK_EQ_INT(
        model_config_parse("{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
                           "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"quantization\":"
                           "{\"mode\":\"mxfp4\",\"bits\":4,\"group_size\":32}}",
                           NULL, "c.json", &c, &err),
        CAIRN_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "'mxfp4'") != NULL);

    /* Malformed. */
    CHECK_EQ_INT(model_config_parse("{", NULL, "c.json", &c, &err), CAIRN_ERR_FORMAT);
    CHECK_EQ_INT(model_config_parse("{\"model_type\":\"llama\"}", NULL, "c.json", &c, &err),
                 CAIRN_ERR_FORMAT);
    CHECK(strstr(err.msg, "implausible") != NULL);
    CHECK_EQ_INT(model_config_parse("{\"model_type\":\"llama\",\"vocab_size\":\"x\"}", NULL,
                                    "c.json", &c, &err),
                 CAIRN_ERR_FORMAT);
    CHECK_EQ_INT(model_config_parse(
                     "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,"
                     "\"num_hidden_layers\":1,\"num_attention_heads\":3,\"num_key_value_heads\":2}",
                     NULL, "c.json", &c, &err),
                 CAIRN_ERR_FORMAT);
}

/* MLX bits/group derived from packed shapes when config.json disagrees: still matches the
 * oracle. */
static void test_derived_bits(void)
{
    const char *d =
        make_dir("derived", "llama-tiny-mlx-q4-g64", "\"bits\": 4\n  },\n  \"quantization_config\"",
                 "\"bits\": 8\n  },\n  \"quantization_config\"");
    char src[512], path[600], exp[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", d);
    snprintf(src, sizeof(src), "%s/model.safetensors",
             oracle_dir("llama-tiny-mlx-q4-g64", exp, sizeof(exp)));
    char *abs = realpath(src, NULL);
    CHECK(abs && symlink(abs, path) == 0);
    free(abs);
    snprintf(exp, sizeof(exp), "%s/expected.safetensors",
             oracle_dir("llama-tiny-mlx-q4-g64", src, sizeof(src)));
    struct model *m = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(model_load(d, test_cpu_be(), &m, &err), CAIRN_OK);
    if (!m) return;
    struct model_check_opts o = {.tol = 2e-3,
                                 .kv_dtype = DTYPE_F32,
                                 .chunk = 32,
                                 .block_size = 16,
                                 .modes = MODEL_CHECK_BATCHED};
    struct model_check_result r;
    CHECK_EQ_INT(model_check_run(m, exp, &o, &r, &err), CAIRN_OK);
    CHECK_MSG(r.n_failed == 0 && r.n_runs == 4, "%d failed of %d", r.n_failed, r.n_runs);
    model_free(m);
}

/* llama-tiny rewritten with F32 and F16 weights: same model, must match the oracle. */
static void convert_weights(const char *dir, enum dtype to)
{
    char src[512], path[600];
    snprintf(path, sizeof(path), "%s/model.safetensors",
             oracle_dir("llama-tiny", src, sizeof(src)));
    struct safetensors st;
    struct cairn_err err = {0};
    CHECK_EQ_INT(safetensors_open(path, &st, &err), CAIRN_OK);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct safetensors_writer *w;
    CHECK_EQ_INT(safetensors_writer_open(path, &w, &err), CAIRN_OK);
    for (int i = 0; i < st.n_tensors; i++)
        CHECK_EQ_INT(safetensors_writer_tensor(w, st.tensors[i].name, to, st.tensors[i].n_dims,
                                               st.tensors[i].shape, &err),
                     CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_begin(w, &err), CAIRN_OK);
    for (int i = 0; i < st.n_tensors; i++) {
        const uint16_t *b = (const uint16_t *)st.tensors[i].data;
        uint64_t n = st.tensors[i].n_elems;
        float *f = malloc(sizeof(float) * n);
        uint16_t *h = malloc(sizeof(uint16_t) * n);
        for (uint64_t j = 0; j < n; j++) {
            f[j] = bf16_to_f32(b[j]);
            h[j] = f32_to_f16(f[j]);
        }
        CHECK_EQ_INT(safetensors_writer_write(w,
                                              to == DTYPE_F32 ? (const void *)f : (const void *)h,
                                              n * dtype_size(to), &err),
                     CAIRN_OK);
        free(f);
        free(h);
    }
    CHECK_EQ_INT(safetensors_writer_commit(w, &err), CAIRN_OK);
    safetensors_close(&st);
}

static void test_weight_dtypes(void)
{
    const struct {
        const char *name;
        enum dtype dt;
        double tol;
    } v[] = {{"as-f32", DTYPE_F32, 2e-3}, {"as-f16", DTYPE_F16, 2e-3}};
    char exp[600], src[512];
    snprintf(exp, sizeof(exp), "%s/expected.safetensors",
             oracle_dir("llama-tiny", src, sizeof(src)));
    for (int i = 0; i < 2; i++) {
        const char *d = make_dir(v[i].name, "llama-tiny", NULL, NULL);
        convert_weights(d, v[i].dt);
        struct model *m = NULL;
        struct cairn_err err = {0};
        CHECK_EQ_INT(model_load(d, test_cpu_be(), &m, &err), CAIRN_OK);
        if (!m) continue;
        struct model_check_opts o = {.tol = v[i].tol,
                                     .kv_dtype = DTYPE_F32,
                                     .chunk = 16,
                                     .block_size = 8,
                                     .modes = MODEL_CHECK_BATCHED};
        struct model_check_result r;
        CHECK_EQ_INT(model_check_run(m, exp, &o, &r, &err), CAIRN_OK);
        CHECK_MSG(r.n_failed == 0 && r.n_runs == 4, "%s: %d failed, max %g", v[i].name, r.n_failed,
                  r.max_abs);
        printf("llama-tiny %s weights: max |dlogit| %.3e\n", dtype_name(v[i].dt), r.max_abs);
        model_free(m);
    }
}

static void test_identity(void)
{
    char d1[512], d2[512];
    struct model *a = NULL, *b = NULL, *c = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(model_load(oracle_dir("llama-tiny", d1, sizeof(d1)), test_cpu_be(), &a, &err), CAIRN_OK);
    CHECK_EQ_INT(model_load(d1, test_cpu_be(), &b, &err), CAIRN_OK);
    CHECK_EQ_INT(model_load(oracle_dir("llama-tiny-mlx-q8-g64", d2, sizeof(d2)), test_cpu_be(), &c, &err),
                 CAIRN_OK);
    if (!a || !b || !c) return;
    CHECK(memcmp(model_get_info(a)->identity, model_get_info(b)->identity, 32) == 0);
    CHECK(memcmp(model_get_info(a)->identity, model_get_info(c)->identity, 32) != 0);
    const struct model_info *ia = model_get_info(a), *ic = model_get_info(c);
    CHECK_EQ_INT(ia->n_params, ic->n_params); /* logical parameter count ignores the packing */
    CHECK_EQ_INT(ia->n_params, 2 * 1024 * 128 +
                                   3 * (2 * 128 + 2 * 128 * 128 + 2 * 64 * 128 + 3 * 352 * 128) +
                                   128);
    CHECK(ic->weight_bytes < ia->weight_bytes);
    CHECK_EQ_INT(ia->n_kv_layers, 3);
    CHECK_EQ_INT(ia->n_eos, 1);
    CHECK_EQ_INT(ia->eos_ids[0], 2);
    CHECK_EQ_INT(ia->bos_id, 1);
    CHECK_EQ_STR(ia->model_type, "llama");
    CHECK_EQ_INT(ia->state_bytes, 0);
    model_free(a);
    model_free(b);
    model_free(c);
}

/* Greedy-sums a few forward steps; returns the logits of the last one in out[vocab]. */
static int run_steps(struct model *m, float *out)
{
    const struct model_info *in = model_get_info(m);
    struct kv_pool kv;
    struct cairn_err err = {0};
    if (kv_pool_init(&kv, test_cpu_be(), in->n_kv_layers, 4, 16, in->n_kv_heads, in->head_dim, DTYPE_F32, &err) !=
        CAIRN_OK)
        return -1;
    int32_t table[4] = {3, 1, 2, 0}, toks[5] = {1, 5, 9, 200, 7};
    int rc = model_reserve(m, 8, &err);
    struct model_seq s = {.tokens = toks,
                          .n_tokens = 5,
                          .pos0 = 0,
                          .block_table = table,
                          .n_logits = 1,
                          .logits = out};
    if (rc == CAIRN_OK) rc = model_forward(m, kv_pool_view(&kv), &s, 1, &err);
    kv_pool_free(&kv);
    return rc;
}

static void test_synth_roundtrip(void)
{
    char cfg[512], dir[512], tokdir[512];
    snprintf(cfg, sizeof(cfg), "%s/config.json", oracle_dir("qwen2-tiny", dir, sizeof(dir)));
    snprintf(tokdir, sizeof(tokdir), "%s/tok", tmp_dir);
    struct cairn_err err = {0};
    cairn_mkdir_p(tokdir, &err);
    char tpath[600];
    snprintf(tpath, sizeof(tpath), "%s/tokenizer.json", tokdir);
    CHECK_EQ_INT(cairn_file_write_atomic(tpath, "{\"model\":{}}", 12, &err), CAIRN_OK);
    const struct {
        const char *name;
        int bits, gs;
        uint64_t seed;
    } v[] = {{"s-bf16-1", 0, 64, 1},
             {"s-bf16-2", 0, 64, 2},
             {"s-q4-1", 4, 64, 1},
             {"s-q8-1", 8, 32, 1},
             {"s-q3-g128", 3, 128, 1}};
    const double min_corr[5] = {0, 0, 0.8, 0.99, 0.5}; /* sanity: the oracle checks exactness */
    uint8_t ids[5][32];
    float *logits[5];
    for (int i = 0; i < 5; i++) {
        char out[512];
        snprintf(out, sizeof(out), "%s/%s", tmp_dir, v[i].name);
        struct model_synth_opts o = {.config_path = cfg,
                                     .out_dir = out,
                                     .tokenizer_dir = tokdir,
                                     .bits = v[i].bits,
                                     .group_size = v[i].gs,
                                     .seed = v[i].seed};
        CHECK_MSG(model_synth(&o, &err) == CAIRN_OK, "%s", err.msg);
        snprintf(tpath, sizeof(tpath), "%s/tokenizer.json", out);
        CHECK(cairn_file_exists(tpath));
        struct model *m = NULL;
        logits[i] = calloc(1024, sizeof(float));
        CHECK_MSG(model_load(out, test_cpu_be(), &m, &err) == CAIRN_OK, "%s", err.msg);
        if (!m) continue;
        memcpy(ids[i], model_get_info(m)->identity, 32);
        CHECK_EQ_INT(run_steps(m, logits[i]), CAIRN_OK);
        double ss = 0;
        for (int j = 0; j < 1024; j++)
            ss += (double)logits[i][j] * logits[i][j];
        CHECK_MSG(isfinite(ss) && ss > 1e-3 && ss < 1e8, "%s: logits sum of squares %g", v[i].name,
                  ss);
        model_free(m);
    }
    CHECK(memcmp(ids[0], ids[1], 32) != 0); /* another seed, another identity */
    CHECK(memcmp(ids[0], ids[2], 32) != 0);
    /* Quantized versions of the same weights give nearby logits: correlation with bf16. */
    for (int q = 2; q < 5; q++) {
        double sab = 0, saa = 0, sbb = 0;
        for (int j = 0; j < 1024; j++) {
            sab += (double)logits[0][j] * logits[q][j];
            saa += (double)logits[0][j] * logits[0][j];
            sbb += (double)logits[q][j] * logits[q][j];
        }
        double corr = sab / sqrt(saa * sbb);
        CHECK_MSG(corr > min_corr[q], "%s: correlation with bf16 %g", v[q].name, corr);
        printf("synth %s: logit correlation with bf16 %.4f\n", v[q].name, corr);
    }
    float *logits0 = logits[0];
    for (int i = 1; i < 5; i++)
        free(logits[i]);
    /* Same seed twice: identical file, identical identity. */
    char out[512];
    snprintf(out, sizeof(out), "%s/s-bf16-1b", tmp_dir);
    struct model_synth_opts o = {.config_path = cfg, .out_dir = out, .seed = 1, .group_size = 64};
    CHECK_EQ_INT(model_synth(&o, &err), CAIRN_OK);
    struct model *m = NULL;
    CHECK_EQ_INT(model_load(out, test_cpu_be(), &m, &err), CAIRN_OK);
    if (m) CHECK(memcmp(ids[0], model_get_info(m)->identity, 32) == 0);
    model_free(m);
    /* Sharded like a real big checkpoint: same tensors, same identity, same logits. */
    snprintf(out, sizeof(out), "%s/s-bf16-1-sharded", tmp_dir);
    o.out_dir = out;
    o.shard_bytes = 200 << 10;
    CHECK_EQ_INT(model_synth(&o, &err), CAIRN_OK);
    char ipath[600];
    snprintf(ipath, sizeof(ipath), "%s/model.safetensors.index.json", out);
    CHECK(cairn_file_exists(ipath));
    int n_shards = 0;
    DIR *dh = opendir(out);
    for (struct dirent *de; dh && (de = readdir(dh));)
        n_shards += strncmp(de->d_name, "model-0000", 10) == 0;
    if (dh) closedir(dh);
    CHECK_MSG(n_shards >= 4, "%d shards", n_shards); /* ~1.3 MB in 200 KB pieces */
    m = NULL;
    CHECK_MSG(model_load(out, test_cpu_be(), &m, &err) == CAIRN_OK, "%s", err.msg);
    if (m) {
        CHECK(memcmp(ids[0], model_get_info(m)->identity, 32) == 0);
        float *l = calloc(1024, sizeof(float));
        CHECK_EQ_INT(run_steps(m, l), CAIRN_OK);
        CHECK(memcmp(l, logits0, sizeof(float) * 1024) == 0);
        free(l);
    }
    model_free(m);
    free(logits0);
}

static void test_quantize_row(void)
{
    /* Every bit width packs and unpacks (tensor_row_to_f32) to within half a step. */
    float x[128];
    for (int i = 0; i < 128; i++)
        x[i] = sinf((float)i * 0.37f) * 2.0f;
    for (int bits = 2; bits <= 8; bits++) {
        uint32_t words[32];
        uint16_t sc[4], bi[4];
        model_synth_quantize_row(x, 128, bits, 32, words, sc, bi);
        struct tensor t = {.dtype = DTYPE_Q,
                           .n_dims = 2,
                           .shape = {1, 128},
                           .data = words,
                           .scales = sc,
                           .biases = bi,
                           .bits = bits,
                           .group_size = 32};
        float y[128];
        tensor_row_to_f32(&t, 0, y);
        double worst = 0;
        for (int i = 0; i < 128; i++)
            worst = fmax(worst, fabs((double)y[i] - x[i]) / bf16_to_f32(sc[i / 32]));
        CHECK_MSG(worst <= 0.5 + 0.02 + 1.0 / 64, "bits %d: error %g steps", bits, worst);
    }
}

static void test_forward_args(void)
{
    char d[512];
    struct model *m = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(model_load(oracle_dir("llama-tiny", d, sizeof(d)), test_cpu_be(), &m, &err), CAIRN_OK);
    if (!m) return;
    struct kv_pool kv, bad;
    CHECK_EQ_INT(kv_pool_init(&kv, test_cpu_be(), 3, 2, 16, 2, 32, DTYPE_F32, &err), CAIRN_OK);
    CHECK_EQ_INT(kv_pool_init(&bad, test_cpu_be(), 2, 2, 16, 2, 32, DTYPE_F32, &err), CAIRN_OK);
    int32_t table[2] = {1, 0}, toks[4] = {1, 2, 3, 4}, badtok = 5000, badtable[2] = {0, 7};
    float logits[1024];
    struct model_seq s = {
        .tokens = toks, .n_tokens = 4, .block_table = table, .n_logits = 1, .logits = logits};
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &s, 1, &err), CAIRN_ERR_INVALID); /* no reserve */
    CHECK_EQ_INT(model_reserve(m, 3, &err), CAIRN_OK);
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &s, 1, &err), CAIRN_ERR_LIMIT);
    CHECK_EQ_INT(model_reserve(m, 4, &err), CAIRN_OK);
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&bad), &s, 1, &err), CAIRN_ERR_INVALID);
    CHECK(strstr(err.msg, "geometry") != NULL);
    struct model_seq sb = s;
    sb.tokens = &badtok;
    sb.n_tokens = 1;
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &sb, 1, &err), CAIRN_ERR_INVALID);
    CHECK(strstr(err.msg, "5000") != NULL);
    sb = s;
    sb.pos0 = 14;
    sb.block_table = badtable;
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &sb, 1, &err), CAIRN_ERR_INVALID);
    sb = s;
    sb.n_logits = 5;
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &sb, 1, &err), CAIRN_ERR_INVALID);
    logits[0] = NAN;
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), &s, 1, &err), CAIRN_OK);
    CHECK(isfinite(logits[0]));
    /* Zero-token sequences and n_logits 0 are fine. */
    struct model_seq two[2] = {s, s};
    two[0].n_tokens = 0;
    two[0].n_logits = 0;
    two[1].n_logits = 0;
    CHECK_EQ_INT(model_forward(m, kv_pool_view(&kv), two, 2, &err), CAIRN_OK);
    kv_pool_free(&kv);
    kv_pool_free(&bad);
    model_free(m);
}

int main(void)
{
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/cairn-test-model-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    test_load_errors();
    test_config();
    test_derived_bits();
    test_weight_dtypes();
    test_identity();
    test_synth_roundtrip();
    test_quantize_row();
    test_forward_args();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return test_summary("test_model_load");
}
