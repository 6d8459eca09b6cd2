#!/usr/bin/env bash
# Session 38: the whole GPU suite on an H200 under triton 3.6 (the image's) and 3.9 (carried: `.whl`),
# its two halves (scripts/gpu_run.sh test-a / test-b) on four GPUs at once where the machine has four
# (one after another otherwise). Logs: $OUT/suite_{a,b}{36,39}.log
#   OUT=$OUT bash scripts/sessions/gpu_s38_suite.sh [PARTS]    (default "a36 b36 a39 b39"; carry .whl for 39)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
parts=${1:-"a36 b36 a39 b39"}
ngpu=$(nvidia-smi -L | wc -l)
if [[ "$parts" == *39* ]]; then (source scripts/t39_env.sh) || { echo "no triton 3.9 (carry .whl)"; exit 1; }; fi
suite() {  # a|b  36|39
  export PYTHONPATH="$PWD"
  if [ "$2" = 39 ]; then source scripts/t39_env.sh; fi
  export TRITON_CACHE_DIR=/tmp/triton_cache_$1$2
  local files
  if [ "$1" = a ]; then files=$(ls tests/test_[a-g]*.py); else files=$(ls tests/test_*.py | grep -v "tests/test_[a-g]"); fi
  python3 -c "import triton; print('triton', triton.__version__)" > "$OUT/suite_$1$2.log"
  timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider $files >> "$OUT/suite_$1$2.log" 2>&1
  echo "suite $1$2 rc=$?" >> "$OUT/suite_$1$2.log"
}
i=0
for p in $parts; do
  if [ "$ngpu" -ge 4 ]; then (export CUDA_VISIBLE_DEVICES=$i; suite "${p:0:1}" "${p:1}") & i=$((i + 1))
  else suite "${p:0:1}" "${p:1}"; fi
done
wait
for p in $parts; do echo "== $p"; head -1 "$OUT/suite_$p.log"; tail -4 "$OUT/suite_$p.log"; done
