#!/usr/bin/env bash
# Session 22 (H100): the warp-specialized Gluon probe (gl_ws, prepared in session 21), then the
# persistent neighbours at T=1024 (gpu_tile_ab.py s22next).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for v in gl_ws_plain gl_ws gl_sync,tl_group,tl_plain; do
  echo "== probe $v"
  timeout 100 python3 scripts/gluon_block_probe.py --variants $v 2>&1 | tail -25 | tee -a "$OUT/s22a_probe.txt"
  echo "rc=$?"
done
timeout 300 python3 scripts/gpu_tile_ab.py s22next 2>&1 | tee "$OUT/s22a_tile_ab.txt"
