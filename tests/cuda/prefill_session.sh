#!/usr/bin/env bash
# One device call for the prefill work of issue 14 (binaries built elsewhere, as
# device_session.sh): the op test, then cairn bench --device cuda prefill figures of this build
# against an earlier one (OLD, e.g. main's), on the 1B and 8B shapes (BF16, MLX q8/q4),
# with CAIRN_CUDA_ATTN=tiled (the f32 attention) and CAIRN_CUDA_PROFILE=1 (GPU time by op kind).
#   tests/cuda/prefill_session.sh bench    op test + the benchmarks
#   tests/cuda/prefill_session.sh check    op test + check-logits on the dense oracle models and
#                                          the demo model, this build beside OLD
# Env: BIN_DIR (cairn, test_cuda_ops, cairn_old, each possibly NAME.gz, lib/), OUT, MODELS,
# BUDGET_S (stop starting benchmarks after this many seconds, default 330).
set -u
cd "${CAIRN_SRC:-$(dirname "$0")/../..}"
BIN_DIR=${BIN_DIR:-.devcarry}
OUT=${OUT:-$(mktemp -d)}
MODELS=${MODELS:-/tmp/cairn-bench}
BUDGET_S=${BUDGET_S:-330}
for z in "$BIN_DIR"/*.gz; do [ -f "$z" ] && gunzip -f "$z"; done
export LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
NEW=$BIN_DIR/cairn
OLD=$BIN_DIR/cairn_old
T0=$SECONDS
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
mkdir -p "$MODELS"

ops() {
    "$BIN_DIR/test_cuda_ops" > "$OUT/ops.log" 2>&1
    echo "test_cuda_ops rc=$?: $(tail -1 "$OUT/ops.log")"
    grep -E "FAIL" "$OUT/ops.log" | head -30
}
synth() { # name config dtype
    [ -d "$MODELS/$1" ] && return 0
    local t=$SECONDS
    "$NEW" synth-model --config "$2" --dtype "$3" --out "$MODELS/$1" > "$OUT/synth-$1.log" 2>&1 ||
        { echo "synth $1 failed: $(tail -2 "$OUT/synth-$1.log")"; return 1; }
    echo "synth $1: $((SECONDS - t)) s"
}
b() { # tag binary model prompt reps [env...]
    local tag=$1 bin=$2 m=$3 p=$4 reps=$5
    shift 5
    if [ $((SECONDS - T0)) -gt "$BUDGET_S" ]; then echo "$tag: skipped (budget)"; return; fi
    env "$@" "$bin" bench --model "$MODELS/$m" --device cuda -p "$p" -n 4 --reps "$reps" --json \
        > "$OUT/b-$tag.json" 2> "$OUT/b-$tag.err"
    echo "$tag: $(grep -o '"pp_tps_median": [0-9.]*' "$OUT/b-$tag.json") $(grep 'cuda profile' "$OUT/b-$tag.err" | tr '\n' ';') $(grep -i 'error\|fail' "$OUT/b-$tag.err" | tail -1)"
}

case "${1:-bench}" in
bench)
    ops
    synth llama1b bench/configs/llama-3.2-1b.json bf16 &&
        { b 1b-new-p512 "$NEW" llama1b 512 3; b 1b-old-p512 "$OLD" llama1b 512 3; }
    synth llama8b bench/configs/llama-3.1-8b.json bf16 && {
        b 8b-new-p512 "$NEW" llama8b 512 3
        b 8b-new-p4096 "$NEW" llama8b 4096 3
        b 8b-prof-p4096 "$NEW" llama8b 4096 1 CAIRN_CUDA_PROFILE=1
        b 8b-prof-p512 "$NEW" llama8b 512 1 CAIRN_CUDA_PROFILE=1
        b 8b-tiled-p4096 "$NEW" llama8b 4096 3 CAIRN_CUDA_ATTN=tiled
        b 8b-old-p512 "$OLD" llama8b 512 3
        b 8b-old-p4096 "$OLD" llama8b 4096 2
    }
    rm -rf "$MODELS/llama8b"
    for q in q8 q4; do
        [ $((SECONDS - T0)) -gt "$BUDGET_S" ] && break
        synth llama8b-$q bench/configs/llama-3.1-8b.json $q && {
            b 8b$q-new-p512 "$NEW" llama8b-$q 512 3
            b 8b$q-prof-p512 "$NEW" llama8b-$q 512 1 CAIRN_CUDA_PROFILE=1
            b 8b$q-old-p512 "$OLD" llama8b-$q 512 3
        }
        rm -rf "$MODELS/llama8b-$q"
    done
    ;;
check)
    ops
    # check-logits on every dense oracle model (the fixed 5e-2 of run.sh's fallback; run.sh sets
    # per-model tolerances from the bf16 reference); OLD beside it on the models whose head_dim
    # (64, 128) takes the tensor-core prefill attention
    for dir in tests/data/oracle/models/*/; do
        name=$(basename "$dir")
        case "$name" in *moe*|*next*|qwen3_5*) continue ;; esac
        for kv in bf16 f32; do
            line="$(printf '%-26s kv=%-4s' "$name" "$kv")"
            whiches="new"
            case "$name" in llama-medium*|qwen3-tiny*) whiches="new old" ;; esac # head_dim 128 / 64
            for which in $whiches; do
                bin=$NEW; [ $which = old ] && bin=$OLD
                log="$OUT/check-$name-$kv-$which.log"
                "$bin" check-logits --device cuda "$dir" "$dir/expected.safetensors" --tol 5e-2 --kv $kv > "$log" 2>&1
                rc=$?
                worst=$(sed -n 's/.*max|dlogit|=\([0-9.e+-]*\).*/\1/p' "$log" | sort -g | tail -1)
                mm=$(grep -cE '^case [0-9]+ batched.*mismatch' "$log")
                line="$line  $which: rc=$rc max|dlogit|=${worst:-?} batched-mismatch=$mm"
            done
            echo "$line"
        done
    done
    for kv in bf16 f32; do
        echo "demo kv=$kv: $("$NEW" check-logits --device cuda models/demo tests/data/demo/expected.safetensors --tol 5e-2 --kv $kv 2>&1 | tail -1)"
    done
    ;;
esac
echo "session: $((SECONDS - T0)) s"
