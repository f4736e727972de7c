"""Checks bpe.Encoder against the oracle ids for the real Qwen3 tokenizer."""
import json
import sys
from bpe import Encoder

tok = json.load(open(sys.argv[1]))
cases = json.load(open(sys.argv[2]))["cases"]
enc = Encoder(tok)
bad = 0
for c in cases:
    got = enc.encode(c["text"])
    if got != c["ids"]:
        bad += 1
        print("MISMATCH", repr(c["text"][:40]), got[:10], c["ids"][:10])
    elif enc.decode(got) != c["decoded"]:
        bad += 1
        print("DECODE MISMATCH", repr(c["text"][:40]))
print(f"{len(cases) - bad} passed, {bad} failed")
sys.exit(1 if bad else 0)
