#!/usr/bin/env bash
# The HTTP edge of `cairn serve` (fake backend), with raw sockets where curl can't misbehave:
# slow headers, a body shorter than its Content-Length, a malformed or huge Content-Length, too
# many headers, a request line over the limit, a NUL escape in the body - each answered with its status and a JSON error in the
# path's API shape, and /health still answering after each. Then: libmicrohttpd's messages
# through cairn's logger, one access-log line per request (and none with --access-log off), a
# client that disconnects during a long (scripted) prefill frees its request within a step, the
# Anthropic fields Claude Code sends, and the per-model usage scale.
set -u
cd "${CAIRN_SRC:-.}"
source tests/integration/lib/serve_lib.sh

cat > "$SERVE_TMP/edge.json" <<'JSON'
{"models":[{"id":"fake","context_length":4096},{"id":"tiny","context_length":40}],
 "default":"Hello there!","chunk_bytes":3,"cached_tokens":5,
 "prefill_steps":60,"token_delay_ms":50}
JSON
cat > "$SERVE_TMP/strict.json" <<'JSON'
{"models":[{"id":"fake","context_length":4096}],"default":"Hi","system_first_only":true,
 "prompt_log":"PROMPTS"}
JSON
sed -i "s|PROMPTS|$SERVE_TMP/prompts.txt|" "$SERVE_TMP/strict.json"

start_server edge --fake-backend "$SERVE_TMP/edge.json" --request-timeout 1000 --max-body-size 64K
start_server quiet --fake-backend "$SERVE_TMP/strict.json" --access-log off --usage-scale fake=2.5
E="http://127.0.0.1:$PORT_edge"
Q="http://127.0.0.1:$PORT_quiet"

# raw PORT PAYLOAD [WAIT_S]: sends the bytes, prints what comes back until the server closes
raw() {
    python3 - "$1" "$2" "${3:-5}" <<'PY'
import socket, sys, time
port, payload, wait = int(sys.argv[1]), sys.argv[2].encode().decode('unicode_escape').encode('latin-1'), float(sys.argv[3])
payload = payload.replace(b"@BIG@", b"b" * 300000).replace(b"@URI@", b"u" * 100000).replace(b"@HUGE@", b"h" * 2000000)
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(wait)
try:
    s.sendall(payload)
except OSError:  # the server answered and closed before reading it all
    pass
out = b""
t0 = time.time()
try:
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
except socket.timeout:
    out += b"<client timeout>"
sys.stdout.write(out.decode('latin-1') + "\n<elapsed %.1f>" % (time.time() - t0))
PY
}
health() { check_eq "$1: /health still answers" "$(curl -s --max-time 5 "$E/health")" '{"status":"ok"}'; }

