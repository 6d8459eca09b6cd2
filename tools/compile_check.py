"""Compile the decode kernels, the quantizers and the prefill grouped GEMMs for sm_90 on a
machine without a GPU (no launch), with the JIT's specialization (16-byte aligned tensors
and ints, unit strides as constants: without it nothing is pipelined and the shared-memory
figure printed means nothing): catches
Triton front-end / compiler errors (e.g. a variable re-typed inside an ``if``) that the
interpreter (TRITON_INTERPRET=1) does not, before any GPU run.

    python tools/compile_check.py            (TRITON_INTERPRET must be unset)
    COMPILE_CHECK_W4=1 python tools/compile_check.py   (the decode kernels' 8-bit word path)
    PYTHONPATH=/path/to/triton36 python tools/compile_check.py   (Triton 3.6, the oldest supported:
        `pip install --target /path/to/triton36 triton==3.6.0`; 3.6 rejects code 3.9 takes,
        e.g. a constexpr-if branch that returns early and a differently shaped value after it)

It builds each launch spec (kernels/decode.py ``*_launch``) from CPU tensors of the right
dtypes, turns it into an ASTSource signature (pointer dtypes, i32/i64/fp32 scalars,
constexprs) and compiles it with triton.compile for GPUTarget('cuda', 90, 32), through
ptxas (bundled with the triton wheel).
"""
from __future__ import annotations

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402
except ImportError:  # pragma: no cover
    TensorDescriptor = None

_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
       torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv", torch.int8: "i8", torch.uint8: "u8"}


def _force_w4(kernel, args, constexprs):
    """COMPILE_CHECK_W4=1: the decode kernels' W4 word path where a GPU would take it
    (kernels/decode.py ``w4_mode``; CPU tensors always give 0)."""
    names = [p.name for p in kernel.params]
    if "W4" not in names or constexprs.get("INT_ACC") or constexprs.get("QA") or constexprs.get("A3"):
        return constexprs
    w = args[names.index("w_ptr")]
    mode = {torch.int8: 1, torch.float8_e4m3fn: 2}.get(w.dtype, 0)
    return dict(constexprs, W4=mode) if mode and w.shape[-1] % 16 == 0 else constexprs


def _consts(spec, **kw):
    """The launch spec with constexprs set (what a GPU launch would pick where CPU tensors give
    another value, e.g. L2_PRE)."""
    spec = list(spec)
    spec[3] = dict(spec[3], **kw)
    return tuple(spec)


def compile_spec(spec, target=GPUTarget("cuda", 90, 32)):
    kernel, grid, args, constexprs, num_warps, num_stages, pdl = (list(spec) + [None, None, False])[:7]
    if os.environ.get("COMPILE_CHECK_W4"):
        constexprs = _force_w4(kernel, args, constexprs)
    sig, consts, attrs = {}, {}, {}
    for i, (p, a) in enumerate(zip(kernel.params, args)):
        if isinstance(a, torch.Tensor):
            sig[p.name] = "*" + _DT[a.dtype]
            # what the launcher's specialization tells the compiler about a real tensor (16-byte
            # aligned): without it no load is vectorized or pipelined through shared memory
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            sig[p.name] = "i1"
        elif isinstance(a, int) and a == 1 and not getattr(p, "do_not_specialize", False):
            sig[p.name] = "constexpr"                 # the JIT specializes 1s (unit strides)
            consts[p.name] = 1
        elif isinstance(a, int):
            sig[p.name] = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
            if a % 16 == 0 and not getattr(p, "do_not_specialize", False):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[p.name] = "fp32"
        elif TensorDescriptor is not None and isinstance(a, TensorDescriptor):   # host-side TMA descriptor
            sig[p.name] = f"tensordesc<{_DT[a.base.dtype]}[{', '.join(map(str, a.block_shape))}]>"
        elif a is None:                               # e.g. no TMA descriptor
            sig[p.name] = "constexpr"
            consts[p.name] = None
            continue
        else:
            raise TypeError(f"{p.name}: {type(a)}")
    for p in kernel.params[len(args):]:
        v = constexprs[p.name] if p.name in constexprs else p.default
        if p.name == "BITWISE_FP8" and kernel.fn.__module__.endswith(".decode"):
            v = False          # the GPU's value (CPU tensors: the interpreter's); the quantizers
            #                    and grouped GEMMs get uint8 views of fp8 outputs on the CPU
        sig[p.name] = "constexpr"
        consts[p.name] = v
    from fusedmoe.kernels.launcher import COMPILE_OPTIONS   # what every launch passes (FP fusion on)
    opts = {"num_warps": num_warps or 4, **COMPILE_OPTIONS}
    if pdl:
        opts["launch_pdl"] = True
    if num_stages:
        opts["num_stages"] = num_stages
    return triton.compile(ASTSource(kernel, sig, consts, attrs), target=target, options=opts)


