#!/usr/bin/env bash
# Session 20 (H100), the last call: the int8 / early-load GPU tests at the final code, then
# gpu_tile_ab.py s20pp (two CTAs an SM for the fp8_block GEMM1, with the scale prefetch).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  tests/test_gpu_layer.py -k "int8 or epilogue_loads" 2>&1 | grep -E "Error|assert|passed|failed" | head -8 | tee "$OUT/s20c_tests.txt"
timeout 380 python3 scripts/gpu_tile_ab.py s20pp 2>&1 | grep -v Warn | tee "$OUT/s20c_tile.txt"
