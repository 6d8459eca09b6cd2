#!/usr/bin/env bash
# Session 31 (H100: kind nvidia-h100-x1): QA, x and h quantized inside the tensor-core decode GEMMs: tried and
# reverted. Run at commits 6d5550c (in-loop form) and e54feb6 (prologue form), where the tc_noqa mode existed:
# the layer A/B (a16, tc with QA, tc with the quantization launches), then the GPU tests of QA.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/tests.txt"
timeout 260 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens ${TOKS:-1,2,3,4,8} --layer-modes ${MODES:-a16,tc,tc_noqa} \
  --layer-rounds 2 --json "$OUT/qa_layer.json" 2>&1 | grep -v "^bench:" | tee "$OUT/qa_layer.txt"
timeout 150 $P tests/test_kernels_decode_tc.py -k "qa or real_sizes or bad_operands" 2>&1 | tail -3 | tee -a "$OUT/tests.txt"
timeout 150 $P tests/test_backends.py tests/test_gpu_layer.py -k "tc_decode_qa or pdl_chain_equals or reuse_their" 2>&1 \
  | tail -3 | tee -a "$OUT/tests.txt"
