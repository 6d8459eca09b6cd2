"""The W8A8 decode at T = 1, 2: each a16 decode GEMM alone against a pure read of its bytes, a
tile grid around decode_config's choice at that T, and the layer in each decode mode.

    python3 benchmarks/decode_t2.py [--cases qwen3-30b-a3b:1:fp8_channel,...] [--tokens 1,2] [--json F]

Why (docs/BENCHMARKS.md, twenty-ninth section): issue 5 wants T <= 16 within 1.3x of reading the
hit experts' 8-bit weights once. T = 4..16 meet it, T = 1 is past it even for two kernels that
only read (1.32x at qwen3), and T = 2 (the tensor-core chain, 1.49-1.62x) is 25-45% above the
two-read floor. This says, per GEMM, how far the a16 kernels (16-bit x and h against the 8-bit
weights) are from a read of the same bytes, and which tile is fastest at T = 2.
GEMM times are CUDA-graph replays over rotated input sets (each set its own routing); the read
is benchmarks/dense_ceiling.py's kernel over the same number of bytes, also rotated.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dense_ceiling import _read  # noqa: E402  (the pure-read kernel)
from decode_ab import W8A8_MODES, variants_ab  # noqa: E402

from fusedmoe.bench import harness as hz  # noqa: E402
from fusedmoe.kernels.decode import decode_config, decode_gemm1, decode_gemm2, gemm2_tiles  # noqa: E402
from fusedmoe.kernels.launcher import next_power_of_2  # noqa: E402
from fusedmoe.presets import get_preset  # noqa: E402


def read_us(nbytes: float, n_sets: int = 8) -> float:
    n = int(nbytes) // 4
    bufs = [torch.randint(-2 ** 30, 2 ** 30, (n,), device="cuda", dtype=torch.int32) for _ in range(n_sets)]
    out = torch.empty(1 << 20, device="cuda", dtype=torch.int32)
    return hz.time_graph([lambda b=b: _read(b, out) for b in bufs])


def grid(d: dict, gk, tiles=(None,)):
    """decode_config's tile with BN and BK halved / doubled at its warps, the other warp count at
    its tile, and (GEMM2) each TILES at its BK."""
    def ok(bk):
        return bk >= 16 and (not gk or bk % gk == 0 or gk % bk == 0)
    t0 = d.get("TILES")
    out = [dict(d, num_warps=12 - d["num_warps"])]
    for bn in (max(2, d["BLOCK_N"] // 2), d["BLOCK_N"], 2 * d["BLOCK_N"]):
        for bk in (d["BLOCK_K"] // 2, d["BLOCK_K"], 2 * d["BLOCK_K"]):
            if not ok(bk):
                continue
            for t in (tiles if bk == d["BLOCK_K"] else (t0,)):
                c = dict(d, BLOCK_N=bn, BLOCK_K=bk)
                if t is not None:
                    c["TILES"] = t
                out.append(c)
    return out


def sweep(name, tp, scheme, T, n_sets=16, rounds=1):
    cfg = get_preset(name).to_config(tp=tp)
    w = hz.make_weights(cfg, scheme, "cuda", seed=0)
    H, I, k = cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    quant = "block" if scheme == "fp8_block" else "channel"
    blk = w.scheme.block_shape if quant == "block" else None
    gk = blk[1] if blk else None
    sets = hz.make_input_sets(cfg, T, "cuda", seed=T, max_sets=n_sets).sets
    hit = sum(s.experts_hit for s in sets) / len(sets)
    b1 = hit * (2 * I * H + 8 * I)
    b2 = hit * (H * I + 4 * H)
    q1 = dict(quant=quant, block_shape=blk, b_scale=w.w13_scale)
    q2 = dict(quant=quant, block_shape=blk, b_scale=w.w2_scale)
    hs = [decode_gemm1(s.x, w.w13, s.topk_ids, "silu", **q1) for s in sets]
    d1 = decode_config(2, T * k, I, H, 1, group_k=gk)
    d2 = decode_config(next_power_of_2(k), T, H, I, 1, group_k=gk, gemm2=True)
    t2 = gemm2_tiles(T * -(-H // d2["BLOCK_N"]), torch.cuda.get_device_properties(0).multi_processor_count, 1,
                     -(-I // d2["BLOCK_K"]))
    rows = []
    for gemm, d, configs, nb in (("gemm1", d1, grid(d1, gk), b1),
                                 ("gemm2", dict(d2, TILES=t2), grid(d2, gk, (1, 2, 4)), b2)):
        floor = min(read_us(nb) for _ in range(rounds))
        cand = []
        for c in configs:
            if (2 if gemm == "gemm1" else next_power_of_2(k)) * c["BLOCK_N"] * c["BLOCK_K"] > 32768:
                continue
            if gemm == "gemm1":
                calls = [lambda s=s, h=h, c=c: decode_gemm1(s.x, w.w13, s.topk_ids, "silu", h, config=c, **q1)
                         for s, h in zip(sets, hs)]
            else:
                outs = [torch.empty(T, H, dtype=torch.bfloat16, device="cuda") for _ in sets]
                calls = [lambda s=s, h=h, o=o, c=c: decode_gemm2(h, w.w2, s.topk_ids, s.topk_weights, o, config=c, **q2)
                         for s, h, o in zip(sets, hs, outs)]
            cand.append((c, calls))
        times = {i: [] for i in range(len(cand))}
        for _ in range(rounds):               # rounds alternate over the configs
            for i, (c, calls) in enumerate(cand):
                if times[i] is None:
                    continue
                try:
                    times[i].append(hz.time_graph(calls))
                except Exception as e:  # a config that does not compile: say so, go on
                    rows.append(dict(gemm=gemm, **c, error=f"{type(e).__name__}: {str(e)[:100]}"))
                    times[i] = None
        for i, (c, _) in enumerate(cand):
            if not times[i]:
                continue
            is_def = all(c.get(key) == d.get(key) for key in ("BLOCK_N", "BLOCK_K", "num_warps", "TILES"))
            rows.append(dict(gemm=gemm, **c, us=sorted(times[i])[len(times[i]) // 2], all_us=times[i],
                             read_us=floor, mb=nb / 1e6, default=is_def))
    del w
    torch.cuda.empty_cache()
    return rows


RULES = {"new": (128, 4096, True), "old": (256, 8192, False), "g1new": (256, 4096, False), "g2new": (128, 8192, True)}
# the tensor-core chain's rules (kernels/decode_tc.py TC_GEMM1_STAGES_SHORT_K,
# TC_GEMM2_PROGRAMS_LONG_K, TC_GEMM1_STAGES_LONG_K, TC_GEMM2_STAGES_SHORT_K): session 31's
# ("tcnew", shipped) against session 30's ("tcold"), each half alone, and the deepseek-v3 tp8
# candidates of session 31's sweep ("tcds": GEMM1 6 stages at K = 7168, GEMM2 2 at K = 256;
# "tcds3": GEMM1 splits K until 1.5 waves at K = 7168, i.e. 2 splits at T=3; "tcdsx": all three).
# Since session 32 "tcds" is the shipped rule set (GEMM1's 6 stages bounded by
# TC_GEMM1_LONG_K_PROGRAMS, which these tuples leave at its value) and "tcnew" the one before it
# Session 35: "tcg2sN", where "tcds" gives GEMM1 6 stages with block scales, K steps of two 128-wide
# scale groups (TC_GEMM1_BLOCK_GROUPS 2, 20 KB a stage) and N stages (two programs an SM up to 5);
# "tcg2s3" has shipped since. (Session 36 measured GEMM2 steps of two groups, "tcg2s3b2", 2.8-4.4%
# slower and removed them.) Each variant: the five numbers above, and its extras.
_RULES_TC = {"tcnew": (3, 2.5, 4, 4, 1.0), "tcold": (4, 4, 4, 4, 1.0), "tcg1new": (3, 4, 4, 4, 1.0),
             "tcg2new": (4, 2.5, 4, 4, 1.0), "tcds": (3, 2.5, 6, 2, 1.0), "tcds1": (3, 2.5, 6, 4, 1.0),
             "tcds2": (3, 2.5, 4, 2, 1.0), "tcds3": (3, 2.5, 4, 4, 1.5), "tcdsx": (3, 2.5, 6, 2, 1.5)}
TC_ATTRS = ("TC_GEMM1_STAGES_SHORT_K", "TC_GEMM2_PROGRAMS_LONG_K", "TC_GEMM1_STAGES_LONG_K",
            "TC_GEMM2_STAGES_SHORT_K", "TC_GEMM1_SPLIT_WAVES_LONG_K")
_ONE_GROUP = dict(TC_GEMM1_BLOCK_GROUPS=1, TC_GEMM1_STAGES_BLOCK_GROUPS=3)
TC_RULES = {**{v: dict(zip(TC_ATTRS, r), **_ONE_GROUP) for v, r in _RULES_TC.items()},
            **{f"tcg2s{n}": dict(zip(TC_ATTRS, _RULES_TC["tcds"]), **dict(_ONE_GROUP, TC_GEMM1_BLOCK_GROUPS=2,
                                                                           TC_GEMM1_STAGES_BLOCK_GROUPS=n))
               for n in (3, 4, 5)}}
# (during an A/B the rules given apply on every platform)
TC_EVERYWHERE = dict(TC_RULES_OLD_ON=(), TC_GEMM1_BLOCK_GROUPS_ON=("",))


def rule_ab(name, tp, scheme, tokens, rounds, variants=("new", "old", "g1new", "g2new")):
    """The layer under rule sets, alternating rounds, best graph µs of each: RULES (a16 math,
    FUSEDMOE_W8A8_DECODE=a16: session 29's 8-bit decode tile rules against session 28's, and
    each half alone: kernels/decode.py BK8_FLOOR, GEMM1_STEP8, TILES_ONE_STEP_ONLY) or
    TC_RULES (the tensor-core chain, FUSEDMOE_W8A8_DECODE=tc: kernels/decode_tc.py)."""
    from fusedmoe.kernels import decode as dk
    from fusedmoe.kernels import decode_tc as tc
    from fusedmoe.layer import prepare_experts
    if all(v in TC_RULES for v in variants):
        mod, mode = tc, "tc"
        table = {v: dict(r, **TC_EVERYWHERE) for v, r in TC_RULES.items()}
    else:
        mod, mode = dk, "a16"
        table = {v: dict(zip(("BK8_FLOOR", "GEMM1_STEP8", "TILES_ONE_STEP_ONLY"), r)) for v, r in RULES.items()}
    saved = {n: getattr(mod, n) for n in set().union(*(table[v] for v in variants))}

    def put(values):
        for n, v in values.items():
            setattr(mod, n, v)
        dk._cached_config.cache_clear()
    os.environ.update(FUSEDMOE_W8A8_DECODE=mode, FUSEDMOE_DECODE_PAIRS="4096")
    cfg = get_preset(name).to_config(tp=tp)
    w = hz.make_weights(cfg, scheme, "cuda", seed=0)
    rows = []
    try:
        for T in tokens:
            sets = hz.make_input_sets(cfg, T, "cuda", seed=T).sets
            best = {}
            for _ in range(rounds):
                for v in variants:
                    put(table[v])
                    pe = prepare_experts(cfg, w, "triton")
                    t = hz.time_impl(pe, sets, graph=True, eager=False)
                    best[v] = min(best.get(v, float("inf")), t.us_graph)
            rows += [dict(case=f"{name}:{tp}:{scheme}", T=T, rule=v, mode=mode, us_graph=us) for v, us in best.items()]
    finally:
        put(saved)
        for key in ("FUSEDMOE_W8A8_DECODE", "FUSEDMOE_DECODE_PAIRS"):
            os.environ.pop(key, None)
    del w
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="qwen3-30b-a3b:1:fp8_channel,deepseek-v3:8:fp8_block,qwen3-30b-a3b:1:int8_channel")
    ap.add_argument("--tokens", default="1,2")
    ap.add_argument("--layer-tokens", default="2,3")
    ap.add_argument("--layer-rounds", type=int, default=2)
    ap.add_argument("--layer-modes", default="auto,a16,tc", help="the layer's decode modes, of decode_ab.W8A8_MODES")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the GEMM grid (median)")
    ap.add_argument("--rule-ab", default="", help="T list: the layer under the new / old 8-bit tile rules")
    ap.add_argument("--rule-variants", default="new,old,g1new,g2new", help="of " + ",".join(RULES) + " (a16) or "
                    + ",".join(TC_RULES) + " (the tensor-core chain)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    bw = hz.measure_ceilings().copy_gbps
    res = {"copy_gbps": bw, "kernels": [], "layer": [], "rules": []}
    for case in a.cases.split(","):
        name, tp, scheme = case.split(":")
        if a.rule_ab:
            rows = rule_ab(name, int(tp), scheme, [int(t) for t in a.rule_ab.split(",")], a.layer_rounds,
                           a.rule_variants.split(","))
            res["rules"] += rows
            for r in rows:
                print(f"rules {case} T={r['T']} {r['rule']:7s} graph {r['us_graph']:6.2f} us ({r['mode']})", flush=True)
        for T in map(int, filter(None, a.tokens.split(","))):
            rows = sweep(name, int(tp), scheme, T, rounds=a.rounds)
            res["kernels"] += [dict(case=case, T=T, **r) for r in rows]
            for g in ("gemm1", "gemm2"):
                ok = sorted((r for r in rows if r["gemm"] == g and "us" in r), key=lambda r: r["us"])
                if not ok:
                    continue
                dflt = [r for r in ok if r["default"]]
                print(f"{case} T={T} {g}: {ok[0]['mb']:.1f} MB, read {ok[0]['read_us']:.2f} us; default "
                      + (f"{dflt[0]['us']:.2f} us" if dflt else "not in grid"), flush=True)
                for r in ok[:5]:
                    print(f"    BN{r['BLOCK_N']:3d} BK{r['BLOCK_K']:5d} w{r['num_warps']} tiles{r.get('TILES', '-')}"
                          f" {r['us']:7.2f} us ({r['us'] / r['read_us']:.2f}x the read)"
                          + (" *" if r["default"] else ""), flush=True)
        if not a.layer_tokens:
            continue
        modes = {m: W8A8_MODES[m] for m in a.layer_modes.split(",")}
        rows = variants_ab(name, int(tp), scheme, bw, [int(t) for t in a.layer_tokens.split(",")], modes,
                           rounds=a.layer_rounds)
        res["layer"] += rows
        for r in rows:
            print(f"layer {case} T={r['T']} {r['variant']:4s} graph {r['us_graph']:6.2f} us ({r['ratio']:.2f}x the "
                  f"8-bit read) err {r['err']:.2e} ok={r['ok']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
