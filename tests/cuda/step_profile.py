#!/usr/bin/env python3
"""GPU time of whole decode steps by kernel class, from Nsight Compute's per-kernel CSV.

Usage: step_profile.py NCU_CSV LABEL[,LABEL...]

NCU_CSV is the output of a run whose steps were chosen with CAIRN_CUDA_PROF_STEPS
(cuda_prof.cu), for example
    CAIRN_CUDA_PROF_STEPS=8,64,128:20:1 ncu --clock-control none --profile-from-start off \\
        --metrics gpu__time_duration.sum --csv --page raw \\
        cairn bench-engine --model DIR --device cuda --concurrency 8,64,128 ...
Each profiled step starts with its embedding kernel, so the kernels are cut into steps there;
LABELs name the steps in order (e.g. the row counts 8,64,128). Every kernel is serialized by
ncu: a duration is the kernel alone, without the launch gaps or the overlap of programmatic
dependent launch that the graph replay has. Per step: each class's kernels, total us, share.
"""
import csv
import re
import sys
from collections import defaultdict

CLASSES = [  # (class, regex on the kernel's name), first match wins
    ("embed", r"embed"),
    ("gemv (decode matmul)", r"gemv"),
    ("act f32->bf16", r"prep_bf16|to_bf16|to_f16"),
    ("dequant", r"dequant"),
    ("attention", r"attn"),
    ("rmsnorm", r"rmsnorm"),
    ("qk norm/rope/kv store", r"qk_rope|rope|kv_store"),
    ("silu_mul", r"silu"),
    ("residual add", r"add_kernel|add_bias"),
    ("sample", r"sample"),
    ("gather rows", r"gather"),
    ("moe route", r"moe_route"),
    ("moe experts", r"moe_"),
    ("gemm (cuBLASLt)", r"gemm|nvjet|xmma|cutlass|sm90|splitK|reduce"),
]


def kclass(name):
    for c, rx in CLASSES:
        if re.search(rx, name):
            return c
    return "other"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    labels = sys.argv[2].split(",")
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = []
    for r in csv.DictReader(lines):
        v = r.get("gpu__time_duration.sum", "")
        try:
            ns = float(v.replace(",", ""))
        except ValueError:
            continue  # the units row
        rows.append((r.get("Kernel Name", "?"), ns))
    if not rows:
        sys.exit("step_profile: no kernel rows in %s" % sys.argv[1])
    steps = []
    for name, ns in rows:
        if re.search(r"embed", name) or not steps:
            steps.append([])
        steps[-1].append((name, ns))
    for i, st in enumerate(steps):
        label = labels[i] if i < len(labels) else "step %d" % i
        tot = defaultdict(float)
        cnt = defaultdict(int)
        for name, ns in st:
            c = kclass(name)
            tot[c] += ns
            cnt[c] += 1
        all_ns = sum(tot.values())
        print("step %s: %d kernels, %.1f us of kernel time" % (label, len(st), all_ns / 1e3))
        for c in sorted(tot, key=tot.get, reverse=True):
            print("  %-24s %5d %10.1f us %5.1f%%" % (c, cnt[c], tot[c] / 1e3, 100 * tot[c] / all_ns))
        big = defaultdict(float)
        for name, ns in st:
            if kclass(name) in ("gemm (cuBLASLt)", "other"):
                big[re.sub(r"\(.*", "", name)[:90]] += ns
        for k in sorted(big, key=big.get, reverse=True)[:6]:
            print("    %-90s %9.1f us" % (k, big[k] / 1e3))


if __name__ == "__main__":
    main()
