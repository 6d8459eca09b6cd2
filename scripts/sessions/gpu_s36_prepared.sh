#!/usr/bin/env bash
# RAN in session 36 at 667cf41 (docs/BENCHMARKS.md thirty-sixth section): GEMM2's two-group steps lost and
# were removed after it, so part 1 no longer runs at later commits.
# Prepared in session 35 (no device time left). H100 (kind nvidia-h100-x1), ~6 min:
#   OUT=$OUT bash scripts/sessions/gpu_s36_prepared.sh
# 1. deepseek-v3 tp8 fp8_block's tc GEMM2 with K steps of two scale groups (kernels/decode_tc.py
# TC_GEMM2_BLOCK_GROUPS, off; K = 256: one step a slot). The bitwise test (one / two groups in GEMM1 and
# GEMM2), each GEMM alone at T = 2, 3, 4 (decode_ab.py section T: GEMM2 BK 256 at 2 / 3 / 4 stages among
# the sweep), then the layer: the shipped rules ("tcg2s3") against them with GEMM2's two groups
# ("tcg2s3b2"), 3 rounds, twice. Where tcg2s3b2 wins every T in both, set TC_GEMM2_BLOCK_GROUPS = 2.
# 2. The slow window's next questions (benchmarks/graph_timeline.py --fresh-study --values): do new weights
# read in full first still start it; do cloned weights with permuted rows (new bytes everywhere); does
# quantizing the same 16-bit weights again (no new draw), read first or not. If reading ends it, a
# load-time touch in prepare_experts is worth it for users (README's bench row says what users see).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
log="$OUT/s36_prepared.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py -k "block_groups" 2>&1 \
  | tail -2 | tee -a "$log"
timeout 150 python3 benchmarks/decode_ab.py --skip A,B,C,D,G --t-cases deepseek-v3:8:fp8_block --t-tokens 2,3,4 \
  2>&1 | grep "^T .*gemm2" | tee -a "$log"
for p in 1 2; do
  timeout 120 python3 benchmarks/decode_t2.py --cases deepseek-v3:8:fp8_block --tokens "" --layer-tokens "" \
    --rule-ab 2,3,4 --layer-rounds 3 --rule-variants tcg2s3,tcg2s3b2 2>&1 | grep "^rules" | tee -a "$log"
done
timeout 200 python3 benchmarks/graph_timeline.py --case deepseek-v3:8:fp8_block --tokens 3 --mode tc \
  --fresh-study --values 2>&1 | grep -v "Warn\|_warn" | tee -a "$log"
