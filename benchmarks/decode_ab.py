"""Decode kernels on the GPU: tile sweep, and decode vs grouped path per T.

    python3 benchmarks/decode_ab.py --out $OUT/decode_ab.json [--quick]

B. The layer's decode path as two launches, or two with PDL (GEMM2 a programmatic dependent
   launch of GEMM1, FUSEDMOE_DECODE_PDL) at T = 1, 2: graph and eager µs, alternating rounds.
A. T=1, bf16, each decode kernel alone (CUDA-graph replay over rotating input sets, so L2
   does not hold the weights): BLOCK_N x BLOCK_K x num_warps x PREFETCH, GB/s of the
   weights read, and decode_config's choice.
C. The layer through ``prepare_experts('triton')`` with FUSEDMOE_DECODE_PAIRS=0 (grouped
   path) and =4096 (decode path) at T = 1, 2, 4, 8, 16: graph and eager µs and % of the
   weight-read roofline; bf16 for the three presets, fp8_channel (qwen3), fp8_block
   (deepseek tp8).
D. W8A8 schemes at T = 1..16 (--d-cases, --d-tokens): decode kernels with x and h quantized
   (FUSEDMOE_W8A8_DECODE=a8), the same on the tensor cores (tc, kernels/decode_tc.py), decode
   kernels with 16-bit activations (a16, the default), and the grouped path; graph / eager
   µs and the ratio to the 8-bit weight-read roofline.
G. GEMM2 with several N tiles a program (kernels/decode.py TILES, FUSEDMOE_DECODE_TILES):
   the layer at --g-tokens for each of --g-tiles, alternating rounds (--g-cases).
   --g-env VAR=a,b makes the layer's variants the values of VAR (e.g. FUSEDMOE_DECODE_PDL=0,1).
T. the tensor-core decode GEMMs alone (--t-cases, at --t-tokens): a tile / split / stage sweep.
   ``--a16`` makes section A sweep the W8A8 GEMMs with 16-bit activations.
Prints tables and writes every figure to the JSON.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

from fusedmoe.bench import harness as hz
from fusedmoe.kernels.decode import decode_config, decode_gemm1, decode_gemm2
from fusedmoe.kernels.launcher import next_power_of_2 as hz_next_pow2
from fusedmoe.layer import prepare_experts
from fusedmoe.presets import get_preset

SHAPES = [("qwen3-30b-a3b", 1), ("deepseek-v3", 8), ("mixtral-8x7b", 1)]


def around(default: dict, esize: int, group_k=None):
    """Section A's --around grid: decode_config's BN and BK halved / kept / doubled, with its
    num_warps (and the other warp count at its BN x BK). (Session 5 also swept here a
    [R, BN, BK] accumulator reduced once instead of per K step, and 8-bit weights widened
    with integer ops instead of conversion instructions: both slower, docs/BENCHMARKS.md.)"""
    bn0, bk0, w0 = default["BLOCK_N"], default["BLOCK_K"], default["num_warps"]
    out = []
    for bn in (max(2, bn0 // 2), bn0, bn0 * 2):
        for bk in (max(16, bk0 // 2), bk0, bk0 * 2):
            if group_k is not None and (group_k % bk if bk <= group_k else bk % group_k):
                continue
            for warps in (w0, 12 - w0) if (bn, bk) == (bn0, bk0) else (w0,):
                out.append(dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, PREFETCH=True))
    return out


def kernel_sweep(cfg, w, sets, bw, quick, scheme="none", a16=False, grid_around=False, only=None):
    """Section A for one shape and scheme: every config's time per GEMM, and the default.
    W8A8 schemes run as the backend does with FUSEDMOE_W8A8_DECODE=a8: x and h quantized by
    the quantization kernels beforehand (untimed here), the GEMMs on the 8-bit operands;
    ``a16``: 16-bit x and h against the 8-bit weights (the default decode math).
    ``only``: {gemm: configs}: time only these (section G)."""
    from fusedmoe.modular.prepare_finalize import quantize_activation
    H, I, k = cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    esize = 1 if scheme != "none" else 2
    q1, q2 = {}, {}
    if scheme != "none":
        quant = "block" if scheme == "fp8_block" else "channel"
        blk = w.scheme.block_shape if quant == "block" else None
        q1 = dict(quant=quant, block_shape=blk, b_scale=w.w13_scale)
        q2 = dict(quant=quant, block_shape=blk, b_scale=w.w2_scale)
    qa = esize == 1 and not a16
    a1 = [quantize_activation(s.x, w.scheme) if qa else (s.x, None) for s in sets]     # (x, scale)
    hs = [decode_gemm1(x, w.w13, s.topk_ids, "silu", a_scale=xs, **q1) for s, (x, xs) in zip(sets, a1)]
    a2 = [quantize_activation(h, w.scheme) if qa else (h, None) for h in hs]           # (h, scale)
    hit = sum(s.experts_hit for s in sets) / len(sets)
    bytes1 = hit * 2 * I * H * esize
    bytes2 = hit * H * I * esize
    rows = []
    kp = hz_next_pow2(k)
    grid = list(itertools.product((4, 8) if quick else (2, 4, 8, 16),
                                  (512,) if quick else ((256, 512, 1024) if esize == 2 else (256, 512, 1024, 2048)),
                                  (8,) if quick else (4, 8), (True,) if quick or esize == 1 else (False, True)))
    gk = w.scheme.block_shape[1] if scheme == "fp8_block" else None
    default = {"gemm1": decode_config(2, k, I, H, esize, group_k=gk), "gemm2": decode_config(kp, 1, H, I, esize, group_k=gk,
                                                                                          gemm2=True)}
    for gemm in ("gemm1", "gemm2") if only is None else tuple(only):
        R = 2 if gemm == "gemm1" else kp
        configs = (only[gemm] if only is not None else around(default[gemm], esize, gk) if grid_around
                   else [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, PREFETCH=pf) for bn, bk, warps, pf in grid])
        for c in configs:
            if R * c["BLOCK_N"] * c["BLOCK_K"] > 32768:          # spills for sure: not worth a compile
                continue
            if gemm == "gemm1":
                calls = [lambda s=s, h=h, a=a: decode_gemm1(a[0], w.w13, s.topk_ids, "silu", h, config=c,
                                                            a_scale=a[1], **q1)
                         for s, h, a in zip(sets, hs, a1)]
                nb = bytes1
            else:
                outs = [torch.empty(1, H, dtype=torch.bfloat16, device="cuda") for _ in sets]
                calls = [lambda s=s, a=a, o=o: decode_gemm2(a[0], w.w2, s.topk_ids, s.topk_weights, o, config=c,
                                                            a_scale=a[1], **q2)
                         for s, a, o in zip(sets, a2, outs)]
                nb = bytes2
            try:
                us = hz.time_graph(calls)
                rows.append(dict(gemm=gemm, **c, us=us, gbps=nb / us / 1e3, pct=100 * nb / us / 1e3 / bw))
                if only is not None:
                    r = rows[-1]
                    print(f"G kernel {scheme:11s} {gemm} BN{c['BLOCK_N']} BK{c['BLOCK_K']} w{c['num_warps']} "
                          f"tiles{c.get('TILES', 1)} {r['us']:7.2f} us "
                          f"{r['gbps']:6.0f} GB/s ({r['pct']:.0f}%)", flush=True)
            except Exception as e:  # a config that does not compile: say so, go on
                rows.append(dict(gemm=gemm, **c, error=f"{type(e).__name__}: {str(e)[:120]}"))
    return rows, default


def tc_sweep(cfg, w, sets, bw, quick=False):
    """Section T: the tensor-core decode GEMMs (kernels/decode_tc.py) alone at T = len(set
    tokens), on operands quantized beforehand (untimed): GEMM1 BN x BK x SPLIT_K x stages,
    GEMM2 BN x BK x GROUPS x stages; GB/s of the 8-bit weights read, and tc_config's choice."""
    from fusedmoe.kernels import decode_tc as tc
    from fusedmoe.modular.prepare_finalize import quantize_activation
    H, I, k = cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    quant = "block" if w.scheme.block_shape else ("tensor" if w.w13_scale.dim() == 1 else "channel")
    blk = w.scheme.block_shape
    gk = blk[1] if blk else None
    T = sets[0].topk_ids.shape[0]
    a1 = [quantize_activation(s.x, w.scheme) for s in sets]
    hs = [torch.empty(T * k, I, dtype=torch.bfloat16, device="cuda") for _ in sets]
    big = [tc.scratch(T, k, I, H, dict(BLOCK_N=32, SPLIT_K=8), dict(BLOCK_N=64, GROUPS=8), True, "cuda")
           for _ in range(1)][0]
    d1 = tc.tc_config("gemm1", T * k, I, H, k, True, gk)
    d2 = tc.tc_config("gemm2", T, H, I, k, group_k=gk)
    from fusedmoe.kernels.launcher import launch
    for s, (x, xs), h in zip(sets, a1, hs):
        launch(*tc.tc_gemm1_launch(x, w.w13, s.topk_ids, "silu", h, *big[0], quant=quant, a_scale=xs,
                                   b_scale=w.w13_scale, block_shape=blk, config=d1))
    a2 = [quantize_activation(h, w.scheme) for h in hs]
    hit = sum(s.experts_hit for s in sets) / len(sets)
    nb = {"gemm1": hit * 2 * I * H, "gemm2": hit * H * I}
    bks = [bk for bk in (64, 128, 256) if (gk is None and bk > 64) or (gk is not None and gk % bk == 0)]
    grid1 = [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sp, num_warps=4, num_stages=4)
             for bn in (32, 64) for bk in bks for sp in (1, 2, 4, 8)]
    grid2 = [dict(BLOCK_N=bn, BLOCK_K=bk, GROUPS=g, num_warps=4, num_stages=4)
             for bn in (64, 128) for bk in bks for g in (1, 2, 4, 8) if g <= k]
    if gk is not None and H > 2048:         # GEMM1 steps of two scale groups (TC_GEMM1_BLOCK_GROUPS 2)
        grid1 += [dict(d1, BLOCK_K=2 * gk, num_stages=st) for st in (3, 4, 5)]
    rows = []
    for gemm, grid, dflt in (("gemm1", grid1, d1), ("gemm2", grid2, d2)):
        stages = [dict(dflt, num_stages=st) for st in ((2, 3, 6, 8) if not quick else ())]
        for c in grid + stages + [dict(dflt, default=True)]:
            cc = {key: v for key, v in c.items() if key != "default"}
            if gemm == "gemm1":
                calls = [lambda s=s, a=a, h=h: launch(*tc.tc_gemm1_launch(
                    a[0], w.w13, s.topk_ids, "silu", h, *big[0], quant=quant, a_scale=a[1], b_scale=w.w13_scale,
                    block_shape=blk, config=cc)) for s, a, h in zip(sets, a1, hs)]
            else:
                outs = [torch.empty(T, H, dtype=torch.bfloat16, device="cuda") for _ in sets]
                calls = [lambda s=s, a=a, o=o: launch(*tc.tc_gemm2_launch(
                    a[0], w.w2, s.topk_ids, s.topk_weights, o, *big[1], quant=quant, a_scale=a[1],
                    b_scale=w.w2_scale, block_shape=blk, config=cc)) for s, a, o in zip(sets, a2, outs)]
            try:
                us = hz.time_graph(calls)
                rows.append(dict(gemm=gemm, **c, us=us, gbps=nb[gemm] / us / 1e3, pct=100 * nb[gemm] / us / 1e3 / bw))
            except Exception as e:  # a config that does not compile: say so, go on
                rows.append(dict(gemm=gemm, **c, error=f"{type(e).__name__}: {str(e)[:160]}"))
    return rows


