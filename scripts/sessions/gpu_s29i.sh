#!/usr/bin/env bash
# Session 29 (H100: kind nvidia-h100-x1): the decode GPU tests at the final commit (decode_config's gemm2= flag).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
timeout 170 $P tests/test_kernels_decode.py tests/test_compile_sm90.py 2>&1 | tee "$OUT/tests36.txt" | tail -2
timeout 170 $P tests/test_gpu_layer.py tests/test_backends.py -k "decode or w8a8 or pdl" 2>&1 | tee -a "$OUT/tests36.txt" | tail -2