out=$(raw "$PORT_edge" 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app')
check_has "slow headers: 408" "$out" "HTTP/1.1 408 Request Timeout"
check_has "slow headers: JSON error (OpenAI shape)" "$out" '{"error":{"message":"the request'"'"'s headers and body did not arrive within 1000 ms","type":"invalid_request_error","param":null,"code":"request_timeout"}}'
check_has "slow headers: closed after about the timeout" "$out" "<elapsed 1."
health "slow headers"

out=$(raw "$PORT_edge" 'POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model":')
check_has "short body: 408" "$out" "HTTP/1.1 408 Request Timeout"
check_has "short body: JSON error (Anthropic shape)" "$out" '{"type":"error","error":{"type":"timeout_error","message":"the request'"'"'s headers and body'
health "short body"

out=$(raw "$PORT_edge" 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n{}')
check_has "bad Content-Length: 400" "$out" "HTTP/1.1 400 Bad Request"
check_has "bad Content-Length: JSON error" "$out" '"message":"the Content-Length header is not a number of bytes","type":"invalid_request_error","param":null,"code":"invalid_content_length"'
check "bad Content-Length: no HTML page" test "${out/<html>/}" = "$out"
health "bad Content-Length"

out=$(raw "$PORT_edge" 'POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n{}')
check_has "huge Content-Length: 413" "$out" "HTTP/1.1 413"
check_has "huge Content-Length: JSON error (Anthropic shape)" "$out" '{"type":"error","error":{"type":"request_too_large"'
health "huge Content-Length"

out=$(curl -s -w ' %{http_code}' "$E/v1/chat/completions" -d "{\"model\":\"fake\",\"messages\":[{\"role\":\"user\",\"content\":\"$(head -c 70000 /dev/zero | tr '\0' a)\"}]}")
check_has "body over --max-body-size: 413 JSON" "$out" '"type":"invalid_request_error","param":null,"code":"request_too_large"}} 413'

hdrs=""
for i in $(seq 1 150); do hdrs+="X-Filler-$i: value\r\n"; done
out=$(raw "$PORT_edge" "GET /v1/models HTTP/1.1\r\nHost: x\r\n${hdrs}\r\n")
check_has "too many headers: 431" "$out" "HTTP/1.1 431"
check_has "too many headers: JSON error" "$out" '"code":"request_header_fields_too_large"'
health "too many headers"
out=$(raw "$PORT_edge" "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: @BIG@\r\n\r\n")
check_has "header block over MHD's pool: 431" "$out" "HTTP/1.1 431"
check_has "header block over MHD's pool: JSON, not MHD's page" "$out" '"code":"request_header_fields_too_large"'
health "huge header"

# A request line over cairn's limit (64 KiB) but within MHD's pool (1 MiB): JSON 414 in the
# path's shape. Over MHD's pool MHD answers its own page (the residual case: README).
out=$(raw "$PORT_edge" "GET /v1/models?pad=@URI@ HTTP/1.1\r\nHost: x\r\n\r\n")
check_has "long request line: 414" "$out" "HTTP/1.1 414"
check_has "long request line: JSON error (OpenAI shape)" "$out" '{"error":{"message":"the request target is 100015 bytes; the limit is 65536","type":"invalid_request_error","param":null,"code":"uri_too_long"}}'
health "long request line"
out=$(raw "$PORT_edge" "POST /v1/messages?pad=@URI@ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
check_has "long request line (Anthropic path): 414" "$out" "HTTP/1.1 414"
check_has "long request line (Anthropic path): Anthropic shape" "$out" '{"type":"error","error":{"type":"invalid_request_error","message":"the request target is 100017 bytes; the limit is 65536"}}'
health "long request line (Anthropic)"
out=$(raw "$PORT_edge" "GET /v1/models?pad=@HUGE@ HTTP/1.1\r\nHost: x\r\n\r\n")
check_has "request line over MHD's pool: MHD's own 414 (documented residual)" "$out" "HTTP/1.1 414"
health "request line over MHD's pool"

out=$(curl -s "$E/v1/chat/completions" -d '{"model":"fake","messages":[{"role":"user","content":"a\u0000b"}]}')
check_has "NUL escape: says what is wrong" "$out" 'a string contains \\u0000 (a NUL character), which is not supported'
check "NUL escape: no jansson flag name" test "${out/JSON_ALLOW_NUL/}" = "$out"

# A client that leaves during a 3 s prefill (60 steps of 50 ms) of a non-streaming request:
# the connection is suspended, the ticker sees the hang-up and the request is cancelled.
t0=$(date +%s.%N)
curl -s --max-time 0.6 "$E/v1/chat/completions" -d '{"model":"fake","messages":[{"role":"user","content":"long prompt"}]}' >/dev/null
freed=""
for _ in $(seq 1 40); do
    st=$(curl -s "$E/api/status")
    case "$st" in *'"running":0'*) freed=yes; break ;; esac
    sleep 0.05
done
t1=$(date +%s.%N)
check_eq "disconnect mid-prefill: request freed" "$freed" yes
check "disconnect mid-prefill: freed within 1.5 s of the request start (prefill takes 3 s)" \
    python3 -c "import sys; sys.exit(0 if $t1 - $t0 < 1.5 else 1)"
# the same while streaming (before any token: only SSE comments are written)
curl -s -N --max-time 0.6 "$E/v1/messages" -d '{"model":"fake","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"x"}]}' >/dev/null
freed=""
for _ in $(seq 1 40); do
    case "$(curl -s "$E/api/status")" in *'"running":0'*) freed=yes; break ;; esac
    sleep 0.05
done
check_eq "disconnect mid-prefill (stream): request freed" "$freed" yes

# message_start waits for the prefill and carries the final usage
out=$(curl -s -N "$E/v1/messages" -d '{"model":"fake","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"x"}]}')
start=$(echo "$out" | grep -m1 '"type":"message_start"' | grep -o '"usage":{[^}]*}' | sed 's/,"output_tokens":[0-9]*//')
final=$(echo "$out" | grep '"type":"message_delta"' | grep -o '"usage":{[^}]*}' | sed 's/,"output_tokens":[0-9]*//')
check_has "message_start usage has the cache hit" "$start" '"cache_read_input_tokens":5'
check_eq "message_start input usage = message_delta's" "$start" "$final"

# access log: one line per request with method, path, model, status, tokens, TTFT, duration
curl -s "$E/v1/chat/completions" -d '{"model":"fake","max_tokens":3,"messages":[{"role":"user","content":"x"}]}' >/dev/null
sleep 0.3
log=$(cat "$SERVE_TMP/edge.log")
line=$(grep 'POST /v1/chat/completions model=fake status=200' "$SERVE_TMP/edge.log" | tail -1)
n_x=$(printf '<|user|>\nx\n<|assistant|>\n' | wc -c) # the fake template, one token per byte
check_has "access log line" "$line" "info  http   POST /v1/chat/completions model=fake status=200 prompt=$n_x cached=5 completion=3 ttft="
check "access log line: TTFT and duration in ms" bash -c "echo '$line' | grep -qE 'ttft=[0-9]+ms duration=[0-9]+ms$'"
check_has "access log: timeout" "$log" "status=408"
check_has "access log: client gone" "$log" "status=499"
check "libmicrohttpd's lines carry cairn's time and level" grep -qE '^[0-9:.]+ (debug|info |warn |error) http   ' "$SERVE_TMP/edge.log"
check "no bare libmicrohttpd lines on stderr" bash -c "! grep -v '^[0-9][0-9]:[0-9][0-9]:' '$SERVE_TMP/edge.log' | grep -q ."
check "disconnect chatter is not at warn" bash -c "! grep -E 'warn .*(closed|reset|disconnect)' '$SERVE_TMP/edge.log'"

# Claude Code's request shape: a system turn inside messages, adaptive thinking, the beta
# fields, ?beta=true and the beta header. The strict template refuses a later system message,
# so it is merged into the leading system prompt.
body='{"model":"fake","max_tokens":50,"system":"You are terse.","thinking":{"type":"adaptive"},
 "context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]},"output_config":{"effort":"medium"},
 "metadata":{"user_id":"u"},"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]},
 {"role":"system","content":"Reminder: answer briefly."},{"role":"user","content":"again"}]}'
