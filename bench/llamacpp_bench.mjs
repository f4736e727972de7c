// llama.cpp reference numbers for bench/compare_llamacpp.sh: prefill and decode speed of a GGUF
// on the CPU through node-llama-cpp's prebuilt llama.cpp (bench-only dependency, installed into
// .deps/bench-npm by compare_llamacpp.sh; nothing of it is built or vendored).
//
//   node bench/llamacpp_bench.mjs MODEL.gguf [-p 128] [-n 32] [-t 2] [--reps 5] [--json] [-v]
//   node bench/llamacpp_bench.mjs MODEL.gguf --tokens 1,2,3 -n 8     # greedy ids, as cairn generate
//
// Per rep: prefill = one evaluation of P random token ids (batch size P, so one llama_decode),
// decode = N greedy steps of one token each; model load and context creation are not timed.
// Medians over reps are printed, like `cairn bench --model`. Main numbers are llama.cpp's own
// perf counters (compute only, as cairn bench times it); *_wall_* are wall clock through the
// node API, which adds per-token JS scheduling and sampling.
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const npmDir = process.env.BENCH_NPM_DIR || path.join(here, "..", ".deps", "bench-npm");
const require = createRequire(path.join(npmDir, "package.json"));
const { getLlama, LlamaLogLevel } = await import(require.resolve("node-llama-cpp"));

const opt = { p: 128, n: 32, t: 2, reps: 5, json: false, verbose: false, tokens: null, model: null };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
    const a = argv[i], v = () => argv[++i];
    if (a === "-p") opt.p = +v();
    else if (a === "-n") opt.n = +v();
    else if (a === "-t") opt.t = +v();
    else if (a === "--reps") opt.reps = +v();
    else if (a === "--json") opt.json = true;
    else if (a === "-v") opt.verbose = true;
    else if (a === "--tokens") opt.tokens = v().split(",").map(Number);
    else if (!a.startsWith("-") && !opt.model) opt.model = a;
    else { console.error(`llamacpp_bench: unknown argument ${a}`); process.exit(2); }
}
if (!opt.model) { console.error("usage: llamacpp_bench.mjs MODEL.gguf [-p P] [-n N] [-t T] [--reps R] [--json] [--tokens 1,2,3]"); process.exit(2); }

// Keep llama.cpp's log for the lines that say which CPU variant and buffer types it picked.
const log = [];
const llama = await getLlama({
    gpu: false, build: "never", usePrebuiltBinaries: true, skipDownload: true, progressLogs: false,
    // "log" level keeps the backend and perf lines without llama.cpp's per-graph debug chatter.
    maxThreads: opt.t, logLevel: opt.verbose ? LlamaLogLevel.debug : LlamaLogLevel.log,
    logger: (level, msg) => { log.push(msg); if (opt.verbose) process.stderr.write(`[${level}] ${msg}\n`); },
});
const model = await llama.loadModel({ modelPath: opt.model, gpuLayers: 0 });
const prompt = opt.tokens || [];
const ctxSize = Math.max(prompt.length, opt.p) + opt.n + 16;
const context = await model.createContext({
    contextSize: ctxSize, batchSize: Math.max(opt.p, prompt.length, 1), sequences: 1,
    threads: { ideal: opt.t, min: opt.t }, performanceTracking: !opt.tokens,
});
const seq = context.getSequence();

