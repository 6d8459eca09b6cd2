#!/usr/bin/env bash
# Session 21 (H100): GEMM2 persistent on the 16-bit tiled GEMM2s (gpu_tile_ab.py s21p), then the
# first half of the GPU suite at this session's code.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 260 python3 scripts/gpu_tile_ab.py s21p 2>&1 | tee "$OUT/s21b_tile_ab.txt"
bash scripts/gpu_run.sh test-a 2>&1 | tail -6
