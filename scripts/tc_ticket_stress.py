"""Stress of the tensor-core W8A8 decode's cross-program tickets (kernels/decode_tc.py: GEMM1's split-K
partials, GEMM2's slot groups and SHARE's per-token sums): the same call N times, eager and as CUDA-graph
replays, must give bitwise the same output. A store made visible to another program too late would show up
as a rare mismatch. Session 31 (an HQ form, reverted, failed a buffer-reuse test for an unknown reason).

    python3 scripts/tc_ticket_stress.py [--n 300]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
os.environ.setdefault("FUSEDMOE_W8A8_DECODE", "tc")

import torch  # noqa: E402

from fusedmoe import prepare_experts  # noqa: E402
from fusedmoe.presets import get_preset  # noqa: E402
from test_gpu_layer import _routed, _weights  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    bad = 0
    for model, tp, quant, tokens in (("qwen3-30b-a3b", 1, "fp8_channel", (1, 3, 8)),
                                     ("qwen3-30b-a3b", 1, "int8_channel", (2, 8)),
                                     ("deepseek-v3", 8, "fp8_block", (1, 2, 16))):
        cfg = get_preset(model).to_config(tp=tp)
        w = _weights(cfg, quant)
        pe = prepare_experts(cfg, w, "triton")
        for T in tokens:
            x, tw, ti = _routed(cfg, T, seed=T)
            ref = pe(x, tw, ti).clone()
            eager = sum(not torch.equal(pe(x, tw, ti), ref) for _ in range(a.n))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                o = pe(x, tw, ti)
            graph = 0
            for _ in range(a.n):
                g.replay()
                graph += not torch.equal(o, ref)
            torch.cuda.synchronize()
            bad += eager + graph
            print(f"{model} tp{tp} {quant} T={T}: {eager} / {a.n} eager and {graph} / {a.n} replays differ", flush=True)
    print("mismatches:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
