#!/usr/bin/env bash
# Session 24: TMA multicast probe (scripts/multicast_probe.py) under triton 3.9 on the device.
# Carry `.whl` (scripts/pack_triton39.sh). Each variant in its own process under a timeout: a
# barrier mistake hangs, and a hang must not cost the call.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
source scripts/t39_env.sh || exit 1
for shape in ${SHAPES:-8,256,28672,4096 8,256,4096,14336}; do
  for v in ${VARIANTS:-tl gl gl_mc}; do
    timeout ${VT:-120} python3 scripts/multicast_probe.py --variants $v --shape $shape 2>&1 \
      | grep -v "FP_FUSION\|warn_once" | tee -a "$OUT/mc_probe.txt"
    [ ${PIPESTATUS[0]} = 124 ] && echo "TIMEOUT $v $shape" | tee -a "$OUT/mc_probe.txt"
  done
done
