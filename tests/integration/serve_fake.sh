#!/usr/bin/env bash
# `cairn serve` over the scripted fake backend, driven by curl: routing, auth, limits, errors,
# streaming, keep-alives, disconnects, 64 concurrent streams, clean shutdown.
set -u
cd "${CAIRN_SRC:-.}"
source tests/integration/lib/serve_lib.sh

LONG=$(printf 'word%.0s ' $(seq 1 400))
cat > "$SERVE_TMP/fast.json" <<JSON
{"models":[{"id":"fake","context_length":4096},{"id":"org/tiny","context_length":32}],
 "replies":[{"match":"weather","text":"<think>\\nplan\\n</think>\\n\\n<tool_call>\\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\\n</tool_call>"},
            {"match":"long","text":"$LONG"}],
 "default":"Hello from the fake model!","chunk_bytes":3,"cached_tokens":5}
JSON
cat > "$SERVE_TMP/slow.json" <<JSON
{"models":[{"id":"fake","context_length":4096}],"default":"$LONG","chunk_bytes":5,"token_delay_ms":150}
JSON

KEY=sekrit-key
start_server fast --fake-backend "$SERVE_TMP/fast.json" --api-key "$KEY" --max-body-size 64K --http-threads 4
start_server slow --fake-backend "$SERVE_TMP/slow.json" --keepalive-ms 100 --max-concurrent-requests 4
F="http://127.0.0.1:$PORT_fast"
S="http://127.0.0.1:$PORT_slow"
AUTH=(-H "Authorization: Bearer $KEY")
CHAT='{"model":"fake","messages":[{"role":"user","content":"hi"}]}'

# health stays open; everything else needs the key
check_eq "health" "$(curl -s "$F/health")" '{"status":"ok"}'
check_eq "no key -> 401" "$(curl -s -o /dev/null -w '%{http_code}' "$F/v1/models")" 401
out=$(curl -s -H "Authorization: Bearer wrong" "$F/v1/chat/completions" -d "$CHAT")
check_has "wrong key shape" "$out" '"type":"authentication_error"'
check_has "wrong key code" "$out" '"code":"invalid_api_key"'
out=$(curl -s -H "x-api-key: nope" "$F/v1/messages" -d '{}')
check_has "anthropic 401 shape" "$out" '{"type":"error","error":{"type":"authentication_error"'
check_eq "x-api-key ok" "$(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $KEY" "$F/v1/models")" 200
out=$(curl -s "${AUTH[@]}" "$F/v1/models")
check_has "models list" "$out" '{"id":"fake","object":"model"'
check_has "nested model id" "$out" '"id":"org/tiny"'
check_eq "model by id" "$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$F/v1/models/org/tiny")" 200
check_eq "unknown model by id" "$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$F/v1/models/nope")" 404

# static files
out=$(curl -s -i "$F/")
check_has "index.html" "$out" "text/html"
check_eq "unknown file" "$(curl -s -o /dev/null -w '%{http_code}' "$F/nope.js")" 404

# plain chat
out=$(curl -s "${AUTH[@]}" "$F/v1/chat/completions" -d "$CHAT")
check_has "chat content" "$out" '"content":"Hello from the fake model!"'
check_has "chat usage cached" "$out" '"prompt_tokens_details":{"cached_tokens":5}'

# errors: malformed JSON, wrong types, unknown model/route, method, body limits, context
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":')
check_has "bad json 400" "$out" ' 400'
check_has "bad json openai shape" "$out" '{"error":{"message":"malformed JSON'
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/messages" -d '{"model":')
check_has "bad json anthropic shape" "$out" '{"type":"error","error":{"type":"invalid_request_error","message":"malformed JSON'
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":"fake","messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}')
check_has "wrong type param" "$out" '"param":"max_tokens","code":null}} 400'
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":"nope","messages":[{"role":"user","content":"x"}]}')
check_has "unknown model" "$out" '"code":"model_not_found"}} 404'
check_eq "unknown route" "$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$F/v1/nothing")" 404
check_eq "GET on POST route" "$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$F/v1/chat/completions")" 405
check_eq "POST on GET route" "$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" -d '{}' "$F/v1/models")" 405
head -c 100000 /dev/zero | tr '\0' 'a' > "$SERVE_TMP/big"
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/chat/completions" --data-binary @"$SERVE_TMP/big")
check_has "413 by content-length" "$out" '"code":"request_too_large"}} 413'
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" -H "Transfer-Encoding: chunked" "$F/v1/messages" --data-binary @"$SERVE_TMP/big")
check_has "413 chunked" "$out" ' 413'
check_has "413 anthropic shape" "$out" '"type":"request_too_large"'
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":"org/tiny","messages":[{"role":"user","content":"this prompt is longer than thirty-two tokens"}]}')
check_has "context 400" "$out" '"code":"context_length_exceeded"}} 400'
check_has "context numbers" "$out" 'maximum context length is 32 tokens'

