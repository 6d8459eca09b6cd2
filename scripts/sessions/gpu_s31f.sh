#!/usr/bin/env bash
# Session 31 (H100: kind nvidia-h100-x1): the tensor-core chain's new tile rules (kernels/decode_tc.py
# TC_GEMM1_STAGES_SHORT_K, TC_GEMM2_PROGRAMS_LONG_K) in the layer against session 30's, each half alone too
# (decode_t2.py --rule-ab, FUSEDMOE_W8A8_DECODE=tc), then `fusedmoe bench` of the W8A8 decode at T <= 16 at
# this code, then the tc decode GPU tests at real sizes.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/tests.txt"
timeout 230 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" --cases qwen3-30b-a3b:1:int8_channel,qwen3-30b-a3b:1:fp8_channel \
  --rule-ab 2,3,4 --rule-variants tcnew,tcold,tcg1new,tcg2new --layer-rounds 3 --json "$OUT/tc_rules.json" 2>&1 \
  | grep -v "^bench:" | tee "$OUT/tc_rules.txt"
(timeout 70 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
   --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | grep -v "^bench:" | tail -22
 timeout 50 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
   --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | grep -v "^bench:" | tail -14) | tee "$OUT/bench.txt"
timeout 130 $P tests/test_kernels_decode_tc.py -k "real_sizes or exact or config" 2>&1 | tail -2 | tee -a "$OUT/tests.txt"
