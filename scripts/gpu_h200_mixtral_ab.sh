#!/usr/bin/env bash
# H200, Mixtral bf16 T=256/1024/4096: the H200-tuned entries vs the H100 ones (same call,
# alternating rounds, torch_grouped_mm as the peer). Prints triton graph us per T and variant.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT" /tmp/cfg_h100
f=fusedmoe/kernels/configs/E=8,N=14336,device_name=NVIDIA_H200,dtype=bfloat16.json
python3 - "$f" <<'PY'
import json, sys
h200 = json.load(open(sys.argv[1]))
h100 = json.load(open(sys.argv[1].replace("NVIDIA_H200", "NVIDIA_H100_80GB_HBM3")))
for T in ("256", "1024", "4096"):
    h200[T] = h100[T]
json.dump(h200, open("/tmp/cfg_h100/" + sys.argv[1].split("/")[-1], "w"))
PY
for r in 1 2; do
  for v in h200 h100; do
    if [ $v = h100 ]; then export FUSEDMOE_CONFIG_DIR=/tmp/cfg_h100; else unset FUSEDMOE_CONFIG_DIR; fi
    timeout 120 python3 -m fusedmoe bench --tokens 256,1024,4096 --model mixtral-8x7b --peers torch_grouped_mm \
        --backend triton --json "$OUT/mx_${v}_$r.json" > /dev/null 2>&1
  done
done
unset FUSEDMOE_CONFIG_DIR
python3 - "$OUT" <<'PY'
import json, sys, glob
best = {}
for f in glob.glob(sys.argv[1] + "/mx_*.json"):
    v = f.split("mx_")[1].split("_")[0]
    for r in json.load(open(f))["results"]:
        if r["status"] == "ok":
            k = (r["T"], r["impl"] if r["impl"] != "triton" else "triton/" + v)
            best[k] = min(best.get(k, 1e30), r["us_graph"])
for k in sorted(best):
    print(k, round(best[k], 1))
PY
