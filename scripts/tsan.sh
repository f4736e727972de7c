#!/usr/bin/env bash
# ThreadSanitizer build of the threaded parts (the cpu pool and every op fanned out over it).
# Usage: scripts/tsan.sh [ctest -R regex]   (default: test_cpu_ops). Builds into build-tsan/.
set -euo pipefail
# CUDA off: with the toolkit the link goes through g++, which pulls GCC's libtsan under clang's
# instrumentation ("FATAL: ThreadSanitizer: unexpected memory mapping" at start).
cd "$(dirname "$0")/.."
regex=${1:-test_cpu_ops}
CC=clang cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCAIRN_CUDA=OFF \
    -DCMAKE_C_FLAGS="-fsanitize=thread -fno-omit-frame-pointer -O1 -g" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build build-tsan -j"$(nproc)" --target "$regex" >/dev/null
cd build-tsan
# Short spins: under TSan every pause is slow and the machine may be oversubscribed.
CAIRN_CPU_SPIN=${CAIRN_CPU_SPIN:-200} TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest -R "$regex" --output-on-failure
