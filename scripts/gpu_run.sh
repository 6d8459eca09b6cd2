#!/usr/bin/env bash
# One device-tool call = one of these stages, results under $OUT (see docs/BENCHMARKS.md).
#   scripts/gpu_run.sh test            environment, GPU test suite, conformance check
#   scripts/gpu_run.sh test-a | test-b the GPU suite in two halves (tests/test_[a-g]*, the rest):
#                                      cold, the whole suite (330 tests) no longer fits one call
#   scripts/gpu_run.sh bench [args]    fusedmoe bench (extra args passed through)
#   scripts/gpu_run.sh tune  [args]    fusedmoe tune  (writes JSON under $OUT/configs)
#   scripts/gpu_run.sh diag            where the time goes (benchmarks/profile_stages.py): host time
#                                      at decode, per-stage times of bf16 / fp8 prefill
#   scripts/gpu_run.sh decode          decode kernels: their GPU tests, then benchmarks/decode_ab.py
#                                      (tile sweep, PDL, decode vs grouped path per T)
#   scripts/gpu_run.sh eager           host time of an eager decode forward, real launches
#                                      (benchmarks/host_overhead.py --real), T=1, the three presets
#   scripts/gpu_run.sh report [--w8a8] the four runs of docs/BENCHMARKS.md (bf16 with peers, W8A8;
#                                      --w8a8: only the W8A8 two), in $OUT/report.tar
#   scripts/gpu_run.sh all             test + the 16-bit benchmark of docs/BENCHMARKS.md
# Any stage under triton 3.9: T39=1 scripts/gpu_run.sh STAGE (carry `.whl`: scripts/pack_triton39.sh)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# T39=1: run under triton 3.9 instead of the image's 3.6 (carry `.whl`; scripts/t39_env.sh)
if [ -n "${T39:-}" ]; then unset T39; source scripts/t39_env.sh || exit 1; fi
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
stage=${1:-all}; shift || true
env_info() {
  python3 - <<'PY' | tee "$OUT/env.txt"
import torch, triton, platform
p = torch.cuda.get_device_properties(0)
print(f"torch {torch.__version__} triton {triton.__version__} python {platform.python_version()}")
print(f"{p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs {p.total_memory/2**30:.1f} GiB")
PY
}
run_tests() {
  timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  timeout 120 python3 -m fusedmoe check --device cuda --json > "$OUT/check.json" 2> "$OUT/check.err"
  timeout 120 python3 benchmarks/bench_kernels.py --json "$OUT/kernels.json" 2>&1 | tail -8
  python3 -c "import json;d=json.load(open('$OUT/check.json'));print('check failures:',d['failures'],'of',len(d['results']));[print(r) for r in d['results'] if not r['ok']]" || tail -5 "$OUT/check.err"
}
run_bench() {
  python3 -m fusedmoe bench --json "$OUT/bench.json" --plot "$OUT/bench.png" "$@" 2> "$OUT/bench.err" | tee "$OUT/bench.txt"
  tail -3 "$OUT/bench.err"
}
case "$stage" in
  test) env_info; run_tests ;;
  test-a) env_info
        timeout 585 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_[a-g]*.py 2>&1 | tee "$OUT/gpu_tests_a.log" | tail -20 ;;
  test-b) env_info
        timeout 585 python3 -m pytest -m gpu -q -p no:cacheprovider $(ls tests/test_*.py | grep -v "tests/test_[a-g]") 2>&1 \
          | tee "$OUT/gpu_tests_b.log" | tail -20 ;;
  bench) env_info; run_bench "$@" ;;
  tune) env_info; python3 -m fusedmoe tune --out-dir "$OUT/configs" "$@" 2>&1 | tail -30 ;;
  diag) env_info
        timeout 120 python3 benchmarks/profile_stages.py --host --tokens 1,16 > "$OUT/diag_host.txt" 2>&1
        timeout 90 python3 benchmarks/profile_stages.py --split --quant fp8_block --model deepseek-v3:8 --tokens 16,4096,16384 > "$OUT/diag_fp8b.txt" 2>&1
        timeout 90 python3 benchmarks/profile_stages.py --split --quant fp8_channel --model qwen3-30b-a3b --tokens 16,4096,16384 > "$OUT/diag_fp8c.txt" 2>&1
        grep -h "==\|host:\|split:" "$OUT"/diag_*.txt ;;
  decode) env_info
        python3 -c "import triton.language.extra.cuda as c; print('gdc:', hasattr(c, 'gdc_wait'))" | tee -a "$OUT/env.txt"
        timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_decode.py \
          tests/test_backends.py -k "decode or cuda_bf16" 2>&1 | tee "$OUT/decode_tests.log" | tail -15
        timeout 420 python3 benchmarks/decode_ab.py --out "$OUT/decode_ab.json" "$@" 2>&1 | tee "$OUT/decode_ab.txt" ;;
  eager) env_info
        for m in qwen3-30b-a3b deepseek-v3:8 mixtral-8x7b; do
          timeout 120 python3 benchmarks/host_overhead.py --real --model $m --iters 3000 2>&1 | tee -a "$OUT/eager.txt"
        done ;;
  report) env_info
        T=1,16,64,256,1024,4096,16384
        if [ "${1:-}" != "--w8a8" ]; then
          python3 -m fusedmoe bench --tokens $T --model mixtral-8x7b,qwen3-30b-a3b --json "$OUT/b16a.json" --plot "$OUT/b16a.png" > "$OUT/b16a.txt" 2> "$OUT/b16a.err"
          python3 -m fusedmoe bench --tokens $T --model deepseek-v3 --tp 8 --json "$OUT/b16b.json" --plot "$OUT/b16b.png" > "$OUT/b16b.txt" 2> "$OUT/b16b.err"
        fi
        python3 -m fusedmoe bench --tokens $T --model qwen3-30b-a3b --quant none,fp8_channel,int8_channel --peers none \
          --backend triton,grouped_mm --json "$OUT/bq1.json" > "$OUT/bq1.txt" 2> "$OUT/bq1.err"
        python3 -m fusedmoe bench --tokens $T --model deepseek-v3 --tp 8 --quant none,fp8_block --peers none \
          --backend triton --json "$OUT/bq2.json" > "$OUT/bq2.txt" 2> "$OUT/bq2.err"
        tail -n 3 "$OUT"/*.err
        (cd "$OUT" && tar cf report.tar $(ls b16* bq* 2>/dev/null) env.txt && rm -f b16* bq*) ;;   # few files come back
  all) env_info; run_tests
       run_bench --model mixtral-8x7b,qwen3-30b-a3b --tokens 1,16,64,256,1024,4096,16384 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
