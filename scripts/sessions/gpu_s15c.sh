#!/usr/bin/env bash
# Session 15, last device call: issue 5's qwen3 T=4096 ratios at the final code, twice (bf16 and
# the W8A8 schemes in the same run each time), then Mixtral T=256 neighbours under MASK_A.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for rep in 1 2; do
  timeout 120 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model qwen3-30b-a3b \
    --tokens 4096 --quant none,fp8_channel,int8_channel > "$OUT/s15c_qw4096_$rep.txt" 2>&1
  echo "== run $rep rc=$?"; grep -E "triton|FAIL|rror" "$OUT/s15c_qw4096_$rep.txt"
done
timeout 200 python3 scripts/gpu_tile_ab.py s15mix256 2>&1 | tee "$OUT/s15c_mix256.txt"
