#!/usr/bin/env python3
"""Load generator for `cairn serve`: N streaming /v1/completions requests submitted at once.

    bench/http_load.py --port 8080 --model NAME [-n 1000] [--prompt-min 200 --prompt-max 2000]
                       [--out-min 100 --out-max 500] [--seed 1] [--vocab 128256] [--concurrency N]
                       [--no-warmup]

Each request is a fixed-seed random prompt of token ids (the OpenAI completions API takes
`prompt` as an array of ids, so the lengths are exact whatever the tokenizer), `max_tokens` from
the output range, `ignore_eos`, greedy, `stream: true`. Reports the aggregate output tok/s over
the wall time from the first submit to the last token, TTFT (submit -> first token) and ITL (the
gaps between a stream's tokens) at p50 / p90 / p99, and errors by HTTP status.

Stdlib only (asyncio with raw sockets: one connection per request, HTTP/1.1, chunked SSE).
Tokens are counted from the SSE chunks: one `choices[0].text` delta per token event; the usage
in the final chunk (completion_tokens) is used when the server sends it.
"""
import argparse
import asyncio
import json
import random
import sys
import time


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
                if not ev.get("choices"):
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
    res[i] = r


async def main_async(args):
    rnd = random.Random(args.seed)
    reqs = []
    for _ in range(args.n):
        n_p = rnd.randint(args.prompt_min, args.prompt_max)
        n_o = rnd.randint(args.out_min, args.out_max)
        reqs.append(([rnd.randrange(args.vocab) for _ in range(n_p)], n_o))
    if args.warmup:  # loads the model (lazily loaded on the first request) outside the timing
        w = [None]
        await one_request(args, 0, reqs[0][0][:16], 4, w, time.perf_counter())
        if w[0]["status"] != 200:
            print(f"http_load: warm-up request failed: status {w[0]['status']} {w[0].get('error', '')}")
            return 1
    res = [None] * args.n
    sem = asyncio.Semaphore(args.concurrency or args.n)
    t_start = time.perf_counter()

    async def guarded(i):
        async with sem:
            await one_request(args, i, reqs[i][0], reqs[i][1], res, t_start)

    await asyncio.gather(*(guarded(i) for i in range(args.n)))
    wall = max((r["t_end"] for r in res), default=t_start) - t_start
    ok = [r for r in res if r["status"] == 200 and "error" not in r]
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    by_status = {}
    for r in res:
        k = r.get("error") and "conn-error" or str(r["status"])
        by_status[k] = by_status.get(k, 0) + 1
    print(f"http_load: {args.n} requests (prompt {args.prompt_min}-{args.prompt_max}, output "
          f"{args.out_min}-{args.out_max}, seed {args.seed}), {len(ok)} ok; statuses {by_status}")
    print(f"  output {tokens} tokens in {wall:.2f} s: {tokens / wall if wall > 0 else 0:.1f} tok/s aggregate")
    print("  TTFT ms p50 %.1f p90 %.1f p99 %.1f" % tuple(1e3 * pct(ttft, p) for p in (50, 90, 99)))
    print("  ITL  ms p50 %.2f p90 %.2f p99 %.2f" % tuple(1e3 * pct(itl, p) for p in (50, 90, 99)))
    return 0 if len(ok) == args.n else 1


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
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="no untimed 4-token request first (it loads the model)")
    args = ap.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
