#!/usr/bin/env bash
# Session 29 (H100: kind nvidia-h100-x1): the GPU suite at the final code. `a`: tests/test_[a-g]* (-m gpu), then the
# W8A8 decode sweep as `fusedmoe bench` reports it; `b`: the rest of the GPU suite.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if [ "${1:-a}" = a ]; then
  OUT="$OUT" bash scripts/gpu_run.sh test-a 2>&1 | tail -3
  timeout 60 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
    --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | grep -v "^bench:" | tail -22 | tee "$OUT/bench.txt"
  timeout 45 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
    --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | grep -v "^bench:" | tail -14 | tee -a "$OUT/bench.txt"
else
  OUT="$OUT" bash scripts/gpu_run.sh test-b 2>&1 | tail -3
fi
