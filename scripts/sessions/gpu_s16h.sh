#!/usr/bin/env bash
# Session 16, last bench (H100): issue 5's qwen3 T=4096 points twice with the final entries.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for rep in 1 2; do
  timeout 120 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model qwen3-30b-a3b \
    --tokens 4096 --quant none,fp8_channel,int8_channel 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/run $rep /"
done 2>&1 | tee "$OUT/s16h_final.txt"
