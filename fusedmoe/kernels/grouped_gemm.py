"""Grouped (per-expert) GEMMs of the MoE layer, standard activation format.

One module though long: the tiled and A-resident kernels share @triton.jit helpers (_dot) and
host helpers (_cfg, _tma_ok), gemm2 picks between them, and a config key changes a kernel, its
launcher and default_config together.

Legend: T tokens, E experts (local), k top-k, H hidden, I intermediate, N = 2I (gated) or I,
n = T*k (token, slot) pairs flattened as s = t*k + j, S = SPLIT_K.

  gemm1_act: h [n, I]  = act(x[s // k] @ w13[e]^T + b13[e])   x [T, H], w13 [E, N, H]
  gemm2:     out [T, H] = sum_j w[s] * (h[s] @ w2[e]^T + b2[e])  h [n, I], w2 [E, H, I]

One kernel, ``_moe_gemm_kernel``, serves both. Rows come from ``AlignResult`` (kernels/align.py):
program (pid_m, pid_n) takes BM slots of ONE expert from sorted_ids, gathers their A rows
(slot // A_DIV), multiplies by that expert's weight tile and scatters the C rows
(slot // C_DIV). Sentinel slots (== n) are computed on A row 0 and never stored.

GEMM1 fuses the gated activation: each program holds two accumulators, gate (w13 rows n)
and up (rows I + n), so the [n, 2I] pre-activation never reaches memory (saves writing
and re-reading it: 2 x 100 MB in bf16 at T=4096, k=8, I=768, ~60 us of HBM time).
The weights are always in halves layout here (backends de-interleave swigluoai once).

GEMM2 multiplies the routing weight in its epilogue, then reduces over k either
  'deterministic': store y [S, n, H], then ``_moe_reduce_kernel`` sums slots (and splits)
                   of each token in a fixed order -> bitwise reproducible;
  'atomic':        tl.atomic_add into an fp32 [T, H] buffer (zeroed first), then cast;
  'atomic_out':    tl.atomic_add straight into the (zeroed) output in its own dtype: for a
                   16-bit output 16-byte vector reds of 8 values (sm_90 red.v8.bf16), no
                   buffer, no cast, no y; each slot's sum rounded to the output dtype.
Slots dropped by expert_map are never computed; the reduce skips them (from topk_ids and
expert_map), and the atomic buffer starts at zero, so tokens with no local slot get 0.

Quantization (hooks for fp8 / int8): A_SCALE 0 none | 1 tensor [1] | 2 per row [M, 1] |
3 block [M, K/bk]; B_SCALE 0 none | 1 per expert [E] | 2 per channel [E, N] | 3 block
[E, N/bn, K/bk]. Block scales are applied per K tile inside the loop (BLOCK_SIZE_K must
divide bk); the others once after it. int8 x int8 accumulates in int32; a 16-bit A with
an 8-bit B (weight-only) casts B to A's dtype in the loop. Block scales two ways: by
default each K group's dot gets a tile of its own, scaled into the accumulator
(``acc += dot(a, b) * sa * sb``); with config RESCALE the accumulator holds
sum_j s_j d_j / s_cur and is multiplied by s_prev / s_cur before each group's dot, which
then accumulates in place (no second fp32 tile live: larger tiles fit; H100 deepseek-v3
tp8 fp8_block T=4096 1550 -> 1263 us with the tiles that allows; scales below 2^-60 read
as 2^-60; not for int8 x int8, whose dot cannot accumulate into fp32). RESCALE's scales are
loaded one K group ahead (PREFETCH_S): triton pipelines only loads that feed a dot, and
the multiply each dot waits on had waited on them (H100 deepseek-v3 tp8 fp8_block T=4096
1005 -> 986 us).

Configs: dict(BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps,
num_stages, SPLIT_K[, USE_TMA, GU_ONE_DOT, HALF_TAIL, PERSISTENT, FLATTEN, RESCALE, A_RESIDENT, BAND_MAJOR,
BAND_N, MASK_A, SORTED_X (GEMM1), SORTED_H (GEMM2)]). SORTED_H / SORTED_X (16-bit, the tiled kernel;
``sorted_h`` / ``sorted_x``, read by the backend and ``moe_forward_triton``): A in sorted order,
row = the tile's sorted position, so a tile's A rows are one [BM, BK] box that a TMA descriptor
loads (with USE_TMA) instead of BM rows gathered by slot / token with cp.async. SORTED_H:
GEMM1 writes h at the sorted positions (``gemm1_act(out_sorted=True)``, [max_padded, I]: padding
rows too, finite values never stored by GEMM2) and GEMM2 reads it (``gemm2(h_sorted=True)``).
SORTED_X: ``gather_sorted`` copies x's rows there first (one launch; padding rows zero) and GEMM1
reads the copy (``gemm1_act(x_sorted=True)``). HALF_TAIL's half tiles load the sorted A by
pointer. H100 Mixtral: SORTED_H T=1024 / 4096 / 16384
-5 / -4 / -2.6%, SORTED_X T=4096 a further -5.3%; both lose at qwen3 / deepseek-v3 (k = 8: the
copy of x is 8 times x; h's padding rows) and SORTED_X at Mixtral T=256 / 1024.
HALF_TAIL (the tiled kernel, BLOCK_SIZE_M >= 32, not with PERSISTENT + FLATTEN): a tile whose second half of rows is all padding runs as a tile of BM / 2 rows (``_tile_or_half``):
half the MMAs for an expert's last few rows. H100: one
tile a program 0.2-1.4% faster (Mixtral T=1024 GEMM2, shipped there); with PERSISTENT 6-20% SLOWER
(sm_90 compile: 170 -> 255 registers, no spill, the same pipelined loops; the cause is not known),
so the tuner tries it on one-tile-a-program configs only. GU_ONE_DOT (gated GEMM1 with USE_TMA, no
block scales): the gate and up tiles in one dot of width 2 BN through a [2, BN, BK] box of the 3-D
view [2E, N, K] of the halves layout (one wgmma m64n256 where two m64n128 read A from shared
memory twice; bf16 128 x (2 x 128): 255 -> 173 registers; H100 Mixtral T=16384 18.3 -> 17.6 ms,
T=1024 1552 -> 1449 us). BLOCK_SIZE_M must divide the AlignResult's block_m; SPLIT_K applies to
GEMM2 only; USE_TMA loads the weight tiles through a host-side TMA descriptor (triton >= 3.4;
falls back to pointer loads when the weight is not contiguous or 16-byte aligned). See
``default_config`` for the decode and prefill regimes. A_RESIDENT = n (GEMM2 only: operands of
one dtype, 16-bit without scales or 8-bit with per-tensor, per-channel or block scales on both; no split, K in at most 4
chunks of <= 256 columns (block scales: one K group a chunk); BLOCK_SIZE_K, GROUP_SIZE_M,
PERSISTENT, RESCALE are then ignored): the A-resident kernel, one program per (m-block, n
column tiles), see ``_moe_gemm2_resident_kernel``. BAND_MAJOR (with A_RESIDENT): programs
take every m-block of a band of n column tiles before the next band, so that with an atomic
k-sum the band of the output being added to stays in L2 (H100 deepseek-v3 tp8 T=16384, bands
of 1024 columns: bf16 3956 -> 3626 us with 'atomic_out', where m-major atomics lost; T=4096,
whose 58 MB output is also past the L2: bf16 1492 -> 1401, fp8_block 939 -> 864).
BAND_N = b (the tiled kernel, one tile a program or persistent): the same order for its tiles,
bands of b column tiles (H100: no gain on qwen3 / Mixtral at
T=16384, e.g. qwen3 fp8_channel 1713 -> 1806-1810 us; shipped nowhere). MASK_A (the tiled
kernel; default ``mask_a_rule``): an m-block's padding rows load nothing (zero-filled)
instead of re-reading row 0, so they cost no L2 bandwidth. H100, Mixtral bf16:
T=256 1077 -> 1028 us (86.8 -> 90.9% of the roofline), T=1024
1790 -> 1686; qwen3 / deepseek tp8 at T=256 / 1024 within +-0.4%.

PERSISTENT = P > 0 launches min(P * SMs, tiles) programs (per K split) instead of one per
tile; each loops over tiles (same GROUP_M order, same per-tile code, so the output is
bitwise the same) until the device's m-block count is exhausted. Why: prefill GEMM2 has
K = I, a handful of K iterations per tile (deepseek-v3 tp8: I = 256 = 4 x BK 64, 57k
tiles at T=16384), so each tile's pipeline fill and drain and its output stores dominate;
a persistent program issues the next tile's loads while the last one's stores drain and
pays its setup once. FLATTEN (with PERSISTENT) asks triton to fuse the tile and K loops
into one software-pipelined loop (``tl.range(flatten=True)``, in triton 3.6 and 3.9; as
in triton's persistent matmul tutorial), so the K pipeline also stays full across tiles.
It costs registers and shared memory (the epilogue's layout-conversion buffer can no longer
reuse the pipeline's): sm90 compile of the deepseek-v3 tp8 GEMM2 tile (BM 128, BN 256,
4 stages, TMA) 186 -> 255 registers with a small spill, 192 -> 224 KiB, so whether it pays
is the tuner's call ('persistent' stage). Unflattened persistent launches keep the
registers of the one-tile launch.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors: triton >= 3.4 (3.6 and 3.9 both have them)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

from .align import AlignResult, align_block_size
from .launcher import cdiv, launch, next_power_of_2
from .common import (ACTIVATIONS, _abs_bits, _activation, _compute_dtype, _num_sms, _quantize, _scale_args,
                     _scale_from_amax_bits, gdc_launch_dependents, gdc_wait)
from .quantize import _bitwise_fp8, _q_arg

__all__ = ["gemm1_act", "gemm2", "moe_reduce", "moe_forward_triton", "default_config",
           "gemm2_workspace_spec", "sorted_h", "sorted_x", "gather_sorted", "ACTIVATIONS", "QUANT_MODES",
           "REDUCE_MODES"]

QUANT_MODES = ("none", "tensor", "channel", "block")
REDUCE_MODES = ("deterministic", "atomic", "atomic_out")
_NO_ACT = -1


# ----------------------------------------------------------------------------------------
@triton.jit
def _dot(a, b, acc, FP32_IEEE: tl.constexpr, INT_ACC: tl.constexpr):
    if FP32_IEEE:   # fp32 operands: exact fp32 products, not TF32's 10-bit mantissa
        r = tl.dot(a, b, acc, input_precision="ieee")
    elif INT_ACC:   # triton 3.6 wants out_dtype to match an int32 accumulator
        r = tl.dot(a, b, acc, out_dtype=tl.int32)
    else:
        r = tl.dot(a, b, acc)
    return r


@triton.jit
def _floor_scale(s):
    """Block scales below 2^-60 (a zero weight block's 0) read as 2^-60: RESCALE divides by
    them. Activation scales are >= 1e-12 / 448 already; NaN survives (where, not maximum)."""
    s = s.to(tl.float32)
    return tl.where(s < 8.673617379884035e-19, 8.673617379884035e-19, s)


@triton.jit
def _rescale(acc, pa, ca, pb, cb, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, SB_SCALAR: tl.constexpr):
    """acc * (pa / ca) (rows) * (pb / cb) (columns, or one scalar when SB_SCALAR)."""
    if A_SCALE == 3:
        ra = pa / ca                                                            # [BM]
        if B_SCALE == 3:
            if SB_SCALAR:
                acc = acc * (ra * (pb / cb))[:, None]
            else:
                acc = acc * (ra[:, None] * (pb / cb)[None, :])
        else:
            acc = acc * ra[:, None]
    elif SB_SCALAR:
        acc = acc * (pb / cb)
    else:
        acc = acc * (pb / cb)[None, :]
    return acc


@triton.jit
def _grouped_coords(tile, num_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of linear tile ``tile`` of a num_m x num_pid_n grid of tiles.

    GROUP_M m-blocks walk the n-blocks together: consecutive m-blocks usually share an
    expert, so its weight tiles are read from L2 instead of HBM.
    """
    in_group = GROUP_M * num_pid_n
    first_m = (tile // in_group) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % rows_in_group
    pid_n = (tile % in_group) // rows_in_group
    return pid_m, pid_n


@triton.jit
def _tile_coords(tile, num_m, num_pid_n, GROUP_M: tl.constexpr, BAND_N: tl.constexpr):
    """``_grouped_coords``, or with BAND_N > 0 (config key BAND_N) the tiles in bands of
    BAND_N n-blocks: every m-block of a band (grouped as above inside it) before the next
    band, so that with an atomic k-sum the band of the output being added to can stay in
    L2 (as the A-resident kernel's BAND_MAJOR; the last band may be narrower)."""
    if BAND_N > 0:
        per_band = num_m * BAND_N
        band = tile // per_band
        width = tl.minimum(num_pid_n - band * BAND_N, BAND_N)
        pid_m, pid_n = _grouped_coords(tile % per_band, num_m, width, GROUP_M)
        pid_n += band * BAND_N
    else:
        pid_m, pid_n = _grouped_coords(tile, num_m, num_pid_n, GROUP_M)
    return pid_m, pid_n


@triton.jit
def _gemm_tile(
    pid_m, pid_n, pid_k, e,
    a_ptr, b_ptr, b_desc, a_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, sorted_ids_ptr, c_scale_ptr,
    N_OUT, K, num_pairs, k_tiles,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk,
    stride_cs, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm,
    limit, alpha,
    A_DIV: tl.constexpr, C_DIV: tl.constexpr,
    GATED: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    MUL_W: tl.constexpr, ATOMIC: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    EVEN_K: tl.constexpr, FP32_IEEE: tl.constexpr, INT_ACC: tl.constexpr, CAST_B: tl.constexpr,
    USE_TMA: tl.constexpr, RESCALE: tl.constexpr, SB_SCALAR: tl.constexpr,
    Q_GROUP: tl.constexpr, Q_POW2: tl.constexpr, BITWISE_FP8: tl.constexpr, MASK_A: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PREFETCH_S: tl.constexpr, EPI_EARLY: tl.constexpr, ONE_DOT: tl.constexpr,
    SORTED_A: tl.constexpr, SORTED_C: tl.constexpr, A_TMA: tl.constexpr,
):
    """One output tile: rows pid_m (of expert ``e``, >= 0), columns pid_n, K split pid_k.

    A helper, not part of the kernel body, so that the one-tile-per-program launch and the
    persistent tile loop run the same code (it is inlined: no call remains). No early
    return here: the persistent loop needs its K loop directly in the tile loop's body
    (triton cannot return inside a loop, and ``flatten`` does not look through an if).
    """
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + offs_m)                                    # [BM]
    row_ok = slots < num_pairs
    # padding rows: MASK_A loads nothing for them, else they read A row 0 (valid memory);
    # never stored. SORTED_A: A's rows are in sorted (padded) order, row = position
    if SORTED_A:
        a_rows = offs_m.to(tl.int64)                                            # [BM]
    else:
        a_rows = tl.where(row_ok, slots // A_DIV, 0).to(tl.int64)               # [BM]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N_OUT          # wrapped columns: B loads need no N mask, stores do
    offs_k = tl.arange(0, BLOCK_K)
    # split pid_k owns K tiles [pid_k * k_tiles, (pid_k + 1) * k_tiles); k_lo written as a
    # multiple of the constexpr BLOCK_K so the compiler can prove 16-byte alignment
    # (from an unspecialized int it made every load a scalar 2-byte ld.global.b16 with no
    # cp.async pipelining: Mixtral T=4096 GEMM1 ran at 125 TFLOP/s on H200)
    k_lo = pid_k * k_tiles * BLOCK_K
    num_k = tl.minimum(tl.cdiv(K - k_lo, BLOCK_K), k_tiles)

    a_ptrs = a_ptr + a_rows[:, None] * stride_am + (k_lo + offs_k)[None, :] * stride_ak         # [BM, BK]
    b_ptrs = b_ptr + e * stride_be + offs_bn[None, :] * stride_bn + (k_lo + offs_k)[:, None] * stride_bk  # [BK, BN]
    up = N_OUT * stride_bn                            # up rows follow the gate rows (halves)
    if INT_ACC:                                       # int8 x int8 without block scales
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if ONE_DOT:
        # gate and up in ONE dot: b_desc is the 3-D view [E * 2, N_OUT, K] of the halves
        # layout, whose [2, BN, BK] box holds this tile's gate rows and its up rows; the
        # [BM, 2 BN] accumulator is split after the loop. One wgmma of width 2 BN reads the A
        # tile from shared memory once a K step where two of width BN read it twice
        acc2 = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.int32 if INT_ACC else tl.float32)
    if A_SCALE == 3:
        as_ptrs = a_scale_ptr + a_rows * stride_asm                             # [BM]
    if B_SCALE == 3:
        if SB_SCALAR:     # BN divides bn, bn divides N: one weight scale a (tile, K group)
            bs_ptrs = b_scale_ptr + e * stride_bse + ((pid_n * BLOCK_N) // GROUP_N) * stride_bsn
            bs_up_ptrs = b_scale_ptr + e * stride_bse + ((pid_n * BLOCK_N + N_OUT) // GROUP_N) * stride_bsn
        else:
            bs_ptrs = b_scale_ptr + e * stride_bse + (offs_bn // GROUP_N) * stride_bsn             # [BN]
            bs_up_ptrs = b_scale_ptr + e * stride_bse + ((offs_bn + N_OUT) // GROUP_N) * stride_bsn
    if RESCALE:
        # acc holds sum_j s_j d_j / s_cur (s_j = sa_j * sb_j, d_j the K group's dot): before
        # each group's dot it is multiplied by s_prev / s_cur, so the dot accumulates into it
        # in place (no second [BM, BN] fp32 tile live across the dot); once after the loop by
        # s_last. An empty K split reads group 0's scales (its acc is 0 anyway).
        kg0 = tl.minimum(k_lo, K - 1) // GROUP_K
        kg_last = (K - 1) // GROUP_K
        if A_SCALE == 3:
            na = tl.load(as_ptrs + kg0 * stride_ask)                                  # [BM]
            pa = _floor_scale(na)
        else:
            pa = 1.0
        if B_SCALE == 3:
            nb = tl.load(bs_ptrs + kg0 * stride_bsk)                                  # [] or [BN]
            pb = _floor_scale(nb)
            if GATED:        # (an ungated GEMM's up pointers run past its expert's scales)
                nbu = tl.load(bs_up_ptrs + kg0 * stride_bsk)
                pbu = _floor_scale(nbu)
            else:
                pbu = 1.0
        else:
            pb = 1.0
            pbu = 1.0

    if EPI_EARLY:
        # the epilogue's per-tensor / per-row scales and routing weights loaded before the K
        # loop: their latency is spent under the loop's MMAs instead of after them, between
        # the last dot and the tile's store (the same values: the same bits). Not the
        # per-column weight scales: a [1, BN] row in the MMA layout costs up to BN / 4
        # registers a thread across the loop (sm_90 compile, qwen3 fp8_channel GEMM2 64x256:
        # 728 bytes of spill at T=4096)
        if A_SCALE == 1:
            e_sa = tl.load(a_scale_ptr)
        elif A_SCALE == 2:
            e_sa = tl.load(a_scale_ptr + a_rows * stride_asm)[:, None]
        if B_SCALE == 1:
            e_sb = tl.load(b_scale_ptr + e * stride_bse)
        if MUL_W:
            e_w = tl.load(topk_w_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)[:, None]

    # TMA: B tiles [BN, BK] of w viewed as [E*N, K]; rows past this expert's N belong to the
    # next expert (or are zero-filled at the end) and only feed masked output columns
    b_row = (e * (N_OUT * (2 if GATED else 1)) + pid_n * BLOCK_N).to(tl.int32)
    for it in range(0, num_k):
        k_at = k_lo + it * BLOCK_K
        k_ok = (k_at + offs_k) < K
        # A: MASK_A masks the padding rows (zero-filled: no L2 traffic for them); A_TMA: the
        # sorted A's [BM, BK] box through a TMA descriptor (zero-filled past K)
        if A_TMA == BLOCK_M:
            a = a_desc.load([(pid_m * BLOCK_M).to(tl.int32), k_at])
        elif EVEN_K and not MASK_A:
            a = tl.load(a_ptrs)
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        elif MASK_A:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        if ONE_DOT:
            b = tl.trans(tl.reshape(b_desc.load([(2 * e).to(tl.int32), pid_n * BLOCK_N, k_at]),
                                    (2 * BLOCK_N, BLOCK_K)))                      # [BK, 2 BN]
        elif USE_TMA:
            b = tl.trans(b_desc.load([b_row, k_at]))                              # [BK, BN]
            if GATED:
                b_u = tl.trans(b_desc.load([b_row + N_OUT, k_at]))
        elif EVEN_K:
            b = tl.load(b_ptrs)
            if GATED:
                b_u = tl.load(b_ptrs + up)
        else:
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
            if GATED:
                b_u = tl.load(b_ptrs + up, mask=k_ok[:, None], other=0.0)
        if CAST_B:                                    # weight-only: 8-bit B, 16-bit A
            b = b.to(a.dtype)
            if GATED and not ONE_DOT:
                b_u = b_u.to(a.dtype)
        if RESCALE:
            kg = (k_lo + it * BLOCK_K) // GROUP_K
            # PREFETCH_S: this group's scales were loaded an iteration ago (na, nb, nbu) and the
            # next group's are loaded now, so a load's latency overlaps this iteration's dots
            # instead of stalling the rescale the dot waits on (triton does not pipeline loads
            # that feed no dot operand: sm_90 compile, both scale loads sat right before their
            # use in the loop). Same values, same operations: bitwise the same output.
            kg_n = tl.minimum((k_lo + (it + 1) * BLOCK_K) // GROUP_K, kg_last)
            if A_SCALE == 3:
                if PREFETCH_S:
                    ca = _floor_scale(na)
                    na = tl.load(as_ptrs + kg_n * stride_ask)
                else:
                    ca = _floor_scale(tl.load(as_ptrs + kg * stride_ask))
            else:
                ca = 1.0
            if B_SCALE == 3:
                if PREFETCH_S:
                    cb = _floor_scale(nb)
                    nb = tl.load(bs_ptrs + kg_n * stride_bsk)
                    if GATED:
                        cbu = _floor_scale(nbu)
                        nbu = tl.load(bs_up_ptrs + kg_n * stride_bsk)
                else:
                    cb = _floor_scale(tl.load(bs_ptrs + kg * stride_bsk))
                    if GATED:
                        cbu = _floor_scale(tl.load(bs_up_ptrs + kg * stride_bsk))
            else:
                cb = 1.0
                cbu = 1.0
            acc = _dot(a, b, _rescale(acc, pa, ca, pb, cb, A_SCALE, B_SCALE, SB_SCALAR), FP32_IEEE, False)
            if GATED:
                acc_u = _dot(a, b_u, _rescale(acc_u, pa, ca, pbu, cbu, A_SCALE, B_SCALE, SB_SCALAR),
                             FP32_IEEE, False)
                if B_SCALE == 3:
                    pbu = cbu
            if A_SCALE == 3:
                pa = ca
            if B_SCALE == 3:
                pb = cb
        elif A_SCALE == 3 or B_SCALE == 3:
            kg = (k_lo + it * BLOCK_K) // GROUP_K
            if A_SCALE == 3:
                sa = tl.load(as_ptrs + kg * stride_ask)[:, None]
            else:
                sa = 1.0
            if B_SCALE == 3:
                sb = tl.load(bs_ptrs + kg * stride_bsk)[None, :]
            else:
                sb = 1.0
            acc += _dot(a, b, None, FP32_IEEE, False).to(tl.float32) * (sa * sb)
            if GATED:
                if B_SCALE == 3:
                    sb = tl.load(bs_up_ptrs + kg * stride_bsk)[None, :]
                acc_u += _dot(a, b_u, None, FP32_IEEE, False).to(tl.float32) * (sa * sb)
        elif ONE_DOT:
            acc2 = _dot(a, b, acc2, FP32_IEEE, INT_ACC)
        else:
            acc = _dot(a, b, acc, FP32_IEEE, INT_ACC)
            if GATED:
                acc_u = _dot(a, b_u, acc_u, FP32_IEEE, INT_ACC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # ---- epilogue: scales, bias, activation, routing weight, store ----
    if ONE_DOT:   # columns [0, BN) are the gate's, [BN, 2 BN) the up's
        acc, acc_u = tl.split(tl.permute(tl.reshape(acc2, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
    acc = acc.to(tl.float32)
    acc_u = acc_u.to(tl.float32)
    if RESCALE:                                       # times the last K group's scale
        acc = _rescale(acc, pa, 1.0, pb, 1.0, A_SCALE, B_SCALE, SB_SCALAR)
        if GATED:
            acc_u = _rescale(acc_u, pa, 1.0, pbu, 1.0, A_SCALE, B_SCALE, SB_SCALAR)
    if A_SCALE == 1 or A_SCALE == 2:
        if EPI_EARLY:
            sa = e_sa
        elif A_SCALE == 1:
            sa = tl.load(a_scale_ptr)
        else:
            sa = tl.load(a_scale_ptr + a_rows * stride_asm)[:, None]
        acc *= sa
        acc_u *= sa
    if B_SCALE == 1:
        if EPI_EARLY:
            sb = e_sb
        else:
            sb = tl.load(b_scale_ptr + e * stride_bse)
        acc *= sb
        acc_u *= sb
    elif B_SCALE == 2:
        acc *= tl.load(b_scale_ptr + e * stride_bse + offs_bn * stride_bsn)[None, :]
        if GATED:
            acc_u *= tl.load(b_scale_ptr + e * stride_bse + (offs_bn + N_OUT) * stride_bsn)[None, :]
    if HAS_BIAS:
        bias_p = bias_ptr + e * stride_bias_e + offs_bn * stride_bias_n
        bias = tl.load(bias_p).to(tl.float32)[None, :]
        if SPLIT_K > 1:
            bias = bias * (pid_k == 0).to(tl.float32)    # one split adds the bias
        acc += bias
        if GATED:
            acc_u += tl.load(bias_p + N_OUT * stride_bias_n).to(tl.float32)[None, :]
    if ACT >= 0:
        acc = _activation(acc, acc_u, ACT, HAS_LIMIT, limit, alpha)
    if MUL_W:
        if EPI_EARLY:
            acc *= e_w
        else:
            acc *= tl.load(topk_w_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)[:, None]

    if SORTED_C:   # rows at their sorted positions, padding rows too (finite: the A rows read)
        c_mask = (offs_n < N_OUT)[None, :]
        c_rows = offs_m.to(tl.int64)
    else:
        c_mask = row_ok[:, None] & (offs_n < N_OUT)[None, :]
        c_rows = (slots // C_DIV).to(tl.int64)
    c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if Q_GROUP > 0:
        # the output quantized to fp8 in 1 x Q_GROUP groups (BLOCK_N holds whole groups):
        # scale = max(amax, 1e-12) / 448 per (row, group) (Q_POW2: rounded up to a power of
        # two), NaN for a group holding NaN / Inf: the reference's quant_fp8_group of the fp32
        # tile; scales to c_scale [rows, G]
        bits = tl.where((offs_n < N_OUT)[None, :], _abs_bits(acc), 0)            # [BM, BN]
        if BLOCK_N == Q_GROUP:
            # one group a tile (deepseek-v3 fp8_block's GEMM1): the row's scale and its
            # reciprocal once, the quotient by _quantize's RCP (the correctly rounded acc / s
            # in 3 FMA-class operations where div_rn takes a dozen or more)
            s_g = _scale_from_amax_bits(tl.max(bits, axis=1), 448.0, Q_POW2)   # [BM]
            tl.store(c_scale_ptr + c_rows * stride_csm + pid_n, s_g, mask=row_ok)     # (a tile starts inside N)
            tl.store(c_ptrs, _quantize(acc, s_g[:, None], "fp8", BITWISE_FP8, True), mask=c_mask)
        else:
            grp_of = tl.arange(0, BLOCK_N) // Q_GROUP                             # [BN] group in the tile
            sc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for g in tl.static_range(BLOCK_N // Q_GROUP):
                in_g = (grp_of == g)[None, :]
                s_g = _scale_from_amax_bits(tl.max(tl.where(in_g, bits, 0), axis=1), 448.0, Q_POW2)  # [BM]
                col0 = pid_n * BLOCK_N + g * Q_GROUP
                g_ok = row_ok & ((slots * 0 + col0) < N_OUT)   # (a tensor '&': the interpreter's mask dtype)
                tl.store(c_scale_ptr + c_rows * stride_csm + col0 // Q_GROUP, s_g, mask=g_ok)
                sc = tl.where(in_g, s_g[:, None], sc)
            tl.store(c_ptrs, _quantize(acc, sc, "fp8", BITWISE_FP8), mask=c_mask)
    elif ATOMIC:
        tl.atomic_add(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask, sem="relaxed")
    else:
        tl.store(c_ptrs + pid_k * stride_cs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _tile_or_half(
    pid_m, pid_n, pid_k, e,
    a_ptr, b_ptr, b_desc, a_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, sorted_ids_ptr, c_scale_ptr,
    N_OUT, K, num_pairs, k_tiles,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk,
    stride_cs, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm,
    limit, alpha,
    A_DIV: tl.constexpr, C_DIV: tl.constexpr,
    GATED: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    MUL_W: tl.constexpr, ATOMIC: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    EVEN_K: tl.constexpr, FP32_IEEE: tl.constexpr, INT_ACC: tl.constexpr, CAST_B: tl.constexpr,
    USE_TMA: tl.constexpr, RESCALE: tl.constexpr, SB_SCALAR: tl.constexpr,
    Q_GROUP: tl.constexpr, Q_POW2: tl.constexpr, BITWISE_FP8: tl.constexpr, MASK_A: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    PREFETCH_S: tl.constexpr, EPI_EARLY: tl.constexpr, ONE_DOT: tl.constexpr, HALF_TAIL: tl.constexpr,
    SORTED_A: tl.constexpr, SORTED_C: tl.constexpr, A_TMA: tl.constexpr,
):
    """``_gemm_tile``, or with HALF_TAIL (config key) a tile whose second half of rows is all
    padding computed as a tile of BLOCK_M / 2 rows: the rows [pid_m BM, pid_m BM + BM / 2) are
    m-block 2 pid_m of the half height. Padding fills the END of an expert's run, so one
    load (the first slot of the second half) tells. An expert with n rows costs
    ceil(n / BM) full tiles without it: Mixtral T=1024 has ~256 +- 16 rows an expert, so
    about half its experts pay a third 128-row tile for a few rows; with it that tile's MMAs
    are half as many (the weight tile is read all the same). Both branches are compiled;
    they are exclusive, so the registers are the larger one's."""
    # (a constexpr False short-circuits the `and`: without HALF_TAIL neither the load nor
    # the half branch is compiled)
    if HALF_TAIL and tl.load(sorted_ids_ptr + pid_m * BLOCK_M + BLOCK_M // 2) >= num_pairs:
        _gemm_tile(
            pid_m * 2, pid_n, pid_k, e,
            a_ptr, b_ptr, b_desc, a_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, sorted_ids_ptr,
            c_scale_ptr, N_OUT, K, num_pairs, k_tiles,
            stride_am, stride_ak, stride_be, stride_bn, stride_bk,
            stride_cs, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
            stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm,
            limit, alpha,
            A_DIV, C_DIV, GATED, ACT, HAS_LIMIT, HAS_BIAS, MUL_W, ATOMIC,
            A_SCALE, B_SCALE, GROUP_N, GROUP_K, EVEN_K, FP32_IEEE, INT_ACC, CAST_B, USE_TMA, RESCALE, SB_SCALAR,
            Q_GROUP, Q_POW2, BITWISE_FP8, MASK_A, BLOCK_M // 2, BLOCK_N, BLOCK_K, SPLIT_K, PREFETCH_S,
            EPI_EARLY, ONE_DOT, SORTED_A, SORTED_C, A_TMA)
    else:
        _gemm_tile(
            pid_m, pid_n, pid_k, e,
            a_ptr, b_ptr, b_desc, a_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, sorted_ids_ptr,
            c_scale_ptr, N_OUT, K, num_pairs, k_tiles,
            stride_am, stride_ak, stride_be, stride_bn, stride_bk,
            stride_cs, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
            stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm,
            limit, alpha,
            A_DIV, C_DIV, GATED, ACT, HAS_LIMIT, HAS_BIAS, MUL_W, ATOMIC,
            A_SCALE, B_SCALE, GROUP_N, GROUP_K, EVEN_K, FP32_IEEE, INT_ACC, CAST_B, USE_TMA, RESCALE, SB_SCALAR,
            Q_GROUP, Q_POW2, BITWISE_FP8, MASK_A, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PREFETCH_S,
            EPI_EARLY, ONE_DOT, SORTED_A, SORTED_C, A_TMA)


@triton.jit
def _zero_share(z_ptr, z_numel, share, n_shares, ZB: tl.constexpr):
    """Store zeros into share ``share`` of ``n_shares`` equal runs (multiples of ZB elements)
    of the contiguous z [z_numel]: the output of GEMM2's atomic k-sum, zeroed by GEMM1 on the
    side (ZERO in _moe_gemm_kernel) instead of by a launch of its own."""
    per = (tl.cdiv(tl.cdiv(z_numel, n_shares), ZB) * ZB).to(tl.int64)
    start = share * per
    offs = tl.arange(0, ZB)
    zeros = tl.zeros([ZB], dtype=z_ptr.dtype.element_ty)
    for off in range(0, per, ZB):
        idx = start + off + offs
        tl.store(z_ptr + idx, zeros, mask=idx < z_numel)


@triton.jit(do_not_specialize=["num_pairs", "num_m_blocks", "k_tiles"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, b_desc, a_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, c_scale_ptr,
    N_OUT, K, num_pairs, num_m_blocks, k_tiles,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk,
    stride_cs, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm,
    limit, alpha, z_ptr, z_numel,
    A_DIV: tl.constexpr, C_DIV: tl.constexpr, ALIGN_BM: tl.constexpr,
    GATED: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    MUL_W: tl.constexpr, ATOMIC: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    EVEN_K: tl.constexpr, FP32_IEEE: tl.constexpr, INT_ACC: tl.constexpr, CAST_B: tl.constexpr,
    USE_TMA: tl.constexpr, RESCALE: tl.constexpr, SB_SCALAR: tl.constexpr,
    Q_GROUP: tl.constexpr, Q_POW2: tl.constexpr, BITWISE_FP8: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, PERSISTENT: tl.constexpr, FLATTEN: tl.constexpr, PDL: tl.constexpr,
    BAND_N: tl.constexpr = 0, MASK_A: tl.constexpr = False, PREFETCH_S: tl.constexpr = False,
    EPI_EARLY: tl.constexpr = False, ZERO: tl.constexpr = False, ZB: tl.constexpr = 2048,
    ONE_DOT: tl.constexpr = False, HALF_TAIL: tl.constexpr = False,
    SORTED_A: tl.constexpr = False, SORTED_C: tl.constexpr = False, A_TMA: tl.constexpr = 0,
):
    # ZERO: z [z_numel] (GEMM2's atomic k-sum output) is zeroed by this launch, a share stored
    # at the start of each tile (stores need no wait, so they drain under the K loop; after the
    # tile measured the same). SPLIT_K must be 1 (GEMM1's is).
    if PDL:   # a programmatic dependent launch: every input may come from the kernel before
        gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N_OUT, BLOCK_N)
    if PERSISTENT:
        # grid axis 0 = a few programs per SM, each looping over tiles with a stride of the
        # grid, so one tile's loads overlap the previous tile's epilogue and stores. The loop
        # runs over the m-blocks that exist on the device (num_tokens_post_padded is a
        # multiple of ALIGN_BM, which BLOCK_M divides), not the host's bound: no iteration
        # is spent on, or has to test for, a block past the end, whose expert id is -1.
        # disable_licm: hoisting the tiles' invariant index tensors out of this loop keeps
        # them live across it (triton 3.9 sm90 compile, deepseek-v3 tp8 tiles: GEMM1 173 ->
        # 255 registers, GEMM2 186 -> 235; with it both stay as in the one-tile launch)
        num_m = tl.minimum(tl.load(ntpp_ptr) // BLOCK_M, num_m_blocks)
        if ZERO:   # the tiles that exist share z (none exist: program 0 zeroes it all)
            if num_m * num_pid_n == 0:
                if pid == 0:
                    _zero_share(z_ptr, z_numel, pid, 1, ZB)   # (pid is 0)
        for tile in tl.range(pid, num_m * num_pid_n, tl.num_programs(0), flatten=FLATTEN, disable_licm=True):
            if ZERO:
                _zero_share(z_ptr, z_numel, tile, num_m * num_pid_n, ZB)
            pid_m, pid_n = _tile_coords(tile, num_m, num_pid_n, GROUP_M, BAND_N)
            e = tl.load(expert_ids_ptr + pid_m * BLOCK_M // ALIGN_BM).to(tl.int64)
            _tile_or_half(
                pid_m, pid_n, pid_k, e,
                a_ptr, b_ptr, b_desc, a_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, sorted_ids_ptr,
                c_scale_ptr, N_OUT, K, num_pairs, k_tiles,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk,
                stride_cs, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
                stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm,
                limit, alpha,
                A_DIV, C_DIV, GATED, ACT, HAS_LIMIT, HAS_BIAS, MUL_W, ATOMIC,
                A_SCALE, B_SCALE, GROUP_N, GROUP_K, EVEN_K, FP32_IEEE, INT_ACC, CAST_B, USE_TMA, RESCALE, SB_SCALAR,
                Q_GROUP, Q_POW2, BITWISE_FP8, MASK_A, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PREFETCH_S, EPI_EARLY,
                ONE_DOT, HALF_TAIL, SORTED_A, SORTED_C, A_TMA)
    else:
        if ZERO:   # before any early return: every program of the grid shares z
            _zero_share(z_ptr, z_numel, pid, tl.num_programs(0), ZB)
        pid_m, pid_n = _tile_coords(pid, num_m_blocks, num_pid_n, GROUP_M, BAND_N)
        if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
            return                                    # past the padded total: nothing to do
        e = tl.load(expert_ids_ptr + pid_m * BLOCK_M // ALIGN_BM).to(tl.int64)
        if e < 0:
            return
        if BLOCK_M < ALIGN_BM:
            # a BM sub-block of an alignment block: padding fills the END of an expert's run,
            # so a sub-block whose first slot is the sentinel is all padding: no weight reads
            # for it (GEMM2 BM 64 under GEMM1's BM 128 when most experts have <= 64 rows)
            if tl.load(sorted_ids_ptr + pid_m * BLOCK_M) >= num_pairs:
                return
        _tile_or_half(
            pid_m, pid_n, pid_k, e,
            a_ptr, b_ptr, b_desc, a_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, sorted_ids_ptr,
            c_scale_ptr, N_OUT, K, num_pairs, k_tiles,
            stride_am, stride_ak, stride_be, stride_bn, stride_bk,
            stride_cs, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
            stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk, stride_csm,
            limit, alpha,
            A_DIV, C_DIV, GATED, ACT, HAS_LIMIT, HAS_BIAS, MUL_W, ATOMIC,
            A_SCALE, B_SCALE, GROUP_N, GROUP_K, EVEN_K, FP32_IEEE, INT_ACC, CAST_B, USE_TMA, RESCALE, SB_SCALAR,
            Q_GROUP, Q_POW2, BITWISE_FP8, MASK_A, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, PREFETCH_S, EPI_EARLY,
            ONE_DOT, HALF_TAIL, SORTED_A, SORTED_C, A_TMA)


@triton.jit
def _res_a(a_ptr, rows, stride_am, stride_ak, K, C: tl.constexpr, KC: tl.constexpr):
    """Chunk C (columns [C*KC, (C+1)*KC)) of the program's BM rows of A; zeros past K. Loaded
    evict_first: a program reads its rows once, and the next read of them (the next column band)
    comes after the whole h has streamed by, while the band of the output that the atomic adds hit
    should stay in L2 (H100 deepseek-v3 tp8 T=16384, the kernel alone: bf16 1686 -> 1627 us,
    fp8_block 1314 -> 1285; the layer 0.5-1% faster)."""
    offs_k = C * KC + tl.arange(0, KC)
    return tl.load(a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak,
                   mask=(offs_k < K)[None, :], other=0.0, eviction_policy="evict_first")


@triton.jit
def _res_as(a_scale_ptr, rows, stride_asm, stride_ask, C: tl.constexpr, A_SCALE: tl.constexpr):
    """The A scale a chunk's dot is multiplied by: the rows' scales of K group C (block
    scales, A_SCALE 3); 1 otherwise (per-tensor / per-row scales go to the epilogue)."""
    if A_SCALE == 3:
        s = tl.load(a_scale_ptr + rows * stride_asm + C * stride_ask).to(tl.float32)   # [BM]
    else:
        s = 1.0
    return s


@triton.jit
def _res_step(acc, a, sa, b_ptr, b_desc, b_scale_ptr, e, pid_n, offs_bn, K, N_OUT,
              stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
              C: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, SB_SCALAR: tl.constexpr,
              FP32_IEEE: tl.constexpr, INT_ACC: tl.constexpr, USE_TMA: tl.constexpr,
              KC: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc + A chunk C @ the tile's weight chunk C. Block scales (B_SCALE 3): the chunk is one
    K group, its dot gets a tile of its own, scaled by the rows' and the columns' group
    scales into the fp32 accumulator; else the dot accumulates in place (int32 for int8)."""
    if USE_TMA:                  # rows past the expert's N only feed masked columns
        b = tl.trans(b_desc.load([(e * N_OUT + pid_n * BLOCK_N).to(tl.int32), C * KC]))   # [KC, BN]
    else:
        offs_k = C * KC + tl.arange(0, KC)
        b = tl.load(b_ptr + e * stride_be + offs_bn[None, :] * stride_bn + offs_k[:, None] * stride_bk,
                    mask=(offs_k < K)[:, None], other=0.0)
    if B_SCALE == 3:
        if SB_SCALAR:            # BN inside one scale group of N: one scale a (tile, group)
            sb = tl.load(b_scale_ptr + e * stride_bse + (pid_n * BLOCK_N // GROUP_N) * stride_bsn
                         + C * stride_bsk).to(tl.float32)
            s = sa[:, None] * sb
        else:
            sb = tl.load(b_scale_ptr + e * stride_bse + (offs_bn // GROUP_N) * stride_bsn
                         + C * stride_bsk).to(tl.float32)
            s = sa[:, None] * sb[None, :]
        d = _dot(a, b, None, FP32_IEEE, INT_ACC).to(tl.float32) * s
        if C == 0:
            acc = d
        else:
            acc += d
    elif C == 0:
        acc = _dot(a, b, None, FP32_IEEE, INT_ACC)
    else:
        acc = _dot(a, b, acc, FP32_IEEE, INT_ACC)
    return acc


@triton.jit(do_not_specialize=["num_pairs", "num_m_blocks"])
def _moe_gemm2_resident_kernel(
    a_ptr, b_ptr, b_desc, c_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr,
    ntpp_ptr,
    N_OUT, K, num_pairs, num_m_blocks,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    ALIGN_BM: tl.constexpr, HAS_BIAS: tl.constexpr, MUL_W: tl.constexpr, USE_TMA: tl.constexpr,
    FP32_IEEE: tl.constexpr, INT_ACC: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, SB_SCALAR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KC: tl.constexpr, NKC: tl.constexpr,
    N_TILES: tl.constexpr, PDL: tl.constexpr, ATOMIC: tl.constexpr = False, C_DIV: tl.constexpr = 1,
    BAND_MAJOR: tl.constexpr = False,
):
    """GEMM2 with A resident (config A_RESIDENT = N_TILES): program (m-block, group g) loads
    its BM rows of h once, all of K, as NKC <= 4 chunks of KC columns (a power of two <= 256,
    a TMA box's limit; with block scales one chunk = one K group), then loops over the
    N_TILES column tiles of group g: per tile NKC weight chunks [BN, KC], NKC dots, the
    epilogue (scales, bias, routing weight) and the y store. Why: with a small K (deepseek-v3
    tp8: I = 256) the one-tile program spends most of its time filling its pipeline and
    draining its stores (ncu); here the loop's weight loads
    are software-pipelined across tiles (num_stages), so a tile's loads fly during the
    previous tile's epilogue, and A crosses L2 once per program, not once per tile.
    Operands of one dtype: 16-bit (no scales) or 8-bit with per-tensor (A_SCALE / B_SCALE 1),
    per-row / per-column (2) or block (3) scales; no split. Output: y rows (slots), or with
    ATOMIC an atomic add into row slot // C_DIV (``_launch`` checks)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    groups = tl.cdiv(tl.cdiv(N_OUT, BLOCK_N), N_TILES)
    if BAND_MAJOR:      # every m-block of column band g before band g + 1: with ATOMIC, the band
        g = pid // num_m_blocks      # of the output being added to can stay in L2
        pid_m = pid % num_m_blocks
    else:
        pid_m = pid // groups
        g = pid % groups
    if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
        return
    e = tl.load(expert_ids_ptr + pid_m * BLOCK_M // ALIGN_BM).to(tl.int64)
    if e < 0:
        return
    if BLOCK_M < ALIGN_BM:          # an all-padding sub-block (see _moe_gemm_kernel)
        if tl.load(sorted_ids_ptr + pid_m * BLOCK_M) >= num_pairs:
            return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + offs_m)                                    # [BM]
    row_ok = slots < num_pairs
    rows = tl.where(row_ok, slots, 0).to(tl.int64)                              # padding reads row 0
    # the resident rows: chunks 1..3 alias chunk 0 when NKC is smaller (never used then)
    a0 = _res_a(a_ptr, rows, stride_am, stride_ak, K, 0, KC)                    # [BM, KC]
    sa0 = _res_as(a_scale_ptr, rows, stride_asm, stride_ask, 0, A_SCALE)
    a1, a2, a3 = a0, a0, a0
    sa1, sa2, sa3 = sa0, sa0, sa0
    if NKC > 1:
        a1 = _res_a(a_ptr, rows, stride_am, stride_ak, K, 1, KC)
        sa1 = _res_as(a_scale_ptr, rows, stride_asm, stride_ask, 1, A_SCALE)
    if NKC > 2:
        a2 = _res_a(a_ptr, rows, stride_am, stride_ak, K, 2, KC)
        sa2 = _res_as(a_scale_ptr, rows, stride_asm, stride_ask, 2, A_SCALE)
    if NKC > 3:
        a3 = _res_a(a_ptr, rows, stride_am, stride_ak, K, 3, KC)
        sa3 = _res_as(a_scale_ptr, rows, stride_asm, stride_ask, 3, A_SCALE)
    if A_SCALE == 1:                # per-tensor / per-row activation scales: the epilogue's
        sa_out = tl.load(a_scale_ptr).to(tl.float32)
    elif A_SCALE == 2:
        sa_out = tl.load(a_scale_ptr + rows * stride_asm).to(tl.float32)[:, None]
    if B_SCALE == 1:
        sb_e = tl.load(b_scale_ptr + e * stride_bse).to(tl.float32)
    if MUL_W:
        w = tl.load(topk_w_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    c_rows = c_ptr + (rows // C_DIV)[:, None] * stride_cm
    for j in tl.range(0, N_TILES):
        pid_n = g * N_TILES + j
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_bn = offs_n % N_OUT     # wrapped columns (a group past N): loads need no N mask
        acc = _res_step(None, a0, sa0, b_ptr, b_desc, b_scale_ptr, e, pid_n, offs_bn, K, N_OUT,
                        stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
                        0, B_SCALE, GROUP_N, SB_SCALAR, FP32_IEEE, INT_ACC, USE_TMA, KC, BLOCK_N)
        if NKC > 1:
            acc = _res_step(acc, a1, sa1, b_ptr, b_desc, b_scale_ptr, e, pid_n, offs_bn, K, N_OUT,
                            stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
                            1, B_SCALE, GROUP_N, SB_SCALAR, FP32_IEEE, INT_ACC, USE_TMA, KC, BLOCK_N)
        if NKC > 2:
            acc = _res_step(acc, a2, sa2, b_ptr, b_desc, b_scale_ptr, e, pid_n, offs_bn, K, N_OUT,
                            stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
                            2, B_SCALE, GROUP_N, SB_SCALAR, FP32_IEEE, INT_ACC, USE_TMA, KC, BLOCK_N)
        if NKC > 3:
            acc = _res_step(acc, a3, sa3, b_ptr, b_desc, b_scale_ptr, e, pid_n, offs_bn, K, N_OUT,
                            stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
                            3, B_SCALE, GROUP_N, SB_SCALAR, FP32_IEEE, INT_ACC, USE_TMA, KC, BLOCK_N)
        acc = acc.to(tl.float32)
        if A_SCALE == 1 or A_SCALE == 2:
            acc *= sa_out
        if B_SCALE == 1:
            acc *= sb_e
        elif B_SCALE == 2:
            acc *= tl.load(b_scale_ptr + e * stride_bse + offs_bn * stride_bsn).to(tl.float32)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + e * stride_bias_e + offs_bn * stride_bias_n).to(tl.float32)[None, :]
        if MUL_W:
            acc *= w
        if ATOMIC:
            tl.atomic_add(c_rows + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
                          mask=row_ok[:, None] & (offs_n < N_OUT)[None, :], sem="relaxed")
        else:
            tl.store(c_rows + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & (offs_n < N_OUT)[None, :])


@triton.jit(do_not_specialize=["num_global"])
def _moe_reduce_kernel(y_ptr, out_ptr, ids_ptr, map_ptr, H, num_global, E,
                       stride_ys, stride_ym, stride_om,
                       TOP_K: tl.constexpr, SPLIT_K: tl.constexpr, HAS_MAP: tl.constexpr,
                       BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    """out[t] = sum over kept slots j (then splits) of y[split, t*k + j]: a fixed order."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        s = t * TOP_K + j
        g = tl.load(ids_ptr + s).to(tl.int32)
        if HAS_MAP:
            loc = tl.load(map_ptr + g, mask=(g >= 0) & (g < num_global), other=-1)
        else:
            loc = g
        # dropped slots were never written: do not read them (mask limit 0, not a scalar
        # '&', which the interpreter turns into an int32 mask)
        h_lim = tl.where((loc >= 0) & (loc < E), H, 0)
        for sp in tl.static_range(SPLIT_K):
            acc += tl.load(y_ptr + sp * stride_ys + s * stride_ym + offs, mask=offs < h_lim, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=offs < H)


@triton.jit(do_not_specialize=["num_pairs"])
def _gather_rows_kernel(x_ptr, out_ptr, sorted_ids_ptr, ntpp_ptr, num_pairs, H, stride_xm, stride_xh, stride_om,
                        A_DIV: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    """out[p] = x[sorted_ids[p] // A_DIV] for the ROWS positions p of this program below the
    padded total; zeros for padding positions; nothing past the total."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    p0 = tl.program_id(0) * ROWS
    ntpp = tl.load(ntpp_ptr)
    if p0 >= ntpp:
        return
    offs_r = p0 + tl.arange(0, ROWS)
    live = offs_r < ntpp
    slots = tl.load(sorted_ids_ptr + offs_r, mask=live, other=num_pairs)
    ok = slots < num_pairs
    src = tl.where(ok, slots // A_DIV, 0).to(tl.int64)
    dst = offs_r.to(tl.int64)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        h_ok = offs_h < H
        v = tl.load(x_ptr + src[:, None] * stride_xm + offs_h[None, :] * stride_xh, mask=ok[:, None] & h_ok[None, :],
                    other=0.0)
        tl.store(out_ptr + dst[:, None] * stride_om + offs_h[None, :], v, mask=live[:, None] & h_ok[None, :])


def gather_sorted(x: torch.Tensor, align: AlignResult, top_k: int, out: Optional[torch.Tensor] = None,
                  pdl: bool = False) -> torch.Tensor:
    """x in sorted order for ``gemm1_act(x_sorted=True)``: out [align.max_padded, H], row p =
    x[sorted_ids[p] // top_k] for every position below the padded total, zeros for padding
    positions (rows past the total are not written). One launch, no host sync."""
    T, H = x.shape
    if out is None:
        out = torch.empty(align.max_padded, H, dtype=x.dtype, device=x.device)
    if out.shape[0] < align.max_padded or out.shape[1] != H or out.stride(1) != 1:
        raise ValueError(f"gather_sorted: out must be [>= {align.max_padded}, {H}] with unit column stride, "
                         f"got {tuple(out.shape)} strides {out.stride()}")
    rows = 4
    if T == 0 or align.max_padded == 0:
        return out
    block_h = min(next_power_of_2(H), 4096 // x.element_size())
    launch(_gather_rows_kernel, (cdiv(align.max_padded, rows),), (
        x, out, align.sorted_ids, align.num_tokens_post_padded, align.num_pairs, H, x.stride(0), x.stride(1),
        out.stride(0),
    ), dict(A_DIV=top_k, ROWS=rows, BLOCK_H=block_h, PDL=pdl), num_warps=4, launch_pdl=pdl)
    return out


# ----------------------------------------------------------------------------------------
def _cfg(config: dict):
    return (config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"],
            config.get("GROUP_SIZE_M", 1), config.get("num_warps", 4), config.get("num_stages", 3),
            config.get("SPLIT_K", 1))


def _tma_ok(b: torch.Tensor) -> bool:
    """A TMA descriptor needs a contiguous K, 16-byte aligned rows and base, and E*N < 2^31."""
    return (b.is_contiguous() and (b.shape[2] * b.element_size()) % 16 == 0 and b.data_ptr() % 16 == 0
            and b.shape[0] * b.shape[1] < 2 ** 31)


def _launch(a, b, c, align: AlignResult, *, n_out, a_div, c_div, act, config, bias=None,
            topk_weights=None, atomic=False, stride_cs=0, swiglu_limit=None, alpha=1.702, limit=7.0,
            quant="none", a_scale=None, b_scale=None, block_shape=None, pdl=False,
            a_group=None, out_scale=None, out_group=0, out_pow2=False, zero=None, a_sorted=False,
            c_sorted=False):
    BM, BN, BK, GM, warps, stages, split = _cfg(config)
    K = a.shape[1]
    if a_sorted or c_sorted:   # (see gemm1_act's out_sorted, gemm2's h_sorted)
        rows = align.max_padded
        if config.get("A_RESIDENT", 0) or quant != "none" or out_group or a_group:
            raise ValueError("a sorted x / h (config SORTED_X / SORTED_H) is for 16-bit operands without scales "
                             "and the tiled kernel (not A_RESIDENT)")
        if (a_sorted and a.shape[0] < rows) or (c_sorted and c.shape[0] < rows):
            raise ValueError(f"a sorted x / h needs {rows} rows (the alignment's padded bound), "
                             f"got {(a if a_sorted and a.shape[0] < rows else c).shape[0]}")
    if config.get("A_RESIDENT", 0):
        return _launch_resident(a, b, c, align, n_out=n_out, config=config, bias=bias, topk_weights=topk_weights,
                                quant=quant, a_scale=a_scale, b_scale=b_scale, block_shape=block_shape, pdl=pdl,
                                atomic=atomic, c_div=c_div,
                                generic_ok=(act == _NO_ACT and a_div == 1 and split == 1
                                            and (c_div == 1 or atomic) and not out_group and not a_group))
    assert quant != "block" or block_shape[1] % BK == 0, "BLOCK_SIZE_K must divide the scale block bk"
    assert not a_group or a_group % BK == 0, "BLOCK_SIZE_K must divide the activation scale group"
    assert not out_group or BN % out_group == 0, "BLOCK_SIZE_N must hold whole output scale groups"
    num_m_blocks = align.max_padded // BM
    if num_m_blocks == 0 or n_out == 0:
        if zero is not None:
            zero.zero_()
        return
    assert zero is None or (split == 1 and zero.is_contiguous()), "zero= needs SPLIT_K 1 and a contiguous tensor"
    k_tiles = cdiv(cdiv(K, BK), split)                                      # K tiles per split
    a_mode, b_mode, gn, gk, sa, sb, sam, sak, sbe, sbn, sbk = _scale_args(quant, a_scale, b_scale, block_shape, a, b,
                                                                           a_group)
    tiles = num_m_blocks * cdiv(n_out, BN)                 # per split; the device skips those past ntpp
    persistent = config.get("PERSISTENT", 0)
    assert persistent >= 0, "PERSISTENT is a number of programs per SM (0: one program per tile)"
    band_n = config.get("BAND_N", 0)
    assert isinstance(band_n, int) and band_n >= 0, "BAND_N is a number of column tiles per band (0: no bands)"
    if persistent:   # PERSISTENT programs per SM in all, spread over the splits
        grid = (min(cdiv(persistent * _num_sms(a.device), split), tiles), split)
    else:
        grid = (tiles, split)
    # RESCALE: block scales applied to the accumulator in place (see _gemm_tile); an int8 x
    # int8 dot cannot accumulate into fp32, so that pair keeps the separate per-group dot
    rescale = 3 in (a_mode, b_mode) and bool(config.get("RESCALE", False)) and not (
        a.dtype == torch.int8 and b.dtype == torch.int8)
    b_desc = None
    # GU_ONE_DOT: a gated GEMM's gate and up tiles in one dot of width 2 BN (see _gemm_tile);
    # needs the TMA descriptor, and not block scales (their per-group dots stay apart)
    one_dot = (bool(config.get("GU_ONE_DOT", False)) and act in (0, 1, 2, 3) and 3 not in (a_mode, b_mode)
               and b.shape[1] == 2 * n_out)
    if config.get("USE_TMA", False) and TensorDescriptor is not None and _tma_ok(b):
        if one_dot:
            b_desc = TensorDescriptor.from_tensor(b.view(2 * b.shape[0], n_out, b.shape[2]), [2, BN, BK])
        else:
            b_desc = TensorDescriptor.from_tensor(b.view(-1, b.shape[2]), [BN, BK])  # [E*N, K]
    one_dot = one_dot and b_desc is not None
    # A in sorted order (GEMM2's h with SORTED_H): its [BM, BK] boxes through a TMA descriptor
    # too when the weights go through one; the half tiles of HALF_TAIL load it by pointer
    a_desc = None
    if a_sorted and b_desc is not None and _tma_ok(a.unsqueeze(0)):
        a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    # HALF_TAIL: a tile whose second half is padding runs at half height (_tile_or_half); a
    # half of at least 16 rows (the smallest MMA tile), one tile a program or persistent
    # without FLATTEN (the tile loop's body must be the K loop itself to be flattened)
    half_tail = (bool(config.get("HALF_TAIL", False)) and BM >= 32
                 and not (persistent and config.get("FLATTEN")))
    a_dt, b_dt = a.dtype, b.dtype
    s_am, s_ak = a.stride()[:2]                      # one stride() call per tensor, not one per dim
    s_be, s_bn, s_bk = b.stride()[:3]
    s_cm, s_cn = c.stride()[:2]
    s_bias_e, s_bias_n = bias.stride()[:2] if bias is not None else (0, 0)
    # positional: every non-constexpr parameter of _moe_gemm_kernel, in signature order
    launch(_moe_gemm_kernel, grid, (
        a, b, b_desc, a_desc, _q_arg(c) if out_group else c, bias if bias is not None else a, sa, sb,
        topk_weights if topk_weights is not None else a, align.sorted_ids, align.expert_ids, align.num_tokens_post_padded,
        out_scale if out_group else a,
        n_out, K, align.num_pairs, num_m_blocks, k_tiles,
        s_am, s_ak, s_be, s_bn, s_bk,
        stride_cs, s_cm, s_cn, s_bias_e, s_bias_n,
        sam, sak, sbe, sbn, sbk, out_scale.stride(0) if out_group else 0,
        float(swiglu_limit if swiglu_limit is not None else limit), float(alpha),
        zero if zero is not None else a, zero.numel() if zero is not None else 0,
    ), dict(
        A_DIV=a_div, C_DIV=c_div, ALIGN_BM=align.block_m,
        GATED=act in (0, 1, 2, 3), ACT=act, HAS_LIMIT=swiglu_limit is not None, HAS_BIAS=bias is not None,
        MUL_W=topk_weights is not None, ATOMIC=atomic,
        A_SCALE=a_mode, B_SCALE=b_mode, GROUP_N=gn, GROUP_K=gk,
        EVEN_K=K % BK == 0, FP32_IEEE=a_dt == torch.float32,
        INT_ACC=a_dt == torch.int8 and b_dt == torch.int8 and 3 not in (a_mode, b_mode),
        CAST_B=b_dt != a_dt, USE_TMA=b_desc is not None, RESCALE=rescale,
        SB_SCALAR=rescale and b_mode == 3 and gn % BN == 0 and n_out % gn == 0,   # tiles inside one group
        Q_GROUP=out_group, Q_POW2=bool(out_pow2), BITWISE_FP8=bool(out_group) and _bitwise_fp8(c),
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM, SPLIT_K=split,
        PERSISTENT=persistent > 0, FLATTEN=persistent > 0 and bool(config.get("FLATTEN", False)), PDL=pdl,
        BAND_N=band_n, MASK_A=mask_a_rule(config, align.num_pairs, b.shape[0], BM),
        PREFETCH_S=rescale,
        EPI_EARLY=epilogue_loads_early(a_dt),
        ZERO=zero is not None, ONE_DOT=one_dot, HALF_TAIL=half_tail,
        SORTED_A=bool(a_sorted), SORTED_C=bool(c_sorted), A_TMA=BM if a_desc is not None else 0,
    ), num_warps=warps, num_stages=stages, launch_pdl=pdl)


def epilogue_loads_early(a_dtype: torch.dtype) -> bool:
    """Whether the tiled kernel with A of ``a_dtype`` loads its epilogue scales and routing
    weights before its K loop (EPI_EARLY; bitwise the same output either way): where A is
    int8. H100, two alternating rounds: qwen3 int8_channel T=4096 550.9 -> 546.9 us, T=16384
    1787 -> 1768; fp8_channel 0.3-1.5% slower, bf16 and Mixtral within noise."""
    return a_dtype == torch.int8


_RESIDENT_MAX_CHUNKS = 4     # resident A chunks a program holds (the kernel names a0..a3)
_RESIDENT_MAX_KC = 256        # a chunk's columns: a TMA box dimension's limit


MASK_A_MAX_BLOCKS = 4   # mask_a_rule: pairs per local expert up to this many BLOCK_SIZE_M


def mask_a_rule(config: dict, num_pairs: int, num_experts: int, block_m: int) -> bool:
    """Whether the tiled kernel masks its padding rows' A loads (MASK_A): the config's key
    when it has one, else on while the pairs per local expert are at most MASK_A_MAX_BLOCKS
    blocks, where padding is a large share of each expert's rows. H100:
    Mixtral T=256 / 1024 4.6 / 5.4% faster masked; at T=16384 (32 blocks an
    expert) ~5% slower. With an expert map the pairs routed to other ranks count too, so the
    rule leans towards off there."""
    if "MASK_A" in config:
        return bool(config["MASK_A"])
    return num_pairs <= MASK_A_MAX_BLOCKS * block_m * max(num_experts, 1)


def resident_chunks(K: int, itemsize: int, block_k: Optional[int] = None) -> Optional[tuple]:
    """(KC, NKC) of the A-resident GEMM2 for reduction size K: K in NKC <= 4 chunks of KC
    columns (a power of two <= 256; 8-bit dots need KC >= 32); with block scales of K group
    ``block_k`` one chunk is one group. None when K does not fit that."""
    if block_k is not None:
        kc = block_k
        if kc & (kc - 1) or not 32 <= kc <= _RESIDENT_MAX_KC:
            return None
    else:
        kc = min(_RESIDENT_MAX_KC, max(32 if itemsize == 1 else 16, next_power_of_2(K)))
    nkc = cdiv(K, kc)
    return (kc, nkc) if 1 <= nkc <= _RESIDENT_MAX_CHUNKS else None


def _launch_resident(a, b, c, align, *, n_out, config, bias, topk_weights, quant, a_scale, b_scale, block_shape,
                     pdl, generic_ok, atomic=False, c_div=1):
    """``_moe_gemm2_resident_kernel``: one program per (m-block, group of A_RESIDENT column tiles)."""
    BM, BN, _, _, warps, stages, _ = _cfg(config)
    n_tiles = config["A_RESIDENT"]
    K = a.shape[1]
    eight_bit = a.dtype.itemsize == 1
    a_mode, b_mode, gn, gk, sa, sb, sam, sak, sbe, sbn, sbk = _scale_args(quant, a_scale, b_scale, block_shape, a, b)
    if eight_bit:    # 8-bit x 8-bit: both scales; block scales on both sides or on neither
        scales_ok = a_mode in (1, 2, 3) and b_mode in (1, 2, 3) and (a_mode == 3) == (b_mode == 3)
    else:
        scales_ok = a_mode == 0 and b_mode == 0
    chunks = resident_chunks(K, a.element_size(), gk if b_mode == 3 else None)
    if not (generic_ok and a.dtype == b.dtype and scales_ok and chunks is not None):
        raise ValueError(
            "config A_RESIDENT is for GEMM2 with operands of one dtype (16-bit without scales, or 8-bit with "
            "per-tensor, per-channel or block scales on both), no split, and K <= "
            f"{_RESIDENT_MAX_CHUNKS * _RESIDENT_MAX_KC} (block scales: K <= {_RESIDENT_MAX_CHUNKS} groups of 32..256) "
            f"(got K = {K}, quant {quant!r}, {a.dtype} x {b.dtype}); drop A_RESIDENT from the config")
    assert isinstance(n_tiles, int) and n_tiles >= 1, "A_RESIDENT is a number of column tiles per program (>= 1)"
    kc, nkc = chunks
    num_m_blocks = align.max_padded // BM
    if num_m_blocks == 0 or n_out == 0:
        return
    groups = cdiv(cdiv(n_out, BN), n_tiles)
    b_desc = None
    if config.get("USE_TMA", False) and TensorDescriptor is not None and _tma_ok(b):
        b_desc = TensorDescriptor.from_tensor(b.view(-1, b.shape[2]), [BN, kc])   # [E*N, K]
    s_am, s_ak = a.stride()[:2]
    s_be, s_bn, s_bk = b.stride()[:3]
    s_cm, s_cn = c.stride()[:2]
    s_bias_e, s_bias_n = bias.stride()[:2] if bias is not None else (0, 0)
    launch(_moe_gemm2_resident_kernel, (num_m_blocks * groups,), (
        a, b, b_desc, c, bias if bias is not None else a, sa, sb, topk_weights if topk_weights is not None else a,
        align.sorted_ids, align.expert_ids, align.num_tokens_post_padded,
        n_out, K, align.num_pairs, num_m_blocks,
        s_am, s_ak, s_be, s_bn, s_bk, s_cm, s_cn, s_bias_e, s_bias_n, sam, sak, sbe, sbn, sbk,
    ), dict(ALIGN_BM=align.block_m, HAS_BIAS=bias is not None, MUL_W=topk_weights is not None,
            USE_TMA=b_desc is not None, FP32_IEEE=a.dtype == torch.float32,
            INT_ACC=a.dtype == torch.int8, A_SCALE=a_mode, B_SCALE=b_mode, GROUP_N=gn,
            SB_SCALAR=b_mode == 3 and gn % BN == 0 and n_out % gn == 0,
            BLOCK_M=BM, BLOCK_N=BN, KC=kc, NKC=nkc, N_TILES=n_tiles, PDL=pdl, ATOMIC=atomic, C_DIV=c_div,
            BAND_MAJOR=bool(config.get("BAND_MAJOR", False))),
        num_warps=warps, num_stages=stages, launch_pdl=pdl)


def gemm1_act(x: torch.Tensor, w13: torch.Tensor, align: AlignResult, top_k: int, activation: str,
              out: Optional[torch.Tensor] = None, *, bias: Optional[torch.Tensor] = None,
              swiglu_limit: Optional[float] = None, alpha: float = 1.702, limit: float = 7.0,
              config: dict, quant: str = "none", a_scale: Optional[torch.Tensor] = None,
              b_scale: Optional[torch.Tensor] = None, block_shape: Optional[tuple] = None,
              pdl: bool = False, out_group: int = 0, out_scale: Optional[torch.Tensor] = None,
              out_pow2: bool = False, zero: Optional[torch.Tensor] = None, out_sorted: bool = False,
              x_sorted: bool = False):
    """h [n, I] = act(x[s // k] @ w13[e]^T + bias[e]) for every aligned slot s (halves layout).

    x [T, H]; w13 [E, 2I, H] (gated) or [E, I, H] (*_no_mul); bias [E, N] or None.
    ``activation``: silu (``swiglu_limit`` clamps), gelu, gelu_tanh, swigluoai (``alpha``,
    ``limit``), relu2_no_mul, silu_no_mul, gelu_no_mul. Rows of dropped slots are not
    written. ``out`` defaults to [n, I] in x's dtype (bf16 for fp8/int8 x).
    config SPLIT_K is ignored (the activation is not linear).
    Quantized operands: ``quant`` 'tensor' (a_scale [1], b_scale [E]), 'channel' (a_scale
    [T, 1], b_scale [E, N]), 'block' (a_scale [T, H/bk], b_scale [E, N/bn, H/bk],
    ``block_shape`` = (bn, bk)); a_scale None = 16-bit x with 8-bit weights (weight-only).
    ``pdl`` (sm90+, triton with griddepcontrol): a programmatic dependent launch (its
    programs may start while the previous kernel drains, and wait for it before any load).
    ``out_group`` g > 0: h leaves the epilogue quantized to fp8 e4m3 in 1 x g groups (the
    reference's ``quant_fp8_group(h, g, out_pow2)`` of the fp32 tile; config BLOCK_SIZE_N a
    multiple of g), and the call returns (h fp8 [n, I], scale fp32 [n, ceil(I/g)]), written
    into ``out`` / ``out_scale`` when given. Otherwise it returns h.
    ``zero``: a contiguous tensor (GEMM2's atomic k-sum output) this launch also fills with
    zeros, a share a tile, so that no launch of its own has to (the stores drain under the K
    loops of a GEMM that is compute or L2 bound). It must not overlap x, w13 or h.
    ``out_sorted``: h [align.max_padded, I] in sorted order instead, row p = sorted position p
    (the slot ``align.sorted_ids[p]``; padding rows hold finite values of no meaning, rows
    past the padded total are not written), for ``gemm2(h_sorted=True)``. 16-bit only.
    ``x_sorted``: x is ``gather_sorted``'s [align.max_padded, H] in sorted order: its rows are
    read where they lie (by TMA with USE_TMA) instead of gathered by token. 16-bit only.
    """
    act = ACTIVATIONS[activation]
    gated = act <= 3
    n_out = w13.shape[1] // 2 if gated else w13.shape[1]
    if out is None:
        dt = torch.float8_e4m3fn if out_group else _compute_dtype(x)
        rows = align.max_padded if out_sorted else align.num_pairs if x_sorted else x.shape[0] * top_k
        out = torch.empty(rows, n_out, dtype=dt, device=x.device)                 # [n, I]
    if out_group and out_scale is None:
        out_scale = torch.empty(out.shape[0], cdiv(n_out, out_group), dtype=torch.float32, device=x.device)
    if config.get("SPLIT_K", 1) != 1:
        config = dict(config, SPLIT_K=1)   # a split before a nonlinear epilogue would be wrong
    _launch(x, w13, out, align, n_out=n_out, a_div=top_k, c_div=1, act=act, config=config, bias=bias,
            swiglu_limit=swiglu_limit, alpha=alpha, limit=limit,
            quant=quant, a_scale=a_scale, b_scale=b_scale, block_shape=block_shape, pdl=pdl,
            out_scale=out_scale, out_group=out_group, out_pow2=out_pow2, zero=zero, c_sorted=out_sorted,
            a_sorted=x_sorted)
    return (out, out_scale) if out_group else out


def sorted_x(config1: dict) -> bool:
    """Whether GEMM1's config asks for x in sorted order (config key SORTED_X: ``gather_sorted``
    copies x's rows to the sorted positions, one launch, and GEMM1 reads them where they lie,
    by TMA with USE_TMA, instead of gathering them by token in its K loop). 16-bit x only
    (the caller's part)."""
    return bool(config1.get("SORTED_X", False))


def sorted_h(config2: dict) -> bool:
    """Whether GEMM2's config asks for h in sorted order (config key SORTED_H: GEMM1 writes h
    [max_padded, I] at the sorted positions, GEMM2 reads its rows where they lie, by TMA with
    USE_TMA, instead of gathering them by slot). 16-bit h only (the caller's part); not with
    A_RESIDENT, whose kernel gathers its rows."""
    return bool(config2.get("SORTED_H", False)) and not config2.get("A_RESIDENT", 0)


def gemm2_workspace_spec(num_tokens: int, top_k: int, hidden: int, config: dict, reduce: str,
                         out_dtype: torch.dtype):
    """(shape, dtype) of the scratch ``gemm2`` needs, or None.

    deterministic: y [S, n, H] in out_dtype (fp32 when S > 1: the splits are summed later);
    atomic: an fp32 [T, H] accumulator unless ``out`` itself is fp32; atomic_out: none.
    """
    split = config.get("SPLIT_K", 1)
    if reduce == "deterministic":
        return (split, num_tokens * top_k, hidden), (out_dtype if split == 1 else torch.float32)
    if out_dtype == torch.float32 or reduce == "atomic_out":
        return None
    return (num_tokens, hidden), torch.float32


def gemm2(h: torch.Tensor, w2: torch.Tensor, align: AlignResult, topk_weights: torch.Tensor,
          out: Optional[torch.Tensor] = None, *, mul_routed_weight: bool = True,
          bias: Optional[torch.Tensor] = None, config: dict, reduce: str = "deterministic",
          workspace: Optional[torch.Tensor] = None, quant: str = "none",
          a_scale: Optional[torch.Tensor] = None, b_scale: Optional[torch.Tensor] = None,
          block_shape: Optional[tuple] = None, pdl: bool = False, a_group: Optional[int] = None,
          out_zeroed: bool = False, h_sorted: bool = False) -> torch.Tensor:
    """out [T, H] = sum_j topk_weights[t, j] * (h[s] @ w2[e]^T + bias[e]) over kept slots.

    h [n, I]; w2 [E, H, I]; topk_weights fp32 [T, k]; bias [E, H] or None. ``reduce``:
    'deterministic' (bitwise reproducible), 'atomic' or 'atomic_out' (see the module
    docstring; both zero ``out`` first and run GEMM2 as an ordinary launch). ``workspace`` as described by
    ``gemm2_workspace_spec`` (allocated when None). Tokens with no kept slot get zeros.
    ``quant`` / scales as in ``gemm1_act`` with M = n rows of h and K = I. ``pdl``: GEMM2
    and the reduce as programmatic dependent launches (as in ``gemm1_act``). ``a_group`` g:
    a_scale [n, ceil(I/g)] holds 1 x g group scales of h (``gemm1_act``'s ``out_group``)
    whatever ``quant`` says of w2 (BLOCK_SIZE_K must divide g; RESCALE applies).
    ``out_zeroed``: the caller has already zeroed ``out`` earlier in the stream (e.g. the
    quantization of x, ``quant_fp8_token(zero=out)``): an atomic sum straight into ``out``
    then skips its own zeroing and keeps ``pdl`` (the zeroing was ordered before the kernel
    GEMM2 depends on). Ignored by the other reduce modes.
    ``h_sorted``: h is ``gemm1_act(out_sorted=True)``'s [align.max_padded, I] in sorted order:
    its rows are read where they lie (no gather), through a TMA descriptor when the config's
    USE_TMA gives the weights one. 16-bit h without scales, the tiled kernel.
    """
    T, k = topk_weights.shape
    H = w2.shape[1]
    if out is None:
        out = torch.empty(T, H, dtype=_compute_dtype(h), device=h.device)        # [T, H]
    if T == 0:
        return out
    spec = gemm2_workspace_spec(T, k, H, config, reduce, out.dtype)
    if spec is not None and workspace is None:
        workspace = torch.empty(spec[0], dtype=spec[1], device=h.device)
    if reduce not in REDUCE_MODES:
        raise ValueError(f"reduce must be one of {REDUCE_MODES} (got {reduce!r})")
    atomic = reduce != "deterministic"
    if atomic:
        c = out if spec is None else workspace                                   # [T, H]
        if not (out_zeroed and c is out):
            c.zero_()
            pdl = False      # its programs must not start before the zeroing is done
        c_div, stride_cs = k, 0
    else:
        c, c_div, stride_cs = workspace[0], 1, workspace.stride(0)               # y [S, n, H]
    _launch(h, w2, c, align, n_out=H, a_div=1, c_div=c_div, act=_NO_ACT, config=config, bias=bias,
            topk_weights=topk_weights if mul_routed_weight else None, atomic=atomic, stride_cs=stride_cs,
            quant=quant, a_scale=a_scale, b_scale=b_scale, block_shape=block_shape, pdl=pdl, a_group=a_group,
            a_sorted=h_sorted)
    if not atomic:
        moe_reduce(workspace, out, align, pdl=pdl)
    elif c is not out:
        out.copy_(c)
    return out


def moe_reduce(y: torch.Tensor, out: torch.Tensor, align: AlignResult, pdl: bool = False) -> torch.Tensor:
    """out [T, H] = sum over kept slots and splits of y [S, n, H]; dropped slots read as 0.
    ``pdl``: a programmatic dependent launch (as in ``gemm1_act``)."""
    T, H = out.shape
    ids = align.topk_ids
    k = ids.shape[1]
    ids = ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    emap = align.expert_map
    has_map = emap is not None
    block_h = min(next_power_of_2(H), 1024)
    s_ys, s_ym = y.stride()[:2]
    launch(_moe_reduce_kernel, (T, cdiv(H, block_h)), (
        y, out, ids, emap if has_map else ids, H,
        emap.numel() if has_map else align.num_experts, align.num_experts,
        s_ys, s_ym, out.stride(0),
    ), dict(TOP_K=k, SPLIT_K=y.shape[0], HAS_MAP=has_map, BLOCK_H=block_h, PDL=pdl), num_warps=4,
        launch_pdl=pdl)
    return out


# ----------------------------------------------------------------------------------------
def default_config(T: int, E: int, N: int, H: int, top_k: int, dtype=torch.bfloat16, *,
                   gemm: str = "gemm1", gated: bool = True, num_sms: int = 132,
                   block_shape: Optional[tuple] = None) -> dict:
    """Shape-aware launch config when no tuned one exists.

    N = rows of w13 (2I gated, I otherwise); ``gemm`` picks GEMM1 (out I, K = H) or GEMM2
    (out H, K = I); ``dtype`` is the operand dtype (fp8/int8: 1 byte); ``block_shape``
    (bn, bk) of block-quantized operands caps BLOCK_SIZE_K at bk. Both GEMMs get the same
    BLOCK_SIZE_M (they share one AlignResult). Regimes by m = T*k/E tokens per expert:
      decode  (m <= 8): memory-bound on weights. BM 16 (the tl.dot minimum); 256-byte
              weight row segments per K tile (BK 128 bf16) = 16-byte cp.async, full lines;
              <= 32 KB of weights per stage (gemm1: gate + up tiles). GEMM1 narrows BN until
              >= 2 programs per SM; GEMM2 keeps BN 64 and splits K = I instead (H200,
              Mixtral T=1: GEMM1 BN 64 = 448 programs, 116 us = 4.0 TB/s; GEMM2 BN 64 x
              SPLIT_K 4 = 512 programs, 67 us = 3.5 TB/s, where BN 16 x SPLIT_K 2 took 104 us).
      middle  (8 < m <= 64): BM = next_pow2(2m) (the busiest expert fits one M block),
              BN 64/128, BK 64, 4 warps, 4 stages.
      prefill (m > 64): tensor-core bound. BM 64/128, BN 128 (gemm1: 64 per half = 128 of
              the 2I outputs with two accumulators), BK 64, GROUP_SIZE_M 8 for L2 reuse,
              8 warps at BM 128, 3 stages (H200 Mixtral T=4096: GEMM1 465, GEMM2 418
              TFLOP/s; USE_TMA=True took GEMM2 from 2.30 to 2.11 ms, GEMM1 unchanged).
    """
    I = N // 2 if gated else N
    n_out, K = (I, H) if gemm == "gemm1" else (H, I)
    pairs = max(1, T * top_k)
    m = pairs / E
    esize = torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 2
    b_tiles = 2 if (gemm == "gemm1" and gated) else 1
    if m <= 8:
        BM = 16
        active = min(pairs, E) * cdiv(max(1, int(m + 0.999)), BM)  # non-empty m-blocks
        BK = min(256 // esize, max(32, next_power_of_2(K)))
        BN = min(64 if gemm == "gemm2" else 128, 32768 // (BK * esize * b_tiles))
        split = 1
        if gemm == "gemm2":
            while (active * cdiv(n_out, BN) * split < 3 * num_sms
                   and K // (split * 2) >= 8 * BK and split < 16):
                split *= 2
        while BN > 16 and active * cdiv(n_out, BN) * split < 2 * num_sms:
            BN //= 2
        cfg = dict(BLOCK_SIZE_M=BM, BLOCK_SIZE_N=BN, BLOCK_SIZE_K=BK, GROUP_SIZE_M=1,
                   num_warps=4, num_stages=4 if esize <= 2 else 3, SPLIT_K=split)
    elif m <= 64:
        # still weight-bound: BLOCK_M covers the busiest expert (~2x the mean under uneven
        # routing) so that no expert's weights are streamed twice
        cfg = dict(BLOCK_SIZE_M=min(128, next_power_of_2(int(2 * m + 0.999))),
                   BLOCK_SIZE_N=64 if b_tiles == 2 else 128,
                   BLOCK_SIZE_K=128 // esize if esize <= 2 else 32, GROUP_SIZE_M=1, num_warps=4,
                   num_stages=4 if esize <= 2 else 3, SPLIT_K=1)
    else:
        BM = 64 if m <= 256 else 128
        cfg = dict(BLOCK_SIZE_M=BM, BLOCK_SIZE_N=64 if b_tiles == 2 else 128,
                   BLOCK_SIZE_K=128 // esize if esize <= 2 else 32, GROUP_SIZE_M=8,
                   num_warps=8 if BM == 128 else 4, num_stages=3 if esize <= 2 else 2, SPLIT_K=1)
    if block_shape is not None:
        bk = block_shape[1]
        while bk % cfg["BLOCK_SIZE_K"]:
            cfg["BLOCK_SIZE_K"] //= 2
    return cfg


def moe_forward_triton(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, activation: str = "silu", *,
                       config1: Optional[dict] = None, config2: Optional[dict] = None,
                       reduce: str = "deterministic", expert_map: Optional[torch.Tensor] = None,
                       w13_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
                       swiglu_limit: Optional[float] = None, alpha: float = 1.702, limit: float = 7.0,
                       out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """align -> gemm1_act -> gemm2 (+ reduce): out [T, H] in x's dtype, 16-bit/fp32 weights.

    x [T, H]; w13 [E, N, H]; w2 [E, H, I]; topk_weights fp32 [T, k]; topk_ids int [T, k]
    (global ids when ``expert_map`` [E_g] is given). Configs default to ``default_config``;
    One BLOCK_SIZE_M divides the other (else config2 takes config1's); the alignment is built
    once, with the larger.
    """
    T, H = x.shape
    k = topk_ids.shape[1]
    E, N = w13.shape[0], w13.shape[1]
    if out is None:
        out = torch.empty(T, H, dtype=x.dtype, device=x.device)                  # [T, H]
    if T == 0:
        return out
    gated = ACTIVATIONS[activation] <= 3
    if config1 is None:
        config1 = default_config(T, E, N, H, k, x.dtype, gemm="gemm1", gated=gated)
    if config2 is None:
        config2 = default_config(T, E, N, H, k, x.dtype, gemm="gemm2", gated=gated)
    b1, b2 = config1["BLOCK_SIZE_M"], config2["BLOCK_SIZE_M"]
    if max(b1, b2) % min(b1, b2):
        config2 = dict(config2, BLOCK_SIZE_M=b1)
    # aligned to the larger BM: the other GEMM runs sub-blocks (backends/triton.py align_bm)
    align = align_block_size(topk_ids, max(b1, config2["BLOCK_SIZE_M"]), E, expert_map)
    srt, sx = sorted_h(config2), sorted_x(config1)
    h = gemm1_act(gather_sorted(x, align, k) if sx else x, w13, align, k, activation, bias=w13_bias,
                  swiglu_limit=swiglu_limit, alpha=alpha, limit=limit, config=config1, out_sorted=srt,
                  x_sorted=sx)                                                    # [n, I]
    return gemm2(h, w2, align, topk_weights, out, bias=w2_bias, config=config2, reduce=reduce, h_sorted=srt)
