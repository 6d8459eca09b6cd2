#!/usr/bin/env bash
# Prepared in session 32, not run (device time spent). Two questions, ~4 minutes:
#  1. (any H100: kind nvidia-h100-x1) deepseek-v3 tp8 fp8_block T=3 on the tensor-core chain: its graph time
#     was bimodal across processes (53.2-53.4 us in 2 processes, 59.2-59.7 in 8; eager 56-57; T=4 stable;
#     docs/BENCHMARKS.md thirty-second section). Six processes with the PDL chain, six without
#     (FUSEDMOE_DECODE_PDL=0): if the slow mode goes away without PDL, look at the captured graph's edges.
#  2. (ARG h200, kind nvidia-h200) W4 (kernels/decode.py: the one-token a16 decode's 8-bit weights as int32
#     words) on the H200, where it ships by default unmeasured: FUSEDMOE_DECODE_W4 0 / 1, two rounds.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/s33.txt"
if [ "${1:-}" = h200 ]; then
  for r in 1 2; do for m in 0 1; do
    echo "== W4=$m round $r" | tee -a "$OUT/s33.txt"
    FUSEDMOE_DECODE_W4=$m timeout 40 python3 -m fusedmoe bench --tokens 1 --model qwen3-30b-a3b \
      --quant fp8_channel,int8_channel --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton|scheme=" \
      | tee -a "$OUT/s33.txt"
  done; done
  exit 0
fi
for pdl in 1 0; do for i in 1 2 3 4 5 6; do
  echo -n "PDL=$pdl process $i: " | tee -a "$OUT/s33.txt"
  FUSEDMOE_DECODE_PDL=$pdl FUSEDMOE_W8A8_DECODE=tc timeout 40 python3 -m fusedmoe bench --tokens 3,4 \
    --model deepseek-v3 --tp 8 --quant fp8_block --peers none --backend triton 2>&1 \
    | grep -E "^ +[0-9]+ triton" | tr -s ' ' | tr '\n' '|' | tee -a "$OUT/s33.txt"
  echo | tee -a "$OUT/s33.txt"
done; done
