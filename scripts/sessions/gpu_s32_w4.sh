#!/usr/bin/env bash
# Session 32 (kind nvidia-h100-x1): the a16 decode's 8-bit weights as int32 words (kernels/decode.py W4):
# the decode GPU tests under it, then `fusedmoe bench` at T = 1, 2 with FUSEDMOE_DECODE_W4 0 / 1 alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/w4.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode.py \
  -k "w4 or real_sizes or tiles_real" 2>&1 | tail -4 | tee -a "$OUT/w4.txt"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py \
  -k "8bit or quantized" 2>&1 | tail -2 | tee -a "$OUT/w4.txt"
for r in 1 2; do for m in 0 1; do
  echo "== W4=$m round $r" | tee -a "$OUT/w4.txt"
  FUSEDMOE_DECODE_W4=$m timeout 40 python3 -m fusedmoe bench --tokens 1,2 --model qwen3-30b-a3b \
    --quant fp8_channel,int8_channel --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton|scheme=" | tee -a "$OUT/w4.txt"
  FUSEDMOE_DECODE_W4=$m timeout 30 python3 -m fusedmoe bench --tokens 1,2 --model deepseek-v3 --tp 8 \
    --quant fp8_block --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton|scheme=" | tee -a "$OUT/w4.txt"
done; done
