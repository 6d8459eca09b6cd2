#!/usr/bin/env bash
# Session 32: the deepseek-v3 tp8 stage rules (GEMM1 6 stages where K > 2048, GEMM2 2 stages where
# K < 512, T = 2..4: "tcds") on the other preset shapes they reach, against the rules before ("tcnew");
# then (H200 only, ARG h200) the W8A8 decode modes a16 / tc at T = 2..4 under the new rules.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/shapes.txt"
timeout 330 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" \
  --cases mixtral-8x7b:1:fp8_channel,qwen3-235b-a22b:1:fp8_channel,gpt-oss-120b:1:int8_channel,qwen3-30b-a3b:4:int8_channel \
  --rule-ab 2,3,4 --rule-variants tcnew,tcds --layer-rounds 3 --json "$OUT/tc_rules_shapes.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/shapes.txt"
if [ "${1:-}" = h200 ]; then
  timeout 200 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens 2,3,4 --layer-modes a16,tc --layer-rounds 3 \
    --cases qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block --json "$OUT/modes_h200.json" 2>&1 \
    | grep -v "^bench:" | tee -a "$OUT/shapes.txt"
fi
