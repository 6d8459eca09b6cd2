#!/usr/bin/env bash
# Session 19, last call (H100, ~4 min of budget left): the gated GEMM1's gate tile rescaled at the
# end of the iteration before (grouped_gemm.py RESCALE_AHEAD), against at the top of its own
# (where ptxas waited for every wgmma first). Its bitwise test, then RESCALE_AHEAD 0 / 1
# alternating on deepseek-v3 tp8 fp8_block.
# RESCALE_AHEAD was commit 98ad774, reverted: 2.5-4.5% SLOWER (docs/bench_h100_s19_rescale_ahead_ab.txt).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py -k "prefetch_same_bits" 2>&1 \
  | grep -E "Error|assert|passed|failed" | head -6 | tee "$OUT/s19e_tests.txt"
b() {  # ahead tokens
  timeout 80 python3 scripts/switch_bench.py fusedmoe.kernels.grouped_gemm.RESCALE_AHEAD $1 bench --peers none --backend triton --no-progress \
    --model deepseek-v3 --tp 8 --quant fp8_block --tokens $2 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/ahead=$1 /"
}
for ah in 1 0 1 0; do
  b $ah 4096,16384 | tee -a "$OUT/s19e_ab.txt"
done
