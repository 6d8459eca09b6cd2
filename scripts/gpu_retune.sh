#!/usr/bin/env bash
# Retune a few (preset, T) points on the device and A/B them against the shipped files in the
# same call: POINTS="preset:tp:T ..." (as scripts/gpu_tune.sh), PER_POINT_S per point, QUANT
# the scheme (default none).
# Prints shipped vs retuned triton graph us and % of roofline; $OUT/configs.tar holds the files.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/out}
bash scripts/gpu_tune.sh > "$OUT/retune.log" 2>&1
for point in $POINTS; do
  IFS=: read -r model tp T pq <<< "$point"       # preset:tp:T[:scheme] (default scheme: QUANT)
  for dir in shipped "$OUT/configs"; do
    if [ "$dir" = shipped ]; then unset FUSEDMOE_CONFIG_DIR; else export FUSEDMOE_CONFIG_DIR=$dir; fi
    timeout 150 python3 -m fusedmoe bench --tokens "$T" --model "$model" --tp "$tp" --peers none --backend triton --quant "${pq:-${QUANT:-none}}" \
        --json "$OUT/ab.json" > /dev/null 2>&1
    python3 -c "import json,sys;r=[x for x in json.load(open('$OUT/ab.json'))['results'] if x['impl']=='triton'][0];print(f\"$model tp$tp T=$T ${pq:-${QUANT:-none}} $(basename $dir): {r['us_graph']:9.1f} us {r['pct_roofline']:5.1f}%\")"
  done
  unset FUSEDMOE_CONFIG_DIR
done
rm -f "$OUT/ab.json"
