#!/usr/bin/env bash
# Session 17, last bench (H100): issue 5's points (qwen3 T=4096 twice, T=16384, deepseek tp8 T=4096) and
# issue 4's Mixtral T=256 / qwen3 T=1024 at the final code and entries.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
b() {  # model quants tokens [extra]
  timeout 150 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model $1 --quant $2 \
    --tokens $3 ${4:-} 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/$1 /"
}
{
for rep in 1 2; do b qwen3-30b-a3b none,fp8_channel,int8_channel 4096; done
b deepseek-v3 none,fp8_block 4096 "--tp 8"
b mixtral-8x7b none 256
b qwen3-30b-a3b none,fp8_channel 1024
b qwen3-30b-a3b none,fp8_channel,int8_channel 16384
} 2>&1 | tee "$OUT/s17e_final.txt"
