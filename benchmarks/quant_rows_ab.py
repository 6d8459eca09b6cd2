"""Row quantizers (kernels/quantize.py) on prefill sizes: rows per program swept, GB/s.

    python3 benchmarks/quant_rows_ab.py [--out quant_rows_ab.json] [--reciprocal | --warps | --chunks]

Per-token fp8 / int8 of h [T*k, I] and x [T, H] (qwen3-30b-a3b, T = 16384: the W8A8 grouped
path's requantization and input quantization), 1 x 128 group fp8 of x [T, 7168] and h
[T*k, 256] (deepseek-v3 tp8). Each: the ``rows_per_program`` rule's choice and 1, 2, 4, 8,
16, CUDA-graph replay over rotating inputs, GB/s of bytes read + written, % of copy bandwidth.
"""
from __future__ import annotations

import argparse
import json

import torch

from fusedmoe.bench import harness as hz
from fusedmoe.kernels import quantize as qk

CASES = [("h qwen3 [131072, 768] fp8 token", (131072, 768), "fp8_token"),
         ("h qwen3 [131072, 768] int8 token", (131072, 768), "int8_token"),
         ("x qwen3 [16384, 2048] fp8 token", (16384, 2048), "fp8_token"),
         ("x deepseek [16384, 7168] fp8 group", (16384, 7168), "fp8_group"),
         ("h deepseek [131072, 256] fp8 group", (131072, 256), "fp8_group")]


def warps_sweep(bw):
    """Per-token fp8 / int8 of h [131072, 768] (the W8A8 requantization at T=16384): rows per
    program x num_warps (quantize._quant_token's measurement hook)."""
    out = []
    x = [torch.randn(131072, 768, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    nbytes = x[0].numel() * 3 + x[0].shape[0] * 4
    for dt, qt in ((torch.float8_e4m3fn, "fp8"), (torch.int8, "int8")):
        for rows in (1, 2, 4, 8):
            for warps in (1, 2, 4, 8):
                try:
                    us = hz.time_graph([lambda a=a: qk._quant_token(a, dt, qt, None, None, None, rows=rows,
                                                                    num_warps=warps) for a in x])
                    r = dict(case=f"h [131072, 768] {qt} token", rows=rows, num_warps=warps, us=us,
                             pct=100 * nbytes / us / 1e3 / bw)
                except Exception as e:  # noqa: BLE001
                    r = dict(case=qt, rows=rows, num_warps=warps, error=f"{type(e).__name__}: {str(e)[:200]}")
                out.append(r)
                print(r, flush=True)
    return out


def chunks_sweep(bw):
    """Per-token fp8 / int8 of h [131072, 768]: the rule (one 1024 tile per row, 25% of its
    lanes masked) against BLOCK_K 256 (an amax pass and a quantize pass over 3 chunks, the
    second reading the row again from L1 / L2), rows per program x num_warps."""
    out = []
    x = [torch.randn(131072, 768, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    nbytes = x[0].numel() * 3 + x[0].shape[0] * 4
    grid = [(None, None, None)] + [(256, r, w) for r in (1, 2, 4, 8) for w in (1, 2, 4)] + [(None, None, None)]
    for dt, qt in ((torch.float8_e4m3fn, "fp8"), (torch.int8, "int8")):
        for bk, rows, warps in grid:
            try:
                us = hz.time_graph([lambda a=a: qk._quant_token(a, dt, qt, None, None, None, rows=rows,
                                                                num_warps=warps, block_k=bk) for a in x])
                r = dict(case=f"h [131072, 768] {qt} token", block_k=bk or "rule", rows=rows or "rule",
                         num_warps=warps or "rule", us=us, pct=100 * nbytes / us / 1e3 / bw)
            except Exception as e:  # noqa: BLE001
                r = dict(case=qt, block_k=bk, rows=rows, num_warps=warps, error=f"{type(e).__name__}: {str(e)[:200]}")
            out.append(r)
            print(r, flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="quant_rows_ab.json")
    ap.add_argument("--warps", action="store_true", help="only the rows x num_warps sweep of h [131072, 768]")
    ap.add_argument("--reciprocal", action="store_true",
                    help="each case with the division by the scale and through its reciprocal (RECIPROCAL_DIV)")
    ap.add_argument("--chunks", action="store_true",
                    help="only per-token h [131072, 768]: the 1024 tile vs rows read as 3 chunks of 256 "
                         "(rows x num_warps)")
    a = ap.parse_args()
    bw = hz.measure_ceilings("cuda").copy_gbps
    if a.chunks:
        with open(a.out, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=chunks_sweep(bw)), f, indent=1)
        return
    if a.warps:
        with open(a.out, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=warps_sweep(bw)), f, indent=1)
        return
    res = []
    for label, shape, kind in CASES:
        xs = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        fn = {"fp8_token": qk.quant_fp8_token, "int8_token": qk.quant_int8_token,
              "fp8_group": qk.quant_fp8_group}[kind]
        nbytes = xs[0].numel() * 3 + xs[0].numel() * 4 // (1 if kind != "fp8_group" else 128) // shape[1]
        grid = [(r, None) for r in (None, 1, 2, 4, 8, 16)]
        if a.reciprocal:     # rule rows, division vs reciprocal, twice each (alternating)
            grid = [(None, rcp) for _ in range(2) for rcp in (False, True)]
        for rows, rcp in grid:
            kw = {} if rcp is None else dict(reciprocal=rcp)
            try:
                us = hz.time_graph([lambda x=x: fn(x, rows_per_program=rows, **kw) for x in xs])
                r = dict(case=label, rows=rows or "rule", reciprocal=rcp, us=us, gbps=nbytes / us / 1e3,
                         pct=100 * nbytes / us / 1e3 / bw)
            except Exception as e:  # noqa: BLE001  (a failing variant is a result)
                r = dict(case=label, rows=rows or "rule", reciprocal=rcp, error=f"{type(e).__name__}: {str(e)[:200]}")
            res.append(r)
            print(r, flush=True)
        del xs
    with open(a.out, "w") as f:
        json.dump(dict(copy_gbps=bw, rows=res), f, indent=1)


if __name__ == "__main__":
    main()
