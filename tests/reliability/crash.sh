#!/usr/bin/env bash
# Crash campaign: ROUNDS (default 20) rounds of kill -9 of `cairn serve` (the demo model, SSD tier
# on, write-through) while requests run and the SSD writers write the round's new blocks,
# restarting each time on the same folder. Every answer that comes back whole is compared with
# a reference server without tiers (greedy); after each restart the first request (the last
# round's first prompt) reports cached_tokens, what the SSD tier gave back of what the kill left,
# beside the scan's damaged / stale-temp counts. Exit 0 only when no answer ever differed.
#   CAIRN_BIN=build/cairn tests/reliability/crash.sh        (ROUNDS=N to change the count)
# Not in make test (minutes); README "Reliability" names it.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${CAIRN_BIN:-build/cairn}
MODEL=${CAIRN_DEMO_MODEL:-models/demo}
ROUNDS=${ROUNDS:-20}
[ -x "$BIN" ] || { echo "crash: $BIN missing (make build)"; exit 2; }
TMP=$(mktemp -d /tmp/cairn-crash.XXXXXX)
export CAIRN_HOME="$TMP/home"
PIDS=
trap 'kill -KILL $PIDS 2>/dev/null; rm -rf "$TMP"' EXIT
SSD="$TMP/ssd"
WORDS=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 12))
PER_ROUND=6
body() { # body R J: round R's prompts share a start, part from other rounds' at "variant R" in
         # the middle (new blocks to write every round) and from each other at the end
    printf '{"model":"demo","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"Repeat: %s variant %s %s and then say %s"}]}' \
        "$WORDS" "$1" "$WORDS" "$2"
}
content() { sed -n 's/.*"content":"\(.*\)"},"logprobs".*/\1/p'; }
num() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" | head -1; }

start() { # start NAME LOG ARGS...: sets PID_NAME, PORT_NAME
    local name=$1 log=$2; shift 2
    rm -f "$TMP/port"
    "$BIN" serve --model "$MODEL" --port 0 --port-file "$TMP/port" --threads 2 "$@" 2>"$log" &
    printf -v "PID_$name" '%s' $!
    for _ in $(seq 1 400); do [ -s "$TMP/port" ] && break; sleep 0.05; done
    [ -s "$TMP/port" ] || { echo "server did not start:"; cat "$log"; exit 1; }
    printf -v "PORT_$name" '%s' "$(cat "$TMP/port")"
}
ask() { curl -s --max-time 120 "http://127.0.0.1:$1/v1/chat/completions" -d "$(body "$2" "$3")"; }

# the reference: a server without tiers, up for the whole run
start ref "$TMP/ref.log"
PIDS="$PID_ref"
declare -A REF
reference() { # reference ROUND: REF[R,J] for its prompts
    for j in $(seq 0 $((PER_ROUND - 1))); do
        REF[$1,$j]=$(ask "$PORT_ref" "$1" "$j" | content)
        [ -n "${REF[$1,$j]}" ] || { echo "crash: no reference answer for $1,$j"; exit 1; }
    done
}
verify() { # verify ROUND J ANSWER-FILE: 0 cut (nothing served), 1 whole and equal, else differs
    local got; got=$(content < "$3")
    [ -z "$got" ] && return 0
    n_checked=$((n_checked + 1))
    if [ "$got" = "${REF[$1,$2]}" ]; then return 1; fi
    n_bad=$((n_bad + 1)); echo "round $1 prompt $2 differs: [$got] vs [${REF[$1,$2]}]"; return 2
}

TIERS=(--ssd-cache-dir "$SSD" --kv-cache-size 64M --hot-cache-max-size 64M --hot-cache-write-through)
n_checked=0 n_bad=0 n_cut=0
printf '%-5s %-9s %-8s %-8s %-7s %s\n' round cached damaged stale files answers
reference 0
for r in $(seq 1 "$ROUNDS"); do
    reference "$r"
    start srv "$TMP/round$r.log" "${TIERS[@]}"
    PIDS="$PID_ref $PID_srv"
    # first request after the restart: the last round's first prompt, from what its kill left
    ask "$PORT_srv" $((r - 1)) 0 > "$TMP/first"
    cached=$(num cached_tokens < "$TMP/first")
    verify $((r - 1)) 0 "$TMP/first"; [ $? -eq 0 ] && n_cut=$((n_cut + 1))
    scan=$(grep -m1 'ssd tier: .*damaged removed' "$TMP/round$r.log")
    damaged=$(echo "$scan" | sed -n 's/.* \([0-9]*\) damaged removed.*/\1/p')
    stale=$(echo "$scan" | sed -n 's/.* \([0-9]*\) stale temp files removed.*/\1/p')
    # this round's prompts in two streams (in turn and in reverse); the kill lands at a random
    # moment while they prefill and decode and the writers write their new blocks
    rm -f "$TMP"/ans.*
    ( for j in $(seq 0 $((PER_ROUND - 1))); do ask "$PORT_srv" "$r" "$j" > "$TMP/ans.a$j"; done ) &
    ( for j in $(seq $((PER_ROUND - 1)) -1 0); do ask "$PORT_srv" "$r" "$j" > "$TMP/ans.b$j"; done ) &
    sleep "$(awk -v s=$RANDOM 'BEGIN{printf "%.2f", 2 + (s % 1000) / 100}')"
    kill -KILL "$PID_srv"; wait "$PID_srv" 2>/dev/null
    PIDS="$PID_ref"
    wait $(jobs -p | grep -v "^$PID_ref\$") 2>/dev/null
    n_ok=0
    for f in "$TMP"/ans.*; do
        j=${f##*.}; j=${j#[ab]}
        verify "$r" "$j" "$f"
        case $? in 0) n_cut=$((n_cut + 1)) ;; 1) n_ok=$((n_ok + 1)) ;; esac
    done
    files=$(find "$SSD" -name '*.safetensors' | wc -l)
    printf '%-5s %-9s %-8s %-8s %-7s %s\n' "$r" "${cached:-?}" "${damaged:-?}" "${stale:-?}" "$files" "$n_ok/$((2 * PER_ROUND)) whole"
done
kill -TERM "$PID_ref"; wait "$PID_ref" 2>/dev/null
echo "crash: $ROUNDS rounds, $n_checked answers checked against the reference, $n_bad differed, $n_cut cut by the kill"
[ "$n_bad" -eq 0 ]
