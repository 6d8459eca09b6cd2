#!/usr/bin/env bash
# Session 16, last call (H100): the GPU suite's second half at the final code, then issue 5's T=4096
# points twice (bf16 and W8A8 in the same run each time) and deepseek tp8 T=4096.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 330 bash scripts/gpu_run.sh test-b | tail -3
for rep in 1 2; do
  timeout 100 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model qwen3-30b-a3b \
    --tokens 4096 --quant none,fp8_channel,int8_channel 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/qwen3 run $rep /"
done 2>&1 | tee "$OUT/s16f_final.txt"
timeout 100 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model deepseek-v3 --tp 8 \
  --tokens 4096 --quant none,fp8_block 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/deepseek /" | tee -a "$OUT/s16f_final.txt"
