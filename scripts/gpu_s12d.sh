#!/usr/bin/env bash
# Session 12, fourth device call: decode loads two steps ahead (PREFETCH 2) for 8-bit weights,
# GEMM1 and GEMM2 alone (decode_ab section G), then the GPU tests of the decode kernels and layer.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 benchmarks/decode_ab.py --skip A,B,C,D,T --g-cases deepseek-v3:8:fp8_block,qwen3-30b-a3b:1:fp8_channel \
  --g-tokens 1 --g-tiles 1,2,4 --out "$OUT/g.json" 2>&1 | grep -v Warn | tee "$OUT/g.txt"
timeout 340 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py -k "tiles or gpu or 16bit" \
  tests/test_gpu_layer.py 2>&1 | tail -4 | tee "$OUT/tests.txt"
