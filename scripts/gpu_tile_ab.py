"""A/B of single launch-config entries of the shipped H100 bf16 files, through `fusedmoe bench`.

    python3 scripts/gpu_tile_ab.py            (on the GPU, from the repo root)

For each (preset, tp, T): the shipped file, then each variant (the entry's gemm1/gemm2 dict
updated with the overrides) in a FUSEDMOE_CONFIG_DIR copy. Prints the triton graph µs and the
% of roofline per variant. Why: the session-2 tuner's picks for a few prefill points were
beaten by hand-picked neighbours (Mixtral T=16384 GEMM1, docs/BENCHMARKS.md).
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

CASES = [   # session 7 (sessions 3-4's cases and results: docs/BENCHMARKS.md); a variant updates
    # one GEMM's entry (gemm, overrides) or several: [(gemm, overrides), ...]. The tuner splits
    # GEMM2's K only up to 64 tokens per expert; Mixtral T=1024 (256 a expert) runs GEMM2 as
    # ~20 x 16 = 320 programs, 2.4 waves of 132 SMs: splitting K evens the waves out
    ("mixtral-8x7b", 1, 1024, "E=8,N=14336,", [("g2 split2", "gemm2", dict(SPLIT_K=2)),
                                               ("g2 split3", "gemm2", dict(SPLIT_K=3)),
                                               ("g2 split4", "gemm2", dict(SPLIT_K=4)),
                                               ("g2 split2 bn128", "gemm2", dict(SPLIT_K=2, BLOCK_SIZE_N=128))]),
    ("mixtral-8x7b", 1, 256, "E=8,N=14336,", [("g2 split2", "gemm2", dict(SPLIT_K=2))]),
]


def bench(model, tp, T, cfg_dir=None):
    env = dict(os.environ)
    env.pop("FUSEDMOE_CONFIG_DIR", None)
    if cfg_dir:
        env["FUSEDMOE_CONFIG_DIR"] = cfg_dir
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        try:
            subprocess.run([sys.executable, "-m", "fusedmoe", "bench", "--tokens", str(T), "--model", model, "--tp",
                            str(tp), "--peers", "none", "--backend", "triton", "--json", f.name],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=150)
            r = [x for x in json.load(open(f.name))["results"] if x["impl"] == "triton"][0]
        except Exception:                      # the variant failed (compile, shared memory): say so
            return float("nan"), float("nan")
    return r["us_graph"] or float("nan"), r["pct_roofline"] or float("nan")


for model, tp, T, prefix, variants in CASES:
    src = glob.glob(f"fusedmoe/kernels/configs/{prefix}device_name=NVIDIA_H100_80GB_HBM3,dtype=bfloat16.json")[0]
    us, pct = bench(model, tp, T)
    print(f"{model} tp{tp} T={T} shipped: {us:9.1f} us {pct:5.1f}%", flush=True)
    for label, gemm, over in [v if len(v) == 3 else (v[0], v[1], None) for v in variants]:
        d = json.load(open(src))
        for g, o in ([(gemm, over)] if over is not None else gemm):
            d[str(T)][g].update(o)
        over = over if over is not None else gemm
        with tempfile.TemporaryDirectory() as td:
            json.dump(d, open(os.path.join(td, os.path.basename(src)), "w"))
            us, pct = bench(model, tp, T, td)
        print(f"{model} tp{tp} T={T} {label:16s}: {us:9.1f} us {pct:5.1f}%  {over}", flush=True)
