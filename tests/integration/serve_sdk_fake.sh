#!/usr/bin/env bash
# `cairn serve` over the scripted fake backend, driven by the official openai and
# @anthropic-ai/sdk npm clients (plain, streaming, tools, reasoning, usage, errors).
set -u
cd "${CAIRN_SRC:-.}"
source tests/integration/lib/serve_lib.sh
NM="${CAIRN_NPM:-${CAIRN_SRC:-.}/.deps/npm/node_modules}"
if [ ! -d "$NM/openai" ] || ! command -v node >/dev/null; then echo "skip: npm clients not installed"; exit 77; fi
cat > "$SERVE_TMP/fake.json" <<'JSON'
{"models":[{"id":"fake-model","context_length":4096}],
 "replies":[{"match":"sunny, 21C","text":"It is sunny in Paris."},
            {"match":"weather","text":"<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"}],
 "default":"Hello from the fake model!","chunk_bytes":2,"cached_tokens":3}
JSON
start_server fake --fake-backend "$SERVE_TMP/fake.json" --api-key k1
if NODE_PATH="$NM" node tests/integration/sdk/sdk_check.cjs "http://127.0.0.1:$PORT_fake" k1 fake-model fake; then ok; else fail "sdk_check fake"; fi
stop_server fake
finish serve_sdk_fake
