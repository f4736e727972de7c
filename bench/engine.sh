#!/usr/bin/env bash
# Engine benchmark on a Qwen3-0.6B-shaped synthetic model (random weights, kept out of git):
# aggregate decode tok/s with 1, 4 and 16 concurrent sequences, prefill time saved by a
# 90%-cached prompt, and (with BLOCK_SIZES) decode speed per KV block size.
#   bench/engine.sh                      # uses build/cairn, model in /tmp/q06
#   CAIRN_BIN=... MODEL_DIR=... BLOCK_SIZES=16,32,64,128 bench/engine.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CAIRN_BIN:-build/cairn}
MODEL_DIR=${MODEL_DIR:-/tmp/q06}
CONFIG=${CONFIG:-bench/configs/qwen3-0.6b.json}
if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
    "$BIN" synth-model --config "$CONFIG" --out "$MODEL_DIR"
fi
args=(--model "$MODEL_DIR" --prompt "${PROMPT:-128}" --gen "${GEN:-64}"
      --concurrency "${CONCURRENCY:-1,4,16}" --prefix-len "${PREFIX_LEN:-1024}")
if [ -n "${BLOCK_SIZES:-}" ]; then
    args+=(--block-sizes "$BLOCK_SIZES" --sweep-prompt "${SWEEP_PROMPT:-1024}")
fi
exec "$BIN" bench-engine "${args[@]}"
