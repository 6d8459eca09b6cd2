#!/usr/bin/env bash
# A/B of PERSISTENT (programs per SM looping over tiles) x FLATTEN (tile and K loops fused into
# one pipeline) on the shipped bf16 configs, prefill: deepseek-v3 --tp 8 and qwen3-30b-a3b at
# T = 4096, 16384. Per point, starting from the shipped tuned (gemm1, gemm2) pair:
#   GEMM1 alone, GEMM2 alone (its kernel without the k-reduce), each with P in 0/1/2 x FLATTEN;
#   the whole forward (CUDA graph) with the variant on GEMM2 only and on both GEMMs.
# Every variant's output is compared bitwise with P=0 (deterministic paths: only the schedule
# changes). Results: $OUT/persistent_ab.{txt,md,json}. Usage: scripts/gpu_persistent_ab.sh [--quick] [--mixtral]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
unset FUSEDMOE_CONFIG_DIR                 # the shipped configs are the baseline
timeout 570 python3 - "$OUT" "$@" <<'PY' 2>&1 | tee "$OUT/persistent_ab.txt"
import json, sys, time
import torch
import triton
from fusedmoe import tuning
from fusedmoe.bench import harness as hz
from fusedmoe.kernels import grouped_gemm as gg
from fusedmoe.kernels.align import align_block_size
from fusedmoe.layer import prepare_experts
from fusedmoe.presets import get_preset

out_dir = sys.argv[1]
quick = "--quick" in sys.argv[2:]
POINTS = [("mixtral-8x7b", 1)] if "--mixtral" in sys.argv[2:] else [("deepseek-v3", 8), ("qwen3-30b-a3b", 1)]
TOKENS = (16384,) if quick else (4096, 16384)
VARIANTS = [(0, False), (1, False), (1, True), (2, False), (2, True)]


def name(p, fl):
    return "base" if p == 0 else f"P{p}{' flat' if fl else ''}"


def graph_us(calls):
    return hz.time_graph(calls, reps=20)


def variant(cfg, p, fl):
    return dict(cfg, PERSISTENT=p, FLATTEN=fl) if p else dict(cfg)


def gemm_rows(model, tp, cfg, ex, T, c1, c2, sets):
    """GEMM1 and GEMM2 alone, every variant, from the shipped (c1, c2)."""
    E, H, I, k = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    w13, w2, act, n = ex.weights.w13, ex.weights.w2, cfg.activation.value, T * k
    aligns = [align_block_size(s.topk_ids, c1["BLOCK_SIZE_M"], E) for s in sets]
    hs = [gg.gemm1_act(s.x, w13, al, k, act, config=c1) for s, al in zip(sets, aligns)]
    h_out = torch.empty_like(hs[0])
    y = torch.empty(1, n, H, dtype=hs[0].dtype, device="cuda")         # GEMM2's deterministic scratch
    flop = {"gemm1": 2 * n * H * (2 * I if cfg.is_gated else I), "gemm2": 2 * n * I * H}

    def run_gemm(g, c, i):
        s, al = sets[i], aligns[i]
        if g == "gemm1":
            return gg.gemm1_act(s.x, w13, al, k, act, h_out, config=c)
        # GEMM2's kernel alone, as gemm2() launches it for reduce='deterministic' (the k-sum
        # that follows is the same kernel for every variant)
        gg._launch(hs[i], w2, y[0], al, n_out=H, a_div=1, c_div=1, act=-1, config=c,
                   topk_weights=s.topk_weights, stride_cs=y.stride(0))
        return y[0]

    rows = []
    for g, base_cfg in (("gemm1", c1), ("gemm2", c2)):
        ref = run_gemm(g, base_cfg, 0).clone()
        base_us = None
        for p, fl in VARIANTS:
            c = variant(base_cfg, p, fl)
            row = dict(model=model, tp=tp, T=T, what=g, variant=name(p, fl))
            try:
                same = torch.equal(run_gemm(g, c, 0), ref)
                us = graph_us([lambda i=i, c=c: run_gemm(g, c, i) for i in range(len(sets))])
            except Exception as e:  # e.g. FLATTEN's extra shared memory past the limit
                print(f"   {g} {row['variant']:9s} failed: {type(e).__name__}: {str(e)[:100]}")
                rows.append(dict(row, error=str(e)[:200]))
                continue
            base_us = base_us or us
            rows.append(dict(row, us=us, tflops=flop[g] / us / 1e6, speedup=base_us / us, bitwise=same))
            print(f"   {g} {row['variant']:9s} {us:9.1f} us {flop[g] / us / 1e6:6.0f} TFLOP/s  "
                  f"x{base_us / us:5.3f}  bitwise={same}")
    return rows


