#!/usr/bin/env bash
# Session 17, call 1 (H100): the atomic k-sum's output zeroed early (by the quantization of x for
# W8A8, by a fill ahead of the alignment for 16-bit x; backends/triton.py FUSED_ZERO). Its GPU
# tests (and test_gpu_align_large, added in session 16), then FUSED_ZERO=0 / 1 alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
{
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_quantize.py -k "fused_zero" 2>&1 | tail -3
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_layer.py \
  -k "atomic_k_sum or prefill_pdl or graph_capture" 2>&1 | tail -3
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gemm.py -k "align_large" 2>&1 | tail -3
} 2>&1 | tee "$OUT/s17a_tests.txt"
b() {  # fused_zero model quants tokens [extra]
  timeout 150 python3 -c "
import sys
import fusedmoe.backends.triton as t
t.FUSED_ZERO = bool(int(sys.argv[1]))
from fusedmoe.cli.main import main
raise SystemExit(main(sys.argv[2:]))" $1 bench --peers none --backend triton --no-progress \
    --model $2 --quant $3 --tokens $4 ${5:-} 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/fz=$1 $2 /"
}
for fz in 0 1 0 1; do
  b $fz qwen3-30b-a3b none,fp8_channel,int8_channel 4096
  b $fz mixtral-8x7b none 256
done 2>&1 | tee "$OUT/s17a_ab.txt"
for fz in 0 1; do
  b $fz qwen3-30b-a3b none,fp8_channel 1024
  b $fz deepseek-v3 fp8_block 4096 "--tp 8"
done 2>&1 | tee -a "$OUT/s17a_ab.txt"
