#!/usr/bin/env bash
# Session 21 (H100): GEMM1 zeroing GEMM2's atomic output on the side (backends/triton.py
# ZERO_IN_GEMM1; grouped_gemm.py gemm1_act zero=). Its GPU tests, then ZERO_IN_GEMM1 0 / 1 on the
# points whose k-sum is atomic (qwen3 and deepseek-v3 tp8 at T=4096 / 16384, 16-bit and 8-bit),
# then the share stored after the tile (ZERO_AFTER_TILE) where GEMM1 is persistent. That switch
# measured the same as "before" and was removed after the session (commit d0c758e has it).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_persistent.py tests/test_backends.py \
  tests/test_gpu_layer.py -k "zero or atomic" 2>&1 | grep -E "Error|assert|passed|failed" | head -8 | tee "$OUT/s21a_tests.txt"
b() {  # module.switch value model tp quants tokens
  timeout 150 python3 scripts/switch_bench.py $1 $2 bench --peers none --backend triton --no-progress \
    --model $3 --tp $4 --quant $5 --tokens $6 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/${1##*.}=$2 $3 /"
}
Z=fusedmoe.backends.triton.ZERO_IN_GEMM1
for z in 0 1 0 1; do
  b $Z $z deepseek-v3 8 none,fp8_block 4096,16384 | tee -a "$OUT/s21a_ab.txt"
  b $Z $z qwen3-30b-a3b 1 none,fp8_channel,int8_channel 4096,16384 | tee -a "$OUT/s21a_ab.txt"
done
A=fusedmoe.kernels.grouped_gemm.ZERO_AFTER_TILE
for a in 1 0; do
  b $A $a qwen3-30b-a3b 1 none,fp8_channel 4096 | tee -a "$OUT/s21a_after.txt"
  b $A $a mixtral-8x7b 1 none 16384 | tee -a "$OUT/s21a_after.txt"
done
