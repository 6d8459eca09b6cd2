#!/usr/bin/env bash
# Session 27 (H100, triton 3.9): at the final decode rules (SLOTS_FIRST on, decode_config's BK as under
# 3.6), A3 off / on for the 16-bit layer at T=1 (benchmarks/decode_a3_ab.py), then the decode and CLI tests.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
source scripts/t39_env.sh || exit 1
timeout 200 python3 benchmarks/decode_a3_ab.py --kernel "" --tokens 1 \
  --cases qwen3-30b-a3b:1:none,deepseek-v3:8:none,mixtral-8x7b:1:none 2>&1 | tee "$OUT/final_a3_39.txt" | grep -v Warn
timeout 220 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 | tee "$OUT/final_tests39.txt" | tail -3
