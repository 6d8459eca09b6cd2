#!/usr/bin/env bash
# The GPU runs of fusedmoe, from the repository root on a CUDA machine; results under $OUT
# (default ./out, git-ignored). See docs/DEVELOPING.md.
#   tools/gpu_run.sh test            environment, the whole GPU test suite, `fusedmoe check`,
#                                    benchmarks/bench_kernels.py
#   tools/gpu_run.sh test-a | test-b the GPU suite in two halves (tests/test_[a-g]*, the rest), for
#                                    machines with a per-command time limit (cold, the whole suite
#                                    takes ~10-15 minutes: every kernel variant compiles)
#   tools/gpu_run.sh bench [args]    fusedmoe bench (extra args passed through)
#   tools/gpu_run.sh report          the five runs behind docs/BENCHMARKS.md's tables (one a GPU at
#                                    once where the machine has five or more), as $OUT/*.json, .txt
#   tools/gpu_run.sh tune  [args]    fusedmoe tune (writes JSON under $OUT/configs)
#   tools/gpu_run.sh diag            where the time goes (benchmarks/profile_stages.py): host time
#                                    at decode, per-stage times of fp8 prefill
#   tools/gpu_run.sh eager           host time of an eager decode forward with real launches
#                                    (benchmarks/host_overhead.py --real), T=1, three presets
#   tools/gpu_run.sh all             test, then the bf16 benchmark of two presets
set -uo pipefail
# NVLink SHARP / multicast off: NCCL and torch's symmetric memory probe it, and some
# virtualized hosts fail that probe (one-host runs need none of it)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
stage=${1:-all}; shift || true
TOKENS=1,16,64,256,1024,4096,16384
env_info() {
  python3 - <<'PY' | tee "$OUT/env.txt"
import torch, triton, platform
p = torch.cuda.get_device_properties(0)
print(f"torch {torch.__version__} triton {triton.__version__} python {platform.python_version()}")
print(f"{p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs {p.total_memory/2**30:.1f} GiB")
PY
}
run_tests() {
  python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  python3 -m fusedmoe check --device cuda --json > "$OUT/check.json" 2> "$OUT/check.err"
  python3 benchmarks/bench_kernels.py --json "$OUT/kernels.json" 2>&1 | tail -8
  python3 -c "import json;d=json.load(open('$OUT/check.json'));print('check failures:',d['failures'],'of',len(d['results']));[print(r) for r in d['results'] if not r['ok']]" || tail -5 "$OUT/check.err"
}
run_bench() {
  python3 -m fusedmoe bench --json "$OUT/bench.json" --plot "$OUT/bench.png" "$@" 2> "$OUT/bench.err" | tee "$OUT/bench.txt"
  tail -3 "$OUT/bench.err"
}
report_part() {   # name, then fusedmoe bench arguments: $OUT/name.json, .txt
  local name=$1; shift
  python3 -m fusedmoe bench --no-progress --tokens $TOKENS --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.txt" 2> "$OUT/$name.err"
  echo "$name rc=$?"
}
case "$stage" in
  test) env_info; run_tests ;;
  test-a) env_info
        python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_[a-g]*.py 2>&1 | tee "$OUT/gpu_tests_a.log" | tail -20 ;;
  test-b) env_info
        python3 -m pytest -m gpu -q -p no:cacheprovider $(ls tests/test_*.py | grep -v "tests/test_[a-g]") 2>&1 \
          | tee "$OUT/gpu_tests_b.log" | tail -20 ;;
  bench) env_info; run_bench "$@" ;;
  report) env_info
        parts=(
          "bf16_mixtral --model mixtral-8x7b"
          "bf16_qwen3 --model qwen3-30b-a3b"
          "bf16_deepseek_tp8 --model deepseek-v3 --tp 8"
          "w8a8_qwen3 --model qwen3-30b-a3b --quant none,fp8_channel,int8_channel --peers none --backend triton,grouped_mm"
          "w8a8_deepseek_tp8 --model deepseek-v3 --tp 8 --quant none,fp8_block --peers none --backend triton"
        )
        ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
        i=0
        for p in "${parts[@]}"; do
          # shellcheck disable=SC2086   (the part's words are its arguments)
          if [ "$ngpu" -ge ${#parts[@]} ]; then (CUDA_VISIBLE_DEVICES=$i report_part $p) & i=$((i + 1)); else report_part $p; fi
        done
        wait
        tail -n 3 "$OUT"/*.err ;;
  tune) env_info; python3 -m fusedmoe tune --out-dir "$OUT/configs" "$@" 2>&1 | tail -30 ;;
  diag) env_info
        python3 benchmarks/profile_stages.py --host --tokens 1,16 > "$OUT/diag_host.txt" 2>&1
        python3 benchmarks/profile_stages.py --split --quant fp8_block --model deepseek-v3:8 --tokens 16,4096,16384 > "$OUT/diag_fp8b.txt" 2>&1
        python3 benchmarks/profile_stages.py --split --quant fp8_channel --model qwen3-30b-a3b --tokens 16,4096,16384 > "$OUT/diag_fp8c.txt" 2>&1
        grep -h "==\|host:\|split:" "$OUT"/diag_*.txt ;;
  eager) env_info
        for m in qwen3-30b-a3b deepseek-v3:8 mixtral-8x7b; do
          python3 benchmarks/host_overhead.py --real --model $m --iters 3000 2>&1 | tee -a "$OUT/eager.txt"
        done ;;
  all) env_info; run_tests
       run_bench --model mixtral-8x7b,qwen3-30b-a3b --tokens $TOKENS ;;
  *) echo "unknown stage $stage (test, test-a, test-b, bench, report, tune, diag, eager, all)"; exit 2 ;;
esac
