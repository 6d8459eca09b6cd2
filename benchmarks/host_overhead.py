"""Host (Python + torch-op) time of one eager forward of a fusedmoe backend at decode size.

    python benchmarks/host_overhead.py [--model qwen3-30b-a3b[:tp]] [--tokens 1] [--backend triton] [--quant Q]
                                       [--dtype D] [--platform P] [--stub launch|run] [--real]
                                       [--iters N] [--profile] [--top K]

Why: at T=1 an eager forward of the ``triton`` backend spends far longer on the host than
the ~40 us its kernels need on an H100, so eager decode is host bound. This measures that
host time per call, for the three entry points a user reaches:
  call   ``PreparedExperts.__call__`` (input checks + run): what ``fusedmoe bench`` times;
  run    ``PreparedExperts.run`` (no input checks);
  op     ``FusedMoE.experts`` (checks + the ``torch.ops.fusedmoe.experts`` custom op).

Launch modes:
  default (no ``--real``): nothing is launched; every Triton launch is replaced, so the
    time is the framework's own Python and torch-op overhead. Works without a GPU.
      ``--stub launch`` (default): ``fusedmoe.kernels.launcher.launch``, as imported by
        every kernel module, becomes a no-op (the launcher's own cost is excluded).
      ``--stub run``: the cached launcher runs for real (key, lookup, hit path) and only
        the compiled kernel's launch is a no-op (fake compiled kernels). The device and
        stream query is stubbed too (device 0, stream 0): on a GPU host it adds ~1 us per
        launch outside a pinned block (``launcher.pin_launch_state``), which this mode
        cannot show.
    Both modes print how many launches one call makes.
  ``--real``: real launches on CUDA. Host time per call as below, with
    ``torch.cuda.synchronize`` around each round (not inside it), and the wall time per
    call including the GPU (a loop of ``--iters`` calls, synchronized at its end).

Host time: the best of rounds of 100 calls (``--iters`` in all), under
``torch.inference_mode``; the median of the rounds is printed beside it as a noise gauge.
A shared or frequency-scaling machine only ever adds time, so compare best against best,
and before against after in alternating runs of the same machine (pin the CPU:
``taskset -c 1``).

On CPU the weights are ``torch.empty`` (never read: launches are stubbed), the dtype
defaults to float16 (the ``triton`` backend refuses bf16 on CPU) and the platform is the
CPU with Triton marked usable; ``--platform h100 --dtype bfloat16`` instead walks the
H100's code path (tuned launch-config table), still with CPU tensors. On CPU,
``check_inputs`` also runs the data-dependent topk-id checks (aminmax and a [T, k, k]
compare: ~10 us of torch ops) that it skips on CUDA; ``run`` is the part both devices
share. ``--profile``: a cProfile of the ``call`` loop (top functions by internal time, then
by cumulative time; the profiler itself roughly doubles every Python call).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402


def build(model: str, tokens: int, backend: str, dtype: str, platform_name: str, device: str,
          quant: str = "none"):
    """(config, FusedMoE, args): the layer of ``model`` (weights quantized to ``quant``) and one
    decode-size input."""
    import math

    from fusedmoe.config import Routing
    from fusedmoe.layer import FusedMoE
    from fusedmoe.platform import Platform
    from fusedmoe.presets import get_preset
    from fusedmoe.weights import ExpertWeights
    name, _, tp = model.partition(":")
    cfg = get_preset(name).to_config(tp=int(tp or 1)).replace(dtype=dtype, routing=Routing())
    E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    dt = cfg.torch_dtype
    if device == "cuda":
        w13 = torch.randn(E, N, H, device=device, dtype=dt) / math.sqrt(H)
        w2 = torch.randn(E, H, I, device=device, dtype=dt) / math.sqrt(I)
        plat = None if platform_name == "current" else platform_name
    else:   # never read (stubbed launches): no need to touch 1 GB of pages, unless quantized here
        fill = torch.empty if quant == "none" else (lambda *s, dtype: torch.full(s, 0.01, dtype=dtype))
        w13 = fill(E, N, H, dtype=dt)
        w2 = fill(E, H, I, dtype=dt)
        plat = (Platform("cpu", "cpu", None, 0.0, os.cpu_count() or 1, True, False)
                if platform_name == "current" else platform_name)
    if quant == "none":
        layer = FusedMoE(cfg, ExpertWeights(w13, w2), backend=backend, platform=plat)
    else:
        layer = FusedMoE.from_float(cfg, w13, w2, quant=quant, backend=backend, platform=plat)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, H, generator=g).to(dt).to(device)
    logits = torch.randn(tokens, cfg.num_experts, generator=g)
    w, ids = torch.topk(torch.softmax(logits, -1), cfg.top_k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).float().to(device)
    return cfg, layer, (x, w, ids.to(torch.int32).to(device))


class _FakeCompiled:
    """A compiled kernel whose launch does nothing but count (``--stub run``)."""

    function = None
    packed_metadata = None
    launches = 0

    @classmethod
    def run(cls, *args):
        cls.launches += 1


class _FakeBackend:
    supports_native_tensor_specialization = True


def stub_launches(mode: str):
    """Replace every Triton launch (see the module doc) -> (undo, count): ``count()`` is the
    number of launches stubbed so far."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    import fusedmoe.kernels
    from fusedmoe.kernels import launcher
    mods = [importlib.import_module(f"fusedmoe.kernels.{m.name}")
            for m in pkgutil.iter_modules(fusedmoe.kernels.__path__)]
    saved_run = JITFunction.run
    if mode == "launch":
        real, calls = launcher.launch, [0]

        def noop(*args, **kwargs):
            calls[0] += 1
        patched = [m for m in mods if getattr(m, "launch", None) is real]
        for m in patched:
            m.launch = noop
        JITFunction.run = noop                      # kernel[grid](...) outside the launcher

        def undo():
            JITFunction.run = saved_run
            for m in patched:
                m.launch = real
        return undo, lambda: calls[0]
    # mode == "run": the cached launcher with fake compiled kernels on a fake device 0
    if launcher._knobs is None or launcher._knobs.runtime.interpret:
        raise SystemExit("--stub run needs triton's JIT kernels: unset TRITON_INTERPRET")
    saved_ds = launcher._device_stream
    kernels = [v for m in mods for v in vars(m).values() if isinstance(v, JITFunction)]
    saved_caches = [(k, k.device_caches) for k in kernels]
    for k in kernels:
        k.device_caches = {0: (None, None, None, _FakeBackend, None)}

    def normal(self, *args, **kwargs):              # a miss: what kernel[grid] returns
        _FakeCompiled.launches += 1
        return _FakeCompiled
    JITFunction.run = normal
    launcher._device_stream = lambda: (0, 0)
    launcher.reset()

    def undo():
        JITFunction.run, launcher._device_stream = saved_run, saved_ds
        for k, caches in saved_caches:
            k.device_caches = caches
        launcher.reset()
    return undo, lambda: _FakeCompiled.launches


