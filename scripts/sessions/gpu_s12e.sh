#!/usr/bin/env bash
# Session 12, last device call: the decode kernels' tests whole, the layer's GPU tests and the
# backend's decode tests at the session's final kernel code.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 570 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py tests/test_gpu_layer.py \
  tests/test_backends.py -k "not cpu_only" --durations=5 2>&1 | tail -15 | tee "$OUT/tests.txt"
