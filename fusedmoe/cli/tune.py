"""``fusedmoe tune``: measure Triton launch configs for a model's MoE layer on this GPU and
write the JSON file the Triton backends look up.

    fusedmoe tune --model qwen3-30b-a3b --tokens 1,16,64,256,1024,4096,16384
    FUSEDMOE_CONFIG_DIR=~/moe-configs fusedmoe tune --model deepseek-v3 --tp 8 --quant fp8_block

The file goes to --out-dir, else FUSEDMOE_CONFIG_DIR, else the package's
fusedmoe/kernels/configs/ (the shipped configs). A progress bar goes to stderr.
"""
from __future__ import annotations

import json
import sys

__all__ = ["add_arguments", "main"]


def add_arguments(p) -> None:
    from ..tuner import DEFAULT_TUNE_TOKENS
    default_tokens = ",".join(str(t) for t in DEFAULT_TUNE_TOKENS)
    p.add_argument("--model", default=None, help="preset name or HF config.json path (see `fusedmoe models`)")
    p.add_argument("--shape", default=None, metavar="E,k,H,I[,activation]", help="a custom shape instead of --model")
    p.add_argument("--tp", type=int, default=1, help="tensor parallelism: divides the intermediate size")
    p.add_argument("--quant", default="none", help="scheme to tune for, or 'native' (default: none = 16-bit)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--tokens", default=default_tokens, help=f"token counts to tune (default {default_tokens})")
    p.add_argument("--out-dir", default=None, help="folder to write into (default: FUSEDMOE_CONFIG_DIR or the package's)")
    p.add_argument("--skew", type=float, default=None, metavar="ALPHA",
                   help="tune on Dirichlet(ALPHA)-skewed routing (distribution-aware, FlashInfer #4106)")
    p.add_argument("--backend", default=None,
                   help="backend to time (default: triton, the one that reads tuned configs)")
    p.add_argument("--budget-ms", type=float, default=60.0, help="timing budget per candidate (ms)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing config file that is unreadable or malformed (default: refuse, saying why)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="print (or write to PATH) the result as JSON")
    p.add_argument("--no-progress", action="store_true")


def main(args) -> int:
    from ..cli.bench import _csv, parse_shapes
    from ..errors import ConfigError
    from ..platform import Platform
    from ..tuner import tune

    if bool(args.model) == bool(args.shape):
        raise ConfigError("--model", args.model, "exactly one of --model or --shape", "e.g. --model qwen3-30b-a3b")
    if args.model and "," in args.model:
        raise ConfigError("--model", args.model, "one model per run", "run `fusedmoe tune` once per model")
    shim = type("A", (), {"model": args.model, "shape": [args.shape] if args.shape else [], "tp": args.tp,
                          "dtype": args.dtype})()
    name, config, _, native = parse_shapes(shim)[0]
    scheme = native if args.quant == "native" else args.quant
    tokens = [int(t) for t in _csv(args.tokens)]
    path = tune(config, scheme, tokens, platform=Platform.current(), out_dir=args.out_dir,
                progress=not args.no_progress, skew=args.skew, backend=args.backend, seed=args.seed,
                budget_ms=args.budget_ms, force=args.force)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    points = data.get("meta", {}).get("points", {})
    lines = [f"wrote {path}"]
    for T, p in points.items():
        sp = f"{p['speedup_vs_default']:.2f}x vs default" if p.get("speedup_vs_default") else "default not timed"
        lines.append(f"  T={T:>6}: {p['tuned_us']:.1f} us ({sp}; {p['candidates']} candidates)")
    lines.append("The Triton backends pick it up at construction when it is in FUSEDMOE_CONFIG_DIR or the package folder.")
    result = {"model": name, "path": path, "file": data}
    if args.json:
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
            print("\n".join(lines), file=sys.stderr)
            return 0
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print("\n".join(lines))
    return 0
