"""One forward of a preset, for Nsight Compute (``ncu``) to profile its GEMM launches.

    ncu --kernel-name regex:_moe_gemm_kernel --launch-skip 4 --launch-count 2 \\
        --section SpeedOfLight ... python benchmarks/ncu_forward.py --model mixtral-8x7b --tokens 1024

Runs ``--warmup`` forwards (compiles; ncu skips their launches with --launch-skip) and one
more. A diagnostic, not a benchmark.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--quant", default="none")
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    from benchmarks.profile_stages import build
    from fusedmoe.bench.harness import make_routing
    name, _, tp = a.model.partition(":")
    cfg, fn = build(name, int(tp or 1), a.quant, "triton")
    g = torch.Generator().manual_seed(a.tokens)
    x = torch.randn(a.tokens, cfg.hidden_size, generator=g).to(cfg.torch_dtype).cuda()
    w, ids = make_routing(a.tokens, cfg.num_local_experts, cfg.top_k, generator=g, device="cuda")
    for _ in range(a.warmup + 1):
        fn(x, w, ids)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
