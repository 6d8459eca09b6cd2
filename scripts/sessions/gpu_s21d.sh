#!/usr/bin/env bash
# Session 21 (H100): the GPU tests of the last test-b files (its call was cut at ~95%), then the
# qwen3 part of the GEMM2-persistent A/B (gpu_tile_ab.py s21q).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_oracle.py tests/test_persistent.py \
  tests/test_presets.py tests/test_quant.py tests/test_reference_moe.py tests/test_routing.py tests/test_tuning.py 2>&1 \
  | tail -4 | tee "$OUT/s21d_tests.txt"
timeout 200 python3 scripts/gpu_tile_ab.py s21q 2>&1 | tee "$OUT/s21d_tile_ab.txt"
