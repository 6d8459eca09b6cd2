#!/usr/bin/env bash
# session 25 (H100): why qwen3 bf16 T=1024 with the 128 x 128 one-dot GEMM1 took 1134 us (shipped 481):
# per-kernel times of the shipped entry and the variant (benchmarks/profile_stages.py)
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
d=$(mktemp -d)
python3 - "$d" <<'PY'
import glob, json, os, sys, torch
dev = torch.cuda.get_device_name().replace(" ", "_")
src = glob.glob(f"fusedmoe/kernels/configs/E=128,N=768,device_name={dev},dtype=bfloat16.json")[0]
cfg = json.load(open(src))
cfg["1024"]["gemm1"].update(GU_ONE_DOT=True, USE_TMA=True, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, num_stages=4)
json.dump(cfg, open(os.path.join(sys.argv[1], os.path.basename(src)), "w"))
PY
echo "== shipped"; timeout 120 python3 benchmarks/profile_stages.py --model qwen3-30b-a3b --tokens 1024 2>&1 | grep -v Warn | tail -14
echo "== variant 128x128 s4 one"; FUSEDMOE_CONFIG_DIR=$d timeout 120 python3 benchmarks/profile_stages.py --model qwen3-30b-a3b --tokens 1024 2>&1 | grep -v Warn | tail -14
