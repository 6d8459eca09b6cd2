"""Where the time of one MoE forward goes: per-kernel device time and host time.

    python benchmarks/profile_stages.py [--model P[:tp],...] [--tokens 1,64,...] [--quant S]
                                        [--backend triton] [--host] [--out DIR]

For each (preset, T): the device time of every kernel of one forward (torch.profiler, CUDA
activity, averaged over the iterations), the sum of kernel times, and the CUDA-graph time of
the whole forward (their difference is launch gaps and tails). ``--host``: cProfile of the
eager forward (host overhead per call, top functions by cumulative time). A diagnostic for
kernel work, not a benchmark: ``fusedmoe bench`` is the measurement of record.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(model: str, tp: int, scheme: str, backend: str):
    from fusedmoe.bench.harness import make_weights
    from fusedmoe.layer import prepare_experts
    from fusedmoe.presets import get_preset
    cfg = get_preset(model).to_config(tp=tp)
    base = make_weights(cfg, "none", "cuda")
    w = make_weights(cfg, scheme, "cuda", base=base)
    return cfg, prepare_experts(cfg, w, backend=backend)


def kernel_times(fn, args, iters: int = 20):
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(*args)
        torch.cuda.synchronize()
    agg = collections.defaultdict(float)
    cnt = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            agg[ev.name] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            cnt[ev.name] += 1
    return {k: (v / iters, cnt[k] / iters) for k, v in agg.items()}


def graph_time(fn, args, reps: int = 50) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def host_us(fn, args, n: int = 300, no_launch: bool = False) -> float:
    import time

    from triton.runtime.jit import JITFunction
    if no_launch:   # the framework's own host time: every Triton launch becomes a no-op
        from fusedmoe import plan
        from fusedmoe.kernels import launcher
        run = JITFunction.run
        launcher.set_fast(False)                      # the cached launcher bypasses JITFunction.run
        JITFunction.run = lambda self, *a, **kw: None
        try:
            return host_us(fn, args, n)
        finally:
            JITFunction.run = run
            launcher.set_fast(plan.override().fast_launch)
    for _ in range(10):
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / n


def split_times(fn, args, iters: int = 10) -> str:
    """Event-timed stages of the triton backend (eager; accurate when kernels outlast launches)."""
    import fusedmoe.kernels.align as al
    import fusedmoe.kernels.grouped_gemm as gg
    times = collections.defaultdict(list)
    orig = {}

    def wrap(mod, name, label_fn):
        f = getattr(mod, name)
        orig[(mod, name)] = f

        def g(*a, **kw):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            r = f(*a, **kw)
            e.record()
            times[label_fn(a, kw)].append((s, e))
            return r
        setattr(mod, name, g)
    wrap(gg, "_launch", lambda a, kw: "gemm1" if kw.get("act", -1) >= 0 else "gemm2")
    wrap(gg, "moe_reduce", lambda a, kw: "reduce")
    wrap(al, "align_block_size", lambda a, kw: "align")
    import fusedmoe.backends.triton as tb
    import fusedmoe.quantize as pf
    wrap(pf, "quantize_activation", lambda a, kw: "quant_x")       # NoEP.prepare (W8A8)
    wrap(tb, "quantize_activation", lambda a, kw: "requant_h")     # between the GEMMs (W8A8)
    try:
        for _ in range(iters):
            fn(*args)
        torch.cuda.synchronize()
    finally:
        for (mod, name), f in orig.items():
            setattr(mod, name, f)
    parts = []
    for k, evs in times.items():
        ms = sorted(s.elapsed_time(e) for s, e in evs)
        parts.append(f"{k} {ms[len(ms) // 2] * 1e3:.1f}")
    return ", ".join(parts) + " (us, median)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mixtral-8x7b,qwen3-30b-a3b,deepseek-v3:8")
    ap.add_argument("--tokens", default="1,64,256,1024,4096,16384")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--profile-max-t", type=int, default=1, help="--host: cProfile the eager forward up to this T")
    ap.add_argument("--split", action="store_true", help="event times of align / gemm1 / gemm2 / reduce")
    ap.add_argument("--reduce", default=None, help="force the triton backend's reduce mode "
                    "(deterministic|atomic|atomic_out; FUSEDMOE_PLAN reduce)")
    args = ap.parse_args(argv)
    if args.reduce:     # read by the backend when it is built
        forced = json.loads(os.environ.get("FUSEDMOE_PLAN") or "{}")
        os.environ["FUSEDMOE_PLAN"] = json.dumps(dict(forced, reduce=args.reduce))
    from fusedmoe.bench.harness import make_routing
    for spec in args.model.split(","):
        name, _, tp = spec.partition(":")
        cfg, fn = build(name, int(tp or 1), args.quant, args.backend)
        for T in [int(t) for t in args.tokens.split(",")]:
            g = torch.Generator().manual_seed(T)
            x = torch.randn(T, cfg.hidden_size, generator=g).to(cfg.torch_dtype).cuda()
            w, ids = make_routing(T, cfg.num_local_experts, cfg.top_k, generator=g, device="cuda")
            kt = kernel_times(fn, (x, w, ids))
            gt = graph_time(fn, (x, w, ids))
            tot = sum(v for v, _ in kt.values())
            print(f"== {spec} {args.quant} T={T}: graph {gt:.1f} us, kernels {tot:.1f} us, gaps {gt - tot:.1f} us")
            for k, (v, c) in sorted(kt.items(), key=lambda kv: -kv[1][0]):
                print(f"   {v:9.1f} us  x{c:.0f}  {k[:110]}")
            if args.split:
                print("   split: " + split_times(fn, (x, w, ids)))
            if args.host and T <= 16:
                print(f"   host: {host_us(fn, (x, w, ids)):.1f} us per eager call (no sync, 300 calls); "
                      f"without Triton launches {host_us(fn, (x, w, ids), no_launch=True):.1f} us")
            if args.host and T <= args.profile_max_t:
                pr = cProfile.Profile()
                torch.cuda.synchronize()
                pr.enable()
                for _ in range(200):
                    fn(x, w, ids)
                pr.disable()
                torch.cuda.synchronize()
                sio = io.StringIO()
                st = pstats.Stats(pr, stream=sio).sort_stats("cumulative")
                st.print_stats(28)
                print(f"-- host profile {spec} T={T} (200 calls; per-call = cumtime / 200)")
                print("\n".join(sio.getvalue().splitlines()[:60]))
        del fn
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
