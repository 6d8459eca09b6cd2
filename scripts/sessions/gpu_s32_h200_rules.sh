#!/usr/bin/env bash
# Prepared in session 31, not run (device time): the tensor-core decode's session-31 tile rules on the H200
# (kind nvidia-h200). The backend keeps session 30's rules there until this says otherwise
# (kernels/decode_tc.py TC_RULES_OLD_ON). ~3 minutes.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/rules.txt"
timeout 300 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" \
  --cases qwen3-30b-a3b:1:int8_channel,qwen3-30b-a3b:1:fp8_channel --rule-ab 2,3,4 \
  --rule-variants tcnew,tcold,tcg1new,tcg2new --layer-rounds 3 --json "$OUT/tc_rules_h200.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/rules.txt"
# deepseek-v3 tp8 on the H200: the session-31 rules change none of its configs; the candidates do
timeout 200 python3 benchmarks/decode_t2.py --tokens "" --layer-tokens "" --cases deepseek-v3:8:fp8_block \
  --rule-ab 2,3,4 --rule-variants tcnew,tcds,tcds3,tcdsx --layer-rounds 3 --json "$OUT/tc_rules_ds_h200.json" 2>&1 \
  | grep -v "^bench:" | tee -a "$OUT/rules.txt"
