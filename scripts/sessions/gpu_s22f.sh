#!/usr/bin/env bash
# Session 22 (H200): GEMM1 zeroing the atomic output (ZERO_IN_GEMM1, on above 2^26 elements) at
# deepseek-v3 tp8 T=16384, whose H200 k-sum is atomic since this session's banded GEMM2 entries:
# off / on, alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
Z=fusedmoe.backends.triton.ZERO_IN_GEMM1
for z in 0 1 0 1; do
  timeout 130 python3 scripts/switch_bench.py $Z $z bench --peers none --backend triton --no-progress \
    --model deepseek-v3 --tp 8 --quant none,fp8_block --tokens 16384 2>&1 | grep -E "triton|FAIL|rror" \
    | sed "s/^/ZERO_IN_GEMM1=$z /" | tee -a "$OUT/s22f_ab.txt"
done
