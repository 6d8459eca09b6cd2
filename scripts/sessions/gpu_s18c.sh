#!/usr/bin/env bash
# Session 18, call 3 (H100): deepseek-v3 tp8 fp8_block with h quantized in GEMM1's epilogue
# (FUSEDMOE_H_QUANT=epilogue: its own 1 x 128 rule, so the same math), now that the one-group
# epilogue divides once per row; against the requantization kernel, alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
{
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  -k "1xg_groups or h_quantized_in_gemm1 or group_scaled" 2>&1 | tail -3
} 2>&1 | tee "$OUT/s18c_tests.txt"
timeout 380 python3 scripts/gpu_hquant_ab.py --rounds 2 --cases deepseek-v3:fp8_block \
  --variants kernel,epilogue --tokens 1024,4096,16384 2>&1 | tee "$OUT/s18c_ab.txt"
