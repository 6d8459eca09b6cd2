#!/usr/bin/env bash
# Session 29 (H100 kind nvidia-h100-x1; H200 with ONLY=layer): the W8A8 decode layer per mode (auto / a16 / tc)
# at T = 1..4 with the new 8-bit decode tiles (benchmarks/decode_t2.py), then the decode kernel tests (triton 3.6).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 330 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens 1,2,3,4 --layer-rounds 3 \
  --json "$OUT/decode_layer.json" 2>&1 | grep -v "Warning\|warn_once" | tee "$OUT/decode_layer.txt"
[ "${ONLY:-}" = layer ] && exit 0
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 | tee "$OUT/decode_tests36.txt" | tail -3
