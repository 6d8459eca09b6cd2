#!/usr/bin/env bash
# W8A8 per-token schemes: h requantized inside GEMM2 (FUSEDMOE_W8A8_REQUANT=fused) vs the
# quantization kernel between the GEMMs (=kernel), one device call: the GPU tests of the
# fused path, then alternating bench rounds (triton graph us per T), then a stage split.
#   TOKENS=256,1024,4096,16384 ROUNDS=2 bash scripts/gpu_requant_ab.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
T=${TOKENS:-256,1024,4096,16384}
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gemm.py tests/test_backends.py \
    -k "requant or quantized_gemms or cuda_bf16" 2>&1 | tee "$OUT/requant_tests.log" | tail -6
python3 -m fusedmoe bench --tokens "$T" --model qwen3-30b-a3b --quant none --peers none --backend triton \
    --json "$OUT/ab_bf16.json" > /dev/null 2>&1
for r in $(seq 1 "${ROUNDS:-2}"); do
  for mode in kernel fused; do
    FUSEDMOE_W8A8_REQUANT=$mode timeout 200 python3 -m fusedmoe bench --tokens "$T" --model qwen3-30b-a3b \
        --quant fp8_channel,int8_channel --peers none --backend triton --json "$OUT/ab_${mode}_$r.json" > /dev/null 2>&1
  done
done
python3 - "$OUT" <<'PY'
import json, sys, glob, collections
out = sys.argv[1]
best = collections.defaultdict(lambda: float("inf"))
def rows(f):
    for r in json.load(open(f))["results"]:
        if r["impl"] == "triton":
            yield r
for f in glob.glob(f"{out}/ab_*.json"):
    mode = "bf16" if f.endswith("ab_bf16.json") else f.split("ab_")[1].rsplit("_", 1)[0]
    for r in rows(f):
        key = (r.get("quant", r.get("scheme", "?")), r["T"], mode)
        best[key] = min(best[key], r["us_graph"])
bf = {T: v for (q, T, m), v in best.items() if m == "bf16"}
print("scheme T kernel_us fused_us fused_speedup ratio_vs_bf16(kernel) ratio_vs_bf16(fused)")
for (q, T, m) in sorted(k for k in best if k[2] == "kernel"):
    k_, f_ = best[(q, T, "kernel")], best[(q, T, "fused")]
    print(f"{q} {T} {k_:.1f} {f_:.1f} {k_ / f_:.3f} {bf.get(T, float('nan')) / k_:.3f} {bf.get(T, float('nan')) / f_:.3f}")
PY
for mode in kernel fused; do
  FUSEDMOE_W8A8_REQUANT=$mode timeout 90 python3 benchmarks/profile_stages.py --split --quant fp8_channel \
      --model qwen3-30b-a3b --tokens 4096,16384 > "$OUT/split_$mode.txt" 2>&1
  echo "== $mode"; tail -30 "$OUT/split_$mode.txt"
done