def time_host(fn, args, iters: int, cuda: bool, per_round: int = 100) -> tuple:
    """(best, median) host us per call over rounds of ``per_round`` calls (``iters`` in all).

    Short rounds and the best of them: on a shared or frequency-scaling machine the noise
    only ever adds time, and a round is short enough to fall between disturbances. The
    median says how noisy the machine was."""
    for _ in range(20):
        fn(*args)
    per_call = []
    for _ in range(max(1, iters // per_round)):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn(*args)
        per_call.append((time.perf_counter() - t0) * 1e6 / per_round)
        if cuda:
            torch.cuda.synchronize()
    per_call.sort()
    return per_call[0], per_call[len(per_call) // 2]


def time_wall(fn, args, iters: int) -> float:
    """Wall us per call including the GPU (synchronized once, at the end)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-30b-a3b", help="preset[:tp], e.g. deepseek-v3:8")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--quant", default="none", help="weight scheme, e.g. fp8_channel, int8_channel, fp8_block")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float16 on CPU")
    ap.add_argument("--platform", default="current", help="'current' or a preset (h100, h200, ...)")
    ap.add_argument("--stub", choices=("launch", "run"), default="launch")
    ap.add_argument("--real", action="store_true", help="real launches (CUDA only)")
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--profile", action="store_true", help="cProfile the 'call' loop")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if a.real and not cuda:
        ap.error("--real needs CUDA")
    device = "cuda" if cuda else "cpu"
    dtype = a.dtype or ("bfloat16" if cuda else "float16")
    cfg, layer, args = build(a.model, a.tokens, a.backend, dtype, a.platform, device, a.quant)
    pe = layer.prepared
    undo, count = (lambda: None, None) if a.real else stub_launches(a.stub)
    mode = "real launches" if a.real else f"launches stubbed ({a.stub})"
    print(f"{a.model} T={a.tokens} backend={pe.selection.winner} {dtype} {a.quant} on {device}, {mode}, "
          f"{a.iters} calls; E={cfg.num_experts} H={cfg.hidden_size} I={cfg.intermediate_size} k={cfg.top_k}")
    if count is not None:
        with torch.inference_mode():
            pe(*args)
            n0 = count()
            pe(*args)
        print(f"  {count() - n0} launches per call, stubbed")
    entries = {"call": pe, "run": pe.run, "op": layer.experts}
    try:
        with torch.inference_mode():
            for name, fn in entries.items():
                best, med = time_host(fn, args, a.iters, cuda)
                line = f"  {name:5s} host {best:7.1f} us/call (median of rounds {med:.1f})"
                if a.real:
                    line += f"   wall (with GPU) {time_wall(fn, args, a.iters):7.1f} us/call"
                print(line)
            if a.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(a.iters):
                    pe(*args)
                prof.disable()
                for key in ("tottime", "cumulative"):
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(a.top)
                    print(f"\n---- cProfile of {a.iters} 'call's, by {key}")
                    print("\n".join(s.getvalue().splitlines()[6:]))   # drop the header noise
    finally:
        undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
