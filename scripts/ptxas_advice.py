"""ptxas's performance advisories (the C75xx "info" lines: wgmma serialized, waits injected, ...)
for the prefill GEMMs of the shipped H100 launch configs (sm_90a compile on a CPU, no GPU).

    python scripts/ptxas_advice.py [T ...]      (TRITON_INTERPRET unset; PYTHONPATH to triton 3.6
                                                 for the device's; default T: 1024 4096 16384)

For each shipped file of the three presets (bf16, fp8_channel, int8_channel, fp8_block) and each
T: GEMM1 and GEMM2 as the triton backend launches them at that T (fp8_block's h quantized in
GEMM1's epilogue; the k-sum as atomic adds into the output), compiled by triton, then the PTX
through the wheel's ptxas -v. Prints registers, spills and every advisory. Why: session 19
found a wait that ptxas injected into the fp8_block GEMM1 loop (C7517) only by reading the SASS.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
sys.path.insert(0, os.path.dirname(_here))
os.environ.pop("TRITON_INTERPRET", None)
import torch  # noqa: E402
import triton  # noqa: E402
import compile_check as cc  # noqa: E402
from fusedmoe.kernels import grouped_gemm as gg  # noqa: E402

PRESETS = {"E=8,N=14336": (8, 4096, 14336, 2), "E=128,N=768": (128, 2048, 768, 8), "E=256,N=256": (256, 7168, 256, 8)}
DEVICE = "NVIDIA_H100_80GB_HBM3"
# triton 3.9 compiles sm_90 PTX for its newer "ptxas-blackwell" (CUDA 13), which the old one rejects
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTXAS = next(p for p in (os.path.join(_BIN, "ptxas-blackwell"), os.path.join(_BIN, "ptxas")) if os.path.exists(p))


def ptxas_info(ptx: str) -> tuple:
    with tempfile.TemporaryDirectory() as td:
        src = os.path.join(td, "k.ptx")
        open(src, "w").write(ptx)
        r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", src, "-o", os.path.join(td, "k.cubin")],
                           capture_output=True, text=True)
    text = r.stdout + r.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    advice = sorted(set(re.sub(r" around line \d+", "", m) for m in re.findall(r"\(C7\d+\)[^\n]*", text)))
    return (int(regs.group(1)) if regs else -1), (int(spill.group(1)) if spill else -1), advice


def launches(prefix: str, scheme: str, T: int, entry: dict) -> list:
    """[(label, spec)] of GEMM1 and GEMM2 at T with the entry's configs."""
    E, H, I, k = PRESETS[prefix]
    n = T * k
    bf = torch.bfloat16
    dt = {"bfloat16": bf, "fp8_channel": torch.float8_e4m3fn, "fp8_block": torch.float8_e4m3fn,
          "int8_channel": torch.int8}[scheme]
    q1, q2, extra1 = {}, {}, {}
    if scheme in ("fp8_channel", "int8_channel"):
        q1 = dict(quant="channel", a_scale=torch.empty(T, 1), b_scale=torch.empty(E, 2 * I))
        q2 = dict(quant="channel", a_scale=torch.empty(n, 1), b_scale=torch.empty(E, H))
    elif scheme == "fp8_block":
        q1 = dict(quant="block", block_shape=(128, 128), a_scale=torch.empty(T, H // 128),
                  b_scale=torch.empty(E, 2 * I // 128, H // 128))
        q2 = dict(quant="block", block_shape=(128, 128), a_scale=torch.empty(n, I // 128),
                  b_scale=torch.empty(E, H // 128, I // 128))
        extra1 = dict(out_group=128)
    captured, real = cc._capture(gg)
    try:
        align = cc._fake_align(E, T, k)
        gg.gemm1_act(torch.empty(T, H, dtype=dt), torch.empty(E, 2 * I, H, dtype=dt), align, k, "silu",
                     config=entry["gemm1"], **q1, **extra1)
        gg.gemm2(torch.empty(n, I, dtype=dt), torch.empty(E, H, I, dtype=dt), align, torch.empty(T, k),
                 torch.empty(T, H, dtype=bf), config=entry["gemm2"], reduce="atomic_out", **q2)
    finally:
        gg.launch = real
    return [("gemm1", captured[0]), ("gemm2", captured[1])]


def main() -> int:
    tokens = [int(t) for t in sys.argv[1:]] or [1024, 4096, 16384]
    print(f"triton {triton.__version__}")
    for path in sorted(glob.glob(os.path.join(os.path.dirname(gg.__file__), "configs", f"*{DEVICE}*.json"))):
        name = os.path.basename(path)
        prefix = name.split(",device_name")[0]
        scheme = re.search(r"dtype=([a-z0-9_]+)", name).group(1)
        d = json.load(open(path))
        for T in tokens:
            if str(T) not in d:
                continue
            for label, spec in launches(prefix, scheme, T, d[str(T)]):
                try:
                    ck = cc.compile_spec(spec)
                    regs, spill, advice = ptxas_info(ck.asm["ptx"])
                    line = f"regs {regs} spill {spill} B" + ("".join(f"\n      {a}" for a in advice) if advice else "")
                except Exception as e:  # a compile failure is a finding too
                    line = f"FAILED {type(e).__name__}: {str(e)[:200]}"
                print(f"{prefix:13s} {scheme:12s} T={T:5d} {label}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
