#!/usr/bin/env bash
# Session 27 (H100): gpu_s27b.sh's triton 3.9 half (its pytest timeout cut it off): the decode tests with
# A3 on, then benchmarks/decode_a3_ab.py, both under triton 3.9.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
source scripts/t39_env.sh || exit 1
timeout 300 python3 benchmarks/decode_a3_ab.py 2>&1 | tee "$OUT/a3_39.txt" | grep -v Warn
FUSEDMOE_DECODE_A3=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py -x 2>&1 \
  | tee "$OUT/a3_tests39.txt" | tail -3
