#!/usr/bin/env bash
# Session 37: the split-I decode (kernels/decode_split.py) on the GPU: its tests, then the layer A/B
# against the two-kernel a16 decode and the default, with tile variants (benchmarks/split_ab.py).
#   OUT=$OUT bash scripts/gpu_s37_split.sh [cases] [configs]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
cases=${1:-"deepseek-v3:8:fp8_block:1,2;qwen3-30b-a3b:1:fp8_channel:1,2;qwen3-30b-a3b:1:int8_channel:1"}
configs=${2:-"8,1024,1024,4;8,1024,1024,8;16,512,512,8;32,256,256,8;4,2048,1024,4"}
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode_split.py 2>&1 | tee "$OUT/split_tests.log" | tail -15
timeout 400 python3 benchmarks/split_ab.py --cases "$cases" --configs "$configs" --rounds 2 --json "$OUT/split_ab.json" \
  2>&1 | tee "$OUT/split_ab.txt"
