/* Tensors: dtypes, read-only tensor views over weights, and scalar conversions.
 *
 * Shapes are row-major like PyTorch: a linear layer's weight is [out, in] (shape[0] = out).
 * MLX affine-quantized weights (DTYPE_Q) keep MLX's layout: `data` holds uint32 words with
 * 32/bits codes each, packed LSB-first along the input dimension, row-major [out, in*bits/32];
 * `scales` and `biases` are bf16 [out, in/group_size]; value = scale * code + bias. */
#ifndef CAIRN_TENSOR_TENSOR_H
#define CAIRN_TENSOR_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dtype {
    DTYPE_F32 = 0,
    DTYPE_F16,
    DTYPE_BF16,
    DTYPE_I32,
    DTYPE_U32,
    DTYPE_I64,
    DTYPE_U8,
    DTYPE_I8,
    DTYPE_Q, /* MLX affine quantized: see bits/group_size */
};

/* Bytes per element (0 for DTYPE_Q, whose size depends on bits). */
size_t dtype_size(enum dtype t);
const char *dtype_name(enum dtype t);

#define TENSOR_MAX_DIMS 4

struct tensor {
    enum dtype dtype;
    int n_dims;
    int64_t shape[TENSOR_MAX_DIMS]; /* logical (dequantized) shape */
    const void *data;               /* not owned: usually points into an mmap'd file */
    const uint16_t *scales;         /* DTYPE_Q: bf16 [shape[0], shape[1] / group_size] */
    const uint16_t *biases;         /* DTYPE_Q: bf16, same shape as scales */
    int bits;                       /* DTYPE_Q: 2..8 */
    int group_size;                 /* DTYPE_Q: 32, 64 or 128 */
    void *be_data;                  /* the backend's own data for this weight (weight_prepare:
                                     * the CPU's packed copy, a GPU's device copy), opaque to all
                                     * but that backend; NULL: the host bytes are used in place */
};

int64_t tensor_n_elems(const struct tensor *t);
/* Dequantizes/converts row `row` of a 2-D tensor (or the whole of a 1-D one, row 0) to f32. */
void tensor_row_to_f32(const struct tensor *t, int64_t row, float *out);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

#endif
