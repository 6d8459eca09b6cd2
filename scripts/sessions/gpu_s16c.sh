#!/usr/bin/env bash
# Session 16, call 3 (H100): the grouped path's second stream (alignment + zeroing of the atomic
# sum beside the quantization of x and GEMM1). Its GPU tests, then FUSEDMOE_OVERLAP=0 / 1
# alternating, bf16 and W8A8 in the same run each time.
# (Reverted: no gain, docs/BENCHMARKS.md sixteenth section; the code is at commit 319c010.)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_layer.py -k "overlap or atomic_k_sum or prefill_pdl or graph_capture" 2>&1 \
  | tail -4 | tee "$OUT/s16c_tests.txt"
b() {  # overlap model quants tokens [extra]
  FUSEDMOE_OVERLAP=$1 timeout 150 python3 -m fusedmoe bench --peers none --backend triton --no-progress \
    --model $2 --quant $3 --tokens $4 ${5:-} 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/ov=$1 /"
}
for ov in 0 1 0 1; do
  b $ov qwen3-30b-a3b none,fp8_channel,int8_channel 4096
done 2>&1 | tee "$OUT/s16c_overlap_ab.txt"
for ov in 0 1; do
  b $ov qwen3-30b-a3b none,fp8_channel 16384
  b $ov deepseek-v3 none,fp8_block 4096 "--tp 8"
done 2>&1 | tee -a "$OUT/s16c_overlap_ab.txt"
