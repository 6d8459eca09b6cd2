#!/usr/bin/env bash
# Session 35 (H100, ~5 min): deepseek-v3 tp8 fp8_block's tc GEMM1 with K steps of two scale groups
# (kernels/decode_tc.py TC_GEMM1_BLOCK_GROUPS 2, SUB_K): the tests, GEMM1 alone at T = 2, 3, 4
# (benchmarks/decode_ab.py section T: BK 256 at 3 / 4 / 5 stages among the sweep), then the layer
# under the shipped rules ("tcds") against tcg2s3 / s4 / s5 (decode_t2.py --rule-ab, 3 rounds).
#   OUT=$OUT bash scripts/sessions/gpu_s35_groups.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
log="$OUT/s35_groups.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py \
  -k "block_groups or real_sizes" 2>&1 | tail -3 | tee -a "$log"
timeout 150 python3 benchmarks/decode_ab.py --skip A,B,C,D,G --t-cases deepseek-v3:8:fp8_block --t-tokens 2,3,4 \
  2>&1 | grep "^T " | tee -a "$log"
timeout 200 python3 benchmarks/decode_t2.py --cases deepseek-v3:8:fp8_block --tokens "" --layer-tokens "" --rule-ab 2,3,4 \
  --layer-rounds 3 --rule-variants tcds,tcg2s3,tcg2s4,tcg2s5 2>&1 | grep "^rules" | tee -a "$log"
