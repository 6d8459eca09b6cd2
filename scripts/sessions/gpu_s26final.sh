#!/usr/bin/env bash
# Session 26 (H100): final figures at this code. Part a: every preset against its peers at the points
# issue 4 leaves unmet (and Mixtral T=4096); part b: issue 5's points, bf16 and 8-bit in one run.
#   bash scripts/sessions/gpu_s26final.sh a | b
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
case "${1:-a}" in
  a) timeout 220 python3 -m fusedmoe bench --no-progress --model mixtral-8x7b --tokens 1024,4096,16384 \
       --json "$OUT/s26_mixtral.json" 2>&1 | tee -a "$OUT/s26_final_a.txt"
     timeout 180 python3 -m fusedmoe bench --no-progress --model qwen3-30b-a3b --tokens 1,1024,16384 \
       --json "$OUT/s26_qwen3.json" 2>&1 | tee -a "$OUT/s26_final_a.txt"
     timeout 180 python3 -m fusedmoe bench --no-progress --model deepseek-v3 --tp 8 --tokens 1,1024,16384 \
       --json "$OUT/s26_deepseek.json" 2>&1 | tee -a "$OUT/s26_final_a.txt" ;;
  b) for m in "deepseek-v3 --tp 8 --quant none,fp8_block" "qwen3-30b-a3b --quant none,fp8_channel,int8_channel"; do
       timeout 280 python3 -m fusedmoe bench --peers none --backend triton --no-progress --tokens 1,4096,16384 --model $m \
         2>&1 | tee -a "$OUT/s26_final_b.txt"
     done ;;
esac
