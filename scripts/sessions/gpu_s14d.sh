#!/usr/bin/env bash
# Session 14: the GPU suite's first half at the final code (default k-sum rule), then the
# bench of the default (FUSEDMOE_REDUCE unset) on the points the rule was chosen from.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_[a-g]*.py > "$OUT/gpu_tests_a.log" 2>&1
tail -3 "$OUT/gpu_tests_a.log"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests_a.log" | head -20
timeout 120 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model qwen3-30b-a3b \
  --tokens 1024,4096,16384 --quant none,fp8_channel,int8_channel > "$OUT/bench_qw.txt" 2>&1
timeout 100 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model deepseek-v3 --tp 8 \
  --tokens 4096,16384 --quant none,fp8_block > "$OUT/bench_ds.txt" 2>&1
grep -E "triton|==" "$OUT"/bench_*.txt
