#!/usr/bin/env bash
# Session 38: host time of eager W8A8 forwards (the H200 bench showed eager 1.5-2.3x the graph time
# at qwen3 T = 16..1024 for fp8_channel / int8_channel, where bf16 is within 5%).
#   OUT=$OUT bash scripts/sessions/gpu_s38_host.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for q in none fp8_channel int8_channel; do
  for t in 1 16 1024; do
    timeout 100 python3 benchmarks/host_overhead.py --real --quant $q --tokens $t --iters 1000 2>&1 | grep -v Warn
  done
done | tee "$OUT/host.txt"
for t in 1 16; do
  timeout 100 python3 benchmarks/host_overhead.py --real --model deepseek-v3:8 --quant fp8_block --tokens $t --iters 1000 2>&1 \
    | grep -v Warn | tee -a "$OUT/host.txt"
done
for q in fp8_channel int8_channel; do
  timeout 100 python3 benchmarks/host_overhead.py --real --quant $q --tokens 64 --iters 1000 --profile --top 40 2>&1 \
    | grep -v Warn > "$OUT/host_profile_$q.txt"
done
head -60 "$OUT/host_profile_fp8_channel.txt"
