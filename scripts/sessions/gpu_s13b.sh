#!/usr/bin/env bash
# Session 13, second device call (run at commit 277f2e4, since reverted): the fp16 lanes with
# the one-load activation amax pass (the first call's version looped over K for it), their GPU
# tests, then the same A/B as gpu_s13a.sh.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py -k "fp16_lanes or tiles or quantized or 16bit" \
  > "$OUT/tests_f16.txt" 2>&1
tail -3 "$OUT/tests_f16.txt"; grep -E "^(FAILED|ERROR)" "$OUT/tests_f16.txt" | head -20
timeout 250 python3 benchmarks/decode_ab.py --skip A,B,C,D,T --g-cases qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block \
  --g-tokens 1 --g-tiles 1,4 --g-f16acc --g-env FUSEDMOE_DECODE_F16ACC=0,1 --out "$OUT/g_f16b.json" > "$OUT/g_f16b.txt" 2>&1
grep "^G" "$OUT/g_f16b.txt" | head -90
