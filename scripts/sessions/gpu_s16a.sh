#!/usr/bin/env bash
# Session 16, call 1 (H100): the GPU suite's second half (includes MASK_A bitwise at Mixtral's
# real size, never run), then the int8 BN 128 A/B (scripts/gpu_tile_ab.py s16int8bn128).
export OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 250 python3 scripts/gpu_tile_ab.py s16int8bn128 2>&1 | tee "$OUT/ab_int8bn128.txt"
timeout 330 bash scripts/gpu_run.sh test-b | tail -5
