/* synth-model: writes a random-weight checkpoint for any supported config, in the same on-disk
 * layout as a real one (config.json + model.safetensors, HF tensor names; MLX affine layout
 * with "quantization" in config.json for q4/q8), tokenizer files copied in.
 *
 * Tensors are generated and streamed one after another (a quantized tensor's scales/biases are
 * the only thing buffered), so an 8B checkpoint needs a few tens of MB of RAM. Values are
 * normal * 1/sqrt(in) for linears, 1 for norm weights, so activations stay sane. Each tensor's
 * values depend only on (seed, tensor name). */
#ifndef CAIRN_MODEL_SYNTH_H
#define CAIRN_MODEL_SYNTH_H

#include <stdint.h>

#include "base/status.h"

struct model_synth_opts {
    const char *config_path;   /* a config.json (any supported architecture) */
    const char *out_dir;       /* created if missing */
    const char *tokenizer_dir; /* tokenizer*.json etc. copied from here; NULL: none */
    int bits;                  /* 0: BF16; 4 or 8 (2..8): MLX affine */
    int group_size;            /* MLX group size (32, 64, 128) */
    uint64_t seed;
    uint64_t shard_bytes;      /* 0: one model.safetensors; else shards of at most this size
                                  (model-0000k-of-0000n.safetensors + index), as real checkpoints */
};

int model_synth(const struct model_synth_opts *o, struct cairn_err *err);

/* Quantizes one row of n floats (n % group_size == 0) MLX-style: per group scale =
 * (max - min) / (2^bits - 1), bias = min; codes packed LSB-first into n*bits/32 words. */
void model_synth_quantize_row(const float *x, int64_t n, int bits, int group_size, uint32_t *words,
                              uint16_t *scales, uint16_t *biases);

#endif
