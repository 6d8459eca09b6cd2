"""A PNG of a bench report: one panel per shape, x = tokens (log), one line per implementation.

matplotlib is optional: ``plot_report`` returns None and says why when it is missing.
"""
from __future__ import annotations

import math
from typing import Optional

__all__ = ["plot_report", "METRICS"]

METRICS = {"pct_roofline": "% of roofline", "us_best": "time per call (us)", "tflops": "TFLOP/s"}


def _series(report, shape: str, metric: str) -> dict:
    """{label: [(T, value)]} for the ok rows of one shape; label = impl [scheme] (peers: impl, with
    [scheme] when run with quantized weights)."""
    schemes = {r.scheme for r in report.results if r.shape == shape and r.kind == "fusedmoe"}
    out = {}
    for r in report.results:
        if r.shape != shape or r.status != "ok":
            continue
        v = getattr(r, metric)
        if v is None:
            continue
        if r.kind == "peer":     # a peer run with quantized weights is its own series
            label = r.impl + ("" if r.scheme == "none" else f" [{r.scheme}]")
        else:
            label = "fusedmoe:" + r.impl + (f" [{r.scheme}]" if len(schemes) > 1 else "")
        out.setdefault((r.kind != "fusedmoe", label), []).append((r.T, v))
    return {k: sorted(v) for k, v in sorted(out.items())}


def plot_report(report, path: str, metric: str = "pct_roofline", *, warn=print) -> Optional[str]:
    """Write the PNG to ``path``; return the path, or None (with a message) without matplotlib."""
    if metric not in METRICS:
        from ..errors import ConfigError  # noqa: PLC0415
        raise ConfigError("metric", metric, list(METRICS), "plot % of roofline or the time per call")
    try:
        import matplotlib  # noqa: PLC0415
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        warn(f"matplotlib is not installed: skipped the plot {path} (pip install matplotlib; the JSON has every number)")
        return None
    shapes = [s.name for s in report.shapes]
    if not shapes:
        warn("nothing to plot")
        return None
    cols = min(3, len(shapes))
    rows = math.ceil(len(shapes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    for i, shape in enumerate(shapes):
        ax = axes[i // cols][i % cols]
        for (is_peer, label), pts in _series(report, shape, metric).items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if not is_peer else "x", linestyle="-" if not is_peer else "--",
                    linewidth=2 if not is_peer else 1.2, label=label)
        ax.set_xscale("log", base=2)
        ts = sorted({r.T for r in report.results if r.shape == shape})
        if ts:
            ax.set_xticks(ts)
            ax.set_xticklabels([str(t) for t in ts], fontsize=8)
        if metric == "us_best":
            ax.set_yscale("log")
        ax.set_title(shape)
        ax.set_xlabel("tokens T")
        ax.set_ylabel(METRICS[metric])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for j in range(len(shapes), rows * cols):
        axes[j // cols][j % cols].axis("off")
    c = report.ceilings
    fig.suptitle(f"fusedmoe bench, {c.device}\nroofline from measured {c.copy_gbps:.0f} GB/s and "
                 f"{c.matmul_tflops:.0f} TFLOP/s (16-bit)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
