#!/usr/bin/env bash
# Session 38 (H200): retune the W8A8 points where the H200's 8-bit / bf16 ratio trails the H100's
# (docs/BENCHMARKS.md, thirty-eighth section), one point a GPU at once (scripts/gpu_retune.sh: tune,
# then shipped vs retuned in the same process order). Results: $OUT/p<i>_retune.txt, $OUT/p<i>.tar
#   OUT=$OUT bash scripts/sessions/gpu_s38_retune.sh
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
# S38_POINTS="preset:tp:T:scheme ..." overrides (the second call: the T=256 8-bit points, deepseek bf16 T=1024)
read -r -a points <<< "${S38_POINTS:-deepseek-v3:8:1024:fp8_block deepseek-v3:8:4096:fp8_block qwen3-30b-a3b:1:1024:int8_channel qwen3-30b-a3b:1:1024:fp8_channel}"
ngpu=$(nvidia-smi -L | wc -l)
for i in "${!points[@]}"; do
  [ "$i" -ge "$ngpu" ] && break
  ( export CUDA_VISIBLE_DEVICES=$i POINTS=${points[$i]} PER_POINT_S=${PER_POINT_S:-330} DEADLINE_S=$(( ${PER_POINT_S:-330} + 10 )) \
      OUT="$OUT/p$i"; mkdir -p "$OUT"
    bash scripts/gpu_retune.sh > "$OUT/ab.txt" 2>&1 ) &
done
wait
for i in "${!points[@]}"; do
  [ -d "$OUT/p$i" ] || continue
  { echo "== ${points[$i]}"; cat "$OUT/p$i/retune.log" "$OUT/p$i/ab.txt"; } > "$OUT/p${i}_retune.txt"
  cat "$OUT/p${i}_retune.txt"
  mv "$OUT/p$i/configs.tar" "$OUT/p$i.tar" 2>/dev/null; rm -rf "$OUT/p$i"
done
