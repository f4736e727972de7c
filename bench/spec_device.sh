#!/usr/bin/env bash
# One device call for speculative decoding (issue 20): continues the demo model's training with
# the copy-and-edit corpus and its MTP head (scripts/demo-model/build.sh, INIT=models/demo), packs
# the result into $OUT/model.tgz (demo/, expected.safetensors, expected_mtp.safetensors), then runs
# bench/spec_decode.py on the GPU with the new model (off / ngram / mtp on the held-out
# copy-and-edit prompts), and checks the export against transformers if time is left.
#   BIN_DIR=.devcarry-spec OUT=DIR BUDGET_S=225 bench/spec_device.sh
# Env: MINUTES (training wall time, default 1.7), LR (6e-4), MTP_LR_MULT (5), DIALOGUES (800000),
# RUNS (bench runs per mode, 3). BIN_DIR holds cairn (a CUDA build, maybe gzip'ed) and the
# shared libraries the device lacks (as tests/cuda/device_session.sh).
set -u
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-.devcarry}
OUT=${OUT:-$(mktemp -d)}
BUDGET_S=${BUDGET_S:-225}
for z in "$BIN_DIR"/*.gz; do [ -f "$z" ] && gunzip -f "$z"; done
chmod +x "$BIN_DIR/cairn"
export LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" NCCL_NVLS_ENABLE=0
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
W=/tmp/spec-work O=/tmp/spec-out
INIT=models/demo MINUTES=${MINUTES:-1.7} LR=${LR:-6e-4} MTP_LR_MULT=${MTP_LR_MULT:-5} DIALOGUES=${DIALOGUES:-800000} \
    EVAL_N=0 VERIFY=0 scripts/demo-model/build.sh "$W" "$O" > "$OUT/build.log" 2>&1
echo "build rc=$? at $(el)s"
grep -E "dialogues,|weights from|step [0-9]*00 |done:|case[0-9]|wrote" "$OUT/build.log" | tail -16
tar czf "$OUT/model.tgz" -C "$O" demo expected.safetensors expected_mtp.safetensors && ls -la "$OUT/model.tgz"
CAIRN_BIN=$BIN_DIR/cairn python3 bench/spec_decode.py --model "$O/demo" --prompts bench/spec_copy_prompts.json \
    --modes off,ngram,mtp --runs "${RUNS:-3}" --gen 300 --device cuda --json "$OUT/bench-gpu.json" \
    > "$OUT/bench-gpu.txt" 2>&1
echo "bench rc=$? at $(el)s"
cat "$OUT/bench-gpu.txt" | tail -22
if [ "$(el)" -lt $((BUDGET_S - 40)) ]; then
    timeout $((BUDGET_S - $(el) - 5)) python3 scripts/demo-model/train.py verify --work "$W" --model "$O/demo" \
        > "$OUT/verify.log" 2>&1
    echo "verify rc=$? at $(el)s"
    grep -E "tokenizer:|chat template|logits vs" "$OUT/verify.log"
else
    echo "verify: not run (no time left at $(el)s)"
fi
