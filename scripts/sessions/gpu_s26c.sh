#!/usr/bin/env bash
# Session 26 (H100, under triton 3.9: carry .whl): the sorted-A tests, then s26t39 (the sorted entries against
# the same entries without them)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
source scripts/t39_env.sh || exit 1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -c "import triton; print('triton', triton.__version__)" | tee "$OUT/s26c_env.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  -k "sorted" 2>&1 | tee "$OUT/s26c_tests.txt" | tail -3
timeout 300 python3 scripts/gpu_tile_ab.py s26t39 2>&1 | tee "$OUT/s26c_t39_ab.txt"
