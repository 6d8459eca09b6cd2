"""The benchmark run: what is measured, per (shape, scheme, T, implementation), and the report.

Legend: T tokens, E experts, k top-k, H hidden, I intermediate size (per partition).

- correctness first: the output on fresh random inputs vs ``reference_moe`` (relative
  Frobenius error, ``fusedmoe.tolerances``); a wrong implementation is reported, not timed
  (``check``);
- the median time of one call as CUDA-graph replay (the graph holds one call per input set,
  rotating through them; timed after ``WARM_MS`` of replays) and eagerly (events around each
  call) (``timing``; the input sets: ``inputs``);
- TFLOP/s, GB/s and the percentage of the roofline reached, against ceilings measured on this
  device (``roofline``); results, speedups, summary and text (``report``).

This module holds the run itself (``BenchSpec``, ``run_bench``) and keeps the names of the
modules above importable from here, where the tuner, the benchmarks and the tests look for them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..config import MoEConfig, QuantMethod, QuantScheme, Routing
from .check import CheckCase, CheckResult, check_against, check_impl, make_check_case  # noqa: F401
from .inputs import (InputSet, InputSets, make_input_sets, make_routing, make_weights,  # noqa: F401
                     total_weight_bytes)
from .progress import Progress
from .report import (SCHEMA, BenchReport, Measurement, ShapeInfo, _with_speedups, format_summary,  # noqa: F401
                     format_table, summarize)
from .roofline import (Ceilings, expert_bytes, flops, l2_bytes, measure_ceilings, moe_bytes,  # noqa: F401
                       pct_of_roofline, peak_for_scheme, roofline_us, weight_bytes)
from .timing import (WARM_MS, Timing, _time_cpu, _time_cuda, _warm_up, capture_graph,  # noqa: F401
                     time_graph, time_impl)

__all__ = [
    "flops", "weight_bytes", "expert_bytes", "moe_bytes", "roofline_us", "pct_of_roofline", "peak_for_scheme",
    "Ceilings", "measure_ceilings", "l2_bytes", "InputSet", "make_routing", "make_input_sets", "make_weights",
    "total_weight_bytes", "Timing", "capture_graph", "time_impl", "CheckResult", "CheckCase", "make_check_case", "check_against",
    "check_impl", "Impl", "ShapeInfo", "Measurement", "BenchReport", "BenchSpec", "Progress", "run_bench",
    "format_table", "format_summary", "summarize", "SCHEMA",
]


@dataclass
class Impl:
    """One implementation to measure. ``build()`` returns ``fn(x, topk_weights, topk_ids) -> out``
    (or raises with the reason it cannot run); ``unavailable`` is set when known up front."""

    name: str
    kind: str                              # "fusedmoe" or "peer"
    build: Optional[Callable] = None
    graph_safe: bool = True
    ids64: bool = False
    unavailable: Optional[str] = None
    description: str = ""
    schemes: tuple = ("none",)             # a peer's quant methods: it runs with those weights too


@dataclass
class BenchSpec:
    shapes: list                          # [(name, MoEConfig, tp)]
    tokens: list
    schemes: list = field(default_factory=lambda: ["none"])
    backends: object = "all"              # "all", "auto", or a list of backend names
    peers: object = "all"                 # "all", "none", or a list of peer names
    graph: bool = True
    repeat: Optional[int] = None
    seed: int = 0
    skew: Optional[float] = None
    budget_ms: float = 200.0
    platform: object = None
    ceilings: Optional[Ceilings] = None
    device: Optional[str] = None


def fusedmoe_impls(config: MoEConfig, scheme: QuantScheme, platform, backends="all") -> tuple:
    """(impls, auto_winner, auto_note): every registered backend asked for, each either buildable
    or marked with the oracle's reasons for refusing."""
    from ..backends.registry import registered  # noqa: PLC0415
    from ..errors import FusedMoEError  # noqa: PLC0415
    from ..oracle import select_backend  # noqa: PLC0415
    specs = registered()
    try:
        auto, auto_note = select_backend(config, scheme, platform, "auto", log_once=False).winner, ""
    except FusedMoEError as e:
        auto, auto_note = None, str(e).splitlines()[0]
    if backends in (None, "all"):
        names = list(specs)
    elif backends == "auto":
        names = [auto] if auto else []
    else:
        names = list(backends)
    out = []
    for name in names:
        if name not in specs:
            out.append(Impl(name, "fusedmoe", unavailable=f"not a registered backend (registered: {', '.join(specs)})"))
            continue
        try:
            select_backend(config, scheme, platform, name, log_once=False)
        except FusedMoEError as e:
            reasons = getattr(e, "rejections", {}).get(name) or [str(e).splitlines()[0]]
            out.append(Impl(name, "fusedmoe", unavailable="; ".join(reasons)))
            continue

        def build(cfg, weights, name=name):
            from ..layer import prepare_experts  # noqa: PLC0415
            return prepare_experts(cfg, weights, backend=name, platform=platform)
        out.append(Impl(name, "fusedmoe", build=build, graph_safe=specs[name].cuda_graph_safe,
                        description=specs[name].description))
    return out, auto, auto_note


