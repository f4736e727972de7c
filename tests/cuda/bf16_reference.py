#!/usr/bin/env python3
"""The reference's own bf16 error on the oracle models: the justification of the GPU tolerance.

Loads each oracle checkpoint (../shared/oracle/models/NAME, README.md there has the formats) in
transformers with dtype=torch.bfloat16 on the GPU (weights and activations bf16, as a bf16
deployment runs it), replays every case of its expected.safetensors (the prompt plus greedy
continuation as one sequence) and prints, per model, the max |logit - expected| over all cases
and rows. The oracle itself was computed from the same weights with float64 activations
(float32 for MoE/hybrid), so this is what bf16 arithmetic alone costs. cairn's GPU run
(check-logits --device cuda) must stay within it.

MLX folders (*-mlx-qB-gG) are loaded by dequantizing each NAME.weight/.scales/.biases triple
(value = scale * code + bias, in f32, then rounded to bf16 like every other weight) into the
plain architecture's state dict.

usage: bf16_reference.py ORACLE_MODELS_DIR [NAME...]
       bf16_reference.py --one NAME MODEL_DIR EXPECTED   (a model kept outside the oracle tree,
                                                         such as models/demo with
                                                         tests/data/demo/expected.safetensors)
stdout: one line per model, "NAME<TAB>max_abs_dlogit<TAB>n_rows"; details on stderr.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM


def dequant_mlx(w, scales, biases, bits, group_size):
    """MLX affine layout: uint32 words, codes LSB-first, value = scale * code + bias."""
    words = w.to(torch.int64) & 0xFFFFFFFF  # safetensors stores U32; widen to avoid sign trouble
    per_word = 32 // bits
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int64) * bits
    codes = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [out, words, per_word]
    codes = codes.reshape(w.shape[0], -1).to(torch.float32)       # [out, in]
    s = scales.to(torch.float32).repeat_interleave(group_size, dim=1)
    b = biases.to(torch.float32).repeat_interleave(group_size, dim=1)
    return (s * codes + b).to(torch.bfloat16)


def load_model(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    q = cfg.get("quantization")
    if not q:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    config = AutoConfig.from_pretrained(path)
    for k in ("quantization", "quantization_config"):
        if hasattr(config, k):
            delattr(config, k)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    raw = load_file(os.path.join(path, "model.safetensors"))
    sd = {}
    for name, t in raw.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base and base + ".scales" in raw:
            sd[name] = dequant_mlx(t, raw[base + ".scales"], raw[base + ".biases"], q["bits"], q["group_size"])
        else:
            sd[name] = t.to(torch.bfloat16) if t.is_floating_point() else t
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "lm_head" not in m]  # tied embeddings
    # An MTP head (mtp.*, models/demo) has no module in transformers' dense classes; the
    # reference covers the main model, whose logits check-logits compares.
    unexpected = [u for u in unexpected if not u.startswith("mtp.")]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing[:5]} unexpected {unexpected[:5]}")
    model.tie_weights()
    return model.cuda().eval()


def run(path, exp=None):
    exp = exp or os.path.join(path, "expected.safetensors")
    with safe_open(exp, "pt") as f:
        cases = json.loads(f.metadata()["cases"])
    want = load_file(exp)
    model = load_model(path)
    worst, rows = 0.0, 0
    for i, c in enumerate(cases):
        idx = c.get("case", i)
        tokens = want[f"case{idx}.tokens"].to(torch.int64).cuda()
        expected = want[f"case{idx}.logits"].to(torch.float32)
        first = c.get("first_logit_pos", 0)
        with torch.no_grad():
            got = model(input_ids=tokens[None]).logits[0].float().cpu()
        got = got[first : first + expected.shape[0]]
        d = (got - expected).abs().max().item()
        print(f"  {os.path.basename(path)} case {idx}: T={tokens.numel()} max|dlogit|={d:.4e}", file=sys.stderr)
        worst = max(worst, d)
        rows += expected.shape[0]
    return worst, rows


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "--one":
        if len(sys.argv) != 5:
            print(__doc__, file=sys.stderr)
            return 2
        worst, rows = run(sys.argv[3], sys.argv[4])
        print(f"{sys.argv[2]}\t{worst:.4e}\t{rows}", flush=True)
        return 0
    root = sys.argv[1]
    names = sys.argv[2:] or sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "expected.safetensors")))
    failed = 0
    for name in names:
        try:
            worst, rows = run(os.path.join(root, name))
            print(f"{name}\t{worst:.4e}\t{rows}", flush=True)
        except Exception as e:  # an architecture this transformers lacks: say so, go on
            failed += 1
            print(f"{name}: not run: {type(e).__name__}: {e}", file=sys.stderr)
    return 1 if failed == len(names) else 0


if __name__ == "__main__":
    sys.exit(main())