# response_format: constrained by a grammar (tests/integration/grammar_*.sh), no warning header;
# an unsupported schema keyword is a 400 naming it, in each API's error shape
out=$(curl -s -i "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":"fake","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}')
check "no x-cairn-warning" [ -z "$(echo "$out" | tr 'A-Z' 'a-z' | grep 'x-cairn-warning')" ]
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":"fake","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","minProperties":2}}}}')
check_has "schema 400" "$out" ' 400'
check_has "schema 400 names the keyword" "$out" "minProperties"
check_has "schema 400 param" "$out" '"param":"response_format"'
out=$(curl -s -w ' %{http_code}' "${AUTH[@]}" "$F/v1/messages" -d '{"model":"fake","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"t","input_schema":{"type":"object","not":{}}}],"tool_choice":{"type":"any"}}')
check_has "anthropic schema 400" "$out" '"type":"invalid_request_error"'
check_has "anthropic schema 400 names the keyword" "$out" "'not'"

# streaming with tools: markup never leaks
out=$(curl -sN "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":"fake","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]}')
check_has "stream role first" "$(echo "$out" | head -1)" '"delta":{"role":"assistant","content":""}'
check_has "stream reasoning" "$out" '"reasoning_content":"p"'
check_has "stream tool call" "$out" '"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}'
check_has "stream finish" "$out" '"finish_reason":"tool_calls"'
check_has "stream usage" "$out" '"choices":[],"usage":{"prompt_tokens":'
check_eq "stream done" "$(echo "$out" | grep -v '^$' | tail -1)" 'data: [DONE]'
case "$out" in *"tool_call>"*|*"<think>"*) fail "markup leaked" ;; *) ok ;; esac
out=$(curl -sN "${AUTH[@]}" "$F/v1/messages" -d '{"model":"fake","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"weather?"}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]}')
check_has "anthropic tool_use" "$out" '"content_block":{"type":"tool_use"'
check_has "anthropic stop_reason" "$out" '"stop_reason":"tool_use"'
check_has "anthropic cache read" "$out" '"cache_read_input_tokens":5'
check_eq "anthropic last event" "$(echo "$out" | grep '^event:' | tail -1)" 'event: message_stop'
out=$(curl -sN "${AUTH[@]}" "$F/v1/responses" -d '{"model":"fake","stream":true,"input":"weather?","tools":[{"type":"function","name":"get_weather","parameters":{}}]}')
check_has "responses function_call" "$out" 'event: response.function_call_arguments.done'
check_eq "responses last event" "$(echo "$out" | grep '^event:' | tail -1)" 'event: response.completed'

# /api/status, /metrics, cache clear
out=$(curl -s "${AUTH[@]}" "$F/api/status")
check_has "status model" "$out" '"id":"fake","loaded":true'
check_has "status cached tokens" "$out" '"cached_tokens_served":'
out=$(curl -s "${AUTH[@]}" "$F/metrics")
check_has "metrics" "$out" 'cairn_requests_running{model="fake"} 0'
check_has "metrics type" "$out" '# TYPE cairn_generated_tokens_total counter'
check_eq "cache clear device" "$(curl -s "${AUTH[@]}" "$F/api/cache/clear" -d '{"tier":"device"}')" '{"status":"ok","tier":"device","tiers_cleared":1}'
check_eq "cache clear bad tier" "$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" "$F/api/cache/clear" -d '{"tier":"moon"}')" 400

# 64 concurrent streams, each complete
for i in $(seq 1 64); do
    curl -sN "${AUTH[@]}" "$F/v1/chat/completions" -d '{"model":"fake","stream":true,"messages":[{"role":"user","content":"long '$i'"}]}' > "$SERVE_TMP/c$i.out" &
done
wait_pids=$(jobs -p | grep -v -x -F "$(printf '%s\n' "${SERVE_PIDS[@]}")")
for p in $wait_pids; do wait "$p"; done
n_ok=0
for i in $(seq 1 64); do
    f="$SERVE_TMP/c$i.out"
    text=$(grep '^data: {' "$f" | sed -n 's/.*"content":"\([^"]*\)".*/\1/p' | tr -d '\n')
    if [ "$(tail -c 15 "$f" | tr -d '\n')" = "data: [DONE]" ] && [ "$text" = "$LONG" ]; then n_ok=$((n_ok + 1)); fi
done
check_eq "64 concurrent streams complete" "$n_ok" 64

# slow server: keep-alives while nothing comes, disconnect cancels, concurrency limit
out=$(curl -sN --max-time 1 "$S/v1/chat/completions" -d '{"model":"fake","stream":true,"messages":[{"role":"user","content":"x"}]}')
check_has "keep-alive comment" "$out" ': keep-alive'
out=$(curl -sN --max-time 1 "$S/v1/messages" -d '{"model":"fake","max_tokens":500,"stream":true,"messages":[{"role":"user","content":"x"}]}')
check_has "anthropic ping" "$out" 'event: ping'
# the server notices at its next write (a token or a keep-alive), then cancels within a step
for _ in $(seq 1 40); do
    st=$(curl -s "$S/api/status")
    case "$st" in *'"running":0'*) break ;; esac
    sleep 0.05
done
check_has "disconnect cancels" "$st" '"running":0'
gen=$(echo "$st" | sed -n 's/.*"generated_tokens":\([0-9]*\).*/\1/p')
check "cancelled early (generated $gen tokens)" [ "${gen:-999}" -lt 40 ]
for i in 1 2 3 4; do
    curl -sN --max-time 3 "$S/v1/chat/completions" -d '{"model":"fake","stream":true,"messages":[{"role":"user","content":"x"}]}' > /dev/null &
done
sleep 0.5
check_eq "429 past --max-concurrent-requests" "$(curl -s -o /dev/null -w '%{http_code}' "$S/v1/chat/completions" -d "$CHAT")" 429
sleep 3

# clean shutdown: a running stream ends with an error event, the server exits 0
curl -sN --max-time 10 "$S/v1/chat/completions" -d '{"model":"fake","stream":true,"messages":[{"role":"user","content":"x"}]}' > "$SERVE_TMP/shut.out" &
cpid=$!
sleep 0.6
kill -TERM "$PID_slow"
wait "$PID_slow"
check_eq "server exit status" "$?" 0
wait "$cpid"
check_has "stream ends with error" "$(tail -c 300 "$SERVE_TMP/shut.out")" '"message":"the server is shutting down"'

stop_server fast
finish serve_fake
