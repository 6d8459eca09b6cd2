#!/usr/bin/env bash
# Session 20 (H100): where the W8A8 target points spend their time at the session's final code
# (benchmarks/profile_stages.py: per-kernel device time inside one forward, and the split), for
# the next person. deepseek-v3 tp8 fp8_block at T=4096 / 16384, qwen3 fp8_channel / int8_channel
# and bf16 at T=4096 / 16384.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for q in fp8_block none; do
  timeout 120 python3 benchmarks/profile_stages.py --split --quant $q --model deepseek-v3:8 --tokens 4096,16384 2>&1 \
    | grep -v Warn | tee -a "$OUT/s20d_profile.txt"
done
for q in fp8_channel int8_channel none; do
  timeout 120 python3 benchmarks/profile_stages.py --split --quant $q --model qwen3-30b-a3b --tokens 4096,16384 2>&1 \
    | grep -v Warn | tee -a "$OUT/s20d_profile.txt"
done
