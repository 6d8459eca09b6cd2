"""Which wgmma instruction shapes triton picks for qwen3 GEMM2 tiles, fp8 vs int8 (sm_90 compile on a CPU, no GPU).

    python scripts/wgmma_shapes.py        (TRITON_INTERPRET unset; PYTHONPATH to triton 3.6 for the device's)

Session 18: e4m3 gets m64n256k32 at a BN 256 tile, s8 two m64n128k32 (triton 3.6 and 3.9)."""
import os
import re
import sys
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
sys.path.insert(0, os.path.dirname(_here))
os.environ.pop("TRITON_INTERPRET", None)
import torch  # noqa: E402
import compile_check as cc  # noqa: E402
from fusedmoe.kernels import grouped_gemm as gg  # noqa: E402
captured, real = cc._capture(gg)
E, H, I, k, T = 128, 2048, 768, 8, 4096
n = T * k
align = cc._fake_align(E, T, k)
bf = torch.bfloat16
for dt in (torch.float8_e4m3fn, torch.int8):
    for bm, bn, w in ((64, 256, 4), (64, 128, 4), (128, 256, 8)):
        captured.clear()
        gg.gemm2(torch.empty(n, I, dtype=dt), torch.empty(E, H, I, dtype=dt), align, torch.empty(T, k),
                 torch.empty(T, H, dtype=bf), quant="channel", a_scale=torch.empty(n, 1), b_scale=torch.empty(E, H),
                 config=dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=128, num_warps=w, num_stages=2, USE_TMA=True),
                 reduce="atomic_out")
        ck = cc.compile_spec(captured[0])
        shapes = sorted(set(re.findall(r"instrShape = \[(\d+), (\d+), (\d+)\]", ck.asm["ttgir"])))
        ptx = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.(\w+)\.(\w+)\.(\w+)", ck.asm["ptx"])))
        nw = len(re.findall(r"wgmma\.mma_async", ck.asm["ptx"]))
        print(f"{str(dt):22s} {bm}x{bn} w{w}: ttgir instrShape {shapes}  ptx {ptx}  ({nw} wgmma in the ptx)")