def layer_ab(name, tp, scheme, bw, tokens):
    preset = get_preset(name)
    cfg = preset.to_config(tp=tp)
    w = hz.make_weights(cfg, scheme, "cuda", seed=0)
    per_expert = hz.expert_bytes(cfg.hidden_size, cfg.intermediate_size, scheme)
    rows = []
    for T in tokens:
        sets = hz.make_input_sets(cfg, T, "cuda", seed=T, weight_bytes=0)
        nb = hz.moe_bytes(T, cfg.hidden_size, sets.experts_hit, per_expert)
        roof = nb / (bw * 1e9) * 1e6
        for path, pairs in (("grouped", "0"), ("decode", "4096")):
            os.environ["FUSEDMOE_DECODE_PAIRS"] = pairs
            pe = prepare_experts(cfg, w, "triton")
            ref_case = hz.make_check_case(cfg, w, T, "cuda")
            chk = hz.check_against(pe, ref_case)
            t = hz.time_impl(pe, sets, graph=True, eager=True)
            rows.append(dict(model=name, tp=tp, scheme=scheme, T=T, path=path, us_graph=t.us_graph,
                             us_eager=t.us_eager, roof_us=roof,
                             pct=100 * roof / t.us_graph if t.us_graph else None,
                             ok=chk.ok, err=chk.rel_err if chk.rel_err is not None else float("nan"), msg=chk.message))
        os.environ.pop("FUSEDMOE_DECODE_PAIRS", None)
    return rows


