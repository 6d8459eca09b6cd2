#!/usr/bin/env bash
# Session 14: deepseek-v3 tp8 T=16384 with GEMM2's atomic k-sum in column bands (BAND_MAJOR), against
# the fixed-order reduce (shipped default there) and the m-major atomic GEMM2.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for q in none fp8_block; do
  timeout 60 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model deepseek-v3 --tp 8 \
    --tokens 16384 --quant $q 2>&1 | grep -E "triton" | sed "s/^/deterministic (default) $q: /"
done
FUSEDMOE_REDUCE=atomic_out timeout 420 python3 scripts/gpu_tile_ab.py s14band 2>&1 | tee "$OUT/band_ab.txt"
