#!/usr/bin/env bash
# Session 30 (H100: kind nvidia-h100-x1): the final code's decode GPU tests (tc decode kernels, the layer's and
# backends' decode / W8A8 / PDL tests with the SHARE table in the chain), then `fusedmoe bench` at T <= 16.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/tests.txt"
timeout 200 $P tests/test_kernels_decode_tc.py 2>&1 | tail -2 | tee -a "$OUT/tests.txt"
timeout 260 $P tests/test_gpu_layer.py tests/test_backends.py -k "decode or w8a8 or pdl or tc" 2>&1 | tail -3 | tee -a "$OUT/tests.txt"
(timeout 60 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
   --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | grep -v "^bench:" | tail -22
 timeout 45 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
   --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | grep -v "^bench:" | tail -14) | tee "$OUT/bench.txt"