# (session 4 also compared "fused", both GEMMs in one launch: slower, see docs/BENCHMARKS.md;
# removed in session 12, commit e6c0681 has it)
VARIANTS = {"two": dict(FUSEDMOE_DECODE_PDL="0"), "pdl": dict(FUSEDMOE_DECODE_PDL="1")}


def variants_ab(name, tp, scheme, bw, tokens, variants, rounds=3):
    """The layer at each T under each variant's environment, rounds alternating, best of each
    (graph and eager µs, the check, whether the call quantized its activations)."""
    cfg = get_preset(name).to_config(tp=tp)
    w = hz.make_weights(cfg, scheme, "cuda", seed=0)
    per_expert = hz.expert_bytes(cfg.hidden_size, cfg.intermediate_size, scheme)
    rows = []
    for T in tokens:
        sets = hz.make_input_sets(cfg, T, "cuda", seed=T, weight_bytes=0)
        roof = hz.moe_bytes(T, cfg.hidden_size, sets.experts_hit, per_expert) / (bw * 1e9) * 1e6
        best = {}
        for _ in range(rounds):
            for var, env in variants.items():
                for other in variants.values():       # no variant's setting leaks into the next
                    for key in other:
                        os.environ.pop(key, None)
                os.environ.update(env)
                pe = prepare_experts(cfg, w, "triton")
                chk = hz.check_against(pe, hz.make_check_case(cfg, w, T, "cuda"))
                t = hz.time_impl(pe, sets, graph=True, eager=True)
                b = best.setdefault(var, dict(us_graph=t.us_graph, us_eager=t.us_eager, ok=chk.ok,
                                              err=chk.rel_err, qa=pe.quantizes_activations(T)))
                b["us_graph"] = min(b["us_graph"], t.us_graph)
                b["us_eager"] = min(b["us_eager"], t.us_eager)
                b["ok"] = b["ok"] and chk.ok
        for env in variants.values():
            for key in env:
                os.environ.pop(key, None)
        for var, b in best.items():
            rows.append(dict(model=name, tp=tp, scheme=scheme, T=T, variant=var, roof_us=roof,
                             pct=100 * roof / b["us_graph"], ratio=b["us_graph"] / roof, **b))
    return rows


