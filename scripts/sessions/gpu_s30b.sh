#!/usr/bin/env bash
# Session 30 (H100: kind nvidia-h100-x1): SHARE with its table kernel. GPU tests of the tc decode and the layer's
# W8A8 decode, the GEMMs alone (share_ab.py), the layer A/B (auto = the new rule, tc one program a pair, tc
# expert-shared, the grouped path), then `fusedmoe bench` at T <= 16.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/tests.txt"
timeout 200 $P tests/test_kernels_decode_tc.py 2>&1 | tail -2 | tee -a "$OUT/tests.txt"
timeout 240 $P tests/test_gpu_layer.py tests/test_backends.py -k "decode or w8a8 or pdl or tc" 2>&1 | tail -2 | tee -a "$OUT/tests.txt"
timeout 120 python3 benchmarks/share_ab.py --tokens 4,8,16 --json "$OUT/share_gemms.json" 2>&1 | grep -v "^bench:" | tee "$OUT/share_gemms.txt"
timeout 200 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens 4,8,16 --layer-modes auto,tc_pair,tc_share,grouped \
  --layer-rounds 2 --json "$OUT/share_layer.json" 2>&1 | grep -v "^bench:" | tee "$OUT/share_layer.txt"
