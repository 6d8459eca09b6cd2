#!/usr/bin/env bash
# session 25 (H100): fp8_channel's h quantized in GEMM1's epilogue in 1 x 128 groups (FUSEDMOE_H_QUANT=epilogue)
# against the per-token quantization kernel (the default), qwen3 T=4096 / 16384, shipped files. Session 9 found
# the epilogue 3-19% slower at T >= 4096; the kernels have changed since (RESCALE's scale prefetch, one dot).
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
one() {  # $1 T, $2 FUSEDMOE_H_QUANT value ('' = default)
  local f; f=$(mktemp --suffix=.json)
  FUSEDMOE_H_QUANT=$2 timeout 150 python3 -m fusedmoe bench --tokens "$1" --model qwen3-30b-a3b --peers none \
    --backend triton --quant fp8_channel --json "$f" > /dev/null 2>&1
  python3 -c "import json,sys;r=[x for x in json.load(open('$f'))['results'] if x['impl']=='triton'][0];print(f\"qwen3 fp8_channel T=$1 h_quant=${2:-default}: {r['us_graph']:9.1f} us {r['pct_roofline']:5.1f}%\")" \
    || echo "qwen3 fp8_channel T=$1 h_quant=${2:-default}: failed"
}
for T in 4096 16384; do one $T ""; one $T epilogue; one $T ""; one $T epilogue; done
