"""Where the split-I decode's time goes (kernels/decode_split.py): the kernel with and without its
atomic adds (ADD 0: a timing probe, wrong result) against the two-kernel a16 decode
(decode_gemm1 + decode_gemm2, PDL) and a pure read of the same weight bytes, CUDA graphs over
rotated input sets.

    python3 benchmarks/split_probe.py [--cases deepseek-v3:8:fp8_block:1,...] [--configs BI,BK,BH,W;...]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_t2 import read_us  # noqa: E402

from fusedmoe.bench import harness as hz  # noqa: E402
from fusedmoe.kernels.decode import decode_gemm1, decode_gemm2  # noqa: E402
from fusedmoe.kernels.decode_split import split_config, split_forward  # noqa: E402
from fusedmoe.presets import get_preset  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="deepseek-v3:8:fp8_block:1;qwen3-30b-a3b:1:fp8_channel:1")
    ap.add_argument("--configs", default="")
    a = ap.parse_args(argv)
    for case in a.cases.split(";"):
        name, tp, scheme, toks = case.split(":")
        cfg = get_preset(name).to_config(tp=int(tp))
        w = hz.make_weights(cfg, scheme, "cuda", seed=0)
        H, I, k = cfg.hidden_size, cfg.intermediate_size, cfg.top_k
        quant = {"fp8_block": "block", "none": "none"}.get(scheme, "channel")
        blk = w.scheme.block_shape if quant == "block" else None
        q = dict(quant=quant, block_shape=blk)
        for T in (int(t) for t in toks.split(",")):
            sets = hz.make_input_sets(cfg, T, "cuda", seed=T, max_sets=16).sets
            hit = sum(s.experts_hit for s in sets) / len(sets)
            nb = hit * 3 * H * I * w.w13.element_size()
            outs = [torch.empty(T, H, dtype=torch.bfloat16, device="cuda") for _ in sets]
            hs = [torch.empty(T * k, I, dtype=torch.bfloat16, device="cuda") for _ in sets]

            def two(s, h, o):
                decode_gemm1(s.x, w.w13, s.topk_ids, "silu", h, b_scale=w.w13_scale, pdl=True, **q)
                decode_gemm2(h, w.w2, s.topk_ids, s.topk_weights, o, b_scale=w.w2_scale, pdl=True, **q)
            rows = [("two-kernel a16", [lambda s=s, h=h, o=o: two(s, h, o) for s, h, o in zip(sets, hs, outs)])]
            base = split_config(T * k, I, H, w.w13.element_size(), 132)
            cfgs = [base] + [dict(zip(("BLOCK_I", "BLOCK_K", "BLOCK_H", "num_warps"), map(int, c.split(","))),
                                  PREFETCH=True) for c in filter(None, a.configs.split(";"))]
            for c in cfgs:
                for add in (True, False):
                    cc = dict(c, ADD=add)
                    rows.append((f"split {c['BLOCK_I']},{c['BLOCK_K']},{c['BLOCK_H']},{c['num_warps']} add={int(add)}",
                                 [lambda s=s, o=o, cc=cc: split_forward(s.x, w.w13, w.w2, s.topk_weights, s.topk_ids,
                                                                        "silu", out=o, w13_scale=w.w13_scale,
                                                                        w2_scale=w.w2_scale, config=cc, **q)
                                  for s, o in zip(sets, outs)]))
            rd = read_us(nb)
            print(f"{name}:{tp} {scheme} T={T}: weight read {nb / 1e6:.1f} MB, pure read {rd:.2f} us", flush=True)
            for label, calls in rows:
                us = min(hz.time_graph(calls) for _ in range(2))
                print(f"  {label:32s} {us:7.2f} us  ({rd / us * 100:5.1f}% of the read)", flush=True)
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
