"""Decode GEMM2 with its weights resident in shared memory before h exists (Gluon, sm90+).

Legend as in decode.py (n = T*k pairs, s = t*k + j).

  resident_gemm2: out [T, H] = sum_j w[t, j] * (h[t*k+j] @ w2[e_j]^T * scales + b2[e_j])
                  grid (H / BLOCK_N, T)

Why: at T = 1 the a16 decode (decode.py: GEMM1, then GEMM2 as a programmatic dependent
launch) reads 8-bit weights at 73-81% (GEMM1) and 42-63% (GEMM2) of copy bandwidth, one
kernel after the other, so the layer takes 1.44x (qwen3 fp8_channel) to 1.54x (deepseek-v3
tp8 fp8_block) the time of one read of the weights (H100, docs/BENCHMARKS.md). GEMM2's
weights do not depend on h. Here each program copies ALL of its weight rows (its BLOCK_N
output rows of every slot's expert, the whole K) into shared memory with cp.async as soon as
it starts, then waits for GEMM1 (griddepcontrol.wait), then sums from shared memory. With
GEMM1 launched on fewer programs than fill the SMs (decode.py ``persist``), GEMM2's
programs become resident while GEMM1 still runs, so both weight reads stream together and
what is left after GEMM1 is a few microseconds of sums out of shared memory.

The math is the a16 GEMM2's (decode.py ``_gemm2_tiles``: h 16-bit, 8-bit weights widened,
fp32 sums; per-tensor / per-channel / 128 x 128 block weight scales, bias, routing weight,
expert_map), summed over the slots in slot order (deterministic; not bitwise the CUDA-core
kernel's, which sums its slots as a tree).

Shared memory holds k x BLOCK_N x K weight bytes a program (8-bit: deepseek-v3 tp8 64 x 8 x
256 = 128 KB, qwen3-30b-a3b 16 x 8 x 768 = 96 KB): ``resident_config`` says whether a shape
fits. Gluon kernels do not run under TRITON_INTERPRET: tests/test_decode_resident.py runs
them on the GPU and compiles them for sm_90a on the CPU.
"""
from __future__ import annotations

from typing import Optional

import torch

try:       # Gluon ships in the triton wheels of 3.4+ (the device's 3.6, the dev box's 3.9)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    HAS_GLUON = True
except ImportError:          # pragma: no cover
    HAS_GLUON = False

from .. import env
from .launcher import cdiv, next_power_of_2

SMEM_BUDGET = 160 * 1024     # bytes of weights a program may hold (the H100 / H200 have 227 KB a CTA)
TILE_ELEMS = 4096            # elements of one [RB, BK] step of the sums (32 a thread at 4 warps)

