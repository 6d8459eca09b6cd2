#!/usr/bin/env bash
# Session 14, first device call: GEMM2's k-sum as atomic adds straight into the bf16 output
# (reduce 'atomic_out': sm_90 red.v8.bf16, no y round trip, no reduce kernel) against the
# deterministic y + reduce, whole forwards through `fusedmoe bench` (correctness checked
# against the reference before timing), FUSEDMOE_REDUCE chosen per run.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
run() {  # tag, timeout, bench args...
  local tag=$1 t=$2; shift 2
  for mode in deterministic atomic_out; do
    FUSEDMOE_REDUCE=$mode timeout "$t" python3 -m fusedmoe bench --peers none --backend triton --no-progress "$@" \
      > "$OUT/ab_${tag}_${mode}.txt" 2>&1
    echo "== $tag $mode rc=$?"; grep -E "triton|==|FAIL|rror" "$OUT/ab_${tag}_${mode}.txt" | head -20
  done
}
run ds 120 --model deepseek-v3 --tp 8 --tokens 256,1024,4096,16384 --quant none,fp8_block
run qw 100 --model qwen3-30b-a3b --tokens 1024,4096,16384 --quant none,fp8_channel,int8_channel
run mx 100 --model mixtral --tokens 4096,16384 --quant none
tar czf "$OUT/ab.tgz" -C "$OUT" $(cd "$OUT" && ls ab_*.txt)
