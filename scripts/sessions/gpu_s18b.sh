#!/usr/bin/env bash
# RAN AT COMMIT a741476 (FUSEDMOE_H_QUANT=token was reverted after it: fp8 530 -> 590 us, int8 549 -> 624)
# Session 18, call 2 (H100): GEMM1 storing h quantized per token (FUSEDMOE_H_QUANT=token). Its GPU
# tests (bitwise against the requantization kernel's path), then kernel / token alternating at
# qwen3 T=4096 / 16384 (fp8_channel, int8_channel), then GEMM1 tile variants under token.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
{
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  -k "quantizes_h_per_token or per_token_by_gemm1 or h_quantized_in_gemm1" 2>&1 | tail -3
} 2>&1 | tee "$OUT/s18b_tests.txt"
timeout 300 python3 scripts/gpu_hquant_ab.py --rounds 2 --cases qwen3-30b-a3b:fp8_channel,qwen3-30b-a3b:int8_channel \
  --variants kernel,token --tokens 4096,16384 2>&1 | tee "$OUT/s18b_ab.txt"
if [ "${TILES:-1}" = 1 ]; then
FUSEDMOE_H_QUANT=token timeout 150 python3 scripts/gpu_tile_ab.py s18token 2>&1 | tee "$OUT/s18b_tiles.txt"
fi
