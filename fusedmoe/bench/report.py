"""The results of a run: measurements, the report and its JSON, speedups, the summary, the text table."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ..config import MoEConfig
from .roofline import Ceilings

__all__ = ["SCHEMA", "ShapeInfo", "Measurement", "BenchReport", "summarize", "format_table", "format_summary"]

SCHEMA = "fusedmoe.bench/1"


@dataclass(frozen=True)
class ShapeInfo:
    name: str
    E: int
    k: int
    H: int
    I: int
    activation: str
    dtype: str
    tp: int
    config: str                     # repr(MoEConfig): eval() rebuilds it

    @classmethod
    def of(cls, name: str, config: MoEConfig, tp: int = 1) -> "ShapeInfo":
        return cls(name, config.num_experts, config.top_k, config.hidden_size, config.intermediate_size,
                   config.activation.value, config.dtype, tp, repr(config))


@dataclass(frozen=True)
class Measurement:
    shape: str
    scheme: str
    T: int
    impl: str
    kind: str                        # fusedmoe | peer
    status: str                      # ok | wrong | failed | unsupported
    reason: str = ""
    us_graph: Optional[float] = None
    us_eager: Optional[float] = None
    us_best: Optional[float] = None  # min(graph, eager): what a user of this implementation gets
    graph_note: str = ""
    rel_err: Optional[float] = None
    tol: Optional[float] = None
    flops: float = 0.0
    bytes: float = 0.0
    experts_hit: float = 0.0
    roofline_us: Optional[float] = None
    tflops: Optional[float] = None
    gbps: Optional[float] = None
    pct_roofline: Optional[float] = None
    speedup_vs_best_peer: Optional[float] = None        # best peer's us_best / this us_best
    eager_speedup_vs_best_peer: Optional[float] = None  # the same, eager vs eager
    auto_selected: bool = False
    n_sets: int = 0
    l2_note: str = ""


@dataclass(frozen=True)
class BenchReport:
    schema: str
    meta: dict
    ceilings: Ceilings
    shapes: tuple
    results: tuple
    summary: dict

    def to_dict(self) -> dict:
        return {"schema": self.schema, "meta": self.meta, "ceilings": dataclasses.asdict(self.ceilings),
                "shapes": [dataclasses.asdict(s) for s in self.shapes],
                "results": [dataclasses.asdict(r) for r in self.results], "summary": self.summary}

    def to_json(self, path: Optional[str] = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, default=_json_default)
        if path and path != "-":
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def _compares_with(peer_scheme: str, scheme: str) -> bool:
    """Whether a peer row run at ``peer_scheme`` is a baseline for rows of ``scheme``: the 16-bit
    peers are for every scheme, a peer run with quantized weights for its own scheme only."""
    return peer_scheme in ("none", scheme)


def _with_speedups(results: list) -> list:
    """Fill speedup_vs_best_peer: the best peer of the same (shape, T) that compares with this
    row's scheme (``_compares_with``) over this row's time."""
    best_peer, best_peer_eager = {}, {}      # {(shape, T, peer scheme): µs}
    for r in results:
        if r.kind == "peer" and r.status == "ok":
            key = (r.shape, r.T, r.scheme)
            if r.us_best and (key not in best_peer or r.us_best < best_peer[key]):
                best_peer[key] = r.us_best
            if r.us_eager and (key not in best_peer_eager or r.us_eager < best_peer_eager[key]):
                best_peer_eager[key] = r.us_eager

    def best(table, r):
        ts = [t for (shape, T, ps), t in table.items() if (shape, T) == (r.shape, r.T) and _compares_with(ps, r.scheme)]
        return min(ts) if ts else None
    out = []
    for r in results:
        bp, bpe = best(best_peer, r), best(best_peer_eager, r)
        sp = bp / r.us_best if r.status == "ok" and bp and r.us_best else None
        se = bpe / r.us_eager if r.status == "ok" and bpe and r.us_eager else None
        out.append(dataclasses.replace(r, speedup_vs_best_peer=sp, eager_speedup_vs_best_peer=se))
    return out


def _geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(results: Sequence[Measurement]) -> dict:
    """Per (shape, scheme, T): best fusedmoe backend vs best peer; per scheme: geomean speedup
    and how many points fusedmoe matches or beats the best peer (best and auto-selected backend)."""
    ok = [r for r in results if r.status == "ok"]
    points = []
    keys = sorted({(r.shape, r.scheme, r.T) for r in ok if r.kind == "fusedmoe"}, key=lambda k: (k[0], k[1], k[2]))
    for shape, scheme, T in keys:
        fm = [r for r in ok if r.kind == "fusedmoe" and (r.shape, r.scheme, r.T) == (shape, scheme, T)]
        pe = [r for r in ok if r.kind == "peer" and (r.shape, r.T) == (shape, T) and _compares_with(r.scheme, scheme)]
        bf = min(fm, key=lambda r: r.us_best)
        auto = next((r for r in fm if r.auto_selected), None)
        bp = min(pe, key=lambda r: r.us_best) if pe else None
        points.append({
            "shape": shape, "scheme": scheme, "T": T,
            "best_fusedmoe": bf.impl, "best_fusedmoe_us": bf.us_best,
            "auto": auto.impl if auto else None, "auto_us": auto.us_best if auto else None,
            "best_peer": bp.impl if bp else None, "best_peer_us": bp.us_best if bp else None,
            "speedup": bp.us_best / bf.us_best if bp else None,
            "auto_speedup": bp.us_best / auto.us_best if bp and auto else None,
            "fusedmoe_ge_peer": (bf.us_best <= bp.us_best) if bp else None,
            "pct_roofline": bf.pct_roofline,
        })
    per_scheme = {}
    for scheme in sorted({p["scheme"] for p in points}):
        ps = [p for p in points if p["scheme"] == scheme and p["speedup"] is not None]
        per_scheme[scheme] = {
            "points": len(ps), "wins": sum(1 for p in ps if p["fusedmoe_ge_peer"]),
            "geomean_speedup": _geomean([p["speedup"] for p in ps]),
            "geomean_speedup_auto": _geomean([p["auto_speedup"] for p in ps if p["auto_speedup"]]),
            "min_speedup": min((p["speedup"] for p in ps), default=None),
        }
    problems, seen = [], set()
    for r in results:   # one entry per (shape, scheme, impl, status, reason); T lists where
        if r.status not in ("wrong", "failed"):
            continue
        key = (r.shape, r.scheme, r.impl, r.status, r.reason if r.status == "failed" else "")
        if key in seen:
            next(p for p in problems if p["key"] == key)["T"].append(r.T)
            continue
        seen.add(key)
        problems.append({"key": key, "shape": r.shape, "scheme": r.scheme, "T": [r.T], "impl": r.impl,
                         "status": r.status, "reason": r.reason})
    for p in problems:
        del p["key"]
    return {"per_scheme": per_scheme, "points": points, "problems": problems,
            "wrong_fusedmoe": sum(1 for r in results if r.kind == "fusedmoe" and r.status == "wrong")}


# ==============================================================================================
# text output
# ==============================================================================================
def _f(v, fmt: str, width: int) -> str:
    return (format(v, fmt) if v is not None else "-").rjust(width)


def format_table(report: BenchReport) -> str:
    """One block per (shape, scheme): µs graph / µs eager / TFLOP/s / GB/s / % roofline / vs best peer."""
    c = report.ceilings
    lines = [f"device: {c.device}   ceilings (measured): copy {c.copy_gbps:.4g} GB/s, matmul {c.matmul_tflops:.4g} TFLOP/s"
             + (f", fp8 {c.fp8_tflops:.4g} TFLOP/s" if c.fp8_tflops else "") + (f"   ({c.note})" if c.note else "")]
    groups = {}
    for r in report.results:
        groups.setdefault((r.shape, r.scheme), []).append(r)
    head = (f"{'T':>6} {'implementation':<22} {'us graph':>10} {'us eager':>10} {'TFLOP/s':>8} {'GB/s':>8} "
            f"{'%roof':>6} {'vs peer':>8}  note")
    for (shape, scheme), rows in groups.items():
        lines += ["", f"== {shape}  scheme={scheme} =="]
        never = {}
        for r in rows:
            if r.status == "unsupported":
                never.setdefault((r.impl, r.reason), []).append(r.T)
        for (impl, reason), Ts in never.items():
            lines.append(f"   not run: {impl}: {reason[:140]}")
        lines.append(head)
        for r in sorted(rows, key=lambda r: (r.T, r.kind != "fusedmoe", r.impl)):
            name = r.impl + ("*" if r.auto_selected else "")
            if r.status == "unsupported":
                continue
            if r.status != "ok":
                lines.append(f"{r.T:>6} {name:<22} {r.status.upper():>10}  {r.reason[:110]}")
                continue
            sp = f"{r.speedup_vs_best_peer:.2f}x" if r.speedup_vs_best_peer else "-"
            note = r.graph_note.split(":")[0] if r.us_graph is None and r.graph_note else ""
            lines.append(f"{r.T:>6} {name:<22} {_f(r.us_graph, '.1f', 10)} {_f(r.us_eager, '.1f', 10)} "
                         f"{_f(r.tflops, '.1f', 8)} {_f(r.gbps, '.0f', 8)} {_f(r.pct_roofline, '.1f', 6)} "
                         f"{sp:>8}  {note}")
    lines.append("")
    lines.append("* = the backend fusedmoe selects by default; 'vs peer' = best peer time / this time "
                 "(min of graph and eager for each).")
    return "\n".join(lines)


def format_summary(report: BenchReport) -> str:
    s = report.summary
    lines = ["summary (best fusedmoe backend vs best peer, geomean over token counts):"]
    if not s["per_scheme"]:
        lines.append("  no point with both a fusedmoe backend and a peer measured")
    for scheme, v in s["per_scheme"].items():
        gm = f"{v['geomean_speedup']:.2f}x" if v["geomean_speedup"] else "-"
        ga = f"{v['geomean_speedup_auto']:.2f}x" if v["geomean_speedup_auto"] else "-"
        mn = f"{v['min_speedup']:.2f}x" if v["min_speedup"] else "-"
        own = scheme != "none" and any(r.kind == "peer" and r.scheme == scheme and r.status == "ok" for r in report.results)
        peers16 = "" if scheme == "none" else f" (vs 16-bit and {scheme} peers)" if own else " (vs 16-bit peers)"
        lines.append(f"  {scheme}{peers16}: geomean {gm} (auto-selected: {ga}), worst {mn}, "
                     f"fusedmoe >= best peer at {v['wins']}/{v['points']} points")
    for p in s["points"]:
        if p["fusedmoe_ge_peer"] is False:
            lines.append(f"  slower than {p['best_peer']}: {p['shape']} {p['scheme']} T={p['T']} "
                         f"({p['best_fusedmoe']} {p['best_fusedmoe_us']:.1f} us vs {p['best_peer_us']:.1f} us)")
    for p in s["problems"]:
        Ts = ",".join(str(t) for t in p["T"])
        lines.append(f"  {p['status'].upper()}: {p['impl']} {p['shape']} {p['scheme']} T={Ts}: {p['reason'][:160]}")
    return "\n".join(lines)
