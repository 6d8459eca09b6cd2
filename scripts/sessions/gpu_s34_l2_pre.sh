#!/usr/bin/env bash
# Session 34, H100 (kind nvidia-h100-x1), ~7 min: L2_PRE (kernels/decode_tc.py: before its PDL wait, the
# tensor-core decode GEMM1 hints L2 with the first lines of its weight rows, GEMM2 with its first slots' rows;
# FUSEDMOE_TC_L2_PRE "G1,G2", off by default). The timelines (docs/BENCHMARKS.md, thirty-third section) show
# DRAM idle while x is quantized (GEMM1 waits for it before its first load) and GEMM2 resident, waiting.
# 1. GPU tests: the output bitwise the same with hints off / on; the tc GPU tests with hints on.
# 2. `fusedmoe bench` T = 2, 3, 4 (tc forced) for FUSEDMOE_TC_L2_PRE 0 / 4,0 / 8,0 / 0,8 / 4,8, two rounds.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/l2.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode_tc.py -k "l2_pre" 2>&1 | tail -2 \
  | tee -a "$OUT/l2.txt"
FUSEDMOE_TC_L2_PRE=4,8 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_decode_tc.py \
  2>&1 | tail -2 | tee -a "$OUT/l2.txt"
bash scripts/tc_env_ab.sh FUSEDMOE_TC_L2_PRE "0 4,0 8,0 0,8 4,8" | tee -a "$OUT/l2.txt"
