"""``fusedmoe`` command line: demo, explain, backends, models, check, bench, tune.

Every command takes ``--json``. A user error prints one line and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

import torch

from .. import __version__
from ..errors import FusedMoEError

log = logging.getLogger("fusedmoe")


def _emit(args, data: dict, text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        from ..errors import ConfigError
        raise ConfigError("--device", name, ["cpu", "auto"], "this machine has no CUDA device")
    return torch.device(name)


def _layer_config(args):
    from ..config import QuantScheme
    from ..presets import get_preset
    p = get_preset(args.model)
    dtype = getattr(args, "dtype", None) or "bfloat16"
    cfg = p.to_config(tp=args.tp, dtype=dtype)
    quant = QuantScheme.parse(args.quant if args.quant else p.quant)
    return p, cfg, quant


def random_layer(cfg, quant, device, seed: int = 0):
    """Seeded random 16-bit experts of ``cfg`` quantized to ``quant`` -> ExpertWeights.

    Scaled like a trained layer (std 1/sqrt(fan_in)) so activations stay O(1)."""
    from ..quantize import quantize_experts
    g = torch.Generator(device="cpu").manual_seed(seed)
    E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    w13 = (torch.randn(E, N, H, generator=g) / H ** 0.5).to(device, cfg.torch_dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(device, cfg.torch_dtype)
    b13 = b2 = None
    if cfg.has_bias:
        b13 = (torch.randn(E, N, generator=g) * 0.1).to(device, cfg.torch_dtype)
        b2 = (torch.randn(E, H, generator=g) * 0.1).to(device, cfg.torch_dtype)
    kw = {}
    if quant.static_activation_scale:
        kw = dict(a13_scale=4.0 / 448, a2_scale=4.0 / 448)
    return quantize_experts(w13, w2, quant, w13_bias=b13, w2_bias=b2, **kw)


def _median_time(fn, device, reps: int) -> float:
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


# ----------------------------------------------------------------------------- demo
def cmd_demo(args) -> int:
    from ..layer import FusedMoE
    from ..reference.moe import reference_moe
    from ..tolerances import rel_error, tolerance
    dev = _device(args.device)
    t_start = time.perf_counter()
    preset, cfg, quant = _layer_config(args)
    weights = random_layer(cfg, quant, dev, args.seed)
    bias = None
    if cfg.routing.has_correction_bias:
        bias = torch.randn(cfg.num_experts, generator=torch.Generator().manual_seed(args.seed + 1)).to(dev) * 0.1
    layer = FusedMoE(cfg, weights, backend=args.backend, correction_bias=bias)
    g = torch.Generator(device="cpu").manual_seed(args.seed + 2)
    x = torch.randn(args.tokens, cfg.hidden_size, generator=g).to(dev, cfg.torch_dtype)
    logits = torch.randn(args.tokens, cfg.num_experts, generator=g).to(dev)
    out = layer(x, logits)
    tw, ti = layer.route(x, logits)
    ref = reference_moe(x, layer.weights if layer.weights.scheme == quant else weights, tw, ti, cfg)
    err = rel_error(out, ref)
    tol = tolerance(cfg.dtype, quant.method)
    secs = _median_time(lambda: layer(x, logits), dev, args.repeat)
    flops = 6 * args.tokens * cfg.top_k * cfg.hidden_size * cfg.intermediate_size if cfg.is_gated else \
        4 * args.tokens * cfg.top_k * cfg.hidden_size * cfg.intermediate_size
    data = {"model": preset.name, "config": repr(cfg), "quant": quant.name, "device": str(dev),
            "tokens": args.tokens, "selection": layer.selection.to_dict(), "backend": layer.selection.winner,
            "rel_error_vs_torch_ref": err, "tolerance": tol, "within_tolerance": err <= tol,
            "median_time_us": secs * 1e6, "tflops": flops / secs / 1e12,
            "wall_s": time.perf_counter() - t_start}
    text = "\n".join([layer.selection.explain(), "",
                      f"model {preset.name}  quant {quant.name}  T={args.tokens}  device {dev}",
                      f"backend {layer.selection.winner}: rel. error vs torch_ref {err:.3e} "
                      f"(tolerance {tol:.0e}: {'OK' if err <= tol else 'FAIL'})",
                      f"median time {secs * 1e6:.1f} us  ({flops / secs / 1e12:.3f} TFLOP/s)"])
    _emit(args, data, text)
    return 0 if err <= tol else 1


# ----------------------------------------------------------------------------- explain
def cmd_explain(args) -> int:
    from ..oracle import select_backend
    from ..platform import Platform
    _, cfg, quant = _layer_config(args)
    sel = select_backend(cfg, quant, Platform.resolve(args.platform), args.backend,
                         deterministic=args.deterministic, log_once=False)
    _emit(args, sel.to_dict(), sel.explain())
    return 0


def cmd_backends(args) -> int:
    from ..backends.registry import registered
    tables = [s.capability_table() for s in registered().values()]
    lines = []
    for t in tables:
        lines.append(f"{t['name']}: {t['description']}")
        for k in ("quant", "activations", "formats", "devices", "min_sm", "quant_min_sm", "parallel",
                  "deterministic", "cuda_graph_safe", "max_tokens", "bias", "clamp", "native"):
            v = t[k]
            lines.append(f"    {k:16s} {', '.join(map(str, v)) if isinstance(v, list) else v}")
    _emit(args, {"backends": tables}, "\n".join(lines))
    return 0


def cmd_models(args) -> int:
    from ..presets import PRESETS
    rows = []
    for p in PRESETS.values():
        rows.append({"name": p.name, "hf_name": p.hf_name, "num_experts": p.num_experts, "top_k": p.top_k,
                     "hidden_size": p.hidden_size, "intermediate_size": p.intermediate_size,
                     "activation": str(p.activation), "routing": repr(p.routing), "quant": p.quant,
                     "has_bias": p.has_bias, "num_shared_experts": p.num_shared_experts})
    text = "\n".join(f"{r['name']:18s} E={r['num_experts']:<4d} k={r['top_k']:<2d} H={r['hidden_size']:<5d} "
                     f"I={r['intermediate_size']:<6d} {r['activation']:10s} quant={r['quant']}" for r in rows)
    _emit(args, {"models": rows}, text)
    return 0


# ----------------------------------------------------------------------------- check
def cmd_check(args) -> int:
    """Conformance of every backend that can serve each scheme on this machine (small shapes)."""
    from ..backends.registry import registered
    from ..config import MoEConfig, QuantMethod, QuantScheme
    from ..layer import platform_for, prepare_experts
    from ..oracle import select_backend
    from ..reference.moe import reference_moe
    from ..tolerances import rel_error, tolerance
    dev = _device(args.device)
    plat = platform_for(dev)
    dtype = "bfloat16" if dev.type == "cuda" else "float32"
    cfg = MoEConfig(num_experts=6, top_k=2, hidden_size=256, intermediate_size=128, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 256, generator=g).to(dev, cfg.torch_dtype)
    logits = torch.randn(37, 6, generator=g)
    tw, ti = torch.softmax(logits, -1).topk(2)
    tw, ti = (tw / tw.sum(-1, keepdim=True)).to(dev), ti.to(dev, torch.int32)
    results = []
    for m in QuantMethod:
        quant = QuantScheme(m)
        weights = random_layer(cfg, quant, dev)
        ref = reference_moe(x, weights, tw, ti, cfg)
        for name in registered():
            for fmt in ("standard", "batched"):
                try:
                    select_backend(cfg, quant, plat, name, fmt=fmt, log_once=False)
                except FusedMoEError:
                    continue
                try:
                    pe = prepare_experts(cfg, weights, name, platform=plat, fmt=fmt)
                    err = rel_error(pe(x, tw, ti), ref)
                    tol = tolerance(dtype, m)
                    results.append({"quant": m.value, "backend": name, "format": fmt, "rel_error": err,
                                    "tolerance": tol, "ok": err <= tol})
                except Exception as e:  # report, never hide
                    results.append({"quant": m.value, "backend": name, "format": fmt, "error": repr(e), "ok": False})
    bad = [r for r in results if not r["ok"]]
    text = "\n".join(f"{'PASS' if r['ok'] else 'FAIL'} {r['quant']:13s} {r['backend']:15s} {r['format']:9s} "
                     + (f"err {r['rel_error']:.2e} (tol {r['tolerance']:.0e})" if "rel_error" in r else r["error"])
                     for r in results)
    _emit(args, {"device": str(dev), "results": results, "failures": len(bad)},
          text + f"\n{len(results) - len(bad)}/{len(results)} passed")
    return 1 if bad else 0


# ----------------------------------------------------------------------------- parser
def _add_layer_args(p, default_model="olmoe-1b-7b", tp_default=1):
    p.add_argument("--model", default=default_model, help="preset name or path to a HF config.json")
    p.add_argument("--quant", default=None, help="quant scheme (default: the model's native one)")
    p.add_argument("--tp", type=int, default=tp_default, help="tensor-parallel size dividing the intermediate size")
    p.add_argument("--backend", default="auto", help="backend name or auto")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fusedmoe", description="Fused Mixture-of-Experts kernels that pick themselves.")
    ap.add_argument("--version", action="version", version=f"fusedmoe {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log the selection (INFO)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="build a preset's MoE layer, select, run, check vs torch_ref, time")
    _add_layer_args(p, tp_default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("explain", help="the full selection report for this machine or a named one")
    _add_layer_args(p)
    p.add_argument("--platform", default="current", help="current, cpu, a100, h100, h200, b200")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("backends", help="each registered backend and its capability table")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backends)

    p = sub.add_parser("models", help="the model presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("check", help="conformance of every backend on this machine vs torch_ref")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    for name, modname, helptext in (("bench", "bench", "benchmark backends and peers against the roofline"),
                                    ("tune", "tune", "search Triton launch configs and write the JSON")):
        try:
            mod = __import__(f"fusedmoe.cli.{modname}", fromlist=["main"])
        except ImportError as e:  # pragma: no cover - reported when the command is used
            p = sub.add_parser(name, help=helptext + f" (unavailable: {e})")
            p.set_defaults(func=lambda a, e=e: (_ for _ in ()).throw(RuntimeError(str(e))))
            continue
        p = sub.add_parser(name, help=helptext)
        mod.add_arguments(p)
        if not any(a.dest == "json" for a in p._actions):
            p.add_argument("--json", nargs="?", const=True, default=False)
        p.set_defaults(func=mod.main)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not getattr(args, "command", None):
        ap.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (FusedMoEError, ValueError, TypeError) as e:
        msg = " ".join(line.strip() for line in str(e).strip().splitlines())   # one line, always
        print(f"fusedmoe {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
