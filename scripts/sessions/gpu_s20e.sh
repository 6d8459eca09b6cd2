#!/usr/bin/env bash
# Session 20 (H100): GEMM2's m-blocks in token order (config TOKEN_ORDER, align.block_order): its
# tests on the GPU, then gpu_tile_ab.py s20tok at deepseek-v3 tp8 T=16384 (fp8_block, bf16).
# It LOST (docs/BENCHMARKS.md, twentieth section) and was reverted: run it at commit 19294d8.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_align.py tests/test_kernels_gemm.py \
  -k "block_order or test_gemm2_a_resident" 2>&1 | grep -E "Error|assert|passed|failed" | head -8 | tee "$OUT/s20e_tests.txt"
timeout 330 python3 scripts/gpu_tile_ab.py s20tok 2>&1 | grep -v Warn | tee "$OUT/s20e_tile.txt"
