#!/usr/bin/env bash
# Session 35 (H100, ~3 min): the SHARE GEMM1's L2 hints (kernels/decode_tc.py TC_L2_PRE_SHARE, 0 until
# measured): the bitwise tests (T = 2, 3, 5, 8; qwen3 T=8 is SHARE), then qwen3-30b-a3b fp8_channel and
# int8_channel T=8 (64 pairs: SHARE) under FUSEDMOE_TC_L2_PRE 4,0 / 0 / 2,0, three alternating rounds (the
# variable reaches every tc GEMM1 hint: at T=8 only SHARE's).
#   OUT=$OUT bash scripts/sessions/gpu_s35_share_l2.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
log="$OUT/s35_share_l2.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py -k "l2_pre and qwen3" \
  2>&1 | tail -2 | tee -a "$log"
for r in 1 2 3; do for v in "4,0" "0" "2,0"; do
  echo "== FUSEDMOE_TC_L2_PRE=$v round $r" | tee -a "$log"
  FUSEDMOE_TC_L2_PRE=$v timeout 40 python3 -m fusedmoe bench --tokens 8 --model qwen3-30b-a3b \
    --quant fp8_channel,int8_channel --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton|scheme=" \
    | tee -a "$log"
done; done
