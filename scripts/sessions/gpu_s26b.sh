#!/usr/bin/env bash
# Session 26 (H100): the sorted-A tests again (after the fp16 atomic tolerance fix), then Mixtral against its
# peers with the SORTED_H / SORTED_X entries shipped
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
  -k "sorted or half_tail or one_dot or block_m_above" 2>&1 | tee "$OUT/s26b_tests.txt" | tail -3
timeout 220 python3 -m fusedmoe bench --no-progress --model mixtral-8x7b --tokens 1024,4096,16384 \
  --json "$OUT/s26b_mixtral.json" 2>&1 | tee "$OUT/s26b_mixtral.txt" | grep -E "ceilings|triton|torch_grouped_mm|geomean"
