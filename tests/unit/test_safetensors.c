/* safetensors reader and writer: round trip, header validation (each check with the message
 * it must give), sharded sets, crash-safe writer behaviour. */
#include "testlib.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "model/safetensors.h"

static char tmp_dir[256];

/* A file from a header string and n_data bytes of data (0x11 filled). */
static uint8_t *st_build(const char *header, size_t n_data, size_t *size)
{
    size_t hl = strlen(header);
    *size = 8 + hl + n_data;
    uint8_t *b = malloc(*size);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, 0x11, n_data);
    return b;
}

/* Parses header+data and expects failure with `needle` in the message. */
static void st_expect_fail(const char *header, size_t n_data, const char *needle)
{
    size_t size;
    uint8_t *b = st_build(header, n_data, &size);
    struct safetensors st;
    struct cairn_err err = {0};
    int rc = safetensors_parse(b, size, "t.safetensors", &st, &err);
    CHECK_MSG(rc == CAIRN_ERR_FORMAT, "header %s: rc %d", header, rc);
    CHECK_MSG(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    CHECK_MSG(strstr(err.msg, "t.safetensors") != NULL, "message '%s' lacks the file name",
              err.msg);
    if (rc == CAIRN_OK) safetensors_free(&st);
    free(b);
}

static void test_validation(void)
{
    /* A good one first. */
    size_t size;
    uint8_t *b = st_build(
        "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],"
        "\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[16,24]}}",
        24, &size);
    struct safetensors st;
    struct cairn_err err = {0};
    CHECK_EQ_INT(safetensors_parse(b, size, "t.safetensors", &st, &err), CAIRN_OK);
    CHECK_EQ_INT(st.n_tensors, 2);
    const struct safetensors_tensor *a = safetensors_find(&st, "a"),
                                    *bt = safetensors_find(&st, "b");
    CHECK(a && a->dtype_ok && a->dtype == DTYPE_F32 && a->n_dims == 2 && a->n_bytes == 16);
    CHECK(bt && !bt->dtype_ok && bt->n_dims == 0 && bt->n_elems == 1 && bt->n_bytes == 8);
    CHECK(safetensors_find(&st, "c") == NULL);
    CHECK(safetensors_meta_get(&st, "format") &&
          strcmp(safetensors_meta_get(&st, "format"), "pt") == 0);
    safetensors_free(&st);
    free(b);

    /* Too short, header length past the end. */
    uint8_t tiny[5] = {1, 2, 3, 4, 5};
    CHECK_EQ_INT(safetensors_parse(tiny, 5, "t.safetensors", &st, &err), CAIRN_ERR_FORMAT);
    CHECK(strstr(err.msg, "too short") != NULL);
    uint8_t big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK_EQ_INT(safetensors_parse(big, 16, "t.safetensors", &st, &err), CAIRN_ERR_FORMAT);
    CHECK(strstr(err.msg, "header length") != NULL);
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    CHECK_EQ_INT(safetensors_parse(huge, 16, "t.safetensors", &st, &err), CAIRN_ERR_FORMAT);

    st_expect_fail("{\"a\":{\"dtype\":\"F32\",", 0, "header JSON");
    st_expect_fail("[1,2]", 0, "not a JSON object");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                   8, "header JSON");
    st_expect_fail("{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                   "unknown dtype 'Q7'");
    st_expect_fail("{\"a\":{\"dtype\":3,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                   "outside the data area");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,4]}}", 8,
                   "outside the data area");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12,
                   "needs 12");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                   "bad shape");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
                   "bad shape");
    st_expect_fail(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}",
        8, "overflows");
    st_expect_fail(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
        "dims");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                   "data_offsets");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8,
                   "data_offsets");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, "overlap");
    st_expect_fail("{\"a\":[]}", 0, "'a'");
    st_expect_fail("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__");
    st_expect_fail("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "shape");
}

