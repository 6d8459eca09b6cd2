"""Does TMA multicast lift the L2-bound 16-bit GEMM1 of Mixtral at T=1024? A dense probe (triton 3.9).

    python3 scripts/multicast_probe.py             (GPU, triton >= 3.9: check every variant, then time it)
    python3 scripts/multicast_probe.py --compile   (CPU: sm_90a compile, registers, the multicast PTX)

Why (docs/NOTES.md, issue 4): at Mixtral T=1024 each expert holds ~256 rows, GEMM1 is
[256, 4096] x [4096, 28672] per expert, and the layer runs at 58% of the roofline. Each
128 x 128 tile reads its A and B K-slices from L2 (~11 TB/s of L2 reads at the tensor-core
rate, more than the L2 gives), so the tensor cores wait. Hopper's cure is a cluster of CTAs
sharing a tile through TMA multicast: two CTAs holding the two 128-row halves of one expert's
256 rows need the same weight tile, and one multicast load puts it in both shared memories,
halving B's L2 reads. Triton 3.6 (the device image's) cannot express it; Gluon in 3.9 can
(``num_ctas=2``, a broadcast ``cga_layout`` on B, ``tma.async_load(..., multicast=True)``).
scripts/t39_env.sh runs triton 3.9 on the device.

The problem: E experts, A [E * M_E, K] (rows of expert e contiguous, as the aligned / gathered
tokens would be), B [E * N, K] (each expert's gate+up weight, K-major as the library stores
it), C_e = A_e B_e^T, bf16 in, fp32 accumulation, bf16 out. Variants:

  tl        triton tl.dot, host TMA descriptors, one 128-row tile a program (the library's kind of kernel).
  gl        Gluon, one CTA a program, TMA ring of STAGES, one wgmma in flight.
  gl_mc     the same with a cluster of 2 CTAs on the two 128-row halves of 256 rows: A split, B
            broadcast and loaded once by CTA 0 with multicast into both. CTA 0 reloads a stage
            only after both CTAs retired the dot that read it (an ``empty`` mbarrier per stage
            shared by the cluster, in CTA 0, that both arrive on).

Everything is a probe: no library code uses it.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GlDesc
    from triton.tools.tensor_descriptor import TensorDescriptor as TlDesc
except ImportError:  # pragma: no cover
    GlDesc = TlDesc = None


@gluon.jit
def _tile_offsets(t, N, M_E, BM: gl.constexpr, BN: gl.constexpr):
    mb_per_e = M_E // BM
    nb = N // BN
    mb = t % mb_per_e
    en = t // mb_per_e
    e = en // nb
    return e * M_E + mb * BM, e * N + (en % nb) * BN, (en % nb) * BN


@gluon.jit
def _gl_kernel(a_desc, b_desc, c_ptr, N, K, M_E, stride_cm,
               MC: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr, num_warps: gl.constexpr):
    """One program = one cluster tile of BM rows (split over the cluster's CTAs) x BN columns.
    Programs in order (expert, n-block, m-block): neighbours share the expert's B tile in L2."""
    off_am, off_bn, off_cn = _tile_offsets(gl.program_id(0), N, M_E, BM, BN)
    CGA: gl.constexpr = [[1, 0]] if MC else []
    IK: gl.constexpr = 256 // a_desc.dtype.primitive_bitwidth
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BN, IK], cga_layout=CGA)
    a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_s = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    if MC:
        # one barrier a stage for the whole cluster (broadcast layout: it lives in CTA 0, the one
        # that issues B's multicast load; init's count is per CTA, so both must arrive)
        empty = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
        for i in gl.static_range(STAGES):
            mbarrier.init(empty.index(i), count=1)
    nbytes: gl.constexpr = a_desc.nbytes_per_cta + b_desc.nbytes_per_cta
    k_tiles = K // BK
    for i in gl.static_range(STAGES - 1):
        mbarrier.expect(ready.index(i), nbytes)
        tma.async_load(a_desc, [off_am, i * BK], ready.index(i), a_s.index(i))
        tma.async_load(b_desc, [off_bn, i * BK], ready.index(i), b_s.index(i), multicast=MC)
    acc = gl.zeros([BM, BN], gl.float32, acc_l)
    for k in range(k_tiles):
        s = k % STAGES
        mbarrier.wait(ready.index(s), (k // STAGES) & 1)
        acc = warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
        # step k - 1's dot has retired: its stage is free here; load step k + STAGES - 1 into it
        nxt = k + STAGES - 1
        ns = nxt % STAGES
        if MC:
            mbarrier.arrive(empty.index(ns), pred=k > 0)
            # CTA 0 (the only waiter) waits for both CTAs' release of that stage's previous use
            mbarrier.wait(empty.index(ns), ((nxt // STAGES) - 1) & 1, pred=(k > 0) & (nxt < k_tiles))
        mbarrier.expect(ready.index(ns), nbytes, pred=nxt < k_tiles)
        tma.async_load(a_desc, [off_am, nxt * BK], ready.index(ns), a_s.index(ns), pred=nxt < k_tiles)
        tma.async_load(b_desc, [off_bn, nxt * BK], ready.index(ns), b_s.index(ns), pred=nxt < k_tiles,
                       multicast=MC)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    rows = off_am + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_l))
    cols = off_cn + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_l))
    gl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(gl.bfloat16))


