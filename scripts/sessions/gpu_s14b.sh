#!/usr/bin/env bash
# Session 14, device call: triton 3.6's Hopper warp specialization (a dense TMA GEMM, then
# prototype grouped GEMMs with A in sorted order through a tensor descriptor) against the
# shipped kernels, per GEMM; every variant in a child process with a timeout (the first try,
# all variants in one process, hung at the first warp-specialized launch).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 580 python3 benchmarks/ws_ab.py --deadline 480 --timeout 45 --out "$OUT/ws_ab.txt" \
  --variants "${VARIANTS:-shipped,ws:128:3:4,nows:128:3:8,ws:128:3:4:noif,ws:256:3:4,nows:256:3:8}" --cases \
"${CASES:-plain:bf16,plain:fp8,qwen3-30b-a3b:1:16384:fp8_channel:gemm2,qwen3-30b-a3b:1:16384:fp8_channel:gemm1,qwen3-30b-a3b:1:16384:none:gemm1,deepseek-v3:8:16384:none:gemm2}" \
  2>&1 | grep -v Warning | tail -150
