#!/usr/bin/env bash
# cpu room: the whole forward pass under every ISA this machine supports (CAIRN_CPU_ISA), checked
# against the Hugging Face oracle logits with `cairn check-logits` (its default tolerance, f32 KV;
# bf16 KV with the model room's 0.1). Models: dense bf16, MLX q4 and q8, a hybrid.
set -euo pipefail
: "${CAIRN_BIN:?set CAIRN_BIN}" "${CAIRN_SRC:?set CAIRN_SRC}"
oracle="$CAIRN_SRC/tests/data/oracle/models"
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
isas="scalar"
if [[ $flags == *" avx2 "* && $flags == *" fma "* && $flags == *" f16c "* ]]; then isas="$isas avx2"; fi
if [[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512vl "* && $flags == *" avx512dq "* ]]; then
    isas="$isas avx512"
fi
fail=0
runs=0
# avx2 and avx512 run twice: by default (q4/q8 packed for the VNNI kernels where the CPU has
# AVX-VNNI / AVX-512 VNNI) and with that path off (CAIRN_CPU_VNNI=0: the f32 MLX tiles).
variants=""
for isa in $isas; do
    variants="$variants $isa:"
    [[ $isa != scalar ]] && variants="$variants $isa:0"
done
for v in $variants; do
    isa=${v%%:*} vnni=${v##*:}
    for m in llama-tiny qwen3-tiny-mlx-q4-g64 llama-tiny-mlx-q8-g64 qwen3_5-tiny; do
        [[ -d $oracle/$m ]] || { echo "missing oracle model $m"; exit 1; }
        # The VNNI switch only changes q4/q8 matmuls.
        [[ -n $vnni && $m != *-mlx-* ]] && continue
        kvs="f32"
        [[ $m == llama-tiny ]] && kvs="f32 bf16" # bf16 KV once per ISA: keeps the test under a minute
        for kv in $kvs; do
            tol=2e-3
            [[ $kv == bf16 ]] && tol=0.1
            out=$(CAIRN_CPU_ISA=$isa CAIRN_CPU_VNNI=$vnni "$CAIRN_BIN" check-logits "$oracle/$m" "$oracle/$m/expected.safetensors" \
                  --kv $kv --tol $tol 2>&1) || { echo "FAIL isa=$isa vnni=$vnni model=$m kv=$kv: $out"; fail=1; }
            echo "isa=$isa vnni=$vnni model=$m kv=$kv: ${out##*$'\n'}"
            runs=$((runs + 1))
        done
    done
done
echo "cpu_isa_oracle: $runs runs over ISAs [$isas], $( ((fail)) && echo FAILED || echo all passed)"
exit $fail
