"""A/B of where the grouped path quantizes GEMM2's input h (FUSEDMOE_H_QUANT), through `fusedmoe bench`.

    python3 scripts/gpu_hquant_ab.py [--rounds 2] [--cases ...] [--variants kernel,epilogue] [--tokens 4096]
        (on the GPU, from the repo root)

(Session 18 measured 'gemm2', GEMM2 quantizing the 16-bit h per token as it loads it: commit
bbab91c, reverted; docs/bench_h100_s18_hquant_gemm2_ab.txt. And 'token', GEMM1 storing h quantized
per token: commit a741476, reverted; docs/bench_h100_s18_hquant_token_ab.txt. Both slower.)
Variants, alternating per round: 'kernel' (16-bit h from GEMM1, then the scheme's quantization
kernel), 'epilogue' (GEMM1 writes fp8 h with 1 x 128 group scales), and for fp8_channel 'epilogue, GEMM2
no RESCALE' (a second fp32 tile per K group instead of scaling the accumulator in place).
Prints the triton graph µs per (preset, scheme, T), and bf16 once per round (with the first
variant) for the ratio issue 5 asks for.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

TOKENS = "1024,4096,16384"
CASES = [("qwen3-30b-a3b", 1, "fp8_channel", "E=128,N=768,"), ("qwen3-30b-a3b", 1, "int8_channel", "E=128,N=768,"),
         ("deepseek-v3", 8, "fp8_block", "E=256,N=256,")]


def bench(model, tp, quants, env_over, cfg_dir=None, tokens=TOKENS):
    env = dict(os.environ, **env_over)
    env.pop("FUSEDMOE_CONFIG_DIR", None)
    if cfg_dir:
        env["FUSEDMOE_CONFIG_DIR"] = cfg_dir
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([sys.executable, "-m", "fusedmoe", "bench", "--tokens", tokens, "--model", model, "--tp",
                            str(tp), "--peers", "none", "--backend", "triton", "--quant", quants, "--json", f.name],
                           env=env, capture_output=True, text=True, timeout=280)
        try:
            res = json.load(open(f.name))["results"]
        except Exception:
            print(r.stdout[-2000:], r.stderr[-2000:])
            return {}
    out = {}
    for x in res:
        if x["impl"] == "triton":
            out[(x["scheme"], x["T"])] = (x["us_graph"] or float("nan"), x["pct_roofline"], x["status"] == "ok",
                                          x["rel_err"])
    return out


def no_rescale_dir(prefix, scheme):
    src = glob.glob(f"fusedmoe/kernels/configs/{prefix}device_name=NVIDIA_H100_80GB_HBM3,dtype={scheme}*.json")[0]
    d = json.load(open(src))
    for k, v in d.items():
        if k not in ("meta", "triton_version"):
            v["gemm2"]["RESCALE"] = False
    tmp = tempfile.mkdtemp()
    json.dump(d, open(os.path.join(tmp, os.path.basename(src)), "w"))
    return tmp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default="qwen3-30b-a3b:fp8_channel,deepseek-v3:fp8_block",
                    help="model:scheme pairs (a bare model: all its schemes here)")
    ap.add_argument("--variants", default="kernel,epilogue,epilogue-norescale")
    ap.add_argument("--tokens", default=TOKENS)
    a = ap.parse_args()
    want = a.cases.split(",")
    for model, tp, scheme, prefix in CASES:
        if model not in want and f"{model}:{scheme}" not in want:
            continue
        variants = []
        for v in a.variants.split(","):
            if v in ("kernel", "epilogue"):
                if v == "epilogue" and scheme == "int8_channel":
                    continue
                variants.append((v, {"FUSEDMOE_H_QUANT": v}, None, scheme))
            elif v == "epilogue-norescale" and scheme == "fp8_channel":
                variants.append(("epilogue, GEMM2 no RESCALE", {"FUSEDMOE_H_QUANT": "epilogue"},
                                 no_rescale_dir(prefix, scheme), scheme))
        variants[0] = variants[0][:3] + ("none," + scheme,)
        for rnd in range(a.rounds):
            for label, env_over, cfg_dir, quants in variants:
                res = bench(model, tp, quants, env_over, cfg_dir, a.tokens)
                for (s, T), (us, pct, ok, err) in sorted(res.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
                    print(f"{model} tp{tp} {s:12s} T={T:6d} round {rnd} {label:28s} {us:9.1f} us "
                          f"{(pct or 0):5.1f}%  check {'ok' if ok else 'FAILED'} {err or 0:.2e}", flush=True)


if __name__ == "__main__":
    main()