def _fake_align(E: int, T: int, k: int, block_m: int = 128):
    """An AlignResult of the right sizes for compiling, never launched."""
    from fusedmoe.kernels.align import AlignResult
    n = T * k
    return AlignResult(torch.zeros(n + E * block_m, dtype=torch.int32),
                       torch.zeros((n + E * block_m) // block_m, dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32), topk_ids=torch.zeros(T, k, dtype=torch.int32),
                       num_experts=E, block_m=block_m, num_pairs=n)


def _capture(gg):
    """Replace ``gg.launch`` by a recorder: (the list of launch specs it fills, the real launch
    to put back)."""
    captured, real = [], gg.launch
    gg.launch = lambda kernel, grid, args, constexprs, num_warps=4, num_stages=3, launch_pdl=False: captured.append(
        (kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl))
    return captured, real


def grouped_cases() -> list:
    """Prefill GEMMs (kernels/grouped_gemm.py) at qwen3-30b-a3b's T=16384 tiles: bf16, and
    the W8A8 per-token path (fp8 and int8, per-row A scales), one tile per program and
    persistent + flattened: the launch specs ``_launch`` builds, captured, not launched."""
    from fusedmoe.kernels import grouped_gemm as gg
    captured, real = _capture(gg)
    try:
        bf, fp8, i8 = torch.bfloat16, torch.float8_e4m3fn, torch.int8
        E, H, I, k, T = 128, 2048, 768, 8, 4096
        n = T * k
        align = _fake_align(E, T, k)
        c1 = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=16, num_warps=8, num_stages=4)
        c2 = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
        out = []
        for wd in (bf, fp8, i8):
            q = {} if wd == bf else dict(quant="channel")
            s1 = {} if wd == bf else dict(a_scale=torch.empty(T, 1), b_scale=torch.empty(E, 2 * I))
            s2 = {} if wd == bf else dict(a_scale=torch.empty(n, 1), b_scale=torch.empty(E, H))
            bk = 64 if wd == bf else 128
            for label, c2x in (("", c2), (" persistent flat", dict(c2, PERSISTENT=1, FLATTEN=True))):
                captured.clear()
                gg.gemm1_act(torch.empty(T, H, dtype=wd), torch.empty(E, 2 * I, H, dtype=wd), align, k, "silu",
                             torch.empty(n, I, dtype=bf), config=dict(c1, BLOCK_SIZE_K=bk), **q, **s1)
                gg.gemm2(torch.empty(n, I, dtype=wd), torch.empty(E, H, I, dtype=wd), align, torch.empty(T, k),
                         torch.empty(T, H, dtype=bf), config=dict(c2x, BLOCK_SIZE_K=bk), **q, **s2,
                         workspace=torch.empty(1, n, H, dtype=bf))
                tag = str(wd)[6:]
                if not label:
                    out.append((f"grouped gemm1 {tag}", captured[0]))
                out.append((f"grouped gemm2 {tag}{label}", captured[1]))
        # weight tiles through a host-side TMA descriptor (USE_TMA, as the shipped T=16384 tiles)
        captured.clear()
        gg.gemm2(torch.empty(n, I, dtype=bf), torch.empty(E, H, I, dtype=bf), align, torch.empty(T, k),
                 torch.empty(T, H, dtype=bf), config=dict(c2, BLOCK_SIZE_K=64, USE_TMA=True),
                 workspace=torch.empty(1, n, H, dtype=bf))
        out.append(("grouped gemm2 bfloat16 tma", captured[0]))
        # column bands (config BAND_N) with the atomic k-sum, one tile a program and persistent + flat
        for label, c2x in (("", dict(c2, BAND_N=4)), (" persistent flat", dict(c2, BAND_N=4, PERSISTENT=1, FLATTEN=True))):
            captured.clear()
            gg.gemm2(torch.empty(n, I, dtype=bf), torch.empty(E, H, I, dtype=bf), align, torch.empty(T, k),
                     torch.empty(T, H, dtype=bf), config=dict(c2x, BLOCK_SIZE_K=64, USE_TMA=True), reduce="atomic_out")
            out.append((f"grouped gemm2 bfloat16 band atomic_out{label}", captured[0]))
        # GEMM1 zeroing GEMM2's atomic output on the side (gemm1_act zero=): one tile a program, persistent
        for label, c1x in (("", c1), (" persistent", dict(c1, PERSISTENT=1, USE_TMA=True))):
            captured.clear()
            gg.gemm1_act(torch.empty(T, H, dtype=bf), torch.empty(E, 2 * I, H, dtype=bf), align, k, "silu",
                         torch.empty(n, I, dtype=bf), config=c1x, zero=torch.empty(T, H, dtype=bf))
            out.append((f"grouped gemm1 bfloat16 zero{label}", captured[0]))
        # GEMM1's gate and up in one dot of width 2 BN (GU_ONE_DOT): bf16, fp8 / int8 per channel,
        # one tile a program and persistent (Mixtral T=16384's shipped GEMM1 kind)
        for wd in (bf, fp8, i8):
            q = {} if wd == bf else dict(quant="channel", a_scale=torch.empty(T, 1), b_scale=torch.empty(E, 2 * I))
            for label, c1x in (("", c1), (" persistent", dict(c1, PERSISTENT=1))):
                captured.clear()
                gg.gemm1_act(torch.empty(T, H, dtype=wd), torch.empty(E, 2 * I, H, dtype=wd), align, k, "silu",
                             torch.empty(n, I, dtype=bf), config=dict(c1x, USE_TMA=True, GU_ONE_DOT=True,
                                                                        BLOCK_SIZE_K=64 if wd == bf else 128), **q)
                out.append((f"grouped gemm1 {str(wd)[6:]} one_dot{label}", captured[0]))
        # HALF_TAIL: a tile whose second half is padding at half height: GEMM1 one dot,
        # one tile a program and persistent (Mixtral T=1024's kind), fp8 per channel; GEMM2 with
        # split K 2 and the atomic k-sum
        for wd in (bf, fp8):
            q = {} if wd == bf else dict(quant="channel", a_scale=torch.empty(T, 1), b_scale=torch.empty(E, 2 * I))
            for label, c1x in (("", c1), (" persistent", dict(c1, PERSISTENT=1))):
                captured.clear()
                gg.gemm1_act(torch.empty(T, H, dtype=wd), torch.empty(E, 2 * I, H, dtype=wd), align, k, "silu",
                             torch.empty(n, I, dtype=bf), config=dict(c1x, USE_TMA=True, GU_ONE_DOT=True, HALF_TAIL=True,
                                                                        BLOCK_SIZE_K=64 if wd == bf else 128), **q)
                out.append((f"grouped gemm1 {str(wd)[6:]} half_tail{label}", captured[0]))
        captured.clear()
        gg.gemm2(torch.empty(n, I, dtype=bf), torch.empty(E, H, I, dtype=bf), align, torch.empty(T, k),
                 torch.empty(T, H, dtype=bf), config=dict(c2, SPLIT_K=2, USE_TMA=True, HALF_TAIL=True),
                 reduce="atomic_out")
        out.append(("grouped gemm2 bfloat16 half_tail split2 atomic_out", captured[0]))
        # h in sorted order (GEMM2 config SORTED_H): GEMM1 writing it at the sorted
        # positions (one dot, persistent), GEMM2 reading it by TMA (one tile a program, split K 2
        # with HALF_TAIL's pointer-loaded half tiles, persistent + flattened)
        hs = torch.empty(align.max_padded, I, dtype=bf)
        captured.clear()
        gg.gemm1_act(torch.empty(T, H, dtype=bf), torch.empty(E, 2 * I, H, dtype=bf), align, k, "silu", hs,
                     config=dict(c1, PERSISTENT=1, USE_TMA=True, GU_ONE_DOT=True), out_sorted=True)
        out.append(("grouped gemm1 bfloat16 sorted_h one_dot persistent", captured[0]))
        for label, c2x, red in (("", dict(c2, USE_TMA=True), "atomic_out"),
                                (" split2 half_tail", dict(c2, USE_TMA=True, SPLIT_K=2, HALF_TAIL=True), "atomic_out"),
                                (" persistent flat", dict(c2, USE_TMA=True, PERSISTENT=1, FLATTEN=True), "atomic_out")):
            captured.clear()
            gg.gemm2(hs, torch.empty(E, H, I, dtype=bf), align, torch.empty(T, k), torch.empty(T, H, dtype=bf),
                     config=c2x, reduce=red, h_sorted=True)
            out.append((f"grouped gemm2 bfloat16 sorted_h{label}", captured[0]))
        # x in sorted order (GEMM1 config SORTED_X): the copy (a PDL launch) and GEMM1
        # reading it by TMA (one dot, persistent)
        xs = torch.empty(align.max_padded, H, dtype=bf)
        captured.clear()
        gg.gather_sorted(torch.empty(T, H, dtype=bf), align, k, xs, pdl=True)
        gg.gemm1_act(xs, torch.empty(E, 2 * I, H, dtype=bf), align, k, "silu", torch.empty(n, I, dtype=bf),
                     config=dict(c1, PERSISTENT=1, USE_TMA=True, GU_ONE_DOT=True), x_sorted=True, out_sorted=False)
        out += [("gather sorted x pdl", captured[0]),
                ("grouped gemm1 bfloat16 sorted_x one_dot persistent", captured[1])]
        # the prefill PDL chain (the plan's pdl; FUSEDMOE_PLAN prefill_pdl): GEMM2 and the reduce as dependents
        captured.clear()
        gg.gemm2(torch.empty(n, I, dtype=bf), torch.empty(E, H, I, dtype=bf), align, torch.empty(T, k),
                 torch.empty(T, H, dtype=bf), config=dict(c2, PERSISTENT=1, BLOCK_SIZE_K=64),
                 workspace=torch.empty(1, n, H, dtype=bf), pdl=True)
        out += [("grouped gemm2 bfloat16 persistent pdl", captured[0]), ("grouped reduce pdl", captured[1])]
        # GEMM2 with A resident (config A_RESIDENT) at deepseek-v3 tp8's K = I = 256
        Ed, Hd, Id = 256, 7168, 256
        for bm, bn, nt, w, st, tma, pdl in ((128, 64, 8, 8, 3, True, False), (128, 128, 4, 8, 2, True, True),
                                            (64, 128, 8, 4, 3, True, False), (128, 64, 8, 8, 3, False, False)):
            captured.clear()
            gg.gemm2(torch.empty(n, Id, dtype=bf), torch.empty(Ed, Hd, Id, dtype=bf), align, torch.empty(T, k),
                     torch.empty(T, Hd, dtype=bf), config=dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=64,
                                                               num_warps=w, num_stages=st, A_RESIDENT=nt, USE_TMA=tma),
                     workspace=torch.empty(1, n, Hd, dtype=bf), pdl=pdl)
            out.append((f"resident gemm2 {bm}x{bn} x{nt} w{w} s{st}" + (" tma" if tma else "") + (" pdl" if pdl else ""),
                        captured[0]))
        # 8-bit A resident: qwen3 (K = I = 768: 3 chunks of 256) fp8 / int8 per channel,
        # bf16 (3 chunks, BM 64), deepseek-v3 tp8 fp8 128x128 blocks (K = 256: 2 groups)
        Eq, Hq, Iq = 128, 2048, 768
        fp8, i8 = torch.float8_e4m3fn, torch.int8
        for name, dt, (E_, H_, I_), q, bm, bn, nt, w, st in (
                ("qwen3 fp8 channel", fp8, (Eq, Hq, Iq), dict(quant="channel", a_scale=torch.empty(n, 1),
                                                              b_scale=torch.empty(Eq, Hq)), 128, 64, 32, 8, 2),
                ("qwen3 int8 channel", i8, (Eq, Hq, Iq), dict(quant="channel", a_scale=torch.empty(n, 1),
                                                              b_scale=torch.empty(Eq, Hq)), 64, 64, 32, 4, 2),
                ("qwen3 bf16", bf, (Eq, Hq, Iq), {}, 64, 32, 64, 4, 2),
                ("deepseek fp8 block", fp8, (Ed, Hd, Id),
                 dict(quant="block", block_shape=(128, 128), a_scale=torch.empty(n, Id // 128),
                      b_scale=torch.empty(Ed, Hd // 128, Id // 128)), 128, 64, 112, 8, 4),
                ("deepseek fp8 block bn256", fp8, (Ed, Hd, Id),
                 dict(quant="block", block_shape=(128, 128), a_scale=torch.empty(n, Id // 128),
                      b_scale=torch.empty(Ed, Hd // 128, Id // 128)), 128, 256, 28, 8, 3)):
            captured.clear()
            gg.gemm2(torch.empty(n, I_, dtype=dt), torch.empty(E_, H_, I_, dtype=dt), align, torch.empty(T, k),
                     torch.empty(T, H_, dtype=bf), config=dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=64,
                                                               num_warps=w, num_stages=st, A_RESIDENT=nt, USE_TMA=True),
                     workspace=torch.empty(1, n, H_, dtype=bf), **q)
            out.append((f"resident gemm2 {name} {bm}x{bn} x{nt} w{w} s{st} tma", captured[0]))
        # the k-sum as atomic adds straight into the bf16 output (reduce 'atomic_out'): the
        # tiled kernel and the A-resident one at deepseek-v3 tp8's shape, bf16 and fp8 blocks
        for name, dt, q, cfg in (
                ("bf16", bf, {}, dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, num_warps=8, num_stages=3)),
                ("bf16", bf, {}, dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, num_warps=8, num_stages=3,
                                      A_RESIDENT=8, USE_TMA=True)),
                ("fp8 block", fp8, dict(quant="block", block_shape=(128, 128), a_scale=torch.empty(n, Id // 128),
                                        b_scale=torch.empty(Ed, Hd // 128, Id // 128)),
                 dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_warps=8, num_stages=4,
                      A_RESIDENT=112, USE_TMA=True)),
                ("bf16 band", bf, {}, dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, num_warps=8, num_stages=3,
                                           A_RESIDENT=16, USE_TMA=True, BAND_MAJOR=True))):
            captured.clear()
            gg.gemm2(torch.empty(n, Id, dtype=dt), torch.empty(Ed, Hd, Id, dtype=dt), align, torch.empty(T, k),
                     torch.empty(T, Hd, dtype=bf), config=cfg, reduce="atomic_out", **q)
            out.append((f"atomic_out gemm2 {name}" + (" resident" if cfg.get("A_RESIDENT") else ""), captured[0]))
        # the A-resident GEMM2 at 256 rows (an alignment of 256)
        align256 = _fake_align(Ed, T, k, 256)
        blk = dict(quant="block", block_shape=(128, 128), a_scale=torch.empty(n, Id // 128),
                   b_scale=torch.empty(Ed, Hd // 128, Id // 128))
        for name, dt, q, w, st in (("bf16", bf, {}, 8, 2), ("bf16", bf, {}, 16, 2),
                                   ("fp8 block", fp8, blk, 8, 3), ("fp8 block", fp8, blk, 8, 2)):
            captured.clear()
            gg.gemm2(torch.empty(n, Id, dtype=dt), torch.empty(Ed, Hd, Id, dtype=dt), align256, torch.empty(T, k),
                     torch.empty(T, Hd, dtype=bf), config=dict(BLOCK_SIZE_M=256, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64,
                                                               num_warps=w, num_stages=st, A_RESIDENT=16, USE_TMA=True,
                                                               BAND_MAJOR=True),
                     reduce="atomic_out", **q)
            out.append((f"resident256 gemm2 {name} 256x64 x16 w{w} s{st}", captured[0]))
    finally:
        gg.launch = real
    return out


def block_cases() -> list:
    """Prefill GEMMs with 128x128 fp8 block scales at deepseek-v3 tp8's shape: the shipped
    tiles (per-group dot) and larger ones with RESCALE (scales applied to the accumulator)."""
    from fusedmoe.kernels import grouped_gemm as gg
    captured, real = _capture(gg)
    fp8, bf = torch.float8_e4m3fn, torch.bfloat16
    E, H, I, k, T = 256, 7168, 256, 8, 4096
    n = T * k
    align = _fake_align(E, T, k)
    q = dict(quant="block", block_shape=(128, 128))
    out = []
    try:
        g1 = lambda c: gg.gemm1_act(  # noqa: E731
            torch.empty(T, H, dtype=fp8), torch.empty(E, 2 * I, H, dtype=fp8), align, k, "silu",
            torch.empty(n, I, dtype=bf), config=c, a_scale=torch.empty(T, H // 128),
            b_scale=torch.empty(E, 2 * I // 128, H // 128), **q)
        g2 = lambda c: gg.gemm2(  # noqa: E731
            torch.empty(n, I, dtype=fp8), torch.empty(E, H, I, dtype=fp8), align, torch.empty(T, k),
            torch.empty(T, H, dtype=bf), config=c, a_scale=torch.empty(n, I // 128),
            b_scale=torch.empty(E, H // 128, I // 128), workspace=torch.empty(1, n, H, dtype=bf), **q)
        for name, run, bm, bn, w, st, r in (("gemm1", g1, 64, 64, 4, 3, False), ("gemm1", g1, 128, 128, 8, 3, True),
                                            ("gemm1", g1, 64, 128, 4, 3, True), ("gemm2", g2, 64, 128, 4, 4, False),
                                            ("gemm2", g2, 128, 256, 8, 3, True), ("gemm2", g2, 128, 128, 8, 3, True)):
            captured.clear()
            run(dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=128, GROUP_SIZE_M=8, num_warps=w, num_stages=st,
                     RESCALE=r))
            out.append((f"block {name} {bm}x{bn} w{w}" + (" rescale" if r else ""), captured[0]))
    finally:
        gg.launch = real
    return out


def epilogue_cases() -> list:
    """h quantized in GEMM1's epilogue (the plan's h_group; FUSEDMOE_PLAN h_quant): qwen3 fp8_channel GEMM1 with
    one and two 1 x 128 groups a tile and its GEMM2 (group-scaled h, channel-scaled w2,
    RESCALE); deepseek-v3 tp8 fp8_block GEMM1 (1 x 128 groups, RESCALE)."""
    from fusedmoe.kernels import grouped_gemm as gg
    captured, real = _capture(gg)
    fp8 = torch.float8_e4m3fn
    out = []
    try:
        E, H, I, k, T = 128, 2048, 768, 8, 4096
        n = T * k
        align = _fake_align(E, T, k)
        ch = dict(quant="channel")
        for bm, bn, w, st in ((128, 128, 8, 4), (64, 256, 8, 3)):
            captured.clear()
            gg.gemm1_act(torch.empty(T, H, dtype=fp8), torch.empty(E, 2 * I, H, dtype=fp8), align, k, "silu",
                         torch.empty(n, I, dtype=fp8), out_group=128, out_scale=torch.empty(n, I // 128),
                         a_scale=torch.empty(T, 1), b_scale=torch.empty(E, 2 * I), **ch,
                         config=dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=128, GROUP_SIZE_M=8,
                                     num_warps=w, num_stages=st))
            out.append((f"epilogue gemm1 fp8_channel {bm}x{bn}", captured[0]))
        for bm, w, st in ((128, 8, 4), (64, 4, 2)):
            captured.clear()
            gg.gemm2(torch.empty(n, I, dtype=fp8), torch.empty(E, H, I, dtype=fp8), align, torch.empty(T, k),
                     torch.empty(T, H, dtype=torch.bfloat16), a_scale=torch.empty(n, I // 128), a_group=128,
                     b_scale=torch.empty(E, H), workspace=torch.empty(1, n, H, dtype=torch.bfloat16), **ch,
                     config=dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=8,
                                 num_warps=w, num_stages=st, RESCALE=True))
            out.append((f"epilogue gemm2 fp8_channel {bm}x256 a-groups rescale", captured[0]))
        E, H, I = 256, 7168, 256
        align = _fake_align(E, T, k)
        captured.clear()
        gg.gemm1_act(torch.empty(T, H, dtype=fp8), torch.empty(E, 2 * I, H, dtype=fp8), align, k, "silu",
                     torch.empty(n, I, dtype=fp8), out_group=128, out_scale=torch.empty(n, I // 128),
                     a_scale=torch.empty(T, H // 128), b_scale=torch.empty(E, 2 * I // 128, H // 128),
                     quant="block", block_shape=(128, 128),
                     config=dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=8,
                                 num_warps=8, num_stages=3, RESCALE=True))
        out.append(("epilogue gemm1 fp8_block 128x128 rescale", captured[0]))
        captured.clear()      # the shipped H100 T=4096 tile
        gg.gemm1_act(torch.empty(T, H, dtype=fp8), torch.empty(E, 2 * I, H, dtype=fp8), align, k, "silu",
                     torch.empty(n, I, dtype=fp8), out_group=128, out_scale=torch.empty(n, I // 128),
                     a_scale=torch.empty(T, H // 128), b_scale=torch.empty(E, 2 * I // 128, H // 128),
                     quant="block", block_shape=(128, 128),
                     config=dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1,
                                 num_warps=4, num_stages=5, RESCALE=True, USE_TMA=True))
        out.append(("epilogue gemm1 fp8_block 64x128 w4 s5 rescale tma", captured[0]))
    finally:
        gg.launch = real
    return out


def reg_usage(cubin: bytes) -> str:
    """'REG r, LOCAL l' (registers per thread, local memory = spills) from the bundled
    cuobjdump's resource usage of the compiled cubin (no GPU needed)."""
    import re
    import subprocess
    import tempfile
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        r = subprocess.run([exe, "--dump-resource-usage", f.name], capture_output=True, text=True)
    except OSError:
        return "regs ?"
    finally:
        os.unlink(f.name)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", r.stdout)
    return f"regs {m.group(1)} stack {m.group(2)} local {m.group(3)}" if m else "regs ?"


def tc_cases() -> list:
    """Tensor-core decode GEMMs (kernels/decode_tc.py) at T=1 as the backend binds them:
    qwen3 fp8 / int8 per channel, deepseek-v3 tp8 fp8 1x128 blocks, with PDL."""
    from fusedmoe.kernels import decode_tc as tc
    bf, fp8, i8 = torch.bfloat16, torch.float8_e4m3fn, torch.int8
    cases = []
    for name, (E, H, I, k), dt, quant in (("qwen3 fp8", (128, 2048, 768, 8), fp8, "channel"),
                                          ("qwen3 int8", (128, 2048, 768, 8), i8, "channel"),
                                          ("deepseek fp8_block", (256, 7168, 256, 8), fp8, "block")):
        blk = (128, 128) if quant == "block" else None
        T = 1
        w13, w2 = torch.empty(E, 2 * I, H, dtype=dt), torch.empty(E, H, I, dtype=dt)
        ids, tw = torch.zeros(T, k, dtype=torch.int32), torch.empty(T, k)
        xq, h, hq = torch.empty(T, H, dtype=dt), torch.empty(T * k, I, dtype=bf), torch.empty(T * k, I, dtype=dt)
        out = torch.empty(T, H, dtype=bf)
        if quant == "block":
            xs, hs = torch.empty(T, H // 128), torch.empty(T * k, I // 128)
            s13, s2 = torch.empty(E, 2 * I // 128, H // 128), torch.empty(E, H // 128, I // 128)
        else:
            xs, hs, s13, s2 = torch.empty(T, 1), torch.empty(T * k, 1), torch.empty(E, 2 * I), torch.empty(E, H)
        part, sync = torch.empty(1 << 16), torch.zeros(1 << 12, dtype=torch.int32)
        q = dict(quant=quant, block_shape=blk)
        cases += [
            (f"tc {name} gemm1 pdl", tc.tc_gemm1_launch(xq, w13, ids, "silu", h, part, sync, a_scale=xs, b_scale=s13,
                                                        pdl=True, pdl_wait=True, **q)),
            (f"tc {name} gemm1 nosplit", tc.tc_gemm1_launch(
                xq, w13, ids, "silu", h, part, sync, a_scale=xs, b_scale=s13,
                config=dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4), **q)),
            (f"tc {name} gemm2 pdl", tc.tc_gemm2_launch(hq, w2, ids, tw, out, part, sync, a_scale=hs, b_scale=s2,
                                                        pdl=True, **q)),
            (f"tc {name} gemm2 groups1", tc.tc_gemm2_launch(
                hq, w2, ids, tw, out, part, sync, a_scale=hs, b_scale=s2,
                config=dict(BLOCK_N=64, BLOCK_K=128, GROUPS=1, num_warps=4, num_stages=4), **q)),
            (f"tc {name} gemm1 pdl l2_pre", _consts(tc.tc_gemm1_launch(    # config L2_PRE (CPU tensors: 0)
                xq, w13, ids, "silu", h, part, sync, a_scale=xs, b_scale=s13, pdl=True, pdl_wait=True,
                config=dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=4), **q), L2_PRE=4)),
            (f"tc {name} gemm1 pdl bk256", tc.tc_gemm1_launch(            # TC_GEMM1_BLOCK_GROUPS 2 (block: SUB_K)
                xq, w13, ids, "silu", h, part, sync, a_scale=xs, b_scale=s13, pdl=True, pdl_wait=True,
                config=dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3), **q)),
            (f"tc {name} gemm1 share l2_pre", _consts(tc.tc_gemm1_launch(  # SHARE: each pair's expert hinted
                xq, w13, ids, "silu", h, part, sync, a_scale=xs, b_scale=s13, pdl=True, pdl_wait=True,
                table=torch.empty(T * k, 16, dtype=torch.int32),
                config=dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=1, SHARE=True, num_warps=4, num_stages=4), **q),
                L2_PRE=4)),
            (f"tc {name} gemm2 pdl l2_pre", _consts(tc.tc_gemm2_launch(
                hq, w2, ids, tw, out, part, sync, a_scale=hs, b_scale=s2, pdl=True,
                config=dict(BLOCK_N=64, BLOCK_K=128, GROUPS=2, num_warps=4, num_stages=4), **q), L2_PRE=2)),
        ]
    return cases


def byte_loads(ptx: str) -> list:
    """The 8-bit global loads (ld.global...b8 / u8 / s8) of a PTX text."""
    return re.findall(r"ld\.global[.\w]*\.[bus]8\b", ptx)


def main() -> int:
    from fusedmoe.kernels import decode as dk
    bf = torch.bfloat16
    cases = []
    for name, (E, H, I, k) in {"qwen3": (128, 2048, 768, 8), "deepseek-tp8": (256, 7168, 256, 8)}.items():
        w13, w2 = torch.empty(E, 2 * I, H, dtype=bf), torch.empty(E, H, I, dtype=bf)
        for T in (1, 3):
            x, ids = torch.empty(T, H, dtype=bf), torch.zeros(T, k, dtype=torch.int32)
            tw, h, out = torch.empty(T, k), torch.empty(T * k, I, dtype=bf), torch.empty(T, H, dtype=bf)
            emap = torch.zeros(E, dtype=torch.int32)
            cases += [
                (f"{name} T={T} gemm1 map+bias", dk.gemm1_launch(x, w13, ids, "swigluoai", h, expert_map=emap,
                                                               bias=torch.empty(E, 2 * I, dtype=bf))),
                (f"{name} T={T} gemm1 pdl", dk.gemm1_launch(x, w13, ids, "silu", h, pdl=True)),
                (f"{name} T={T} gemm2 pdl", dk.gemm2_launch(h, w2, ids, tw, out, pdl=True)),
                (f"{name} T={T} gemm2 pdl tiles8", dk.gemm2_launch(h, w2, ids, tw, out, pdl=True, config=dict(
                    dk.decode_config(8, T, H, I, 2, 132, gemm2=True), TILES=8))),
            ]
    # the W8A8 decode chain (fp8 per token, fp8 1x128 groups): quantization kernels with PDL,
    # GEMM1 waiting for x, GEMM2 for h
    from fusedmoe.kernels import quantize as qk
    fp8 = torch.float8_e4m3fn
    E, H, I, k, T = 128, 2048, 768, 8, 1
    w13, w2 = torch.empty(E, 2 * I, H, dtype=fp8), torch.empty(E, H, I, dtype=fp8)
    ids, tw = torch.zeros(T, k, dtype=torch.int32), torch.empty(T, k)
    xq, h, hq = torch.empty(T, H, dtype=fp8), torch.empty(T * k, I, dtype=bf), torch.empty(T * k, I, dtype=fp8)
    out = torch.empty(T, H, dtype=bf)
    for quant, xs, hs, s13, s2, blk in (
            ("channel", torch.empty(T, 1), torch.empty(T * k, 1), torch.empty(E, 2 * I), torch.empty(E, H), None),
            ("block", torch.empty(T, H // 128), torch.empty(T * k, I // 128), torch.empty(E, 2 * I // 128, H // 128),
             torch.empty(E, H // 128, I // 128), (128, 128))):
        q = dict(quant=quant, block_shape=blk)
        cases += [
            (f"fp8 {quant} gemm1 pdl_wait", dk.gemm1_launch(xq, w13, ids, "silu", h, a_scale=xs, b_scale=s13,
                                                             pdl=True, pdl_wait=True, **q)),
            (f"fp8 {quant} gemm2 pdl", dk.gemm2_launch(hq, w2, ids, tw, out, a_scale=hs, b_scale=s2, pdl=True, **q)),
        ]
    # W8A8 weights with 16-bit x / h (the plan's a16 math), int8 weights too
    i8 = torch.int8
    for quant, wd, s13, s2, blk in (
            ("channel", fp8, torch.empty(E, 2 * I), torch.empty(E, H), None),
            ("block", fp8, torch.empty(E, 2 * I // 128, H // 128), torch.empty(E, H // 128, I // 128), (128, 128)),
            ("channel", i8, torch.empty(E, 2 * I), torch.empty(E, H), None)):
        a13, a2 = torch.empty(E, 2 * I, H, dtype=wd), torch.empty(E, H, I, dtype=wd)
        q = dict(quant=quant, block_shape=blk)
        lab = f"a16 {quant} {str(wd)[6:]}"
        cases += [
            (f"{lab} gemm1", dk.gemm1_launch(torch.empty(T, H, dtype=bf), a13, ids, "silu", h, b_scale=s13,
                                             pdl=True, **q)),
            (f"{lab} gemm2", dk.gemm2_launch(h, a2, ids, tw, out, b_scale=s2, pdl=True, **q)),
            (f"{lab} gemm2 tiles4", dk.gemm2_launch(h, a2, ids, tw, out, b_scale=s2, pdl=True, config=dict(
                dk.decode_config(8, T, H, I, 1, 132, blk[1] if blk else None, gemm2=True), TILES=4), **q)),
            # GEMM2 with one tile a program (qwen3's shipped choice)
            (f"{lab} gemm2 tiles1", dk.gemm2_launch(h, a2, ids, tw, out, b_scale=s2, pdl=True, config=dict(
                dk.decode_config(8, T, H, I, 1, 132, blk[1] if blk else None, gemm2=True), TILES=1), **q)),
        ]

    def rows_case(label, K, rows, bk, mode="token", qt="fp8", counts=False, pdl=False, dt=bf, rcp=False,
                  zero=False):
        """_quant_rows_kernel on a [rows, bk] tile (num_warps as quantize._launch_rows)."""
        qd = fp8 if qt == "fp8" else torch.int8
        return (label, (qk._quant_rows_kernel, (1,), (
            torch.empty(1, K, dtype=dt), torch.empty(1, K, dtype=qd), torch.empty(1), torch.empty(1, dtype=torch.int32),
            torch.empty(1, dtype=torch.int32) if counts else torch.empty(1), torch.empty(1, K, dtype=bf),
            1000, K, 64 if counts else 1, K, K, K),
            dict(MODE=mode, QTYPE=qt, QMAX=448.0 if qt == "fp8" else 127.0, BITWISE_FP8=False,
                 HAS_COUNTS=counts, BLOCK_K=bk, ONE_CHUNK=K <= bk, ROWS=rows, PDL=pdl, RCP=rcp, ZERO=zero),
            8 if rows * bk >= 2048 else 4, None, pdl))

    def group_case(label, K, rows, gpp, counts=False, pdl=False, pow2=False, rcp=False, zero=False):
        """_quant_group_kernel on a [rows, gpp, 128] tile (num_warps as quant_fp8_group)."""
        return (label, (qk._quant_group_kernel, (1, 1), (
            torch.empty(1, K, dtype=bf), torch.empty(1, K, dtype=fp8), torch.empty(1, K // 128),
            torch.empty(1, dtype=torch.int32) if counts else torch.empty(1), torch.empty(1, K, dtype=bf),
            1000, K, K // 128, 64 if counts else 1, K, K, K // 128, K),
            dict(GROUP=128, GROUP_P2=128, GROUPS_PER_PROG=gpp, POW2=pow2, BITWISE_FP8=False, HAS_COUNTS=counts,
                 ROWS=rows, PDL=pdl, RCP=rcp, ZERO=zero), 8 if rows * gpp * 128 > 4096 else 4, None, pdl))

    for qt in ("fp8", "int8"):
        cases.append(rows_case(f"quant rows pdl {qt}", H, 1, 2048, qt=qt, pdl=True))
    cases.append(group_case("quant group pdl", H, 1, 16, pdl=True))
    # the fused zeroing of the atomic k-sum's output (grouped path, W8A8: quantize.py ZERO)
    cases += [rows_case("quant rows zero fp8 R=2 K=2048", H, 2, 2048, zero=True),
              rows_case("quant rows zero int8 K=768 chunks", 768, 2, 256, qt="int8", zero=True),
              group_case("quant group zero K=7168", 7168, 1, 16, zero=True)]
    # several rows per program (the prefill sizes: quantize._rows_per_program): h [M, 768] and
    # x [T, 2048] bf16, batched padding rows, the per-tensor modes, rows of two chunks (7168)
    cases += [
        rows_case("quant rows R=8 K=768 fp8", 768, 8, 1024),
        rows_case("quant rows R=8 K=768 int8 counts", 768, 8, 1024, qt="int8", counts=True),
        rows_case("quant rows R=4 K=2048 fp8 pdl", H, 4, 2048, pdl=True),
        rows_case("quant rows R=2 K=7168 2 chunks", 7168, 2, 4096),
        rows_case("quant rows R=4 fp32 K=768", 768, 4, 1024, dt=torch.float32),
        rows_case("quant rows R=8 tensor_dynamic", 768, 8, 1024, mode="tensor_dynamic", counts=True),
        rows_case("quant rows R=8 tensor_static", 768, 8, 1024, mode="tensor_static"),
        group_case("quant group R=8 K=768", 768, 8, 8),
        group_case("quant group R=4 K=2048 counts pow2", H, 4, 16, counts=True, pow2=True),
        group_case("quant group R=4 K=7168 pdl", 7168, 4, 16, pdl=True),
        # the division through the scale's reciprocal (the quantizers' reciprocal=, the default)
        rows_case("quant rows rcp R=1 K=768 fp8", 768, 1, 1024, rcp=True),
        rows_case("quant rows rcp R=1 K=768 int8", 768, 1, 1024, qt="int8", rcp=True),
        group_case("quant group rcp R=2 K=256", 256, 2, 2, rcp=True),
        # per-token rows of 768 in chunks of 256 (quantize._token_chunk), 1 warp
        (lambda c: (c[0], c[1][:4] + (1,) + c[1][5:]))(rows_case("quant rows chunks R=2 K=768 fp8", 768, 2, 256, rcp=True)),
    ]
    # the alignment's chunked path as a PDL chain (align_block_size(pdl=True))
    from fusedmoe.kernels import align as al
    n, eb = 40000, 256
    cases += [
        ("align count pdl", (al._align_count_kernel, (79,), (torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32),
                             torch.empty(79, eb, dtype=torch.int32), n, 256, 128),
                             dict(HAS_MAP=False, E_BINS=eb, CHUNK_=512, PDL=True), 4, None, False)),
        ("align scan pdl", (al._align_scan_kernel, (1,), (torch.empty(79, eb, dtype=torch.int32),
                            torch.empty(79, eb, dtype=torch.int32), torch.empty(n + 128 * 63, dtype=torch.int32),
                            torch.empty(1000, dtype=torch.int32), torch.empty(1, dtype=torch.int32), 79, n, 128,
                            n + 128 * 63, 1000), dict(BM=64, E_BINS=eb, LOG_E=8, CB=16, CT=32, FILL_B=1024, EP=eb,
                                                      PDL=True), 8, None, True)),
        # the scan on several programs (align._scan_launch at n = 131072, E 128 / 256)
        ("align scan P=8 pdl", (al._align_scan_kernel, (8,), (torch.empty(128, eb, dtype=torch.int32),
                                torch.empty(128, eb, dtype=torch.int32), torch.empty(139136, dtype=torch.int32),
                                torch.empty(2174, dtype=torch.int32), torch.empty(1, dtype=torch.int32), 128, 131072,
                                128, 139136, 2174), dict(BM=64, E_BINS=eb, LOG_E=8, CB=16, CT=32, FILL_B=1024, EP=32,
                                                          PDL=True), 8, None, True)),
        ("align scan P=16 E=256", (al._align_scan_kernel, (16,), (torch.empty(128, 512, dtype=torch.int32),
                                   torch.empty(128, 512, dtype=torch.int32), torch.empty(163712, dtype=torch.int32),
                                   torch.empty(1279, dtype=torch.int32), torch.empty(1, dtype=torch.int32), 128, 131072,
                                   256, 163712, 1279), dict(BM=128, E_BINS=512, LOG_E=9, CB=8, CT=16, FILL_B=1024,
                                                            EP=32, PDL=False), 8, None, False)),
        # the one-program path (shares _write_layout with the scan)
        ("align small", (al._align_small_kernel, (1,), (torch.empty(512, dtype=torch.int32),
                         torch.empty(512, dtype=torch.int32), torch.empty(4096, dtype=torch.int32),
                         torch.empty(256, dtype=torch.int32), torch.empty(1, dtype=torch.int32), 512, 256, 128,
                         2560, 160), dict(HAS_MAP=True, BM=16, E_BINS=eb, LOG_E=8, BLOCK=512, FILL_B=1024), 4,
                         None, False)),
        ("align scatter pdl", (al._align_scatter_kernel, (79,), (torch.empty(n, dtype=torch.int32),
                               torch.empty(n, dtype=torch.int32), torch.empty(79, eb, dtype=torch.int32),
                               torch.empty(n + 128 * 63, dtype=torch.int32), n, 256, 128),
                               dict(HAS_MAP=False, E_BINS=eb, CHUNK_=512, PDL=True), 4, None, True)),
    ]
    cases += grouped_cases()
    cases += block_cases()
    cases += epilogue_cases()
    cases += tc_cases()
    only = sys.argv[1:]                       # label substrings: compile only those cases
    if only:
        cases = [c for c in cases if any(o in c[0] for o in only)]
    bad = 0
    for label, spec in cases:
        t0 = time.perf_counter()
        try:
            ck = compile_spec(spec)
            ptx = ck.asm["ptx"]
            if os.environ.get("COMPILE_CHECK_DUMP"):   # write the case's PTX and ttgir into that folder
                os.makedirs(os.environ["COMPILE_CHECK_DUMP"], exist_ok=True)
                stem = os.path.join(os.environ["COMPILE_CHECK_DUMP"], re.sub(r"[^A-Za-z0-9_.-]+", "_", label))
                for ext in ("ptx", "ttgir"):
                    with open(f"{stem}.{ext}", "w") as f:
                        f.write(ck.asm[ext])
            # 8-bit global loads: every case here reads its 8-bit operands 4-16 bytes at a time; a
            # byte load means a tile's contiguity was lost (once: a tl.where on the contiguous
            # offsets turned a [BH, 16] fp8 tile into 32 byte loads a thread, the kernel 4x slower)
            narrow = byte_loads(ptx)
            if narrow:
                bad += 1
                print(f"FAIL {label}: {len(narrow)} 8-bit global loads ({narrow[0]}): a tile lost its contiguity "
                      f"(a tl.where / % on the contiguous offsets?)",
                      flush=True)
                continue
            mma = "wgmma " + ",".join(sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))) \
                if "wgmma" in ptx else ("mma" if "mma.sync" in ptx else "")
            print(f"ok   {label:36s} {time.perf_counter() - t0:5.1f} s  shared {ck.metadata.shared} B {mma}"
                  f"  {reg_usage(ck.asm['cubin'])}", flush=True)
        except Exception as e:  # print the compiler's message and go on
            bad += 1
            print(f"FAIL {label}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
