#!/usr/bin/env bash
# Session 32: `fusedmoe bench` of the W8A8 decode at T <= 16 at this code (the tc rules of sessions 31-32,
# auto_a16_max_t), the three issue-5 schemes. H100: kind nvidia-h100-x1; also run on the H200.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/bench.txt"
(timeout 90 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
   --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | grep -v "^bench:" | tail -22
 timeout 70 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
   --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | grep -v "^bench:" | tail -14) | tee -a "$OUT/bench.txt"
