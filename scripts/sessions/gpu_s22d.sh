#!/usr/bin/env bash
# Session 22 (H100): the layer's GPU tests at this session's configs (tests/test_gpu_layer.py whole),
# then the banded deepseek T=16384 GEMM2 at BM 64 (gpu_tile_ab.py s22ds16k).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_layer.py 2>&1 | tail -4 | tee "$OUT/s22d_tests.txt"
timeout 250 python3 scripts/gpu_tile_ab.py s22ds16k 2>&1 | tee "$OUT/s22d_tile_ab.txt"