def forward_rows(model, tp, pe, T, c1, c2, sets):
    """The whole forward (graph, rotating sets): the variant on GEMM2 only, then on both GEMMs."""
    x0, w0, i0 = sets[0].args()
    rows, ref, base_us = [], None, None
    for p, fl in VARIANTS:
        for scope in (("both",) if p == 0 else ("gemm2", "both")):
            pair = (variant(c1, p, fl) if scope == "both" else c1, variant(c2, p, fl))
            row = dict(model=model, tp=tp, T=T, what="forward", variant=name(p, fl) + ("" if p == 0 else f" {scope}"))
            tuning._reset_workspaces(pe)
            try:
                with tuning.override(pair):
                    o = pe(x0, w0, i0).clone()
                    us = hz.time_impl(pe, sets, graph=True, eager=False, budget_ms=150, min_reps=5).best_us
            except Exception as e:
                print(f"   forward {row['variant']:16s} failed: {type(e).__name__}: {str(e)[:100]}")
                rows.append(dict(row, error=str(e)[:200]))
                continue
            ref = o if ref is None else ref
            base_us = base_us or us
            same = torch.equal(o, ref)
            rows.append(dict(row, us=us, speedup=base_us / us, bitwise=same))
            print(f"   forward {row['variant']:16s} {us:9.1f} us  x{base_us / us:5.3f}  bitwise={same}")
    return rows


props = torch.cuda.get_device_properties(0)
print(f"{props.name} {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
rows = []
for model, tp in POINTS:
    cfg = get_preset(model).to_config(tp=tp)
    w = hz.make_weights(cfg, "none", "cuda", seed=0)
    pe = prepare_experts(cfg, w, "triton")
    ex = pe.kernel.experts
    print(f"== {model} tp{tp}: E={cfg.num_local_experts} H={cfg.hidden_size} I={cfg.intermediate_size} "
          f"k={cfg.top_k}; {ex.lc.describe()}")
    for T in TOKENS:
        c1, c2 = ex.configs(T)                                     # the shipped tuned pair
        print(f"-- T={T}: gemm1 {c1}\n           gemm2 {c2}")
        sets = hz.make_input_sets(cfg, T, "cuda", seed=T, weight_bytes=hz.total_weight_bytes(w),
                                  l2_bytes=hz.l2_bytes(), min_sets=2, max_sets=4).sets
        rows += gemm_rows(model, tp, cfg, ex, T, c1, c2, sets)
        torch.cuda.empty_cache()
        rows += forward_rows(model, tp, pe, T, c1, c2, sets)
        torch.cuda.empty_cache()
    pe = w = ex = None
    torch.cuda.empty_cache()

with open(f"{out_dir}/persistent_ab.json", "w") as f:
    json.dump(dict(device=props.name, sms=props.multi_processor_count, triton=triton.__version__,
                   when=time.strftime("%Y-%m-%dT%H:%M:%S"), rows=rows), f, indent=1)
with open(f"{out_dir}/persistent_ab.md", "w") as f:
    f.write(f"{props.name}, triton {triton.__version__}; graph µs, speedup vs the shipped config (base)\n\n")
    f.write("| model | T | what | variant | µs | TFLOP/s | speedup | bitwise |\n|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        if "error" in r:
            f.write(f"| {r['model']} tp{r['tp']} | {r['T']} | {r['what']} | {r['variant']} | failed | | | |\n")
        else:
            tf = f"{r['tflops']:.0f}" if "tflops" in r else ""
            f.write(f"| {r['model']} tp{r['tp']} | {r['T']} | {r['what']} | {r['variant']} | {r['us']:.1f} | {tf} | "
                    f"{r['speedup']:.3f} | {r['bitwise']} |\n")
print(f"wrote {out_dir}/persistent_ab.md and .json")
PY
