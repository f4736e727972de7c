#!/usr/bin/env bash
# `cairn serve --tensor-parallel N` on simulated CPU ranks (issue 23): one engine drives a group
# of ranks (model/model_group.h). Through the HTTP API, on a dense, a MoE and a hybrid (Gated
# DeltaNet) oracle model, greedy text at N = 2 and N = 4 equals N = 1, and so does the group of
# one (CAIRN_TP_FORCE=1); so does the demo model's chat text at N = 2 (dense MLX q8 with an MTP
# head, which a rank leaves unloaded), whose 6 heads N = 4 refuses; a batch of concurrent requests under N = 2 equals each alone; a
# prefix-cache hit under N = 2 (cached tokens > 0, hybrid state snapshots included) gives the
# cold answer; /api/status names the ranks. Refused with a clear error: tiers and MTP under
# tensor parallel, a head count that does not divide.
# The oracle models have no tokenizer: each gets tests/data/tp/tokenizer.json, a byte-level BPE
# of their 1024 ids (the 256 bytes, then 625 merged pairs of common ASCII characters, then
# "x<k>y" fillers), so prompts and outputs are plain text.
set -uo pipefail
. "$(dirname "$0")/lib/serve_lib.sh"
export CAIRN_LOG_LEVEL=warn
SRC_ABS=$(cd "$CAIRN_SRC" && pwd)
O=$SRC_ABS/tests/data/oracle/models
MD=$SERVE_TMP/models
MODELS="qwen3-tiny qwen3-moe-tiny qwen3_5-tiny"
for m in $MODELS; do
    mkdir -p "$MD/$m"
    for f in config.json model.safetensors; do ln -s "$O/$m/$f" "$MD/$m/$f"; done
    ln -s "$SRC_ABS/tests/data/tp/tokenizer.json" "$MD/$m/tokenizer.json"
done
ln -s "$SRC_ABS/models/demo" "$MD/demo" # dense qwen3, MLX q8, a chat template and an MTP head

field() { node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{let o;try{o=JSON.parse(d)}catch(e){process.stdout.write("BAD JSON: "+d.slice(0,200));return}const f=new Function("o","return "+process.argv[1]);const v=f(o);process.stdout.write(typeof v==="string"?v:JSON.stringify(v))})' "$1"; }
post() { # post PORT JSON-BODY: /v1/completions
    curl -s --max-time 300 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' -d "$2"
}
req() { # req MODEL PROMPT MAX_TOKENS
    printf '{"model":"%s","temperature":0,"max_tokens":%d,"prompt":"%s"}' "$1" "$3" "$2"
}
text() { field 'o.choices ? o.choices[0].text + "|" + o.usage.completion_tokens : "ERROR " + JSON.stringify(o)'; }

P1="the cat sat on the mat and then the dog ran in the rain, a tale told at dusk"
P2="once upon a time in a land far away there lived a small fox who loved songs"
P3="where do rivers go when they reach the sea? ask the old man who fishes there"
# longer than one 64-token block, for the prefix cache
LONG="$P1. $P2. $P3. $P1 again, with a twist: the mat was red and the dog was late. hello"

common=(--model-dir "$MD" --device cpu --threads 2 --kv-cache-size 64M)
start_server tp1 "${common[@]}"
CAIRN_TEST_STEP_DELAY_MS=20 start_server tp2 "${common[@]}" --tensor-parallel 2
start_server tp4 "${common[@]}" --tensor-parallel 4
CAIRN_TP_FORCE=1 start_server force1 "${common[@]}" --tensor-parallel 1

st=$(curl -s "http://127.0.0.1:$PORT_tp2/api/status")
check_eq "status: tensor_parallel 2" "$(echo "$st" | field 'o.tensor_parallel')" "2"
check_eq "status: the two ranks' devices" "$(echo "$st" | field 'o.devices.join(",")')" "cpu:tp0/2,cpu:tp1/2"
check_eq "status: one device without tensor parallel" \
    "$(curl -s "http://127.0.0.1:$PORT_tp1/api/status" | field 'o.tensor_parallel + " " + o.devices.length + " " + o.sharded')" "1 1 false"
check_eq "status: a group of one under CAIRN_TP_FORCE=1" \
    "$(curl -s "http://127.0.0.1:$PORT_force1/api/status" | field 'o.tensor_parallel + " " + o.devices.join() + " " + o.sharded')" "1 cpu:tp0/1 true"

