"""Split-I decode: the whole MoE layer for a few tokens in ONE launch with no grid-wide wait.

Legend as kernels/decode.py: T tokens, k top-k, H hidden, I intermediate, pairs s = t*k + j.

    program (c, s): hc = act(x[t] @ w13[e_s, rows of chunk c]^T)          [BI]  (GEMM1 rows)
                    ws[t] += w[s] * (w2[e_s][:, chunk c] @ hc (+ b2 if c == 0)) [H]  (GEMM2 columns)
    grid (I / BI, T * k); the last program to finish writes out = ws (cast) and zeroes ws.

Why: the two-kernel decode (decode.py) must wait for all of h before GEMM2 reads it, so each
kernel pays its own ramp and tail: at one token that floor is measured at 1.27-1.32x the
8-bit weight read, above issue 5's 1.3x line, where one read kernel is 1.14-1.19x
(docs/BENCHMARKS.md, "The two-kernel weight-read floor"). GEMM2 is linear in h, so a program
that owns a chunk of I can finish its own GEMM2 share at once: no program waits for another.
The price: the k-sum and the sum over chunks become fp32 atomic adds into a workspace
(T*k*I/BI adds of H values), so this path is not bitwise reproducible (the oracle's
``deterministic`` keeps the two-kernel path), and w2 is read in [H, BI] column slices of its
[E, H, I] layout (BI 16 = 16 contiguous bytes a row at 8 bits).

The workspace ws [T, H] fp32 and the ticket are zero before a launch and are left zero by its
last program (it reads ws from L2, after the ticket's acquire, and stores zeros), so no zeroing
launch is needed. One (ws, ticket) pair serves a device (``workspace``): launches that share it
must not run concurrently (one stream), as with the tensor-core decode's tickets.

16-bit activations only (x and h are never quantized: the "a16" math of the W8A8 decode,
as decode.py's one-token default); weights 16-bit, or 8-bit with per-tensor / per-channel /
block scales (B_SCALE as grouped_gemm._scale_args).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import env
from .decode import _epilogue, _local_experts, _map_args, _quant_flags, _rows_dot, w4_mode
from .grouped_gemm import ACTIVATIONS, _activation, _num_sms
from .launcher import cdiv, launch, next_power_of_2


@triton.jit
def _w2_tile(w2_e, rows, stride_w2n, cols, stride_w2k, ok, c_ok):
    """[BH, BI] of w2 (rows ``rows`` masked by ``ok``, columns ``cols`` by ``c_ok``): ``cols`` must
    stay a plain arange (no tl.where), or its contiguity is lost and the loads become bytes."""
    return tl.load(w2_e + rows[:, None] * stride_w2n + cols[None, :] * stride_w2k, mask=ok[:, None] & c_ok[None, :],
                   other=0.0)


@triton.jit(do_not_specialize=["num_global"])
def _split_i_kernel(
    x_ptr, w13_ptr, w2_ptr, ws_ptr, out_ptr, ticket_ptr, b13_ptr, b2_ptr, bs13_ptr, bs2_ptr, topk_w_ptr,
    ids_ptr, map_ptr,
    I, H, T, num_global, E,
    stride_xm, stride_xk, stride_w13e, stride_w13n, stride_w13k, stride_w2e, stride_w2n, stride_w2k,
    stride_wsm, stride_om, stride_on, stride_b13e, stride_b13n, stride_b2e, stride_b2n,
    stride_bs13e, stride_bs13n, stride_bs13k, stride_bs2e, stride_bs2n, stride_bs2k,
    limit, alpha,
    TOP_K: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
    HAS_BIAS13: tl.constexpr, HAS_BIAS2: tl.constexpr, HAS_MAP: tl.constexpr, MUL_W: tl.constexpr,
    B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, PREFETCH: tl.constexpr,
    W4: tl.constexpr = 0, BITWISE_FP8: tl.constexpr = False, STAGGER: tl.constexpr = True,
    ADD: tl.constexpr = True,
):
    """Grid (I / BLOCK_I, T * k): see the module docstring. ADD False (a timing probe only: the
    result is wrong) leaves out the atomic adds."""
    c = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    t = s // TOP_K
    R: tl.constexpr = 2 if GATED else 1
    r = tl.arange(0, R)
    e = _local_experts(ids_ptr, map_ptr, s + r * 0, r >= 0, num_global, E, HAS_MAP)   # [R], equal
    e_s = tl.max(e)
    offs_i = c * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = offs_i < I
    if e_s >= 0:
        e64 = e.to(tl.int64)
        e1 = e_s.to(tl.int64)
        # w2's first column slice does not depend on h: in flight during GEMM1
        w2_e = w2_ptr + e1 * stride_w2e
        offs_h = tl.arange(0, BLOCK_H)
        cols = offs_i
        # each program walks H from its own tile on (STAGGER): programs in step would all add into
        # the same few lines of ws at once, and adds to one line are serialized in L2
        n_h = tl.cdiv(H, BLOCK_H)
        first = (c + tl.program_id(1) * tl.num_programs(0)) % n_h if STAGGER else 0
        rows = first * BLOCK_H + offs_h
        w_nx = _w2_tile(w2_e, rows, stride_w2n, cols, stride_w2k, rows < H, i_ok)
        # GEMM1 rows of the chunk: gate and up
        wrows = tl.where(i_ok, offs_i, 0)[None, :] + (r * I)[:, None]                          # [R, BI]
        bs_e = bs13_ptr + e64 * stride_bs13e
        x_rows = x_ptr + t * stride_xm + r * 0
        acc, sa_tok = _rows_dot(x_rows, stride_xk, w13_ptr + e64[:, None] * stride_w13e + wrows * stride_w13n,
                                stride_w13k, H, H + r * 0, x_rows, 0, bs_e[:, None] + (wrows // GROUP_N) * stride_bs13n,
                                stride_bs13k, 0, B_SCALE, GROUP_K, False, 0, "fp8", 448.0, False, BITWISE_FP8,
                                R, BLOCK_I, BLOCK_K, PREFETCH, 0, 0, 0, W4)
        acc = _epilogue(acc, sa_tok, x_rows, bs_e, b13_ptr + e64 * stride_b13e, wrows, stride_bs13n,
                        stride_b13n, 0, B_SCALE, HAS_BIAS13, 0)
        g = tl.sum(tl.where(r[:, None] == 0, acc, 0.0), axis=0)                    # [BI]
        u = tl.sum(tl.where(r[:, None] == R - 1, acc, 0.0), axis=0)
        # h rounded to x's dtype, as the two-kernel path stores it
        hc = _activation(g, u, ACT, HAS_LIMIT, limit, alpha).to(x_ptr.dtype.element_ty).to(tl.float32)
        hc = tl.where(i_ok, hc, 0.0)
        if MUL_W:
            wt = tl.load(topk_w_ptr + s).to(tl.float32)
        else:
            wt = 1.0
        if B_SCALE == 1:
            wt = wt * tl.load(bs2_ptr + e1 * stride_bs2e)
        bs2_e = bs2_ptr + e1 * stride_bs2e
        ws_row = ws_ptr + t * stride_wsm
        for i in range(0, n_h):
            rows = ((first + i) % n_h) * BLOCK_H + offs_h
            r_ok = rows < H
            w = w_nx
            rows1 = ((first + i + 1) % n_h) * BLOCK_H + offs_h
            w_nx = _w2_tile(w2_e, rows1, stride_w2n, cols, stride_w2k, rows1 < H - H * ((i + 1) // n_h), i_ok)   # (none after the last)
            p = tl.sum(w.to(tl.float32) * hc[None, :], axis=1)                       # [BH]
            if B_SCALE == 2:
                p = p * tl.load(bs2_e + rows * stride_bs2n, mask=r_ok, other=0.0)
            elif B_SCALE == 3:
                p = p * tl.load(bs2_e + (rows // GROUP_N) * stride_bs2n + ((c * BLOCK_I) // GROUP_K) * stride_bs2k,
                                mask=r_ok, other=0.0)
            if HAS_BIAS2:
                p += tl.load(b2_ptr + e1 * stride_b2e + rows * stride_b2n, mask=rows + c * H < H,
                             other=0.0)                                  # chunk 0 only.to(tl.float32)
            if ADD:
                tl.atomic_add(ws_row + rows, p * wt, mask=r_ok, sem="relaxed")
            else:     # keep the products live without the adds: one store a program, never taken
                tl.store(ws_row + rows, p * wt, mask=r_ok & (p * wt == 12345.678))
    # every program takes a ticket (a dropped pair's too); the last one writes the output
    tl.debug_barrier()                                 # every thread's adds before the release
    n_prog = tl.num_programs(0) * tl.num_programs(1)
    old = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if old == n_prog - 1:
        offs = tl.arange(0, BLOCK_H)
        for m in range(0, T):
            for h0 in range(0, H, BLOCK_H):
                cols_o = h0 + offs
                o_ok = cols_o < H
                ws_o = ws_ptr + m * stride_wsm + cols_o
                v = tl.load(ws_o, mask=o_ok, other=0.0, cache_modifier=".cg")        # L2: every program's adds
                tl.store(ws_o, tl.zeros_like(v), mask=o_ok)
                tl.store(out_ptr + m * stride_om + cols_o * stride_on, v.to(out_ptr.dtype.element_ty), mask=o_ok)
        tl.store(ticket_ptr, 0)


# ----------------------------------------------------------------------------------------
_WORKSPACES: dict = {}


def workspace(device: torch.device, tokens: int, hidden: int) -> tuple:
    """(ws [>= tokens, hidden] fp32, ticket [1] int32), zero, kept per (device, hidden): every
    launch leaves them zero again. Grown (a new zero buffer) when ``tokens`` is larger. Launches
    that share them must not overlap: one stream (as the tensor-core decode's scratch)."""
    key = (device, hidden)
    cur = _WORKSPACES.get(key)
    if cur is None or cur[0].shape[0] < tokens:
        cur = _WORKSPACES[key] = (torch.zeros(max(tokens, 4), hidden, dtype=torch.float32, device=device),
                                  torch.zeros(1, dtype=torch.int32, device=device))
    return cur


def split_config(n_pairs: int, I: int, H: int, esize: int, num_sms: int) -> dict:
    """BLOCK_I / BLOCK_K / BLOCK_H / num_warps: BLOCK_I 16 bytes of each w2 row (16 at 8 bits,
    8 at 16), the GEMM1 step 16 KB (gate and up rows), w2 slices of 256 rows a step; 4 warps.
    FUSEDMOE_SPLIT_CONFIG overrides."""
    v = env.split_config()
    if v is not None:
        return v
    bi = min(16 // esize, next_power_of_2(I))
    rows = 2 * bi
    bk = max(16, min(next_power_of_2(H), 16384 // (esize * rows)))
    bh = max(16, min(next_power_of_2(H), 256))
    return dict(BLOCK_I=bi, BLOCK_K=bk, BLOCK_H=bh, num_warps=4, PREFETCH=True)


# positions of the per-call tensors in the launch arguments (launcher.Bound slots): x, out,
# topk_weights, ids, map (the ids again when there is no expert_map)
SPLIT_SLOTS = (0, 4, 10, 11, 12)


def split_launch(x, w13, w2, topk_weights, topk_ids, activation, out, *, expert_map=None, w13_bias=None,
                 w2_bias=None, swiglu_limit=None, alpha=1.702, limit=7.0, quant="none", w13_scale=None,
                 w2_scale=None, block_shape=None, mul_routed_weight=True, config=None) -> tuple:
    """(kernel, grid, args, constexprs, num_warps, num_stages, pdl) of the split-I launch."""
    T, k = topk_ids.shape
    N13, H = w13.shape[1:]
    act = ACTIVATIONS[activation]
    gated = act <= 3
    I = N13 // 2 if gated else N13
    assert w2.shape[1] == H and w2.shape[2] == I, f"w2 {tuple(w2.shape)} does not match w13 {tuple(w13.shape)}"
    if config is None:
        config = split_config(T * k, I, H, w13.element_size(), _num_sms(x.device))
    bi = config["BLOCK_I"]
    nw = config.get("num_warps", 4)
    # (H100, triton 3.6: BLOCK_H 1024 at 4 warps, 8 values a thread for the vector adds, gave
    # wrong sums; 4 a thread at most is what was measured right)
    assert config["BLOCK_H"] <= 4 * 32 * nw, f"BLOCK_H {config['BLOCK_H']} > 4 x 32 x num_warps {nw}"
    scales13, q13 = _quant_flags(quant, x, w13, None, w13_scale, block_shape, None, False)
    scales2, q2 = _quant_flags(quant, x, w2, None, w2_scale, block_shape, None, False)
    if q13["B_SCALE"] == 3:
        gk = q13["GROUP_K"]
        assert gk % bi == 0, f"BLOCK_I {bi} must divide the scale group {gk} (w2's K groups)"
        bk = config["BLOCK_K"]
        assert (gk % bk if bk <= gk else bk % gk) == 0, f"BLOCK_K {bk} must divide the group {gk} or be a multiple"
    ids, emap, num_global, has_map = _map_args(topk_ids, expert_map, w13.shape[0])
    ws, ticket = workspace(x.device, T, H)
    w4 = w4_mode(w13, q13, config["BLOCK_K"], config.get("W4"), 1, True)
    sb13 = w13_scale if w13_scale is not None else w13
    sb2 = w2_scale if w2_scale is not None else w2
    s13 = scales13[4:]
    s2 = scales2[4:]
    b13s = w13_bias.stride()[:2] if w13_bias is not None else (0, 0)
    b2s = w2_bias.stride()[:2] if w2_bias is not None else (0, 0)
    return (_split_i_kernel, (cdiv(I, bi), T * k), (
        x, w13, w2, ws, out, ticket, w13_bias if w13_bias is not None else w13,
        w2_bias if w2_bias is not None else w2, sb13, sb2, topk_weights, ids, emap,
        I, H, T, num_global, w13.shape[0],
        *x.stride()[:2], *w13.stride()[:3], *w2.stride()[:3], ws.stride(0), *out.stride()[:2], *b13s, *b2s,
        *s13, *s2,
        float(swiglu_limit if swiglu_limit is not None else limit), float(alpha),
    ), dict(TOP_K=k, GATED=gated, ACT=act, HAS_LIMIT=swiglu_limit is not None, HAS_BIAS13=w13_bias is not None,
            HAS_BIAS2=w2_bias is not None, HAS_MAP=has_map, MUL_W=mul_routed_weight, B_SCALE=q13["B_SCALE"],
            GROUP_N=q13["GROUP_N"], GROUP_K=q13["GROUP_K"], BLOCK_I=bi, BLOCK_K=config["BLOCK_K"],
            BLOCK_H=config["BLOCK_H"], PREFETCH=bool(config.get("PREFETCH", True)), W4=w4,
            STAGGER=bool(config.get("STAGGER", True)), ADD=bool(config.get("ADD", True)),
            BITWISE_FP8=q13["BITWISE_FP8"]), config.get("num_warps", 4), None, False)


def split_forward(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, activation: str = "silu", *, out: Optional[torch.Tensor] = None,
                  **kw) -> torch.Tensor:
    """out [T, H] in x's dtype: the MoE layer of the pairs in one launch (see the module docstring).
    Keywords as ``split_launch``."""
    T = topk_ids.shape[0]
    if out is None:
        out = torch.empty(T, w2.shape[1], dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    launch(*split_launch(x, w13, w2, topk_weights, topk_ids, activation, out, **kw))
    return out
