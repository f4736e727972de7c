#!/usr/bin/env bash
# Time to first token of one long prompt on a synthetic model (random weights): cold,
# device-cache hit, hot-tier hit (after evicting the device cache), and SSD hit after a restart
# with the page cache dropped (when root). Prints each as seconds and as a ratio to cold, the
# KV bytes of the prompt, the SSD hit's read bandwidth (KV bytes / its TTFT, an upper bound on
# the time the read took) and what /api/status says about restore vs recompute.
#   bench/tiers_ttft.sh                      (a Qwen3-0.6B shape, 8,192 tokens, on the CPU)
#   DEVICE=cuda MODEL_CONFIG=bench/configs/llama-3.1-8b.json N_TOKENS=32768 KV_SIZE=40G \
#       HOT_SIZE=16G bench/tiers_ttft.sh
# Env: CAIRN_BIN, DEVICE (cpu), MODEL_CONFIG, MODEL_DIR (synthesized there if missing; default
# WORK/model), N_TOKENS, KV_SIZE (2G), HOT_SIZE (4G), MAX_BATCH_TOKENS (512 on the CPU, 8192 on
# a GPU), WORK (/tmp/cairn-ttft), THREADS, PORT (18931). The tokenizer is the demo model's,
# padded to the config's vocabulary (bench/synth_tokenizer.py): nothing outside the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CAIRN_BIN:-build/cairn}
device=${DEVICE:-cpu}
config=${MODEL_CONFIG:-bench/configs/qwen3-0.6b.json}
n=${N_TOKENS:-8192}
work=${WORK:-/tmp/cairn-ttft}
threads=${THREADS:-$(nproc)}
model=${MODEL_DIR:-$work/model}
kv=${KV_SIZE:-2G}
hot=${HOT_SIZE:-4G}
if [ "$device" = cpu ]; then mbt=${MAX_BATCH_TOKENS:-512}; else mbt=${MAX_BATCH_TOKENS:-8192}; fi
port=${PORT:-18931}
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$config")
mkdir -p "$work"
if [ ! -f "$model/config.json" ]; then
    python3 bench/synth_tokenizer.py models/demo "$work/tok" "$vocab" >/dev/null
    "$bin" synth-model --config "$config" --out "$model" --dtype bf16 --tokenizer "$work/tok" >/dev/null
fi
name=$(basename "$model")
rm -rf "$work/ssd"
prompt=$(awk -v n="$n" -v v="$vocab" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), 1000 + int(rand() * (v - 1000)) }')
printf '{"model":"%s","prompt":[%s],"max_tokens":1,"temperature":0}' "$name" "$prompt" > "$work/body.json"
pid=
start() {
    "$bin" serve --model "$model" --device "$device" --port "$port" --threads "$threads" --kv-cache-size "$kv" \
        --hot-cache-max-size "$hot" --ssd-cache-dir "$work/ssd" --max-batch-tokens "$mbt" --preload \
        --log-level warn 2>>"$work/serve.log" &
    pid=$!
    for _ in $(seq 1 1800); do curl -fs -o /dev/null "http://127.0.0.1:$port/health" && return; sleep 0.1; done
    echo "server did not start (see $work/serve.log)" >&2; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" || true; }
status() { curl -fs "http://127.0.0.1:$port/api/status"; }
jget() { python3 -c "import json,sys; m=json.load(sys.stdin)['models'][0]
for k in sys.argv[1].split('.'): m=m.get(k, {}) if isinstance(m, dict) else {}
print(m if m != {} else 0)" "$1"; }
ttft() { # prints "seconds cached_tokens"
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$(curl -fs --max-time 3600 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        --data-binary @"$work/body.json")
    t1=$(date +%s.%N)
    local cached
    cached=$(printf '%s' "$out" | grep -o '"cached_tokens":[0-9]*' | cut -d: -f2)
    echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }') ${cached:-0}"
}
start
read -r cold c0 < <(ttft)
read -r dev c1 < <(ttft)
curl -fs -o /dev/null "http://127.0.0.1:$port/api/cache/clear" -H 'Content-Type: application/json' -d '{"tier":"device"}'
read -r hot c2 < <(ttft)
# without write-through the hot tier goes to the disk at shutdown (stop waits for it)
hot_bytes=$(status | jget tiers.hot.bytes)
stop
sync
if [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then dropped=yes; else dropped=no; fi
start
ssd_bytes=$(status | jget tiers.ssd.bytes)
read -r ssd c3 < <(ttft)
st=$(status)
stop
printf '%-28s %9s %8s %14s\n' "case ($n-token prompt)" seconds "vs cold" "cached tokens"
for row in "cold $cold $c0" "device-cache hit $dev $c1" "hot-tier hit $hot $c2" "SSD hit after restart $ssd $c3"; do
    set -- $row
    name="$1"; shift
    while [ $# -gt 2 ]; do name="$name $1"; shift; done
    printf '%-28s %9.3f %8.4f %14s\n' "$name" "$1" "$(awk -v a="$1" -v b="$cold" 'BEGIN { printf "%.6f", a / b }')" "$2"
done
echo "KV bytes of the prompt: hot tier $hot_bytes, SSD tier $ssd_bytes (page cache dropped: $dropped)"
printf 'SSD hit: %.0f MB/s (SSD bytes / its TTFT)\n' "$(awk -v a="$ssd_bytes" -v b="$ssd" 'BEGIN { printf "%.3f", a / b / 1e6 }')"
printf '%s' "$st" | python3 -c "import json,sys; m=json.load(sys.stdin)['models'][0]; r=m['prefix_restore']
print('server, restore vs recompute: restored %d, recomputed %d (%d blocks), fetched %d blocks; measured: '
      'SSD read %.0f MB/s, hot read %.0f MB/s, prefill %.0f tok/s' % (r['restored'], r['recomputed'],
      r['blocks_recomputed'], r['fetched_blocks'], r['ssd_read_bytes_per_s'] / 1e6,
      r['hot_read_bytes_per_s'] / 1e6, r['prefill_tokens_per_s']))"
