#!/usr/bin/env bash
# `--tensor-parallel N` end to end (issue 23). check-logits with N = 2 simulated CPU ranks on a
# dense and a hybrid oracle model passes the oracle (every rank runs the check on its own
# thread; the sharding math itself is test_tp_cpu); a split that would cut MLX groups, a count
# out of range and more ranks than visible GPUs exit 2 with the reason; bench runs sharded
# (text and JSON) and refuses a head count that does not divide; bench --allreduce times the
# all-reduce alone; bench-engine drives an engine over a model group. serve: tp_serve.sh.
set -uo pipefail
bin=${CAIRN_BIN:?}; src=${CAIRN_SRC:-.}
export CAIRN_LOG_LEVEL=warn
M=$src/tests/data/oracle/models
fail=0
expect() { # expect CODE PATTERN -- command...: exit code and a line of its output
    local code=$1 pat=$2; shift 3
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" != "$code" ] || ! grep -q -- "$pat" <<<"$out"; then
        echo "FAIL: $* -> rc $rc (want $code), want '$pat' in:"; echo "$out" | tail -5; fail=1
    else
        echo "ok: rc $rc: $(grep -m1 -- "$pat" <<<"$out")"
    fi
}
for m in qwen3-tiny qwen3_5-tiny; do
    expect 0 "^PASS: .* 0 failed" -- "$bin" check-logits "$M/$m" "$M/$m/expected.safetensors" \
        --device cpu --tensor-parallel 2
done
expect 0 "tensor parallel: 2 ranks on cpu:tp0/2" -- "$bin" check-logits "$M/qwen3-tiny" \
    "$M/qwen3-tiny/expected.safetensors" --device cpu --tensor-parallel 2
expect 2 "cut its groups of 64" -- "$bin" check-logits "$M/qwen2-tiny-mlx-q4-g64" \
    "$M/qwen2-tiny-mlx-q4-g64/expected.safetensors" --device cpu --tensor-parallel 2
expect 2 "must be 1..16, got '0'" -- "$bin" check-logits "$M/qwen3-tiny" \
    "$M/qwen3-tiny/expected.safetensors" --tensor-parallel 0
expect 2 "num_attention_heads (2) does not divide by --tensor-parallel 4" -- "$bin" check-logits \
    "$M/llama-medium" "$M/llama-medium/expected.safetensors" --device cpu --tensor-parallel 4
# 16 GPUs are not visible here (a build without CUDA says that instead)
expect 2 "only [0-9]* visible\|built without CUDA" -- "$bin" check-logits "$M/qwen3-tiny" \
    "$M/qwen3-tiny/expected.safetensors" --device cuda --tensor-parallel 16
# bench runs sharded (serve: tp_serve.sh): every rank steps, rank 0 reports
expect 0 "tensor parallel:   2 ranks (cpu:tp0/2, simulated" -- "$bin" bench --model "$M/qwen3_5-tiny" \
    --device cpu --tensor-parallel 2 -p 8 -n 4 --reps 1 --probe-mb 4
expect 0 '"tensor_parallel": 2, ' -- "$bin" bench --model "$M/qwen3-moe-tiny" --device cpu \
    --tensor-parallel 2 -p 8 -n 4 --batch 2 --reps 1 --probe-mb 4 --json
expect 0 "all-reduce of \[1, 64\] f32 (0.2 KiB) over 2 ranks (cpu:tp0/2)" -- "$bin" bench --allreduce 64 \
    --tensor-parallel 2 --device cpu -n 20 --reps 3
expect 0 '"mode": "allreduce", "device": "cpu:tp0/4", "tensor_parallel": 4, "hidden": 32, "rows": 3' -- \
    "$bin" bench --allreduce 32 -p 3 --tensor-parallel 4 --device cpu -n 5 --reps 1 --json
expect 0 "tensor parallel: 2 ranks, cpu:tp0/2 .. cpu:tp1/2" -- "$bin" bench-engine --model "$M/qwen3_5-tiny" \
    --device cpu --tensor-parallel 2 --concurrency 2 --prompt 16 --gen 4 --prefix-len 80
expect 2 "runs with --model only" -- "$bin" bench --matmul 48x256 --tensor-parallel 2
expect 1 "does not divide by --tensor-parallel 3" -- "$bin" bench --model "$M/qwen3-tiny" \
    --device cpu --tensor-parallel 3 -p 8 -n 2 --reps 1 --probe-mb 4
exit $fail
