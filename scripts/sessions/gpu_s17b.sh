#!/usr/bin/env bash
# Session 17, call 2 (H100): GEMM2's L2 prefetch before its PDL wait (config L2_PREFETCH): its GPU
# test (bitwise), the PDL / atomic tests, then the A/B (scripts/gpu_tile_ab.py s17l2).
# (Reverted: slower everywhere, docs/BENCHMARKS.md seventeenth section; the code is at commit 967b0fe.)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_layer.py \
  -k "l2_prefetch or prefill_pdl or atomic_k_sum" 2>&1 | tail -3 | tee "$OUT/s17b_tests.txt"
timeout 330 python3 scripts/gpu_tile_ab.py s17l2 2>&1 | tee "$OUT/s17b_l2_ab.txt"
