#!/usr/bin/env python3
"""Load generator for `cairn serve`: N streaming /v1/completions requests submitted at once.

    bench/http_load.py --port 8080 --model NAME [-n 1000] [--prompt-min 200 --prompt-max 2000]
                       [--out-min 100 --out-max 500] [--seed 1] [--vocab 128256] [--concurrency N]
                       [--procs P] [--json FILE] [--no-warmup] [--poll S] [--max-seconds S]

Each request is a fixed-seed random prompt of token ids (the OpenAI completions API takes
`prompt` as an array of ids, so the lengths are exact whatever the tokenizer), `max_tokens` from
the output range, `ignore_eos`, greedy, `stream: true`. Reports the aggregate output tok/s over
the wall time from the first submit to the last token, TTFT (submit -> first token) and ITL (the
gaps between a stream's tokens) at p50 / p90 / p99, and errors by HTTP status. Then where the
server's time went, from /api/status read before and after the run (and once a second during
it): steps, token rows per step, decode-only vs prefill-carrying steps, the host phases, peak
running / waiting / KV blocks, preemptions. With a cairn that has the scheduler's accounting
(/api/status steps.thread_s ...), also the scheduler thread's whole time (idle, between steps,
before / in / after the forward), every step by kind and by token rows, and what preemption
cost (readmissions, recomputed rows, evictions); one line of it per status poll (--poll
seconds) during the run, so a run cut by a timeout still says where its time went.

Stdlib only (asyncio with raw sockets: one connection per request, HTTP/1.1, chunked SSE),
spread over P forked client processes (a slice of the requests each, started together on a
barrier) so that the client keeps up with 10^4+ tokens/s. It raises its open-file limit to
N + 256 (the soft limit is often 1,024); the server needs as many (bench/gpu_serve_figures.sh
raises the shell's limit), `--max-waiting` and `--max-concurrent-requests` of at least N, else
429s. Tokens are counted from the SSE chunks: one `choices[0].text` delta per token event (the
finish event is none); the usage in the final chunk (completion_tokens) is used when the server
sends it.
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import random
import resource
import sys
import threading
import time
import urllib.request


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


async def read_chunked_lines(reader):
    """Yields the lines of an HTTP/1.1 chunked body (SSE lines)."""
    buf = b""
    while True:
        size_line = await reader.readline()
        if not size_line:
            break
        size = int(size_line.strip().split(b";")[0] or b"0", 16)
        if size == 0:
            await reader.readline()
            break
        data = await reader.readexactly(size)
        await reader.readline()  # CRLF after the chunk
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.rstrip(b"\r")
    if buf:
        yield buf


async def one_request(args, i, prompt, max_tokens, res, t_start):
    body = json.dumps({
        "model": args.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {args.host}:{args.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + (f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else "")
            + "Connection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    r = {"ttft": None, "itl": [], "tokens": 0, "status": 0, "t0": t0, "t_end": t0}
    res[i] = r  # what it got so far counts if --max-seconds cuts it (then it lacks "done")
    try:
        reader, writer = await asyncio.open_connection(args.host, args.port, limit=1 << 22)
        writer.write(head + body)
        await writer.drain()
        status = await reader.readline()
        r["status"] = int(status.split()[1]) if len(status.split()) > 1 else 0
        chunked = False
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            if h.lower().startswith(b"transfer-encoding:") and b"chunked" in h.lower():
                chunked = True
        if r["status"] != 200:
            await reader.read()
        else:
            lines = read_chunked_lines(reader) if chunked else None
            last = None
            usage_tokens = None

            async def plain_lines():
                while True:
                    ln = await reader.readline()
                    if not ln:
                        return
                    yield ln.rstrip(b"\r\n")

            async for ln in (lines if chunked else plain_lines()):
                if not ln.startswith(b"data:"):
                    continue
                data = ln[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    ev = json.loads(data)
                except ValueError:
                    continue
                if ev.get("usage") and ev["usage"].get("completion_tokens") is not None:
                    usage_tokens = ev["usage"]["completion_tokens"]
                ch = ev.get("choices")
                # the finish event ("text": "", finish_reason set) carries no token
                if not ch or (not ch[0].get("text") and ch[0].get("finish_reason")):
                    continue
                now = time.perf_counter()
                if r["ttft"] is None:
                    r["ttft"] = now - t0
                elif last is not None:
                    r["itl"].append(now - last)
                last = now
                r["tokens"] += 1
                r["t_end"] = now
            if usage_tokens is not None:
                r["tokens"] = usage_tokens
        writer.close()
    except (OSError, asyncio.IncompleteReadError, ValueError) as ex:
        r["error"] = str(ex)
    r["done"] = True


def make_requests(args):
    rnd = random.Random(args.seed)
    reqs = []
    for _ in range(args.n):
        n_p = rnd.randint(args.prompt_min, args.prompt_max)
        n_o = rnd.randint(args.out_min, args.out_max)
        reqs.append(([rnd.randrange(args.vocab) for _ in range(n_p)], n_o))
    return reqs


async def run_slice(args, reqs, idx, concurrency):
    res = {}
    sem = asyncio.Semaphore(concurrency or len(idx) or 1)

    async def guarded(i):
        async with sem:
            await one_request(args, i, reqs[i][0], reqs[i][1], res, 0)

    run = asyncio.gather(*(guarded(i) for i in idx))
    if args.max_seconds > 0:
        try:  # cancelling closes the connections: the server cancels those requests
            await asyncio.wait_for(run, args.max_seconds)
        except asyncio.TimeoutError:
            pass
    else:
        await run
    return res


def worker(args, reqs, idx, concurrency, barrier, q):
    """One client process: its share of the requests, all submitted at once after the barrier
    (perf_counter is CLOCK_MONOTONIC, one clock for every process)."""
    try:
        barrier.wait()
        t = time.perf_counter()
        q.put((t, asyncio.run(run_slice(args, reqs, idx, concurrency))))
    except BaseException as ex:  # the parent must not wait forever on a dead worker
        q.put((time.perf_counter(), {i: {"status": 0, "error": f"worker: {ex}", "ttft": None, "itl": [],
                                         "tokens": 0, "t0": 0, "t_end": 0} for i in idx}))


def get_status(args):
    """GET /api/status as a dict, or None."""
    try:
        rq = urllib.request.Request(f"http://{args.host}:{args.port}/api/status")
        if args.api_key:
            rq.add_header("Authorization", f"Bearer {args.api_key}")
        with urllib.request.urlopen(rq, timeout=10) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def model_entry(st, name):
    ms = (st or {}).get("models", [])
    for m in ms:
        if m.get("id") == name:
            return m
    return ms[0] if ms else {}


def dget(m, *path):
    for k in path:
        m = (m or {}).get(k, 0)
    return m or 0


def poll_line(t, m0, m1):
    """One line on the interval between two /api/status reads of the model (m0 may be {})."""
    def d(*path):
        return dget(m1, *path) - dget(m0, *path)

    dt = d("steps", "thread_s", "elapsed") or 1e-9
    kv = m1.get("kv_blocks", {})
    line = (f"  [{t:6.1f} s] running {m1.get('running', 0)} waiting {m1.get('waiting', 0)} | KV used "
            f"{kv.get('used', 0)} cached {kv.get('cached', 0)} free {kv.get('free', 0)} | out "
            f"{d('generated_tokens') / dt:.0f} tok/s, prompt {d('steps', 'rows', 'prefill') / dt:.0f} rows/s")
    if not dget(m1, "steps", "thread_s"):
        return line
    kinds = [d("steps", "by_kind", k, "steps") for k in ("decode", "prefill", "mixed")]
    fwd = sum(d("steps", "by_kind", k, "forward_s") for k in ("decode", "prefill", "mixed"))
    n = sum(kinds)
    return (line + f" | {n} steps d/p/m {kinds[0]}/{kinds[1]}/{kinds[2]}, "
            f"{(d('steps', 'rows', 'decode') + d('steps', 'rows', 'verify') + d('steps', 'rows', 'prefill')) / max(n, 1):.0f}"
            f" rows/step | thread {dt:.1f} s: forward {100 * fwd / dt:.0f}%, pre "
            f"{100 * d('steps', 'thread_s', 'pre') / dt:.0f}%, post {100 * d('steps', 'thread_s', 'post') / dt:.0f}%, "
            f"between {100 * d('steps', 'thread_s', 'between') / dt:.0f}%, idle "
            f"{100 * d('steps', 'thread_s', 'idle') / dt:.0f}% | preempt {d('preemptions')} readmit "
            f"{d('steps', 'sched', 'readmissions')} recomputed {d('steps', 'rows', 'recomputed')} evicted "
            f"{d('steps', 'sched', 'evicted_blocks')}")


def poll_status(args, stop, peak, t_ref, m0):
    """Peaks of the engine's queue and KV use while the run goes, and a line on each interval
    (one GET every --poll seconds; the first interval starts at m0, the read before the run)."""
    prev = m0
    while not stop.wait(args.poll):
        m = model_entry(get_status(args), args.model)
        if not m:
            continue
        for k, v in (("running", m.get("running", 0)), ("waiting", m.get("waiting", 0)),
                     ("kv_used", m.get("kv_blocks", {}).get("used", 0))):
            peak[k] = max(peak.get(k, 0), v)
        peak["kv_total"] = m.get("kv_blocks", {}).get("total", 0)
        if prev:
            print(poll_line(time.perf_counter() - t_ref, prev, m), flush=True)
        prev = m


def server_report(m0, m1, wall, peak):
    """Lines on where the server's time went during the run: differences of /api/status."""
    if not m1.get("steps"):
        return ["  server: /api/status has no step counters (older cairn)"]

    def d(*path):
        a, b = m0, m1
        for k in path:
            a, b = (a or {}).get(k, 0), (b or {}).get(k, 0)
        return (b or 0) - (a or 0)

    n_steps = d("steps", "count")
    phases = {k: d("steps", "host_s", k) for k in ("plan", "issue", "wait", "sample", "detok", "emit")}
    step_s = sum(phases.values())
    dec_s, dec_tok = d("steps", "decode_only_s"), d("steps", "decode_only_tokens")
    prompt, cached, gen = d("prompt_tokens"), d("cached_tokens_served"), d("generated_tokens")
    rows = prompt - cached + gen  # token rows the steps computed (recomputes after preemption aside)
    out = [f"  server: {n_steps} steps in {step_s:.2f} s of the {wall:.2f} s wall "
           f"({100 * step_s / wall if wall > 0 else 0:.0f}%), {1e3 * step_s / max(n_steps, 1):.2f} ms/step, "
           f"~{rows / max(n_steps, 1):.0f} token rows/step "
           f"({prompt - cached} prompt computed + {cached} cached + {gen} generated)",
           f"  server: decode-only steps {dec_s:.2f} s for {dec_tok} tokens "
           f"({dec_tok / dec_s if dec_s > 0 else 0:.0f} tok/s); steps with prefill {step_s - dec_s:.2f} s "
           f"({(prompt - cached) / (step_s - dec_s) if step_s - dec_s > 0 else 0:.0f} prompt tok/s, "
           f"decodes riding along)",
           "  server: host phases s: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
           + " (issue + wait = the forward: launches, then the device)",
           f"  server: peak running {peak.get('running', 0)}, waiting {peak.get('waiting', 0)}, KV blocks "
           f"used {peak.get('kv_used', 0)} of {peak.get('kv_total', 0)}; preemptions {d('preemptions')}; "
           f"requests done {d('requests_done')}"]
    if not dget(m1, "steps", "thread_s"):
        return out
    # the scheduler's accounting: the thread's whole time, every step
    el = d("steps", "thread_s", "elapsed") or 1e-9
    fwd = phases["issue"] + phases["wait"]
    th = {k: d("steps", "thread_s", k) for k in ("idle", "between", "steps", "pre", "post")}
    out.append(f"  sched: thread {el:.2f} s = idle {th['idle']:.2f} ({100 * th['idle'] / el:.0f}%) + between steps "
               f"{th['between']:.2f} ({100 * th['between'] / el:.0f}%) + steps {th['steps']:.2f} "
               f"({100 * th['steps'] / el:.0f}%: before the forward {th['pre']:.2f}, forward {fwd:.2f}, after "
               f"{th['post']:.2f})")
    for k in ("decode", "prefill", "mixed"):
        n = d("steps", "by_kind", k, "steps")
        if not n:
            continue
        rows, ctx, f, w = (d("steps", "by_kind", k, x) for x in ("rows", "ctx", "forward_s", "wall_s"))
        out.append(f"  sched: {k:7s} steps {n:6d}, {rows / n:7.1f} rows/step ({ctx / n:9.0f} KV positions), "
                   f"forward {1e3 * f / n:8.2f} ms, "
                   f"step {1e3 * w / n:8.2f} ms, {w:7.2f} s ({100 * w / el:.0f}% of the thread)")
    rb0 = {(b["rows_min"]): b for b in dget(m0, "steps", "by_rows") or []}
    for b in dget(m1, "steps", "by_rows") or []:
        a = rb0.get(b["rows_min"], {})
        n = b["steps"] - a.get("steps", 0)
        if not n:
            continue
        w = b["wall_s"] - a.get("wall_s", 0)
        f = b["forward_s"] - a.get("forward_s", 0)
        rows = b["rows"] - a.get("rows", 0)
        hi = b["rows_max"] if b["rows_max"] >= 0 else "inf"
        out.append(f"  sched: rows {b['rows_min']:5d}-{hi!s:5s} {n:6d} steps, {rows / n:7.1f} rows/step, "
                   f"forward {1e3 * f / n:8.2f} ms, step {1e3 * w / n:8.2f} ms, {w:7.2f} s "
                   f"({100 * w / el:.0f}%), {rows / w if w > 0 else 0:.0f} rows/s")
    nn = d("steps", "new_rows", "steps")
    if nn:
        tot = {x: sum(d("steps", "by_kind", k, x) for k in ("decode", "prefill", "mixed"))
               for x in ("steps", "rows", "forward_s")}
        nr, nf = d("steps", "new_rows", "rows"), d("steps", "new_rows", "forward_s")
        rest = max(tot["steps"] - nn, 1)
        out.append(f"  sched: steps of a row count no step had before {nn} ({nr / nn:.0f} rows/step, forward "
                   f"{1e3 * nf / nn:.2f} ms) vs the others {tot['steps'] - nn} ({(tot['rows'] - nr) / rest:.0f} "
                   f"rows/step, forward {1e3 * (tot['forward_s'] - nf) / rest:.2f} ms): a backend that tunes or "
                   f"captures per shape pays on the first")
    out.append(f"  sched: rows decode {d('steps', 'rows', 'decode')}, verify {d('steps', 'rows', 'verify')}, "
               f"prefill {d('steps', 'rows', 'prefill')} (of which recomputed after preemption "
               f"{d('steps', 'rows', 'recomputed')}); preemptions {d('preemptions')} releasing "
               f"{d('steps', 'sched', 'preempted_blocks')} blocks ({d('steps', 'sched', 'repreemptions')} of a sequence "
               f"preempted before), readmissions {d('steps', 'sched', 'readmissions')} "
               f"({d('steps', 'sched', 'readmit_same_step')} in the same step), admissions deferred for KV "
               f"{d('steps', 'sched', 'admit_deferred')}, empty passes {d('steps', 'sched', 'empty_passes')}, "
               f"cached blocks evicted {d('steps', 'sched', 'evicted_blocks')}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=0, help="in flight at once (0: all)")
    ap.add_argument("--prompt-min", type=int, default=200)
    ap.add_argument("--prompt-max", type=int, default=2000)
    ap.add_argument("--out-min", type=int, default=100)
    ap.add_argument("--out-max", type=int, default=500)
    ap.add_argument("--vocab", type=int, default=128256, help="prompt ids are drawn below this")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--procs", type=int, default=0,
                    help="client processes (0: min(8, cores / 2)); one Python process parses "
                         "only some 10^4 SSE events/s")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop the run after this long (0: when every request is done); the report "
                         "covers what was streamed until then")
    ap.add_argument("--poll", type=float, default=2.0,
                    help="seconds between /api/status reads during the run (peaks, one line each)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="no untimed 4-token request first (it loads the model)")
    args = ap.parse_args()

    # one socket per request in flight, on both ends: the soft limit is often 1,024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.n + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    reqs = make_requests(args)
    if args.warmup:  # loads the model (lazily loaded on the first request) outside the timing
        w = {}
        asyncio.run(one_request(args, 0, reqs[0][0][:16], 4, w, 0))
        if w[0]["status"] != 200:
            print(f"http_load: warm-up request failed: status {w[0]['status']} {w[0].get('error', '')}")
            return 1
    n_procs = max(1, min(args.procs or min(8, (os.cpu_count() or 2) // 2), args.n))
    m0 = model_entry(get_status(args), args.model)
    stop, peak = threading.Event(), {}
    poller = threading.Thread(target=poll_status, args=(args, stop, peak, time.perf_counter(), m0), daemon=True)
    poller.start()
    ctx = multiprocessing.get_context("fork")
    barrier, q = ctx.Barrier(n_procs), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(args, reqs, list(range(k, args.n, n_procs)),
                                              -(-args.concurrency // n_procs) if args.concurrency else 0,
                                              barrier, q))
             for k in range(n_procs)]
    for p in procs:
        p.start()
    res, starts = {}, []
    for _ in procs:
        t, part = q.get()
        starts.append(t)
        res.update(part)
    for p in procs:
        p.join()
    stop.set()
    poller.join()
    m1 = model_entry(get_status(args), args.model)
    res = [res[i] for i in range(args.n)]
    t_start = min(starts)

    wall = max((r["t_end"] for r in res), default=t_start) - t_start
    ok = [r for r in res if r["status"] == 200 and "error" not in r and r.get("done")]
    cut = [r for r in res if not r.get("done")]
    got = ok + [r for r in cut if r["status"] == 200]  # tokens streamed before the cut count too
    tokens = sum(r["tokens"] for r in got)
    ttft = [r["ttft"] for r in got if r["ttft"] is not None]
    itl = [x for r in got for x in r["itl"]]
    by_status = {}
    for r in res:
        k = "cut" if not r.get("done") else r.get("error") and "conn-error" or str(r["status"])
        by_status[k] = by_status.get(k, 0) + 1
    errors = sorted({r["error"] for r in res if r.get("error")})[:3]
    # prompt tokens prefilled: every request's, or (cut) those that got their first token
    n_prompt = sum(len(reqs[i][0]) for i, r in enumerate(res) if r.get("done") or r["ttft"] is not None)
    fig = {"n": args.n, "ok": len(ok), "statuses": by_status, "procs": n_procs, "wall_s": wall,
           "output_tokens": tokens, "output_tok_s": tokens / wall if wall > 0 else 0,
           "prompt_tokens": n_prompt,
           "ttft_ms": {p: 1e3 * pct(ttft, p) for p in (50, 90, 99)},
           "itl_ms": {p: 1e3 * pct(itl, p) for p in (50, 90, 99)}}
    print(f"http_load: {args.n} requests (prompt {args.prompt_min}-{args.prompt_max}, output "
          f"{args.out_min}-{args.out_max}, seed {args.seed}; {n_procs} client processes), {len(ok)} ok; "
          f"statuses {by_status}" + (f"; errors e.g. {errors}" if errors else "")
          + (f"; {len(cut)} cut at --max-seconds {args.max_seconds:g} (their tokens so far counted; "
             "TTFT over the requests that got a token)" if cut else ""))
    print(f"  output {tokens} tokens in {wall:.2f} s: {fig['output_tok_s']:.1f} tok/s aggregate "
          f"({n_prompt} prompt tokens: {n_prompt / wall if wall > 0 else 0:.0f} tok/s)")
    print("  TTFT ms p50 %.1f p90 %.1f p99 %.1f" % tuple(fig["ttft_ms"].values()))
    print("  ITL  ms p50 %.2f p90 %.2f p99 %.2f" % tuple(fig["itl_ms"].values()))
    lines = server_report(m0, m1, wall, peak)
    print("\n".join(lines), flush=True)
    if args.json:
        fig["server"] = {"before": m0, "after": m1, "peak": peak}
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=1)
    return 0 if len(ok) + len([r for r in cut if r["status"] in (0, 200)]) == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
