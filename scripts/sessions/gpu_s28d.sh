#!/usr/bin/env bash
# Session 28 (H100): (1) the layer with h loaded evict_first in the A-resident GEMM2 (S28_EV=3, scripts/s28_evict_ab.patch applied,
# switch) against the shipped kernel, alternating; (2) the A-resident GPU tests with it; (3) the decode tests
# under triton 3.9 (carry .whl) after the TILES test's fix.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for ev in 0 3 0 3; do
  echo "### bench S28_EV=$ev" | tee -a "$OUT/ev_bench.txt"
  S28_EV=$ev timeout 120 python3 -m fusedmoe bench --model deepseek-v3 --tp 8 --tokens 4096,16384 --quant none,fp8_block \
    --peers none --backend triton --no-progress 2>&1 | tee -a "$OUT/ev_bench.txt" | grep -E "triton|rror" | head -6
done
S28_EV=3 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gemm.py -k "resident" \
  tests/test_backends.py 2>&1 | tee "$OUT/resident_tests.txt" | tail -3
( source scripts/t39_env.sh && timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 \
    | tee "$OUT/decode_tests39.txt" | tail -3 )
