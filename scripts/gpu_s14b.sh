#!/usr/bin/env bash
# Session 14, second device call: triton 3.6's Hopper warp specialization on prototype grouped
# GEMMs (A in sorted order through a tensor descriptor) against the shipped kernels, per GEMM.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 570 python3 benchmarks/ws_ab.py --deadline 500 --out "$OUT/ws_ab.txt" --cases \
qwen3-30b-a3b:1:16384:fp8_channel:gemm2,qwen3-30b-a3b:1:16384:fp8_channel:gemm1,\
qwen3-30b-a3b:1:16384:none:gemm2,qwen3-30b-a3b:1:16384:none:gemm1,\
deepseek-v3:8:16384:none:gemm1,deepseek-v3:8:16384:none:gemm2,mixtral-8x7b:1:16384:none:gemm1,\
qwen3-30b-a3b:1:4096:fp8_channel:gemm1,qwen3-30b-a3b:1:4096:fp8_channel:gemm2 2>&1 | grep -v Warning | tail -150
