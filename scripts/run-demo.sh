#!/usr/bin/env bash
# Serves the bundled demo model in the foreground: `make run` calls this after the build.
#   scripts/run-demo.sh [PORT]      (default 8000; CAIRN_BIN / CAIRN_DEMO_MODEL override paths)
# Prints the chat page's URL and a ready curl line as soon as the server answers /health.
set -euo pipefail
port=${1:-8000}
cd "$(dirname "$0")/.."
bin=${CAIRN_BIN:-build/cairn}
model=${CAIRN_DEMO_MODEL:-models/demo}
host=127.0.0.1
base="http://$host:$port"

if [ ! -x "$bin" ]; then
    echo "run-demo: $bin is missing: run 'make build' first" >&2
    exit 1
fi
if [ ! -f "$model/model.safetensors" ]; then
    echo "run-demo: no checkpoint in $model (see scripts/demo-model/README.md to train one)" >&2
    exit 1
fi

banner() {
    cat <<MSG

  cairn is serving the demo model ($model)

    chat page:  $base/

    try it:     curl -s $base/v1/chat/completions -H 'Content-Type: application/json' \\
                  -d '{"model": "demo", "messages": [{"role": "user", "content": "What is the capital of Japan?"}]}'

  Ctrl+C stops the server.

MSG
}

# Wait for /health in the background, then print the banner once.
(
    for _ in $(seq 1 600); do
        if curl -fsS -o /dev/null --max-time 1 "$base/health" 2>/dev/null; then
            banner
            exit 0
        fi
        sleep 0.2
    done
    echo "run-demo: the server did not answer $base/health within 2 minutes" >&2
) &
waiter=$!
trap 'kill "$waiter" 2>/dev/null || true' EXIT

echo "run-demo: starting $bin serve --model $model --host $host --port $port"
"$bin" serve --model "$model" --host "$host" --port "$port"