if (opt.tokens) {
    // Sanity mode: greedy continuation of the given ids, with llama.cpp's top-2 probabilities so
    // that a disagreement with cairn can be judged (near-tie or real difference).
    const ids = [], top = [];
    for await (const out of seq.evaluateWithMetadata(prompt, { probabilities: true }, { temperature: 0 })) {
        const [a, b] = [...out.probabilities.entries()];
        ids.push(out.token);
        top.push(`${a[0]}:${a[1].toFixed(4)} ${b[0]}:${b[1].toFixed(4)}`);
        if (ids.length >= opt.n) break;
    }
    console.log(ids.join(","));
    if (opt.verbose || opt.json) console.error(top.join("\n"));
} else {
    const V = Number(model.fileInfo.tensorInfo.find((t) => t.name === "token_embd.weight").dimensions[1]);
    let seed = 12345; // fixed LCG so every run feeds the same ids
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
    const pp = [], tg = [], ppIn = [], tgIn = [];
    // llama.cpp's own counters (llama_perf_context_print, reset by each print): compute time
    // without node-llama-cpp's per-token JS scheduling and sampling, as cairn bench measures.
    const perfMs = async (what, count) => {
        const from = log.length;
        await context.printTimings();
        const re = new RegExp(`^llama_perf_context_print:\\s+${what} =\\s+([\\d.]+) ms /\\s+(\\d+)`);
        for (let tries = 0; tries < 100; tries++) { // the log reaches JS asynchronously
            for (const l of log.slice(from)) {
                const m = re.exec(l.trim());
                if (m && +m[2] === count) return +m[1];
            }
            await new Promise((ok) => setTimeout(ok, 10));
        }
        throw new Error(`no '${what}' for ${count} tokens in llama.cpp's perf log: ${log.slice(from).join(" / ")}`);
    };
    for (let r = 0; r < opt.reps; r++) {
        await seq.clearHistory();
        const ids = Array.from({ length: opt.p }, () => rand() % V);
        let t0 = performance.now();
        await seq.evaluateWithoutGeneratingNewTokens(ids);
        pp.push(performance.now() - t0);
        ppIn.push(await perfMs("prompt eval time", opt.p));
        let k = 0;
        t0 = performance.now();
        for await (const _ of seq.evaluate([rand() % V], { temperature: 0 })) {
            if (++k >= opt.n) break;
        }
        tg.push(performance.now() - t0);
        tgIn.push(await perfMs("eval time", opt.n));
    }
    const median = (a) => { const s = [...a].sort((x, y) => x - y), m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
    // Which libggml-cpu-*.so ggml's runtime dispatch loaded (logged during the first load).
    const variant = log.map((l) => /loaded CPU backend from .*libggml-cpu-(\w+)\.so/.exec(l)?.[1])
        .find(Boolean) || "unknown";
    const tps = (count, ms) => +(count / (ms / 1e3)).toFixed(2);
    const res = {
        model: opt.model, prompt: opt.p, gen: opt.n, threads: context.currentThreads, reps: opt.reps,
        batch_size: context.batchSize, context_size: context.contextSize, cpu_variant: variant,
        llama_cpp_release: llama.llamaCppRelease.release,
        flash_attention: log.some((l) => l.includes("Flash Attention enabled")), // "auto" resolves on CPU
        kv_type: context.kvCacheKeyType,
        pp_tps_median: tps(opt.p, median(ppIn)), pp_tps_best: tps(opt.p, Math.min(...ppIn)),
        tg_tps_median: tps(opt.n, median(tgIn)), tg_tps_best: tps(opt.n, Math.min(...tgIn)),
        pp_tps_wall_median: tps(opt.p, median(pp)), tg_tps_wall_median: tps(opt.n, median(tg)),
    };
    if (opt.json) console.log(JSON.stringify(res));
    else {
        console.log(`llama.cpp ${res.llama_cpp_release} (libggml-cpu-${variant}), ${res.threads} threads, ${opt.reps} reps: ${opt.model}`);
        console.log(`  prefill pp${opt.p}: median ${res.pp_tps_median} tok/s, best ${res.pp_tps_best} tok/s (wall through the API: median ${res.pp_tps_wall_median})`);
        console.log(`  decode  tg${opt.n}:  median ${res.tg_tps_median} tok/s, best ${res.tg_tps_best} tok/s (wall through the API: median ${res.tg_tps_wall_median})`);
    }
}
await context.dispose();
await model.dispose();
await llama.dispose();
