#!/usr/bin/env bash
# Prepared in session 33, not run (device budget spent). H100 (kind nvidia-h100-x1), ~6 min: EARLY_W
# (kernels/decode_tc.py: the tc GEMM2's first weight tile loaded before its wait for h, the expert checked again
# after it; FUSEDMOE_TC_EARLY_W, off by default). Its tests on the GPU (bitwise the plain loop; the tc decode and
# backend GPU tests with it on, PDL chain included), then `fusedmoe bench` T = 2, 3, 4 with FUSEDMOE_TC_EARLY_W 0 / 1
# alternating, two rounds (qwen3 fp8 / int8, deepseek tp8 fp8_block; tc forced). Where 1 wins in both rounds, make
# it the default (env.tc_early_w) and say so in the README.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/s34.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode_tc.py -k "early" 2>&1 | tail -2 \
  | tee -a "$OUT/s34.txt"
FUSEDMOE_TC_EARLY_W=1 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py \
  tests/test_backends.py -k "tc or decode or w8a8" 2>&1 | tail -2 | tee -a "$OUT/s34.txt"
bash scripts/tc_env_ab.sh FUSEDMOE_TC_EARLY_W "0 1" | tee -a "$OUT/s34.txt"
