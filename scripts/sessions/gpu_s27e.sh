#!/usr/bin/env bash
# Session 27 (H100): the layer at T=1 and 2 under triton 3.6, then 3.9, at the final decode rules
# (A3 and the halved GEMM2 BK under 3.9): bf16 qwen3 / Mixtral / deepseek-v3 tp8, qwen3 fp8_channel,
# deepseek fp8_block (fusedmoe bench, triton backend, no peers).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
run() {
  python3 -m fusedmoe bench --model qwen3-30b-a3b,mixtral-8x7b --tokens 1,2 --quant none --backend triton --peers none \
    2>/dev/null | grep -E "ceilings|^==|triton" | tee -a "$OUT/t1_$1.txt"
  python3 -m fusedmoe bench --model qwen3-30b-a3b --tokens 1,2 --quant fp8_channel --backend triton --peers none \
    2>/dev/null | grep -E "ceilings|^==|triton" | tee -a "$OUT/t1_$1.txt"
  python3 -m fusedmoe bench --model deepseek-v3 --tp 8 --tokens 1,2 --quant none,fp8_block --backend triton --peers none \
    2>/dev/null | grep -E "ceilings|^==|triton" | tee -a "$OUT/t1_$1.txt"
}
timeout 280 bash -c "$(declare -f run); run 36"
(source scripts/t39_env.sh && timeout 280 bash -c "$(declare -f run); run 39")
