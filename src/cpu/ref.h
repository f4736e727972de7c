/* Scalar reference kernels (internal to cpu/). Row/token ranges let the pool split work. */
#ifndef CAIRN_CPU_REF_H
#define CAIRN_CPU_REF_H

#include "cpu/cpu.h"

/* Rows [row_begin, row_end) of y = x · W^T; row_buf holds one dequantized row (in floats). */
void ref_matmul(const struct tensor *w, const float *x, float *y, int n, int64_t row_begin,
                int64_t row_end, float *row_buf);
void ref_embed(const struct tensor *w, const int32_t *ids, int n, float *out);
void ref_rmsnorm(float *y, const float *x, const float *w, int n_rows, int dim, float eps,
                 float w_offset);
void ref_rope(float *x, int n_tokens, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
              const float *inv_freq);
void ref_silu_mul(float *out, const float *gate, const float *up, int64_t n);
void ref_kv_store(const struct backend_kv_view *kv, int layer, const int32_t *slots, int n_tokens,
                  const float *k, const float *v);
/* Query head h of token t; acc holds head_dim floats. */
void ref_attention_head(const struct cpu_attn *a, int t, int h, float *acc);
/* Query tokens [t_begin, t_end); scratch holds head_dim floats. */
void ref_attention(const struct cpu_attn *a, int t_begin, int t_end, float *scratch);

#endif
