#!/usr/bin/env bash
# Tune launch configs on the device: one `fusedmoe tune` per (preset, T) so that every point
# that finishes is kept (files merge), inside one device call. Results: $OUT/configs/*.json
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/configs"
quant=${QUANT:-none}; per=${PER_POINT_S:-80}   # BUDGET_MS: timing budget per candidate (default 15)
# DEADLINE_S: stop starting points after this many seconds (the device tool's 600 s per call);
# the points not started are listed as "not started" so the next call can take them
end=$(( $(date +%s) + ${DEADLINE_S:-100000} ))
# start from the shipped files: the tuner merges new T entries into an existing file
cp -n fusedmoe/kernels/configs/*.json "$OUT/configs/" 2>/dev/null || true
# preset:tp:T, most valuable first
for point in ${POINTS:-mixtral-8x7b:1:1024 qwen3-30b-a3b:1:4096 deepseek-v3:8:1024 mixtral-8x7b:1:256 qwen3-30b-a3b:1:16384 deepseek-v3:8:4096 mixtral-8x7b:1:4096 qwen3-30b-a3b:1:1 deepseek-v3:8:1 mixtral-8x7b:1:16384 deepseek-v3:8:16384 qwen3-30b-a3b:1:1024 qwen3-30b-a3b:1:256 deepseek-v3:8:64 mixtral-8x7b:1:1}; do
  IFS=: read -r model tp T pq <<< "$point"       # preset:tp:T[:scheme] (default scheme: QUANT)
  left=$(( end - $(date +%s) ))
  if [ "$left" -lt 25 ]; then echo "== not started: $point"; continue; fi
  echo "== $model tp$tp T=$T ${pq:-$quant} ($(date +%T))"
  timeout "$(( left < per ? left : per ))" python3 -m fusedmoe tune --model "$model" --tp "$tp" --tokens "$T" --quant "${pq:-$quant}" \
      --budget-ms "${BUDGET_MS:-15}" --no-progress --out-dir "$OUT/configs" 2>&1 | grep -E "^ *T= *$T:|rror" | tail -3
  # file names hold '=' and ',' which the device tool does not bring back: ship a tarball
  tar -C "$OUT" -cf "$OUT/configs.tar" configs
done
ls -la "$OUT/configs"