# ------------------------------------------------------------------ warp-specialized, persistent (gl_ws)
# One program an SM walks tiles t = pid, pid + P, ... (same order as above). A 1-warp producer
# fills a ring of STAGES buffers (ready / empty mbarriers) and runs ahead across tiles; two
# consumer warpgroups own the two 64-row halves of the 128-row tile, each with one asynchronous
# wgmma in flight, and release a stage once the dot that read it has retired. The tensor cores
# only wait on the consumers' epilogue (a direct store), which the producer's loads of the next
# tile overlap. (Session 22's gl_ws in gluon_block_probe.py issued synchronous dots.)


@gluon.jit
def _ws_consumer(a_s, b_s, ready, empty, c_ptr, N, K, M_E, stride_cm, num_tiles, HALF: gl.constexpr,
                 BH: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, NUM_PROGS: gl.constexpr):
    IK: gl.constexpr = 256 // a_s.dtype.primitive_bitwidth     # wgmma's K: 16 for 16-bit operands, 32 for 8-bit
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, IK])
    k_tiles = K // BK
    it = 0
    for t in range(gl.program_id(0), num_tiles, NUM_PROGS):
        off_am, off_bn, off_cn = _tile_offsets(t, N, M_E, 2 * BH, BN)
        acc = gl.zeros([BH, BN], gl.float32, acc_l)
        for k in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            acc = warpgroup_mma(a_s.index(2 * s + HALF), b_s.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=k > 0)   # the previous step's stage
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        rows = off_am + HALF * BH + gl.arange(0, BH, layout=gl.SliceLayout(1, acc_l))
        cols = off_cn + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_l))
        gl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def _ws_producer(a_desc, b_desc, a_s, b_s, ready, empty, N, K, M_E, num_tiles, BH: gl.constexpr, BN: gl.constexpr,
                 BK: gl.constexpr, STAGES: gl.constexpr, NUM_PROGS: gl.constexpr):
    nbytes: gl.constexpr = 2 * a_desc.nbytes_per_cta + b_desc.nbytes_per_cta
    k_tiles = K // BK
    it = 0
    for t in range(gl.program_id(0), num_tiles, NUM_PROGS):
        off_am, off_bn, off_cn = _tile_offsets(t, N, M_E, 2 * BH, BN)
        for k in range(k_tiles):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)     # fresh barriers pass parity 1
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_load(a_desc, [off_am, k * BK], ready.index(s), a_s.index(2 * s))
            tma.async_load(a_desc, [off_am + BH, k * BK], ready.index(s), a_s.index(2 * s + 1))
            tma.async_load(b_desc, [off_bn, k * BK], ready.index(s), b_s.index(s))
            it += 1


@gluon.jit
def _ws_kernel(a_desc, b_desc, c_ptr, N, K, M_E, stride_cm, num_tiles, BN: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr, NUM_PROGS: gl.constexpr, REGS: gl.constexpr, num_warps: gl.constexpr):
    """a_desc's block is [64, BK] (one consumer's half of the 128-row tile); num_warps 4."""
    BH: gl.constexpr = a_desc.block_shape[0]
    a_s = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, BH, BK], a_desc.layout)
    b_s = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)          # both consumers release a stage
    ZERO: gl.constexpr = 0
    ONE: gl.constexpr = 1
    if REGS:
        gl.warp_specialize([
            (_ws_consumer, (a_s, b_s, ready, empty, c_ptr, N, K, M_E, stride_cm, num_tiles, ZERO, BH, BN, BK, STAGES,
                            NUM_PROGS)),
            (_ws_consumer, (a_s, b_s, ready, empty, c_ptr, N, K, M_E, stride_cm, num_tiles, ONE, BH, BN, BK, STAGES,
                            NUM_PROGS)),
            (_ws_producer, (a_desc, b_desc, a_s, b_s, ready, empty, N, K, M_E, num_tiles, BH, BN, BK, STAGES,
                            NUM_PROGS)),
        ], [4, 1], [REGS, 40])
    else:
        gl.warp_specialize([
            (_ws_consumer, (a_s, b_s, ready, empty, c_ptr, N, K, M_E, stride_cm, num_tiles, ZERO, BH, BN, BK, STAGES,
                            NUM_PROGS)),
            (_ws_consumer, (a_s, b_s, ready, empty, c_ptr, N, K, M_E, stride_cm, num_tiles, ONE, BH, BN, BK, STAGES,
                            NUM_PROGS)),
            (_ws_producer, (a_desc, b_desc, a_s, b_s, ready, empty, N, K, M_E, num_tiles, BH, BN, BK, STAGES,
                            NUM_PROGS)),
        ], [4, 1])


