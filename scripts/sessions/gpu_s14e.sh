#!/usr/bin/env bash
# Session 14: retune qwen3 fp8_channel / int8_channel T=4096 under the new default k-sum (atomic
# adds into the output: GEMM2's best tile may differ), then bench shipped vs retuned in one call.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
POINTS="qwen3-30b-a3b:1:4096:fp8_channel qwen3-30b-a3b:1:4096:int8_channel" PER_POINT_S=130 DEADLINE_S=290 \
  bash scripts/gpu_tune.sh 2>&1 | grep -v "^-\|^total\|^d" | tail -8
for tag in shipped retuned; do
  if [ $tag = retuned ]; then export FUSEDMOE_CONFIG_DIR="$OUT/configs"; fi
  timeout 90 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model qwen3-30b-a3b \
    --tokens 4096 --quant none,fp8_channel,int8_channel > "$OUT/bench_$tag.txt" 2>&1
  echo "== $tag"; grep -E "triton" "$OUT/bench_$tag.txt"
done
