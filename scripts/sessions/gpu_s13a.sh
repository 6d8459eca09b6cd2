#!/usr/bin/env bash
# Session 13, first device call (run at commit b3c546d, the fp16-lane decode since reverted):
# the decode kernels' tests whole on the GPU, then the fp16-lane A/B of the a16 decode at T=1:
# each GEMM alone (config F16ACC off / on over decode_config's neighbourhood) and the layer
# under FUSEDMOE_DECODE_F16ACC=0 / 1 (decode_ab.py's --g-f16acc, gone with the revert).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env.txt"
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py > "$OUT/tests_decode.txt" 2>&1
tail -5 "$OUT/tests_decode.txt"; grep -E "^(FAILED|ERROR)" "$OUT/tests_decode.txt" | head -20
timeout 250 python3 benchmarks/decode_ab.py --skip A,B,C,D,T --g-cases qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block \
  --g-tokens 1 --g-tiles 1,4 --g-f16acc --g-env FUSEDMOE_DECODE_F16ACC=0,1 --out "$OUT/g_f16.json" > "$OUT/g_f16.txt" 2>&1
grep "^G" "$OUT/g_f16.txt" | head -90
