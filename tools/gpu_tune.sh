#!/usr/bin/env bash
# Tune Triton launch configs on a GPU for a list of (preset, T) points, one `fusedmoe tune` process a
# point, so that every point that finishes is kept (the tuner merges new T entries into the file it
# writes), from the repository root. See docs/DEVELOPING.md.
#   POINTS="preset:tp:T[:scheme] ..." tools/gpu_tune.sh        (default POINTS: the list below)
#   AB=1 POINTS="..." tools/gpu_tune.sh   then time each point with the shipped files and the new ones
# QUANT: the scheme of points that name none (default none = 16-bit); PER_POINT_S: time limit a point
# (default 80; prefill points need it); BUDGET_MS: timing budget a candidate (default 15); DEADLINE_S:
# start no point after this many seconds (the rest are listed "not started", for a later run).
# Results: $OUT/configs/*.json (seeded with the shipped files), also packed as $OUT/configs.tar.
# Ship an entry (copy it into fusedmoe/kernels/configs/) only after fresh processes confirm the gain.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/configs"
quant=${QUANT:-none}; per=${PER_POINT_S:-80}
end=$(( $(date +%s) + ${DEADLINE_S:-100000} ))
POINTS=${POINTS:-mixtral-8x7b:1:1024 qwen3-30b-a3b:1:4096 deepseek-v3:8:1024 mixtral-8x7b:1:256 qwen3-30b-a3b:1:16384 deepseek-v3:8:4096 mixtral-8x7b:1:4096 qwen3-30b-a3b:1:1 deepseek-v3:8:1 mixtral-8x7b:1:16384 deepseek-v3:8:16384 qwen3-30b-a3b:1:1024 qwen3-30b-a3b:1:256 deepseek-v3:8:64 mixtral-8x7b:1:1}
cp -n fusedmoe/kernels/configs/*.json "$OUT/configs/" 2>/dev/null || true
for point in $POINTS; do
  IFS=: read -r model tp T pq <<< "$point"
  left=$(( end - $(date +%s) ))
  if [ "$left" -lt 25 ]; then echo "== not started: $point"; continue; fi
  echo "== $model tp$tp T=$T ${pq:-$quant} ($(date +%T))"
  timeout "$(( left < per ? left : per ))" python3 -m fusedmoe tune --model "$model" --tp "$tp" --tokens "$T" --quant "${pq:-$quant}" \
      --budget-ms "${BUDGET_MS:-15}" --no-progress --out-dir "$OUT/configs" 2>&1 | grep -E "^ *T= *$T:|rror" | tail -3
  tar -C "$OUT" -cf "$OUT/configs.tar" configs      # one file that holds them all ('=' and ',' in the names)
done
[ -n "${AB:-}" ] || exit 0
for point in $POINTS; do
  IFS=: read -r model tp T pq <<< "$point"
  for dir in shipped "$OUT/configs"; do
    if [ "$dir" = shipped ]; then unset FUSEDMOE_CONFIG_DIR; else export FUSEDMOE_CONFIG_DIR=$dir; fi
    timeout 150 python3 -m fusedmoe bench --tokens "$T" --model "$model" --tp "$tp" --peers none --backend triton \
        --quant "${pq:-$quant}" --no-progress --json "$OUT/ab.json" > /dev/null 2>&1
    python3 -c "import json;r=[x for x in json.load(open('$OUT/ab.json'))['results'] if x['impl']=='triton'][0];print(f\"$model tp$tp T=$T ${pq:-$quant} $(basename "$dir"): {r['us_graph']:9.1f} us {r['pct_roofline']:5.1f}%\")"
  done
  unset FUSEDMOE_CONFIG_DIR
done
rm -f "$OUT/ab.json"
