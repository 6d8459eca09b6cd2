#!/usr/bin/env bash
# Session 38 (H200; the H100 was not lent): the issue-4 / issue-5 report at today's code, the four
# parts on four GPUs at once where the machine has them (one after another otherwise):
#   0: mixtral-8x7b bf16 against every peer, T = 1 ... 16384
#   1: qwen3-30b-a3b bf16 against every peer
#   2: deepseek-v3 tp8 bf16 against every peer, then none,fp8_block (issue 5, the same run)
#   3: qwen3-30b-a3b none,fp8_channel,int8_channel (triton, grouped_mm)
# Results: $OUT/s38.tar (the device tool returns at most 8 files).
#   OUT=$OUT bash scripts/sessions/gpu_s38_h200.sh [PARTS]   (default 0123)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/s38"
T=1,16,64,256,1024,4096,16384
parts=${1:-0123}
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi -L > "$OUT/s38/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/s38/env.txt"
bench() {  # name timeout args...
  local name=$1 lim=$2; shift 2
  timeout "$lim" python3 -m fusedmoe bench --no-progress --tokens $T --json "$OUT/s38/$name.json" "$@" \
    > "$OUT/s38/$name.txt" 2> "$OUT/s38/$name.err"
  echo "$name rc=$?" >> "$OUT/s38/rc.txt"
}
part() {
  case $1 in
    0) bench b16_mixtral 560 --model mixtral-8x7b --plot "$OUT/s38/b16_mixtral.png" ;;
    1) bench b16_qwen3 560 --model qwen3-30b-a3b --plot "$OUT/s38/b16_qwen3.png" ;;
    2) bench b16_deepseek 320 --model deepseek-v3 --tp 8 --plot "$OUT/s38/b16_deepseek.png"
       bench q_deepseek 230 --model deepseek-v3 --tp 8 --quant none,fp8_block --peers none --backend triton ;;
    3) bench q_qwen3 560 --model qwen3-30b-a3b --quant none,fp8_channel,int8_channel --peers none \
         --backend triton,grouped_mm ;;
  esac
}
i=0
for p in $(echo "$parts" | grep -o .); do
  if [ "$ngpu" -ge 4 ]; then (export CUDA_VISIBLE_DEVICES=$i; part "$p") & i=$((i + 1)); else part "$p"; fi
done
wait
cat "$OUT/s38/rc.txt"
for f in "$OUT"/s38/*.txt; do echo "== $f"; grep -v "^ *[0-9]* \(torch_ref\|hf_eager\|torch_loop\)" "$f" | head -80; done
(cd "$OUT" && tar cf s38.tar s38 && rm -rf s38)
