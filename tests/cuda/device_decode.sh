#!/usr/bin/env bash
# One device call for the decode work (issue 14): op test, the GEMV microbenchmark, the parity
# checks of device_session.sh check, and decode benchmarks, each part chosen by name:
#   tests/cuda/device_decode.sh ops gemv check b1 b8 b8q
# ops: test_cuda_ops; gemv: test_cuda_ops --bench-gemv; check: device_session.sh check minus
# the op test; b1: 1B BF16 pp512/tg128 with and without graphs; eng: bench-engine on that 1B
# at 1/8/32/64 sequences; b8: 8B BF16; b8q: 8B MLX q8 and q4 (synth ~1 min each); attn: the 8B
# BF16 with each decode attention kernel (CAIRN_CUDA_ATTN_DEC=fast, then pipe): the op test,
# tg128 and bench-engine at 8 and 64 streams, 256 new tokens (issue 15's figures); tiers: the
# 32K-token prompt's TTFT from each prefix-cache tier (bench/gpu_serve_figures.sh PARTS=tiers,
# the pinned hot tier). attn and tiers share one 8B checkpoint with a tokenizer (MODELS/serve).
# Env as device_session.sh (BIN_DIR, OUT, MODELS); CAIRN_CUDA_* pass through to cairn.
set -u
cd "${CAIRN_ROOT:-$(dirname "$0")/../..}"
BIN_DIR=${BIN_DIR:-.devcarry}
OUT=${OUT:-$(mktemp -d)}
MODELS=${MODELS:-/tmp/cairn-bench}
for z in "$BIN_DIR"/*.gz; do [ -f "$z" ] && gunzip -f "$z"; done
export LD_LIBRARY_PATH="$PWD/$BIN_DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
BIN=$BIN_DIR/cairn
b() { # name config dtype prompt gen reps
    local dir="$MODELS/$1"
    [ -d "$dir" ] || "$BIN" synth-model --config "$2" --dtype "$3" --out "$dir" > "$OUT/synth-$1.log" 2>&1 ||
        { echo "synth $1 failed: $(tail -2 "$OUT/synth-$1.log")"; return; }
    "$BIN" bench --model "$dir" --device cuda -p "$4" -n "$5" --reps "$6" --json > "$OUT/bench-$1-p$4$7.json" \
        2> "$OUT/bench-$1-p$4$7.err"
    echo "$1 p$4 n$5 $7: $(grep -o '"pp_tps_median": [0-9.]*\|"tg_tps_median": [0-9.]*' "$OUT/bench-$1-p$4$7.json" |
        tr '\n' ' ') $(tail -1 "$OUT/bench-$1-p$4$7.err")"
}
for part in "$@"; do
    t0=$(date +%s)
    case "$part" in
    ops) for g in 1 0; do
            CAIRN_CUDA_GRAPHS=$g "$BIN_DIR/test_cuda_ops" > "$OUT/ops-g$g.log" 2>&1
            echo "test_cuda_ops graphs=$g rc=$?: $(tail -1 "$OUT/ops-g$g.log")"; grep -E "FAIL" "$OUT/ops-g$g.log" | head -30
         done ;;
    gemv) "$BIN_DIR/test_cuda_ops" --bench-gemv > "$OUT/gemv.log" 2>&1; echo "bench-gemv rc=$?"; cat "$OUT/gemv.log" ;;
    check) mkdir -p "$OUT/run"
        CAIRN_BUILD=$BIN_DIR CAIRN_BIN=$BIN OUT=$OUT/run timeout 300 bash tests/cuda/run.sh --no-op-test \
            > "$OUT/run.log" 2>&1
        echo "run.sh rc=$?"; cat "$OUT/run/summary.txt" 2>/dev/null
        for g in 1 0; do
            for kv in bf16 f32; do
                echo "demo graphs=$g kv=$kv: $(CAIRN_CUDA_GRAPHS=$g "$BIN" check-logits --device cuda models/demo \
                    tests/data/demo/expected.safetensors --tol 5e-2 --kv $kv 2>&1 | tail -1)"
            done
        done
        # the oracle models again without graphs, at the tolerances run.sh used (kv bf16)
        grep "kv=bf16" "$OUT/run/summary.txt" | while read -r name _ tol _; do
            d=tests/data/oracle/models/$name; t=${tol#tol=}
            CAIRN_CUDA_GRAPHS=0 "$BIN" check-logits --device cuda "$d" "$d/expected.safetensors" --tol "$t" \
                --kv bf16 > "$OUT/check0-$name.log" 2>&1
            echo "graphs=0 $name tol=$t rc=$?: $(tail -1 "$OUT/check0-$name.log")"
        done ;;
    b1) b llama1b-bf16 bench/configs/llama-3.2-1b.json bf16 512 128 3 ""
        CAIRN_CUDA_GRAPHS=0 b llama1b-bf16 bench/configs/llama-3.2-1b.json bf16 512 128 3 "-nographs" ;;

    eng) for g in 1 0; do
            CAIRN_CUDA_GRAPHS=$g timeout 120 "$BIN" bench-engine --model "$MODELS/llama1b-bf16" --device cuda \
                --concurrency 1,8,32,64 --prompt 128 --gen 64 > "$OUT/engine-g$g.log" 2>&1
            echo "bench-engine 1B graphs=$g rc=$?"; grep -E "decode|error|prefill" "$OUT/engine-g$g.log"
        done ;;
    b8) b llama8b-bf16 bench/configs/llama-3.1-8b.json bf16 512 128 3 ""; rm -rf "$MODELS/llama8b-bf16" ;;
    b8q) b llama8b-q8 bench/configs/llama-3.1-8b.json q8 512 128 3 ""; rm -rf "$MODELS/llama8b-q8"
         b llama8b-q4 bench/configs/llama-3.1-8b.json q4 512 128 3 ""; rm -rf "$MODELS/llama8b-q4" ;;
    attn|tiers)
        srv=$MODELS/serve
        if [ ! -f "$srv/model/config.json" ]; then
            python3 bench/synth_tokenizer.py models/demo "$srv/tok" 128256 > /dev/null &&
                "$BIN" synth-model --config bench/configs/llama-3.1-8b.json --dtype bf16 --out "$srv/model" \
                    --tokenizer "$srv/tok" > "$OUT/synth-serve.log" 2>&1 || { echo "synth serve failed"; continue; }
        fi
        if [ "$part" = tiers ]; then
            PARTS=tiers timeout 400 bash bench/gpu_serve_figures.sh "$PWD/$BIN" "$srv" "$OUT/tiers" > "$OUT/tiers.log" 2>&1
            echo "tiers rc=$?"; tail -8 "$OUT/tiers.log"
        else
            for dec in fast pipe; do
                CAIRN_CUDA_ATTN_DEC=$dec "$BIN_DIR/test_cuda_ops" > "$OUT/ops-$dec.log" 2>&1
                echo "test_cuda_ops attn=$dec rc=$?: $(tail -1 "$OUT/ops-$dec.log")"
                CAIRN_CUDA_ATTN_DEC=$dec "$BIN" bench --model "$srv/model" --device cuda -p 512 -n 128 --reps 3 \
                    --json > "$OUT/b8-$dec.json" 2> "$OUT/b8-$dec.err"
                echo "8B attn=$dec: $(grep -o '"tg_tps_median": [0-9.]*' "$OUT/b8-$dec.json")"
                CAIRN_CUDA_ATTN_DEC=$dec timeout 170 "$BIN" bench-engine --model "$srv/model" --device cuda \
                    --concurrency 8,64,8,64,8,64 --prompt 128 --gen 256 --kv-gb 16 > "$OUT/eng-$dec.log" 2>&1
                echo "bench-engine attn=$dec rc=$?"; grep "^decode:" "$OUT/eng-$dec.log"
            done
        fi ;;
    esac
    echo "[$part: $(( $(date +%s) - t0 )) s]"
done
