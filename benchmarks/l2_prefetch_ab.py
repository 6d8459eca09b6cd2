"""A/B of the decode GEMM1's L2 prefetch of GEMM2's weights (FUSEDMOE_DECODE_L2 0 / 1 / 2,
kernels/decode.py ``_l2_prefetch_next``): the layer's graph time per (preset, scheme, T),
rounds alternating, best of each, checked against the reference (decode_ab.variants_ab).

    python3 benchmarks/l2_prefetch_ab.py [--cases model:tp:scheme:T1/T2,...] [--rounds 2] [--out FILE]

Why: at T=1 the decode GEMM2 reads its 8-bit weights at ~42-63% of copy bandwidth (short K,
few steps a program, docs/BENCHMARKS.md twelfth session); its weights do not depend on
GEMM1's output, so GEMM1's programs can ask L2 for them while they stream their own.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from decode_ab import _print_layer_rows, variants_ab  # noqa: E402
from fusedmoe.bench import harness as hz  # noqa: E402

CASES = ("qwen3-30b-a3b:1:fp8_channel:1,qwen3-30b-a3b:1:int8_channel:1,deepseek-v3:8:fp8_block:1,"
         "qwen3-30b-a3b:1:none:1/2/4,deepseek-v3:8:none:1/2/4/8,mixtral-8x7b:1:none:1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--modes", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="l2_prefetch_ab.json")
    a = ap.parse_args()
    ceil = hz.measure_ceilings("cuda")
    print(f"{ceil.device}: copy {ceil.copy_gbps:.0f} GB/s", flush=True)
    variants = {f"l2={m}": dict(FUSEDMOE_DECODE_L2=m) for m in a.modes.split(",")}
    res = dict(device=ceil.device, copy_gbps=ceil.copy_gbps, rows=[])
    for case in a.cases.split(","):
        name, tp, scheme, tokens = case.split(":")
        rows = variants_ab(name, int(tp), scheme, ceil.copy_gbps, [int(t) for t in tokens.split("/")], variants,
                           a.rounds)
        _print_layer_rows("L2", name, scheme, rows, 5)
        res["rows"] += rows
        json.dump(res, open(a.out, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
