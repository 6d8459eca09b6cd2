#!/usr/bin/env bash
# Prepared in session 35 (no device time left). H100 (kind nvidia-h100-x1), ~4 min:
#   OUT=$OUT bash scripts/gpu_s36_g2_groups.sh
# deepseek-v3 tp8 fp8_block's tc GEMM2 with K steps of two scale groups (kernels/decode_tc.py
# TC_GEMM2_BLOCK_GROUPS, off; K = 256: one step a slot). The bitwise test (one / two groups in GEMM1 and
# GEMM2), each GEMM alone at T = 2, 3, 4 (decode_ab.py section T: GEMM2 BK 256 at 2 / 3 / 4 stages among
# the sweep), then the layer: the shipped rules ("tcg2s3") against them with GEMM2's two groups
# ("tcg2s3b2"), 3 rounds, twice. Where tcg2s3b2 wins every T in both, set TC_GEMM2_BLOCK_GROUPS = 2.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
log="$OUT/s36_g2_groups.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py -k "block_groups" 2>&1 \
  | tail -2 | tee -a "$log"
timeout 150 python3 benchmarks/decode_ab.py --skip A,B,C,D,G --t-cases deepseek-v3:8:fp8_block --t-tokens 2,3,4 \
  2>&1 | grep "^T .*gemm2" | tee -a "$log"
for p in 1 2; do
  timeout 120 python3 benchmarks/decode_t2.py --cases deepseek-v3:8:fp8_block --tokens "" --layer-tokens "" \
    --rule-ab 2,3,4 --layer-rounds 3 --rule-variants tcg2s3,tcg2s3b2 2>&1 | grep "^rules" | tee -a "$log"
done