REF_P1=$(post "$PORT_tp1" "$(req qwen3-tiny "$P1" 24)" | text)
for m in $MODELS; do
    for p in "$P1" "$P2" "$P3"; do
        ref=$(post "$PORT_tp1" "$(req "$m" "$p" 24)" | text)
        check "$m: N = 1 gives text ($ref)" [ "${#ref}" -gt 12 ]
        case "$ref" in ERROR*) continue ;; esac
        for s in tp2 tp4 force1; do
            port=PORT_$s
            check_eq "$m, $s: greedy text = N 1 ('${p:0:20}...')" "$(post "${!port}" "$(req "$m" "$p" 24)" | text)" "$ref"
        done
    done
    # batched == solo under N = 2: three at once (the 20 ms step delay keeps them overlapping)
    bpids=()
    for i in 1 2 3; do
        pv=P$i
        post "$PORT_tp2" "$(req "$m" "${!pv}" 24)" > "$SERVE_TMP/$m.b$i" &
        bpids+=($!)
    done
    for j in "${bpids[@]}"; do wait "$j"; done
    for i in 1 2 3; do
        pv=P$i
        solo=$(post "$PORT_tp1" "$(req "$m" "${!pv}" 24)" | text)
        check_eq "$m, tp2: batched request $i = solo" "$(text < "$SERVE_TMP/$m.b$i")" "$solo"
    done
    # prefix cache under N = 2: the second identical long prompt reuses its blocks
    cold=$(post "$PORT_tp2" "$(req "$m" "$LONG" 16)")
    warm=$(post "$PORT_tp2" "$(req "$m" "$LONG" 16)")
    ref=$(post "$PORT_tp1" "$(req "$m" "$LONG" 16)" | text)
    check "$m, tp2: the long prompt spans a block ($(echo "$cold" | field 'o.usage.prompt_tokens') tokens)" \
        [ "$(echo "$cold" | field 'o.usage.prompt_tokens')" -gt 64 ]
    hit=$(echo "$warm" | field 'o.usage.prompt_tokens_details ? o.usage.prompt_tokens_details.cached_tokens : 0')
    check "$m, tp2: prefix-cache hit ($hit cached tokens)" [ "${hit:-0}" -ge 64 ]
    check_eq "$m, tp2: cold = N 1" "$(echo "$cold" | text)" "$ref"
    check_eq "$m, tp2: prefix hit = cold" "$(echo "$warm" | text)" "$(echo "$cold" | text)"
done
# the demo model through the chat API: its MTP head is left unloaded under tensor parallel
chat='{"model":"demo","temperature":0,"max_tokens":40,"messages":[{"role":"user","content":"Write a story about a fox."}]}'
chat_text() { curl -s --max-time 300 "http://127.0.0.1:$1/v1/chat/completions" -H 'Content-Type: application/json' -d "$chat" |
    field 'o.choices ? o.choices[0].message.content : "ERROR " + JSON.stringify(o)'; }
ref=$(chat_text "$PORT_tp1")
check "demo: a story (${ref:0:40}...)" [ "${#ref}" -gt 40 ]
check_eq "demo, tp2: chat text = N 1" "$(chat_text "$PORT_tp2")" "$ref"
check_eq "demo, force1: chat text = N 1" "$(chat_text "$PORT_force1")" "$ref"
check_has "demo, tp4: 6 heads refused" "$(chat_text "$PORT_tp4")" "num_attention_heads (6) does not divide by --tensor-parallel 4"

st=$(curl -s "http://127.0.0.1:$PORT_tp2/api/status")
check "tp2: requests ran ($(echo "$st" | field 'o.models.map(x=>x.id+":"+x.requests_done).join(" ")'))" \
    [ "$(echo "$st" | field 'o.models.reduce((a,x)=>a+x.requests_done,0)')" -ge 24 ]
for s in tp1 tp2 tp4 force1; do stop_server $s; done

# a failure on one rank fails the step for all: the injected stall (backend_test_stall) hits
# whichever rank steps first, past --step-timeout; the request ends with 503, the group is
# unloaded, and the next request loads it again and answers as before
CAIRN_TEST_STALL_MS=3000 start_server stall "${common[@]}" --tensor-parallel 2 --step-timeout 1
code=$(curl -s -o "$SERVE_TMP/stall.json" -w '%{http_code}' --max-time 60 "http://127.0.0.1:$PORT_stall/v1/completions" \
    -H 'Content-Type: application/json' -d "$(req qwen3-tiny "$P1" 8)")
check_eq "a rank's stall: HTTP 503" "$code" "503"
check_has "a rank's stall: says which rank" "$(cat "$SERVE_TMP/stall.json")" "tensor parallel: rank "
again=""
for _ in $(seq 1 100); do
    again=$(post "$PORT_stall" "$(req qwen3-tiny "$P1" 24)" | text)
    case "$again" in ERROR*) sleep 0.1 ;; *) break ;; esac
done
check_eq "after the stall: reloaded, the same text" "$again" "$REF_P1"
stop_server stall

# refusals
out=$("$CAIRN_BIN" serve "${common[@]}" --tensor-parallel 2 --hot-cache-max-size 64M --port 0 2>&1)
check_eq "tiers under tensor parallel: exit 2" "$?" "2"
check_has "tiers under tensor parallel: why" "$out" "lower KV tiers (--hot-cache-max-size, --ssd-cache-dir) are not supported under tensor parallel"
out=$("$CAIRN_BIN" serve "${common[@]}" --tensor-parallel 2 --speculative mtp --port 0 2>&1)
check_eq "MTP under tensor parallel: exit 2" "$?" "2"
check_has "MTP under tensor parallel: why" "$out" "--speculative mtp is not supported under tensor parallel"
out=$("$CAIRN_BIN" serve --model "$MD/qwen3-tiny" --device cpu --tensor-parallel 3 --preload --port 0 2>&1)
check "3 ranks on 4 heads: the load fails" [ "$?" -ne 0 ]
check_has "3 ranks on 4 heads: why" "$out" "does not divide by --tensor-parallel 3"
out=$("$CAIRN_BIN" serve --model "$MD/qwen3-tiny" --device cuda --tensor-parallel 16 --port 0 2>&1)
check_eq "16 GPU ranks: exit 2" "$?" "2"
check_has "16 GPU ranks: why" "$out" "--tensor-parallel 16 --device cuda"
finish tp_serve
