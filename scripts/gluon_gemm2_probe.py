"""Probe (session 28): an A-resident GEMM2 in Gluon whose atomic epilogue overlaps the next tile's wgmma.

    python3 scripts/gluon_gemm2_probe.py            (GPU: check against the library's GEMM2, then time both)
    python3 scripts/gluon_gemm2_probe.py --compile  (CPU: sm_90a compile, registers, shared memory, red width)

Why: deepseek-v3 tp8's GEMM2 (K = I = 256, the k-sum as atomic adds into the bf16 output) is the
library's A-resident kernel (``grouped_gemm._moe_gemm2_resident_kernel``). On the H100 at T=16384 it
took 1684 us; with its atomic adds masked off 1203 us, the adds alone 901 us
(docs/bench_h100_s28_diag_g2.txt). So the MMAs and the adds run one after the other: triton issues
each column tile's wgmma and waits for it (``wgmma.wait_group 0``) before the epilogue, and a
software-pipelined form of the loop compiles to the same wait (a dot whose accumulator is not
loop-carried is never left in flight). Gluon exposes the wgmma token: here tile j's wgmmas are
issued asynchronously, tile j - 1's epilogue (routing weight, bf16, 16-byte atomic adds) runs on the
CUDA cores while they execute, and only then is tile j waited for.

Program = (m-block of BM rows of one expert, band g of N_TILES column tiles of BN), bands major (as
BAND_MAJOR). A: the block's BM rows of h gathered by slot into shared memory once (KC = 64 column
chunks; evict_first, as the library's kernel, unless h_evict=False). B: w2 [E * H, I] by TMA, [BN, 64]
boxes, STAGES tiles in flight (w_hint=True: the TMA loads evict_first, triton 3.9 only: run it with
`source scripts/t39_env.sh` and `.whl` carried, `scripts/sessions/gpu_s28f.sh`). 16-bit, no bias, no scales.
H100 results: docs/BENCHMARKS.md, twenty-eighth section (the overlap is worth 0.5%).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GlDesc
except ImportError:  # pragma: no cover
    GlDesc = None

_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier   # 3.9 / 3.6 names
try:   # TMA loads with an L2 eviction policy: triton 3.9's Gluon (3.6's async copy takes none)
    from triton.experimental.gluon.language.nvidia.ampere import CachePolicy, FractionalEvictionPolicy
    _W_EVICT_FIRST = gl.constexpr(CachePolicy(l2=FractionalEvictionPolicy("evict_first", 1.0)))
except ImportError:  # pragma: no cover
    _W_EVICT_FIRST = None
KC = 64


@gluon.jit
def _load_w(b_desc, coord0, coord1, bar, dst, pred, W_HINT: gl.constexpr):
    if W_HINT:
        _tma_load(b_desc, [coord0, coord1], bar, dst, pred=pred, cache_policy=_W_EVICT_FIRST)
    else:
        _tma_load(b_desc, [coord0, coord1], bar, dst, pred=pred)


@gluon.jit
def _epilogue(acc, w, c_rows_ptr, row_ok, pid_n, N_OUT, stride_cn,
              BN: gl.constexpr, out_l: gl.constexpr):
    v = gl.convert_layout((acc * w[:, None]).to(gl.bfloat16), out_l)
    cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, out_l))
    gl.atomic_add(c_rows_ptr[:, None] + cols[None, :] * stride_cn, v,
                  mask=row_ok[:, None] & (cols < N_OUT)[None, :], sem="relaxed")


@gluon.jit
def _g2_kernel(h_ptr, b_desc, c_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,
               N_OUT, num_pairs, num_m_blocks, stride_hm, stride_cm, stride_cn,
               TOP_K: gl.constexpr, ALIGN_BM: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
               NKC: gl.constexpr, N_TILES: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
               H_EVICT: gl.constexpr, W_HINT: gl.constexpr, num_warps: gl.constexpr):
    KCc: gl.constexpr = 64
    pid = gl.program_id(0)
    g = pid // num_m_blocks
    pid_m = pid % num_m_blocks
    if pid_m * BM >= gl.load(ntpp_ptr):
        return
    e = gl.load(expert_ids_ptr + pid_m * BM // ALIGN_BM)
    if e < 0:
        return
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BN, 16])
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])     # 16-byte loads / adds
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BN, BN // 8], [num_warps, 1], [1, 0])
    a_lay: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, KCc], gl.bfloat16)
    a_s = gl.allocate_shared_memory(gl.bfloat16, [NKC, BM, KCc], a_lay)
    b_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES * NKC, BN, KCc], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    nbytes: gl.constexpr = NKC * BN * KCc * 2
    row0 = (e * N_OUT + g * N_TILES * BN).to(gl.int32)
    for i in gl.static_range(STAGES):          # the first STAGES weight tiles in flight
        mbarrier.expect(bars.index(i), nbytes, pred=i < N_TILES)
        for c in gl.static_range(NKC):
            _load_w(b_desc, row0 + i * BN, c * KCc, bars.index(i), b_s.index(i * NKC + c), i < N_TILES, W_HINT)
    # the block's rows of h, gathered by slot into shared memory (padding rows read row 0, never stored)
    offs_m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, ld_l))
    slots = gl.load(sorted_ids_ptr + offs_m)
    rows = gl.where(slots < num_pairs, slots, 0).to(gl.int64)
    for c in gl.static_range(NKC):
        offs_k = c * KCc + gl.arange(0, KCc, layout=gl.SliceLayout(0, ld_l))
        if H_EVICT:    # as the library's kernel since session 28
            a_s.index(c).store(gl.load(h_ptr + rows[:, None] * stride_hm + offs_k[None, :],
                                       eviction_policy="evict_first"))
        else:
            a_s.index(c).store(gl.load(h_ptr + rows[:, None] * stride_hm + offs_k[None, :]))
    fence_async_shared()
    _cta_barrier()
    # epilogue operands: routing weights in the accumulator's rows, output rows in out_l's
    offs_ma = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_l))
    slots_a = gl.load(sorted_ids_ptr + offs_ma)
    w = gl.load(topk_w_ptr + slots_a, mask=slots_a < num_pairs, other=0.0)
    offs_mo = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, out_l))
    slots_o = gl.load(sorted_ids_ptr + offs_mo)
    row_ok = slots_o < num_pairs
    c_rows_ptr = c_ptr + (gl.where(row_ok, slots_o, 0) // TOP_K).to(gl.int64) * stride_cm
    zero = gl.zeros([BM, BN], gl.float32, acc_l)
    prev = zero
    for j in range(0, N_TILES):
        s = j % STAGES
        mbarrier.wait(bars.index(s), (j // STAGES) & 1)
        tok = warpgroup_mma(a_s.index(0), b_s.index(s * NKC).permute((1, 0)), zero, use_acc=False, is_async=True)
        for c in gl.static_range(1, NKC):
            tok = warpgroup_mma(a_s.index(c), b_s.index(s * NKC + c).permute((1, 0)), tok, is_async=True)
        if OVERLAP:
            if j > 0:        # tile j - 1's adds while tile j's wgmmas run
                _epilogue(prev, w, c_rows_ptr, row_ok, g * N_TILES + j - 1, N_OUT, stride_cn, BN, out_l)
            prev = warpgroup_mma_wait(num_outstanding=0, deps=[tok])
        else:
            prev = warpgroup_mma_wait(num_outstanding=0, deps=[tok])
            _epilogue(prev, w, c_rows_ptr, row_ok, g * N_TILES + j, N_OUT, stride_cn, BN, out_l)
        nxt = j + STAGES                   # stage s is free: its tile has retired
        mbarrier.expect(bars.index(s), nbytes, pred=nxt < N_TILES)
        for c in gl.static_range(NKC):
            _load_w(b_desc, row0 + nxt * BN, c * KCc, bars.index(s), b_s.index(s * NKC + c), nxt < N_TILES, W_HINT)
    if OVERLAP:
        _epilogue(prev, w, c_rows_ptr, row_ok, g * N_TILES + N_TILES - 1, N_OUT, stride_cn, BN, out_l)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))


def launch(h, w2, align, topk_weights, out, BM=128, BN=64, n_tiles=16, stages=3, warps=8, overlap=True,
           h_evict=True, w_hint=False):
    """out [T, H] += sum over slots of topk_weights * h @ w2[e]^T (out zeroed by the caller)."""
    E, H, I = w2.shape
    assert I % KC == 0 and H % (BN * n_tiles) == 0 and align.block_m % BM == 0
    lay = gl.NVMMASharedLayout.get_default_for([BN, KC], gl.bfloat16)
    bd = GlDesc.from_tensor(w2.view(E * H, I), [BN, KC], lay)
    num_m = align.max_padded // BM
    grid = (num_m * (H // (BN * n_tiles)),)
    _g2_kernel[grid](h, bd, out, topk_weights, align.sorted_ids, align.expert_ids, align.num_tokens_post_padded,
                     H, align.num_pairs, num_m, h.stride(0), out.stride(0), out.stride(1),
                     TOP_K=topk_weights.shape[1], ALIGN_BM=align.block_m, BM=BM, BN=BN, NKC=I // KC,
                     N_TILES=n_tiles, STAGES=stages, OVERLAP=overlap, H_EVICT=h_evict, W_HINT=w_hint,
                     num_warps=warps)


def gpu(tokens, variants):
    from fusedmoe.bench.harness import make_routing
    from fusedmoe.kernels.align import align_block_size
    from fusedmoe.kernels.grouped_gemm import gemm2
    from fusedmoe.tuning import LaunchConfigs
    E, H, I, k = 256, 7168, 256, 8
    g = torch.Generator().manual_seed(0)
    w2 = (torch.randn(E, H, I, generator=g) / 16).to(torch.bfloat16).cuda()
    for T in tokens:
        tw, ids = make_routing(T, E, k, generator=g, device="cuda")
        h = torch.randn(T * k, I, generator=g).to(torch.bfloat16).cuda()
        cfg = LaunchConfigs.load(None, E, I, H, k).get(T)[1]      # the shipped entry of this GPU
        align = align_block_size(ids, 128, E)
        ref = torch.zeros(T, H, dtype=torch.bfloat16, device="cuda")
        lib = lambda: gemm2(h, w2, align, tw, ref, config=cfg, reduce="atomic_out")   # noqa: E731
        lib()
        exact = torch.zeros(T, H, device="cuda")          # fp32 sums, the yardstick of both
        flat, twf = ids.flatten().long(), tw.flatten()
        for ex in range(E):
            s = (flat == ex).nonzero()[:, 0]
            exact.index_add_(0, s // k, (h[s].float() @ w2[ex].float().t()) * twf[s, None])
        rel = lambda o: ((o.float() - exact).norm() / exact.norm()).item()   # noqa: E731
        from triton.testing import do_bench
        err_lib = rel(ref)
        t_lib = do_bench(lib, warmup=5, rep=100)
        z = do_bench(lambda: ref.zero_(), warmup=5, rep=100)
        print(f"T={T} library gemm2 {cfg}: {(t_lib - z) * 1e3:8.1f} us (with its zeroing {t_lib * 1e3:.1f})  "
              f"rel err {err_lib:.2e}", flush=True)
        aligns = {128: align}
        for name, kw in variants:
            out = torch.zeros(T, H, dtype=torch.bfloat16, device="cuda")

            bm = kw.get("BM", 128)
            if bm not in aligns:
                aligns[bm] = align_block_size(ids, bm, E)

            def run():
                out.zero_()
                launch(h, w2, aligns[bm], tw, out, **kw)
            run()
            torch.cuda.synchronize()
            err = rel(out)
            t = do_bench(run, warmup=5, rep=100)
            z = do_bench(lambda: out.zero_(), warmup=5, rep=100)
            print(f"T={T} gluon {name:24s}: {(t - z) * 1e3:8.1f} us (zeroing {z * 1e3:.1f} excluded)  rel err {err:.2e}"
                  + ("  BAD" if not err < 1e-2 else ""), flush=True)


VARIANTS = [("x16 bn64 s3 overlap", dict(BN=64, n_tiles=16, stages=3, overlap=True)),
            ("x16 bn64 s3 no overlap", dict(BN=64, n_tiles=16, stages=3, overlap=False)),
            ("x8 bn128 s2 overlap", dict(BN=128, n_tiles=8, stages=2, overlap=True)),
            ("x8 bn128 s2 no overlap", dict(BN=128, n_tiles=8, stages=2, overlap=False)),
            ("bm256 x16 bn64 s2 overlap", dict(BM=256, BN=64, n_tiles=16, stages=2, overlap=True)),
            ("bm256 x16 bn64 s2 no overlap", dict(BM=256, BN=64, n_tiles=16, stages=2, overlap=False)),
            ("bm256 x32 bn32 s3 overlap", dict(BM=256, BN=32, n_tiles=32, stages=3, overlap=True)),
            ("bm64 x16 bn64 s3 overlap", dict(BM=64, BN=64, n_tiles=16, stages=3, overlap=True, warps=4)),
            ("x8 bn128 s2 h plain", dict(BN=128, n_tiles=8, stages=2, h_evict=False)),
            ("x16 bn64 s3 h plain", dict(BN=64, n_tiles=16, stages=3, h_evict=False))]
if _W_EVICT_FIRST is not None:    # triton 3.9: w2's TMA loads evict_first too (next session's first try)
    VARIANTS += [("x16 bn64 s3 w evict_first", dict(BN=64, n_tiles=16, stages=3, w_hint=True)),
                 ("x8 bn128 s2 w evict_first", dict(BN=128, n_tiles=8, stages=2, w_hint=True))]


def compile_only():
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    target = GPUTarget("cuda", 90, 32)
    for name, kw in VARIANTS:
        BN = kw["BN"]
        lay = gl.NVMMASharedLayout.get_default_for([BN, KC], gl.bfloat16)
        sig = {"h_ptr": "*bf16", "b_desc": f"tensordesc<bf16[{BN}, {KC}],{lay!r}>", "c_ptr": "*bf16",
               "topk_w_ptr": "*fp32", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32",
               "N_OUT": "i32", "num_pairs": "i32", "num_m_blocks": "i32", "stride_hm": "i32", "stride_cm": "i32",
               "stride_cn": "constexpr"}
        bm, warps = kw.get("BM", 128), kw.get("warps", 8)
        consts = dict(stride_cn=1, TOP_K=8, ALIGN_BM=max(bm, 128), BM=bm, BN=BN, NKC=4, N_TILES=kw["n_tiles"],
                      STAGES=kw["stages"], OVERLAP=kw.get("overlap", True), H_EVICT=kw.get("h_evict", True),
                      W_HINT=kw.get("w_hint", False), num_warps=warps)
        for c in consts:
            sig.setdefault(c, "constexpr")
        attrs = {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]],
                 (4,): [["tt.divisibility", 16]], (5,): [["tt.divisibility", 16]], (6,): [["tt.divisibility", 16]],
                 (7,): [["tt.divisibility", 16]], (10,): [["tt.divisibility", 16]], (11,): [["tt.divisibility", 16]]}
        try:
            try:
                src = GluonASTSource(_g2_kernel, sig, consts, attrs)
            except TypeError:
                src = GluonASTSource(_g2_kernel, sig, consts)
            kern = triton.compile(src, target=target, options={"num_warps": warps, "enable_fp_fusion": True})
            ptx = kern.asm["ptx"]
            waits = [ln.strip() for ln in ptx.splitlines() if "wgmma.wait_group" in ln]
            reds = sorted({ln.split()[1] if ln.split()[0].startswith("@") else ln.split()[0]
                           for ln in ptx.splitlines() if "red.global" in ln or "atom.global" in ln})
            print(f"ok   {name:24s} shared {kern.metadata.shared} wgmma {ptx.count('wgmma.mma_async')} "
                  f"waits {waits} adds {reds} {kern.n_regs if hasattr(kern, 'n_regs') else ''}", flush=True)
            if os.environ.get("COMPILE_CHECK_DUMP"):
                os.makedirs(os.environ["COMPILE_CHECK_DUMP"], exist_ok=True)
                with open(os.path.join(os.environ["COMPILE_CHECK_DUMP"], name.replace(" ", "_") + ".ptx"), "w") as f:
                    f.write(ptx)
        except Exception as ex:
            print(f"FAIL {name}: {type(ex).__name__}: {str(ex)[:3000]}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="sm_90a compile only (no GPU needed)")
    p.add_argument("--tokens", default="4096,16384")
    args = p.parse_args()
    if args.compile:
        os.environ.pop("TRITON_INTERPRET", None)
        compile_only()
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: use --compile")
    else:
        gpu([int(t) for t in args.tokens.split(",")], VARIANTS)
