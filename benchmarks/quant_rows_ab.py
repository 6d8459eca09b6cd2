"""Row quantizers (kernels/quantize.py) on prefill sizes: rows per program swept, GB/s.

    python3 benchmarks/quant_rows_ab.py [--out quant_rows_ab.json]

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="quant_rows_ab.json")
    a = ap.parse_args()
    bw = hz.measure_ceilings("cuda").copy_gbps
    res = []
    for label, shape, kind in CASES:
        xs = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        fn = {"fp8_token": qk.quant_fp8_token, "int8_token": qk.quant_int8_token,
              "fp8_group": qk.quant_fp8_group}[kind]
        nbytes = xs[0].numel() * 3 + xs[0].numel() * 4 // (1 if kind != "fp8_group" else 128) // shape[1]
        for rows in (None, 1, 2, 4, 8, 16):
            try:
                us = hz.time_graph([lambda x=x: fn(x, rows_per_program=rows) for x in xs])
                r = dict(case=label, rows=rows or "rule", us=us, gbps=nbytes / us / 1e3, pct=100 * nbytes / us / 1e3 / bw)
            except Exception as e:  # noqa: BLE001  (a failing variant is a result)
                r = dict(case=label, rows=rows or "rule", error=f"{type(e).__name__}: {str(e)[:200]}")
            res.append(r)
            print(r, flush=True)
        del xs
    with open(a.out, "w") as f:
        json.dump(dict(copy_gbps=bw, rows=res), f, indent=1)


if __name__ == "__main__":
    main()
