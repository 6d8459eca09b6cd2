#!/usr/bin/env bash
# Session 17, call 3 (H100): GEMM2 at BM 128 over GEMM1 at BM 64 (the alignment takes the larger
# BM): the GPU tests that cross BMs, then the A/B (scripts/gpu_tile_ab.py s17bm).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py -k "block_m" 2>&1 | tail -2 \
  | tee "$OUT/s17c_tests.txt"
timeout 400 python3 scripts/gpu_tile_ab.py s17bm 2>&1 | tee "$OUT/s17c_bm_ab.txt"
