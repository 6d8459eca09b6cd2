#!/usr/bin/env bash
# A/B of USE_TMA (weight tiles through a TMA descriptor) on the shipped bf16 configs, T >= 1024.
# Variants: base (shipped), g2 (GEMM2 TMA), g12 (both GEMMs). Results: $OUT/tma_<variant>_<preset>.json
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for v in g2 g12; do
  mkdir -p "/tmp/cfg_$v"
  python3 - "$v" <<'PY'
import glob, json, os, sys
v = sys.argv[1]
for f in glob.glob("fusedmoe/kernels/configs/*bfloat16.json"):
    d = json.load(open(f))
    for k, e in d.items():
        if k.isdigit() and int(k) >= 1024:
            e["gemm2"]["USE_TMA"] = True
            if v == "g12":
                e["gemm1"]["USE_TMA"] = True
    json.dump(d, open(os.path.join(f"/tmp/cfg_{v}", os.path.basename(f)), "w"))
PY
done
for v in base g2 g12; do
  if [ "$v" = base ]; then unset FUSEDMOE_CONFIG_DIR; else export FUSEDMOE_CONFIG_DIR=/tmp/cfg_$v; fi
  for m in "mixtral-8x7b 1" "qwen3-30b-a3b 1" "deepseek-v3 8"; do
    set -- $m
    timeout 100 python3 -m fusedmoe bench --tokens 1024,4096,16384 --model "$1" --tp "$2" --peers none --backend triton \
      --json "$OUT/tma_${v}_$1.json" 2>/dev/null | grep -E "^ +[0-9]+ triton" | sed "s/^/$v $1 /"
  done
done
