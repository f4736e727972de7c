#!/usr/bin/env python3
"""Decode speed with and without speculative decoding, through `cairn serve` (CPU).

One server with --speculative ngram; each prompt is sent RUNS times with the per-request
extension "speculative": "off" and RUNS times without it (prompt lookup), interleaved (off, on,
on, off, ...) so that a noisy machine hits both alike. Greedy, not streamed; the rate is
completion tokens / request time (the prompt is served from the prefix cache after the first
request, the same way for both). Reports per prompt the median rate of each mode, the spread
(min-max), the speedup of the medians, whether the texts were identical, and the engine's
drafted/accepted/parks counters (from /api/status).

  bench/spec_decode.py [--model models/demo] [--runs 7] [--gen 200] [--random [--random-config C]]
                       [--serve-arg=ARG ...]
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

PROMPTS = {
    # copy-heavy: the answer should re-emit what the prompt shows (the demo model was not trained
    # to copy: it answers something else, so this shows what an untrained copier gets)
    "copy-story": "Repeat this story word for word:\n\n" + STORY,
    # the model's own repetitive output (templated stories re-use their phrases)
    "story-knight": "Write a long story about a brave knight.",
    "story-cat": "Tell me a story about a cat named Luna who finds a lost key.",
}


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
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
            return proc, port
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"server exited; log in {log.name}")
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"server did not start; log in {log.name}")


def chat(port, model_id, prompt, gen, spec):
    body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": gen,
            "temperature": 0}
    if spec:
        body["speculative"] = spec
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        d = json.loads(r.read())
    dt = time.perf_counter() - t0
    n = d["usage"]["completion_tokens"]
    return n / dt, d["choices"][0]["message"]["content"], n


def status(port):
    s = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status").read())
    return s["models"][0].get("speculative", {})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "demo"))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--gen", type=int, default=200)
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--random-config", help="config.json for --random (default: the model's; vocab_size is set "
                    "to the tokenizer's)")
    ap.add_argument("--threads", default="")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve argument (repeatable)")
    a = ap.parse_args()
    model = a.model
    if a.random:
        cfg_path = a.random_config or os.path.join(a.model, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg.pop("quantization", None)
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
    extra = (["--threads", a.threads] if a.threads else []) + a.serve_arg
    model_id = os.path.basename(os.path.normpath(model))
    res = {}
    proc, port = start(model, "ngram", extra)
    try:
        chat(port, model_id, "Hello", 8, "off")  # warm-up
        for name, prompt in PROMPTS.items():
            for mode in ("off", "ngram"):
                res[(mode, name)] = ([], set(), 0)
            for r in range(a.runs):
                for mode in (("off", "ngram") if r % 2 == 0 else ("ngram", "off")):
                    rate, text, n = chat(port, model_id, prompt, a.gen, "off" if mode == "off" else None)
                    rates, texts, _ = res[(mode, name)]
                    rates.append(rate)
                    texts.add(text)
                    res[(mode, name)] = (rates, texts, n)
        counters = status(port)
    finally:
        proc.terminate()
        proc.wait()
    print(f"model {model} ({'random weights' if a.random else 'trained'}), {a.runs} runs per mode, max {a.gen} "
          f"tokens, greedy; tok/s = completion tokens / request time")
    for name in PROMPTS:
        off, on = res[("off", name)], res[("ngram", name)]
        mo, mn = statistics.median(off[0]), statistics.median(on[0])
        same = off[1] == on[1] and len(off[1]) == 1
        print(f"  {name:12s} {off[2]:4d} tokens: off {mo:7.1f} tok/s [{min(off[0]):.1f}-{max(off[0]):.1f}]  "
              f"ngram {mn:7.1f} tok/s [{min(on[0]):.1f}-{max(on[0]):.1f}]  speedup {mn / mo if mo else 0:.3f}x  "
              f"text {'identical' if same else 'DIFFERS'}")
    print(f"  engine counters: {json.dumps(counters)}")
    ok = all(res[("off", n)][1] == res[("ngram", n)][1] for n in PROMPTS)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
