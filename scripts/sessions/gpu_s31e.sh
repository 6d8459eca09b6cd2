#!/usr/bin/env bash
# Session 31 (H100): the tensor-core decode GEMMs alone at T = 2..4 (benchmarks/decode_ab.py section T): is
# tc_config's tile / split / group choice (tuned at T = 1 in session 7, on fp8) still the best there, for int8 too?
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 400 python3 benchmarks/decode_ab.py --skip A,B,C,D,G --t-tokens ${TOKS:-2,3,4} \
  --t-cases qwen3-30b-a3b:1:int8_channel,qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block \
  --out "$OUT/tc_sweep.json" 2>&1 | grep -v "^bench:" | tee "$OUT/tc_sweep.txt"
