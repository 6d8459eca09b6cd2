"""The split-I decode (kernels/decode_split.py: the layer in one launch, no grid-wide wait)
against the two-kernel a16 decode and the default (FUSEDMOE_W8A8_DECODE=auto), in the layer.

    python3 benchmarks/split_ab.py [--cases deepseek-v3:8:fp8_block:1,2,...] [--configs BI,BK,BH,W;...]
                                   [--rounds 2] [--json F]

Each case's T: the layer (prepare_experts, backend triton) under each variant's environment,
rounds alternating, best graph / eager µs, checked against the reference first
(decode_ab.variants_ab); % of the roofline of `fusedmoe bench` (the hit experts' weight bytes at
the measured copy bandwidth).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_ab import _print_layer_rows, variants_ab  # noqa: E402

from fusedmoe.bench import harness as hz  # noqa: E402

CASES = ("deepseek-v3:8:fp8_block:1,2,3,4;qwen3-30b-a3b:1:fp8_channel:1,2,3;qwen3-30b-a3b:1:int8_channel:1,2;"
         "qwen3-30b-a3b:1:none:1,2;deepseek-v3:8:none:1,2")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=CASES, help="model:tp:scheme:T,T;...")
    ap.add_argument("--configs", default="", help="split tiles to add as variants: BI,BK,BH,W;...")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-auto", action="store_true", help="leave out the default (auto) variant")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    ceil = hz.measure_ceilings("cuda")
    bw = ceil.copy_gbps
    print(f"{ceil.device}: copy {bw:.0f} GB/s", flush=True)
    a16 = dict(FUSEDMOE_W8A8_DECODE="a16", FUSEDMOE_DECODE_PAIRS="4096")
    variants = {} if a.no_auto else {"auto": dict(FUSEDMOE_W8A8_DECODE="auto")}
    variants.update({"a16": dict(a16, FUSEDMOE_DECODE_SPLIT="0"), "split": dict(a16, FUSEDMOE_DECODE_SPLIT="1")})
    for c in filter(None, a.configs.split(";")):
        variants[f"split{c.replace(',', '_')}"] = dict(a16, FUSEDMOE_DECODE_SPLIT="1", FUSEDMOE_SPLIT_CONFIG=c)
    rows = []
    for case in a.cases.split(";"):
        name, tp, scheme, toks = case.split(":")
        r = variants_ab(name, int(tp), scheme, bw, [int(t) for t in toks.split(",")], variants, a.rounds)
        _print_layer_rows("S", name, scheme, r, max(len(v) for v in variants))
        rows += r
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=ceil.device, copy_gbps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