out=$(curl -s -w ' %{http_code}' "$Q/v1/messages?beta=true" -H 'anthropic-beta: context-management-2025-06-27,interleaved-thinking-2025-05-14' -H 'anthropic-version: 2023-06-01' -d "$body")
check_has "Claude Code fields: 200" "$out" ' 200'
check_has "Claude Code fields: a message" "$out" '"type":"message","role":"assistant"'
prompt=$(cat "$SERVE_TMP/prompts.txt")
check_has "system turn merged into the leading system prompt" "$prompt" "<|system|>
You are terse.

Reminder: answer briefly.
<|user|>"
out=$(curl -s "$Q/v1/messages" -d '{"model":"fake","max_tokens":5,"messages":[{"role":"tool","content":"x"}]}')
check_has "a role cairn can't take: Anthropic's type and wording" "$out" '{"type":"error","error":{"type":"invalid_request_error","message":"messages.0.role: Input should be '"'"'user'"'"', '"'"'assistant'"'"' or '"'"'system'"'"'"}}'
out=$(curl -s "$E/v1/messages" -d '{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]}')
check_has "context overflow: Anthropic's wording" "$out" '{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 72 tokens > 39 maximum"}}'

# models: context length, and Anthropic's list shape when anthropic-version is sent
out=$(curl -s "$E/v1/models")
check_has "models: context length" "$out" '{"id":"tiny","object":"model","created":1700000000,"owned_by":"cairn","context_length":40'
out=$(curl -s -H 'anthropic-version: 2023-06-01' "$E/v1/models")
check_has "models: Anthropic shape" "$out" '"data":[{"type":"model","id":"fake","display_name":"fake","created_at":"2023-11-14T22:13:20Z","context_length":4096'
check_has "models: Anthropic paging fields" "$out" '"has_more":false,"first_id":"fake","last_id":"tiny"}'

# usage scale 2.5 on the quiet server: every reported count, count_tokens too
u=$(curl -s "$Q/v1/chat/completions" -d '{"model":"fake","messages":[{"role":"user","content":"hey"}]}')
n_prompt=$(printf '<|user|>\nhey\n<|assistant|>\n' | wc -c)
want=$(python3 -c "print(int($n_prompt * 2.5 + 0.5))")
check_has "usage scale: prompt tokens" "$u" "\"prompt_tokens\":$want,"
check_has "usage scale: completion tokens (1 real: \"Hi\" in one 3-byte step)" "$u" '"completion_tokens":3,'
u=$(curl -s "$Q/v1/messages/count_tokens" -d '{"model":"fake","messages":[{"role":"user","content":"hey"}]}')
check_eq "usage scale: count_tokens" "$u" "{\"input_tokens\":$want}"
check "--access-log off: no request lines" bash -c "! grep -q 'POST /v1' '$SERVE_TMP/quiet.log'"

stop_server edge
stop_server quiet
finish http_edge
