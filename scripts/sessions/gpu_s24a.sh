#!/usr/bin/env bash
# Session 24: does the library run under triton 3.9 on the GPU, and are its kernels faster there?
# Needs `.whl` carried (scripts/pack_triton39.sh). Benches alternate 3.6 / 3.9 / 3.6 / 3.9.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
ROOT=$PWD
b() {  # label, then bench args
  local lab=$1; shift
  timeout 200 python3 -m fusedmoe bench --peers none --backend triton --no-progress "$@" 2>&1 \
    | grep -E "triton|FAIL|rror|Error" | sed "s/^/$lab /"
}
points() {
  local lab=$1
  b $lab --model mixtral-8x7b --tokens 1,1024,16384
  b $lab --model qwen3-30b-a3b --quant none,fp8_channel,int8_channel --tokens 1,4096,16384
  b $lab --model deepseek-v3 --tp 8 --quant none,fp8_block --tokens 1,4096,16384
}
( export PYTHONPATH=$ROOT; python3 -c "import triton; print('A', triton.__version__)" ) | tee "$OUT/env.txt"
( source scripts/t39_env.sh || exit 1
  python3 -c "import torch, triton; print('B', triton.__version__, triton.__file__, torch.__version__)"
  echo "ptxas: $TRITON_PTXAS_BLACKWELL_PATH"; $TRITON_PTXAS_BLACKWELL_PATH --version | tail -1 ) 2>&1 | tee -a "$OUT/env.txt"
( source scripts/t39_env.sh || exit 1
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_layer.py -k "not compile" 2>&1 | tail -15 ) \
  | tee "$OUT/t39_tests.txt"
ROUNDS=${ROUNDS:-"t36 t39 t36 t39"}
for r in $ROUNDS; do
  if [ $r = t36 ]; then ( export PYTHONPATH=$ROOT; points t36 ) | tee -a "$OUT/ab.txt"
  else ( source scripts/t39_env.sh || exit 1; echo "ptxas $TRITON_PTXAS_BLACKWELL_PATH"; points t39 ) | tee -a "$OUT/ab.txt"; fi
done
