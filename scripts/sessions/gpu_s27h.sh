#!/usr/bin/env bash
# Session 27 (H100, triton 3.9): the decode tests at the final rules (SLOTS_FIRST on, A3 at <= 2 slots).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
source scripts/t39_env.sh || exit 1
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 | tee "$OUT/final_tests39.txt" | tail -3
