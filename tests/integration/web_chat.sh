#!/usr/bin/env bash
# Chat page end to end: cairn serves models/demo, headless Chromium (playwright-core) opens
# the page, asks "What is the capital of Japan?" and checks the streamed reply and the tok/s stat.
# Env: CAIRN_BIN (built cairn), CAIRN_SRC (repo root). Needs node, chromium, and
# playwright-core under $CAIRN_SRC/.deps/npm (scripts/bootstrap.sh test installs them).
set -euo pipefail
src=${CAIRN_SRC:?CAIRN_SRC not set}
bin=${CAIRN_BIN:?CAIRN_BIN not set}
here=$(cd "$(dirname "$0")" && pwd)
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$chromium" ]; then
    echo "web_chat: chromium not found (apt-get install chromium)" >&2
    exit 1
fi
exec node "$here/web_chat.mjs" --bin "$bin" --src "$src" --chromium "$chromium" \
    --model "${CAIRN_DEMO_MODEL:-$src/models/demo}"
