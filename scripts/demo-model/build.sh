#!/usr/bin/env bash
# Makes the demo model on a machine with a CUDA GPU and PyTorch (5-9 minutes on one H200):
# corpus and tokenizer, training, export as MLX q8, a check of the export against HF
# transformers/tokenizers, and the held-out eval.
#   scripts/demo-model/build.sh WORK OUT
# writes OUT/demo/ (the checkpoint folder for models/demo), OUT/expected.safetensors (for
# tests/data/demo/) and OUT/eval.json. Settings (environment):
#   MINUTES=5.5 LR=3e-3   training wall time and peak learning rate
#   INIT=DIR              continue from an exported checkpoint (keeps its tokenizer)
#   EVAL_N=50             held-out prompts per eval category
# models/demo was made by two runs; see README.md for the exact commands.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?WORK}; out=${2:?OUT}
export PYTHONUNBUFFERED=1
mkdir -p "$work" "$out"
py() { python3 "$here/train.py" "$@"; }
py prep   --work "$work" --dialogues 1500000 ${INIT:+--tokenizer "$INIT/tokenizer.json"}
py train  --work "$work" --minutes "${MINUTES:-5.5}" --lr "${LR:-3e-3}" ${INIT:+--init-from "$INIT" --warmup 50}
py export --work "$work" --out "$out/demo" --expected "$out/expected.safetensors"
py verify --work "$work" --model "$out/demo"
py eval   --model "$out/demo" --n "${EVAL_N:-50}" --eval-out "$out/eval.json"
