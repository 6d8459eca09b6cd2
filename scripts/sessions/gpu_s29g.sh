#!/usr/bin/env bash
# Session 29 (H100: kind nvidia-h100-x1): the final 8-bit decode rules (BK 128 from two tokens on) against session
# 28's in the layer (benchmarks/decode_t2.py --rule-ab), the decode GPU tests, and the W8A8 decode sweep.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" --rule-ab 1,2,3 --rule-variants new,old \
  --layer-rounds 3 --json "$OUT/rule_ab.json" 2>&1 | grep -v "Warning\|warn_once" | tee "$OUT/rule_ab.txt"
P="python3 -m pytest -q -p no:cacheprovider"
timeout 150 $P tests/test_kernels_decode.py 2>&1 | tee "$OUT/tests36.txt" | tail -2
timeout 150 $P tests/test_gpu_layer.py tests/test_backends.py -k "decode or w8a8 or pdl" 2>&1 | tee -a "$OUT/tests36.txt" | tail -2
timeout 60 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model qwen3-30b-a3b --quant fp8_channel,int8_channel \
  --peers none --backend triton --json "$OUT/bench_q.json" 2>&1 | grep -v "^bench:" | tail -22 | tee "$OUT/bench.txt"
timeout 45 python3 -m fusedmoe bench --tokens 1,2,3,4,8,16 --model deepseek-v3 --tp 8 --quant fp8_block \
  --peers none --backend triton --json "$OUT/bench_d.json" 2>&1 | grep -v "^bench:" | tail -14 | tee -a "$OUT/bench.txt"
