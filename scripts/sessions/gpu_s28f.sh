#!/usr/bin/env bash
# Prepared in session 28, NOT RUN (the device budget was spent): the Gluon GEMM2 probe under triton 3.6 and then
# 3.9, whose variants add w2's TMA loads with an L2 evict_first policy (Gluon's cache_policy, 3.9 only), so
# that the output band the atomic adds hit stays in L2 (docs/NOTES.md, next steps). Carry `.whl`; H100:
# name kind nvidia-h100-x1.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 scripts/gluon_gemm2_probe.py --tokens 16384,4096 2>&1 | grep -v "nanobind\|leaked\|^ - " \
  | tee "$OUT/gl_probe36.txt" | grep -E "T=|BAD"
( source scripts/t39_env.sh && timeout 240 python3 scripts/gluon_gemm2_probe.py --tokens 16384,4096 2>&1 \
    | grep -v "nanobind\|leaked\|^ - " | tee "$OUT/gl_probe39.txt" | grep -E "T=|BAD" )
