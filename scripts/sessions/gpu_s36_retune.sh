#!/usr/bin/env bash
# Prepared in session 35. H100 (kind nvidia-h100-x1), ~6 min:  OUT=$OUT bash scripts/sessions/gpu_s36_retune.sh
# Session 34's one-T `fusedmoe tune` found 1.05x over the shipped qwen3-30b-a3b fp8_channel T=64 entry
# (fusedmoe/kernels/configs/E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_channel.json). This retunes
# T = 16, 64, 256 into $OUT/configs, then times the layer with the shipped file and with the new one
# (FUSEDMOE_CONFIG_DIR, searched first), alternating, two rounds. Where the new entries win both rounds,
# copy them into the shipped file (keep its other T; say so in docs/BENCHMARKS.md).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/configs"
log="$OUT/s36_retune.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
timeout 300 python3 -m fusedmoe tune --model qwen3-30b-a3b --quant fp8_channel --tokens 16,64,256 \
  --out-dir "$OUT/configs" --no-progress 2>&1 | grep -v "Warn\|_warn" | tail -8 | tee -a "$log"
ls "$OUT/configs" | tee -a "$log"
for r in 1 2; do
  for v in shipped tuned; do
    echo "== $v round $r" | tee -a "$log"
    if [ "$v" = tuned ]; then dir="$OUT/configs"; else dir=""; fi
    FUSEDMOE_CONFIG_DIR=$dir timeout 60 python3 -m fusedmoe bench --tokens 16,64,256 --model qwen3-30b-a3b \
      --quant fp8_channel --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton" | tee -a "$log"
  done
done
