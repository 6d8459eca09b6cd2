"""A/B of alignment variants inside whole triton forwards (on the GPU).

    python3 benchmarks/align_forward_ab.py [--ab scan|pdl] [--rounds 3] [--reps 50] [--points 0,2]

``--ab scan`` (default): the chunked alignment's scan forced onto one program
(align_block_size(scan_programs=1), the grid before session 11) vs the default grid.
``--ab pdl``: the alignment's scan and scatter as plain launches (pdl=False forced) vs the
backend's choice (programmatic dependent launches inside the prefill PDL chain; ninth session,
formerly benchmarks/align_pdl_ab.py).
CUDA-graph µs of the whole forward per variant, ABBA rounds (drift cancels), min and median.
benchmarks/align_ab.py times the alignment alone; this says what reaches the forward.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (preset[:tp], T, scheme) per A/B: prefill points whose alignment takes the chunked path
# (n > SMALL_MAX); for pdl, points where the backend runs its grouped path as a PDL chain
POINTS = {
    "scan": [("qwen3-30b-a3b", 4096, "none"), ("qwen3-30b-a3b", 16384, "none"),
             ("qwen3-30b-a3b", 16384, "fp8_channel"), ("deepseek-v3:8", 16384, "none")],
    "pdl": [("qwen3-30b-a3b", 256, "none"), ("qwen3-30b-a3b", 1024, "none"), ("deepseek-v3:8", 1024, "none"),
            ("deepseek-v3:8", 2048, "none")],
}
# per A/B: (label of the forced variant, the keyword it forces, label of the default)
VARIANTS = {"scan": ("scan P=1", {"scan_programs": 1}, "scan default"),
            "pdl": ("align plain", {"pdl": False}, "align pdl")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ab", choices=sorted(POINTS), default="scan")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=50, help="graph replays per timing (the ninth session's pdl run: 100)")
    ap.add_argument("--points", default=None, help="indices into POINTS[--ab], comma-separated (default: all)")
    a = ap.parse_args()
    import fusedmoe.kernels.align as al
    from benchmarks.profile_stages import build, graph_time
    from fusedmoe.bench.harness import make_routing
    real = al.align_block_size
    forced_label, forced_kw, default_label = VARIANTS[a.ab]

    def forced(*args, **kw):
        return real(*args, **{**kw, **forced_kw})
    points = POINTS[a.ab]
    points = [points[int(i)] for i in a.points.split(",")] if a.points else points
    for spec, T, scheme in points:
        name, _, tp = spec.partition(":")
        cfg, fn = build(name, int(tp or 1), scheme, "triton")
        if a.ab == "pdl":
            print(f"{spec} T={T}: prefill PDL {fn.kernel.experts.prefill_pdl_for(T)}", flush=True)
        g = torch.Generator().manual_seed(T)
        x = torch.randn(T, cfg.hidden_size, generator=g).to(cfg.torch_dtype).cuda()
        w, ids = make_routing(T, cfg.num_local_experts, cfg.top_k, generator=g, device="cuda")
        res = {forced_label: [], default_label: []}
        for r in range(a.rounds):
            for label in (list(res) if r % 2 == 0 else list(res)[::-1]):   # ABBA: drift cancels
                al.align_block_size = forced if label == forced_label else real
                try:
                    res[label].append(graph_time(fn, (x, w, ids), reps=a.reps))
                finally:
                    al.align_block_size = real
        print(f"{spec} T={T} {scheme}", flush=True)
        for label, v in res.items():
            med = sorted(v)[len(v) // 2]
            print(f"   {label:12s} " + " ".join(f"{u:8.1f}" for u in v) + f"   min {min(v):8.1f}  median {med:8.1f} us",
                  flush=True)
        del fn
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
