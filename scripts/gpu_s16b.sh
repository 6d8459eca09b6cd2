#!/usr/bin/env bash
# Session 16, call 2 (H100): the decode GEMM1's L2 prefetch of w2: its GPU tests, then the A/B.
export OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py -k "l2" 2>&1 | tail -5 | tee "$OUT/l2_tests.txt"
timeout 380 python3 benchmarks/l2_prefetch_ab.py --out "$OUT/l2_ab.json" 2>&1 | tee "$OUT/l2_ab.txt"