static void test_writer_roundtrip(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/w.safetensors", tmp_dir);
    struct safetensors_writer *w;
    struct cairn_err err = {0};
    CHECK_EQ_INT(safetensors_writer_open(path, &w, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_meta(w, "format", "cairn-test", &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_meta(w, "tokens", "[1,2,3]", &err), CAIRN_OK);
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s3[3] = {2, 2, 2};
    CHECK_EQ_INT(safetensors_writer_tensor(w, "f", DTYPE_F32, 2, s1, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_tensor(w, "h", DTYPE_BF16, 1, s2, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_tensor(w, "u", DTYPE_U32, 3, s3, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_tensor(w, "h", DTYPE_BF16, 1, s2, &err),
                 CAIRN_ERR_INVALID); /* twice */
    CHECK_EQ_INT(safetensors_writer_tensor(w, "q", DTYPE_Q, 1, s2, &err), CAIRN_ERR_INVALID);
    CHECK_EQ_INT(safetensors_writer_begin(w, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_tensor(w, "late", DTYPE_F32, 1, s2, &err), CAIRN_ERR_INVALID);
    float f[15];
    uint16_t h[7];
    uint32_t u[8];
    for (int i = 0; i < 15; i++)
        f[i] = (float)i * 0.5f - 3;
    for (int i = 0; i < 7; i++)
        h[i] = f32_to_bf16((float)i + 0.25f);
    for (int i = 0; i < 8; i++)
        u[i] = 0xdeadbeefu + (uint32_t)i;
    /* in pieces that straddle tensors */
    CHECK_EQ_INT(safetensors_writer_write(w, f, 20, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_write(w, (uint8_t *)f + 20, 40, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_write(w, h, 14, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_write(w, u, 32, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_write(w, u, 1, &err),
                 CAIRN_ERR_INVALID); /* past the declared size */
    CHECK_EQ_INT(safetensors_writer_commit(w, &err), CAIRN_OK);

    struct safetensors st;
    CHECK_EQ_INT(safetensors_open(path, &st, &err), CAIRN_OK);
    CHECK_EQ_INT(st.n_tensors, 3);
    CHECK_EQ_INT(st.data_start % 8, 0);
    const struct safetensors_tensor *tf = safetensors_find(&st, "f"),
                                    *th = safetensors_find(&st, "h"),
                                    *tu = safetensors_find(&st, "u");
    CHECK(tf && tf->dtype == DTYPE_F32 && tf->shape[0] == 3 && tf->shape[1] == 5 &&
          memcmp(tf->data, f, 60) == 0);
    CHECK(th && th->dtype == DTYPE_BF16 && th->n_dims == 1 && memcmp(th->data, h, 14) == 0);
    CHECK(tu && tu->dtype == DTYPE_U32 && tu->n_dims == 3 && memcmp(tu->data, u, 32) == 0);
    CHECK(safetensors_meta_get(&st, "tokens") &&
          strcmp(safetensors_meta_get(&st, "tokens"), "[1,2,3]") == 0);
    safetensors_close(&st);

    /* A writer that fails (too few bytes) or is aborted leaves the old file untouched and no
     * temp file behind. */
    CHECK_EQ_INT(safetensors_writer_open(path, &w, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_tensor(w, "x", DTYPE_F32, 1, s2, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_begin(w, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_write(w, f, 8, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_commit(w, &err), CAIRN_ERR_INVALID);
    CHECK(strstr(err.msg, "8 of 28") != NULL);
    CHECK_EQ_INT(safetensors_writer_open(path, &w, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_tensor(w, "x", DTYPE_F32, 1, s2, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_begin(w, &err), CAIRN_OK);
    safetensors_writer_abort(w);
    CHECK_EQ_INT(safetensors_open(path, &st, &err), CAIRN_OK);
    CHECK_EQ_INT(st.n_tensors, 3);
    safetensors_close(&st);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls %s | grep -c tmp > /dev/null", tmp_dir);
    CHECK(system(cmd) != 0); /* grep found no temp file */

    /* Truncated copy: the last tensor's offsets are now past the end. */
    char *data;
    size_t len;
    CHECK_EQ_INT(cairn_file_read_all(path, 1 << 20, &data, &len, &err), CAIRN_OK);
    char tpath[512];
    snprintf(tpath, sizeof(tpath), "%s/trunc.safetensors", tmp_dir);
    CHECK_EQ_INT(cairn_file_write_atomic(tpath, data, len - 4, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_open(tpath, &st, &err), CAIRN_ERR_FORMAT);
    CHECK(strstr(err.msg, "'u'") != NULL && strstr(err.msg, "trunc.safetensors") != NULL);
    free(data);
    CHECK_EQ_INT(safetensors_open("/nonexistent/x.safetensors", &st, &err), CAIRN_ERR_NOT_FOUND);
}

static void write_shard(const char *name, const char *tensor, float value)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/shards/%s", tmp_dir, name);
    struct safetensors_writer *w;
    struct cairn_err err = {0};
    int64_t s[1] = {4};
    float v[4] = {value, value, value, value};
    CHECK_EQ_INT(safetensors_writer_open(path, &w, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_tensor(w, tensor, DTYPE_F32, 1, s, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_begin(w, &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_write(w, v, sizeof(v), &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_writer_commit(w, &err), CAIRN_OK);
}

static void test_sharded(void)
{
    char dir[512], path[600];
    struct cairn_err err = {0};
    snprintf(dir, sizeof(dir), "%s/shards", tmp_dir);
    CHECK_EQ_INT(cairn_mkdir_p(dir, &err), CAIRN_OK);
    struct safetensors_set set;
    CHECK_EQ_INT(safetensors_set_open(dir, &set, &err), CAIRN_ERR_NOT_FOUND);
    write_shard("model-00001-of-00002.safetensors", "a.weight", 1.0f);
    write_shard("model-00002-of-00002.safetensors", "b.weight", 2.0f);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
                      "\"a.weight\":\"model-00001-of-00002.safetensors\","
                      "\"b.weight\":\"model-00002-of-00002.safetensors\"}}";
    CHECK_EQ_INT(cairn_file_write_atomic(path, idx, strlen(idx), &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_set_open(dir, &set, &err), CAIRN_OK);
    CHECK_EQ_INT(set.n_files, 2);
    CHECK_EQ_INT(set.n_tensors, 2);
    const struct safetensors_tensor *b = safetensors_set_find(&set, "b.weight");
    CHECK(b && ((const float *)b->data)[3] == 2.0f);
    CHECK(b && strcmp(safetensors_set_file_name(&set, b), "model-00002-of-00002.safetensors") == 0);
    CHECK(safetensors_set_find(&set, "c.weight") == NULL);
    safetensors_set_close(&set);

    /* The index names a tensor its shard lacks. */
    idx = "{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\","
          "\"c.weight\":\"model-00002-of-00002.safetensors\"}}";
    CHECK_EQ_INT(cairn_file_write_atomic(path, idx, strlen(idx), &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_set_open(dir, &set, &err), CAIRN_ERR_FORMAT);
    CHECK(strstr(err.msg, "'c.weight'") != NULL && strstr(err.msg, "model-00002-of-00002") != NULL);
    /* A shard path that leaves the folder. */
    idx = "{\"weight_map\":{\"a.weight\":\"../x.safetensors\"}}";
    CHECK_EQ_INT(cairn_file_write_atomic(path, idx, strlen(idx), &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_set_open(dir, &set, &err), CAIRN_ERR_FORMAT);
    CHECK(strstr(err.msg, "../x.safetensors") != NULL);
    /* A missing shard. */
    idx = "{\"weight_map\":{\"a.weight\":\"model-00003-of-00002.safetensors\"}}";
    CHECK_EQ_INT(cairn_file_write_atomic(path, idx, strlen(idx), &err), CAIRN_OK);
    CHECK_EQ_INT(safetensors_set_open(dir, &set, &err), CAIRN_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "model-00003-of-00002.safetensors") != NULL);
}

int main(void)
{
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/cairn-test-st-XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    test_validation();
    test_writer_roundtrip();
    test_sharded();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return test_summary("test_safetensors");
}
