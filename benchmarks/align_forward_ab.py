"""A/B of the alignment's scan grid inside whole forwards (on the GPU).

    python3 benchmarks/align_forward_ab.py [--rounds 3] [--points 0,2]

For prefill points whose alignment takes the chunked path: CUDA-graph µs of the whole triton
forward with the scan forced onto one program (align_block_size(scan_programs=1), the grid
before session 11) and with the default grid, alternating rounds. benchmarks/align_ab.py times
the alignment alone; this says what reaches the forward (the scan sits inside the prefill
PDL chain, so part of its time may already be hidden).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

POINTS = [("qwen3-30b-a3b", 4096, "none"), ("qwen3-30b-a3b", 16384, "none"), ("qwen3-30b-a3b", 16384, "fp8_channel"),
          ("deepseek-v3:8", 16384, "none")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--points", default=None, help="indices into POINTS, comma-separated (default: all)")
    a = ap.parse_args()
    import fusedmoe.kernels.align as al
    from benchmarks.profile_stages import build, graph_time
    from fusedmoe.bench.harness import make_routing
    real = al.align_block_size

    def one_program(*args, **kw):
        kw["scan_programs"] = 1
        return real(*args, **kw)
    points = [POINTS[int(i)] for i in a.points.split(",")] if a.points else POINTS
    for spec, T, scheme in points:
        name, _, tp = spec.partition(":")
        cfg, fn = build(name, int(tp or 1), scheme, "triton")
        g = torch.Generator().manual_seed(T)
        x = torch.randn(T, cfg.hidden_size, generator=g).to(cfg.torch_dtype).cuda()
        w, ids = make_routing(T, cfg.num_local_experts, cfg.top_k, generator=g, device="cuda")
        res = {"scan P=1": [], "scan default": []}
        for r in range(a.rounds):
            for label in (list(res) if r % 2 == 0 else list(res)[::-1]):   # ABBA: drift cancels
                al.align_block_size = one_program if label == "scan P=1" else real
                try:
                    res[label].append(graph_time(fn, (x, w, ids), reps=50))
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
