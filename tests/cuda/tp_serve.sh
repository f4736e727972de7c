#!/usr/bin/env bash
# `cairn serve --device cuda --tensor-parallel N` through the HTTP API (issue 23), against the
# plain one-GPU server, on a dense (qwen3-tiny, and models/demo with its own tokenizer), a MoE
# (qwen3-moe-tiny) and a hybrid (qwen3_5-tiny) model.
#   TP_N=1 (default): CAIRN_TP_FORCE=1 --tensor-parallel 1, the NCCL path as a group of one
#     (a communicator of one rank, the rank thread, the group's KV pool and states). A world of
#     one sums nothing, so its greedy text must EQUAL the plain path's, request by request.
#   TP_N=2+ (tests/cuda/tp_multi.sh, several GPUs): the ranks' partial sums round differently
#     from one GPU's, so text against the plain server is reported (equal, or the length of the
#     common prefix), not required; batched == solo and prefix hit == cold are required within
#     the sharded server, and /api/status must name every rank.
# In both: a batch of concurrent requests equals each alone, and a prefix-cache hit (cached
# tokens > 0) equals the cold answer.
# usage: tests/cuda/tp_serve.sh   Env: CAIRN_BIN (default build-cuda/cairn), OUT (logs), TP_N,
# TP_DEVICE (default cuda; cpu: the same script on simulated CPU ranks, a rehearsal without a GPU),
# TP_TOKENIZER (default tests/data/tp/tokenizer.json).
# Exit: 0 passed, 1 a difference, 77 no GPU (or too few, or a build without CUDA, or no python3).
set -u
cd "${CAIRN_SRC:-$(dirname "$0")/../..}"
SRC=$PWD
BIN=${CAIRN_BIN:-build-cuda/cairn}
case "$BIN" in /*) ;; *) BIN=$SRC/$BIN ;; esac
LOG=${OUT:-$(mktemp -d /tmp/cairn-tp-serve.XXXXXX)}
N=${TP_N:-1}
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 CAIRN_LOG_LEVEL=warn CAIRN_HOME=$LOG/home
DEV=${TP_DEVICE:-cuda} # TP_DEVICE=cpu rehearses the script on simulated ranks (no GPU needed)
if [ "$DEV" = cuda ]; then
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
        echo "SKIP: no GPU"; exit 77
    fi
    n_gpus=$(nvidia-smi -L | grep -c GPU)
    [ "$N" -le "$n_gpus" ] || { echo "SKIP: TP_N=$N on $n_gpus GPU(s)"; exit 77; }
fi
[ -x "$BIN" ] || { echo "SKIP: no $BIN"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
O=$SRC/tests/data/oracle/models
MD=$LOG/models
rm -rf "$MD"
for m in qwen3-tiny qwen3-moe-tiny qwen3_5-tiny; do
    mkdir -p "$MD/$m"
    for f in config.json model.safetensors; do ln -s "$O/$m/$f" "$MD/$m/$f"; done
    ln -s "${TP_TOKENIZER:-$SRC/tests/data/tp/tokenizer.json}" "$MD/$m/tokenizer.json"
done
ln -s "$SRC/models/demo" "$MD/demo"

fail=0
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null' EXIT
start() { # start NAME ARGS...: sets PORT_NAME
    local name=$1; shift
    rm -f "$LOG/$name.port"
    "$BIN" serve --port 0 --port-file "$LOG/$name.port" --model-dir "$MD" --device "$DEV" --kv-cache-size 256M \
        "$@" 2> "$LOG/$name.log" &
    PIDS+=($!)
    for _ in $(seq 1 1200); do [ -s "$LOG/$name.port" ] && break; sleep 0.1; done
    if [ ! -s "$LOG/$name.port" ]; then echo "FAIL: server $name did not start:"; tail -5 "$LOG/$name.log"; exit 1; fi
    printf -v "PORT_$name" '%s' "$(cat "$LOG/$name.port")"
}
start plain
if [ "$N" = 1 ]; then
    CAIRN_TP_FORCE=1 start tp --tensor-parallel 1
else
    start tp --tensor-parallel "$N"
fi
field() { python3 -c 'import json,sys
try: o=json.load(sys.stdin)
except Exception as e: print("BAD JSON"); sys.exit()
v=eval(sys.argv[1]); print(v if isinstance(v,str) else json.dumps(v))' "$1"; }
post() { curl -s --max-time 120 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' -d "$2"; }
req() { printf '{"model":"%s","temperature":0,"max_tokens":%d,"prompt":"%s"}' "$1" "$3" "$2"; }
text() { field '(o["choices"][0]["text"] + "|" + str(o["usage"]["completion_tokens"])) if "choices" in o else "ERROR " + json.dumps(o)'; }
prefix() { python3 -c 'import os,sys; a,b=sys.argv[1],sys.argv[2]; print(len(os.path.commonprefix([a,b])), "of", max(len(a),len(b)), "chars")' "$1" "$2"; }
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

st=$(curl -s "http://127.0.0.1:$PORT_tp/api/status")
if [ "$DEV" = cuda ]; then
    want_dev=$(python3 -c "print(','.join('cuda:%d' % r for r in range($N)))")
else
    want_dev=$(python3 -c "print(','.join('cpu:tp%d/$N' % r for r in range($N)))")
fi
got=$(echo "$st" | field 'str(o.get("tensor_parallel")) + " " + str(o.get("sharded")) + " " + ",".join(o.get("devices", []))')
[ "$got" = "$N True $want_dev" ] && ok "status: $got" || bad "status: got [$got], want [$N True $want_dev]"

P1="the cat sat on the mat and then the dog ran in the rain, a tale told at dusk"
P2="once upon a time in a land far away there lived a small fox who loved songs"
P3="where do rivers go when they reach the sea? ask the old man who fishes there"
P4="a short note on the weather: cold at dawn, warm by noon, and rain at night"
LONG="$P1. $P2. $P3. $P4. $P1 again, with a twist: the mat was red and the dog was late. hello"
for m in qwen3-tiny qwen3-moe-tiny qwen3_5-tiny demo; do
    for i in 1 2 3 4; do
        pv=P$i
        a=$(post "$PORT_plain" "$(req "$m" "${!pv}" 32)" | text)
        b=$(post "$PORT_tp" "$(req "$m" "${!pv}" 32)" | text)
        echo "$m P$i plain: $a" >> "$LOG/texts.txt"
        echo "$m P$i tp$N:  $b" >> "$LOG/texts.txt"
        case "$a" in ERROR*) bad "$m P$i: plain server: $a"; continue ;; esac
        if [ "$a" = "$b" ]; then
            ok "$m P$i: tp$N text = plain (${#a} chars)"
        elif [ "$N" = 1 ]; then
            bad "$m P$i: the group of one differs from the plain path: common prefix $(prefix "$a" "$b")"
        else
            echo "note: $m P$i: tp$N text differs from one GPU after a common prefix of $(prefix "$a" "$b")"
        fi
    done
    # batched == solo on the sharded server
    bp=()
    for i in 1 2 3 4; do
        pv=P$i
        post "$PORT_tp" "$(req "$m" "${!pv}" 32)" > "$LOG/$m.batch$i" &
        bp+=($!)
    done
    for p in "${bp[@]}"; do wait "$p"; done
    for i in 1 2 3 4; do
        pv=P$i
        solo=$(post "$PORT_tp" "$(req "$m" "${!pv}" 32)" | text)
        got=$(text < "$LOG/$m.batch$i")
        case "$got" in ERROR*) bad "$m: batched P$i: $got"; continue ;; esac
        [ "$got" = "$solo" ] && ok "$m: batched P$i = solo" || bad "$m: batched P$i [$got] != solo [$solo]"
    done
    cold=$(post "$PORT_tp" "$(req "$m" "$LONG" 16)")
    warm=$(post "$PORT_tp" "$(req "$m" "$LONG" 16)")
    hit=$(echo "$warm" | field 'str(o.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0))')
    if [ "${hit:-0}" -ge 64 ] && [ "$(echo "$warm" | text)" = "$(echo "$cold" | text)" ]; then
        ok "$m: prefix hit ($hit cached tokens) = cold"
    else
        bad "$m: prefix hit: $hit cached; warm [$(echo "$warm" | text)] cold [$(echo "$cold" | text)]"
    fi
done
grep -i "error\|fail" "$LOG/tp.log" | head -5
exit $fail