def _peer_names(spec: BenchSpec) -> tuple:
    """(peer names to run, notes on the peers 'all' leaves out because their package is missing)."""
    from . import peers  # noqa: PLC0415
    if spec.peers in ("none", None, False):
        return [], []
    if spec.peers == "all":
        return peers.default_peer_names()
    return list(spec.peers), []


def _peer_impls(config, names: list, scheme: QuantScheme, say: Callable, where: str) -> list:
    """The peers that run at ``scheme``: all of them for 16-bit weights, else those that list it."""
    from . import peers  # noqa: PLC0415
    if not names:
        return []
    impls = peers.build_peers(config, names)
    run = [p for p in impls if _runs_at(p, scheme)]
    left = [p.name for p in impls if not _runs_at(p, scheme)]
    if left:
        say(f"{where} " + (f"peers {', '.join(left)} run" if run else "peers run")
            + " for 16-bit weights only; compare with the 'none' rows of this run")
    return run


def _runs_at(impl: Impl, scheme: QuantScheme) -> bool:
    """fusedmoe's backends run at every scheme; a peer at 'none' and at the schemes it lists."""
    return impl.kind == "fusedmoe" or scheme.method.value in impl.schemes


def _free():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_bench(spec: BenchSpec, *, progress: bool = True, impls_fn: Optional[Callable] = None,
              log: Optional[Callable] = None) -> BenchReport:
    """Measure every (shape, scheme, T, implementation) of ``spec``; return the report.

    ``impls_fn(config, scheme, platform, weights16) -> (impls, auto_winner)`` replaces the
    registry + peers discovery (tests use it to run fakes); its peers too run at the schemes
    they list only."""
    from ..platform import Platform  # noqa: PLC0415
    plat = Platform.resolve(spec.platform)
    device = torch.device(spec.device or ("cuda" if plat.kind == "cuda" and torch.cuda.is_available() else "cpu"))
    schemes = [QuantScheme.parse(s) for s in spec.schemes]
    fp8 = any(s.method in (QuantMethod.FP8_TENSOR, QuantMethod.FP8_CHANNEL, QuantMethod.FP8_BLOCK) for s in schemes)
    ceil = spec.ceilings or measure_ceilings(device, fp8=fp8)
    l2 = ceil.l2_bytes
    results, shapes = [], []
    bar = Progress(None, "bench", enabled=progress)
    say = log or bar.write
    peer_names, notes = _peer_names(spec) if impls_fn is None else ([], [])
    for n in notes:
        say(n)
    with torch.inference_mode():
        for shape_name, config0, tp in spec.shapes:
            config = config0.replace(routing=Routing())   # the experts stage; routing is generated here
            shapes.append(ShapeInfo.of(shape_name, config, tp))
            base = make_weights(config, "none", device, seed=spec.seed)
            for scheme in schemes:
                try:
                    weights = make_weights(config, scheme, device, base=base)
                except Exception as e:  # the scheme cannot quantize this shape (group size, ...)
                    for T in spec.tokens:
                        results.append(Measurement(shape_name, scheme.name, T, "*", "fusedmoe", "failed",
                                                   f"quantize_experts: {e}"))
                    continue
                if impls_fn is not None:
                    impls, auto = impls_fn(config, scheme, plat, base)
                    impls = [i for i in impls if _runs_at(i, scheme)]
                else:
                    impls, auto, note = fusedmoe_impls(config, scheme, plat, spec.backends)
                    if auto is None:
                        say(f"[{shape_name} {scheme.name}] oracle: {note}")
                    impls += _peer_impls(config, peer_names, scheme, say, f"[{shape_name} {scheme.name}]")
                wbytes = total_weight_bytes(weights)
                per_exp = expert_bytes(config.hidden_size, config.intermediate_size, scheme, config.dtype,
                                       config.is_gated, config.has_bias)
                peak, _ = peak_for_scheme(scheme, ceil)
                inputs = {T: make_input_sets(config, T, device, seed=spec.seed + T, skew=spec.skew, l2_bytes=l2,
                                             weight_bytes=wbytes) for T in spec.tokens}
                cases = {}
                bar.add_total(len(impls) * len(spec.tokens))
                for impl in impls:
                    fn, why = None, impl.unavailable
                    if why is None:
                        try:
                            fn = impl.build(config, weights)   # at 'none' the 16-bit base itself
                        except Exception as e:  # reported; PeerUnavailable = cannot run here, not a failure
                            msg = str(e).splitlines()[0][:200] if str(e) else ""
                            if type(e).__name__ == "PeerUnavailable":
                                impl.unavailable = why = msg
                            else:
                                why = f"could not build: {type(e).__name__}: {msg}"
                    for T in spec.tokens:
                        bar.update(1, f"{shape_name} {scheme.name} T={T} {impl.name}")
                        sets = inputs[T]
                        fl = flops(T, config.top_k, config.hidden_size, config.intermediate_size, config.is_gated)
                        nb = moe_bytes(T, config.hidden_size, sets.experts_hit, per_exp, config.dtype)
                        roof = roofline_us(fl, nb, peak, ceil.copy_gbps)
                        common = dict(shape=shape_name, scheme=scheme.name, T=T, impl=impl.name, kind=impl.kind,
                                      flops=fl, bytes=nb, experts_hit=sets.experts_hit, roofline_us=roof,
                                      auto_selected=(impl.kind == "fusedmoe" and impl.name == auto),
                                      n_sets=len(sets.sets), l2_note=sets.note)
                        if fn is None:
                            st = "unsupported" if impl.unavailable else "failed"
                            results.append(Measurement(status=st, reason=why or "", **common))
                            continue
                        if T not in cases:
                            cases[T] = make_check_case(config, weights, T, device, seed=spec.seed + T, skew=spec.skew)
                        chk = check_against(fn, cases[T], ids64=impl.ids64)
                        if not chk.ok:
                            st = "wrong" if chk.rel_err is not None or "NaN" in chk.message else "failed"
                            results.append(Measurement(status=st, reason=chk.message, rel_err=chk.rel_err,
                                                       tol=chk.tol, **common))
                            continue
                        try:
                            tm = time_impl(fn, sets, graph=spec.graph, ids64=impl.ids64, reps=spec.repeat,
                                           budget_ms=spec.budget_ms, graph_safe=impl.graph_safe)
                        except Exception as e:
                            why = f"timing raised {type(e).__name__}: {e}"[:240]
                            results.append(Measurement(status="failed", reason=why,
                                                       rel_err=chk.rel_err, tol=chk.tol, **common))
                            continue
                        best = tm.best_us
                        results.append(Measurement(
                            status="ok", us_graph=tm.us_graph, us_eager=tm.us_eager, us_best=best,
                            graph_note=tm.graph_note, rel_err=chk.rel_err, tol=chk.tol,
                            tflops=fl / (best * 1e-6) / 1e12, gbps=nb / (best * 1e-6) / 1e9,
                            pct_roofline=pct_of_roofline(best, roof), **common))
                    del fn
                    _free()
                del weights, inputs, cases
                _free()
            del base
            _free()
    bar.close()
    results = _with_speedups(results)
    meta = _meta(spec, plat, device)
    return BenchReport(SCHEMA, meta, ceil, tuple(shapes), tuple(results), summarize(results))


def _meta(spec: BenchSpec, plat, device) -> dict:
    try:
        import triton  # noqa: PLC0415
        tv = triton.__version__
    except Exception:
        tv = None
    from .. import __version__  # noqa: PLC0415
    return {"fusedmoe": __version__, "torch": torch.__version__, "triton": tv, "device": str(device),
            "platform": plat.name, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "tokens": list(spec.tokens),
            "schemes": [QuantScheme.parse(s).name for s in spec.schemes], "graph": spec.graph,
            "repeat": spec.repeat, "seed": spec.seed,
            "routing": "uniform softmax top-k" if spec.skew is None else f"dirichlet(alpha={spec.skew})",
            "peers_note": "peers run with 16-bit weights, vllm and sglang also with fp8_tensor / fp8_channel / "
                          "fp8_block weights; quantized rows compare with the 16-bit peers and the peers of their "
                          "scheme",
            "time_note": "us_best = min(graph, eager): what a user of the implementation gets; "
                         "eager_speedup compares eager with eager"}
