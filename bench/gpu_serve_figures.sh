#!/usr/bin/env bash
# Issue 15's serving figures in one run: (1) N requests submitted at once over HTTP to
# `cairn serve` (bench/http_load.py: output tok/s, TTFT / ITL percentiles, where the server's
# time went), (2) a long prompt's TTFT from each prefix-cache tier (bench/tiers_ttft.sh: cold,
# device hit, hot hit, SSD hit after a restart, KV bytes, SSD read bandwidth).
#   bench/gpu_serve_figures.sh CAIRN_BIN SCRATCH [LOG_DIR]
# On the H200 (defaults): the 8B BF16, 1,000 requests, prompts 200-2,000, outputs 100-500, a
# 32K-token prompt for the tiers. On the CPU (a proof of the script, not figures):
#   DEVICE=cpu MODEL_CONFIG=bench/configs/llama-3.1-tiny.json N_REQ=200 PROMPT_MIN=20 \
#       PROMPT_MAX=200 OUT_MIN=8 OUT_MAX=32 N_TOKENS=2048 KV_SIZE=2G HOT_SIZE=1G \
#       bench/gpu_serve_figures.sh build/cairn /tmp/sv/figs
# Env: DEVICE (cuda), MODEL_CONFIG (bench/configs/llama-3.1-8b.json), N_REQ (1000), PROMPT_MIN,
# PROMPT_MAX, OUT_MIN, OUT_MAX, MAX_RUNNING (256), MAX_BATCH_TOKENS (4096; 512 on the CPU),
# KV_SIZE (the serve's KV budget: 80G on a GPU, 256 x 2,500 tokens x 128 KiB = 84G worst case), N_TOKENS (32768), HOT_SIZE (16G), PARTS
# (load,tiers), POLL (5: seconds between the load's /api/status lines), MAX_S (0: the load runs
# until every request is done; else it is cut after MAX_S s and reports what it got). CAIRN_ENGINE_SCHED=legacy
# passes through to the server (session 11's admission and preemption, for an A/B). LOG_DIR
# defaults to $OUT, else SCRATCH/logs. The model is synthesized once into
# SCRATCH/model (random weights, the demo tokenizer padded to the vocabulary: nothing outside
# the tree is needed).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,20p' "$0"; exit 2; }
bin=$(realpath "$1")
scratch=$2
logs=${3:-${OUT:-$scratch/logs}}
device=${DEVICE:-cuda}
config=${MODEL_CONFIG:-bench/configs/llama-3.1-8b.json}
if [ "$device" = cpu ]; then mbt=${MAX_BATCH_TOKENS:-512}; else mbt=${MAX_BATCH_TOKENS:-4096}; fi
kv=${KV_SIZE:-80G}
parts=${PARTS:-load,tiers}
mkdir -p "$scratch" "$logs"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
# one socket per request in flight on the server too; the soft limit is often 1,024
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 65536 2>/dev/null || true
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$config")
model=$scratch/model
if [ ! -f "$model/config.json" ]; then
    python3 bench/synth_tokenizer.py models/demo "$scratch/tok" "$vocab" >/dev/null &&
        "$bin" synth-model --config "$config" --out "$model" --dtype bf16 --tokenizer "$scratch/tok" \
            > "$logs/synth.log" 2>&1 || { echo "synth-model failed:"; tail "$logs/synth.log"; exit 1; }
fi
echo "model $config ($device) ready at $(el)s; logs in $logs"
rc=0
if [[ $parts == *load* ]]; then
    port=18941
    n_req=${N_REQ:-1000}
    # a user's flags for a burst of N: everyone admitted (waiting + running >= N), the step
    # budget big enough for MAX_RUNNING decodes plus prefill chunks, the KV budget from the
    # device's memory (8B: 16 GB weights; 128 KiB of KV per token)
    CAIRN_CUDA_STEP_PROFILE=1 "$bin" serve --model "$model" --device "$device" --port $port \
        --max-running "${MAX_RUNNING:-256}" --max-waiting $((n_req + 64)) \
        --max-concurrent-requests $((n_req + 64)) --max-batch-tokens "$mbt" --kv-cache-size "$kv" \
        --http-threads 8 --preload --access-log off --log-level warn > "$logs/serve-load.log" 2>&1 &
    spid=$!
    for _ in $(seq 1 1200); do curl -fs -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.1; done
    echo "server up at $(el)s"
    python3 bench/http_load.py --port $port --model model -n "$n_req" --vocab "$vocab" \
        --prompt-min "${PROMPT_MIN:-200}" --prompt-max "${PROMPT_MAX:-2000}" \
        --out-min "${OUT_MIN:-100}" --out-max "${OUT_MAX:-500}" --json "$logs/http_load.json" --poll "${POLL:-5}" \
        --max-seconds "${MAX_S:-0}" \
        2>&1 | tee "$logs/http_load.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    curl -fs "http://127.0.0.1:$port/api/status" > "$logs/status-load.json"
    kill -TERM $spid; wait $spid
    echo "load part done at $(el)s; step profile (most time first; every step, the total last):"
    grep "cuda step profile: rows" "$logs/serve-load.log" | sort -k9,9nr | head -24
    grep "cuda step profile: total" "$logs/serve-load.log"
fi
if [[ $parts == *tiers* ]]; then
    CAIRN_BIN=$bin DEVICE=$device MODEL_CONFIG=$config MODEL_DIR=$model WORK=$scratch/tiers \
        N_TOKENS=${N_TOKENS:-32768} KV_SIZE=${TIERS_KV_SIZE:-$kv} HOT_SIZE=${HOT_SIZE:-16G} \
        MAX_BATCH_TOKENS=$mbt bench/tiers_ttft.sh 2>&1 | tee "$logs/tiers.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    cp "$scratch/tiers/serve.log" "$logs/serve-tiers.log" 2>/dev/null
    echo "tiers part done at $(el)s"
fi
echo "gpu_serve_figures: rc=$rc in $(el)s"
exit $rc
