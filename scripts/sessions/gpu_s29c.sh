#!/usr/bin/env bash
# Session 29 (H100: kind nvidia-h100-x1): the W8A8 a16 decode GEMMs at T = 1, 2 against a pure read of
# their bytes, a tile grid around decode_config's choice, and the layer per decode mode at T = 2, 3
# (benchmarks/decode_t2.py).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 560 python3 benchmarks/decode_t2.py ${ARGS:-} --json "$OUT/decode_t2.json" 2>&1 | grep -v "Warning\|warn_once" \
  | tee "$OUT/decode_t2.txt"
