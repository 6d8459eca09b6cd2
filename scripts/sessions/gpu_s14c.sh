#!/usr/bin/env bash
# Session 14, device call: the atomic_out k-sum tested on the GPU (the GEMM kernel test file
# whole, the backend's reduce-mode test, the persistent tests), then the Mixtral A/B of
# FUSEDMOE_REDUCE (the first call's preset name was wrong).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_persistent.py \
  tests/test_backends.py -k "not test_backends or reduce_modes or resident" > "$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"; grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -20
for mode in deterministic atomic_out; do
  FUSEDMOE_REDUCE=$mode timeout 110 python3 -m fusedmoe bench --peers none --backend triton --no-progress \
    --model mixtral-8x7b --tokens 4096,16384 > "$OUT/ab_mx_$mode.txt" 2>&1
  echo "== mx $mode"; grep -E "triton|==|FAIL|rror" "$OUT/ab_mx_$mode.txt" | head
done
