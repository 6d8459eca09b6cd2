#!/usr/bin/env bash
# `fusedmoe bench` T = 2, 3, 4 of the tensor-core W8A8 decode (tc forced) for each value of an environment
# variable, alternating, two rounds: qwen3-30b-a3b fp8_channel / int8_channel, deepseek-v3 tp8 fp8_block.
#   bash scripts/tc_env_ab.sh VAR "v1 v2 ..." >> log
set -uo pipefail
var=$1; values=$2
for r in 1 2; do for m in $values; do
  echo "== $var=$m round $r"
  env "$var=$m" FUSEDMOE_W8A8_DECODE=tc timeout 60 python3 -m fusedmoe bench --tokens 2,3,4 \
    --model qwen3-30b-a3b --quant fp8_channel,int8_channel --peers none --backend triton 2>&1 \
    | grep -E "^ +[0-9]+ triton|scheme="
  env "$var=$m" FUSEDMOE_W8A8_DECODE=tc timeout 50 python3 -m fusedmoe bench --tokens 2,3,4 \
    --model deepseek-v3 --tp 8 --quant fp8_block --peers none --backend triton 2>&1 \
    | grep -E "^ +[0-9]+ triton|scheme="
done; done
