"""Checks hybrid_ref.py's target forward against the HF oracle of the tiny hybrid checkpoints
(tests/data/oracle/models/{qwen3_5-tiny,qwen3next-tiny}/expected.safetensors): max |logit error|.
Usage: python3 scripts/mtp-ref/check_oracle.py [folder ...]; exit 1 if any error is >= 1e-3 (as demo-model/check_oracle.py)."""
import json
import sys

import torch

from hybrid_ref import Hybrid, load_safetensors

folders = sys.argv[1:] or ["tests/data/oracle/models/qwen3_5-tiny", "tests/data/oracle/models/qwen3next-tiny"]
worst_all = 0.0
for folder in folders:
    m = Hybrid(folder)
    exp, meta = load_safetensors(f"{folder}/expected.safetensors")
    worst = 0.0
    for c in json.loads(meta["cases"]):
        i = c["case"]
        toks = exp[f"case{i}.tokens"].long()
        with torch.no_grad():
            lg, _ = m.forward(toks, 0, m.new_caches())
        ref = exp[f"case{i}.logits"].double()
        err = (lg[c["first_logit_pos"]:] - ref).abs().max().item()
        worst = max(worst, err)
        print(f"{folder} case{i}: T={len(toks)} max|err|={err:.3e} scale={ref.abs().max().item():.2f}")
    print(f"{folder}: worst {worst:.3e}")
    worst_all = max(worst_all, worst)
sys.exit(0 if worst_all < 1e-3 else 1)
