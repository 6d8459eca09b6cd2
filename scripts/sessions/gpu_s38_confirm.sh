#!/usr/bin/env bash
# Session 38 (H200): the retuned T=1024 entries against the ones they replace, alternating in fresh
# processes (new, old, new, old), one point a GPU at once. Carry .s38old (the files before the retune).
#   OUT=$OUT bash scripts/sessions/gpu_s38_confirm.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
# S38_CONFIRM="T|model args;..." overrides (the second call: the T=256 8-bit entries, deepseek bf16 T=1024)
IFS=';' read -r -a points <<< "${S38_CONFIRM:-1024|deepseek-v3 --tp 8 --quant fp8_block;1024|qwen3-30b-a3b --quant int8_channel;1024|qwen3-30b-a3b --quant fp8_channel}"
ab() {  # i, T, point args
  local i=$1 T=$2; shift 2
  for round in 1 2; do
    for which in new old; do
      if [ "$which" = old ]; then export FUSEDMOE_CONFIG_DIR=$PWD/.s38old; else unset FUSEDMOE_CONFIG_DIR; fi
      timeout 120 python3 -m fusedmoe bench --no-progress --tokens $T --peers none --backend triton --model "$@" \
        --json "$OUT/c$i.json" > /dev/null 2>&1
      python3 -c "import json;r=[x for x in json.load(open('$OUT/c$i.json'))['results'] if x['impl']=='triton'][0];print('$* T=$T round $round $which', f\"{r['us_graph']:.1f} us {r['pct_roofline']:.1f}% rel_err {r['rel_err']:.2e}\")"
    done
  done > "$OUT/confirm_$i.txt"
  rm -f "$OUT/c$i.json"
}
for i in "${!points[@]}"; do (export CUDA_VISIBLE_DEVICES=$i; ab "$i" ${points[$i]%%|*} ${points[$i]#*|}) & done
wait
cat "$OUT"/confirm_*.txt
