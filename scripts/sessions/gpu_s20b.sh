#!/usr/bin/env bash
# Session 20, H200 (`nvidia-h200`): the H100-measured switches of sessions 19-20 on the H200, whose
# files are unchanged since session 18. EPILOGUE_LOADS_EARLY (default "int8") 0 / 1 on qwen3
# int8_channel; SCALE_PREFETCH 0 / 1 on deepseek-v3 tp8 fp8_block; the H100's T=4096 fp8_block
# GEMM1 tile on the H200's entry (gpu_tile_ab.py h200blk). Alternating rounds, graph µs.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/s20b_env.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py -k "epilogue_loads or prefetch" 2>&1 \
  | grep -E "Error|assert|passed|failed" | head -6 | tee "$OUT/s20b_tests.txt"
sw() {  # module.attr value model quants tokens [extra args]
  timeout 150 python3 scripts/switch_bench.py fusedmoe.kernels.grouped_gemm.$1 $2 bench --peers none --backend triton --no-progress \
    --model $3 --quant $4 --tokens $5 ${6:-} 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/$1=$2 $3 /"
}
for v in 0 1 0 1; do
  sw EPILOGUE_LOADS_EARLY $v qwen3-30b-a3b int8_channel 4096,16384 | tee -a "$OUT/s20b_ab.txt"
done
for v in 0 1 0 1; do
  sw SCALE_PREFETCH $v deepseek-v3 fp8_block 4096,16384 "--tp 8" | tee -a "$OUT/s20b_ab.txt"
done
timeout 200 python3 scripts/gpu_tile_ab.py h200blk 2>&1 | tail -8 | tee "$OUT/s20b_tile.txt"
