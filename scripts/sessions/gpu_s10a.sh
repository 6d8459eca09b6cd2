#!/usr/bin/env bash
# Session 10, first device call: reciprocal row quantizers A/B, quantize + epilogue tests whole
# on the GPU, deepseek-v3 tp8 T=16384 GEMM2 tile A/B.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env.txt"
timeout 120 python3 benchmarks/quant_rows_ab.py --reciprocal --out "$OUT/q.json" > "$OUT/q.txt" 2>&1; tail -12 "$OUT/q.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_quantize.py 2>&1 | tail -5 | tee "$OUT/tests.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_backends.py -k epilogue 2>&1 | tail -5 | tee -a "$OUT/tests.txt"
timeout 300 python3 scripts/gpu_tile_ab.py 2>&1 | tee "$OUT/tile.txt"
