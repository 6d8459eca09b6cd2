#!/usr/bin/env bash
# Session 26 (H100): the sorted-h tests on the GPU (fp32 / fp16 kernels, the backend in bf16), then the
# first A/B round of GEMM2 config SORTED_H (scripts/gpu_tile_ab.py s26sorted)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  -k "sorted or half_tail or one_dot" 2>&1 | tee "$OUT/s26_sorted_tests.txt" | tail -5
timeout 480 python3 scripts/gpu_tile_ab.py "${1:-s26sorted}" 2>&1 | tee "$OUT/s26_sorted_ab.txt"
