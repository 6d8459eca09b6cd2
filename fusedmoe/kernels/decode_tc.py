"""Tensor-core decode GEMMs for W8A8: 8-bit weights against 8-bit activations on the MMA units.

One module though long: the two kernels share the ticket / partials protocol (_publish,
_gather, the share table) with their launchers and scratch sizing, which change together.

Legend as in decode.py (n = T*k pairs, s = t*k + j, ROWS weight rows per program).

  tc_gemm1: h [n, I]   = act(xq[s // k] @ w13[e_s]^T * scales + b13[e_s])     grid (I / BN, SPLIT_K, n)
  tc_gemm2: out [T, H] = sum_j w[t, j] * (hq[t*k+j] @ w2[e]^T * scales + b2[e])  grid (H / BN, GROUPS, T)

Why: the CUDA-core decode kernels (decode.py) reach 78-90% of copy bandwidth on 16-bit
weights but only 54-71% on 8-bit ones (H100): per byte an 8-bit weight
costs the widening and the FMA a 16-bit one does, twice as many per byte read. Here the
weights never leave 8 bits: "swap AB", the weight tile [ROWS, BK] is the M x K operand of
tl.dot (ROWS >= 64 fills a Hopper wgmma) and the pair's activation row the K x 16 operand
(column 0; columns 1..15 are zero, so row sums of the product are the result). Weight
tiles stream through shared memory as any pipelined GEMM's do (num_stages); the MMA work
is 16x the useful work but the tensor cores have ~100x the needed rate at decode.

The activations are 8-bit already (the quantization kernels of kernels/quantize.py run
before each GEMM: per token or per 1 x bk group), so this is the W8A8 math of the grouped
path: ``reference_moe(..., quantize_activations=True)``.

Few rows (a pair's 2I or H weight rows in tiles of 64) give few programs; two splits keep
the SMs busy without atomics on the result:
  * GEMM1 SPLIT_K > 1: each program sums a slice of K and writes its [ROWS] partial (fp32)
    to ``part``; the last of the pair's SPLIT_K programs to finish (an int32 ticket per
    (pair, N tile) in ``sync``, acq_rel) sums the partials in split order, applies bias and
    activation and writes h, and puts the ticket back to 0;
  * GEMM2 GROUPS > 1: the token's k slots are split into GROUPS groups of programs; the
    last group to finish sums the groups' partials in group order and writes out.
Both orders are fixed, so results are bitwise reproducible (deterministic mode), and each
launch leaves ``sync`` zero (it must be zero before the first; launches that may run at
the same time, two streams, must not share it).

SHARE (expert-shared, ``tc_share``): with many pairs a pair's expert is often another pair's
too, and a program a pair reads it again (qwen3 T=8: 64 pairs on ~51 distinct experts). Then
``_share_table_kernel`` writes, per pair, the pairs it leads (up to 16 of its expert, in pair
order) or -1; a leading program puts those pairs' activation rows in the 16 columns (the
weight tile is read once) and the others exit. GEMM1 stores each column's h row; GEMM2
(``_tc_gemm2_share_kernel``, grid (N tiles, pairs)) stores each pair's weighted y and the
last program of each (token, N tile), by ticket, sums the token's y in slot order (fixed,
so bitwise reproducible as well).

Scales as the grouped kernels' (grouped_gemm._scale_args): A_SCALE 1 tensor / 2 per row /
3 block [M, K/gk]; B_SCALE 1 per expert / 2 per channel [E, N] / 3 block [E, N/gn, K/gk].
Block scales need BLOCK_K to divide the group gk (each K tile within one group): they are
applied per K tile; the others once at the end (int8 x int8 accumulates exactly in int32).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import ACTIVATIONS, _activation, _compute_dtype, _num_sms, _scale_args, gdc_launch_dependents, gdc_wait
from .decode import _local_experts
from .launcher import cdiv, launch, next_power_of_2

N_COLS = 16      # the activation operand's width: tl.dot's minimum


@triton.jit
def _local_expert(ids_ptr, map_ptr, s, ok, num_global, E, HAS_MAP: tl.constexpr):
    """Local expert of pair ``s`` (scalar), -1 when not ``ok``, dropped or out of range."""
    g = tl.load(ids_ptr + s, mask=ok, other=-1).to(tl.int32)
    if HAS_MAP:
        in_range = ok & (g >= 0) & (g < num_global)
        loc = tl.load(map_ptr + tl.where(in_range, g, 0), mask=in_range, other=-1).to(tl.int32)
    else:
        loc = g
    return tl.where(ok & (loc >= 0) & (loc < E), loc, -1)


# prefetch.global.L2: a hint that brings the 128-byte line at an address into L2; nothing is
# read back and no register is held (the result is a dummy 0). CUDA only (inline PTX).
_L2_HINT = tl.constexpr("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];")


@triton.jit
def _l2_hint_rows(w_rows, k_lo, k_hi, stride_wk, LINES: tl.constexpr, LINE: tl.constexpr):
    """L2_PRE: ask L2 for the first LINES lines (LINE elements each, 128 bytes) of each weight
    row from k_lo (w_rows [ROWS] pointers; columns clamped below k_hi, so every address lies
    in the row). Issued before a programmatic dependent launch's wait: the weights do not
    depend on the kernel waited for, and the loads after the wait then find their first K
    steps in L2 instead of starting from DRAM while the kernel before ends."""
    ks = tl.minimum(k_lo + tl.arange(0, LINES) * LINE, k_hi - 1)
    tl.inline_asm_elementwise(_L2_HINT, "=r,l", [w_rows[:, None] + ks[None, :] * stride_wk], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _tile_dot(w_ptrs, a_ptrs, k_ok, col_ok, INT8: tl.constexpr):
    """[ROWS, 16] = w [ROWS, BK] @ a [BK, 16]: a's columns are activation rows where col_ok
    [16] (column 0 alone, or the pairs of one expert: SHARE), masked to zero where k_ok [BK]
    is False (past K; everywhere for a dropped pair)."""
    w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
    a = tl.load(a_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
    if INT8:
        return tl.dot(w, a, out_dtype=tl.int32)
    return tl.dot(w, a)


@triton.jit
def _row_scale(as_ptr, bs_e, wrows, k0, stride_ask, stride_bsn, stride_bsk,
               A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
               TILE: tl.constexpr, WHOLE: tl.constexpr):
    """[ROWS] fp32 factor: TILE, the block scales of the K tile at k0; WHOLE, the others
    (tensor / row / expert / channel). ``as_ptr``: the activation row's scale pointer;
    ``bs_e``: the expert's weight scales."""
    f = tl.full(wrows.shape, 1.0, dtype=tl.float32)
    if TILE:
        if B_SCALE == 3:
            f = f * tl.load(bs_e + (wrows // GROUP_N) * stride_bsn + (k0 // GROUP_K) * stride_bsk)
        if A_SCALE == 3:
            f = f * tl.load(as_ptr + (k0 // GROUP_K) * stride_ask)
    if WHOLE:
        if A_SCALE == 1 or A_SCALE == 2:
            f = f * tl.load(as_ptr)
        if B_SCALE == 1:
            f = f * tl.load(bs_e)
        elif B_SCALE == 2:
            f = f * tl.load(bs_e + wrows * stride_bsn)
    return f


@triton.jit
def _publish(v, slot, part, stride, ticket):
    """Store this program's fp32 partial ``v`` at ``slot + part * stride`` and take the tile's
    ticket (acq_rel, after a CTA barrier): the count of partials published before it."""
    tl.store(slot + part * stride, v)
    tl.debug_barrier()                                 # every thread's partial before the release
    return tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _gather(slot, stride, ticket, PARTS: tl.constexpr, N: tl.constexpr):
    """The last program of a tile: the sum of its PARTS partials in part order (a fixed
    order: bitwise reproducible), and the ticket back to 0 for the next launch."""
    v = tl.zeros((N,), dtype=tl.float32)
    for p in tl.static_range(PARTS):
        v += tl.load(slot + p * stride, cache_modifier=".cg")
    tl.store(ticket, 0)
    return v


@triton.jit
def _share(ids_ptr, map_ptr, s, n, num_global, E, HAS_MAP: tl.constexpr, NP: tl.constexpr,
           COLS: tl.constexpr):
    """SHARE: the pairs of pair ``s``'s expert, COLS at a time, so that one program reads the
    expert's weight tile once for all of them (its activation rows in the MMA's columns).
    Returns (e, lead, pairs [COLS], ok [COLS]): e pair s's local expert (-1: dropped); lead:
    e >= 0 and s is the first of its group of COLS among the pairs of e in pair order (the
    other programs of the group do nothing); pairs[c] the group's c-th pair, where ok[c].
    ``n`` pairs, NP >= n a power of two."""
    i = tl.arange(0, NP)
    es = _local_experts(ids_ptr, map_ptr, i, i < n, num_global, E, HAS_MAP)
    e = tl.sum(tl.where(i == s, es, 0), axis=0)
    match = (es == e) & (e >= 0)
    rank = tl.cumsum(match.to(tl.int32), axis=0) - 1                  # a matching pair's rank
    mine = tl.sum((match & (i < s)).to(tl.int32), axis=0)              # pair s's rank
    lead = (e >= 0) & (mine % COLS == 0)
    c = tl.arange(0, COLS)
    sel = match[None, :] & (rank[None, :] == (mine + c)[:, None])      # [COLS, NP]
    pairs = tl.sum(tl.where(sel, i[None, :], 0), axis=1)
    ok = tl.sum(sel.to(tl.int32), axis=1) > 0
    return e, lead, pairs, ok


@triton.jit
def _share_row(table_ptr, ids_ptr, map_ptr, s, num_global, E, HAS_MAP: tl.constexpr):
    """SHARE: _share's (e, lead, pairs, ok) for pair ``s``, from the table row
    _share_table_kernel wrote (one load: the scan runs once, not in every GEMM program)."""
    c = tl.arange(0, 16)
    prs = tl.load(table_ptr + s * 16 + c)
    ok = prs >= 0
    lead = tl.load(table_ptr + s * 16) >= 0
    e = _local_expert(ids_ptr, map_ptr, s, s >= 0, num_global, E, HAS_MAP)
    return e, lead, tl.where(ok, prs, 0), ok


@triton.jit(do_not_specialize=["num_global"])
def _share_table_kernel(ids_ptr, map_ptr, table_ptr, num_global, E, HAS_MAP: tl.constexpr, NP: tl.constexpr,
                        PDL: tl.constexpr = False):
    """Grid (pairs,): row s of the share table, _share's pairs where s leads, else -1. PDL: a
    link of the decode chain (after x's quantization, before GEMM1): lets GEMM1 launch, computes
    its row, then waits for the kernel before it (so that GEMM1's wait covers both) to store."""
    if PDL:
        gdc_launch_dependents()
    s = tl.program_id(0).to(tl.int64)
    e, lead, prs, ok = _share(ids_ptr, map_ptr, s, tl.num_programs(0), num_global, E, HAS_MAP, NP, 16)
    if PDL:
        gdc_wait()
    tl.store(table_ptr + s * 16 + tl.arange(0, 16), tl.where(lead & ok, prs, -1))


@triton.jit
def _col_scale(as_cols, ok, k0, stride_ask, A_SCALE: tl.constexpr, GROUP_K: tl.constexpr,
               TILE: tl.constexpr, WHOLE: tl.constexpr):
    """SHARE: [COLS] fp32 activation factor of each column's row (``as_cols``: the rows'
    scale pointers): TILE the block scale of the K tile at k0, WHOLE the tensor / row one."""
    f = tl.full(ok.shape, 1.0, dtype=tl.float32)
    if TILE and A_SCALE == 3:
        f = tl.load(as_cols + (k0 // GROUP_K) * stride_ask, mask=ok, other=1.0)
    if WHOLE and (A_SCALE == 1 or A_SCALE == 2):
        f = f * tl.load(as_cols, mask=ok, other=1.0)
    return f


@triton.jit(do_not_specialize=["num_global"])
def _tc_gemm1_kernel(
    x_ptr, w_ptr, h_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, ids_ptr, map_ptr, part_ptr, sync_ptr,
    N_OUT, K, num_global, E,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_hm, stride_hn,
    stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    limit, alpha, table_ptr,
    TOP_K: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, INT8: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PDL: tl.constexpr = False, PDL_WAIT: tl.constexpr = False, SHARE: tl.constexpr = False,
    L2_PRE: tl.constexpr = 0, SUB_K: tl.constexpr = 0,
):
    """Grid (N tiles, SPLIT_K, pairs). A program: BN gate rows and BN up rows of its pair's
    expert (ROWS = 2 BN; BN rows when not gated) over its K slice. SHARE (SPLIT_K 1): the
    pair's program leads the pairs of its table row or does nothing.

    SUB_K > 0 (``_sub_k``): the width of one dot, BLOCK_K // SUB_K dots a K step: block scales
    with BLOCK_K a multiple of their group take one dot a group, each scaled by its own
    factors, so that a step (a pipeline stage) may read several groups. 0: BLOCK_K.

    L2_PRE > 0 (``tc_l2_pre``; PDL_WAIT, CUDA): before the wait for x, the program asks L2 for
    the first L2_PRE lines of each of its weight rows (``_l2_hint_rows``), from the expert the
    ids give then (SHARE: its pair's, before the table says whether it leads; an expert's other
    programs ask for lines already asked for). A hint only: the loads after the wait read the
    same addresses, and a stale expert only costs the lines it fetched."""
    if PDL:
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    s = tl.program_id(2).to(tl.int64)
    ROWS: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    r = tl.arange(0, ROWS)
    offs_n = pid_n * BLOCK_N + r % BLOCK_N
    wrows = tl.where(offs_n < N_OUT, offs_n, 0) + (r // BLOCK_N) * N_OUT           # gate rows, then up rows
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_k * per
    if L2_PRE > 0:                  # (SHARE: the pair's expert, whether or not this program leads)
        ep = _local_expert(ids_ptr, map_ptr, s, s >= 0, num_global, E, HAS_MAP)
        if ep >= 0:
            _l2_hint_rows(w_ptr + ep.to(tl.int64) * stride_we + wrows.to(tl.int64) * stride_wn, k_lo, K, stride_wk,
                          L2_PRE, 128)
    if PDL_WAIT:
        gdc_wait()
    cols = tl.arange(0, 16)
    if SHARE:
        tl.static_assert(SPLIT_K == 1, "SHARE: one K slice")
        e, go, prs, col_ok = _share_row(table_ptr, ids_ptr, map_ptr, s, num_global, E, HAS_MAP)
    else:
        e = _local_expert(ids_ptr, map_ptr, s, s >= 0, num_global, E, HAS_MAP)
        go = e >= 0
        prs = s + cols * 0
        col_ok = cols == 0
    if go:
        e64 = e.to(tl.int64)
        t = s // TOP_K
        toks = prs.to(tl.int64) // TOP_K                                         # [16]: each column's token
        DK: tl.constexpr = SUB_K if SUB_K > 0 else BLOCK_K
        kk = tl.arange(0, DK)
        w_rows = w_ptr + e64 * stride_we + wrows.to(tl.int64)[:, None] * stride_wn
        x_row = x_ptr + toks[None, :] * stride_xm
        as_ptr = a_scale_ptr + t * stride_asm
        as_cols = a_scale_ptr + toks * stride_asm
        bs_e = b_scale_ptr + e64 * stride_bse
        k_hi = tl.minimum(K, k_lo + per)
        if INT8 and A_SCALE != 3 and B_SCALE != 3:
            acc = tl.zeros((ROWS, 16), dtype=tl.int32)
        else:
            acc = tl.zeros((ROWS, 16), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            for j in tl.static_range(BLOCK_K // DK):                                  # scale groups a step
                kj = k0 + j * DK
                ks = kj + kk
                part = _tile_dot(w_rows + ks[None, :] * stride_wk, x_row + ks[:, None] * stride_xk, ks < K, col_ok,
                                 INT8)
                if DK < BLOCK_K:
                    kj = tl.minimum(kj, K - 1)        # a group past K (its dot is zero): an existing scale
                if SHARE and (A_SCALE == 3 or B_SCALE == 3):
                    f = _row_scale(as_ptr, bs_e, wrows, kj, stride_ask, stride_bsn, stride_bsk,
                                   0, B_SCALE, GROUP_N, GROUP_K, True, False)
                    acc += part.to(tl.float32) * (f[:, None] * _col_scale(as_cols, col_ok, kj, stride_ask, A_SCALE,
                                                                           GROUP_K, True, False)[None, :])
                elif A_SCALE == 3 or B_SCALE == 3:
                    acc += part.to(tl.float32) * _row_scale(as_ptr, bs_e, wrows, kj, stride_ask, stride_bsn,
                                                            stride_bsk, A_SCALE, B_SCALE, GROUP_N, GROUP_K, True,
                                                            False)[:, None]
                else:
                    acc += part
        if SHARE:
            f = _row_scale(as_ptr, bs_e, wrows, 0, stride_ask, stride_bsn, stride_bsk,
                           0, B_SCALE, GROUP_N, GROUP_K, False, True)
            v2 = acc.to(tl.float32) * (f[:, None] * _col_scale(as_cols, col_ok, 0, stride_ask, A_SCALE, GROUP_K,
                                                               False, True)[None, :])
            _gemm1_finish_cols(v2, e64, prs, col_ok, pid_n, wrows, h_ptr, bias_ptr, N_OUT, stride_hm, stride_hn,
                               stride_bias_e, stride_bias_n, limit, alpha, GATED, ACT, HAS_LIMIT, HAS_BIAS, BLOCK_N)
        else:
            v = tl.sum(acc.to(tl.float32), axis=1)                                # [ROWS]: column 0
            v = v * _row_scale(as_ptr, bs_e, wrows, 0, stride_ask, stride_bsn, stride_bsk,
                               A_SCALE, B_SCALE, GROUP_N, GROUP_K, False, True)
            if SPLIT_K > 1:
                tiles = tl.num_programs(0)
                slot = part_ptr + (s * SPLIT_K) * (tiles * ROWS) + pid_n * ROWS + r
                ticket = sync_ptr + s * tiles + pid_n
                if _publish(v, slot, pid_k, tiles * ROWS, ticket) == SPLIT_K - 1:     # the last split
                    v = _gather(slot, tiles * ROWS, ticket, SPLIT_K, ROWS)
                    _gemm1_finish(v, e64, s, pid_n, wrows, h_ptr, bias_ptr, N_OUT, stride_hm, stride_hn,
                                  stride_bias_e, stride_bias_n, limit, alpha, GATED, ACT, HAS_LIMIT, HAS_BIAS,
                                  BLOCK_N)
            else:
                _gemm1_finish(v, e64, s, pid_n, wrows, h_ptr, bias_ptr, N_OUT, stride_hm, stride_hn,
                              stride_bias_e, stride_bias_n, limit, alpha, GATED, ACT, HAS_LIMIT, HAS_BIAS, BLOCK_N)


@triton.jit
def _gemm1_finish(v, e64, s, pid_n, wrows, h_ptr, bias_ptr, N_OUT, stride_hm, stride_hn,
                  stride_bias_e, stride_bias_n, limit, alpha, GATED: tl.constexpr, ACT: tl.constexpr,
                  HAS_LIMIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """v [ROWS] (gate rows then up rows, fp32, scaled) -> bias, activation, h[s, tile]."""
    if HAS_BIAS:
        v += tl.load(bias_ptr + e64 * stride_bias_e + wrows * stride_bias_n).to(tl.float32)
    if GATED:
        v2 = tl.reshape(v, (2, BLOCK_N))
        first = tl.arange(0, 2)[:, None] == 0
        g = tl.sum(tl.where(first, v2, 0.0), axis=0)
        u = tl.sum(tl.where(first, 0.0, v2), axis=0)
    else:
        g = v
        u = v
    out = _activation(g, u, ACT, HAS_LIMIT, limit, alpha)
    offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(h_ptr + s * stride_hm + offs * stride_hn, out.to(h_ptr.dtype.element_ty), mask=offs < N_OUT)


@triton.jit
def _gemm1_finish_cols(v, e64, prs, col_ok, pid_n, wrows, h_ptr, bias_ptr, N_OUT, stride_hm, stride_hn,
                       stride_bias_e, stride_bias_n, limit, alpha, GATED: tl.constexpr, ACT: tl.constexpr,
                       HAS_LIMIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """SHARE: v [ROWS, 16] (column c: pair prs[c], where col_ok) -> bias, activation, h rows."""
    if HAS_BIAS:
        v += tl.load(bias_ptr + e64 * stride_bias_e + wrows * stride_bias_n).to(tl.float32)[:, None]
    if GATED:
        v3 = tl.reshape(v, (2, BLOCK_N, 16))
        first = tl.arange(0, 2)[:, None, None] == 0
        g = tl.sum(tl.where(first, v3, 0.0), axis=0)
        u = tl.sum(tl.where(first, 0.0, v3), axis=0)
    else:
        g = v
        u = v
    out = _activation(g, u, ACT, HAS_LIMIT, limit, alpha)                     # [BN, 16]
    offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(h_ptr + prs.to(tl.int64)[None, :] * stride_hm + offs[:, None] * stride_hn,
             out.to(h_ptr.dtype.element_ty), mask=(offs < N_OUT)[:, None] & col_ok[None, :])


@triton.jit
def _g2_slot(ids_ptr, map_ptr, t, grp, i, nk, num_global, E, SLOTS: tl.constexpr, TOP_K: tl.constexpr,
             HAS_MAP: tl.constexpr, BLOCK_K: tl.constexpr):
    """GEMM2's step i of a program's (slot, K tile) loop: (k0, pair s, local expert e or -1)."""
    jj = i // nk
    k0 = (i - jj * nk) * BLOCK_K
    j = grp * SLOTS + jj
    s = t * TOP_K + tl.minimum(j, TOP_K - 1)
    e = _local_expert(ids_ptr, map_ptr, s, j < TOP_K, num_global, E, HAS_MAP)
    return k0, s, e


@triton.jit
def _g2_w(w_rows, e, k0, K, stride_we, stride_wk, BLOCK_K: tl.constexpr):
    """The [BN, BK] weight tile of expert e (-1: zeros) at k0."""
    ks = k0 + tl.arange(0, BLOCK_K)
    keep = e >= 0
    return tl.load(w_rows + tl.where(keep, e, 0).to(tl.int64) * stride_we + ks[None, :] * stride_wk,
                   mask=(ks < tl.where(keep, K, 0))[None, :], other=0.0)


@triton.jit
def _g2_accumulate(acc, w, k0, s, e, h_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, wrows, K,
                   stride_hm, stride_hk, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                   MUL_W: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr,
                   GROUP_K: tl.constexpr, INT8: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc [BN, 16] += (w [BN, BK] @ h[s, k0:k0+BK] in column 0) x the step's scales and routing
    weight; nothing from a dropped slot (e = -1)."""
    keep = e >= 0
    e64 = tl.where(keep, e, 0).to(tl.int64)
    ks = k0 + tl.arange(0, BLOCK_K)
    cols = tl.arange(0, 16)
    a = tl.load(h_ptr + s * stride_hm + ks[:, None] * stride_hk + cols[None, :] * 0,
                mask=(ks < tl.where(keep, K, 0))[:, None] & (cols == 0)[None, :], other=0.0)
    if INT8:
        part = tl.dot(w, a, out_dtype=tl.int32).to(tl.float32)
    else:
        part = tl.dot(w, a).to(tl.float32)
    f = _row_scale(a_scale_ptr + s * stride_asm, b_scale_ptr + e64 * stride_bse, wrows, k0, stride_ask,
                   stride_bsn, stride_bsk, A_SCALE, B_SCALE, GROUP_N, GROUP_K, True, True)
    if MUL_W:
        f = f * tl.load(topk_w_ptr + s).to(tl.float32)
    return acc + part * tl.where(keep, f, 0.0)[:, None]


@triton.jit(do_not_specialize=["num_global"])
def _tc_gemm2_kernel(
    h_ptr, w_ptr, out_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr, part_ptr, sync_ptr,
    N_OUT, K, num_global, E,
    stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    TOP_K: tl.constexpr, SLOTS: tl.constexpr, GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_MAP: tl.constexpr, MUL_W: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, INT8: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
    L2_PRE: tl.constexpr = 0, L2_LINES: tl.constexpr = 1,
):
    """Grid (N tiles, GROUPS, tokens). A program: BN rows of H for SLOTS of its token's k
    slots (group g: slots g*SLOTS ..), one loop over (slot, K tile) so that the next slot's
    weights stream while this one's finish; per slot the scales and the routing weight.

    L2_PRE > 0 (``tc_l2_pre``, PDL, CUDA): before the wait, the program asks L2 for the whole
    rows (L2_LINES lines of 128 bytes) of its first L2_PRE slots' experts (``_l2_hint_rows``),
    a hint that never changes the result."""
    pid_n = tl.program_id(0)
    grp = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)
    r = tl.arange(0, BLOCK_N)
    offs_n = pid_n * BLOCK_N + r
    n_ok = offs_n < N_OUT
    wrows = tl.where(n_ok, offs_n, 0)
    w_rows = w_ptr + wrows.to(tl.int64)[:, None] * stride_wn
    nk = tl.cdiv(K, BLOCK_K)
    for jp in tl.static_range(L2_PRE):
        _k, _s, e_l2 = _g2_slot(ids_ptr, map_ptr, t, grp, jp * nk, nk, num_global, E, SLOTS, TOP_K, HAS_MAP, BLOCK_K)
        if e_l2 >= 0:
            _l2_hint_rows(w_rows + e_l2.to(tl.int64) * stride_we, 0, K, stride_wk, L2_LINES, 128)
    if PDL:
        gdc_wait()
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for i in range(0, SLOTS * nk):
        k0, s, e = _g2_slot(ids_ptr, map_ptr, t, grp, i, nk, num_global, E, SLOTS, TOP_K, HAS_MAP, BLOCK_K)
        w = _g2_w(w_rows, e, k0, K, stride_we, stride_wk, BLOCK_K)
        acc = _g2_accumulate(acc, w, k0, s, e, h_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, wrows, K,
                             stride_hm, stride_hk, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                             MUL_W, A_SCALE, B_SCALE, GROUP_N, GROUP_K, INT8, BLOCK_K)
    v = tl.sum(acc, axis=1)                                                      # [BN]
    if HAS_BIAS:
        for jj in tl.static_range(SLOTS):
            j = grp * SLOTS + jj
            s = t * TOP_K + tl.minimum(j, TOP_K - 1)
            e = _local_expert(ids_ptr, map_ptr, s, j < TOP_K, num_global, E, HAS_MAP)
            keep = e >= 0
            b = tl.load(bias_ptr + tl.where(keep, e, 0).to(tl.int64) * stride_bias_e + wrows * stride_bias_n)
            b = b.to(tl.float32)
            if MUL_W:
                b = b * tl.load(topk_w_ptr + s).to(tl.float32)
            v += tl.where(keep, b, 0.0)
    if GROUPS > 1:
        tiles = tl.num_programs(0)
        n_pad = tiles * BLOCK_N
        slot = part_ptr + t * (GROUPS * n_pad) + offs_n
        ticket = sync_ptr + t * tiles + pid_n
        if _publish(v, slot, grp, n_pad, ticket) == GROUPS - 1:                   # the last group
            v = _gather(slot, n_pad, ticket, GROUPS, BLOCK_N)
            tl.store(out_ptr + t * stride_om + offs_n * stride_on, v.to(out_ptr.dtype.element_ty), mask=n_ok)
    else:
        tl.store(out_ptr + t * stride_om + offs_n * stride_on, v.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit(do_not_specialize=["num_global"])
def _tc_gemm2_share_kernel(
    h_ptr, w_ptr, out_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr, part_ptr, sync_ptr,
    N_OUT, K, num_global, E,
    stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, table_ptr,
    TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr, MUL_W: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    INT8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, KP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """SHARE. Grid (N tiles, pairs). A leading program (its table row) reads BN rows of its expert's
    w2 once for all the expert's pairs (up to 16, one a column) and stores each pair's
    weighted contribution y[pair] (fp32, ``part`` [pairs, tiles * BN]); then it takes a ticket
    of each column's (token, N tile). The program bringing a token's count to its number of
    kept slots sums the token's y rows in slot order (fixed: bitwise reproducible, whichever
    program it is), writes out and puts the ticket back to 0. A token with no kept slot gets
    zeros from its first slot's program."""
    if PDL:
        gdc_wait()
    pid_n = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    tiles = tl.num_programs(0)
    n_pad = tiles * BLOCK_N
    r = tl.arange(0, BLOCK_N)
    offs_n = pid_n * BLOCK_N + r
    n_ok = offs_n < N_OUT
    wrows = tl.where(n_ok, offs_n, 0)
    j = tl.arange(0, KP)
    if s % TOP_K == 0:                                 # a token whose slots are all dropped: zeros
        e_t = _local_experts(ids_ptr, map_ptr, s + j, j < TOP_K, num_global, E, HAS_MAP)
        if tl.sum((e_t >= 0).to(tl.int32), axis=0) == 0:
            tl.store(out_ptr + (s // TOP_K) * stride_om + offs_n * stride_on,
                     tl.zeros((BLOCK_N,), dtype=out_ptr.dtype.element_ty), mask=n_ok)
    e, lead, prs, ok = _share_row(table_ptr, ids_ptr, map_ptr, s, num_global, E, HAS_MAP)
    if lead:
        e64 = e.to(tl.int64)
        prs64 = prs.to(tl.int64)
        kk = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + e64 * stride_we + wrows.to(tl.int64)[:, None] * stride_wn
        h_cols = h_ptr + prs64[None, :] * stride_hm
        as_ptr = a_scale_ptr
        as_cols = a_scale_ptr + prs64 * stride_asm
        bs_e = b_scale_ptr + e64 * stride_bse
        if INT8 and A_SCALE != 3 and B_SCALE != 3:
            acc = tl.zeros((BLOCK_N, 16), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + kk
            part = _tile_dot(w_rows + ks[None, :] * stride_wk, h_cols + ks[:, None] * stride_hk, ks < K, ok, INT8)
            if A_SCALE == 3 or B_SCALE == 3:
                f = _row_scale(as_ptr, bs_e, wrows, k0, stride_ask, stride_bsn, stride_bsk,
                               0, B_SCALE, GROUP_N, GROUP_K, True, False)
                acc += part.to(tl.float32) * (f[:, None] * _col_scale(as_cols, ok, k0, stride_ask, A_SCALE,
                                                                       GROUP_K, True, False)[None, :])
            else:
                acc += part
        f = _row_scale(as_ptr, bs_e, wrows, 0, stride_ask, stride_bsn, stride_bsk,
                       0, B_SCALE, GROUP_N, GROUP_K, False, True)
        y = acc.to(tl.float32) * (f[:, None] * _col_scale(as_cols, ok, 0, stride_ask, A_SCALE, GROUP_K,
                                                          False, True)[None, :])
        if HAS_BIAS:
            y += tl.load(bias_ptr + e64 * stride_bias_e + wrows * stride_bias_n).to(tl.float32)[:, None]
        if MUL_W:
            y = y * tl.load(topk_w_ptr + prs64, mask=ok, other=0.0).to(tl.float32)[None, :]
        tl.store(part_ptr + prs64[None, :] * n_pad + offs_n[:, None], y, mask=ok[None, :])
        tl.debug_barrier()                             # every thread's y before the release
        toks = prs64 // TOP_K
        tickets = sync_ptr + toks * tiles + pid_n
        old = tl.atomic_add(tickets, 1, mask=ok, sem="acq_rel", scope="gpu")
        e_t = _local_experts(ids_ptr, map_ptr, toks[:, None] * TOP_K + j[None, :], ok[:, None] & (j < TOP_K)[None, :],
                             num_global, E, HAS_MAP)                                   # [16, KP]
        last = ok & (old == tl.sum((e_t >= 0).to(tl.int32), axis=1) - 1)
        if tl.sum(last.to(tl.int32), axis=0) > 0:
            v = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            for jj in tl.static_range(TOP_K):
                sj = toks * TOP_K + jj
                kept = last & (_local_experts(ids_ptr, map_ptr, sj, last, num_global, E, HAS_MAP) >= 0)
                v += tl.load(part_ptr + sj[None, :] * n_pad + offs_n[:, None], mask=kept[None, :], other=0.0,
                             cache_modifier=".cg")
            tl.store(out_ptr + toks[None, :] * stride_om + offs_n[:, None] * stride_on,
                     v.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & last[None, :])
            tl.store(tickets, tl.zeros_like(old), mask=last)


# ----------------------------------------------------------------------------------------
SHARE_MIN_PAIRS_PER_EXPERT = 0.5   # tc_share: pairs / local experts from which SHARE is on
SHARE_MIN_I = 512                  # tc_share: the least intermediate size (GEMM2's K)


def tc_share(pairs: int, top_k: int, num_experts: Optional[int], intermediate: Optional[int] = None) -> bool:
    """Whether the tensor-core decode GEMMs run expert-shared (``SHARE``): one program reads an
    expert's weight tile once for all the pairs routed to it (up to 16, one an MMA column)
    instead of once a pair: from E / 2 pairs on (and two tokens: one token's k slots are k
    distinct experts). Why (H100): the pair-per-program GEMMs run at the speed of a pure
    read of what they read, and with uniform routing a pair's expert is another pair's too in
    ~8% of pairs at E / 4 pairs, ~20% at E / 2, ~35% at E. SHARE's programs are fewer and each
    reads its table row first: qwen3 fp8 GEMM1 T=4 (E / 4) 35.5 -> 36.7 us, T=8 (E / 2) 65.3 ->
    59.0, T=16 125.5 -> 90.7; deepseek-v3 tp8 fp8_block (458 KB programs, ~1.2 waves) T=8 (E / 4)
    75.4 -> 78.5, T=16 (E / 2) 148.0 -> 140.0. In the layer (H100): qwen3 fp8 T=8 103.3 -> 97.2,
    int8 103.2 -> 97.1; deepseek T=16 229.2 -> 226.6. On the H200 qwen3 T=8 79.8 -> 78.8 but
    deepseek T=16 165.8 -> 183.1: its GEMM2 (I = 256: a SHARE program is one 16 KB tile, then
    the ticket round trip) 58.5 -> 71.8, its GEMM1 103.1 -> 106.9. Hence also ``intermediate``
    (GEMM2's K) >= SHARE_MIN_I. ``num_experts`` None: off."""
    return (num_experts is not None and pairs > top_k and pairs >= SHARE_MIN_PAIRS_PER_EXPERT * num_experts
            and (intermediate is None or intermediate >= SHARE_MIN_I))


# H100, each GEMM alone at T = 2, 3, 4 (qwen3 fp8_channel and int8_channel agree to 0.1 us):
# GEMM1 (K = 2048, one K slice, a program a pair) with 3 stages instead of 4: T=2 20.1 -> 19.3 us,
# T=3 28.2 -> 27.0, T=4 35.5 -> 35.3; GEMM2 (K = 768) with half the slot groups at T = 3, 4
# (4 instead of 8): 16.9 -> 15.8, 20.1 -> 19.4. deepseek-v3 tp8 (GEMM1 K = 7168, GEMM2 K = 256)
# had no single better rule in that sweep (its own rules below).
TC_GEMM1_STAGES_SHORT_K = 3        # GEMM1 stages where K <= 2048, unsplit, not SHARE (old: 4)
TC_GEMM2_PROGRAMS_LONG_K = 2.5     # GEMM2 slot groups double while programs < this x SMs, K >= 512 (old: 4)
# Layer A/B (best of 3 alternating rounds, tc forced): deepseek-v3 tp8 fp8_block with GEMM1 6 stages
# (K = 7168) and GEMM2 2 stages (K = 256), graph us: H100 T=2 41.20 -> 40.58, T=3 56.30 -> 54.78,
# T=4 69.31 -> 68.32; H200 33.09 -> 32.00, 45.66 -> 43.12, 53.92 -> 51.19. GEMM1 2 splits at T=3
# (TC_GEMM1_SPLIT_WAVES_LONG_K 1.5): H100 56.30 -> 55.87, H200 45.66 -> 45.79: not taken.
# GEMM1's 6 stages lose where many programs share an SM (H100, T = 2, 3, 4): qwen3-235b fp8
# (K = 4096, 48 tiles a pair) 109.41 -> 110.88, 160.01 -> 160.36, 204.92 -> 205.74 us; gpt-oss-120b
# int8 (K = 2880, 90 tiles a pair) 82.83 -> 84.71, 115.37 -> 117.24, 151.21 -> 152.04; Mixtral
# fp8 even. Hence the bound: deepseek tp8 runs 128-256 GEMM1 programs, the losers 768 and more.
TC_GEMM1_STAGES_LONG_K = 6         # GEMM1 stages where K > 2048, not SHARE, programs <= the bound (old: 4)
TC_GEMM1_LONG_K_PROGRAMS = 2       # ... the bound: this x SMs programs (tiles x splits)
TC_GEMM2_STAGES_SHORT_K = 2        # GEMM2 stages where K < 512, not SHARE (old: 4)
TC_GEMM1_SPLIT_WAVES_LONG_K = 1.0  # GEMM1 splits K while tiles x splits < this x SMs, K > 2048
# H100: where the rule above gives GEMM1 its 6 stages and the weights carry 128-wide block scales (deepseek-v3 tp8
# fp8_block, K = 7168), a K step of two scale groups (BK 256: two dots, each scaled by its group,
# SUB_K) with 3 stages buffers the same 60 KB a program in half the steps. GEMM1 alone: T=2 24.07
# -> 23.95 us, T=3 34.19 -> 33.48, T=4 42.36 -> 41.46; the layer, best of 3 alternating rounds:
# 39.85 -> 39.42, 54.47 -> 53.78, 67.32 -> 66.42 (4 stages: 39.16, 54.44, 66.15; 5: 39.33, 53.97,
# 67.09). The output is bitwise the same (the same products added in the same order).
TC_GEMM1_BLOCK_GROUPS = 2          # block-scale groups a GEMM1 K step there (1: one, as before)
TC_GEMM1_STAGES_BLOCK_GROUPS = 3   # ... and its stages
# H200 (the layer, three processes): 32.42-32.48
# -> 31.86-31.88 us (T=2), 43.99-44.03 -> 43.04-43.09 (T=3), 52.42-52.73 -> 51.62-52.04 (T=4); 4 and 5
# stages lost at T = 3, 4, and GEMM1 split in two (tcds3) lost 2-4%.
# The same for GEMM2 (deepseek-v3 tp8: K = 256, one step a slot): GEMM2 alone 12-14% slower at
# T = 2..4 on the H100 (T=3 18.54 -> 21.03 us at its best stages): one group a step.
# H100 (`fusedmoe bench --tokens 2,3,4`, tc forced, two alternating rounds): GEMM1 hinting L2 with the
# first 4 lines of each weight row before its wait for x (L2_PRE) gains in every case and round,
# graph us: qwen3 fp8_channel T=2 34.7-34.9 -> 34.2-34.3, T=3 46.9-47.0 -> 46.4, T=4 58.5 -> 57.9-58.1;
# int8_channel 34.7 -> 34.1, 47.1 -> 46.7, 58.3 -> 58.0; deepseek-v3 tp8 fp8_block 41.9-42.1 -> 41.5,
# 53.3-53.4 -> 52.7-52.8, 69.3-69.4 -> 68.7. 8 lines: qwen3 slower than none. GEMM2 hinting its
# slots' rows while it waits for h: 6-11% SLOWER everywhere (the hints compete with GEMM1's reads).


def tc_config(gemm: str, pairs_or_tokens: int, n_out: int, K: int, top_k: int, gated: bool = True,
              group_k: Optional[int] = None, num_sms: int = 132, share: Optional[bool] = None,
              num_experts: Optional[int] = None, block_groups: bool = False) -> dict:
    """Launch config of one tensor-core decode GEMM: BLOCK_N, BLOCK_K, SPLIT_K (gemm1) or
    GROUPS (gemm2), SHARE, num_warps, num_stages.

    ROWS = 64 weight rows a program (one wgmma M; GEMM1 gated: 32 gate + 32 up rows), BK
    256 bytes of each row a K step (16 KB a stage), or the block scales' group. GEMM1 splits
    K (powers of two) only while its tiles fill less than one wave of programs (the ticket
    and the partials' round trip cost: qwen3 fp8 T=1 11.2 us unsplit vs 13.8 with 2 splits),
    and takes TC_GEMM1_STAGES_SHORT_K stages where K <= 2048 and it does not split,
    TC_GEMM1_STAGES_LONG_K where K > 2048 and its programs number at most
    TC_GEMM1_LONG_K_PROGRAMS an SM (else 4). GEMM2 splits the slots while there are fewer
    than 4 programs per SM (qwen3 and deepseek tp8 at T=1: one slot a program measured best),
    TC_GEMM2_PROGRAMS_LONG_K for K >= 512 (qwen3 T = 3, 4: two slots a program), and takes
    TC_GEMM2_STAGES_SHORT_K stages where K < 512; GEMM1 with block scales, where it takes those
    long-K stages, steps TC_GEMM1_BLOCK_GROUPS scale groups at a time with
    TC_GEMM1_STAGES_BLOCK_GROUPS stages where ``block_groups`` (the plan's per-GPU fact); all these at T =
    2..4 only (measured on the H100 and the H200).
    ``share`` (None: ``tc_share`` with ``num_experts`` local experts, I = GEMM1's n_out or
    GEMM2's K): expert-shared programs;
    GEMM1 then takes one K slice, and GEMM2 a program a (pair, N tile) with its own k-sum
    (GROUPS 1) and two stages (its K is short: qwen3 T=8 38.4 -> 33.1 us, T=16 60.9 -> 50.3
    against four; three were between the two in the first form). The T = 2..4 rules apply
    where they were measured (T=1 has its own sweep's)."""
    pairs = pairs_or_tokens if gemm == "gemm1" else pairs_or_tokens * top_k
    s31 = top_k < pairs <= 4 * top_k
    if share is None:
        share = tc_share(pairs, top_k, num_experts, n_out if gemm == "gemm1" else K)
    bk = 256
    if group_k is not None:
        while bk > 16 and group_k % bk:
            bk //= 2
    if K <= 64:
        bk = max(16, next_power_of_2(K))
    if gemm == "gemm1":
        bn = 32 if gated else 64
        tiles = cdiv(n_out, bn) * pairs_or_tokens
        nk = cdiv(K, bk)
        split = 1
        waves = TC_GEMM1_SPLIT_WAVES_LONG_K if (s31 and K > 2048) else 1.0
        while not share and split < 8 and tiles * split < waves * num_sms and cdiv(nk, 2 * split) >= 2:
            split *= 2
        stages = 4
        if s31 and not share:
            if K > 2048:
                stages = TC_GEMM1_STAGES_LONG_K if tiles * split <= TC_GEMM1_LONG_K_PROGRAMS * num_sms else 4
                wide = _groups_bk(bk, group_k, TC_GEMM1_BLOCK_GROUPS) if block_groups else bk
                if stages == TC_GEMM1_STAGES_LONG_K and wide != bk:
                    bk, stages = wide, TC_GEMM1_STAGES_BLOCK_GROUPS
            elif split == 1:
                stages = TC_GEMM1_STAGES_SHORT_K
        return dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, SHARE=share, num_warps=4, num_stages=stages)
    bn = 64
    tiles = cdiv(n_out, bn) * pairs_or_tokens
    groups = 1
    per_sm = TC_GEMM2_PROGRAMS_LONG_K if (s31 and K >= 512) else 4
    while not share and groups < top_k and tiles * groups < per_sm * num_sms:
        groups *= 2
    stages = 2 if share else (TC_GEMM2_STAGES_SHORT_K if s31 and K < 512 else 4)
    return dict(BLOCK_N=bn, BLOCK_K=bk, GROUPS=min(groups, top_k), SHARE=share, num_warps=4, num_stages=stages)


def _groups_bk(bk: int, group_k: Optional[int], groups: int) -> int:
    """BLOCK_K of a tc GEMM step that reads ``groups`` block-scale groups (SUB_K) where BK is
    one group and the step stays within 512 bytes; else ``bk``."""
    if group_k is not None and bk == group_k and groups > 1 and group_k * groups <= 512:
        return group_k * groups
    return bk


def _check(a, w, quant, block_shape, bk, groups_ok=False) -> None:
    """Operand dtypes, and BLOCK_K against the block scales' K group: a divisor of it, or
    (``groups_ok``: GEMM1, whose steps take one dot a group) a multiple."""
    if a.dtype not in (torch.float8_e4m3fn, torch.int8) or w.dtype != a.dtype:
        raise ValueError(f"tensor-core decode: 8-bit activations and weights of one dtype "
                         f"(fp8 e4m3 or int8), got {a.dtype} x {w.dtype}; use kernels/decode.py for others")
    if quant == "block" and block_shape[1] % bk and not (groups_ok and bk % block_shape[1] == 0):
        what = "divide or be a multiple of" if groups_ok else "divide"
        raise ValueError(f"tensor-core decode: BLOCK_K {bk} must {what} the scale group {block_shape[1]}")


def _sub_k(quant, block_shape, bk) -> int:
    """GEMM1's SUB_K: the scale group where a step reads several (block scales), else 0."""
    return block_shape[1] if quant == "block" and bk > block_shape[1] else 0


def scratch_sizes(T: int, top_k: int, n_out1: int, H: int, cfg1: dict, cfg2: dict, gated: bool = True) -> tuple:
    """((fp32 partials, int32 tickets) of GEMM1, the same of GEMM2): element counts for T
    tokens (a SHARE GEMM2's partials: every pair's y). Each GEMM gets its own scratch (a GEMM2 may start before GEMM1 ends: PDL)."""
    rows = 2 * cfg1["BLOCK_N"] if gated else cfg1["BLOCK_N"]
    t1 = cdiv(n_out1, cfg1["BLOCK_N"])
    t2 = cdiv(H, cfg2["BLOCK_N"])
    part1 = T * top_k * cfg1["SPLIT_K"] * t1 * rows if cfg1["SPLIT_K"] > 1 else 1
    if cfg2.get("SHARE"):
        part2 = T * top_k * t2 * cfg2["BLOCK_N"]       # y: each pair's contribution
    else:
        part2 = T * cfg2["GROUPS"] * t2 * cfg2["BLOCK_N"] if cfg2["GROUPS"] > 1 else 1
    return (part1, T * top_k * t1), (part2, T * t2)


def scratch(T: int, top_k: int, n_out1: int, H: int, cfg1: dict, cfg2: dict, gated: bool, device) -> tuple:
    """((part, sync) of GEMM1, (part, sync) of GEMM2): the tensors of ``scratch_sizes``,
    tickets zeroed."""
    return tuple((torch.empty(p, dtype=torch.float32, device=device), torch.zeros(n, dtype=torch.int32, device=device))
                 for p, n in scratch_sizes(T, top_k, n_out1, H, cfg1, cfg2, gated))


def _common(a, w, topk_ids, expert_map, bias, quant, a_scale, b_scale, block_shape):
    a_mode, b_mode, gn, gk, sa, sb, sam, sak, sbe, sbn, sbk = _scale_args(quant, a_scale, b_scale, block_shape, a, w)
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    emap, num_global = (ids, w.shape[0]) if expert_map is None else (expert_map, expert_map.numel())
    if a_scale is None:
        sa = w
    if b_scale is None:
        sb = w
    s_bias = bias.stride()[:2] if bias is not None else (0, 0)
    return ((sa, sb, ids, emap), (num_global, w.shape[0]), (*s_bias, sam, sak, sbe, sbn, sbk),
            dict(HAS_BIAS=bias is not None, HAS_MAP=expert_map is not None, A_SCALE=a_mode, B_SCALE=b_mode,
                 GROUP_N=gn, GROUP_K=gk, INT8=a.dtype == torch.int8))


def _share_consts(config: dict, table) -> dict:
    """{'SHARE': True} for a SHARE config (its ``table``, of share_table_launch, checked), else {}."""
    if not config.get("SHARE"):
        return {}
    if config.get("SPLIT_K", 1) != 1:
        raise ValueError(f"tensor-core decode: SHARE takes SPLIT_K 1, got {config['SPLIT_K']}")
    if table is None:
        raise ValueError("tensor-core decode: a SHARE config needs table= (share_table / share_table_launch)")
    return dict(SHARE=True)


def _l2_pre(config: dict, a: torch.Tensor, waits: bool, gemm: int) -> int:
    """L2_PRE of a tc GEMM's launch (GEMM1: lines a weight row, GEMM2: slots): the config's
    (the plan sets it per GPU), 0 where the launch does not wait for the kernel before it
    (nothing to overlap) or off CUDA (the hint is inline PTX)."""
    if not waits or not a.is_cuda:
        return 0
    n = int(config.get("L2_PRE", 0))
    return next_power_of_2(n) if n > 0 and gemm == 0 else n      # (GEMM1: a tl.arange length)


# positions of the per-call tensors in the launch arguments (launcher.Bound slots)
TC_GEMM1_SLOTS = dict(x=0, out=2, a_scale=4, ids=6, map=7)
TC_GEMM2_SLOTS = dict(h=0, out=2, a_scale=4, topk_weights=6, ids=7, map=8)


def tc_gemm1_launch(x, w13, topk_ids, activation, out, part, sync, *, expert_map=None, bias=None,
                    swiglu_limit=None, alpha=1.702, limit=7.0, quant="channel", a_scale=None, b_scale=None,
                    block_shape=None, config=None, pdl=False, pdl_wait=False, table=None) -> tuple:
    """(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl) of GEMM1 (T > 0,
    out given). ``part`` fp32 / ``sync`` int32 scratch of ``scratch_sizes`` (sync zero before
    the first launch; every launch leaves it zero). ``pdl``: let a dependent launch start
    early; ``pdl_wait``: this launch is a programmatic dependent of the kernel writing x."""
    T, k = topk_ids.shape
    N13, K = w13.shape[1:]
    act = ACTIVATIONS[activation]
    gated = act <= 3
    n_out = N13 // 2 if gated else N13
    if config is None:
        config = tc_config("gemm1", T * k, n_out, K, k, gated, block_shape[1] if quant == "block" else None,
                           _num_sms(x.device))
    _check(x, w13, quant, block_shape, config["BLOCK_K"], groups_ok=True)
    (sa, sb, ids, emap), counts, strides, consts = _common(x, w13, topk_ids, expert_map, bias, quant, a_scale,
                                                           b_scale, block_shape)
    return (_tc_gemm1_kernel, (cdiv(n_out, config["BLOCK_N"]), config["SPLIT_K"], T * k), (
        x, w13, out, bias if bias is not None else w13, sa, sb, ids, emap, part, sync,
        n_out, K, *counts,
        *x.stride()[:2], *w13.stride()[:3], *out.stride()[:2], *strides,
        float(swiglu_limit if swiglu_limit is not None else limit), float(alpha), table if table is not None else sync,
    ), dict(TOP_K=k, GATED=gated, ACT=act, HAS_LIMIT=swiglu_limit is not None, BLOCK_N=config["BLOCK_N"],
            BLOCK_K=config["BLOCK_K"], SPLIT_K=config["SPLIT_K"], PDL=pdl, PDL_WAIT=pdl_wait,
            L2_PRE=_l2_pre(config, x, pdl_wait, 0),
            SUB_K=_sub_k(quant, block_shape, config["BLOCK_K"]), **_share_consts(config, table),
            **consts),
        config.get("num_warps", 4), config.get("num_stages", 4), pdl_wait)


def tc_gemm2_launch(h, w2, topk_ids, topk_weights, out, part, sync, *, expert_map=None, mul_routed_weight=True,
                    bias=None, quant="channel", a_scale=None, b_scale=None, block_shape=None, config=None,
                    pdl=False, table=None) -> tuple:
    """GEMM2's launch as in ``tc_gemm1_launch``. ``pdl``: a programmatic dependent launch
    (waits for the kernel writing h before anything else)."""
    T, k = topk_ids.shape
    H, K = w2.shape[1:]
    if config is None:
        config = tc_config("gemm2", T, H, K, k, group_k=block_shape[1] if quant == "block" else None,
                           num_sms=_num_sms(h.device))
    _check(h, w2, quant, block_shape, config["BLOCK_K"])
    groups = config["GROUPS"]
    (sa, sb, ids, emap), counts, strides, consts = _common(h, w2, topk_ids, expert_map, bias, quant, a_scale,
                                                           b_scale, block_shape)
    if _share_consts(config, table):
        return (_tc_gemm2_share_kernel, (cdiv(H, config["BLOCK_N"]), T * k), (
            h, w2, out, bias if bias is not None else w2, sa, sb, topk_weights, ids, emap, part, sync,
            H, K, *counts,
            *h.stride()[:2], *w2.stride()[:3], *out.stride()[:2], *strides, table if table is not None else sync,
        ), dict(TOP_K=k, MUL_W=mul_routed_weight, BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
                KP=next_power_of_2(k), PDL=pdl, **consts),
            config.get("num_warps", 4), config.get("num_stages", 4), pdl)
    return (_tc_gemm2_kernel, (cdiv(H, config["BLOCK_N"]), groups, T), (
        h, w2, out, bias if bias is not None else w2, sa, sb, topk_weights, ids, emap, part, sync,
        H, K, *counts,
        *h.stride()[:2], *w2.stride()[:3], *out.stride()[:2], *strides,
    ), dict(TOP_K=k, SLOTS=cdiv(k, groups), GROUPS=groups, MUL_W=mul_routed_weight, BLOCK_N=config["BLOCK_N"],
            BLOCK_K=config["BLOCK_K"], PDL=pdl,
            L2_PRE=min(_l2_pre(config, h, pdl, 1), cdiv(k, groups)), L2_LINES=next_power_of_2(cdiv(K, 128)),
            **consts),
        config.get("num_warps", 4), config.get("num_stages", 4), pdl)


def share_table(T: int, top_k: int, device) -> torch.Tensor:
    """The SHARE GEMMs' table (int32 [T * k, 16]: row s the pairs pair s leads, else -1),
    written by share_table_launch before GEMM1 of every call."""
    return torch.empty(T * top_k, 16, dtype=torch.int32, device=device)


def share_table_launch(topk_ids, table, num_experts: int, *, expert_map=None, pdl=False) -> tuple:
    """(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl) of the share table
    (``table`` of ``share_table``; ``num_experts`` local). ``pdl``: a programmatic dependent
    launch after the kernel writing x (it waits for it before storing, see the kernel)."""
    T, k = topk_ids.shape
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    emap, num_global = (ids, num_experts) if expert_map is None else (expert_map, expert_map.numel())
    return (_share_table_kernel, (T * k,), (ids, emap, table, num_global, num_experts),
            dict(HAS_MAP=expert_map is not None, NP=max(16, next_power_of_2(T * k)), PDL=pdl), 4, 1, pdl)


def tc_decode(xq, w13, w2, topk_weights, topk_ids, activation="silu", *, x_scale=None, w13_scale=None,
              w2_scale=None, quant="channel", block_shape=None, expert_map=None, w13_bias=None, w2_bias=None,
              swiglu_limit=None, alpha=1.702, limit=7.0, mul_routed_weight=True, quantize_h=None,
              config1=None, config2=None) -> tuple:
    """Both GEMMs on pre-quantized x (tests and benchmarks; the backend binds the launches
    itself): (h [n, I] 16-bit, out [T, H] bf16). ``quantize_h(h) -> (hq, h_scale)`` is the
    scheme's activation quantizer between them."""
    T, k = topk_ids.shape
    N13, H = w13.shape[1:]
    gated = ACTIVATIONS[activation] <= 3
    n_out = N13 // 2 if gated else N13
    dt = _compute_dtype(xq)
    h = torch.empty(T * k, n_out, dtype=dt, device=xq.device)
    out = torch.zeros(T, H, dtype=dt, device=xq.device)
    if T == 0:
        return h, out
    gk = block_shape[1] if quant == "block" else None
    nsm = _num_sms(xq.device)
    E = w13.shape[0]
    c1 = config1 or tc_config("gemm1", T * k, n_out, H, k, gated, gk, nsm, num_experts=E)
    c2 = config2 or tc_config("gemm2", T, H, n_out, k, group_k=gk, num_sms=nsm, num_experts=E)
    (part1, sync1), (part2, sync2) = scratch(T, k, n_out, H, c1, c2, gated, xq.device)
    table = None
    if c1.get("SHARE") or c2.get("SHARE"):
        table = share_table(T, k, xq.device)
        launch(*share_table_launch(topk_ids, table, w13.shape[0], expert_map=expert_map))
    launch(*tc_gemm1_launch(xq, w13, topk_ids, activation, h, part1, sync1, expert_map=expert_map, bias=w13_bias,
                            swiglu_limit=swiglu_limit, alpha=alpha, limit=limit, quant=quant, a_scale=x_scale,
                            b_scale=w13_scale, block_shape=block_shape, config=c1, table=table))
    hq, h_scale = quantize_h(h)
    launch(*tc_gemm2_launch(hq, w2, topk_ids, topk_weights, out, part2, sync2, expert_map=expert_map,
                            mul_routed_weight=mul_routed_weight, bias=w2_bias, quant=quant, a_scale=h_scale,
                            b_scale=w2_scale, block_shape=block_shape, config=c2, table=table))
    return h, out
