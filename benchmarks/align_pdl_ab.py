"""A/B of the alignment's scan and scatter as programmatic dependent launches (on the GPU).

    python3 benchmarks/align_pdl_ab.py [--rounds 3]

For the (preset, T) points where the triton backend runs its grouped path as a PDL chain
(prefill_pdl_for) and the alignment takes its chunked path (n > SMALL_MAX): CUDA-graph µs of
the whole forward with align_block_size(pdl=False) (forced) and with the backend's choice,
alternating rounds.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

POINTS = [("qwen3-30b-a3b", 256), ("qwen3-30b-a3b", 1024), ("deepseek-v3:8", 1024), ("deepseek-v3:8", 2048)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import fusedmoe.kernels.align as al
    from benchmarks.profile_stages import build, graph_time
    from fusedmoe.bench.harness import make_routing
    real = al.align_block_size

    def no_pdl(*args, **kw):
        kw["pdl"] = False
        return real(*args, **kw)
    for spec, T in POINTS:
        name, _, tp = spec.partition(":")
        cfg, fn = build(name, int(tp or 1), "none", "triton")
        print(f"{spec} T={T}: prefill PDL {fn.kernel.experts.prefill_pdl_for(T)}", flush=True)
        g = torch.Generator().manual_seed(T)
        x = torch.randn(T, cfg.hidden_size, generator=g).to(cfg.torch_dtype).cuda()
        w, ids = make_routing(T, cfg.num_local_experts, cfg.top_k, generator=g, device="cuda")
        res = {"align plain": [], "align pdl": []}
        for _ in range(a.rounds):
            for label in res:
                al.align_block_size = no_pdl if label == "align plain" else real
                try:
                    res[label].append(graph_time(fn, (x, w, ids), reps=100))
                finally:
                    al.align_block_size = real
        for label, v in res.items():
            print(f"   {label:12s} " + " ".join(f"{u:8.1f}" for u in v) + f"   min {min(v):8.1f} us", flush=True)
        del fn
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
