#!/usr/bin/env bash
# Session 27 (H100): the sorted-A tests at session 26's final code (gather_sorted's strides came after
# its last GPU run), then the T=1 decode kernels and layer under triton 3.6 and 3.9 in one call
# (benchmarks/decode_ab.py section A around decode_config's tiles, section B the layer at T=1):
# session 24 measured the T=1 layer 8-15% slower under 3.9.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  -k "sorted" 2>&1 | tee "$OUT/s27_sorted_tests.txt" | tail -4
args="--skip C,D,G,T --around --a16 --quick --schemes ${SCHEMES:-none,fp8_block}"
timeout 200 python3 benchmarks/decode_ab.py $args --out "$OUT/dec36.json" > "$OUT/dec36.txt" 2>&1
grep -v "^ *$" "$OUT/dec36.txt" | grep "A \|B \|BN\|copy" | head -60
(source scripts/t39_env.sh && python3 -c "import triton; print('triton', triton.__version__)" \
  && timeout 220 python3 benchmarks/decode_ab.py $args --out "$OUT/dec39.json" > "$OUT/dec39.txt" 2>&1)
grep -v "^ *$" "$OUT/dec39.txt" | grep "A \|B \|BN\|copy" | head -60
