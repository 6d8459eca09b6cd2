#!/usr/bin/env bash
# Session 27 (H100, triton 3.9): the decode GEMM2's weight tile hinted into triton 3.6's layout
# (SLOTS_FIRST) off / on / on with 3.6's A3 and BK rules (benchmarks/decode_a3_ab.py --sf), then the
# decode tests with it on.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
source scripts/t39_env.sh || exit 1
timeout 300 python3 benchmarks/decode_a3_ab.py --sf --tokens 1 --cases qwen3-30b-a3b:1:none,deepseek-v3:8:none,\
deepseek-v3:8:fp8_block,qwen3-30b-a3b:1:fp8_channel,qwen3-30b-a3b:1:int8_channel,mixtral-8x7b:1:none 2>&1 \
  | tee "$OUT/sf_39.txt" | grep -v Warn
FUSEDMOE_DECODE_SLOTS_FIRST=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py \
  2>&1 | tee "$OUT/sf_tests39.txt" | tail -3
