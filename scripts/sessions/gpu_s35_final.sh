#!/usr/bin/env bash
# Session 35's last call (H100, ~5 min): TC_GEMM1_BLOCK_GROUPS 2 shipped for the H100. The tc and layer
# GPU tests that run the deepseek-v3 tp8 fp8_block chain through the backend, the shipped rule
# against one group a step again (decode_t2.py --rule-ab, a new process, 3 rounds), and the default
# W8A8 decode bench of deepseek-v3 tp8 fp8_block (two processes).
#   OUT=$OUT bash scripts/sessions/gpu_s35_final.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
log="$OUT/s35_final.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py tests/test_gpu_layer.py \
  -k "l2_pre or block_groups or (deepseek and real_sizes) or (fp8_block and (tc or auto))" 2>&1 | tail -3 \
  | tee -a "$log"
timeout 120 python3 benchmarks/decode_t2.py --cases deepseek-v3:8:fp8_block --tokens "" --layer-tokens "" \
  --rule-ab 2,3,4 --layer-rounds 3 --rule-variants tcds,tcg2s3 2>&1 | grep "^rules" | tee -a "$log"
for r in 1 2; do
  echo "== default bench, process $r" | tee -a "$log"
  timeout 60 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
    --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton|scheme=" | tee -a "$log"
done
