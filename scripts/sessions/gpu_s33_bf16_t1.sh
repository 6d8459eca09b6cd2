#!/usr/bin/env bash
# Session 33 (H100, ~3 min): issue 4's decode points (T = 1, 16) against every peer with the harness's 50 ms graph
# warm-up (bench/harness.py WARM_MS): the first T of each shape had been timed inside the slow window after weights
# are allocated (docs/BENCHMARKS.md thirty-third section).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/bf16_t1.txt"
timeout 150 python3 -m fusedmoe bench --tokens 1,16 --model mixtral-8x7b,qwen3-30b-a3b --json "$OUT/bf16_t1_a.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/bf16_t1.txt" | tail -30
timeout 100 python3 -m fusedmoe bench --tokens 1,16 --model deepseek-v3 --tp 8 --json "$OUT/bf16_t1_b.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/bf16_t1.txt" | tail -16
