#!/usr/bin/env bash
# Session 29 (H100: kind nvidia-h100-x1; carry .whl): the decode tiles / auto rule of 760e7c7 verified:
# the decode kernel tests (triton 3.6 and 3.9), the layer's decode / W8A8 GPU tests, the backends' decode tests,
# and the decode sweep as `fusedmoe bench` reports it (T = 1, 2, 3, 4, 8, 16).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
timeout 150 $P tests/test_kernels_decode.py 2>&1 | tee "$OUT/tests36.txt" | tail -2
timeout 150 $P tests/test_gpu_layer.py tests/test_backends.py -k "decode or w8a8 or pdl" 2>&1 | tee -a "$OUT/tests36.txt" | tail -2
( source scripts/t39_env.sh && timeout 190 $P tests/test_kernels_decode.py 2>&1 | tee "$OUT/tests39.txt" | tail -2 )
timeout 60 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
  --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | grep -v "^bench:" | tail -22 | tee "$OUT/bench.txt"
timeout 45 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
  --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | grep -v "^bench:" | tail -14 | tee -a "$OUT/bench.txt"
