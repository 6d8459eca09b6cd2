#!/usr/bin/env bash
# (Needs commit 0b58862: the code it measures was reverted after it lost.)
# Session 23: one-token 8-bit decode with GEMM2's weights resident in shared memory
# (kernels/decode_resident.py) beside a persistent GEMM1: its tests, then the layer A/B
# FUSEDMOE_DECODE_RESIDENT = 0 (off) / 1 / 2 / 3 (GEMM1 programs an SM), alternating rounds.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi -L
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_decode_resident.py 2>&1 | tail -25 | tee "$OUT/s23a_tests.txt"
timeout 300 python3 benchmarks/decode_ab.py --skip A,B,C,D,G,T --r-rounds 3 --out "$OUT/s23a_r.json" 2>&1 \
  | grep -v "^\s*$" | tee "$OUT/s23a_r.txt"
