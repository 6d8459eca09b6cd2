#!/usr/bin/env bash
# Session 36, one call with no kind named (mostly an H100 comes, sometimes an H200):
#   OUT=$OUT bash scripts/sessions/gpu_s36_h200_or_suite.sh
# On an H200: session 35's prepared H200 run (scripts/sessions/gpu_s35_prepared.sh h200: the L2 hints, W4 with the
# warm-up, a16 / tc at qwen3 fp8_channel T = 2, 3). On an H100: the second half of the GPU suite
# (scripts/gpu_run.sh test-b) at this session's code.
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT="$OUT" bash scripts/sessions/gpu_s35_prepared.sh h200
else
  OUT="$OUT" bash scripts/gpu_run.sh test-b
fi
