#!/usr/bin/env bash
# Crash campaign: ROUNDS (default 20) rounds of kill -9 of `cairn serve` (the demo model, SSD tier
# on, write-through) while requests run and the SSD writers are writing, restarting each time on
# the same folder. Every answer that comes back whole is compared with a cold reference run
# (greedy, a server without tiers); after each restart the first request's cached_tokens (what
# the SSD tier gave back) and the scan's damaged / stale-temp counts are reported. Exit 0 only
# when no answer ever differed.
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
PID=
trap '[ -n "$PID" ] && kill -KILL $PID 2>/dev/null; rm -rf "$TMP"' EXIT
SSD="$TMP/ssd"
WORDS=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 12))
N_PROMPTS=12   # a round sends 6 of them in turn: new blocks to write in the first rounds, hits later
PER_ROUND=6
body() { # body I: a shared start, then prompts part ways at the middle (I % 3) or at the end
    printf '{"model":"demo","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"Repeat: %s %s %s and then say %s"}]}' \
        "$WORDS" "variant $(( $1 % 3 ))" "$WORDS" "$1"
}
content() { sed -n 's/.*"content":"\(.*\)"},"logprobs".*/\1/p'; }
num() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" | head -1; }

start() { # start LOG ARGS...
    local log=$1; shift
    rm -f "$TMP/port"
    "$BIN" serve --model "$MODEL" --port 0 --port-file "$TMP/port" --threads 2 "$@" 2>"$log" &
    PID=$!
    for _ in $(seq 1 400); do [ -s "$TMP/port" ] && break; sleep 0.05; done
    [ -s "$TMP/port" ] || { echo "server did not start:"; cat "$log"; exit 1; }
    PORT=$(cat "$TMP/port")
}
ask() { curl -s --max-time 120 "http://127.0.0.1:$PORT/v1/chat/completions" -d "$(body "$1")"; }

start "$TMP/ref.log"
for i in $(seq 0 $((N_PROMPTS - 1))); do
    REF[$i]=$(ask "$i" | content)
    [ -n "${REF[$i]}" ] || { echo "crash: no reference answer for prompt $i"; exit 1; }
done
kill -TERM $PID; wait $PID 2>/dev/null; PID=

TIERS=(--ssd-cache-dir "$SSD" --kv-cache-size 64M --hot-cache-max-size 64M --hot-cache-write-through)
n_checked=0 n_bad=0 n_cut=0
printf '%-5s %-9s %-8s %-8s %-7s %s\n' round cached damaged stale files answers
for r in $(seq 1 "$ROUNDS"); do
    start "$TMP/round$r.log" "${TIERS[@]}"
    # first request after the restart: what the SSD tier gives back
    i0=$(( (r - 1) % N_PROMPTS ))
    out=$(ask "$i0")
    got=$(echo "$out" | content)
    cached=$(echo "$out" | num cached_tokens)
    n_checked=$((n_checked + 1))
    if [ "$got" != "${REF[$i0]}" ]; then n_bad=$((n_bad + 1)); echo "round $r: prompt $i0 differs: [$got] vs [${REF[$i0]}]"; fi
    scan=$(grep -m1 'ssd tier: .*damaged removed' "$TMP/round$r.log")
    damaged=$(echo "$scan" | sed -n 's/.* \([0-9]*\) damaged removed.*/\1/p')
    stale=$(echo "$scan" | sed -n 's/.* \([0-9]*\) stale temp files removed.*/\1/p')
    # then PER_ROUND more, one after another beside a second stream of the same, and the kill
    # lands at a random moment while they prefill and decode and the writers write
    rm -f "$TMP"/ans.*
    list=$(seq "$r" $((r + PER_ROUND - 1)) | awk -v n=$N_PROMPTS '{print $1 % n}')
    ( for i in $list; do ask "$i" > "$TMP/ans.$i"; done ) &
    ( for i in $(echo "$list" | tac); do ask "$i" > "$TMP/ans.b$i"; done ) &
    sleep "$(awk -v s=$RANDOM 'BEGIN{printf "%.2f", 1 + (s % 500) / 100}')"
    kill -KILL $PID; wait $PID 2>/dev/null; PID=
    wait
    n_ok=0
    for f in "$TMP"/ans.*; do
        i=${f##*.}; i=${i#b}
        got=$(content < "$f")
        if [ -z "$got" ]; then n_cut=$((n_cut + 1)); continue; fi # cut by the kill: nothing served
        n_checked=$((n_checked + 1)); n_ok=$((n_ok + 1))
        if [ "$got" != "${REF[$i]}" ]; then n_bad=$((n_bad + 1)); echo "round $r: prompt $i differs: [$got] vs [${REF[$i]}]"; fi
    done
    files=$(find "$SSD" -name '*.safetensors' | wc -l)
    printf '%-5s %-9s %-8s %-8s %-7s %s\n' "$r" "${cached:-?}" "${damaged:-?}" "${stale:-?}" "$files" "$n_ok/$((2 * PER_ROUND)) whole"
done
echo "crash: $ROUNDS rounds, $n_checked answers checked against the cold reference, $n_bad differed, $n_cut cut by the kill"
[ "$n_bad" -eq 0 ]
