#!/usr/bin/env bash
# Session 28 (H100): what bounds deepseek-v3 tp8's A-resident GEMM2 (the DIAG_G2 switch of scripts/s28_diag_g2.patch, applied uncommitted: `git apply`, in
# _moe_gemm2_resident_kernel: 0 shipped, 1 plain stores instead of atomic adds, 2 atomics masked off at
# run time, 3 no MMA: the atomic adds alone), then the decode tests under triton 3.9 (carry .whl).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for q in none fp8_block; do
  for d in 0 1 2 3; do
    echo "### DIAG_G2=$d quant=$q" | tee -a "$OUT/diag_g2.txt"
    DIAG_G2=$d timeout 120 python3 benchmarks/profile_stages.py --model deepseek-v3:8 --tokens 4096,16384 \
      --quant $q 2>&1 | head -40 | tee -a "$OUT/diag_g2.txt" | grep -E "==|resident|gemm" | head -8
  done
done
if [ -f .whl/libtriton39.so.xz ] && [ -s .whl/libtriton39.so.xz ]; then
  ( source scripts/t39_env.sh && timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 \
    | tee "$OUT/decode_tests39.txt" | tail -3 )
fi
