#!/usr/bin/env bash
# Session 19, call 1 (H100): RESCALE's block scales loaded one K group ahead (grouped_gemm.py
# SCALE_PREFETCH / PREFETCH_S). Its GPU tests, then SCALE_PREFETCH 0 / 1 alternating on deepseek-v3
# tp8 fp8_block, then the GEMM1 tile neighbours under it (scripts/gpu_tile_ab.py s19blk).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_gpu_layer.py \
  -k "prefetch or block or rescale" 2>&1 | tail -4 | tee "$OUT/s19a_tests.txt"
b() {  # prefetch model quants tokens [extra]
  timeout 150 python3 scripts/switch_bench.py fusedmoe.kernels.grouped_gemm.SCALE_PREFETCH $1 bench --peers none --backend triton --no-progress \
    --model $2 --quant $3 --tokens $4 ${5:-} 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/pf=$1 $2 /"
}
for pf in 0 1 0 1; do
  b $pf deepseek-v3 fp8_block 1024,4096,16384 "--tp 8"
done 2>&1 | tee "$OUT/s19a_ab.txt"
# then (call 2): python3 scripts/gpu_tile_ab.py s19blk
