#!/usr/bin/env bash
# Prepared in session 19, not run (H100): the tiled kernel's epilogue row scales and routing
# weights loaded before the K loop (grouped_gemm.py EPILOGUE_LOADS_EARLY, off by default until
# measured). Its GPU tests, then EPILOGUE_LOADS_EARLY 0 / 1 alternating where the tiled kernel
# runs with per-row scales or routing weights: qwen3 W8A8 (and bf16's GEMM2) at T=4096 / 16384,
# Mixtral bf16 at T=1024.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py -k "epilogue_loads_early" 2>&1 \
  | grep -E "Error|assert|passed|failed" | head -6 | tee "$OUT/s20a_tests.txt"
b() {  # early model quants tokens
  timeout 120 python3 scripts/switch_bench.py fusedmoe.kernels.grouped_gemm.EPILOGUE_LOADS_EARLY $1 bench --peers none --backend triton --no-progress \
    --model $2 --quant $3 --tokens $4 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/early=$1 $2 /"
}
for early in 0 1 0 1; do
  b $early qwen3-30b-a3b none,fp8_channel,int8_channel 4096,16384 | tee -a "$OUT/s20a_ab.txt"
done
for early in 0 1; do
  b $early mixtral-8x7b none 1024 | tee -a "$OUT/s20a_ab.txt"
done