if HAS_GLUON:
    # triton 3.6 calls the CTA barrier thread_barrier; 3.9 renamed it barrier
    _cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
    # 3.6 names the cp.async copy async_copy_global_to_shared; 3.9 removed that name for async_load
    _cp_async = async_copy.async_load if hasattr(async_copy, "async_load") else async_copy.async_copy_global_to_shared

    @gluon.jit
    def _gdc_wait():
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)

    @gluon.jit
    def _slot_expert(ids_ptr, map_ptr, s, num_global, E, HAS_MAP: gl.constexpr):
        """Local expert of pair s (scalar int32), -1 when dropped or out of range."""
        g = gl.load(ids_ptr + s).to(gl.int32)
        if HAS_MAP:
            ok = (g >= 0) & (g < num_global)
            loc = gl.load(map_ptr + gl.where(ok, g, 0)).to(gl.int32)
            loc = gl.where(ok, loc, -1)
        else:
            loc = g
        return gl.where((loc >= 0) & (loc < E), loc, -1)

    @gluon.jit
    def _resident_gemm2_kernel(
        h_ptr, w_ptr, out_ptr, bias_ptr, b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr,
        N_OUT, num_global, E,
        stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
        stride_bias_e, stride_bias_n, stride_bse, stride_bsn, stride_bsk,
        TOP_K: gl.constexpr, K: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_MAP: gl.constexpr,
        MUL_W: gl.constexpr, B_SCALE: gl.constexpr, GROUP_N: gl.constexpr, GROUP_K: gl.constexpr,
        BLOCK_N: gl.constexpr, RB: gl.constexpr, BK: gl.constexpr, TPW_K: gl.constexpr, PDL: gl.constexpr,
        NW: gl.constexpr,
    ):
        """Grid (H / BLOCK_N, T); NW = the launch's num_warps."""
        KC: gl.constexpr = K // BK                 # K chunks (K % BK == 0)
        NR: gl.constexpr = BLOCK_N // RB           # row blocks
        blk: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[32 // TPW_K, TPW_K],
                                             warps_per_cta=[NW, 1], order=[1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, blk)
        col_l: gl.constexpr = gl.SliceLayout(0, blk)
        smem_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        n0 = gl.program_id(0) * BLOCK_N
        t = gl.program_id(1).to(gl.int64)
        w_s = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [TOP_K * KC * NR, RB, BK], smem_l)
        r = gl.arange(0, RB, layout=row_l)
        kk = gl.arange(0, BK, layout=col_l)
        # 1. every weight byte this program will sum, in flight at once (no dependence on h)
        for j in gl.static_range(TOP_K):
            e = _slot_expert(ids_ptr, map_ptr, t * TOP_K + j, num_global, E, HAS_MAP)
            w_e = w_ptr + gl.where(e >= 0, e, 0).to(gl.int64) * stride_we
            for c in gl.static_range(KC):
                for rb in gl.static_range(NR):
                    rows = n0 + rb * RB + r
                    ptrs = w_e + rows[:, None] * stride_wn + (c * BK + kk)[None, :] * stride_wk
                    ok = (rows[:, None] < N_OUT) & (kk[None, :] >= 0) & (e >= 0)
                    _cp_async(w_s.index((j * KC + c) * NR + rb), ptrs, mask=ok)
        async_copy.commit_group()
        # 2. h is GEMM1's output
        if PDL:
            _gdc_wait()
        async_copy.wait_group(0)
        _cta_barrier()
        # 3. the sums, row block by row block, slots in order. A dropped slot is skipped (its
        #    rows were not copied). FOLD: every factor of a slot is one number for the row
        #    block (per-expert scale, the block scale of its 128 x 128 group, the routing
        #    weight), so it multiplies the h chunk and all slots and chunks share one [RB, BK]
        #    accumulator, reduced once; per-channel scales or a bias need a sum per slot.
        FOLD: gl.constexpr = B_SCALE != 2 and not HAS_BIAS
        for rb in range(NR):
            rows = n0 + rb * RB + r
            r_ok = rows < N_OUT
            rows_c = gl.where(r_ok, rows, 0)
            acc_all = gl.zeros([RB, BK], gl.float32, blk)
            total = gl.zeros([RB], gl.float32, row_l)
            for j in gl.static_range(TOP_K):
                s = t * TOP_K + j
                e = _slot_expert(ids_ptr, map_ptr, s, num_global, E, HAS_MAP)
                if e >= 0:
                    e64 = e.to(gl.int64)
                    acc2 = gl.zeros([RB, BK], gl.float32, blk)
                    for c in gl.static_range(KC):
                        w = w_s.index((j * KC + c) * NR + rb).load(blk).to(gl.float32)
                        a = gl.load(h_ptr + s * stride_hm + (c * BK + kk) * stride_hk).to(gl.float32)
                        if B_SCALE == 3:      # the row block lies in one group of GROUP_N rows
                            a = a * gl.load(b_scale_ptr + e64 * stride_bse + ((n0 + rb * RB) // GROUP_N) * stride_bsn
                                            + ((c * BK) // GROUP_K) * stride_bsk)
                        if FOLD:
                            if B_SCALE == 1:
                                a = a * gl.load(b_scale_ptr + e64 * stride_bse)
                            if MUL_W:
                                a = a * gl.load(topk_w_ptr + s).to(gl.float32)
                            acc_all += w * a[None, :]
                        else:
                            acc2 += w * a[None, :]
                    if not FOLD:
                        acc = gl.sum(acc2, axis=1)
                        if B_SCALE == 1:
                            acc = acc * gl.load(b_scale_ptr + e64 * stride_bse)
                        elif B_SCALE == 2:
                            acc = acc * gl.load(b_scale_ptr + e64 * stride_bse + rows_c * stride_bsn)
                        if HAS_BIAS:
                            acc += gl.load(bias_ptr + e64 * stride_bias_e + rows_c * stride_bias_n).to(gl.float32)
                        if MUL_W:
                            acc = acc * gl.load(topk_w_ptr + s).to(gl.float32)
                        total += acc
            if FOLD:
                total = gl.sum(acc_all, axis=1)
            gl.store(out_ptr + t * stride_om + rows * stride_on, total.to(out_ptr.dtype.element_ty), mask=r_ok)


def available(device: torch.device) -> bool:
    """Gluon importable and a CUDA device of compute capability 9.0+ (cp.async, griddepcontrol)."""
    return HAS_GLUON and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def resident_config(T: int, k: int, H: int, K: int, esize: int, num_sms: int, group_k: Optional[int] = None,
                    budget: int = SMEM_BUDGET, group_n: Optional[int] = None, num_warps: Optional[int] = None
                    ) -> Optional[dict]:
    """(BLOCK_N, RB, BK, TPW_K, num_warps) for ``resident_gemm2_launch``, or None when the shape does
    not fit: 8-bit weights, K a multiple of a power-of-two chunk BK (16 <= BK <= 256, dividing the
    block-scale group), and k x BLOCK_N x K bytes within ``budget``, BLOCK_N the smallest power of
    two that needs at most one program an SM per token."""
    if esize != 1 or T < 1:
        return None
    bk = 256
    while bk >= 16 and (K % bk or (group_k is not None and group_k % bk)):
        bk //= 2
    if bk < 16:
        return None
    rb = max(1, min(TILE_ELEMS // bk, 64))
    bn = rb
    while cdiv(H, bn) > num_sms:
        bn *= 2
    if k * bn * K * esize > budget:
        return None
    rb = min(rb, bn)
    while group_n is not None and group_n % rb:     # a row block within one scale group
        rb //= 2
    if num_warps is None:
        num_warps = env.decode_resident_warps() or 8
    return dict(BLOCK_N=bn, RB=rb, BK=bk, TPW_K=min(32, bk // 16), num_warps=num_warps)


def resident_gemm2_launch(h, w2, topk_ids, topk_weights, out, *, config: dict, expert_map=None,
                          mul_routed_weight=True, bias=None, quant="none", b_scale=None, block_shape=None,
                          pdl=False) -> tuple:
    """(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl) for launcher.launch /
    bind, slots as decode.py's GEMM2 (h 0, out 2, topk_weights 5, ids 6, map 7: see
    RESIDENT_SLOTS). h is 16-bit (the a16 math); ``pdl``: a programmatic dependent launch of
    the kernel that writes h."""
    from .grouped_gemm import _scale_args
    T, k = topk_ids.shape
    E, H, K = w2.shape
    _, b_mode, gn, gk, _, sb, _, _, sbe, sbn, sbk = _scale_args(quant, None, b_scale, block_shape, h, w2)
    assert K % config["BK"] == 0 and (b_mode != 3 or (gk % config["BK"] == 0 and gn % config["RB"] == 0)), \
        (K, config, gk, gn)
    ids = topk_ids.reshape(-1)
    emap = ids if expert_map is None else expert_map
    num_global = E if expert_map is None else expert_map.numel()
    s_bias = bias.stride()[:2] if bias is not None else (0, 0)
    return (_resident_gemm2_kernel, (cdiv(H, config["BLOCK_N"]), T), (
        h, w2, out, bias if bias is not None else w2, b_scale if b_scale is not None else w2, topk_weights, ids, emap,
        H, num_global, E,
        *h.stride()[:2], *w2.stride()[:3], *out.stride()[:2], *s_bias, sbe, sbn, sbk,
    ), dict(TOP_K=k, K=K, HAS_BIAS=bias is not None, HAS_MAP=expert_map is not None, MUL_W=mul_routed_weight,
            B_SCALE=b_mode, GROUP_N=gn, GROUP_K=gk, BLOCK_N=config["BLOCK_N"], RB=config["RB"], BK=config["BK"],
            TPW_K=config["TPW_K"], PDL=pdl, NW=config["num_warps"]), config["num_warps"], None, pdl)


RESIDENT_SLOTS = dict(h=0, out=2, topk_weights=5, ids=6, map=7)
