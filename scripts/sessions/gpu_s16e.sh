#!/usr/bin/env bash
# Session 16, call 10 (H100): the alignment's chunk size at n = 8K..128K pairs (benchmarks/align_ab.py
# --chunks), then the first half of the GPU suite at this session's code.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 benchmarks/align_ab.py --chunks 256,512,1024,2048 --out "$OUT/align_chunks.json" 2>&1 \
  | tee "$OUT/align_chunks.txt"
timeout 380 bash scripts/gpu_run.sh test-a | tail -4
