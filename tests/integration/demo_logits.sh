#!/usr/bin/env bash
# The bundled demo model through cairn's forward pass matches the float32 reference logits
# written by scripts/demo-model/train.py export (tests/data/demo/expected.safetensors).
# Env: CAIRN_BIN (built cairn), CAIRN_SRC (repo root). Needs `cairn check-logits`.
set -euo pipefail
src=${CAIRN_SRC:?CAIRN_SRC not set}
bin=${CAIRN_BIN:?CAIRN_BIN not set}
exec "$bin" check-logits "$src/models/demo" "$src/tests/data/demo/expected.safetensors"
