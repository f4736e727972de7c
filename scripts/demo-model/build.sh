#!/usr/bin/env bash
# Makes the demo model on a machine with a CUDA GPU and PyTorch (5-9 minutes on one H200):
# corpus and tokenizer, training (the model and its MTP head), export as MLX q8, a check of the
# export against HF transformers/tokenizers, and the held-out eval.
#   scripts/demo-model/build.sh WORK OUT
# writes OUT/demo/ (the checkpoint folder for models/demo), OUT/expected.safetensors and
# OUT/expected_mtp.safetensors (for tests/data/demo/) and OUT/eval.json (+ eval_mtp.json: the
# head's k = 1 draft hit rate per category). Settings (environment):
#   MINUTES=5.5 LR=3e-3   training wall time and peak learning rate (the MTP head's: x MTP_LR_MULT=3)
#   INIT=DIR              continue from an exported checkpoint (keeps its tokenizer; a head it
#                         lacks starts from random weights)
#   DIALOGUES=1500000     corpus size
#   EVAL_N=50             held-out prompts per eval category (0: no eval)
#   VERIFY=1              0: skip the check against transformers/tokenizers
# models/demo was made by two runs; see README.md for the exact commands.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?WORK}; out=${2:?OUT}
export PYTHONUNBUFFERED=1
mkdir -p "$work" "$out"
py() { python3 "$here/train.py" "$@"; }
py prep   --work "$work" --dialogues "${DIALOGUES:-1500000}" ${INIT:+--tokenizer "$INIT/tokenizer.json"}
py train  --work "$work" --minutes "${MINUTES:-5.5}" --lr "${LR:-3e-3}" --mtp-lr-mult "${MTP_LR_MULT:-3}" \
          ${INIT:+--init-from "$INIT" --warmup 50}
py export --work "$work" --out "$out/demo" --expected "$out/expected.safetensors" \
          --expected-mtp "$out/expected_mtp.safetensors"
[ "${VERIFY:-1}" = 0 ] || py verify --work "$work" --model "$out/demo"
[ "${EVAL_N:-50}" = 0 ] || py eval --model "$out/demo" --n "${EVAL_N:-50}" --eval-out "$out/eval.json"
