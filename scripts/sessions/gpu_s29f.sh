#!/usr/bin/env bash
# Session 29 (H100: kind nvidia-h100-x1): the layer under session 29's 8-bit decode tile rules against session 28's
# and each half alone, T = 1, 2, 3 (benchmarks/decode_t2.py --rule-ab); the layer test that failed at 760e7c7.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 360 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" --rule-ab 1,2,3 --layer-rounds 3 \
  --json "$OUT/rule_ab.json" 2>&1 | grep -v "Warning\|warn_once" | tee "$OUT/rule_ab.txt"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_layer.py -k "decode_pdl_chain" 2>&1 | tail -2
