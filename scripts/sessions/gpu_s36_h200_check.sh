#!/usr/bin/env bash
# Session 36 (H200, kind nvidia-h200, ~5 min): the H200 defaults set this session (tc GEMM1 two-group
# K steps, its L2 hints, W4 for block scales at T=1) under their GPU tests, then the default decode bench.
#   OUT=$OUT bash scripts/sessions/gpu_s36_h200_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
log="$OUT/s36_h200_check.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py -k "block_groups or l2_pre" \
  2>&1 | tail -2 | tee -a "$log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode.py tests/test_cli.py -k "w4 or explain" \
  2>&1 | tail -2 | tee -a "$log"
timeout 100 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block --peers none \
  --backend triton 2>&1 | grep -E "^ +[0-9]+ triton|^==|device|copy" | tee -a "$log"
timeout 100 python3 -m fusedmoe bench --tokens 1,2,3,4 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
  --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton|^==" | tee -a "$log"
