#!/usr/bin/env bash
# Session 12, second device call: decode GEMM2 with several N tiles a program (TILES): its tests
# on the GPU, then benchmarks/decode_ab.py section G (GEMM2 alone, then the layer, at T = 1, 2).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py -k "tiles or gpu" 2>&1 | tail -4 | tee "$OUT/tests.txt"
timeout 420 python3 benchmarks/decode_ab.py --skip A,B,C,D,T --out "$OUT/g.json" 2>&1 | grep -v Warn | tee "$OUT/g.txt"
