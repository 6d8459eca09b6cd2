#!/usr/bin/env bash
# Session 24: the warp-specialized persistent Gluon GEMM (multicast_probe.py gl_ws) against triton's
# tl.dot at the dense equivalents of the open T=16384 points (GEMM1 / GEMM2 of each preset).
# Triton 3.9 (carry `.whl`). Each variant in its own process under a timeout.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
source scripts/t39_env.sh || exit 1
# dtype:E,M_E,N,K  (M_E = T * k / E)
CASES=${CASES:-"bf16:8,4096,28672,4096 bf16:8,4096,4096,14336 bf16:128,1024,1536,2048 bf16:128,1024,2048,768
fp8:128,1024,1536,2048 fp8:128,1024,2048,768 bf16:256,512,512,7168 bf16:256,512,7168,256 fp8:256,512,512,7168"}
for c in $CASES; do
  for v in ${VARIANTS:-tl gl_ws}; do
    timeout ${VT:-100} python3 scripts/multicast_probe.py --variants $v --dtype ${c%%:*} --shape ${c#*:} 2>&1 \
      | grep -v "FP_FUSION\|warn_once\|nanobind\|^ - \|^See https" | tee -a "$OUT/ws_probe.txt"
    [ ${PIPESTATUS[0]} = 124 ] && echo "TIMEOUT $v $c" | tee -a "$OUT/ws_probe.txt"
  done
done
