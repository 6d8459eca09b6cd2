#!/usr/bin/env bash
# Session 33 (H100, ~2 min): is a call slower back to back (bench's graph) than alone? deepseek-v3 tp8 fp8_block
# T=3,4 (tc), qwen3 fp8_channel / int8_channel T=1,3 (auto); benchmarks/graph_timeline.py, kernel timelines.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/timeline.txt"
timeout 150 python3 benchmarks/graph_timeline.py --case deepseek-v3:8:fp8_block --tokens 3,4 --mode tc 2>&1 | tee -a "$OUT/timeline.txt"
FUSEDMOE_DECODE_PDL=0 timeout 100 python3 benchmarks/graph_timeline.py --case deepseek-v3:8:fp8_block --tokens 3 --mode tc 2>&1 \
  | sed 's/^== /== PDL=0 /' | tee -a "$OUT/timeline.txt"
timeout 150 python3 benchmarks/graph_timeline.py --case qwen3-30b-a3b:1:fp8_channel,qwen3-30b-a3b:1:int8_channel --tokens 1,3 2>&1 \
  | tee -a "$OUT/timeline.txt"
