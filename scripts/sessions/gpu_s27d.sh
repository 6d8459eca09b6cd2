#!/usr/bin/env bash
# Session 27 (H100): under triton 3.9 the decode GEMM2's BK halved against decode_config's, the layer
# with A3 on (benchmarks/decode_a3_ab.py --bk), and the decode tests at the committed rule; then under
# triton 3.6 the decode and launcher tests (A3 both ways in test_gpu_decode_real_sizes, FP fusion
# asked for by every launch).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py tests/test_launcher.py 2>&1 \
  | tee "$OUT/s27d_tests36.txt" | tail -3
(source scripts/t39_env.sh || exit 1
 timeout 200 python3 benchmarks/decode_a3_ab.py --bk --cases qwen3-30b-a3b:1:none,deepseek-v3:8:none,mixtral-8x7b:1:none \
   2>&1 | tee "$OUT/bk_39.txt" | grep -v Warn
 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py tests/test_launcher.py 2>&1 \
   | tee "$OUT/s27d_tests39.txt" | tail -3)
