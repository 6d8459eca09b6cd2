#!/usr/bin/env bash
# Session 33 (H100, ~3 min): `fusedmoe bench` of the W8A8 decode at T <= 16 with the harness's 50 ms graph warm-up
# (bench/harness.py WARM_MS), the three issue-5 schemes (scripts/sessions/gpu_s32_bench.sh), then deepseek-v3 tp8 fp8_block
# T=3,4 in two more processes: is T=3 now the same in every process?
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
bash scripts/sessions/gpu_s32_bench.sh
for i in 1 2; do
  echo -n "deepseek process $i: " | tee -a "$OUT/bench.txt"
  timeout 40 python3 -m fusedmoe bench --tokens 3,4 --model deepseek-v3 --tp 8 --quant fp8_block --peers none \
    --backend triton 2>&1 | grep -E "^ +[0-9]+ triton" | tr -s ' ' | tr '\n' '|' | tee -a "$OUT/bench.txt"
  echo | tee -a "$OUT/bench.txt"
done
