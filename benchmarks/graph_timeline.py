"""Is one MoE call slower back to back than alone? The graph of ``fusedmoe bench`` holds one call
per input set, back to back; this times the same calls four ways and traces the kernels:

    python benchmarks/graph_timeline.py [--case deepseek-v3:8:fp8_block] [--tokens 3] [--mode tc]

  * bench:     one graph of all the bench's input sets, replayed; us per call (what bench reports);
  * alone:     one graph per set, each replay between synchronizations (the GPU idle before it);
  * replays:   the one-set graphs replayed back to back without synchronization (graph launches
               between the calls: no programmatic dependent launch across them);
  * timeline:  torch.profiler's kernel records of one replay of the bench graph: each kernel's
               start and end relative to the first, so the overlap between calls shows.
A diagnostic, not a measurement of record (``fusedmoe bench`` is).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _events(fn, reps, sync_each):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    stream = torch.cuda.current_stream()
    for s, e in ev:
        if sync_each:
            torch.cuda.synchronize()
        s.record(stream)
        fn()
        e.record(stream)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in ev) * 1e3


def _graph(calls):
    from fusedmoe.bench.harness import capture_graph
    g = capture_graph(calls, side_warmup=len(calls))
    g.replay()
    torch.cuda.synchronize()
    return g


def run(case: str, T: int, reps: int = 200, warm_study: bool = False):
    from fusedmoe.bench import harness as hz
    from fusedmoe.layer import prepare_experts
    from fusedmoe.presets import get_preset
    name, tp, scheme = case.split(":")
    cfg = get_preset(name).to_config(tp=int(tp))
    w = hz.make_weights(cfg, scheme, "cuda", seed=0)
    pe = prepare_experts(cfg, w, "triton")
    sets = hz.make_input_sets(cfg, T, "cuda", seed=T, weight_bytes=hz.total_weight_bytes(w)).sets
    calls = [lambda a=s.args(False): pe(*a) for s in sets]
    n = len(calls)
    g_all = _graph(calls)
    g_one = [_graph([c]) for c in calls]
    out = {"sets": n, "experts_hit": [s.experts_hit for s in sets]}
    for r in range(2):
        out[f"bench{r}"] = _events(g_all.replay, reps, False) / n
        out[f"alone{r}"] = statistics.mean(_events(g.replay, reps // 2, True) for g in g_one)
        out[f"replays{r}"] = _events(lambda: [g.replay() for g in g_one], reps, False) / n
    print(f"== {case} T={T} sets={n}: " + "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in out.items()), flush=True)
    if warm_study:
        import time
        for idle, warm_ms in ((1, 0), (1, 30), (5, 0), (5, 50), (10, 0), (10, 100)):
            label = f"after {idle} s idle, {warm_ms} ms warm-up"
            time.sleep(idle)
            hz._warm_up(g_all.replay, warm_ms)
            chunks = [_events(g_all.replay, 10, False) / n for _ in range(20)]
            print(f"   {label}: consecutive 10-replay medians " + " ".join(f"{c:.1f}" for c in chunks), flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g_all.replay()
        torch.cuda.synchronize()
    ks = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    if ks:
        t0 = ks[0].time_range.start
        for e in ks:
            print(f"  {e.time_range.start - t0:8.2f} {e.time_range.end - t0:8.2f} {e.time_range.elapsed_us():7.2f}  "
                  f"{e.name[:70]}")
    return out


def fresh_study(case: str, T: int, extended: bool = False, device: str = "cuda", source: bool = False,
                values: bool = False):
    """Which fresh object starts a slow state: new weights, new input sets, or a new graph?
    Consecutive 5-replay medians (us per call) from the first replay after each. ``source``
    (--source, session 34's question): new weights drawn on the GPU instead of the host, and
    cloned weights after an unrelated pageable host-to-device copy of the same size (is the
    copy what starts it?), after a host sleep of the copy's length, and after a copy on the GPU.
    ``values`` (--values, session 35's questions; the copy was not it, and GPU-drawn weights start
    it too): new weights read in full before the timing; cloned weights with permuted rows (new
    bytes at every address, written by a gather kernel); the same 16-bit weights quantized again
    (the quantization pass without a new draw), and that read in full first."""
    import time
    from fusedmoe.bench import harness as hz
    from fusedmoe.layer import prepare_experts
    from fusedmoe.presets import get_preset
    name, tp, scheme = case.split(":")
    cfg = get_preset(name).to_config(tp=int(tp))

    def series(label, g, n, chunks=48):
        t0 = time.perf_counter()
        c = [_events(g.replay, 5, False) / n for _ in range(chunks)]
        print(f"   {label} ({(time.perf_counter() - t0) * 1e3:.0f} ms): " + " ".join(f"{v:.0f}" for v in c), flush=True)

    import dataclasses

    def cloned(w):          # the same weights in new allocations, written by a GPU copy
        return dataclasses.replace(w, **{f.name: getattr(w, f.name).clone() for f in dataclasses.fields(w)
                                         if isinstance(getattr(w, f.name), torch.Tensor)})

    def busy(ms):           # GPU work that does not touch the weights
        a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        hz._warm_up(lambda: a @ a, ms)

    def gpu_base():         # make_weights' 16-bit draw, on the GPU (no host tensor, no host-to-device copy)
        from fusedmoe.weights import ExpertWeights
        g = torch.Generator(device=device).manual_seed(1)
        E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
        w13 = (torch.randn(E, N, H, generator=g, device=device) / H ** 0.5).to(cfg.torch_dtype)
        w2 = (torch.randn(E, H, I, generator=g, device=device) / I ** 0.5).to(cfg.torch_dtype)
        return ExpertWeights(w13, w2)

    def gpu_drawn():
        return hz.make_weights(cfg, scheme, device, base=gpu_base())

    def permuted(w):        # new bytes at every address of new allocations (a gather kernel writes them)
        def perm(t):
            if t.dim() < 2:
                return t.clone()
            return t.index_select(1, torch.randperm(t.shape[1], device=t.device))
        return dataclasses.replace(w, **{f.name: perm(getattr(w, f.name)) for f in dataclasses.fields(w)
                                         if isinstance(getattr(w, f.name), torch.Tensor)})

    def read_all(w, times=5):
        for _ in range(times):
            for t in w.tensors().values():
                t.view(torch.uint8).amax()

    def host_copy(nbytes, kind):    # unrelated traffic of the weights' size before cloning them
        if kind == "h2d":
            host = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
            t0 = time.perf_counter()
            dev = host.to(device)
            torch.cuda.synchronize()
            return dev, time.perf_counter() - t0
        if kind == "d2d":
            a = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
            return a.clone(), 0.0
        return None, 0.0

    w = pe = sets = None
    copy_s = 0.5
    steps = ("new weights", "new graph", "new input sets", "new graph", "new weights")
    if source:
        steps = ("new weights", "new weights drawn on the GPU", "cloned weights after a host-to-device copy",
                 "cloned weights after a host sleep", "cloned weights after a GPU copy", "new weights")
    if values:
        steps = ("new weights", "new weights, read in full 5 times first", "cloned weights with permuted rows",
                 "new weights drawn on the GPU", "the same 16-bit weights quantized again",
                 "the same 16-bit weights quantized again, read in full 5 times first")
    base = None
    if extended:
        steps += ("cloned weights", "cloned weights, each tensor read 5 times first",
                  "cloned weights, 50 ms of other GPU work first", "cloned weights after empty_cache",
                  "the first weights again")
    first = None
    for step in steps:
        if step.startswith("new weights") and "GPU" not in step:
            w = hz.make_weights(cfg, scheme, device, seed=0)
            first = first or w
            if "read in full" in step:
                read_all(w)
        elif step == "new weights drawn on the GPU":
            if values:
                base = gpu_base()
                w = hz.make_weights(cfg, scheme, device, base=base)
            else:
                w = gpu_drawn()
        elif step.startswith("the same 16-bit weights quantized again"):
            w = hz.make_weights(cfg, scheme, device, base=base)
            if "read in full" in step:
                read_all(w)
        elif step == "cloned weights with permuted rows":
            w = permuted(w)
        elif step == "the first weights again":
            w = first
        elif step.startswith("cloned weights"):
            if "empty_cache" in step:
                pe = g = None
                torch.cuda.empty_cache()
            if "host-to-device copy" in step:
                junk, copy_s = host_copy(hz.total_weight_bytes(w), "h2d")
                print(f"   (host-to-device copy of {hz.total_weight_bytes(w) / 1e9:.2f} GB: {copy_s * 1e3:.0f} ms)")
                del junk
            elif "host sleep" in step:
                time.sleep(copy_s)
            elif "GPU copy" in step:
                junk, _ = host_copy(hz.total_weight_bytes(w), "d2d")
                del junk
            w = cloned(w)
            if "read 5 times" in step:
                read_all(w)
            elif "other GPU work" in step:
                busy(50)
        if step != "new graph" and step != "new input sets":
            pe = prepare_experts(cfg, w, "triton")
        if sets is None or step == "new input sets":
            sets = hz.make_input_sets(cfg, T, device, seed=T, weight_bytes=hz.total_weight_bytes(w)).sets
        torch.cuda.synchronize()
        g = _graph([lambda a=s.args(False), pe=pe: pe(*a) for s in sets])
        series(f"{case} T={T} {step}", g, len(sets))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="deepseek-v3:8:fp8_block")
    ap.add_argument("--tokens", default="3")
    ap.add_argument("--warm-study", action="store_true", help="consecutive chunks after an idle second")
    ap.add_argument("--fresh-study", action="store_true", help="which fresh object starts a slow state")
    ap.add_argument("--extended", action="store_true", help="--fresh-study: also cloned weights, read first, "
                    "other GPU work first, after empty_cache, the first weights again")
    ap.add_argument("--source", action="store_true", help="--fresh-study: weights drawn on the GPU; cloned "
                    "weights after a host-to-device copy, a host sleep, a GPU copy")
    ap.add_argument("--values", action="store_true", help="--fresh-study: new weights read in full first; "
                    "cloned weights with permuted rows; the same 16-bit weights quantized again (and read first)")
    ap.add_argument("--mode", default=None, help="FUSEDMOE_W8A8_DECODE for the run (a16 / tc / auto)")
    a = ap.parse_args(argv)
    if a.mode:
        os.environ["FUSEDMOE_W8A8_DECODE"] = a.mode
    if a.fresh_study:
        for case in a.case.split(","):
            for T in a.tokens.split(","):
                fresh_study(case, int(T), a.extended, source=a.source, values=a.values)
        return 0
    for case in a.case.split(","):
        for T in a.tokens.split(","):
            run(case, int(T), warm_study=a.warm_study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
