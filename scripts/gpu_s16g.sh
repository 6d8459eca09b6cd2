#!/usr/bin/env bash
# Session 16 (H100): GEMM2 stream-K, its GPU tests, then the A/B (scripts/gpu_tile_ab.py s16streamk).
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gemm.py -k "stream_k" 2>&1 | tail -3 \
  | tee "$OUT/streamk_tests.txt"
timeout 340 python3 scripts/gpu_tile_ab.py s16streamk 2>&1 | grep -v Warn | tee "$OUT/streamk_ab.txt"
