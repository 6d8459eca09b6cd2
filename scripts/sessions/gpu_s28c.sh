#!/usr/bin/env bash
# Session 28 (H100): deepseek-v3 tp8's A-resident GEMM2 with L2 eviction hints (the S28_EV switch of scripts/s28_evict_ab.patch, applied uncommitted,
# in grouped_gemm._launch_resident; it applies to grouped_gemm.py as of 4bc99e3, before h evict_first shipped: 0 shipped (TMA weights), 1 weights by pointer loads, 2 pointer loads
# evict_first for the weights and h, 3 TMA weights + h evict_first, 4 pointer weights evict_first): can the
# 1024-column band of the output that the atomic adds hit stay in L2 while w2 and h stream past it?
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for q in none fp8_block; do
  for ev in 0 1 2 3 4; do
    [ $q = fp8_block ] && [ $ev = 1 ] && continue
    echo "### S28_EV=$ev quant=$q" | tee -a "$OUT/ev.txt"
    S28_EV=$ev timeout 120 python3 benchmarks/profile_stages.py --model deepseek-v3:8 --tokens 4096,16384 \
      --quant $q 2>&1 | head -40 | tee -a "$OUT/ev.txt" | grep -E "==|resident" | head -8
  done
done
