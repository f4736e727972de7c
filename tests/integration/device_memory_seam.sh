#!/usr/bin/env bash
# tests/cuda/serve_memory.sh rehearsed on the CPU, in make test: the device budget without a
# device (CAIRN_TEST_DEVICE_BUDGET=1, the seam of api_real_opts.device_budget), so the KV pool
# sized from --max-device-memory (a predicted block count), the 507s of each API for a prompt
# that can never fit it, and the evictions of idle models for a full context are checked on
# every run, not only on the GPU. Skips (77) where the Qwen3 tokenizer is missing.
set -u
cd "${CAIRN_SRC:-.}"
export CAIRN_BIN="${CAIRN_BIN:-build/cairn}"
export CAIRN_NPM="${CAIRN_NPM:-${CAIRN_SRC:-.}/.deps/npm/node_modules}"
CAIRN_TEST_DEVICE_BUDGET=1 exec bash tests/cuda/serve_memory.sh
