#!/usr/bin/env bash
# Session 12, first device call: where the 8-bit decode time goes (T=1, 2), Mixtral T=256 stages
# and tile A/B, Nsight Compute on qwen3 fp8_channel T=16384's GEMMs and reduce.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env.txt"
timeout 100 python3 benchmarks/profile_stages.py --model deepseek-v3:8 --quant fp8_block --tokens 1,2 > "$OUT/p_dsb.txt" 2>&1
timeout 100 python3 benchmarks/profile_stages.py --model qwen3-30b-a3b --quant fp8_channel --tokens 1,2 > "$OUT/p_q8.txt" 2>&1
timeout 100 python3 benchmarks/profile_stages.py --model mixtral-8x7b --tokens 64,256 --split > "$OUT/p_mix.txt" 2>&1
cat "$OUT"/p_*.txt | grep -v "^ *$" | head -80
NCU=/usr/local/cuda/bin/ncu
timeout 150 $NCU --clock-control none --kernel-name regex:"_moe_gemm_kernel|_moe_reduce_kernel" --launch-skip 6 --launch-count 3 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  python3 benchmarks/ncu_forward.py --model qwen3-30b-a3b --quant fp8_channel --tokens 16384 > "$OUT/ncu_q8.txt" 2>&1
grep -E "_moe_|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|Memory Throughput|Registers|Achieved Occupancy|Grid Size" "$OUT/ncu_q8.txt" | head -60
timeout 280 python3 scripts/gpu_tile_ab.py s12mix256 2>&1 | tee "$OUT/tile.txt"
