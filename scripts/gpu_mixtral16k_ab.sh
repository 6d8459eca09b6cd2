#!/usr/bin/env bash
# A/B of GEMM1 tiles for mixtral-8x7b T=16384 (bf16, H100 file): base (session 2 tuned: BM128 BN64 BK128)
# vs A (BN128 BK64 GM8 s4), B (BN128 BK64 GM16 s3, shipped since session 3), C (base + GEMM2 PERSISTENT 1),
# then the base with the peers. Written against the session-2 file; run from the repo root.
set -u
export PYTHONPATH=$PWD
F="fusedmoe/kernels/configs/E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3,dtype=bfloat16.json"
for v in A B C; do
  mkdir -p /tmp/cfg$v
  python3 - "$F" "$v" <<'PY'
import json, os, sys
f, v = sys.argv[1], sys.argv[2]
d = json.load(open(f))
g1 = {"A": dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=4, SPLIT_K=1, USE_TMA=True),
      "B": dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=16, num_warps=8, num_stages=3, SPLIT_K=1, USE_TMA=True),
      "C": dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=16, num_warps=8, num_stages=3, SPLIT_K=1, USE_TMA=True)}[v]
d["16384"]["gemm1"] = g1
if v == "C":
    d["16384"]["gemm2"]["PERSISTENT"] = 1
json.dump(d, open(os.path.join(f"/tmp/cfg{v}", os.path.basename(f)), "w"))
PY
done
for v in base A B C; do
  if [ $v = base ]; then unset FUSEDMOE_CONFIG_DIR; else export FUSEDMOE_CONFIG_DIR=/tmp/cfg$v; fi
  timeout 100 python3 -m fusedmoe bench --tokens 16384 --model mixtral-8x7b --peers none --backend triton 2>/dev/null | grep -E "^ +[0-9]+ triton" | sed "s/^/$v /"
done
unset FUSEDMOE_CONFIG_DIR
timeout 100 python3 -m fusedmoe bench --tokens 16384 --model mixtral-8x7b --backend triton 2>/dev/null | grep -E "^ +[0-9]+ (triton|torch_grouped)" | sed "s/^/peer-run /"