def pdl_ab(name, tp, scheme, bw, tokens, rounds=3):
    """Section B: the layer's decode path as two launches, or two with GEMM2 a programmatic
    dependent launch of GEMM1 (FUSEDMOE_DECODE_PDL)."""
    return variants_ab(name, tp, scheme, bw, tokens, VARIANTS, rounds)


W8A8_MODES = {"auto": dict(FUSEDMOE_W8A8_DECODE="auto"),        # the default: its own pair bound
              "tc": dict(FUSEDMOE_W8A8_DECODE="tc", FUSEDMOE_DECODE_PAIRS="4096"),
              "a8": dict(FUSEDMOE_W8A8_DECODE="a8", FUSEDMOE_DECODE_PAIRS="4096"),
              "a16": dict(FUSEDMOE_W8A8_DECODE="a16", FUSEDMOE_DECODE_PAIRS="4096"),
              "grouped": dict(FUSEDMOE_W8A8_DECODE="a16", FUSEDMOE_DECODE_PAIRS="0"),
              # the tensor-core chain with one program a pair / a (token, slot group), and expert-shared
              "tc_pair": dict(FUSEDMOE_W8A8_DECODE="tc", FUSEDMOE_DECODE_PAIRS="4096", FUSEDMOE_DECODE_SHARE="0"),
              "tc_share": dict(FUSEDMOE_W8A8_DECODE="tc", FUSEDMOE_DECODE_PAIRS="4096", FUSEDMOE_DECODE_SHARE="1")}


