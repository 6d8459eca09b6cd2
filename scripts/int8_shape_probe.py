"""Is int8's wgmma shape what keeps int8 GEMMs behind fp8's? A dense probe, triton against Gluon.

    python3 scripts/int8_shape_probe.py             (GPU: check every variant, then time it)
    python3 scripts/int8_shape_probe.py --compile   (CPU: sm_90a compile, the wgmma shapes in the PTX)

Why: qwen3-30b-a3b int8_channel's grouped GEMMs run 10% behind fp8_channel's at the same tiles
(T=16384: 1589 vs 1445 µs, docs/BENCHMARKS.md twenty-third section). Triton 3.6 / 3.9 emit one
wgmma m64n256k32 a K step for e4m3 at BN 256 but two m64n128k32 for s8 (its int8 instruction
shapes stop at n 128), and the int32 -> fp32 epilogue conversions explain at most a quarter of
the gap (benchmarks/i2f_rate.py). Gluon lets a kernel pick its own instruction shape. This probe
times C[M, N] = A[M, K] @ B[N, K]^T (both K-major, bf16 out) at a qwen3 GEMM2-like shape:

  tl_fp8 / tl_int8    triton: acc = tl.dot(a, b.T, acc) over TMA descriptors, 128 x 256 x 128 tiles
  gl_fp8 / gl_int8    Gluon: the same pipeline (TMA ring of STAGES, one asynchronous wgmma in
                      flight), accumulator instruction shape m64 n{N_INSTR} k32
  gl_int8_n128        Gluon int8 with n 128 instructions (what triton picks)

Everything is a probe: no library code uses it. Result (session 23, `--compile`, triton 3.6 and
3.9): gl_int8 does not compile: the NVGPU -> LLVM lowering asserts "WGMMA type or shape is not
supported" for s8 at n 256, so neither triton nor Gluon can issue it; gl_int8_n128 and tl_int8
emit 8 x m64n128k32.s32, gl_fp8 / tl_fp8 4 x m64n256k32.f32 a 128 x 256 x 128 step. (tl_int8's
CPU compile fails under 3.6 in this script's hand-made signature; the library's int8 kernels,
compiled by scripts/compile_check.py, show the same 8 IGMMA.64 a step under 3.6.)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # fusedmoe, uninstalled

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GlDesc

try:
    from triton.tools.tensor_descriptor import TensorDescriptor as TlDesc
except ImportError:          # pragma: no cover
    TlDesc = None

# 3.6 names the TMA load async_copy_global_to_shared; 3.9 async_load (same arguments)
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared


@gluon.jit
def _gl_kernel(a_desc, b_desc, c_ptr, K, stride_cm, INT: gl.constexpr, N_INSTR: gl.constexpr, BM: gl.constexpr,
               BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Grid (M / BM, N / BN); K a multiple of BK, at least STAGES steps."""
    off_m = gl.program_id(0) * BM
    off_n = gl.program_id(1) * BN
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, N_INSTR, 32])
    a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_s = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    nbytes: gl.constexpr = (BM + BN) * BK
    k_tiles = K // BK
    for i in gl.static_range(STAGES - 1):
        mbarrier.expect(bars.index(i), nbytes)
        _tma_load(a_desc, [off_m, i * BK], bars.index(i), a_s.index(i))
        _tma_load(b_desc, [off_n, i * BK], bars.index(i), b_s.index(i))
    if INT:
        acc = gl.zeros([BM, BN], gl.int32, acc_l)
    else:
        acc = gl.zeros([BM, BN], gl.float32, acc_l)
    for k in range(0, k_tiles):
        s = k % STAGES
        mbarrier.wait(bars.index(s), (k // STAGES) & 1)
        acc = warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])     # step k - 1 retired: its stage is free
        nxt = k + STAGES - 1
        ns = nxt % STAGES
        mbarrier.expect(bars.index(ns), nbytes, pred=nxt < k_tiles)
        _tma_load(a_desc, [off_m, nxt * BK], bars.index(ns), a_s.index(ns), pred=nxt < k_tiles)
        _tma_load(b_desc, [off_n, nxt * BK], bars.index(ns), b_s.index(ns), pred=nxt < k_tiles)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    rows = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_l))
    cols = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_l))
    gl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(gl.float32).to(gl.bfloat16))


