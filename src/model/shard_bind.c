/* Binding a tensor-parallel rank's share of each weight (model_load_shard; rules in shard.h).
 *
 * The whole tensor is bound first (model_bind_spec: the loader's name, shape, dtype and MLX
 * checks run on the checkpoint as stored), then cut:
 * - column-parallel (SHARD_ROWS) with one contiguous range: a view into the mapping (rows of
 *   F32/BF16 and of MLX codes, scales and biases are contiguous), no copy;
 * - several ranges (MLX stacked experts, DeltaNet q|k|v, qwen3_next's per-key-head packing):
 *   the rows gathered into an owned copy;
 * - row-parallel (SHARD_COLS): each row's column range copied out (owned); MLX weights only at
 *   whole quantization groups (shard_check_cols).
 * Vectors (biases, conv1d, A_log, dt_bias) are gathered on the host before their upload. A
 * row-parallel bias goes to rank 0 only. Owned copies are host memory freed with the model; the
 * backend's weight_prepare then sees an ordinary tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_int.h"
#include "model/shard.h"

/* Copies the rule's rows (units of unit_bytes) of src, in rule order, to dst. */
static void shard_gather(const struct shard_rule *r, const uint8_t *src, size_t unit_bytes,
                         uint8_t *dst)
{
    for (int64_t c = 0; c < r->count; c++)
        for (int i = 0; i < r->n_pieces; i++) {
            size_t bytes = (size_t)r->piece[i].len * unit_bytes;
            memcpy(dst, src + (size_t)(r->base + c * r->stride + r->piece[i].off) * unit_bytes,
                   bytes);
            dst += bytes;
        }
}

/* The rule's rows of a [full, row_bytes] array: a view when one range, else an owned gather. */
static const void *shard_rows(struct model *m, const struct shard_rule *r, const void *src,
                              size_t row_bytes)
{
    if (r->count == 1 && r->n_pieces == 1)
        return (const uint8_t *)src + (size_t)r->piece[0].off * row_bytes;
    uint8_t *dst = model_alloc_owned(m, (size_t)r->local * row_bytes);
    if (dst) shard_gather(r, src, row_bytes, dst);
    return dst;
}

/* Bytes [off, off + len) of each of n_rows rows of row_bytes, into an owned copy. */
static const void *shard_cols(struct model *m, const void *src, int64_t n_rows, size_t row_bytes,
                              size_t off, size_t len)
{
    uint8_t *dst = model_alloc_owned(m, (size_t)n_rows * len);
    if (!dst) return NULL;
    for (int64_t i = 0; i < n_rows; i++)
        memcpy(dst + (size_t)i * len, (const uint8_t *)src + (size_t)i * row_bytes + off, len);
    return dst;
}

static int shard_slice_linear(struct model *m, const struct shard_rule *r, const char *name,
                              struct tensor *t, struct cairn_err *err)
{
    int64_t rows = t->shape[0], cols = t->shape[1];
    int q = t->dtype == DTYPE_Q;
    size_t data_row = q ? (size_t)(cols * t->bits / 8) : (size_t)cols * dtype_size(t->dtype);
    size_t group_row = q ? (size_t)(cols / t->group_size) * 2 : 0;
    if (r->kind == SHARD_ROWS) {
        t->data = shard_rows(m, r, t->data, data_row);
        if (q) {
            t->scales = shard_rows(m, r, t->scales, group_row);
            t->biases = shard_rows(m, r, t->biases, group_row);
        }
        t->shape[0] = r->local;
    } else {
        CAIRN_ASSERT(r->count == 1 && r->n_pieces == 1);
        int64_t off = r->piece[0].off, len = r->piece[0].len;
        if (q) {
            int rc = shard_check_cols(name, off, len, t->group_size, t->bits, err);
            if (rc != CAIRN_OK) return rc;
            size_t go = (size_t)(off / t->group_size) * 2, gl = (size_t)(len / t->group_size) * 2;
            t->data = shard_cols(m, t->data, rows, data_row, (size_t)(off * t->bits / 8),
                                 (size_t)(len * t->bits / 8));
            t->scales = shard_cols(m, t->scales, rows, group_row, go, gl);
            t->biases = shard_cols(m, t->biases, rows, group_row, go, gl);
        } else {
            size_t es = dtype_size(t->dtype);
            t->data = shard_cols(m, t->data, rows, data_row, (size_t)off * es, (size_t)len * es);
        }
        t->shape[1] = len;
    }
    if (!t->data || (q && (!t->scales || !t->biases)))
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory cutting its shard", name);
    return CAIRN_OK;
}

/* Vector `name` of `rows` floats: the rule's entries (rule NULL: all) uploaded to *out. */
static int shard_bind_vector(struct model *m, const struct shard_rule *r, const char *name,
                             int64_t rows, int optional, int flat, float **out,
                             struct cairn_err *err)
{
    float *v = NULL;
    *out = NULL;
    int rc = model_vector_host(m, name, rows, optional, flat, &v, err);
    if (rc != CAIRN_OK || !v) return rc;
    size_t n = (size_t)rows;
    float *local = v;
    if (r) {
        n = (size_t)r->local;
        local = malloc(sizeof(float) * (n ? n : 1));
        if (local) shard_gather(r, (const uint8_t *)v, sizeof(float), (uint8_t *)local);
    }
    *out = local ? model_dev_vector(m, local, n, err) : NULL;
    if (!local) cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", name);
    if (local != v) free(local);
    free(v);
    if (!*out) {
        cairn_err_prefix(err, "%s", name);
        return err ? err->status : CAIRN_ERR_NOMEM;
    }
    return CAIRN_OK;
}

int shard_bind_spec(struct model *m, const struct shard_plan *p, const struct model_wspec *s,
                    struct cairn_err *err)
{
    struct shard_rule r;
    int linear = s->kind == MODEL_WSPEC_LINEAR;
    int rc = shard_rule_for(p, &m->cfg, s->name, s->rows, linear ? s->cols : 1, &r, err);
    if (rc != CAIRN_OK) return rc;
    if (r.kind == SHARD_REPLICATED) return model_bind_spec(m, s, err);
    if (!linear)
        return shard_bind_vector(m, &r, s->name, s->rows, s->optional, s->flat, s->vec, err);
    struct model_wspec whole = *s;
    whole.bias = MODEL_BIAS_NONE;
    rc = model_bind_spec(m, &whole, err);
    if (rc != CAIRN_OK || !s->lin->w.data) return rc;
    rc = shard_slice_linear(m, &r, s->name, &s->lin->w, err);
    if (rc != CAIRN_OK || s->bias == MODEL_BIAS_NONE) return rc;
    char name[200];
    snprintf(name, sizeof(name), "%s.bias", s->name);
    int optional = s->bias == MODEL_BIAS_OPTIONAL;
    if (r.kind == SHARD_ROWS)
        return shard_bind_vector(m, &r, name, s->rows, optional, 0, &s->lin->bias, err);
    /* row-parallel: the partial sums are all-reduced, so only rank 0 adds the bias */
    if (p->rank != 0) return CAIRN_OK;
    return shard_bind_vector(m, NULL, name, s->rows, optional, 0, &s->lin->bias, err);
}
