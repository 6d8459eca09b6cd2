#!/usr/bin/env bash
# Session 12, third device call: the decode GEMM2 TILES rule (8-bit weights) on the GPU: its
# tests and the layer's W8A8 decode tests, per-kernel times, then fusedmoe bench at T <= 16.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py -k "tiles or gpu" \
  tests/test_gpu_layer.py 2>&1 | tail -4 | tee "$OUT/tests.txt"
timeout 60 python3 benchmarks/profile_stages.py --model deepseek-v3:8 --quant fp8_block --tokens 1 2>&1 | grep -v Warn | grep -v warn | tee "$OUT/p_dsb.txt"
timeout 200 python3 -m fusedmoe bench --tokens 1,2,4,8,16 --model deepseek-v3 --tp 8 --quant none,fp8_block --peers none \
  --backend triton --json "$OUT/bq2_small.json" 2>/dev/null | tee "$OUT/bq2_small.txt" | tail -30