@triton.jit
def _tl_kernel(a_desc, b_desc, c_ptr, N, K, M_E, stride_cm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    mb_per_e = M_E // BM
    nb = N // BN
    mb = pid % mb_per_e
    en = pid // mb_per_e
    e = en // nb
    off_am = e * M_E + mb * BM
    off_bn = e * N + (en % nb) * BN
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(0, K // BK):
        acc = tl.dot(a_desc.load([off_am, k * BK]), b_desc.load([off_bn, k * BK]).T, acc)
    rows = off_am + tl.arange(0, BM)
    cols = (en % nb) * BN + tl.arange(0, BN)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(tl.bfloat16))


def launch(name, a, b, c, E, M_E, N, K, BM, BN, BK, STAGES, warps):
    """BM: rows of one program (gl_mc: of the cluster, so each CTA holds BM / 2). BK is for 16-bit
    operands; 8-bit ones take twice as many (the same bytes a row a stage)."""
    gdt = {torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv}[a.dtype]
    BK = BK * 2 // a.element_size()
    grid = (E * (M_E // BM) * (N // BN),)
    if name == "tl":
        ad = TlDesc.from_tensor(a, [BM, BK])
        bd = TlDesc.from_tensor(b, [BN, BK])
        _tl_kernel[grid](ad, bd, c, N, K, M_E, c.stride(0), BM=BM, BN=BN, BK=BK, num_warps=warps, num_stages=STAGES)
        return
    if name.startswith("gl_ws"):
        nprogs = torch.cuda.get_device_properties(a.device).multi_processor_count
        la = gl.NVMMASharedLayout.get_default_for([BM // 2, BK], gdt)
        lb = gl.NVMMASharedLayout.get_default_for([BN, BK], gdt)
        ad = GlDesc.from_tensor(a, [BM // 2, BK], la)
        bd = GlDesc.from_tensor(b, [BN, BK], lb)
        _ws_kernel[(nprogs,)](ad, bd, c, N, K, M_E, c.stride(0), grid[0], BN=BN, BK=BK, STAGES=STAGES,
                              NUM_PROGS=nprogs, REGS=232 if name == "gl_ws_regs" else 0, num_warps=4)
        return
    mc = name == "gl_mc"
    la = gl.NVMMASharedLayout.get_default_for([BM, BK], gdt, cga_layout=[[1, 0]] if mc else None)
    lb = gl.NVMMASharedLayout.get_default_for([BN, BK], gdt, cga_layout=[[0, 0]] if mc else None)
    ad = GlDesc.from_tensor(a, [BM, BK], la)
    bd = GlDesc.from_tensor(b, [BN, BK], lb)
    _gl_kernel[grid](ad, bd, c, N, K, M_E, c.stride(0), MC=mc, BM=BM, BN=BN, BK=BK, STAGES=STAGES,
                     num_warps=warps, num_ctas=2 if mc else 1)


def time_graph(fn, reps=20):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    return sorted(ts)[len(ts) // 2]


VARIANTS = {
    # name: list of (BM, BN, BK, STAGES, warps); BM is the program's rows (gl_mc: two CTAs of BM / 2)
    "tl": [(128, 128, 64, 4, 8), (128, 256, 64, 3, 8)],
    "gl": [(128, 128, 64, 4, 8), (128, 256, 64, 4, 8)],
    "gl_mc": [(256, 128, 64, 4, 8), (256, 256, 64, 4, 8)],
    # BM is the tile's rows (two 64-row consumers); warps ignored (4 + 4 + 1)
    "gl_ws": [(128, 256, 64, 4, 4), (128, 128, 64, 6, 4), (128, 256, 64, 3, 4)],
    "gl_ws_regs": [(128, 256, 64, 4, 4)],
}


def gpu(E, M_E, N, K, names, dtype="bf16", tiles=None):
    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[dtype]
    a = torch.randn(E * M_E, K, device="cuda").to(dt)
    b = (torch.randn(E * N, K, device="cuda") * (4 if dtype == "fp8" else K ** -0.5)).to(dt)
    ref = torch.cat([a[e * M_E:(e + 1) * M_E].float() @ b[e * N:(e + 1) * N].float().T for e in range(E)])
    flop = 2 * E * M_E * N * K
    for name in names:
        for cfg in [t for i, t in enumerate(VARIANTS[name]) if tiles is None or i in tiles]:
            c = torch.zeros(E * M_E, N, device="cuda", dtype=torch.bfloat16)
            tag = f"{dtype} E={E} M_E={M_E} N={N} K={K} {name:6s} {cfg}"
            try:
                launch(name, a, b, c, E, M_E, N, K, *cfg)
                torch.cuda.synchronize()
                err = ((c.float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    print(f"{tag}: WRONG rel err {err:.3g}", flush=True)
                    continue
                us = time_graph(lambda: launch(name, a, b, c, E, M_E, N, K, *cfg))
                print(f"{tag}: {us:8.1f} us {flop / us / 1e6:7.1f} TFLOP/s  rel err {err:.2e}", flush=True)
            except Exception as ex:  # a probe: report and go on
                print(f"{tag}: FAILED {type(ex).__name__}: {str(ex)[:400]}", flush=True)


def compile_only():
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ptxas_advice import ptxas_info
    target = GPUTarget("cuda", 90, 32)
    for name in ("gl_ws", "gl_ws_regs"):
        for BM, BN, BK, STAGES, warps in VARIANTS[name]:
            la = gl.NVMMASharedLayout.get_default_for([BM // 2, BK], gl.bfloat16)
            lb = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
            sig = {"a_desc": f"tensordesc<bf16[{BM // 2}, {BK}],{la!r}>", "b_desc": f"tensordesc<bf16[{BN}, {BK}],{lb!r}>",
                   "c_ptr": "*bf16", "N": "i32", "K": "i32", "M_E": "i32", "stride_cm": "i32", "num_tiles": "i32",
                   "BN": "constexpr", "BK": "constexpr", "STAGES": "constexpr", "NUM_PROGS": "constexpr",
                   "REGS": "constexpr", "num_warps": "constexpr"}
            consts = dict(BN=BN, BK=BK, STAGES=STAGES, NUM_PROGS=132, REGS=232 if name == "gl_ws_regs" else 0,
                          num_warps=4)
            try:
                k = triton.compile(GluonASTSource(_ws_kernel, sig, consts), target=target, options={"num_warps": 4})
                ptx = k.asm["ptx"]
                regs, spills, advice = ptxas_info(ptx)
                print(f"ok   {name:6s} {(BM, BN, BK, STAGES)} regs {regs} spills {spills} shared {k.metadata.shared} "
                      f"setmaxnreg {ptx.count('setmaxnreg')} {advice}", flush=True)
            except Exception as ex:
                print(f"FAIL {name:6s} {(BM, BN, BK, STAGES)} {type(ex).__name__}: {str(ex)[:3000]}", flush=True)
    for name in ("gl", "gl_mc"):
        for BM, BN, BK, STAGES, warps in VARIANTS[name]:
            mc = name == "gl_mc"
            la = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16, cga_layout=[[1, 0]] if mc else None)
            lb = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16, cga_layout=[[0, 0]] if mc else None)
            sig = {"a_desc": f"tensordesc<bf16[{BM}, {BK}],{la!r}>", "b_desc": f"tensordesc<bf16[{BN}, {BK}],{lb!r}>",
                   "c_ptr": "*bf16", "N": "i32", "K": "i32", "M_E": "i32", "stride_cm": "i32", "MC": "constexpr",
                   "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "STAGES": "constexpr",
                   "num_warps": "constexpr"}
            consts = dict(MC=mc, BM=BM, BN=BN, BK=BK, STAGES=STAGES, num_warps=warps)
            try:
                k = triton.compile(GluonASTSource(_gl_kernel, sig, consts), target=target,
                                   options={"num_warps": warps, "num_ctas": 2 if mc else 1})
                ptx = k.asm["ptx"]
                regs, spills, advice = ptxas_info(ptx)
                mcast = sum("multicast::cluster" in ln for ln in ptx.splitlines())
                print(f"ok   {name:6s} {(BM, BN, BK, STAGES, warps)} regs {regs} spills {spills} "
                      f"shared {k.metadata.shared} multicast-loads {mcast} {advice}", flush=True)
            except Exception as ex:
                print(f"FAIL {name:6s} {(BM, BN, BK, STAGES, warps)} {type(ex).__name__}: {str(ex)[:3000]}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="sm_90a compile only (no GPU needed)")
    p.add_argument("--variants", default="tl,gl,gl_mc,gl_ws", help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--shape", default="8,256,28672,4096", help="E,M_E,N,K (default: Mixtral GEMM1 at T=1024)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp8"))
    p.add_argument("--tiles", default="", help="comma list of tile indices into the variant's list (default: all)")
    args = p.parse_args()
    if args.compile:
        os.environ.pop("TRITON_INTERPRET", None)
        compile_only()
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: use --compile")
    else:
        gpu(*map(int, args.shape.split(",")), [v for v in args.variants.split(",") if v], args.dtype,
            [int(i) for i in args.tiles.split(",")] if args.tiles else None)
