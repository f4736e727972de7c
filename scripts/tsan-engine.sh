#!/usr/bin/env bash
# ThreadSanitizer run of the engine's threaded tests (scheduler thread vs submit/cancel/stats
# callers). Usage: scripts/tsan-engine.sh [test names...]; default: every test_engine* binary.
set -euo pipefail
# CUDA off: with the toolkit the link goes through g++, which pulls GCC's libtsan under clang's
# instrumentation ("FATAL: ThreadSanitizer: unexpected memory mapping" at start).
cd "$(dirname "$0")/.."
BUILD=${CAIRN_TSAN_BUILD:-build-tsan}
CC=clang cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DCAIRN_CUDA=OFF \
    -DCMAKE_C_FLAGS="-fsanitize=thread -O1 -g" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    for f in tests/unit/test_engine*.c; do tests+=("$(basename "$f" .c)"); done
fi
cmake --build "$BUILD" -j"${JOBS:-2}" --target "${tests[@]}"
rc=0
for t in "${tests[@]}"; do
    echo "== $t (tsan)"
    CAIRN_SRC=$PWD TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$BUILD/$t" || rc=1
done
exit $rc
