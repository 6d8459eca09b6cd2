#!/usr/bin/env bash
# Session 18, final call (H100): the GPU tests this session's changes touch (fp8_block's h now
# quantized in GEMM1's epilogue by default; the one-group epilogue's RCP quotient; persistent
# GEMM1 entries), then the changed points with their bf16 in the same run.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_layer.py tests/test_backends.py \
  tests/test_kernels_gemm.py -k "block or epilogue or 1xg or group" 2>&1 | tail -4 | tee "$OUT/s18e_tests.txt"
b() { timeout 150 python3 -m fusedmoe bench --peers none --backend triton --no-progress "$@" 2>&1 \
  | grep -E "triton|FAIL|rror"; }
{
b --model mixtral-8x7b --tokens 1024,16384
b --model qwen3-30b-a3b --quant none,fp8_channel,int8_channel --tokens 4096,16384
b --model deepseek-v3 --tp 8 --quant none,fp8_block --tokens 1024,4096,16384
} 2>&1 | tee "$OUT/s18e_bench.txt"
