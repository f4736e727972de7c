"""Checks qwen3_min against the HF oracle (tests/data/oracle/models/qwen3-tiny): max logit error."""
import sys
import json
import torch
from qwen3_min import load_model, load_safetensors

folder = sys.argv[1] if len(sys.argv) > 1 else "tests/data/oracle/models/qwen3-tiny"
m, cfg = load_model(folder, torch.float64)
exp, meta = load_safetensors(f"{folder}/expected.safetensors")
worst = 0.0
for c in json.loads(meta["cases"]):
    i = c["case"]
    toks = exp[f"case{i}.tokens"].long()[None]
    with torch.no_grad():
        lg = m(toks, torch.float64)[0]
    ref = exp[f"case{i}.logits"].double()
    got = lg[c["first_logit_pos"]:]
    err = (got - ref).abs().max().item()
    worst = max(worst, err)
    print(f"case{i}: T={toks.shape[1]} max|err|={err:.3e} scale={ref.abs().max().item():.2f}")
print("worst", worst)
sys.exit(0 if worst < 1e-3 else 1)
