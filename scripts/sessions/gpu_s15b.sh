#!/usr/bin/env bash
# Session 15: the triton backend after MASK_A became the default (padding rows of an m-block
# load nothing) and the qwen3 int8_channel T=4096 entry change, through `fusedmoe bench`
# (correctness checked against the reference before timing), the W8A8 schemes beside bf16 in
# the same run (issue 5's ratios).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
b() {  # tag, timeout, args
  local tag=$1 t=$2; shift 2
  timeout "$t" python3 -m fusedmoe bench --peers none --backend triton --no-progress "$@" --json "$OUT/s15b_$tag.json" \
    > "$OUT/s15b_$tag.txt" 2>&1
  echo "== $tag rc=$?"; grep -E "triton|FAIL|rror" "$OUT/s15b_$tag.txt" | head -14
}
b mx 200 --model mixtral-8x7b --tokens 64,256,1024,4096,16384
b qw 150 --model qwen3-30b-a3b --tokens 256,1024,4096,16384 --quant none,fp8_channel,int8_channel
b ds 150 --model deepseek-v3 --tp 8 --tokens 256,1024,4096,16384 --quant none,fp8_block
