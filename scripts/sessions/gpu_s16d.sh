#!/usr/bin/env bash
# Session 16, call 9 (H100): int8 rounding A/B, new (two fp32 adds) vs old (floor + tie fix-up),
# alternating; needs scratch/quantize_old.py = `git show 844596b~1:fusedmoe/kernels/quantize.py` (carried)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
cp fusedmoe/kernels/quantize.py scratch/quantize_new.py
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_quantize.py 2>&1 | tail -2 | tee "$OUT/q_tests.txt"
b() { timeout 120 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model qwen3-30b-a3b \
        --quant int8_channel,fp8_channel --tokens $1 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/$2 /"; }
for v in new old new old; do
  cp scratch/quantize_$v.py fusedmoe/kernels/quantize.py
  timeout 100 python3 benchmarks/quant_rows_ab.py --out "$OUT/q_$v.json" 2>&1 | grep -i "int8\|fp8 token" | grep -i "rule" | sed "s/^/$v /"
  b 4096 $v
done 2>&1 | tee "$OUT/q_ab.txt"
for v in new old; do cp scratch/quantize_$v.py fusedmoe/kernels/quantize.py; b 16384 $v; done 2>&1 | tee -a "$OUT/q_ab.txt"
cp scratch/quantize_new.py fusedmoe/kernels/quantize.py
