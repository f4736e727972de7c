#!/usr/bin/env python3
"""Pads a byte-level BPE tokenizer to a model's vocabulary size, for serving random-weight
checkpoints (`cairn synth-model`) whose vocab (e.g. Llama-3's 128,256) is larger than the
tokenizer at hand (the demo model's 2,339 ids).

    bench/synth_tokenizer.py SRC_DIR DST_DIR VOCAB_SIZE

Copies SRC_DIR's tokenizer.json and tokenizer_config.json to DST_DIR (next to the checkpoint's
config.json), with the ids the tokenizer lacks filled by plain vocabulary entries "Ġtok<ID>"
(byte-level: they decode to " tok<ID>"). No merge produces them, so encoding is unchanged;
every id a random model can emit decodes to text. The added tokens keep their ids, so they must
lie below VOCAB_SIZE. Stdlib json only.
"""
import json
import os
import shutil
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().split("\n\n")[1])
    src, dst, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    if t["model"]["type"] != "BPE":
        sys.exit("synth_tokenizer: only BPE tokenizers")
    v = t["model"]["vocab"]
    used = set(v.values()) | {a["id"] for a in t.get("added_tokens", [])}
    if max(used) >= vocab:
        sys.exit(f"synth_tokenizer: the tokenizer has id {max(used)}, past vocab {vocab}")
    for i in range(vocab):
        if i not in used:
            v["\u0120tok%d" % i] = i
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False)
    cfg = os.path.join(src, "tokenizer_config.json")
    if os.path.exists(cfg):
        shutil.copy(cfg, os.path.join(dst, "tokenizer_config.json"))
    print(f"synth_tokenizer: {len(used)} ids of {src} padded to {vocab} in {dst}")


if __name__ == "__main__":
    main()
