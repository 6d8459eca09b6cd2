#!/usr/bin/env bash
# Session 24 (H100): final figures with GU_ONE_DOT shipped: Mixtral against its peers, the issue-5
# points (bf16 and 8-bit in one run), then the one-dot A/B of deepseek tp8 bf16 T=4096 (not measured
# in s24onedot: the call's time ran out).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m fusedmoe bench --no-progress --model mixtral-8x7b --tokens 1024,4096,16384 \
  --json "$OUT/s24_mixtral.json" 2>&1 | tee -a "$OUT/s24_final.txt"
for m in "deepseek-v3 --tp 8 --quant none,fp8_block" "qwen3-30b-a3b --quant none,fp8_channel,int8_channel"; do
  timeout 170 python3 -m fusedmoe bench --peers none --backend triton --no-progress --tokens 4096,16384 --model $m \
    2>&1 | tee -a "$OUT/s24_final.txt"
done
timeout 100 python3 scripts/gpu_tile_ab.py s24ds4k 2>&1 | tee "$OUT/s24ds4k.txt"
