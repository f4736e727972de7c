# Helpers for integration tests that start `cairn serve` (sourced by tests/integration/*.sh).

# Each server gets its own temp folder and a free port (--port 0, read back from --port-file).


: "${CAIRN_BIN:=build/cairn}"
: "${CAIRN_SRC:=.}"
SERVE_TMP=$(mktemp -d /tmp/cairn-serve-test.XXXXXX)
# settings.json of the servers: in the test's folder, never the user's ~/.cairn
export CAIRN_HOME="$SERVE_TMP/cairn-home"
SERVE_PIDS=()
cleanup_serve() {
    for p in "${SERVE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${SERVE_PIDS[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$SERVE_TMP"
}
trap cleanup_serve EXIT

n_fail=0
n_pass=0
ok() { n_pass=$((n_pass + 1)); }
fail() { n_fail=$((n_fail + 1)); echo "FAIL: $*" >&2; }
check() { # check DESC CONDITION-COMMAND...
    local desc=$1; shift
    if "$@"; then ok; else fail "$desc"; fi
}
check_eq() { # check_eq DESC GOT WANT
    if [ "$2" = "$3" ]; then ok; else fail "$1: got [$2] want [$3]"; fi
}
check_has() { # check_has DESC HAYSTACK NEEDLE
    case "$2" in *"$3"*) ok ;; *) fail "$1: [$3] not in [${2:0:600}]" ;; esac
}

# start_server NAME ARGS... : sets PORT_<NAME> and PID_<NAME>
start_server() {
    local name=$1; shift
    local pf="$SERVE_TMP/$name.port"
    "$CAIRN_BIN" serve --port 0 --port-file "$pf" "$@" 2>"$SERVE_TMP/$name.log" &
    local pid=$!
    SERVE_PIDS+=("$pid")
    for _ in $(seq 1 200); do [ -s "$pf" ] && break; sleep 0.05; done
    if [ ! -s "$pf" ]; then echo "server $name did not start:" >&2; cat "$SERVE_TMP/$name.log" >&2; exit 1; fi
    printf -v "PORT_$name" '%s' "$(cat "$pf")"
    printf -v "PID_$name" '%s' "$pid"
}

finish() {
    echo "$1: $n_pass passed, $n_fail failed"
    [ "$n_fail" -eq 0 ]
}

# stop_server NAME: SIGTERM, wait, and check a clean exit (0; ASan/LSan findings make it fail).
stop_server() {
    local pidvar="PID_$1"
    local pid=${!pidvar}
    kill -TERM "$pid"
    wait "$pid"
    local rc=$?
    if [ "$rc" -eq 0 ]; then ok; else fail "server $1 exited with $rc"; tail -30 "$SERVE_TMP/$1.log" >&2; fi
}
