#!/usr/bin/env python3
"""Decode speed with and without speculative decoding, through `cairn serve` (CPU or GPU).

One server (--speculative auto: MTP where the model has a head, else prompt lookup); each prompt
is sent RUNS times per mode with the per-request extension "speculative": off, ngram, mtp,
interleaved (the order rotates each run, so a noisy machine hits every mode alike). Greedy, not
streamed, batch 1; the rate is completion tokens / request time (the prompt is served from the
prefix cache after the first request, the same way for every mode). Reports per prompt the median
rate of each mode, the speedup of the medians over off, the acceptance (accepted / drafted
tokens, from usage.cairn_speculative), whether every mode gave the same text (greedy equality),
and for prompt files with an expected reply whether the text matched it; then the totals
(sum of tokens / sum of median times) and the engine's counters (/api/status).

  bench/spec_decode.py [--model models/demo] [--prompts bench/spec_copy_prompts.json]
                       [--modes off,ngram,mtp] [--runs 5] [--gen 300] [--device cpu|cuda]
                       [--random [--random-config C]] [--serve-arg=ARG ...] [--json OUT]
  --prompts: a JSON list of {"name", "messages", "tools"?, "expect"?} (bench/spec_copy_prompts.json:
            held-out copy-and-edit tasks, scripts/demo-model/make_bench_prompts.py); without it,
            three built-in single-turn prompts.
  --random: a random-weight model of the same shape (cairn synth-model, demo tokenizer) in
            /tmp/cairn-spec-random-*; --random-config CONFIG gives another shape. A random model
            whose output never repeats (the hybrid tiny shape) with --serve-arg=--spec-ngram-min
            --serve-arg=1 drafts often and is (almost) never right: what parking costs.
  CAIRN_BIN (default build/cairn): use a release build; the machine should be quiet.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("CAIRN_BIN", os.path.join(ROOT, "build", "cairn"))

STORY = ("Once upon a time there was a little fox named Max. Max lived in a big green forest "
         "near a river. Every morning Max went to the river to drink water and to look at the "
         "fish. One day Max saw a small bird that could not fly. Max helped the bird and they "
         "became good friends. The end.")

PROMPTS = [
    {"name": "copy-story", "messages": [{"role": "user", "content": "Repeat this story word for word:\n\n" + STORY}]},
    # the model's own repetitive output (templated stories re-use their phrases)
    {"name": "story-knight", "messages": [{"role": "user", "content": "Write a long story about a brave knight."}]},
    {"name": "story-cat", "messages": [{"role": "user", "content": "Tell me a story about a cat named Luna who "
                                        "finds a lost key."}]},
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(model, mode, extra):
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="cairn-spec-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen([BIN, "serve", "--model", model, "--port", str(port), "--preload",
                             "--speculative", mode] + extra, stdout=log, stderr=log)
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
            return proc, port
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"server exited; log in {log.name}")
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"server did not start; log in {log.name}")


def chat(port, model_id, p, gen, spec):
    """(completion tokens, seconds, text, drafted, accepted) of one greedy request."""
    body = {"model": model_id, "messages": p["messages"], "max_tokens": gen, "temperature": 0,
            "speculative": spec}
    if p.get("tools"):
        body["tools"] = p["tools"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        d = json.loads(r.read())
    dt = time.perf_counter() - t0
    u = d["usage"]
    cs = u.get("cairn_speculative", {})
    return u["completion_tokens"], dt, d["choices"][0]["message"].get("content") or "", cs.get("drafted", 0), \
        cs.get("accepted", 0)


def status(port):
    s = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status").read())
    return s["models"][0].get("speculative", {})


def random_model(a):
    cfg_path = a.random_config or os.path.join(a.model, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.pop("quantization", None)
    cfg.pop("num_nextn_predict_layers", None)  # synth-model writes no MTP head
    with open(os.path.join(a.model, "config.json")) as f:
        cfg["vocab_size"] = json.load(f)["vocab_size"]
    tag = os.path.basename(os.path.dirname(os.path.abspath(cfg_path)))
    model = f"/tmp/cairn-spec-random-{tag}"
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        os.makedirs(model, exist_ok=True)
        with open(os.path.join(model, "in-config.json"), "w") as f:
            json.dump(cfg, f)
        subprocess.check_call([BIN, "synth-model", "--config", os.path.join(model, "in-config.json"), "--out",
                               model, "--tokenizer", a.model, "--dtype", "q8", "--seed", "7"])
        for f in ("tokenizer_config.json", "generation_config.json"):
            src = os.path.join(a.model, f)
            if os.path.exists(src):
                with open(src) as i, open(os.path.join(model, f), "w") as o:
                    o.write(i.read())
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--prompts", help="JSON prompt file (default: three built-in prompts)")
    ap.add_argument("--modes", default="off,ngram", help="comma-separated: off, ngram, mtp, auto")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--gen", type=int, default=200)
    ap.add_argument("--device", default="", help="serve --device (cpu, cuda)")
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--random-config", help="config.json for --random (default: the model's; vocab_size is set "
                    "to the tokenizer's)")
    ap.add_argument("--threads", default="")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve argument (repeatable)")
    ap.add_argument("--json", help="write the per-prompt results here")
    a = ap.parse_args()
    modes = a.modes.split(",")
    if "off" not in modes:
        modes.insert(0, "off")
    model = random_model(a) if a.random else a.model
    prompts = json.load(open(a.prompts)) if a.prompts else PROMPTS
    extra = (["--threads", a.threads] if a.threads else []) + (["--device", a.device] if a.device else []) + \
        a.serve_arg
    model_id = os.path.basename(os.path.normpath(model))
    res = {(m, p["name"]): {"rates": [], "secs": [], "texts": set(), "n": 0, "drafted": 0, "accepted": 0}
           for p in prompts for m in modes}
    proc, port = start(model, "auto" if "mtp" in modes else "ngram", extra)
    try:
        chat(port, model_id, {"messages": [{"role": "user", "content": "Hello"}]}, 8, "off")  # warm-up
        for p in prompts:
            chat(port, model_id, p, a.gen, "off")  # puts the prompt in the prefix cache for every mode
            for r in range(a.runs):
                order = modes[r % len(modes):] + modes[:r % len(modes)]
                for mode in order:
                    n, dt, text, dr, ac = chat(port, model_id, p, a.gen, mode)
                    x = res[(mode, p["name"])]
                    x["rates"].append(n / dt)
                    x["secs"].append(dt)
                    x["texts"].add(text)
                    x["n"], x["drafted"], x["accepted"] = n, x["drafted"] + dr, x["accepted"] + ac
        counters = status(port)
    finally:
        proc.terminate()
        proc.wait()
    print(f"model {model} ({'random weights' if a.random else 'trained'}) {a.device or 'default device'}, "
          f"{a.runs} runs per mode, max {a.gen} tokens, greedy, batch 1; tok/s = completion tokens / request time; "
          f"accept = accepted / drafted tokens")
    hdr = f"  {'prompt':12s} {'tokens':>6s}" + "".join(f" {m + ' tok/s':>11s}" for m in modes) + \
        "".join(f" {m + ' x':>8s} {m + ' acc':>8s}" for m in modes if m != "off") + "  text"
    print(hdr)
    tot = {m: [0, 0.0, 0, 0] for m in modes}
    ok_all, out = True, []
    for p in prompts:
        xs = {m: res[(m, p["name"])] for m in modes}
        med = {m: statistics.median(xs[m]["rates"]) for m in modes}
        same = len(set().union(*[xs[m]["texts"] for m in modes])) == 1
        ok_all &= same
        text = next(iter(xs["off"]["texts"]))
        match = "" if "expect" not in p else (" matches expected" if text == p["expect"] else " != expected")
        line = f"  {p['name']:12s} {xs['off']['n']:6d}" + "".join(f" {med[m]:11.1f}" for m in modes)
        for m in modes:
            if m == "off":
                continue
            acc = xs[m]["accepted"] / xs[m]["drafted"] if xs[m]["drafted"] else 0.0
            line += f" {med[m] / med['off']:7.2f}x {acc:8.2f}"
        print(line + f"  {'identical' if same else 'DIFFERS'}{match}")
        for m in modes:
            t = tot[m]
            t[0] += xs[m]["n"]
            t[1] += statistics.median(xs[m]["secs"])
            t[2] += xs[m]["drafted"]
            t[3] += xs[m]["accepted"]
        out.append({"name": p["name"], "tokens": xs["off"]["n"], "identical": same, "tok_s": med,
                    "drafted": {m: xs[m]["drafted"] for m in modes}, "accepted": {m: xs[m]["accepted"] for m in modes},
                    "texts": {m: sorted(xs[m]["texts"]) for m in modes}, "expect": p.get("expect")})
    off_rate = tot["off"][0] / tot["off"][1]
    line = f"  {'all':12s} {tot['off'][0]:6d}" + "".join(f" {tot[m][0] / tot[m][1]:11.1f}" for m in modes)
    for m in modes:
        if m != "off":
            line += f" {tot[m][0] / tot[m][1] / off_rate:7.2f}x {tot[m][3] / tot[m][2] if tot[m][2] else 0:8.2f}"
    print(line + "  (sum of tokens / sum of median request times)")
    print(f"  engine counters: {json.dumps(counters)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": model, "device": a.device, "runs": a.runs, "prompts": out}, f, indent=1)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
