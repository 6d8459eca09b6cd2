"""``fusedmoe bench``: every backend that can serve each case and the peers a user would pick
instead, side by side against the measured roofline.

    fusedmoe bench --model deepseek-v3 --tp 8 --tokens 1,16,64,256,1024,4096,16384 \\
                   --quant none,fp8_block --json out.json --plot out.png

Progress goes to stderr; the table and summary to stdout (to stderr when ``--json`` alone
sends the JSON to stdout). Exit status 1 when a fusedmoe backend gave a wrong result.
"""
from __future__ import annotations

import sys

__all__ = ["add_arguments", "main", "parse_shapes"]

DEFAULT_TOKENS = "1,16,64,256,1024,4096,16384"


def add_arguments(p) -> None:
    p.add_argument("--model", default=None,
                   help="preset name(s), comma-separated (see `fusedmoe models`), or a HF config.json path")
    p.add_argument("--shape", action="append", default=[], metavar="E,k,H,I[,activation]",
                   help="a custom shape (repeatable), e.g. 64,8,2048,1024 or 8,2,128,64,gelu")
    p.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"token counts T (default {DEFAULT_TOKENS})")
    p.add_argument("--tp", type=int, default=1, help="tensor parallelism: divides the intermediate size")
    p.add_argument("--quant", default="none",
                   help="scheme(s), comma-separated: none, fp8_block, ... or 'native' (the preset's own)")
    p.add_argument("--backend", default="all",
                   help="fusedmoe backends: 'all' that can serve (default), 'auto' (the selected one), or names")
    p.add_argument("--peers", default="all",
                   help="peers: 'all' (default: every one whose package is installed), 'none', or names: "
                        "torch_loop, torch_grouped_mm, hf_eager, hf_batched_mm, hf_grouped_mm, vllm, sglang")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--repeat", type=int, default=None,
                   help="timed repetitions per point (default: as many as fit ~200 ms, 5..200)")
    p.add_argument("--no-graph", action="store_true", help="eager timing only (no CUDA-graph replay)")
    p.add_argument("--skew", type=float, default=None, metavar="ALPHA",
                   help="Dirichlet(ALPHA)-skewed expert popularity (default: uniform random routing)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write the full report as JSON to PATH ('-' or no PATH: stdout)")
    p.add_argument("--plot", default=None, metavar="PNG", help="write a plot (needs matplotlib)")
    p.add_argument("--plot-metric", default="pct_roofline", choices=["pct_roofline", "us_best", "tflops"])
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")


def _csv(s) -> list:
    return [x.strip() for x in str(s).split(",") if x.strip()]


def parse_shapes(args) -> list:
    """[(name, MoEConfig, tp)] from --model and --shape."""
    from ..config import MoEConfig
    from ..errors import ConfigError
    shapes = []
    for name in _csv(args.model or ""):
        from ..presets import get_preset
        p = get_preset(name)
        label = p.name + (f"/tp{args.tp}" if args.tp != 1 else "")
        shapes.append((label, p.to_config(tp=args.tp, dtype=args.dtype), args.tp, p.quant))
    for spec in args.shape or []:
        parts = _csv(spec)
        try:
            E, k, H, I = (int(v) for v in parts[:4])
        except ValueError:
            raise ConfigError("--shape", spec, "E,k,H,I[,activation] integers", "e.g. --shape 64,8,2048,1024") from None
        if len(parts) not in (4, 5):
            raise ConfigError("--shape", spec, "E,k,H,I[,activation]", "e.g. --shape 8,2,128,64,silu")
        act = parts[4] if len(parts) == 5 else "silu"
        if I % args.tp:
            raise ConfigError("--tp", args.tp, f"a divisor of I={I}", "pick a tp that divides the intermediate size")
        cfg = MoEConfig(E, k, H, I // args.tp, activation=act, dtype=args.dtype)
        shapes.append((f"E{E}k{k}H{H}I{I // args.tp}" + ("" if act == "silu" else f"-{act}"), cfg, args.tp, "none"))
    if not shapes:
        raise ConfigError("--model", None, "a preset name (fusedmoe models) or --shape E,k,H,I",
                          "e.g. fusedmoe bench --model qwen3-30b-a3b", problem="is missing")
    return shapes


def _schemes(args, shapes) -> list:
    from ..config import QuantScheme
    out = []
    for q in _csv(args.quant):
        names = [s[3] for s in shapes] if q == "native" else [q]
        for n in names:
            name = QuantScheme.parse(n).name
            if name not in out:
                out.append(name)
    return out or ["none"]


def main(args) -> int:
    import torch

    from ..bench import harness, plot
    from ..errors import ConfigError

    shapes = parse_shapes(args)
    tokens = sorted({int(t) for t in _csv(args.tokens)})
    if not tokens or tokens[0] < 1:
        raise ConfigError("--tokens", args.tokens, "positive integers, comma-separated", f"e.g. {DEFAULT_TOKENS}")
    dev = args.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", dev, ["cpu", "auto"], "this machine has no CUDA device")
    peer_names = args.peers if args.peers in ("all", "none") else _csv(args.peers)
    if isinstance(peer_names, list):     # asked for by name: a missing package is a user error
        from ..bench.peers import check_installed
        check_installed(peer_names)
    from ..layer import platform_for
    plat = platform_for(torch.device(dev))
    spec = harness.BenchSpec(
        shapes=[(n, c, tp) for n, c, tp, _ in shapes], tokens=tokens, schemes=_schemes(args, shapes),
        backends=args.backend if args.backend in ("all", "auto") else _csv(args.backend),
        peers=peer_names,
        graph=not args.no_graph and dev == "cuda", repeat=args.repeat, seed=args.seed, skew=args.skew,
        platform=plat, device=dev)
    json_stdout = args.json == "-"
    out = sys.stderr if json_stdout else sys.stdout
    report = harness.run_bench(spec, progress=not args.no_progress)
    print(harness.format_table(report), file=out)
    print(harness.format_summary(report), file=out)
    if args.json:
        text = report.to_json(None if json_stdout else args.json)
        if json_stdout:
            print(text)
        else:
            print(f"wrote {args.json}", file=out)
    if args.plot:
        path = plot.plot_report(report, args.plot, args.plot_metric, warn=lambda m: print(m, file=sys.stderr))
        if path:
            print(f"wrote {path}", file=out)
    return 1 if report.summary["wrong_fusedmoe"] else 0
