#!/usr/bin/env bash
# Session 29 (H100: kind nvidia-h100-x1): the per-expert cuBLAS 8-bit / 16-bit ratios at the issue-5 shapes
# (benchmarks/dense_ceiling.py loop points), and where the 8-bit decode's time goes at T = 1, 2, 4
# (profile_stages.py), and the decode sweep as `fusedmoe bench` reports it against the 8-bit read.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 benchmarks/dense_ceiling.py --points "" --no-decode --json "$OUT/dense_loop.json" 2>&1 \
  | grep -v "^    {" | tee "$OUT/dense_loop.txt"
for a in "qwen3-30b-a3b fp8_channel" "qwen3-30b-a3b int8_channel" "deepseek-v3:8 fp8_block"; do
  set -- $a
  timeout 100 python3 benchmarks/profile_stages.py --model $1 --quant $2 --tokens 1,2,4 2>&1 \
    | grep -v "Warning\|warn_once" | tee -a "$OUT/decode_profile.txt"
done
timeout 120 python3 -m fusedmoe bench --tokens 1,2,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
  --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | tail -25 | tee "$OUT/bench_decode.txt"
timeout 100 python3 -m fusedmoe bench --tokens 1,2,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
  --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | tail -20 | tee -a "$OUT/bench_decode.txt"
