#!/usr/bin/env bash
# Session 17, call 4 (H100): GEMM2 BM 128 over GEMM1 BM 64 again (scripts/gpu_tile_ab.py s17bm2), and
# where the qwen3 W8A8 T=4096 time goes now (benchmarks/profile_stages.py, per kernel)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 120 python3 benchmarks/profile_stages.py --model qwen3-30b-a3b --tokens 4096 --quant fp8_channel 2>&1 \
  | grep -v Warn | tail -14 | tee "$OUT/s17d_profile.txt"
timeout 420 python3 scripts/gpu_tile_ab.py s17bm2 2>&1 | tee "$OUT/s17d_bm2_ab.txt"
