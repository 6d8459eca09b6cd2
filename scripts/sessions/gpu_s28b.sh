#!/usr/bin/env bash
# Session 28 (H100): the A-resident GEMM2 with A held in registers (wgmma.s A from registers; scripts/s28_diag_g2.patch applied,
# DIAG_G2 >= 10) against the shipped form (A in shared memory), deepseek-v3 tp8 bf16 / fp8_block:
# per-kernel times, then the layer (fusedmoe bench, checked against the reference) in alternating runs.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; S=$SECONDS
for d in 10 12; do for q in none fp8_block; do
  echo "### DIAG_G2=$d quant=$q" | tee -a "$OUT/diag_g2.txt"
  DIAG_G2=$d timeout 120 python3 benchmarks/profile_stages.py --model deepseek-v3:8 --tokens 4096,16384 \
    --quant $q 2>&1 | head -40 | tee -a "$OUT/diag_g2.txt" | grep -E "==|resident|gemm" | head -8
done; done
for d in 0 10 0 10; do
  echo "### bench DIAG_G2=$d" | tee -a "$OUT/bench_ab.txt"
  DIAG_G2=$d timeout 150 python3 -m fusedmoe bench --model deepseek-v3 --tp 8 --tokens 4096,16384 --quant none,fp8_block \
    --peers none --backend triton --no-progress 2>&1 | tee -a "$OUT/bench_ab.txt" | grep -E "triton|error|Error" | head -6
done
echo "elapsed $((SECONDS - S)) s"
if [ $((SECONDS - S)) -lt 330 ] && [ -s .whl/libtriton39.so.xz ]; then
  ( source scripts/t39_env.sh && timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py 2>&1 \
    | tee "$OUT/decode_tests39.txt" | tail -3 )
fi
