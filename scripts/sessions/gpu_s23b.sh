#!/usr/bin/env bash
# (Needs commit 0b58862: the code it measures was reverted after it lost.)
# Session 23: the resident decode's parts (benchmarks/resident_ab.py): GEMM1 alone at each
# persist, GEMM2 a16 vs resident at 4 / 8 / 16 warps, the layer at FUSEDMOE_DECODE_RESIDENT values.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 420 python3 benchmarks/resident_ab.py --layer 0,2,3,99 2>&1 | grep -v "^\s*$" | tee "$OUT/s23b_parts.txt"
