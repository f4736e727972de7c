#!/usr/bin/env bash
# `cairn bench` end to end (its speed is reported, never asserted): the matmul, attention and
# model modes (one prompt length or several) print well-formed JSON with the fields bench/compare_llamacpp.sh reads, positive rates, and
# the kernels in use; bad arguments exit 2 with a message.
set -euo pipefail
bin=${CAIRN_BIN:?}; src=${CAIRN_SRC:-.}
export CAIRN_LOG_LEVEL=warn
check() { # JSON on stdin; the listed numeric fields must be present and > 0
    node -e '
        const d = JSON.parse(require("fs").readFileSync(0, "utf8"));
        for (const k of process.argv.slice(1))
            if (!(typeof d[k] === "number" && d[k] > 0)) { console.error("bench json: bad " + k + ": " + d[k]); process.exit(1); }
        if (typeof d.vnni_q !== "boolean" || typeof d.isa !== "string") { console.error("bench json: isa/vnni_q"); process.exit(1); }
        console.log(`isa ${d.isa} vnni_q ${d.vnni_q}: ok`);' "$@"
}
for dt in q4 bf16; do
    "$bin" bench --matmul 48x256 --dtype "$dt" -n 3 --reps 2 --probe-mb 4 --json |
        check weight_bytes gflops_median read_gbs fma_peak_gflops
done
m=$src/tests/data/oracle/models/qwen3-tiny-mlx-q4-g64
"$bin" bench --model "$m" -p 8 -n 4 --reps 1 --probe-mb 4 --json |
    check pp_tps_median tg_tps_median weight_bytes n_params read_gbs
# Several prompt lengths in one run, prefilled in chunks: one "prefill" entry per length, each
# with a positive speed and its share of time in attention (a fraction, above 0 on the CPU).
"$bin" bench --model "$m" -p 8,40 --chunk 16 -n 2 --reps 1 --probe-mb 4 --json | node -e '
    const d = JSON.parse(require("fs").readFileSync(0, "utf8"));
    const p = d.prefill;
    if (!Array.isArray(p) || p.length !== 2 || p[0].prompt !== 8 || p[1].prompt !== 40 || d.chunk !== 16) {
        console.error("bench json: prefill entries " + JSON.stringify(p) + " chunk " + d.chunk); process.exit(1); }
    for (const e of p)
        if (!(e.pp_tps_median > 0 && e.attn_share_median > 0 && e.attn_share_median <= 1)) {
            console.error("bench json: bad prefill entry " + JSON.stringify(e)); process.exit(1); }
    console.log("prefill lengths: ok");'
"$bin" bench --attn 4:2:20 -p 40 --chunk 16 --reps 1 --probe-mb 4 --json |
    check rowwise_ms_median tiled_ms_median tiled_speedup_median read_gbs
set +e
err=$("$bin" bench --model "$m" -p 8,,3 2>&1); rc=$?
set -e
[ "$rc" = 2 ] || { echo "bench -p 8,,3 exited $rc, wanted 2"; exit 1; }
echo "$err" | grep -q 'positive lengths separated by commas'
set +e
err=$("$bin" bench --matmul 48x250 --dtype q4 --group 64 2>&1); rc=$?
set -e
[ "$rc" = 2 ] || { echo "bench with IN not a multiple of the group exited $rc, wanted 2"; exit 1; }
echo "$err" | grep -q 'multiple of the group size'
echo "bench_cli: ok"
