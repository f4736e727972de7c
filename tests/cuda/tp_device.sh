#!/usr/bin/env bash
# One device call for issue 23 on ONE GPU (what the one-GPU kind allows; tests/cuda/tp_multi.sh
# is the multi-GPU one): the NCCL path as a group of one against the plain path,
#   1. tp1.sh: check-logits case lines equal, and --tensor-parallel 2 refused (one GPU visible);
#   2. tp_serve.sh (TP_N=1): serve's greedy text equal through the HTTP API, batched == solo,
#      prefix hit == cold, /api/status sharded;
#   3. the all-reduce's floor: bench --allreduce 4096 --tensor-parallel 1 (one rank: NCCL's
#      per-call cost with nothing to sum), [1, 4096] and [512, 4096].
# Each part runs under its own timeout; the whole stays under ~6 min.
# usage: BIN_DIR=DIR tests/cuda/tp_device.sh   DIR holds cairn(.xz) and lib/ (devpack.sh), and may
# hold copies of this folder's scripts and tests/data/tp/tokenizer.json (a carry folder used
# before the branch is in the device's tree). OUT: where logs go.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
# the tree root: CAIRN_SRC, else tests/cuda/../.. (in the repository), else the current folder
# (a carry folder at the root of the device's tree)
if [ -n "${CAIRN_SRC:-}" ]; then cd "$CAIRN_SRC"; elif [ -f "$HERE/../../CMakeLists.txt" ]; then cd "$HERE/../.."; fi
SRC=$PWD
BIN_DIR=${BIN_DIR:-$HERE}
case "$BIN_DIR" in /*) ;; *) BIN_DIR=$SRC/$BIN_DIR ;; esac
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
if ls "$BIN_DIR"/*.xz >/dev/null 2>&1; then bash "$HERE/devunpack.sh" "$BIN_DIR"; fi
export LD_LIBRARY_PATH="$BIN_DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" NCCL_NVLS_ENABLE=0
BIN=$BIN_DIR/cairn
TOK=$HERE/tokenizer.json
[ -f "$TOK" ] || TOK=$SRC/tests/data/tp/tokenizer.json
rc=0
t0=$(date +%s)
CAIRN_SRC=$SRC CAIRN_BIN=$BIN OUT=$OUT/tp1 timeout 150 bash "$HERE/tp1.sh" > "$OUT/tp1.log" 2>&1
r=$?; echo "tp1.sh rc=$r ($(($(date +%s) - t0)) s)"; cat "$OUT/tp1.log"; [ $r = 0 ] || [ $r = 77 ] || rc=1
t0=$(date +%s)
CAIRN_SRC=$SRC CAIRN_BIN=$BIN OUT=$OUT/serve TP_TOKENIZER=$TOK timeout 200 bash "$HERE/tp_serve.sh" \
    > "$OUT/tp_serve.log" 2>&1
r=$?; echo "tp_serve.sh rc=$r ($(($(date +%s) - t0)) s): $(grep -c '^ok' "$OUT/tp_serve.log") ok"
grep -v '^ok' "$OUT/tp_serve.log" | head -20; [ $r = 0 ] || [ $r = 77 ] || rc=1
for rows in 1 512; do
    CAIRN_TP_FORCE=1 timeout 60 "$BIN" bench --allreduce 4096 -p $rows --tensor-parallel 1 --device cuda -n 200 \
        --reps 5 2>&1 | tail -1
done
exit $rc
