#!/usr/bin/env bash
# session 25 (H100): per-stage times at the unmet issue-4 points at the final code, without the prefill PDL
# chain (its waits would land in the next stage's event time): benchmarks/profile_stages.py --split
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
FUSEDMOE_PREFILL_PDL=0 timeout 280 python3 benchmarks/profile_stages.py --split \
  --model mixtral-8x7b,qwen3-30b-a3b,deepseek-v3:8 --tokens 1024,16384 2>&1 | grep -E "==|split:"
