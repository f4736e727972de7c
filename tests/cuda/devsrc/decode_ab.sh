#!/usr/bin/env bash
# One device call for the decode folds of issue 14 (RMSNorm and SwiGLU in the decode GEMV), an
# edited copy of tests/cuda/device_session.sh's decode mode for a source carry: build on the device
# (build.sh), op test with graphs on (off at the end while the budget lasts), tg128 of the 1B and
# 8B (BF16, MLX q4/q8) with the folds on and off in the same call (the 1B also with the norm fold
# alone), then the dense oracle models' parity (run.sh). Logs go to /tmp/res, packed into $OUT.
# usage (device call, from the repository root, carry [DEST]): bash DEST/decode_ab.sh
#   after tests/cuda/devsrc/pack.sh BASE DEST here.
set -u
T0=$SECONDS
BUDGET=${BUDGET_S:-280}
D=$(dirname "$0") # the carry folder (tests/cuda/devsrc/pack.sh DEST, with this script copied in)
# the reference's own bf16 error (run.sh's step 2) while the build runs (no timing matters then)
mkdir -p /tmp/res
(python3 tests/cuda/bf16_reference.py tests/data/oracle/models > /tmp/res/bf16_reference.tsv 2> /tmp/res/bf16_reference.log) &
PR=$!
# build on the device (the carry has room for sources, not binaries: build.sh says how)
bash $D/build.sh > /tmp/res/build.log 2>&1
echo "build: $(tail -1 /tmp/res/build.log) [$((SECONDS - T0)) s]"
grep -E 'failed' /tmp/res/build.log | head -5
[ -x $D/cairn ] || { tar -czf $OUT/res.tgz -C /tmp res bd 2>/dev/null; exit 1; }
export LD_LIBRARY_PATH=$PWD/$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
BIN=$D/cairn
R=/tmp/res
M=/tmp/cairn-bench
mkdir -p $R $M
el() { echo "[$((SECONDS - T0)) s]"; }
left() { [ $((SECONDS - T0)) -lt "$1" ] || { echo "$2: skipped (budget) $(el)"; return 1; }; }
nvidia-smi -L > $R/gpu.txt 2>&1
synth() { [ -d "$M/$1" ] || "$BIN" synth-model --config "$2" --dtype "$3" --out "$M/$1" > "$R/synth-$1.log" 2>&1; }
(synth llama1b-bf16 bench/configs/llama-3.2-1b.json bf16; synth llama8b-q4 bench/configs/llama-3.1-8b.json q4) &
P1=$!
(synth llama8b-bf16 bench/configs/llama-3.1-8b.json bf16) &
P2=$!
(synth llama8b-q8 bench/configs/llama-3.1-8b.json q8) &
P3=$!
ops() {
    CAIRN_CUDA_GRAPHS=$1 timeout 75 $D/test_cuda_ops > $R/ops-g$1.log 2>&1
    echo "test_cuda_ops graphs=$1 rc=$?: $(tail -1 $R/ops-g$1.log) $(el)"
    grep -E "FAIL" $R/ops-g$1.log | head -8
}
ops 1
wait $P1 $P2 $P3
echo "synth done $(el)"
while kill -0 $PR 2>/dev/null && [ $((SECONDS - T0)) -lt 150 ]; do sleep 2; done
kill $PR 2>/dev/null && echo "bf16_reference.py: stopped (budget)"
echo "bf16 reference: $(wc -l < $R/bf16_reference.tsv) lines $(el)"
b() { # name tag env...
    local n=$1 tag=$2
    shift 2
    env "$@" "$BIN" bench --model "$M/$n" --device cuda -p 512 -n 128 --reps 3 --json > "$R/bench-$n-$tag.json" \
        2> "$R/bench-$n-$tag.err"
    echo "$n $tag: $(grep -o '"pp_tps_median": [0-9.]*\|"tg_tps_median": [0-9.]*\|"decode_roofline_pct_median": [0-9.]*\|"device_copy_gbs": [0-9.]*' \
        "$R/bench-$n-$tag.json" | tr '\n' ' ') $(el)"
}
OFF="CAIRN_CUDA_FUSE_NORM=0 CAIRN_CUDA_FUSE_SILU=0"
for n in llama1b-bf16 llama8b-bf16 llama8b-q4 llama8b-q8; do
    left $BUDGET "$n" || break
    b $n fold X=1
    b $n nofold $OFF
    [ $n = llama1b-bf16 ] && b $n norm-only CAIRN_CUDA_FUSE_SILU=0
done
rest=$((BUDGET + 25 - (SECONDS - T0)))
[ $rest -gt 110 ] && rest=110
if [ $rest -gt 30 ]; then
    mkdir -p $R/run
    CAIRN_CUDA_MODELS="llama-tiny llama-tiny-mlx-q4-g64 llama-tiny-mlx-q8-g64 llama31-rope-tiny qwen2-tiny qwen2-tiny-mlx-q4-g64 qwen3-tiny qwen3-tiny-mlx-q4-g64 qwen3-tiny-mlx-q8-g64 llama-medium llama-tiny-mlx-q4-g32 llama-medium-mlx-q4-g64" \
        CAIRN_BF16_REF=$R/bf16_reference.tsv CAIRN_BUILD=$D CAIRN_BIN=$BIN OUT=$R/run timeout $rest bash tests/cuda/run.sh --no-op-test > $R/run.log 2>&1
    echo "run.sh rc=$? $(el)"
    grep -v '^ ' $R/run/summary.txt 2>/dev/null | head -60
else
    echo "run.sh: skipped (budget) $(el)"
fi
left $((BUDGET + 5)) bench-gemv && timeout 30 $D/test_cuda_ops --bench-gemv > $R/bench-gemv.log 2>&1 &&
    grep -E '^(device|fused|gemv .* n=1:)' $R/bench-gemv.log
left $((BUDGET + 10)) ops-g0 && ops 0
tar -czf $OUT/res.tgz -C /tmp res bd/link.err 2>/dev/null
cp $R/ops-g1.log $OUT/ops-g1.log 2>/dev/null
cp $R/run/summary.txt $OUT/run-summary.txt 2>/dev/null
cp $R/bf16_reference.tsv $OUT/bf16_reference.tsv 2>/dev/null
echo "done $(el)"
