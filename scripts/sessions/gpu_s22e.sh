#!/usr/bin/env bash
# Session 22 (H100): FUSEDMOE_H_QUANT=pow2 (fp8_channel: GEMM1 writes fp8 h with power-of-two
# group scales, regroup_pow2 puts each row on one power-of-two scale) against 'kernel' (the
# default: 16-bit h, then the per-token quantizer), alternating; its GPU tests first.
# REVERTED after this A/B (9-14% slower): commit b66797f has FUSEDMOE_H_QUANT=pow2, b0dea34 its compile cases;
# at later commits the environment variable rejects pow2.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_quantize.py tests/test_backends.py \
  -k "regroup or h_pow2 or h_quantized" 2>&1 | tail -3 | tee "$OUT/s22e_tests.txt"
for r in 1 2; do
  for m in kernel pow2; do
    FUSEDMOE_H_QUANT=$m timeout 120 python3 -m fusedmoe bench --peers none --backend triton --no-progress \
      --model qwen3-30b-a3b --quant fp8_channel --tokens 1024,4096,16384 2>&1 | grep -E "triton|FAIL|rror" \
      | sed "s/^/H_QUANT=$m /" | tee -a "$OUT/s22e_ab.txt"
  done
done
