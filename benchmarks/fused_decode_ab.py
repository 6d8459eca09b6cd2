"""Kernel-level A/B of the decode paths at T=1 on the GPU (CUDA-graph µs over rotating sets):
two launches, two with PDL, the fused one-launch kernel with ticket-ordered items, and the
fused kernel with program-id-ordered items (kernels/decode.py fused_launch ``ticket``).

    python3 benchmarks/fused_decode_ab.py
"""
from __future__ import annotations

import torch

from fusedmoe.bench import harness as hz
from fusedmoe.kernels import decode as dk
from fusedmoe.kernels.launcher import launch
from fusedmoe.presets import get_preset


def main():
    for name, tp in (("qwen3-30b-a3b", 1), ("deepseek-v3", 8)):
        cfg = get_preset(name).to_config(tp=tp)
        w = hz.make_weights(cfg, "none", "cuda", seed=0)
        sets = hz.make_input_sets(cfg, 1, "cuda", seed=1).sets
        I, H, k = cfg.intermediate_size, cfg.hidden_size, cfg.top_k
        hs = [torch.empty(k, I, dtype=torch.bfloat16, device="cuda") for _ in sets]
        outs = [torch.empty(1, H, dtype=torch.bfloat16, device="cuda") for _ in sets]
        sync = torch.zeros(dk.sync_buffer_size(1), dtype=torch.int32, device="cuda")
        ref = [dk.decode_forward(s.x, w.w13, w.w2, s.topk_weights, s.topk_ids) for s in sets]

        def fused(ticket):
            def go(s, h, o):
                launch(*dk.fused_launch(s.x, w.w13, w.w2, s.topk_ids, s.topk_weights, "silu", h, o, sync,
                                        ticket=ticket))
                return o
            return go
        variants = {
            "two": lambda s, h, o: dk.decode_forward(s.x, w.w13, w.w2, s.topk_weights, s.topk_ids, out=o),
            "pdl": lambda s, h, o: dk.decode_forward(s.x, w.w13, w.w2, s.topk_weights, s.topk_ids, out=o, pdl=True),
            "fused-ticket": fused(True),
            "fused-pid": fused(False),
        }
        for var, fn in variants.items():
            ok = all(torch.equal(fn(s, h, o), r) for s, h, o, r in zip(sets, hs, outs, ref))
            calls = [lambda s=s, h=h, o=o, fn=fn: fn(s, h, o) for s, h, o in zip(sets, hs, outs)]
            us = min(hz.time_graph(calls) for _ in range(3))
            print(f"{name:14s} T=1 {var:13s} {us:7.2f} us  bitwise={ok}  sync clean={not sync.any().item()}",
                  flush=True)


if __name__ == "__main__":
    main()
