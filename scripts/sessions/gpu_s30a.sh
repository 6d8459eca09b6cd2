#!/usr/bin/env bash
# Session 30 (H100: kind nvidia-h100-x1): the expert-shared tensor-core decode (SHARE). GPU tests of the tc
# decode and the layer's W8A8 decode, then the layer A/B (one program a pair vs expert-shared vs the grouped
# path) and `fusedmoe bench` at T <= 16.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/tests.txt"
timeout 150 $P tests/test_kernels_decode_tc.py 2>&1 | tee -a "$OUT/tests.txt" | tail -2
timeout 150 $P tests/test_gpu_layer.py tests/test_backends.py -k "decode or w8a8 or pdl or tc" 2>&1 | tee -a "$OUT/tests.txt" | tail -2
timeout 200 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens ${TOK:-3,4,8,16} --layer-modes tc_pair,tc_share,grouped \
  --layer-rounds 2 --json "$OUT/share_ab.json" 2>&1 | grep -v "^bench:" | tee "$OUT/share_ab.txt"
