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

_R = dict(RESCALE=True, PERSISTENT=0, FLATTEN=False)   # block scales applied to the accumulator
CASES = [   # session 9: qwen3 T=1024 (79.6%, ncu: GEMM1 L2 throughput 93%, DRAM 85%): BM 128 puts
    # each expert's ~64 rows in one m-block (BM 64 gave half the experts a second, nearly empty
    # one that re-reads the weights through L2); GEMM2 BM 64 then skips all-padding sub-blocks
    ("qwen3-30b-a3b", 1, 1024, "E=128,N=768,", [
        ("g1 BM128 w8", "gemm1", dict(BLOCK_SIZE_M=128, num_warps=8)),
        ("g1 BM128 w8 s3", "gemm1", dict(BLOCK_SIZE_M=128, num_warps=8, num_stages=3)),
        ("g1 BM128 w8 tma", "gemm1", dict(BLOCK_SIZE_M=128, num_warps=8, USE_TMA=True)),
        ("g1+g2 BM128", [("gemm1", dict(BLOCK_SIZE_M=128, num_warps=8)),
                         ("gemm2", dict(BLOCK_SIZE_M=128, num_stages=4))]),
    ]),
]


def bench(model, tp, T, cfg_dir=None, quant="none"):
    env = dict(os.environ)
    env.pop("FUSEDMOE_CONFIG_DIR", None)
    if cfg_dir:
        env["FUSEDMOE_CONFIG_DIR"] = cfg_dir
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        try:
            subprocess.run([sys.executable, "-m", "fusedmoe", "bench", "--tokens", str(T), "--model", model, "--tp",
                            str(tp), "--peers", "none", "--backend", "triton", "--quant", quant, "--json", f.name],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=150)
            r = [x for x in json.load(open(f.name))["results"] if x["impl"] == "triton"
                 and x.get("scheme", quant) == quant][0]
        except Exception:                      # the variant failed (compile, shared memory): say so
            return float("nan"), float("nan")
    return r["us_graph"] or float("nan"), r["pct_roofline"] or float("nan")


for model, tp, T, prefix, variants, *rest in CASES:
    quant = rest[0] if rest else "none"
    dt = "bfloat16" if quant == "none" else quant
    src = glob.glob(f"fusedmoe/kernels/configs/{prefix}device_name=NVIDIA_H100_80GB_HBM3,dtype={dt}*.json")[0]
    us, pct = bench(model, tp, T, quant=quant)
    print(f"{model} tp{tp} T={T} shipped: {us:9.1f} us {pct:5.1f}%", flush=True)
    for label, gemm, over in [v if len(v) == 3 else (v[0], v[1], None) for v in variants]:
        d = json.load(open(src))
        for g, o in ([(gemm, over)] if over is not None else gemm):
            d[str(T)][g].update(o)
        over = over if over is not None else gemm
        with tempfile.TemporaryDirectory() as td:
            json.dump(d, open(os.path.join(td, os.path.basename(src)), "w"))
            us, pct = bench(model, tp, T, td, quant)
        print(f"{model} tp{tp} T={T} {label:16s}: {us:9.1f} us {pct:5.1f}%  {over}", flush=True)
    us, pct = bench(model, tp, T, quant=quant)      # the shipped entry again: the spread of the run
    print(f"{model} tp{tp} T={T} shipped again: {us:9.1f} us {pct:5.1f}%", flush=True)
