#!/usr/bin/env bash
# Session 32, kind nvidia-h200: the W8A8 decode modes a16 / tc at T = 2..4 under the session-32 tc rules
# (for auto_a16_max_t on the H200), the bounded GEMM1 6-stage rule on gpt-oss-120b tp8, then the tc decode
# and the layer's decode / W8A8 / PDL GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/final.txt"
timeout 150 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens 2,3,4 --layer-modes a16,tc --layer-rounds 3 \
  --cases qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block --json "$OUT/modes.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/final.txt"
timeout 60 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" --cases gpt-oss-120b:8:int8_channel \
  --rule-ab 2,3,4 --rule-variants tcnew,tcds --layer-rounds 3 --json "$OUT/gptoss.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/final.txt"
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_decode_tc.py tests/test_gpu_layer.py \
  tests/test_backends.py -k "decode or w8a8 or pdl or tc" 2>&1 | tail -15 > "$OUT/tests.txt"
tail -3 "$OUT/tests.txt"
