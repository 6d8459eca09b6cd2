#!/usr/bin/env bash
# Session 31 (H100: kind nvidia-h100-x1): `fusedmoe bench` of the W8A8 decode at T <= 16 at the final code, by
# default (auto) and with the tensor-core chain forced (FUSEDMOE_W8A8_DECODE=tc: what auto takes above
# auto_a16_max_t), then the rest of the decode GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/tests.txt"
bench() {  # $1: label
  (timeout 70 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
     --peers none --backend triton --json "$OUT/bench_q_$1.json" 2>&1 | grep -v "^bench:" | tail -22
   timeout 50 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
     --peers none --backend triton --json "$OUT/bench_d_$1.json" 2>&1 | grep -v "^bench:" | tail -14) | tee "$OUT/bench_$1.txt"
}
bench auto
FUSEDMOE_W8A8_DECODE=tc bench tc
timeout 200 $P tests/test_kernels_decode_tc.py -k "not hq and not real_sizes" 2>&1 | tail -2 | tee -a "$OUT/tests.txt"
timeout 150 $P tests/test_gpu_layer.py tests/test_backends.py -k "decode or w8a8" 2>&1 | tail -2 | tee -a "$OUT/tests.txt"
