#!/usr/bin/env bash
# Tensor parallel through NCCL on ONE GPU (issue 23; the lent machines of this session had one):
# `check-logits --device cuda --tensor-parallel 1` with CAIRN_TP_FORCE=1 takes the sharded path
# (an NCCL communicator of one rank created with the bounded non-blocking start-up, NVLS off,
# the identity shard plan, an ncclAllReduce after every sub-layer, the rank on its own thread)
# and must print the same per-case lines (max |dlogit| and greedy counts) as the plain path:
# a world of one sums nothing, so any difference is a bug of the path. Then --tensor-parallel 2
# on a one-GPU machine must exit 2 saying how many GPUs are visible.
# usage: tests/cuda/tp1.sh   Env: CAIRN_BIN (default build-cuda/cairn), OUT (logs).
# Exit: 0 passed, 1 a difference, 77 no GPU (or a build without CUDA).
set -u
cd "${CAIRN_SRC:-$(dirname "$0")/../..}"
BIN=${CAIRN_BIN:-build-cuda/cairn}
LOG=${OUT:-$(mktemp -d /tmp/cairn-tp1.XXXXXX)}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 CAIRN_LOG_LEVEL=warn
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "SKIP: no GPU"; exit 77
fi
if [ ! -x "$BIN" ]; then echo "SKIP: no $BIN (make test-cuda builds it)"; exit 77; fi
M=tests/data/oracle/models
[ -d "$M" ] || M=../shared/oracle/models
fail=0
for m in qwen3-tiny llama-tiny-mlx-q4-g64 qwen2-tiny; do
    args=("$M/$m" "$M/$m/expected.safetensors" --device cuda --kv bf16 --tol 1)
    "$BIN" check-logits "${args[@]}" > "$LOG/$m.plain" 2>&1
    rc_plain=$?
    if grep -q "built without CUDA\|no usable GPU\|no such GPU" "$LOG/$m.plain"; then
        echo "SKIP: $(tail -1 "$LOG/$m.plain")"; exit 77
    fi
    CAIRN_TP_FORCE=1 "$BIN" check-logits "${args[@]}" --tensor-parallel 1 > "$LOG/$m.tp1" 2>&1
    rc_tp=$?
    if ! grep -q "^tensor parallel: 1 ranks on cuda:0" "$LOG/$m.tp1"; then
        echo "FAIL $m: the NCCL path did not run:"; tail -3 "$LOG/$m.tp1"; fail=1; continue
    fi
    if [ $rc_plain != 0 ] || [ $rc_tp != 0 ] ||
        ! diff <(grep '^case' "$LOG/$m.plain") <(grep '^case' "$LOG/$m.tp1") > "$LOG/$m.diff"; then
        echo "FAIL $m: plain rc $rc_plain, tp1 rc $rc_tp; diff:"; head -5 "$LOG/$m.diff"; fail=1
    else
        echo "ok $m: $(grep -c '^case' "$LOG/$m.tp1") case lines equal; $(tail -1 "$LOG/$m.tp1")"
    fi
done
n_gpus=$(nvidia-smi -L | grep -c GPU)
"$BIN" check-logits "$M/qwen3-tiny" "$M/qwen3-tiny/expected.safetensors" --device cuda \
    --tensor-parallel $((n_gpus + 1)) > "$LOG/too_many" 2>&1
rc=$?
if [ $rc != 2 ] || ! grep -q "only $n_gpus visible" "$LOG/too_many"; then
    echo "FAIL: --tensor-parallel $((n_gpus + 1)) on $n_gpus GPU(s): rc $rc:"; tail -2 "$LOG/too_many"; fail=1
else
    echo "ok: $(tail -1 "$LOG/too_many")"
fi
exit $fail
