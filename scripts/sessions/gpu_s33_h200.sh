#!/usr/bin/env bash
# Session 33 (kind nvidia-h200, ~3 min): W4 on the H200 (scripts/sessions/gpu_s33_prepared.sh h200: FUSEDMOE_DECODE_W4 0 / 1,
# two rounds, qwen3 fp8_channel / int8_channel T=1), then deepseek-v3 tp8 fp8_block T=3,4 on the tc chain in three
# processes (is the H200's graph time stable across processes, as the H100's was this session?).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
bash scripts/sessions/gpu_s33_prepared.sh h200
for i in 1 2 3; do
  echo -n "deepseek tc process $i: " | tee -a "$OUT/s33.txt"
  FUSEDMOE_W8A8_DECODE=tc timeout 40 python3 -m fusedmoe bench --tokens 3,4 --model deepseek-v3 --tp 8 \
    --quant fp8_block --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton" | tr -s ' ' | tr '\n' '|' \
    | tee -a "$OUT/s33.txt"
  echo | tee -a "$OUT/s33.txt"
done
