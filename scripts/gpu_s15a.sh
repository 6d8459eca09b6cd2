#!/usr/bin/env bash
# Session 15, one device call: (1) the GPU tests of the per-token requantization of h in
# GEMM1's tail (kernels/grouped_gemm.py _row_quant_tail; FUSEDMOE_H_QUANT=tail), (2) whole
# forwards through `fusedmoe bench` (correctness checked against the reference before timing)
# with the quantization kernel after GEMM1 ('kernel', the default) against the tail, twice
# each in alternation (run-to-run spread), qwen3-30b-a3b fp8_channel / int8_channel and bf16.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_gemm.py -k "row_quant_tail" \
  tests/test_backends.py 2>&1 | tail -5
for rep in 1 2; do
  for mode in kernel tail; do
    FUSEDMOE_H_QUANT=$mode timeout 150 python3 -m fusedmoe bench --peers none --backend triton --no-progress \
      --model qwen3-30b-a3b --tokens 1024,4096,16384 --quant none,fp8_channel,int8_channel \
      > "$OUT/hq_${mode}_${rep}.txt" 2>&1
    echo "== $mode $rep rc=$?"; grep -E "triton|FAIL|rror" "$OUT/hq_${mode}_${rep}.txt" | head -12
  done
done
tar czf "$OUT/hq.tgz" -C "$OUT" $(cd "$OUT" && ls hq_*.txt)
