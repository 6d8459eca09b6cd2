#!/usr/bin/env bash
# Session 29 (H100: name kind nvidia-h100-x1; carry .whl): (1) the decode tests under triton 3.9 in
# session 28's final form, (2) benchmarks/dense_ceiling.py (the vendor's dense GEMMs at the targets'
# shapes with an ideal MoE around them), (3) session 28's prepared Gluon probe (scripts/sessions/gpu_s28f.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
( source scripts/t39_env.sh && timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 \
    | tee "$OUT/decode_tests39.txt" | tail -3 )
timeout 150 python3 benchmarks/dense_ceiling.py --json "$OUT/dense_ceiling.json" 2>&1 | grep -v "^    {" \
  | tee "$OUT/dense_ceiling.txt"
G="python3 scripts/gluon_gemm2_probe.py --tokens 16384"
timeout 110 $G 2>&1 | grep -v "nanobind\|leaked\|^ - " | tee "$OUT/gl_probe36.txt" | grep -E "T=|BAD"
( source scripts/t39_env.sh && timeout 140 $G 2>&1 | grep -v "nanobind\|leaked\|^ - " | tee "$OUT/gl_probe39.txt" \
    | grep -E "T=|BAD" )
