#!/usr/bin/env bash
# Session 31 (H100: kind nvidia-h100-x1): HQ, GEMM1 of the tensor-core decode chain quantizes h for GEMM2 (no
# quantization launch between the GEMMs). The layer A/B first (a16; tc = the new default; tc_nohq = tc with the
# launch), then the GPU tests of HQ and of the layer's W8A8 decode / PDL chain.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/tests.txt"
timeout 240 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens ${TOKS:-1,2,3,4} --layer-modes ${MODES:-a16,tc,tc_nohq} \
  --layer-rounds 2 --json "$OUT/hq_layer.json" 2>&1 | grep -v "^bench:" | tee "$OUT/hq_layer.txt"
timeout 150 $P tests/test_kernels_decode_tc.py -k "hq or real_sizes" 2>&1 | tail -3 | tee -a "$OUT/tests.txt"
timeout 170 $P tests/test_backends.py tests/test_gpu_layer.py -k "tc_decode_hq or pdl_chain_equals or reuse_their" 2>&1 \
  | tail -3 | tee -a "$OUT/tests.txt"
