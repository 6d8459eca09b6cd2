"""Where triton waits on its wgmmas, and where the scale loads sit, in the fp8_block GEMM1 loop
(deepseek-v3 tp8, RESCALE tiles) and in a standalone block-scaled dot (sm_90 compile on a CPU).

    python scripts/wgmma_waits.py        (TRITON_INTERPRET unset; PYTHONPATH to triton 3.6 for the device's)

Session 19: every dot whose accumulator is rescaled, or which starts from zeros, is followed by
``wgmma.wait_group 0`` (synchronous), with triton 3.6 and 3.9, including the DeepGEMM form that
adds the previous group's dot while the next one runs ('late'). Before SCALE_PREFETCH the scale
loads sat in the loop right before the rescale that the next dot waits on. In the SASS (ptxas of
the triton 3.6 wheel) of the gated GEMM1 the loop runs: wait for every wgmma (up's, left in
flight across the back edge), gate's rescale, gate's wgmmas with up's rescale scheduled between
them, wait, up's wgmmas: gate's rescale and the wait between the two dots leave the tensor cores
idle. ptxas -v says why it waits at the top (C7517: "warpgroup.wait is injected ... to allow use
of registers defined by GMMA"). Rescaling gate's tile at the end of the iteration before instead
(commit 98ad774, RESCALE_AHEAD) removed that wait and let gate's wgmmas queue behind up's, and
ran 2.5-4.5% SLOWER on the H100 (docs/bench_h100_s19_rescale_ahead_ab.txt): reverted.
"""
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
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
import compile_check as cc  # noqa: E402
from fusedmoe.kernels import grouped_gemm as gg  # noqa: E402


def loop_summary(ptx: str) -> str:
    """The first loop's wgmma waits, and how many instructions after the loop header the global
    loads and the first division sit."""
    head = ptx.rfind("\n", 0, ptx.find("Loop Header")) + 1
    label = ptx[head:ptx.find(":", head)]                                  # e.g. $L__BB0_5
    body = ptx[head:]
    body = body[:body.find(f"bra \t{label};") if f"bra \t{label};" in body else body.find(f"{label};", len(label) + 1)]
    lines = [x.strip() for x in body.splitlines()[1:] if x.strip() and not x.strip().startswith("//")]
    loads = [i for i, x in enumerate(lines) if x.startswith("ld.global")]
    waits = [(i, x.split()[-1].rstrip(";")) for i, x in enumerate(lines) if x.startswith("wgmma.wait_group")]
    divs = [i for i, x in enumerate(lines) if x.startswith("div.")]
    return f"loop: {len(lines)} lines, ld.global at {loads}, first div at {divs[:1]}, wgmma waits (line, n) {waits}"


def sass_loop(cubin: bytes) -> str:
    """The SASS order of the main loop's wgmma waits (W), wgmma issues (Q), accumulator multiplies
    (m: FMUL runs, counted) and global loads (L), through the nvdisasm of the triton wheel."""
    nvd = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvd, "-c", f.name], capture_output=True, text=True).stdout
    ops = []
    for line in sass.splitlines():
        if "WARPGROUP.DEPBAR" in line:
            ops.append("W")
        elif "GMMA" in line:
            ops.append("Q")
        elif " FMUL " in line:
            ops.append("m")
        elif "LDG.E " in line:
            ops.append("L")
    text = "".join(ops)
    first_q = text.find("Q")
    loop = text[max(0, text.rfind("W", 0, first_q)):]          # from the wait before the first wgmma
    return re.sub(r"m{2,}", lambda r: f"m{len(r.group())}", loop[:loop.find("W", loop.rfind("Q")) + 1])


captured, real = cc._capture(gg)
E, H, I, k, T = 256, 7168, 256, 8, 4096
n = T * k
align = cc._fake_align(E, T, k)
fp8, bf = torch.float8_e4m3fn, torch.bfloat16
for prefetch in (False, True):
    gg.SCALE_PREFETCH = prefetch
    for bm, w, st in ((128, 8, 4), (64, 4, 5)):
        captured.clear()
        gg.gemm1_act(torch.empty(T, H, dtype=fp8), torch.empty(E, 2 * I, H, dtype=fp8), align, k, "silu",
                     torch.empty(n, I, dtype=bf), quant="block", block_shape=(128, 128),
                     config=dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=w,
                                 num_stages=st, RESCALE=True, USE_TMA=True),
                     a_scale=torch.empty(T, H // 128), b_scale=torch.empty(E, 2 * I // 128, H // 128))
        ck = cc.compile_spec(captured[0])
        print(f"gemm1 {bm}x128 w{w} s{st} prefetch={prefetch}: {loop_summary(ck.asm['ptx'])}")
        print(f"    sass: {sass_loop(ck.asm['cubin'])}")
gg.launch = real


@triton.jit
def _block_dot(a_ptr, b_ptr, s_ptr, c_ptr, K, MODE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr):
    offs_m, offs_n, offs_k = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BM, BN), tl.float32)
    d_prev = tl.zeros((BM, BN), tl.float32)
    s_prev = 0.0
    for it in range(0, K // BK):
        a, b, s = tl.load(a_ptrs), tl.load(b_ptrs), tl.load(s_ptr + it)
        if MODE == 0:       # rescale in place (RESCALE)
            acc = tl.dot(a, b, acc * s)
        elif MODE == 1:     # a fresh dot a group, added at once (the per-group dot)
            acc += tl.dot(a, b) * s
        else:               # a fresh dot, added one iteration late (DeepGEMM's promotion)
            d = tl.dot(a, b)
            acc += d_prev * s_prev
            d_prev, s_prev = d, s
        a_ptrs += BK
        b_ptrs += BK
    tl.store(c_ptr + offs_m[:, None] * BN + offs_n[None, :], acc + d_prev * s_prev)


for mode, name in enumerate(("rescale", "per-group", "late")):
    sig = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "s_ptr": "*fp32", "c_ptr": "*fp32", "K": "i32",
           "MODE": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    src = ASTSource(_block_dot, sig, constexprs={"MODE": mode, "BM": 128, "BN": 128, "BK": 128},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
    print(f"standalone {name:10s}: {loop_summary(ck.asm['ptx'])}")
