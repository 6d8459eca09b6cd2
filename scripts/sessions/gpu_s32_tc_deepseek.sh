#!/usr/bin/env bash
# Prepared in session 31, not run (device time): the deepseek-v3 tp8 candidates of the tensor-core decode's
# GEMMs-alone sweep (docs/bench_h100_s31_tc_sweep_t234.txt: GEMM1 6 stages, GEMM2 2 stages at T = 2..4, GEMM1 2 splits at T=3) in the
# layer, against the shipped rules (kind nvidia-h100-x1; ~2 minutes). Where "tcds*" wins by more than the
# spread, set kernels/decode_tc.py TC_GEMM1_STAGES_LONG_K / TC_GEMM2_STAGES_SHORT_K / TC_GEMM1_SPLIT_WAVES_LONG_K.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/rules.txt"
timeout 300 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" --cases deepseek-v3:8:fp8_block \
  --rule-ab 2,3,4 --rule-variants tcnew,tcds,tcds1,tcds2,tcds3,tcdsx --layer-rounds 3 --json "$OUT/tc_rules_ds.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/rules.txt"