def w8a8_ab(name, tp, scheme, bw, tokens, rounds=2, variants=None):
    """Section D: a W8A8 scheme's small-T forward three ways: decode kernels with x and h
    quantized (a8, the PDL chain), decode kernels with 16-bit activations (a16), and the
    grouped path; ratio = graph time / the 8-bit-weight-read roofline."""
    return variants_ab(name, tp, scheme, bw, tokens, {v: W8A8_MODES[v] for v in variants or W8A8_MODES}, rounds)


def _print_layer_rows(section, name, scheme, rows, width):
    """One line per (T, variant) of a layer A/B (sections B and G)."""
    for r in rows:
        print(f"{section} {name:14s} {scheme:11s} T={r['T']:<3d} {r['variant']:{width}s} graph {r['us_graph']:7.2f} "
              f"eager {r['us_eager']:7.1f} us  roof {r['roof_us']:6.1f}  {r['pct']:5.1f}%  ok={r['ok']}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="decode_ab.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: A,B,C,D,G,T")
    ap.add_argument("--schemes", default="none,fp8_channel,fp8_block", help="schemes of both sections")
    ap.add_argument("--a16", action="store_true", help="section A: W8A8 schemes with 16-bit activations")
    ap.add_argument("--around", action="store_true", help="section A: the grid around decode_config's choice "
                    "(function around)")
    ap.add_argument("--d-cases", default="qwen3-30b-a3b:1:fp8_channel,qwen3-30b-a3b:1:int8_channel,"
                    "deepseek-v3:8:fp8_block,qwen3-30b-a3b:1:fp8_tensor", help="section D: model:tp:scheme list")
    ap.add_argument("--d-tokens", default="1,2,4,8,16")
    ap.add_argument("--d-variants", default=",".join(W8A8_MODES), help="section D: which of " + ",".join(W8A8_MODES))
    ap.add_argument("--t-cases", default="qwen3-30b-a3b:1:fp8_channel,qwen3-30b-a3b:1:int8_channel,"
                    "deepseek-v3:8:fp8_block", help="section T: model:tp:scheme list")
    ap.add_argument("--t-tokens", default="1", help="section T: token counts (the GEMMs alone at each)")
    ap.add_argument("--g-cases", default="qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block,"
                    "qwen3-30b-a3b:1:none,deepseek-v3:8:none", help="section G: model:tp:scheme list")
    ap.add_argument("--g-tokens", default="1,2")
    ap.add_argument("--g-tiles", default="1,2,4,8,16")
    ap.add_argument("--g-env", default=None, help="section G: the layer's variants from one variable instead of "
                    "TILES, e.g. FUSEDMOE_DECODE_PDL=0,1")
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    ceil = hz.measure_ceilings("cuda")
    bw = ceil.copy_gbps
    res = {"device": ceil.device, "copy_gbps": bw, "A": {}, "C": []}
    print(f"{ceil.device}: copy {bw:.0f} GB/s", flush=True)
    sweeps = [(n, tp, "none") for n, tp in SHAPES] + [("qwen3-30b-a3b", 1, "fp8_channel"),
                                                        ("deepseek-v3", 8, "fp8_block")]
    want = set(a.schemes.split(","))
    if a.around:      # (Mixtral's T=1 decode is at ~100% of the roofline already)
        sweeps = [c for c in sweeps if c[0] != "mixtral-8x7b"]
    if "G" not in skip:
        res["G"] = []
        variants = {f"tiles{n}": dict(FUSEDMOE_DECODE_TILES=n) for n in a.g_tiles.split(",")}
        if a.g_env:
            var, vals = a.g_env.split("=")
            variants = {f"{var.split('_')[-1].lower()}={v}": {var: v} for v in vals.split(",")}
        for case in a.g_cases.split(","):
            name, tp, scheme = case.split(":")
            print(f"G {case}", flush=True)
            # each GEMM alone at T=1 (16-bit x / h: the a16 math of W8A8): decode_config's tile with BN
            # halved / doubled and BK halved; GEMM2 with every TILES
            cfg = get_preset(name).to_config(tp=int(tp))
            w = hz.make_weights(cfg, scheme, "cuda", seed=0)
            sets = hz.make_input_sets(cfg, 1, "cuda", seed=1).sets
            esize = 1 if scheme != "none" else 2
            gk = w.scheme.block_shape[1] if scheme == "fp8_block" else None
            d = decode_config(hz_next_pow2(cfg.top_k), 1, cfg.hidden_size, cfg.intermediate_size, esize, group_k=gk,
                              gemm2=True)
            d1 = decode_config(2, cfg.top_k, cfg.intermediate_size, cfg.hidden_size, esize, group_k=gk)

            def ok(bk):
                return bk >= 16 and (not gk or bk % gk == 0 or gk % bk == 0)
            g1 = [dict(d1, BLOCK_N=bn, BLOCK_K=bk) for bn in (max(2, d1["BLOCK_N"] // 2), d1["BLOCK_N"], 2 * d1["BLOCK_N"])
                  for bk in (d1["BLOCK_K"], d1["BLOCK_K"] // 2) if ok(bk)]
            g2 = [dict(d, BLOCK_N=bn, BLOCK_K=bk, TILES=int(n)) for bn in (max(2, d["BLOCK_N"] // 2), d["BLOCK_N"],
                                                                          2 * d["BLOCK_N"])
                  for bk in (d["BLOCK_K"], d["BLOCK_K"] // 2) if ok(bk) for n in a.g_tiles.split(",")]
            rows, _ = kernel_sweep(cfg, w, sets, bw, False, scheme, True, False, {"gemm1": g1, "gemm2": g2})
            res["G"].append(dict(case=case, kernel=rows))
            del w
            rows = variants_ab(name, int(tp), scheme, bw, [int(t) for t in a.g_tokens.split(",")], variants)
            res["G"] += rows
            _print_layer_rows("G", name, scheme, rows, 8)
            torch.cuda.empty_cache()
    if "T" not in skip:
        res["T"] = {}
        for case, T in itertools.product(a.t_cases.split(","), [int(t) for t in a.t_tokens.split(",")]):
            name, tp, scheme = case.split(":")
            cfg = get_preset(name).to_config(tp=int(tp))
            w = hz.make_weights(cfg, scheme, "cuda", seed=0)
            sets = hz.make_input_sets(cfg, T, "cuda", seed=1).sets
            rows = tc_sweep(cfg, w, sets, bw, a.quick)
            if T != 1:
                case = f"{case} T={T}"
            res["T"][case] = rows
            for g in ("gemm1", "gemm2"):
                ok = sorted((r for r in rows if r["gemm"] == g and "us" in r), key=lambda r: r["us"])
                bad = [r for r in rows if r["gemm"] == g and "error" in r]
                more = [r for r in ok[6:] if r.get("default") or ("block" in case and r["BLOCK_K"] == 256)]
                for r in ok[:6] + more:                 # (block scales: BK 256 is two groups a step)
                    extra = {key: r[key] for key in ("SPLIT_K", "GROUPS") if key in r}
                    print(f"T {case:32s} {g} {'default ' if r.get('default') else ''}BN{r['BLOCK_N']} "
                          f"BK{r['BLOCK_K']} {extra} s{r['num_stages']} {r['us']:7.2f} us {r['gbps']:6.0f} GB/s "
                          f"({r['pct']:.0f}%)", flush=True)
                if bad:
                    print(f"T {case} {g}: {len(bad)} configs failed, e.g. {bad[0]['error']}", flush=True)
            del w
            torch.cuda.empty_cache()
    for name, tp, scheme in [c for c in sweeps if c[2] in want] if "A" not in skip else []:
        cfg = get_preset(name).to_config(tp=tp)
        w = hz.make_weights(cfg, scheme, "cuda", seed=0)
        sets = hz.make_input_sets(cfg, 1, "cuda", seed=1).sets
        rows, default = kernel_sweep(cfg, w, sets, bw, a.quick or name == "mixtral-8x7b", scheme, a.a16, a.around)
        res["A"][f"{name}/{scheme}"] = dict(rows=rows, default=default)
        for g in ("gemm1", "gemm2"):
            ok = sorted((r for r in rows if r["gemm"] == g and "us" in r), key=lambda r: r["us"])
            print(f"A {name:14s} {scheme:11s} {g}: default {default[g]}", flush=True)
            dflt = [r for r in ok if all(r[key] == v for key, v in default[g].items())]
            for r in ok[:6] + dflt:
                print(f"    BN{r['BLOCK_N']:<3d} BK{r['BLOCK_K']:<5d} w{r['num_warps']} pf{int(r['PREFETCH'])} "
                      f"{r['us']:7.2f} us "
                      f"{r['gbps']:6.0f} GB/s ({r['pct']:.0f}%)", flush=True)
        del w
        torch.cuda.empty_cache()
    if "B" not in skip:
        res["B"] = []
        cases = [(n, tp, "none") for n, tp in SHAPES] + [("qwen3-30b-a3b", 1, "fp8_channel"),
                                                          ("deepseek-v3", 8, "fp8_block")]
        for name, tp, scheme in [c for c in cases if c[2] in want]:
            rows = pdl_ab(name, tp, scheme, bw, (1,) if a.quick else (1, 2))
            res["B"] += rows
            _print_layer_rows("B", name, scheme, rows, 6)
            torch.cuda.empty_cache()
    if "C" not in skip:
        cases = [(n, tp, "none") for n, tp in SHAPES] + [("qwen3-30b-a3b", 1, "fp8_channel"),
                                                          ("deepseek-v3", 8, "fp8_block")]
        for name, tp, scheme in [c for c in cases if c[2] in want]:
            rows = layer_ab(name, tp, scheme, bw, (1, 2, 4, 8, 16) if not a.quick else (1, 4))
            res["C"] += rows
            for r in rows:
                print(f"C {name:14s} {scheme:11s} T={r['T']:<3d} {r['path']:8s} graph {r['us_graph'] or 0:7.1f} "
                      f"eager {r['us_eager'] or 0:7.1f} us  roof {r['roof_us']:6.1f}  "
                      f"{r['pct'] or 0:5.1f}%  ok={r['ok']} err={r['err']:.1e}", flush=True)
            torch.cuda.empty_cache()
    if "D" not in skip:
        res["D"] = []
        for case in a.d_cases.split(","):
            name, tp, scheme = case.split(":")
            rows = w8a8_ab(name, int(tp), scheme, bw, [int(t) for t in a.d_tokens.split(",")],
                           variants=a.d_variants.split(","))
            res["D"] += rows
            for r in rows:
                print(f"D {name:14s} {scheme:12s} T={r['T']:<3d} {r['variant']:8s} graph {r['us_graph']:7.2f} "
                      f"eager {r['us_eager']:7.1f} us  roof {r['roof_us']:6.1f}  {r['ratio']:5.2f}x  "
                      f"qa={int(r['qa'])} ok={r['ok']} err={r['err'] or float('nan'):.1e}", flush=True)
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
