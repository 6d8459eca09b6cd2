#!/usr/bin/env bash
# Session 17 (H100): the tuner with this session's search (GEMM2's BM free of GEMM1's, TMA on the best
# two tile shapes) at qwen3 W8A8 T=4096, then its picks against the shipped entries in the same call.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/configs"
for q in fp8_channel int8_channel; do
  timeout 190 python3 -m fusedmoe tune --model qwen3-30b-a3b --quant $q --tokens 4096 --out-dir "$OUT/configs" \
    --no-progress 2>&1 | tail -3
done 2>&1 | tee "$OUT/s17i_tune.txt"
b() {
  timeout 60 python3 -m fusedmoe bench --peers none --backend triton --no-progress --model qwen3-30b-a3b \
    --quant fp8_channel,int8_channel --tokens 4096 2>&1 | grep -E "triton|FAIL|rror" | sed "s/^/$1 /"
}
{ b shipped; FUSEDMOE_CONFIG_DIR="$OUT/configs" b tuned; b shipped; FUSEDMOE_CONFIG_DIR="$OUT/configs" b tuned; } \
  2>&1 | tee "$OUT/s17i_ab.txt"
python3 - "$OUT/configs" <<'PY' | tee -a "$OUT/s17i_ab.txt"
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    print(f.split("/")[-1][:70], json.dumps(d.get("4096")))
PY
