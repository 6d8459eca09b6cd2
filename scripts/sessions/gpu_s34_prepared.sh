#!/usr/bin/env bash
# Prepared in session 33, not run (device budget spent). H100 (kind nvidia-h100-x1), ~5 min:
#  1. the code of session 33's last commits that no GPU has run: bench/harness.py capture_graph (the bench GPU
#     test, a layer graph test) and tuning's short warm-up after the first candidate (a one-T `fusedmoe tune`);
#  2. the slow window after a layer's weights are allocated (docs/BENCHMARKS.md thirty-third section):
#     benchmarks/graph_timeline.py --fresh-study --extended: does reading the weights, or other GPU work, end it;
#     do cloned weights or weights after empty_cache start it; do the first weights come back fast?
#  3. W4 rerun with the harness's warm-up (scripts/sessions/gpu_s32_w4.sh: FUSEDMOE_DECODE_W4 0 / 1, two rounds).
# The EARLY_W A/B is scripts/sessions/gpu_s34_early_w.sh (a second call).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/s34.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_bench.py tests/test_gpu_layer.py \
  -k "graph or bench" 2>&1 | tail -3 | tee -a "$OUT/s34.txt"
timeout 150 python3 -m fusedmoe tune --model qwen3-30b-a3b --quant fp8_channel --tokens 64 --out-dir "$OUT/configs" \
  --no-progress 2>&1 | tail -5 | tee -a "$OUT/s34.txt"
timeout 200 python3 benchmarks/graph_timeline.py --case deepseek-v3:8:fp8_block --tokens 3 --mode tc --fresh-study \
  --extended 2>&1 | grep -v "Warn\|_warn" | tee -a "$OUT/s34.txt"
OUT="$OUT" bash scripts/sessions/gpu_s32_w4.sh > /dev/null 2>&1; grep -v "^$" "$OUT/w4.txt" | tee -a "$OUT/s34.txt"
