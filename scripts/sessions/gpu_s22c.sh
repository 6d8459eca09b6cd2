#!/usr/bin/env bash
# Session 22 (H100): the A-resident banded GEMM2 at qwen3 T=16384 in the configs that fit
# (gpu_tile_ab.py s22qres2), then the final issue-5 run (bf16 and 8-bit in one run).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 scripts/gpu_tile_ab.py s22qres2 2>&1 | tee "$OUT/s22c_tile_ab.txt"
for m in "deepseek-v3 --tp 8 --quant none,fp8_block" "qwen3-30b-a3b --quant none,fp8_channel,int8_channel"; do
  timeout 170 python3 -m fusedmoe bench --peers none --backend triton --no-progress --tokens 4096,16384 --model $m \
    2>&1 | tee -a "$OUT/s22c_final.txt"
done
