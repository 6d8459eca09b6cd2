#!/usr/bin/env bash
# Session 22 (H100): the A-resident GEMM2 in column bands at deepseek tp8 T=4096 (gpu_tile_ab.py s22band).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 560 python3 scripts/gpu_tile_ab.py ${ROUND:-s22band} 2>&1 | tee "$OUT/s22b_tile_ab_${ROUND:-s22band}.txt"
