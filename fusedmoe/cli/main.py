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


def _progress(args, msg: str) -> None:
    """A progress line on stderr (work that takes minutes says what it is doing); none with --json."""
    if not getattr(args, "json", False):
        print(f"fusedmoe {args.command}: {msg}", file=sys.stderr, flush=True)


def _check_tp(preset, quant, tp: int) -> None:
    """Refuse, before anything is built, a --tp whose shard ``quant`` cannot hold, naming the
    --tp values that work."""
    from ..errors import ConfigError
    ok = preset.fitting_tps(quant)
    if tp in ok or preset.intermediate_size % tp:       # a tp that does not divide I: to_config says so
        return
    m = quant.k_multiple
    raise ConfigError("--tp", tp, ok or "none (hidden_size is not a multiple of the scheme's K-group)",
                      f"use --tp {max(ok)}" if ok else f"use another --quant than {quant.name}",
                      problem=f"shards {preset.name}'s intermediate size {preset.intermediate_size} to "
                              f"{preset.intermediate_size // tp}, not a multiple of {m} ({quant.name})")


def _layer_config(args, tp=None):
    from ..config import QuantScheme
    from ..presets import get_preset
    p = get_preset(args.model)
    quant = QuantScheme.parse(args.quant if args.quant else p.quant)
    tp = args.tp if tp is None else tp
    _check_tp(p, quant, tp)
    dtype = getattr(args, "dtype", None) or "bfloat16"
    cfg = p.to_config(tp=tp, dtype=dtype)
    return p, cfg, quant


def random_layer(cfg, quant, device, seed: int = 0):
    """Seeded random 16-bit experts of ``cfg`` quantized to ``quant`` -> ExpertWeights.

    Scaled like a trained layer (std 1/sqrt(fan_in)) so activations stay O(1)."""
    from ..quantize import quantize_experts
    g = torch.Generator(device="cpu").manual_seed(seed)
    E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    # scaled in place: one fp32 temporary per tensor, not two (the demo's memory estimate counts one)
    w13 = torch.randn(E, N, H, generator=g).div_(H ** 0.5).to(device, cfg.torch_dtype)
    w2 = torch.randn(E, H, I, generator=g).div_(I ** 0.5).to(device, cfg.torch_dtype)
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
_GiB = 2 ** 30
_DEMO_TP = 4          # the default shard: a 4-GPU tensor-parallel layer


