#!/usr/bin/env bash
# Session 22 (H100): the prefill PDL chain past PREFILL_PDL_MAX_M (64 pairs an expert; session 8
# measured bf16 2-3% slower at T=4096 with that session's kernels) on the W8A8 points of issue 5,
# whose chains hold two quantization kernels more: default / unbounded, alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
b() {  # max_m model tp quants tokens
  timeout 120 python3 -c "import sys, fusedmoe.backends.triton as t; t.PREFILL_PDL_MAX_M = int(sys.argv[1]); \
from fusedmoe.cli.main import main; raise SystemExit(main(sys.argv[2:]))" $1 bench --peers none --backend triton \
    --no-progress --model $2 --tp $3 --quant $4 --tokens $5 2>&1 | grep -E "triton|FAIL|rror|scheme" | sed "s/^/PDL_MAX_M=$1 /"
}
for m in 64 1000000 64 1000000; do
  b $m qwen3-30b-a3b 1 none,fp8_channel,int8_channel 4096,16384 | tee -a "$OUT/s22g_ab.txt"
  b $m deepseek-v3 8 fp8_block 4096 | tee -a "$OUT/s22g_ab.txt"
done
