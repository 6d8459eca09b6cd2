#!/usr/bin/env bash
# Session 27 (H100): decode GEMM2 with A3 (the activation tile in the weight tile's layout) off / on,
# under triton 3.6, then 3.9 (benchmarks/decode_a3_ab.py), plus the decode tests with A3 on.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
FUSEDMOE_DECODE_A3=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py -x 2>&1 \
  | tee "$OUT/a3_tests36.txt" | tail -3
timeout 200 python3 benchmarks/decode_a3_ab.py 2>&1 | tee "$OUT/a3_36.txt" | grep -v Warn
(source scripts/t39_env.sh && FUSEDMOE_DECODE_A3=1 timeout 100 python3 -m pytest -q -p no:cacheprovider \
  tests/test_kernels_decode.py -x 2>&1 | tee "$OUT/a3_tests39.txt" | tail -3 \
  && timeout 200 python3 benchmarks/decode_a3_ab.py 2>&1 | tee "$OUT/a3_39.txt" | grep -v Warn)