def available_bytes(device: torch.device):
    """Memory the demo may allocate: free GPU memory on CUDA, MemAvailable of /proc/meminfo on
    Linux; None where neither can be read (no check then)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def demo_bytes(cfg, quant, backend: str) -> int:
    """Peak bytes the demo allocates, estimated: the experts in the build dtype, the quantized
    copy, the reference's fp32 dequantized copy, the largest fp32 temporary of the random
    generation, the 16-bit copy the ``emulation`` backend dequantizes into, and 0.5 GiB for
    the process itself (Qwen3-30B-A3B tp 4 fp8_block on CPU: estimated 2.3 GiB, peak RSS 2.1)."""
    E, N, H, I = cfg.num_local_experts, cfg.n13, cfg.hidden_size, cfg.intermediate_size
    p13, p2 = E * N * H, E * H * I
    p, b = p13 + p2, cfg.torch_dtype.itemsize
    q = 0 if quant.method.value == "none" else quant.method.weight_bits / 8
    return int(p * (b + q + 4) + max(p13, p2) * 4 + (p * b if backend == "emulation" else 0) + _GiB // 2)


def demo_plan(args, dev):
    """(preset, cfg, quant, notes, estimated bytes): the layer the demo will build, checked before anything is
    allocated. --tp unset: 4, or the largest tp <= 4 whose shard the scheme can hold, grown
    until the estimate fits in memory (each change is a note); an explicit --tp that cannot
    work is a one-line error naming one that does."""
    from ..config import QuantScheme
    from ..errors import ConfigError
    from ..layer import platform_for
    from ..oracle import select_backend
    from ..presets import get_preset
    preset = get_preset(args.model)
    quant = QuantScheme.parse(args.quant if args.quant else preset.quant)
    notes = [preset.quant_note] if preset.quant_note else []
    ok = preset.fitting_tps(quant)
    if args.tp is None:
        if not ok:
            _check_tp(preset, quant, _DEMO_TP)            # raises: no tp fits the scheme
        tp = _DEMO_TP if _DEMO_TP in ok else max([t for t in ok if t <= _DEMO_TP] or [min(ok)])
        if tp != _DEMO_TP:
            notes.append(f"--tp {tp}: at tp {_DEMO_TP} the intermediate size {preset.intermediate_size // _DEMO_TP} "
                         f"is not a multiple of {quant.k_multiple} ({quant.name})")
    else:
        tp = args.tp
    p, cfg, quant = _layer_config(args, tp)
    plat = platform_for(dev)
    backend = select_backend(cfg, quant, plat, args.backend, log_once=False).winner
    avail = available_bytes(dev)
    need = demo_bytes(cfg, quant, backend)
    if avail is not None and need > avail:
        fits = [t for t in ok if t > tp and demo_bytes(p.to_config(tp=t, dtype=cfg.dtype), quant, backend) <= avail]
        where = "free on the GPU" if dev.type == "cuda" else "available (MemAvailable)"
        if fits and args.tp is None:
            notes.append(f"--tp {fits[0]}: at tp {tp} the demo would allocate ~{need / _GiB:.1f} GiB, "
                         f"{avail / _GiB:.1f} GiB are {where}")
            tp = fits[0]
            p, cfg, quant = _layer_config(args, tp)
            need = demo_bytes(cfg, quant, backend)
        else:
            raise ConfigError("--tp", tp, f"a --tp whose layer fits in memory: {', '.join(map(str, fits))}" if fits
                              else "a smaller layer: no --tp of this model fits",
                              f"use --tp {fits[0]}" if fits else "use a smaller model preset, or a machine with "
                              f"~{need / _GiB:.0f} GiB free",
                              problem=f"needs ~{need / _GiB:.1f} GiB for {p.name} ({quant.name}, {cfg.dtype}) but "
                                      f"{avail / _GiB:.1f} GiB are {where}")
    return p, cfg, quant, notes, need


def cmd_demo(args) -> int:
    from ..errors import check_int
    from ..layer import FusedMoE
    from ..reference.moe import reference_moe
    from ..tolerances import rel_error, tolerance
    # checked before anything is built: a bad count used to fail after the layer was built
    check_int("--tokens", args.tokens, min_value=1, hint="e.g. --tokens 32")
    check_int("--repeat", args.repeat, min_value=1, hint="the time is the median of --repeat runs, e.g. --repeat 5")
    check_int("--seed", args.seed, min_value=0, hint="e.g. --seed 0")
    if args.tp is not None:
        check_int("--tp", args.tp, min_value=1, hint="e.g. --tp 4")
    dev = _device(args.device)
    t_start = time.perf_counter()
    preset, cfg, quant, notes, need = demo_plan(args, dev)
    for n in notes:
        _progress(args, f"note: {n}")
    _progress(args, f"building {preset.name}'s experts: E={cfg.num_local_experts} H={cfg.hidden_size} "
                    f"I={cfg.intermediate_size} {cfg.dtype}, quantized to {quant.name} "
                    f"(~{need / _GiB:.1f} GiB at the peak, estimated)")
    weights = random_layer(cfg, quant, dev, args.seed)
    bias = None
    if cfg.routing.has_correction_bias:
        bias = torch.randn(cfg.num_experts, generator=torch.Generator().manual_seed(args.seed + 1)).to(dev) * 0.1
    _progress(args, f"selecting a backend and preparing the layer (backend={args.backend})")
    layer = FusedMoE(cfg, weights, backend=args.backend, correction_bias=bias)
    g = torch.Generator(device="cpu").manual_seed(args.seed + 2)
    x = torch.randn(args.tokens, cfg.hidden_size, generator=g).to(dev, cfg.torch_dtype)
    logits = torch.randn(args.tokens, cfg.num_experts, generator=g).to(dev)
    _progress(args, f"running {args.tokens} tokens on {layer.selection.winner}")
    out = layer(x, logits)
    tw, ti = layer.route(x, logits)
    _progress(args, "checking against the plain-torch reference")
    ref = reference_moe(x, layer.weights if layer.weights.scheme == quant else weights, tw, ti, cfg)
    err = rel_error(out, ref)
    tol = tolerance(cfg.dtype, quant.method)
    _progress(args, f"timing: median of {args.repeat} runs")
    secs = _median_time(lambda: layer(x, logits), dev, args.repeat)
    flops = 6 * args.tokens * cfg.top_k * cfg.hidden_size * cfg.intermediate_size if cfg.is_gated else \
        4 * args.tokens * cfg.top_k * cfg.hidden_size * cfg.intermediate_size
    data = {"model": preset.name, "config": repr(cfg), "quant": quant.name, "device": str(dev),
            "tokens": args.tokens, "selection": layer.selection.to_dict(), "backend": layer.selection.winner,
            "rel_error_vs_torch_ref": err, "tolerance": tol, "within_tolerance": err <= tol,
            "median_time_us": secs * 1e6, "tflops": flops / secs / 1e12,
            "wall_s": time.perf_counter() - t_start, "notes": notes}
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
    preset, cfg, quant = _layer_config(args)
    sel = select_backend(cfg, quant, Platform.resolve(args.platform), args.backend,
                         deterministic=args.deterministic, log_once=False)
    notes = [preset.quant_note] if preset.quant_note else []
    _emit(args, dict(sel.to_dict(), notes=notes), "\n".join([sel.explain()] + [f"note: {n}" for n in notes]))
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
def _interpreter_on_cpu() -> bool:
    """Turn on TRITON_INTERPRET=1 so that the Triton backends run on this CPU as an
    independent path; False where Triton is not installed, or its kernels were already
    compiled for a GPU in this process (``triton.jit`` reads the variable when a kernel
    module is imported)."""
    import importlib.util
    import os
    if importlib.util.find_spec("triton") is None:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    if any(m.startswith("fusedmoe.kernels") for m in sys.modules):
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


# backends whose CPU path is the reference's own math: their 0 error checks the plumbing only
_SAME_MATH = {"torch_ref": "the reference itself", "emulation": "the reference's dequantize + fake-quant math"}


def cmd_check(args) -> int:
    """Conformance of every backend that can serve each scheme on this machine (small shapes)."""
    import dataclasses
    from ..backends.registry import registered
    from ..config import MoEConfig, QuantMethod, QuantScheme
    from ..layer import platform_for, prepare_experts
    from ..oracle import select_backend
    from ..reference.moe import reference_moe
    from ..tolerances import rel_error, tolerance
    dev = _device(args.device)
    plat = platform_for(dev)
    if dev.type == "cpu":
        # without this, every CPU row is the reference's math compared with itself (errors 0)
        interp = _interpreter_on_cpu()
        plat = dataclasses.replace(plat, triton=interp, interpreter=interp)
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
                _progress(args, f"{m.value}: {name} ({fmt})")
                row = {"quant": m.value, "backend": name, "format": fmt,
                       "independent": not (dev.type == "cpu" and name in _SAME_MATH)}
                try:
                    pe = prepare_experts(cfg, weights, name, platform=plat, fmt=fmt)
                    err = rel_error(pe(x, tw, ti), ref)
                    tol = tolerance(dtype, m)
                    results.append(dict(row, rel_error=err, tolerance=tol, ok=err <= tol))
                except Exception as e:  # report, never hide
                    results.append(dict(row, error=repr(e), ok=False))
    bad = [r for r in results if not r["ok"]]
    indep = sorted({r["backend"] for r in results if r["independent"]})
    compared = (f"each backend's output vs fusedmoe.reference.moe.reference_moe (plain torch) on E=6 top-2 H=256 "
                f"I=128, 37 tokens, {dtype}, {dev}")
    if dev.type == "cpu":
        compared += ("; independent implementations: " + (", ".join(indep) if indep else "none") + "; "
                     + "; ".join(f"{b} runs {w} here (its 0 error checks the wiring, not the math)"
                                 for b, w in _SAME_MATH.items() if any(r["backend"] == b for r in results)))
        if not plat.interpreter:
            compared += ("; the Triton kernels did not run (install triton to run them under TRITON_INTERPRET=1, "
                         "in a fresh process)")
        elif not any(r["backend"].startswith("triton") for r in results):
            compared += "; no Triton backend is registered"
        else:
            compared += "; Triton kernels ran under TRITON_INTERPRET=1"
    text = "\n".join(f"{'PASS' if r['ok'] else 'FAIL'} {r['quant']:13s} {r['backend']:15s} {r['format']:9s} "
                     + (f"err {r['rel_error']:.2e} (tol {r['tolerance']:.0e})" if "rel_error" in r else r["error"])
                     + ("" if r["independent"] else "  (same math as the reference)")
                     for r in results)
    _emit(args, {"device": str(dev), "compared": compared, "independent_backends": indep, "results": results,
                 "failures": len(bad)},
          f"compared: {compared}\n" + text + f"\n{len(results) - len(bad)}/{len(results)} passed")
    return 1 if bad else 0


# ----------------------------------------------------------------------------- parser
def _add_layer_args(p, default_model="olmoe-1b-7b", tp_default=1):
    p.add_argument("--model", default=default_model, help="preset name or path to a HF config.json")
    p.add_argument("--quant", default=None, help="quant scheme (default: the model's native one)")
    p.add_argument("--tp", type=int, default=tp_default,
                   help="tensor-parallel size dividing the intermediate size" + (
                       f" (default {_DEMO_TP}, or the tp the scheme and the memory allow, with a note)"
                       if tp_default is None else f" (default {tp_default})"))
    p.add_argument("--backend", default="auto", help="backend name or auto")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fusedmoe", description="Fused Mixture-of-Experts kernels that pick themselves.")
    ap.add_argument("--version", action="version", version=f"fusedmoe {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log the selection (INFO)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="build a preset's MoE layer, select, run, check vs torch_ref, time")
    _add_layer_args(p, tp_default=None)
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
