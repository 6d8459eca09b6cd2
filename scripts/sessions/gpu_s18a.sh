#!/usr/bin/env bash
# RAN AT COMMIT bbab91c (FUSEDMOE_H_QUANT=gemm2 was reverted after it: 530 -> 670 us fp8, 549 -> 1075 int8)
# Session 18, call 1 (H100): GEMM2 quantizing its 16-bit h per token as it loads it
# (FUSEDMOE_H_QUANT=gemm2). Its GPU tests (bitwise against the requantization kernel's path),
# then kernel / gemm2 alternating at qwen3 T=4096 / 16384 (fp8_channel, int8_channel), then
# GEMM2 tile variants under gemm2 (scripts/gpu_tile_ab.py s18qrow).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
{
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  -k "per_token_on_load or a_qrow or per_token_by_gemm2" 2>&1 | tail -3
} 2>&1 | tee "$OUT/s18a_tests.txt"
timeout 420 python3 scripts/gpu_hquant_ab.py --rounds 2 --cases qwen3-30b-a3b:fp8_channel,qwen3-30b-a3b:int8_channel \
  --variants kernel,gemm2 --tokens 4096,16384 2>&1 | tee "$OUT/s18a_ab.txt"
# (second call) FUSEDMOE_H_QUANT=gemm2 timeout 200 python3 scripts/gpu_tile_ab.py s18qrow 2>&1 | tee "$OUT/s18a_tiles.txt"
