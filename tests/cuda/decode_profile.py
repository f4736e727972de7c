#!/usr/bin/env python3
"""GPU time per kernel kind of cairn's batch-1 decode, from Nsight Compute's per-kernel CSV.

Usage: decode_profile.py NCU_CSV DECODE_STEPS

NCU_CSV is the output of
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        cairn bench --model DIR --device cuda -p P -n N --reps 1
(every kernel of the run, serialized by ncu: each duration is the kernel alone, without the
launch gaps a CUDA graph replay still has). Kernels are grouped by their base name (template
arguments dropped); each kind prints its calls, total and mean time, and its share. Prefill and
warm-up kernels are in the totals too, so DECODE_STEPS (the decode steps the run made) only
scales the per-step column: it is the kind's total divided by the steps, meaningful for the
kinds that run once per decode step per layer (GEMVs, norms, rope, attention).
"""
import csv
import re
import sys
from collections import defaultdict


def base_name(name):
    name = re.sub(r"<.*", "", name)          # template arguments
    name = re.sub(r"\(.*", "", name)          # parameter list
    return name.split("::")[-1].strip() or "?"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    steps = max(1, int(sys.argv[2]))
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines too
    reader = csv.DictReader(lines)
    for r in reader:
        v = r.get("gpu__time_duration.sum", "")
        try:
            ns = float(v.replace(",", ""))
        except ValueError:
            continue  # the units row
        rows.append((base_name(r.get("Kernel Name", "?")), ns))
    if not rows:
        sys.exit("decode_profile: no kernel rows in %s" % sys.argv[1])
    total = defaultdict(float)
    calls = defaultdict(int)
    for k, ns in rows:
        total[k] += ns
        calls[k] += 1
    all_ns = sum(total.values())
    print("%-34s %7s %10s %9s %10s %6s" % ("kernel", "calls", "total us", "mean us", "us/step", "share"))
    for k in sorted(total, key=total.get, reverse=True):
        print("%-34s %7d %10.1f %9.2f %10.1f %5.1f%%" % (k[:34], calls[k], total[k] / 1e3,
              total[k] / calls[k] / 1e3, total[k] / 1e3 / steps, 100 * total[k] / all_ns))
    print("%-34s %7d %10.1f" % ("all kernels", len(rows), all_ns / 1e3))


if __name__ == "__main__":
    main()