@triton.jit
def _tl_kernel(a_desc, b_desc, c_ptr, K, stride_cm, INT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr):
    off_m = tl.program_id(0) * BM
    off_n = tl.program_id(1) * BN
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    if INT:
        acc = tl.zeros([BM, BN], tl.int32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(0, K // BK):
        a = a_desc.load([off_m, k * BK])
        b = b_desc.load([off_n, k * BK])
        acc = tl.dot(a, b.T, acc)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(tl.float32).to(tl.bfloat16))


VARIANTS = {"tl_fp8": ("tl", False, 256), "tl_int8": ("tl", True, 256), "gl_fp8": ("gl", False, 256),
            "gl_int8": ("gl", True, 256), "gl_int8_n128": ("gl", True, 128)}


def launch(name, a, b, c, BM=128, BN=256, BK=128, stages=4, warps=8):
    kind, _, n_instr = VARIANTS[name]
    M, K = a.shape
    N = b.shape[0]
    grid = (M // BM, N // BN)
    is_int = a.dtype == torch.int8
    if kind == "gl":
        gdt = gl.int8 if is_int else gl.float8e4nv
        ad = GlDesc.from_tensor(a, [BM, BK], gl.NVMMASharedLayout.get_default_for([BM, BK], gdt))
        bd = GlDesc.from_tensor(b, [BN, BK], gl.NVMMASharedLayout.get_default_for([BN, BK], gdt))
        _gl_kernel[grid](ad, bd, c, K, c.stride(0), INT=is_int, N_INSTR=min(n_instr, BN), BM=BM, BN=BN, BK=BK,
                         STAGES=stages, num_warps=warps)
    else:
        ad, bd = TlDesc.from_tensor(a, [BM, BK]), TlDesc.from_tensor(b, [BN, BK])
        _tl_kernel[grid](ad, bd, c, K, c.stride(0), INT=is_int, BM=BM, BN=BN, BK=BK, num_warps=warps,
                         num_stages=stages)


def gpu(shapes, variants):
    from fusedmoe.bench.harness import time_graph
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    for M, N, K in shapes:
        ai = torch.randint(-127, 128, (M, K), device="cuda", dtype=torch.int8)
        bi = torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8)
        af = (torch.randn(M, K, device="cuda") * 2).to(torch.float8_e4m3fn)
        bf = (torch.randn(N, K, device="cuda") * 2).to(torch.float8_e4m3fn)
        refs = {True: ai.double() @ bi.double().T, False: af.double() @ bf.double().T}
        flop = 2 * M * N * K
        for name in variants:
            is_int = VARIANTS[name][1]
            a, b = (ai, bi) if is_int else (af, bf)
            for cfg in (dict(stages=4), dict(stages=3), dict(BN=128, stages=4)):
                c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
                tag = f"M={M} N={N} K={K} {name:13s} {cfg}"
                try:
                    launch(name, a, b, c, **cfg)
                    torch.cuda.synchronize()
                    ref = refs[is_int]
                    err = ((c.double() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        print(f"{tag}: WRONG rel err {err:.3g}", flush=True)
                        continue
                    us = time_graph([lambda: launch(name, a, b, c, **cfg)] * 50)
                    print(f"{tag}: {us:8.1f} us {flop / us / 1e6:7.1f} TOP/s  rel err {err:.2e}", flush=True)
                except Exception as e:          # a probe: report and go on
                    print(f"{tag}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


def compile_only(variants):
    """sm_90a compile on the CPU (no launch): the wgmma instructions each variant emits."""
    import re
    from collections import Counter
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource
    target = GPUTarget("cuda", 90, 32)
    BM, BN, BK = 128, 256, 128
    for name in variants:
        kind, is_int, n_instr = VARIANTS[name]
        dt, gdt = ("i8", gl.int8) if is_int else ("fp8e4nv", gl.float8e4nv)
        try:
            if kind == "gl":
                la = gl.NVMMASharedLayout.get_default_for([BM, BK], gdt)
                lb = gl.NVMMASharedLayout.get_default_for([BN, BK], gdt)
                sig = {"a_desc": f"tensordesc<{dt}[{BM}, {BK}],{la!r}>", "b_desc": f"tensordesc<{dt}[{BN}, {BK}],{lb!r}>",
                       "c_ptr": "*bf16", "K": "i32", "stride_cm": "i32", "INT": "constexpr", "N_INSTR": "constexpr",
                       "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "STAGES": "constexpr",
                       "num_warps": "constexpr"}
                consts = dict(INT=is_int, N_INSTR=n_instr, BM=BM, BN=BN, BK=BK, STAGES=4, num_warps=8)
                k = triton.compile(GluonASTSource(_gl_kernel, sig, consts), target=target, options={"num_warps": 8})
            else:
                sig = {"a_desc": f"tensordesc<{dt}[{BM}, {BK}]>", "b_desc": f"tensordesc<{dt}[{BN}, {BK}]>",
                       "c_ptr": "*bf16", "K": "i32", "stride_cm": "i32", "INT": "constexpr", "BM": "constexpr",
                       "BN": "constexpr", "BK": "constexpr"}
                consts = dict(INT=is_int, BM=BM, BN=BN, BK=BK)
                k = triton.compile(ASTSource(_tl_kernel, sig, consts), target=target,
                                   options={"num_warps": 8, "num_stages": 4})
            shapes = Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.(\w+)", k.asm["ptx"]))
            print(f"{name:13s} shared {k.metadata.shared} B  wgmma {dict(shapes)}", flush=True)
        except Exception as e:
            print(f"{name:13s} FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shapes", default="16384x2048x768,16384x1536x2048")
    a = ap.parse_args()
    vs = a.variants.split(",")
    if a.compile:
        compile_only(vs)
    else:
        gpu([tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")], vs)
