"""The tensor-core W8A8 decode GEMMs alone, one program a pair against expert-shared (SHARE).

    python3 benchmarks/share_ab.py [--cases qwen3-30b-a3b:1:fp8_channel,...] [--tokens 4,8,16] [--json F]

Each GEMM of kernels/decode_tc.py as CUDA-graph replays over rotated input sets (each set its
own routing and x), next to a pure read (benchmarks/dense_ceiling.py's kernel) of the bytes a
pair-per-program GEMM reads (every pair's expert) and of the distinct experts' bytes (what
SHARE reads). SHARE's table (kernels/decode_tc.py share_table_launch) is written before the
timed GEMMs and timed alone. Variants: ``--g2-stages`` (SHARE GEMM2 num_stages list).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_t2 import read_us  # noqa: E402  (a pure read of the same bytes, rotated)

from fusedmoe.bench import harness as hz  # noqa: E402
from fusedmoe.kernels import decode_tc as tc  # noqa: E402
from fusedmoe.kernels.grouped_gemm import _num_sms  # noqa: E402
from fusedmoe.kernels.launcher import launch  # noqa: E402
from fusedmoe.modular.prepare_finalize import quantize_activation  # noqa: E402
from fusedmoe.presets import get_preset  # noqa: E402


def run_case(name, tp, scheme, T, g2_stages, rounds):
    cfg = get_preset(name).to_config(tp=tp)
    w = hz.make_weights(cfg, scheme, "cuda", seed=0)
    H, I, k = cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    quant = {"fp8_block": "block", "fp8_tensor": "tensor"}.get(scheme, "channel")
    gk = w.scheme.block_shape[1] if quant == "block" else None
    nsm = _num_sms(torch.device("cuda"))
    sets = hz.make_input_sets(cfg, T, "cuda", seed=T, min_sets=16).sets
    ins = []
    for s in sets:
        xq, xs = quantize_activation(s.x, w.scheme)
        hq, hs = quantize_activation(torch.randn(T * k, I, device="cuda", dtype=torch.bfloat16), w.scheme)
        ins.append((xq, xs, hq, hs, s))
    n_ids = sum(s.topk_ids.numel() for s in sets) / len(sets)
    hit = sum(s.experts_hit for s in sets) / len(sets)
    b13 = w.w13[0].numel() * w.w13.element_size()
    b2 = w.w2[0].numel() * w.w2.element_size()
    rows = []
    variants = [("pair", False, None), ("share", True, None)] + [(f"share_s{st}", True, st) for st in g2_stages]
    tables = []
    for s in sets:           # the share table of each set (untimed here; timed alone below)
        tables.append(tc.share_table(T, k, "cuda"))
        launch(*tc.share_table_launch(s.topk_ids, tables[-1], cfg.num_local_experts))
    t_tab = hz.time_graph([lambda s=s, t=t: launch(*tc.share_table_launch(s.topk_ids, t, cfg.num_local_experts))
                           for s, t in zip(sets, tables)])
    res = {}
    for _ in range(rounds):
        for vname, share, st in variants:
            c1 = tc.tc_config("gemm1", T * k, I, H, k, True, gk, nsm, share=share)
            c2 = tc.tc_config("gemm2", T, H, I, k, group_k=gk, num_sms=nsm, share=share)
            if st is not None:
                c2["num_stages"] = st
            s1, s2 = tc.scratch(T, k, I, H, c1, c2, True, "cuda")
            h = torch.empty(T * k, I, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
            bs = w.scheme.block_shape


            def g1(xq, xs, s, t):
                launch(*tc.tc_gemm1_launch(xq, w.w13, s.topk_ids, "silu", h, *s1, quant=quant, a_scale=xs,
                                           b_scale=w.w13_scale, block_shape=bs, config=dict(c1),
                                           table=t if share else None))

            def g2(hq, hs, s, t):
                launch(*tc.tc_gemm2_launch(hq, w.w2, s.topk_ids, s.topk_weights, out, *s2, quant=quant,
                                           a_scale=hs, b_scale=w.w2_scale, block_shape=bs, config=dict(c2),
                                           table=t if share else None))
            t1 = hz.time_graph([lambda a=a, t=t: g1(a[0], a[1], a[4], t) for a, t in zip(ins, tables)])
            t2 = hz.time_graph([lambda a=a, t=t: g2(a[2], a[3], a[4], t) for a, t in zip(ins, tables)])
            r = res.setdefault(vname, dict(g1=t1, g2=t2))
            r["g1"], r["g2"] = min(r["g1"], t1), min(r["g2"], t2)
    reads = dict(g1_pairs=read_us(n_ids * b13), g1_hit=read_us(hit * b13),
                 g2_pairs=read_us(n_ids * b2), g2_hit=read_us(hit * b2))
    for vname, r in res.items():
        rows.append(dict(case=f"{name}:{tp}:{scheme}", T=T, variant=vname, **r, **reads, pairs=n_ids, hit=hit,
                         table_us=t_tab))
    del w
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block")
    ap.add_argument("--tokens", default="4,8,16")
    ap.add_argument("--g2-stages", default="", help="GEMM2 num_stages variants of SHARE, e.g. 2,3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    st = [int(s) for s in a.g2_stages.split(",") if s]
    rows = []
    for case in a.cases.split(","):
        name, tp, scheme = case.split(":")
        for T in map(int, a.tokens.split(",")):
            for r in run_case(name, int(tp), scheme, T, st, a.rounds):
                rows.append(r)
                print(f"{r['case']} T={T} {r['variant']:9s} gemm1 {r['g1']:7.2f} us (read pairs {r['g1_pairs']:6.2f}, "
                      f"hit {r['g1_hit']:6.2f})  gemm2 {r['g2']:7.2f} us (read pairs {r['g2_pairs']:6.2f}, hit "
                      f"{r['g2_hit']:6.2f})  pairs {r['pairs']:.0f} hit {r['hit']:.1f} table {r['table_us']:.2f} us", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
