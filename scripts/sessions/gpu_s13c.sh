#!/usr/bin/env bash
# Session 13, third device call: the final decode code (fp16 lanes reverted; GEMM2's K limit as
# K * keep) tested whole on the GPU, and the 8-bit decode bench at T = 1, 2, 4.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py > "$OUT/tests_decode.txt" 2>&1
tail -3 "$OUT/tests_decode.txt"; grep -E "^(FAILED|ERROR)" "$OUT/tests_decode.txt" | head -20
timeout 150 python3 -m fusedmoe bench --tokens 1,2,4 --model deepseek-v3 --tp 8 --quant fp8_block --peers none \
  --backend triton > "$OUT/bench_ds.txt" 2>&1
timeout 150 python3 -m fusedmoe bench --tokens 1,2,4 --model qwen3-30b-a3b --quant fp8_channel --peers none \
  --backend triton > "$OUT/bench_q8.txt" 2>&1
grep -E "triton|Device|ceilings" "$OUT"/bench_*.txt | head -20
