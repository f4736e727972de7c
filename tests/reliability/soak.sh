#!/usr/bin/env bash
# Soak: one ASan build of `cairn serve` (the demo model) under STREAMS (64) concurrent request
# loops for SOAK_SECONDS (600), mixing good streaming / whole requests (checked against their
# greedy reference), client disconnects mid-stream and malformed requests (bad JSON, wrong types,
# a body over --max-body-size). Reports resident memory at the start, peak and end, then stops
# the server gracefully (SIGTERM) and requires exit 0 with LeakSanitizer clean.
#   make test builds the ASan binary; then:  SOAK_SECONDS=60 tests/reliability/soak.sh
# SOAK_ASAN_OPTIONS replaces the server's ASAN_OPTIONS (e.g. add quarantine_size_mb=8: ASan holds
# up to 256 MiB of freed memory by default, which reads as RSS growth).
# Not in make test (too long); README "Reliability" names it. Needs node (18+, for fetch).
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${CAIRN_BIN:-build-test/cairn}
MODEL=${CAIRN_DEMO_MODEL:-models/demo}
SECS=${SOAK_SECONDS:-600}
STREAMS=${STREAMS:-64}
[ -x "$BIN" ] || { echo "soak: $BIN missing (make test builds it)"; exit 2; }
command -v node >/dev/null || { echo "soak: node missing"; exit 2; }
TMP=$(mktemp -d /tmp/cairn-soak.XXXXXX)
export CAIRN_HOME="$TMP/home"
trap 'kill -KILL $PID 2>/dev/null; rm -rf "$TMP"' EXIT
ASAN_OPTIONS=${SOAK_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BIN" serve --model "$MODEL" --port 0 --port-file "$TMP/port" --threads 2 --max-body-size 1M \
    2>"$TMP/serve.log" &
PID=$!
for _ in $(seq 1 400); do [ -s "$TMP/port" ] && break; sleep 0.05; done
[ -s "$TMP/port" ] || { echo "soak: server did not start"; cat "$TMP/serve.log"; exit 1; }
rss() { awk '/^VmRSS/{print $2}' /proc/$PID/status 2>/dev/null; }
( while kill -0 $PID 2>/dev/null; do echo "$(date +%s) $(rss)" >> "$TMP/rss"; sleep 2; done ) &
SAMPLER=$!
node tests/reliability/soak_client.mjs "http://127.0.0.1:$(cat "$TMP/port")" "$SECS" "$STREAMS" $((2 * 1024 * 1024)) \
    > "$TMP/client.json"
client_rc=$?
sleep 2
echo "stop" >> "$TMP/rss" # samples after this one are of the shutdown
kill -TERM $PID
wait $PID
server_rc=$?
kill $SAMPLER 2>/dev/null
cat "$TMP/client.json"
# start: the third sample (2 s apart; the model is loaded, the client's reference requests ran);
# end: the last sample before the stop; the quarter points show whether it keeps growing
awk '$1=="stop"{exit} {v[++n]=$2; if ($2>p) p=$2}
     END{printf "rss_kib start %d q1 %d half %d q3 %d end %d peak %d (%d samples)\n", v[3], v[int(n/4)],
         v[int(n/2)], v[int(3*n/4)], v[n], p, n}' "$TMP/rss"
leaks=$(grep -c 'LeakSanitizer\|AddressSanitizer\|runtime error' "$TMP/serve.log")
echo "server exit $server_rc, sanitizer reports $leaks, client exit $client_rc, $SECS s, $STREAMS streams"
[ "$leaks" -gt 0 ] && grep -A30 'Sanitizer\|runtime error' "$TMP/serve.log" | head -60
[ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && [ "$leaks" -eq 0 ]
