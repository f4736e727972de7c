#!/usr/bin/env bash
# One device call's worth of GPU checks and benchmarks, for a session that built cairn on the
# development machine and carried it to the GPU machine (whose image cannot build cairn: no
# -dev headers, no libmicrohttpd/libutf8proc).
#   tests/cuda/device_session.sh check   op test, run.sh (bf16 reference, check-logits on every
#                                        dense oracle model, batched == solo), demo model parity
#                                        at the demo's own bf16-reference tolerance
#   tests/cuda/device_session.sh final   both of these in one call: op test with graphs on and off,
#                                        run.sh, the demo model, benchmarks while BUDGET_S lasts
#   tests/cuda/device_session.sh decode  the decode work's call: op test (graphs on/off), run.sh, the
#                                        demo, PDL bit-identity, tg128 of 1B and 8B BF16/q4/q8 with
#                                        the models synthesized in the background, a kernel profile
#   tests/cuda/device_session.sh bench   cairn bench --device cuda on the 1B and 8B shapes
#                                        (BF16, MLX q8/q4), synthesized on the device's disk
# Env: BIN_DIR (default .devcarry: cairn, test_cuda_ops, each possibly as NAME.gz, and the
# shared libraries the device lacks), OUT (where logs go; the device tool brings $OUT back), MODELS (default /tmp/cairn-bench).
set -u
cd "$(dirname "$0")/../.."
BIN_DIR=${BIN_DIR:-.devcarry}
OUT=${OUT:-$(mktemp -d)}
MODELS=${MODELS:-/tmp/cairn-bench}
# Binaries may be carried gzip'ed (the working tree plus the carry must stay under 64 MiB).
for z in "$BIN_DIR"/*.gz; do [ -f "$z" ] && gunzip -f "$z"; done
chmod +x "$BIN_DIR/cairn" "$BIN_DIR/test_cuda_ops" 2>/dev/null
export LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
BIN=$BIN_DIR/cairn
nvidia-smi -L > "$OUT/gpu.txt" 2>&1

b() { # name config dtype prompt gen reps
    local dir="$MODELS/$1"
    [ -d "$dir" ] || "$BIN" synth-model --config "$2" --dtype "$3" --out "$dir" > "$OUT/synth-$1.log" 2>&1 ||
        { echo "synth $1 failed: $(tail -2 "$OUT/synth-$1.log")"; return; }
    "$BIN" bench --model "$dir" --device cuda -p "$4" -n "$5" --reps "$6" --json > "$OUT/bench-$1-p$4.json" \
        2> "$OUT/bench-$1-p$4.err"
    echo "$1 p$4 n$5: $(grep -o '"pp_tps_median": [0-9.]*\|"tg_tps_median": [0-9.]*' "$OUT/bench-$1-p$4.json" |
        tr '\n' ' ') $(tail -1 "$OUT/bench-$1-p$4.err")"
}

# The trained demo model (qwen3, MLX q8): GPU logits against the expected ones the CPU tests use,
# at the tolerance the bf16 reference measures for it (bf16_reference.py --one, as run.sh does
# for the oracle models: at least 2e-3; 5e-2 where torch is missing).
demo_tol() {
    local t
    t=$(python3 tests/cuda/bf16_reference.py --one demo models/demo tests/data/demo/expected.safetensors \
        2> "$OUT/bf16_reference_demo.log" | awk '$1 == "demo" { print $2 }')
    awk -v t="${t:-5e-2}" 'BEGIN { printf "%.3e\n", (t < 2e-3 ? 2e-3 : t) }'
}
demo_check() {
    local tol kv
    tol=$(demo_tol)
    for kv in bf16 f32; do
        echo "demo kv=$kv tol=$tol: $("$BIN" check-logits --device cuda models/demo tests/data/demo/expected.safetensors \
            --tol "$tol" --kv $kv 2>&1 | tail -1)"
    done
}

case "${1:-check}" in
check)
    "$BIN_DIR/test_cuda_ops" > "$OUT/ops.log" 2>&1
    echo "test_cuda_ops rc=$?: $(tail -1 "$OUT/ops.log")"
    grep -E "FAIL|copy" "$OUT/ops.log" | head -40
    mkdir -p "$OUT/run"
    CAIRN_BUILD=$BIN_DIR CAIRN_BIN=$BIN OUT=$OUT/run timeout 360 bash tests/cuda/run.sh --no-op-test \
        > "$OUT/run.log" 2>&1
    echo "run.sh rc=$?"
    cat "$OUT/run/summary.txt" 2>/dev/null
    demo_check
    ;;
final)
    # One call that proves a build: op test with graphs on and off, run.sh's parity checks,
    # the demo model, and the benchmarks while BUDGET_S (default 420) seconds are not spent.
    T0=$SECONDS
    for g in 1 0; do
        CAIRN_CUDA_GRAPHS=$g "$BIN_DIR/test_cuda_ops" > "$OUT/ops-g$g.log" 2>&1
        echo "test_cuda_ops graphs=$g rc=$?: $(tail -1 "$OUT/ops-g$g.log") [$((SECONDS - T0)) s]"
        grep -E "FAIL" "$OUT/ops-g$g.log" | head -20
    done
    mkdir -p "$OUT/run"
    python3 -c 'import openai; print("python openai", openai.__version__)' 2>&1 | tail -1
    CAIRN_BUILD=$BIN_DIR CAIRN_BIN=$BIN OUT=$OUT/run timeout 240 bash tests/cuda/run.sh --no-op-test \
        > "$OUT/run.log" 2>&1
    echo "run.sh rc=$? [$((SECONDS - T0)) s]"
    cat "$OUT/run/summary.txt" 2>/dev/null
    # a model that failed: again with the f32 tiled prefill attention and without graphs
    grep '  FAIL$' "$OUT/run/summary.txt" 2>/dev/null | while read -r name kv tol _; do
        d=tests/data/oracle/models/$name
        for env in CAIRN_CUDA_ATTN=tiled CAIRN_CUDA_GRAPHS=0; do
            echo "  $name $kv $env: $(env $env "$BIN" check-logits --device cuda "$d" "$d/expected.safetensors" \
                --tol "${tol#tol=}" --kv "${kv#kv=}" 2>&1 | tail -1)"
        done
    done
    demo_check
    mkdir -p "$MODELS"
    left() { [ $((SECONDS - T0)) -lt "${BUDGET_S:-420}" ] || { echo "$1: skipped (budget) [$((SECONDS - T0)) s]"; return 1; }; }
    fb() { left "$1 p$4" && b "$@"; echo "  [$((SECONDS - T0)) s]"; }
    fb llama1b-bf16 bench/configs/llama-3.2-1b.json bf16 512 128 3
    fb llama8b-bf16 bench/configs/llama-3.1-8b.json bf16 512 128 3
    fb llama8b-bf16 bench/configs/llama-3.1-8b.json bf16 4096 16 2
    rm -rf "$MODELS/llama8b-bf16"
    fb llama8b-q8 bench/configs/llama-3.1-8b.json q8 512 128 3
    rm -rf "$MODELS/llama8b-q8"
    fb llama8b-q4 bench/configs/llama-3.1-8b.json q4 512 128 3
    ;;
decode)
    # One call for the decode work, inside BUDGET_S (default 260) seconds: the benchmark models
    # are synthesized on the CPU cores in the background while the GPU runs the op test (graphs
    # on and off); then tg128 of the 1B and of the 8B
    # in BF16, MLX q4 and q8 (pp512 too) once the models are there, then the parity checks; last,
    # while the budget lasts, the 1B with the fused ops and PDL off for comparison,
    # PDL on/off bit-identity on one oracle model, and the 1B's GPU time per kernel (ncu).
    T0=$SECONDS
    left() { [ $((SECONDS - T0)) -lt "${BUDGET_S:-260}" ] || { echo "$1: skipped (budget) [$((SECONDS - T0)) s]"; return 1; }; }
    mkdir -p "$MODELS"
    synth() { [ -d "$MODELS/$1" ] || "$BIN" synth-model --config "$2" --dtype "$3" --out "$MODELS/$1" \
        > "$OUT/synth-$1.log" 2>&1; }
    (synth llama1b-bf16 bench/configs/llama-3.2-1b.json bf16; synth llama8b-q4 bench/configs/llama-3.1-8b.json q4) &
    (synth llama8b-bf16 bench/configs/llama-3.1-8b.json bf16) &
    (synth llama8b-q8 bench/configs/llama-3.1-8b.json q8) &
    for g in 1 0; do
        CAIRN_CUDA_GRAPHS=$g timeout 60 "$BIN_DIR/test_cuda_ops" > "$OUT/ops-g$g.log" 2>&1
        echo "test_cuda_ops graphs=$g rc=$?: $(tail -1 "$OUT/ops-g$g.log") [$((SECONDS - T0)) s]"
        grep -E "FAIL" "$OUT/ops-g$g.log" | head -10
    done
    wait
    echo "synth done [$((SECONDS - T0)) s]"
    left 1b && b llama1b-bf16 bench/configs/llama-3.2-1b.json bf16 512 128 3
    left 8b-bf16 && b llama8b-bf16 bench/configs/llama-3.1-8b.json bf16 512 128 3
    left 8b-q4 && b llama8b-q4 bench/configs/llama-3.1-8b.json q4 512 128 3
    left 8b-q8 && b llama8b-q8 bench/configs/llama-3.1-8b.json q8 512 128 3
    for qk in pipelined old; do
        left gemv && echo "q GEMVs n=1, the $qk kernel:" && CAIRN_CUDA_GEMVQ=$qk timeout 20 \
            "$BIN_DIR/test_cuda_ops" --bench-gemv q 2>&1 | grep -E "^gemv Q .*n=1:"
    done
    mkdir -p "$OUT/run"
    CAIRN_BUILD=$BIN_DIR CAIRN_BIN=$BIN OUT=$OUT/run timeout 110 bash tests/cuda/run.sh --no-op-test \
        > "$OUT/run.log" 2>&1
    echo "run.sh rc=$? [$((SECONDS - T0)) s]"
    cat "$OUT/run/summary.txt" 2>/dev/null
    demo_check
    d=tests/data/oracle/models/qwen3-tiny-mlx-q4-g64 # q/k norms, q4 GEMVs
    for p in 1 0; do
        [ -d "$d" ] && echo "pdl=$p $(basename "$d"): $(CAIRN_CUDA_PDL=$p "$BIN" check-logits --device cuda "$d" \
            "$d/expected.safetensors" --tol 1 2>&1 | tail -1)"
    done
    echo "[$((SECONDS - T0)) s]"
    left 1b-unfused && echo "1b fuse=0 pdl=0: $(CAIRN_CUDA_FUSE=0 CAIRN_CUDA_PDL=0 "$BIN" bench --model "$MODELS/llama1b-bf16" \
        --device cuda -p 16 -n 128 --reps 3 --json 2>/dev/null | grep -o '"tg_tps_median": [0-9.]*')"
    left 1b-nopdl && echo "1b fuse=1 pdl=0: $(CAIRN_CUDA_PDL=0 "$BIN" bench --model "$MODELS/llama1b-bf16" \
        --device cuda -p 16 -n 128 --reps 3 --json 2>/dev/null | grep -o '"tg_tps_median": [0-9.]*')"
    if left ncu && command -v ncu > /dev/null; then
        CAIRN_CUDA_GRAPHS=0 timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
            "$BIN" bench --model "$MODELS/llama1b-bf16" --device cuda -p 8 -n 8 --reps 1 > "$OUT/ncu_1b.csv" 2>/dev/null
        python3 tests/cuda/decode_profile.py "$OUT/ncu_1b.csv" 9 | head -16
    fi
    echo "[$((SECONDS - T0)) s]"
    ;;
bench)
    mkdir -p "$MODELS"
    b llama1b-bf16 bench/configs/llama-3.2-1b.json bf16 512 128 3
    b llama8b-bf16 bench/configs/llama-3.1-8b.json bf16 512 128 3
    b llama8b-bf16 bench/configs/llama-3.1-8b.json bf16 4096 16 2
    rm -rf "$MODELS/llama8b-bf16"
    b llama8b-q8 bench/configs/llama-3.1-8b.json q8 512 128 3
    rm -rf "$MODELS/llama8b-q8"
    b llama8b-q4 bench/configs/llama-3.1-8b.json q4 512 128 3
    ;;
esac
