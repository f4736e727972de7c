#!/usr/bin/env bash
# Disk faults under a running `cairn serve` (the demo model, SSD tier on, write-through):
# CAIRN_FILE_FAULT (base/file.h) makes every SSD block write fail with ENOSPC at write(), or with
# EIO at rename(), or come in short writes. Each time the server keeps answering, every answer is
# the cold reference's greedy text, a failed write is logged and counted in /api/status; then a
# second server on the same folder, without faults, answers the same again: a failed write left
# nothing it would serve (cached_tokens 0), short writes left whole blocks (a prefix hit).
set -uo pipefail
. "$(dirname "$0")/lib/serve_lib.sh"
model=$CAIRN_SRC/models/demo
[ -f "$model/model.safetensors" ] || { echo "skip: no demo model"; exit 77; }
BLOCK=64 # ENGINE_DEFAULT_BLOCK_SIZE
WORDS=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 12))
REQ="{\"model\":\"demo\",\"temperature\":0,\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"Repeat: $WORDS\"}]}"
content() { sed -n 's/.*"content":"\(.*\)"},"logprobs".*/\1/p'; }
num() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" | head -1; }
ask() { curl -s --max-time 120 "http://127.0.0.1:$1/v1/chat/completions" -d "$REQ"; }
TIERS=(--kv-cache-size 64M --hot-cache-max-size 64M --hot-cache-write-through --threads 2)

start_server ref --model "$model" --threads 2
ref=$(ask "$PORT_ref")
want=$(echo "$ref" | content)
pt=$(echo "$ref" | num prompt_tokens)
check "reference answer" [ -n "$want" ]
check "long prompt (${pt:-0} tokens)" [ "${pt:-0}" -ge $((3 * BLOCK)) ]
stop_server ref

run_fault() { # run_fault NAME FAULT WANT-HIT(0|1)
    local name=$1 fault=$2 hit=$3 ssd="$SERVE_TMP/ssd-$1"
    CAIRN_FILE_FAULT=$fault start_server "$name" --model "$model" --ssd-cache-dir "$ssd" "${TIERS[@]}"
    local port pid
    eval "port=\$PORT_$name; pid=\$PID_$name"
    local i out
    for i in 1 2; do
        out=$(ask "$port")
        check_eq "$name: answer $i under the fault" "$(echo "$out" | content)" "$want"
        sleep 0.5 # the writers run (and fail)
    done
    local st; st=$(curl -s "http://127.0.0.1:$port/api/status")
    local werr; werr=$(echo "$st" | sed -n 's/.*"ssd":{"enabled":true,[^}]*"write_errors":\([0-9]*\).*/\1/p')
    if [ "$hit" = 0 ]; then
        check "$name: write errors counted (${werr:-none})" [ "${werr:-0}" -ge $((pt / BLOCK - 1)) ]
        check_has "$name: the failure is logged" "$(cat "$SERVE_TMP/$name.log")" "ssd tier: write failed"
    else
        check_eq "$name: no write errors" "${werr:-none}" 0
    fi
    stop_server "$name"
    check_eq "$name: no temp file left" "$(find "$ssd" -name '*.tmp.*' | wc -l)" 0
    start_server "${name}2" --model "$model" --ssd-cache-dir "$ssd" "${TIERS[@]}"
    eval "port=\$PORT_${name}2"
    out=$(ask "$port")
    local cached; cached=$(echo "$out" | num cached_tokens)
    check_eq "$name: same answer after the restart" "$(echo "$out" | content)" "$want"
    if [ "$hit" = 0 ]; then
        check_eq "$name: nothing cached on disk" "${cached:-none}" 0
    else
        check "$name: cached ${cached:-0} >= $pt - $BLOCK" [ "${cached:-0}" -ge $((pt - BLOCK)) ]
    fi
    stop_server "${name}2"
    echo "$name: prompt $pt tokens, write errors ${werr:-0}, cached ${cached:-0} after the restart"
}
run_fault enospc "write:ENOSPC:.safetensors" 0
run_fault eio "rename:EIO:.safetensors" 0
run_fault short "write:short:.safetensors" 1
finish file_faults
