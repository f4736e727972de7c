/* dtype helpers and the scalar dequantizer every backend is checked against. */
#include "tensor/tensor.h"

#include <math.h>

size_t dtype_size(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: case DTYPE_I32: case DTYPE_U32: return 4;
    case DTYPE_F16: case DTYPE_BF16: return 2;
    case DTYPE_I64: return 8;
    case DTYPE_U8: case DTYPE_I8: return 1;
    case DTYPE_Q: return 0;
    }
    return 0;
}

const char *dtype_name(enum dtype t)
{
    static const char *const names[] = {"F32", "F16", "BF16", "I32", "U32", "I64", "U8", "I8", "Q"};
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

int64_t tensor_n_elems(const struct tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, mant = h & 1023;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            float f = ldexpf((float)mant, -24);
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 255) - 127 + 15;
    uint32_t mant = u & 0x7fffff;
    if (((u >> 23) & 255) == 255) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

void tensor_row_to_f32(const struct tensor *t, int64_t row, float *out)
{
    int64_t cols = t->n_dims >= 2 ? t->shape[t->n_dims - 1] : t->shape[0];
    switch (t->dtype) {
    case DTYPE_F32: memcpy(out, (const float *)t->data + row * cols, (size_t)cols * 4); break;
    case DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)t->data + row * cols;
        for (int64_t i = 0; i < cols; i++) out[i] = bf16_to_f32(p[i]);
        break;
    }
    case DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)t->data + row * cols;
        for (int64_t i = 0; i < cols; i++) out[i] = f16_to_f32(p[i]);
        break;
    }
    case DTYPE_Q: {
        int bits = t->bits, gs = t->group_size;
        int64_t words_per_row = cols * bits / 32, groups = cols / gs;
        const uint32_t *w = (const uint32_t *)t->data + row * words_per_row;
        const uint16_t *sc = t->scales + row * groups, *bi = t->biases + row * groups;
        uint32_t mask = (1u << bits) - 1;
        for (int64_t i = 0; i < cols; i++) {
            /* Codes are a little-endian bit stream: code i starts at bit i*bits. */
            int64_t bit = i * bits;
            uint64_t word = w[bit / 32];
            if ((bit % 32) + bits > 32) word |= (uint64_t)w[bit / 32 + 1] << 32;
            uint32_t code = (uint32_t)(word >> (bit % 32)) & mask;
            out[i] = bf16_to_f32(sc[i / gs]) * (float)code + bf16_to_f32(bi[i / gs]);
        }
        break;
    }
    default:
        for (int64_t i = 0; i < cols; i++) out[i] = 0;
        break;
    }
}
