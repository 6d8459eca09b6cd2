#!/usr/bin/env bash
# Session 34, H100 (kind nvidia-h100-x1), ~6 min: the code with L2_PRE on by default (GEMM1 4 lines on an H100).
# 1. GPU tests: the tc decode file (real sizes, the hints bitwise), the backend's tc / decode / W8A8 tests, explain;
# 2. `fusedmoe bench` of the W8A8 decode at the default selection, T = 1, 2, 3, 4, 8, 16.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/final.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py tests/test_backends.py \
  tests/test_cli.py -k "tc or decode or w8a8 or explain or l2" 2>&1 | tail -3 | tee -a "$OUT/final.txt"
timeout 70 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
  --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | grep -E "^ +[0-9]+ triton|scheme=|T implementation" \
  | tee -a "$OUT/final.txt"
timeout 50 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
  --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | grep -E "^ +[0-9]+ triton|scheme=|T implementation" \
  | tee -a "$OUT/final.txt"
