#!/usr/bin/env bash
# Session 28 (H100): the GPU suite at the final code: STAGE=a: test-a (triton 3.6) + the decode tests under
# triton 3.9 (carry .whl); STAGE=b: test-b (triton 3.6).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ "${1:-a}" = a ]; then
  bash scripts/gpu_run.sh test-a 2>&1 | tail -4
  ( source scripts/t39_env.sh && timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 \
      | tee "$OUT/decode_tests39.txt" | tail -3 )
else
  bash scripts/gpu_run.sh test-b 2>&1 | tail -4
fi
