#!/usr/bin/env bash
# Session 31 (H100): the tc decode's ticket stress at the shipped code (scripts/tc_ticket_stress.py), then the
# reverted HQ form's failing buffer-reuse test in detail (tmp_hq/: an untracked copy of commit beabcdf, removed after).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
timeout 200 python3 scripts/tc_ticket_stress.py --n 200 2>&1 | tee "$OUT/stress.txt"
if [ -d tmp_hq ]; then
  (cd tmp_hq && PYTHONPATH="$PWD" timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/test_gpu_layer.py \
     -k "reuse_their and tc" 2>&1 | grep -v "^\s*$" | tail -40) | tee "$OUT/hq_fail.txt"
fi
