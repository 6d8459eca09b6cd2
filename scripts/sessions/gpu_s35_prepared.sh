#!/usr/bin/env bash
# Prepared in session 34 (device budget spent). Two calls:
#   H100 (kind nvidia-h100-x1), ~5 min:  OUT=$OUT bash scripts/sessions/gpu_s35_prepared.sh h100
#     1. the slow window's source (benchmarks/graph_timeline.py --fresh-study --source): weights drawn on the
#        GPU, and cloned weights after an unrelated pageable host-to-device copy / a host sleep of its length /
#        a GPU copy. If only the host-to-device copy brings 60 us back, the window follows host transfers.
#     2. GEMM1's L2 hint lines (FUSEDMOE_TC_L2_PRE) 4 (shipped) against 2, two rounds, T = 2, 3, 4, tc forced.
#   H200 (kind nvidia-h200), ~6 min:     OUT=$OUT bash scripts/sessions/gpu_s35_prepared.sh h200
#     1. the hint tests on the H200, then FUSEDMOE_TC_L2_PRE 0 / 4,0 (the H200 has no default yet: where 4,0
#        wins in both rounds, add "H200" to kernels/decode_tc.py TC_L2_PRE_ON);
#     2. W4 with the bench's warm-up (scripts/sessions/gpu_s32_w4.sh; session 33's H200 A/B ran before it);
#     3. a16 against tc at qwen3 fp8_channel T = 2, 3 (the H200's bound is 2; with the hints tc may win T=2).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
log="$OUT/s35_${1:-h100}.txt"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
if [ "${1:-h100}" = "h100" ]; then
  timeout 200 python3 benchmarks/graph_timeline.py --case deepseek-v3:8:fp8_block --tokens 3 --mode tc \
    --fresh-study --source 2>&1 | grep -v "Warn\|_warn" | tee -a "$log"
  bash scripts/tc_env_ab.sh FUSEDMOE_TC_L2_PRE "4,0 2,0" | tee -a "$log"
else
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode_tc.py -k "l2_pre" 2>&1 | tail -2 \
    | tee -a "$log"
  bash scripts/tc_env_ab.sh FUSEDMOE_TC_L2_PRE "0 4,0" | tee -a "$log"
  OUT="$OUT" bash scripts/sessions/gpu_s32_w4.sh > /dev/null 2>&1; grep -v "^$" "$OUT/w4.txt" | tee -a "$log"
  for r in 1 2; do for m in a16 tc; do
    echo "== $m round $r" | tee -a "$log"
    FUSEDMOE_W8A8_DECODE=$m timeout 40 python3 -m fusedmoe bench --tokens 2,3 --model qwen3-30b-a3b \
      --quant fp8_channel --peers none --backend triton 2>&1 | grep -E "^ +[0-9]+ triton" | tee -a "$log"
  done; done
fi
