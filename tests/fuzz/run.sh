#!/usr/bin/env bash
# Replays a fuzz target's corpus (tests/fuzz/corpus/NAME.tar.gz, see corpus.sh), then fuzzes it
# for CAIRN_FUZZ_SECONDS (default 10) with a fixed seed (CAIRN_FUZZ_SEED, default 1; 0 = random)
# so CI is deterministic. What the run finds stays in a temporary folder: corpus.sh merge keeps it.
set -euo pipefail
bin=$1; name=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
corpus=$work/corpus
mkdir -p "$work/new"
bash tests/fuzz/corpus.sh unpack "$name" "$corpus"
"$bin" -runs=0 "$corpus"
seed=${CAIRN_FUZZ_SEED:-1}
"$bin" -seed="$seed" -max_total_time="${CAIRN_FUZZ_SECONDS:-10}" -max_len=65536 \
    -artifact_prefix="$work/" -print_final_stats=0 "$work/new" "$corpus" 2>&1 | tail -3
