"""Writes bench/spec_copy_prompts.json: held-out copy-and-edit prompts (gen_copy.py, eval split)
for bench/spec_decode.py, three of each kind, with the reply the corpus would give.

    /usr/bin/python3 scripts/demo-model/make_bench_prompts.py     (seeded: rewrites the same file)
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_copy  # noqa: E402

KINDS = {"story": 3, "list": 3, "config": 3, "code": 3, "quote": 3}


def main():
    rng = random.Random(2026)
    out, have = [], {k: 0 for k in KINDS}
    while any(have[k] < n for k, n in KINDS.items()):
        _, msgs, tools, expect = gen_copy.gen_copy(rng, "eval")
        kind = ("quote" if tools else "code" if "```python" in expect[0] else "config" if "```json" in expect[0]
                else "list" if expect[0][:2] in ("- ", "1.") else "story")
        if have[kind] >= KINDS[kind]:
            continue
        have[kind] += 1
        for m in msgs:  # OpenAI's wire form: a tool call's arguments are a JSON string
            for c in m.get("tool_calls", []):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
        out.append({"name": f"{kind}-{have[kind]}", "messages": msgs[:-1], "tools": tools, "expect": expect[0]})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "spec_copy_prompts.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(out)} prompts to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
