#!/usr/bin/env bash
# cairn vs llama.cpp on the CPU at equal bits per weight, same random weights: cairn bf16/q8/q4
# (MLX affine, group 64: 16, 8.5, 4.5 bpw) against llama.cpp BF16/Q8_0/Q4_0 (16, 8.5, 4.5 bpw)
# converted from cairn's bf16 checkpoint by bench/gguf_from_safetensors.py. llama.cpp is the
# prebuilt one of the npm package node-llama-cpp (bench-only; installed into .deps/bench-npm).
#   bench/compare_llamacpp.sh
#   MODELS="qwen3-0.6b" TYPES="q4 q8" P=128 N=32 THREADS=2 REPS=5 bench/compare_llamacpp.sh
# Models (random weights, several GB) and GGUFs are kept in /tmp/cmp-*, made once, reused.
# Needs python3 + numpy (installed with apt-get when run as root, else named) and node/npm.
# Run it on a quiet machine: llama.cpp's threads spin at barriers and collapse when a core is
# taken by something else.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CAIRN_BIN:-build/cairn}
MODELS=${MODELS:-qwen3-0.6b llama-3.2-1b}
TYPES=${TYPES:-bf16 q8 q4}
P=${P:-128} N=${N:-32} THREADS=${THREADS:-2} REPS=${REPS:-5}
PY=${PYTHON:-python3} # the GGUF writer needs numpy (Debian: python3-numpy)
RAW=${RAW:-/tmp/cmp-results.jsonl} # every run's full JSON from both, appended
NPM_DIR=.deps/bench-npm
NLC_VERSION=3.22.1

# What the script needs besides cairn: python3 with numpy (the GGUF writer), node/npm (llama.cpp).
# A python3 first on PATH that is not Debian's (pyenv, a venv) does not see Debian's numpy: then
# Debian's own /usr/bin/python3 is used, installing python3-numpy for it if root can.
if ! "$PY" -c 'import numpy' 2>/dev/null && [ "$PY" = python3 ] && [ -x /usr/bin/python3 ]; then
    if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        echo "compare_llamacpp: installing python3-numpy" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-numpy >/dev/null
    fi
    /usr/bin/python3 -c 'import numpy' 2>/dev/null && PY=/usr/bin/python3
fi
if ! "$PY" -c 'import numpy' 2>/dev/null; then
    echo "compare_llamacpp: $PY lacks numpy: install it (Debian: sudo apt-get install python3-numpy," >&2
    echo "  or pip install numpy) or point PYTHON at a python3 that has it" >&2
    exit 1
fi
for c in node npm; do
    command -v "$c" >/dev/null || { echo "compare_llamacpp: needs $c (Debian: apt-get install nodejs npm)" >&2; exit 1; }
done

if [ ! -f "$NPM_DIR/node_modules/@node-llama-cpp/linux-x64/package.json" ]; then
    # Only the CPU binaries: --omit=optional skips the CUDA/Vulkan packages (~600 MB), and no
    # postinstall script is needed since the prebuilt libraries are used as they are.
    mkdir -p "$NPM_DIR"
    [ -f "$NPM_DIR/package.json" ] || echo '{"name": "cairn-bench-npm", "private": true}' >"$NPM_DIR/package.json"
    (cd "$NPM_DIR" && npm install --omit=optional --ignore-scripts --no-audit --no-fund \
        "node-llama-cpp@$NLC_VERSION" "@node-llama-cpp/linux-x64@$NLC_VERSION" >&2)
fi
load=$(cut -d' ' -f1 /proc/loadavg)
if awk "BEGIN {exit !($load > 1.0)}"; then
    echo "compare_llamacpp: load average $load: numbers will be noisy" >&2
fi

field() { "$PY" -c 'import json, sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
ratio() { awk "BEGIN {printf \"%.2f\", $1 / $2}"; }

rows=()
for model in $MODELS; do
    config=bench/configs/$model.json
    base=/tmp/cmp-$model
    for type in $TYPES; do
        case $type in bf16) gtype=bf16 ;; q8) gtype=q8_0 ;; q4) gtype=q4_0 ;;
            *) echo "compare_llamacpp: unknown type $type" >&2; exit 2 ;; esac
        # synth-model seeds every tensor by name, so the q8/q4 checkpoints quantize the same
        # weights the GGUFs are converted from.
        for d in bf16 "$type"; do
            [ -f "$base-$d/model.safetensors" ] ||
                "$BIN" synth-model --config "$config" --out "$base-$d" --dtype "$d" >&2
        done
        gguf=$base-$gtype.gguf
        [ -f "$gguf" ] || "$PY" bench/gguf_from_safetensors.py "$base-bf16" "$gguf" --type "$gtype"
        echo "compare_llamacpp: $model $type ..." >&2
        c=$("$BIN" bench --model "$base-$type" -p "$P" -n "$N" --reps "$REPS" -t "$THREADS" --json 2>/dev/null)
        l=$(node bench/llamacpp_bench.mjs "$gguf" -p "$P" -n "$N" --reps "$REPS" -t "$THREADS" --json)
        info="llama.cpp $(field llama_cpp_release <<<"$l") (node-llama-cpp $NLC_VERSION), libggml-cpu-$(field cpu_variant <<<"$l"), flash attention $(field flash_attention <<<"$l"), f16 KV; cairn isa $(field isa <<<"$c"), bf16 KV"
        cpp=$(field pp_tps_median <<<"$c") ctg=$(field tg_tps_median <<<"$c")
        lpp=$(field pp_tps_median <<<"$l") ltg=$(field tg_tps_median <<<"$l")
        lwall=$(field tg_tps_wall_median <<<"$l")
        printf '{"model": "%s", "type": "%s", "cairn": %s, "llamacpp": %s}\n' "$model" "$type" "$c" "$l" >>"$RAW"
        rows+=("$(printf '%-13s %-5s %9.1f %9.1f %6s %9.2f %9.2f %6s %9.2f' "$model" "$type" \
            "$cpp" "$lpp" "$(ratio "$cpp" "$lpp")" "$ctg" "$ltg" "$(ratio "$ctg" "$ltg")" "$lwall")")
        echo "${rows[-1]}" >&2
    done
done
echo "pp$P / tg$N, $THREADS threads, median of $REPS; $info"
echo "ratio = cairn / llama.cpp; llama.cpp columns: its own perf counters (compute only, as cairn bench);"
echo "last column: llama.cpp tg through the node API (wall clock, incl. sampling); raw JSON in $RAW"
printf '%-13s %-5s %9s %9s %6s %9s %9s %6s %9s\n' model type cairn_pp llama_pp ratio cairn_tg llama_tg ratio llama_tg_api
printf '%s\n' "${rows[@]}"
