"""Decode kernels: the MoE layer for a handful of (token, slot) pairs in two launches.

One module though long: both GEMMs are built from the same @triton.jit helpers (_rows_dot,
_accumulate, _epilogue), and the measured launch rules (decode_config, gemm2_tiles) change
with them.

Legend: T tokens, E experts (local), k top-k, H hidden, I intermediate, n = T*k pairs
s = t*k + j, N = 2I (gated) or I.

  decode_gemm1: h [n, I]   = act(x[s // k] @ w13[e_s]^T + b13[e_s])      grid (I / BN, n)
  decode_gemm2: out [T, H] = sum_j w[t, j] * (h[t*k+j] @ w2[e]^T + b2[e])  grid (H / BN, T)

Why a separate path for decode: with T*k pairs much smaller than E the grouped GEMMs
(grouped_gemm.py) spend their time around the weights rather than on them. Measured on
the H100 at T=1 (qwen3-30b-a3b, deepseek-v3 tp8): align 3.5-5 us + GEMM1 + GEMM2 + reduce
2 us + launch gaps, and GEMM1 had only (experts hit) x (I / BN) programs. Here:
  * no align: each GEMM1 program reads its pair's expert id itself (expert_map aware),
    so a program exists for every (pair, N tile): n * I / BN programs;
  * no reduce: each GEMM2 program owns an output tile of ONE token and sums that token's
    k slots in a fixed order (j = 0..k-1): deterministic, no y [n, H] round trip, no
    atomics;
  * no tensor cores: a pair is one row (tl.dot needs 16). A program holds R groups of BN
    weight rows, [R, BN, BK] per K step (GEMM1: R = gate and up of one pair; GEMM2: R =
    the token's k slots, so all k experts' loads are in flight together), multiplies them
    by the matching activation rows on the CUDA cores in fp32 and sums over BK.
    Bandwidth, not math, is the limit: BK spans long contiguous weight rows (256 B - 2 KB
    of each row per step), and the next step's loads are issued before this step's sum.
Pairs that share an expert read its weights once per pair (the grouped path reads them
once per expert), so this path is for T*k small against E; the backend picks it below a
pair count (see backends/triton.py) and the selection report says which path a T takes.

Quantized operands take the grouped kernels' conventions (grouped_gemm._scale_args):
A_SCALE 0 none | 1 tensor [1] | 2 per row [M, 1] | 3 block [M, K/bk]; B_SCALE 0 none |
1 per expert [E] | 2 per channel [E, N] | 3 block [E, N/bn, K/bk]. Block scales are
applied per scale group inside each K tile (BLOCK_K a divisor or a multiple of bk), the
others once at the end. int8 x int8 sums in int32 (exact), 8-bit weights with a 16-bit
activation are upcast (weight-only): on a GPU, by default for one token with per-channel
scales, loaded as int32 words of four and converted by inline PTX (``W4``, ``w4_mode``).
Config: dict(BLOCK_N, BLOCK_K, num_warps, PREFETCH[, TILES: GEMM2's N tiles a program]);
``decode_config`` picks one from the shape (and ``gemm2_tiles`` GEMM2's TILES), from H100
sweeps. GEMM2 may be a programmatic dependent
launch of GEMM1 (``pdl``): it loads its first weight tile, then waits (griddepcontrol) before
reading h; the backend launches it so on sm90+ (FUSEDMOE_DECODE_PDL).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from .common import (ACTIVATIONS, _abs_bits, _activation, _compute_dtype, _num_sms, _quantize, _scale_args,
                     _scale_from_amax_bits, gdc_launch_dependents, gdc_wait)
from .launcher import cdiv, launch, next_power_of_2

@triton.jit
def _local_experts(ids_ptr, map_ptr, s, ok, num_global, E, HAS_MAP: tl.constexpr):
    """Local expert of each pair in ``s`` ([R]), -1 where ``ok`` is False, expert_map drops
    the pair or the id is out of range."""
    g = tl.load(ids_ptr + s, mask=ok, other=-1).to(tl.int32)
    if HAS_MAP:
        loc = tl.load(map_ptr + g, mask=ok & (g >= 0) & (g < num_global), other=-1)
    else:
        loc = g
    return tl.where(ok & (loc >= 0) & (loc < E), loc, -1)


@triton.jit
def _load_a(a_rows, stride_ak, k0, k_lim, BLOCK_K: tl.constexpr, A3: tl.constexpr = 0):
    """a [R, BK] of the activation rows at K offset k0 (columns at or past a row's k_lim
    read as 0 and move no memory). A3 > 0: [R, A3, BK], each row A3 times (see _rows_dot)."""
    kk = k0 + tl.arange(0, BLOCK_K)
    if A3 > 0:
        z = tl.zeros((A3,), dtype=tl.int32)
        a = tl.load(a_rows[:, None, None] + (z[None, :, None] + kk[None, None, :]) * stride_ak,
                    mask=(kk[None, :] < k_lim[:, None])[:, None, :], other=0.0)
    else:
        a = tl.load(a_rows[:, None] + kk[None, :] * stride_ak, mask=kk[None, :] < k_lim[:, None], other=0.0)
    return a


@triton.jit
def _load_w(w_rows, stride_wk, k0, k_lim, BLOCK_K: tl.constexpr, SF: tl.constexpr = 0, W4: tl.constexpr = 0):
    """w [R, BN, BK] of the weight rows at K offset k0, masked as ``_load_a``. SF (slots first):
    R gets the threads and warps K leaves before BN does, the layout triton 3.6 picks by itself
    (see ``gemm2_slots_first``). The hint claims 2-element runs along R: it only orders the
    dimensions, as K (BK-element runs) stays the one that loads are vectorized along.
    W4 (8-bit weights, unit K stride, 16-byte aligned rows: ``w4_mode``): [R, BN, BK / 4] int32
    words of four weights each (``_w4_f32``)."""
    if W4:
        kw = k0 // 4 + tl.arange(0, BLOCK_K // 4)
        rows = tl.multiple_of(w_rows.to(tl.pointer_type(tl.int32)), [16, 16])     # (w4_mode: 16-byte rows)
        ptrs = rows[:, :, None] + kw[None, None, :]
        if SF:
            ptrs = tl.max_contiguous(ptrs, [2, 1, BLOCK_K // 4])
        else:
            ptrs = tl.max_contiguous(ptrs, [1, 1, BLOCK_K // 4])
        return tl.load(ptrs, mask=(kw[None, :] < (k_lim // 4)[:, None])[:, None, :], other=0)
    else:
        kk = k0 + tl.arange(0, BLOCK_K)
        ptrs = w_rows[:, :, None] + kk[None, None, :] * stride_wk
        if SF:
            ptrs = tl.max_contiguous(ptrs, [2, 1, BLOCK_K])
        return tl.load(ptrs, mask=(kk[None, :] < k_lim[:, None])[:, None, :], other=0.0)


@triton.jit
def _load_tiles(a_rows, stride_ak, w_rows, stride_wk, k0, k_lim, BLOCK_K: tl.constexpr, A3: tl.constexpr = 0,
                SF: tl.constexpr = 0, W4: tl.constexpr = 0):
    return (_load_a(a_rows, stride_ak, k0, k_lim, BLOCK_K, A3),
            _load_w(w_rows, stride_wk, k0, k_lim, BLOCK_K, SF, W4))


@triton.jit
def _e4m3_bits_to_f32(b):
    """float8_e4m3fn bit patterns (uint8) -> fp32, exactly, with integer math (the
    interpreter's fp8 casts are not IEEE; the GPU path never calls this)."""
    b = b.to(tl.int32) & 0xFF
    e = (b >> 3) & 0xF
    m = b & 0x7
    normal = ((e + 120) << 23) | (m << 20)                             # rebias 7 -> 127
    sub = (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)  # m * 2**-9, exact
    bits = tl.where(e == 0, sub, normal)
    bits = tl.where((b & 0x7F) == 0x7F, 0x7FC00000, bits)               # e4m3fn NaN
    return (bits | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)


# Four packed 8-bit weights (one int32 word, byte j = weight j) -> four fp32 (W4). int8: offset
# the bytes by 128 (one XOR a word), put each in the low mantissa byte of 2**23 (one PRMT from
# the word and 0x4B000000), then subtract 2**23 + 128 (``_w4_f32``): exact. fp8 e4m3: two
# e4m3x2 -> f16x2 conversions and four f16 -> f32. Triton's own casts of an int8 / fp8 tile
# unpack every byte into a register and repack pairs (2-4 PRMT / LOP3 a weight, and a
# quarter-rate I2F for int8), which kept the a16 decode's CUDA cores busier than its loads.
_I8X4_TO_F32_BITS = tl.constexpr("""{
.reg .b32 t, c;
xor.b32 t, $4, 0x80808080;
mov.b32 c, 0x4B000000;
prmt.b32 $0, t, c, 0x7440;
prmt.b32 $1, t, c, 0x7441;
prmt.b32 $2, t, c, 0x7442;
prmt.b32 $3, t, c, 0x7443;
}""")
_E4M3X4_TO_F32 = tl.constexpr("""{
.reg .b16 l, h, p0, p1, q0, q1;
.reg .b32 p, q;
mov.b32 {l, h}, $4;
cvt.rn.f16x2.e4m3x2 p, l;
cvt.rn.f16x2.e4m3x2 q, h;
mov.b32 {p0, p1}, p;
mov.b32 {q0, q1}, q;
cvt.f32.f16 $0, p0;
cvt.f32.f16 $1, p1;
cvt.f32.f16 $2, q0;
cvt.f32.f16 $3, q1;
}""")


@triton.jit
def _w4_f32(words, W4: tl.constexpr):
    """The four fp32 weights of each int32 word (W4 1: int8, 2: fp8 e4m3), K order."""
    if W4 == 1:
        b0, b1, b2, b3 = tl.inline_asm_elementwise(_I8X4_TO_F32_BITS, "=r,=r,=r,=r,r", [words],
                                                   dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                   is_pure=True, pack=1)
        return (b0.to(tl.float32, bitcast=True) - 8388736.0, b1.to(tl.float32, bitcast=True) - 8388736.0,
                b2.to(tl.float32, bitcast=True) - 8388736.0, b3.to(tl.float32, bitcast=True) - 8388736.0)
    else:
        return tl.inline_asm_elementwise(_E4M3X4_TO_F32, "=f,=f,=f,=f,r", [words],
                                         dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                                         is_pure=True, pack=1)


@triton.jit
def _w4_products(a, w, R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A3: tl.constexpr,
                 W4: tl.constexpr):
    """[R, BN, BK / 4]: each word's four products w * a summed (w: ``_load_w``'s W4 words
    [R, BN, BK / 4]; a: [R, BK] or, A3, [R, BN, BK])."""
    f0, f1, f2, f3 = _w4_f32(w, W4)
    if A3:
        ev, od = tl.split(tl.reshape(a.to(tl.float32), (R, BLOCK_N, BLOCK_K // 4, 2, 2)))
        a0, a2 = tl.split(ev)
        a1, a3 = tl.split(od)
    else:
        ev, od = tl.split(tl.reshape(a.to(tl.float32), (R, BLOCK_K // 4, 2, 2)))
        a0, a2 = tl.split(ev)
        a1, a3 = tl.split(od)
        a0 = a0[:, None, :]
        a1 = a1[:, None, :]
        a2 = a2[:, None, :]
        a3 = a3[:, None, :]
    return f0 * a0 + f1 * a1 + f2 * a2 + f3 * a3


@triton.jit
def _fake_quant(a, scale, QTYPE: tl.constexpr, BITWISE_FP8: tl.constexpr):
    """a / scale on the 8-bit grid (quantize.py's rounding, bit for bit), as fp32; int8 as int8."""
    q = _quantize(a, scale, QTYPE, BITWISE_FP8)
    if QTYPE == "int8":
        return q
    elif BITWISE_FP8:
        return _e4m3_bits_to_f32(q)
    else:
        return q.to(tl.float32)


@triton.jit
def _row_scales(a_rows, stride_ak, K, k_lim, QMAX: tl.constexpr, R: tl.constexpr, BLOCK_K: tl.constexpr):
    """[R] dynamic per-row scales max(amax, 1e-12) / QMAX of the activation rows (NaN when a
    row holds NaN or Inf), as quantize.py's per-token kernels compute them."""
    bits = tl.zeros((R,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows[:, None] + kk[None, :] * stride_ak, mask=kk[None, :] < k_lim[:, None], other=0.0)
        bits = tl.maximum(bits, tl.max(_abs_bits(a), axis=1))
    return _scale_from_amax_bits(bits, QMAX, False)


@triton.jit
def _accumulate(acc, a, w, sa_tok, k0, K, as_rows, stride_ask, bs_rows, stride_bsk,
                A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_K: tl.constexpr, INT_ACC: tl.constexpr,
                QA: tl.constexpr, QTYPE: tl.constexpr, POW2: tl.constexpr, BITWISE_FP8: tl.constexpr,
                R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A3: tl.constexpr = 0,
                W4: tl.constexpr = 0):
    """acc [R, BN] += sum_k a[r, k] * w[r, n, k] (A3: a is [R, BN, BK], ``_load_a``; W4: w is
    ``_load_w``'s words, QA 0, not INT_ACC).

    QA 1: a is 16-bit and is quantized here with the per-row scales ``sa_tok`` (applied
    later, in the epilogue); QA 2: a is quantized here per GROUP_K group (fp8, optionally
    power-of-two scales) and the group scales are applied like given block scales (mode 3)."""
    if QA == 1:
        a = _fake_quant(a, sa_tok[:, None], QTYPE, BITWISE_FP8)
    if INT_ACC:
        if A3:
            acc += tl.sum(w.to(tl.int32) * a.to(tl.int32), axis=2)
        else:
            acc += tl.sum(w.to(tl.int32) * a.to(tl.int32)[:, None, :], axis=2)
    elif A_SCALE == 3 or B_SCALE == 3 or QA == 2:
        # NG scale groups of GG columns in this K tile (NG = 1: the tile lies in one group)
        NG: tl.constexpr = BLOCK_K // GROUP_K if BLOCK_K > GROUP_K else 1
        GG: tl.constexpr = BLOCK_K // NG
        if W4:   # (QA 0)
            p = tl.sum(tl.reshape(_w4_products(a, w, R, BLOCK_N, BLOCK_K, A3, W4), (R, BLOCK_N, NG, GG // 4)),
                       axis=3)                                                                  # [R, BN, NG]
        elif A3:   # (QA 0)
            p = tl.sum(tl.reshape(w, (R, BLOCK_N, NG, GG)).to(tl.float32)
                       * tl.reshape(a.to(tl.float32), (R, BLOCK_N, NG, GG)), axis=3)            # [R, BN, NG]
        else:
            a3 = tl.reshape(a.to(tl.float32), (R, NG, GG))
            if QA == 2:
                sq = _scale_from_amax_bits(tl.max(_abs_bits(a3), axis=2), 448.0, POW2)      # [R, NG]
                a3 = _fake_quant(a3, sq[:, :, None], "fp8", BITWISE_FP8)
            p = tl.sum(tl.reshape(w, (R, BLOCK_N, NG, GG)).to(tl.float32) * a3[:, None, :, :], axis=3)  # [R, BN, NG]
        g = k0 // GROUP_K + tl.arange(0, NG)
        g_ok = g * GROUP_K < K                        # groups past K: products are 0, scales unread
        if QA == 2:
            p = p * sq[:, None, :]
        elif A_SCALE == 3:
            p = p * tl.load(as_rows[:, None] + g[None, :] * stride_ask, mask=g_ok[None, :], other=0.0)[:, None, :]
        if B_SCALE == 3:
            p = p * tl.load(bs_rows[:, :, None] + g[None, None, :] * stride_bsk, mask=g_ok[None, None, :], other=0.0)
        acc += tl.sum(p, axis=2)
    elif W4:
        acc += tl.sum(_w4_products(a, w, R, BLOCK_N, BLOCK_K, A3, W4), axis=2)
    elif A3:
        acc += tl.sum(w.to(tl.float32) * a.to(tl.float32), axis=2)
    else:
        acc += tl.sum(w.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
    return acc


@triton.jit
def _wait(WAIT: tl.constexpr):
    """WAIT 1: griddepcontrol.wait (this grid is a programmatic dependent launch); 0: nothing."""
    if WAIT == 1:
        gdc_wait()


@triton.jit
def _rows_dot(a_rows, stride_ak, w_rows, stride_wk, K, k_lim, as_rows, stride_ask, bs_rows, stride_bsk,
              A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_K: tl.constexpr, INT_ACC: tl.constexpr,
              QA: tl.constexpr, QTYPE: tl.constexpr, QMAX: tl.constexpr, POW2: tl.constexpr,
              BITWISE_FP8: tl.constexpr, R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              PREFETCH: tl.constexpr, WAIT: tl.constexpr = 0, A3: tl.constexpr = 0, SF: tl.constexpr = 0,
              W4: tl.constexpr = 0):
    """([R, BN] fp32, [R] per-row scales): sum_k a[r, k] * w[r, n, k] for R activation rows,
    each against its own BN weight rows (a_rows [R], w_rows [R, BN] pointers; k_lim [R]: K,
    or 0 to read nothing). The scales are the in-kernel per-row quantization's (QA 1: a
    first pass over the rows; they multiply the result in the epilogue), else 1.

    PREFETCH issues the next K tile's loads before reducing the current one: two tiles in
    flight per program (plain loads are not software-pipelined the way tl.dot operands are).
    WAIT: the activations are written by other programs, the weights are not; the first
    weight tile is loaded, then the program waits, then reads the activations. WAIT 1
    (programmatic dependent launch): for the previous grid (griddepcontrol.wait).
    A3 (= BN, QA 0): the activation tile is loaded as [R, BN, BK], each row BN times, in the
    weight tile's own layout (``_load_a``); see ``gemm2_a3``.
    """
    if not PREFETCH:
        _wait(WAIT)
    if QA == 1:
        sa_tok = _row_scales(a_rows, stride_ak, K, k_lim, QMAX, R, BLOCK_K)
    else:
        sa_tok = tl.full((R,), 1.0, dtype=tl.float32)
    if INT_ACC:
        acc = tl.zeros((R, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((R, BLOCK_N), dtype=tl.float32)
    if PREFETCH:
        if WAIT:
            w_nx = _load_w(w_rows, stride_wk, 0, k_lim, BLOCK_K, SF, W4)
            _wait(WAIT)
            a_nx = _load_a(a_rows, stride_ak, 0, k_lim, BLOCK_K, A3)
        else:
            a_nx, w_nx = _load_tiles(a_rows, stride_ak, w_rows, stride_wk, 0, k_lim, BLOCK_K, A3, SF, W4)
        for k0 in range(0, K, BLOCK_K):
            a, w = a_nx, w_nx
            a_nx, w_nx = _load_tiles(a_rows, stride_ak, w_rows, stride_wk, k0 + BLOCK_K, k_lim, BLOCK_K, A3, SF,
                                     W4)
            acc = _accumulate(acc, a, w, sa_tok, k0, K, as_rows, stride_ask, bs_rows, stride_bsk,
                              A_SCALE, B_SCALE, GROUP_K, INT_ACC, QA, QTYPE, POW2, BITWISE_FP8, R, BLOCK_N, BLOCK_K,
                              A3, W4)
    else:
        for k0 in range(0, K, BLOCK_K):
            a, w = _load_tiles(a_rows, stride_ak, w_rows, stride_wk, k0, k_lim, BLOCK_K, A3, SF, W4)
            acc = _accumulate(acc, a, w, sa_tok, k0, K, as_rows, stride_ask, bs_rows, stride_bsk,
                              A_SCALE, B_SCALE, GROUP_K, INT_ACC, QA, QTYPE, POW2, BITWISE_FP8, R, BLOCK_N, BLOCK_K,
                              A3, W4)
    return acc.to(tl.float32), sa_tok


@triton.jit
def _epilogue(acc, sa_tok, as_rows, bs_e, bias_e, wrows, stride_bsn, stride_bias_n,
              A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, QA: tl.constexpr):
    """acc [R, BN]: per-tensor / per-row activation scale (given, or QA 1's ``sa_tok``),
    per-expert / per-channel weight scale, bias. as_rows, bs_e, bias_e: [R] pointers; wrows
    [R, BN] weight row indices."""
    if A_SCALE == 1 or A_SCALE == 2:
        acc = acc * tl.load(as_rows)[:, None]
    if QA == 1:
        acc = acc * sa_tok[:, None]
    if B_SCALE == 1:
        acc = acc * tl.load(bs_e)[:, None]
    elif B_SCALE == 2:
        acc = acc * tl.load(bs_e[:, None] + wrows * stride_bsn)
    if HAS_BIAS:
        acc += tl.load(bias_e[:, None] + wrows * stride_bias_n).to(tl.float32)
    return acc


@triton.jit
def _gemm1_item(pid_n, s, x_ptr, w_ptr, h_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, ids_ptr, map_ptr,
                N_OUT, K, num_global, E,
                stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_hm, stride_hn,
                stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                limit, alpha,
                TOP_K: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr,
                A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
                INT_ACC: tl.constexpr, QA: tl.constexpr, QTYPE: tl.constexpr, QMAX: tl.constexpr,
                POW2: tl.constexpr, BITWISE_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                PREFETCH: tl.constexpr, WAIT: tl.constexpr = 0, W4: tl.constexpr = 0):
    """GEMM1 for pair s (int64), N tile pid_n; R = 2 weight row groups (gate, up) or 1. A
    dropped pair writes nothing (its h row is never read). WAIT 1: x is the previous
    kernel's output (``_rows_dot``)."""
    R: tl.constexpr = 2 if GATED else 1
    r = tl.arange(0, R)
    e = _local_experts(ids_ptr, map_ptr, s + r * 0, r >= 0, num_global, E, HAS_MAP)      # [R], equal
    if tl.max(e) >= 0:
        e64 = e.to(tl.int64)
        t = s // TOP_K
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N_OUT
        wrows = tl.where(n_ok, offs_n, 0)[None, :] + (r * N_OUT)[:, None]          # [R, BN]: gate, up
        x_rows = x_ptr + t * stride_xm + r * 0                                      # [R]: the same row
        as_rows = a_scale_ptr + t * stride_asm + r * 0
        bs_e = b_scale_ptr + e64 * stride_bse
        acc, sa_tok = _rows_dot(x_rows, stride_xk, w_ptr + e64[:, None] * stride_we + wrows * stride_wn, stride_wk,
                                K, K + r * 0, as_rows, stride_ask, bs_e[:, None] + (wrows // GROUP_N) * stride_bsn,
                                stride_bsk, A_SCALE, B_SCALE, GROUP_K, INT_ACC, QA, QTYPE, QMAX, POW2, BITWISE_FP8,
                                R, BLOCK_N, BLOCK_K, PREFETCH, WAIT, 0, 0, W4)
        acc = _epilogue(acc, sa_tok, as_rows, bs_e, bias_ptr + e64 * stride_bias_e, wrows, stride_bsn,
                        stride_bias_n, A_SCALE, B_SCALE, HAS_BIAS, QA)
        g = tl.sum(tl.where(r[:, None] == 0, acc, 0.0), axis=0)                    # [BN]
        u = tl.sum(tl.where(r[:, None] == R - 1, acc, 0.0), axis=0)               # == g when not gated
        out = _activation(g, u, ACT, HAS_LIMIT, limit, alpha)
        tl.store(h_ptr + s * stride_hm + offs_n * stride_hn, out.to(h_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _token_slots(t, ids_ptr, map_ptr, num_global, E, TOP_K: tl.constexpr, KP: tl.constexpr,
                 HAS_MAP: tl.constexpr):
    """Token t's KP slot rows for GEMM2: (pairs s [KP], keep [KP], local experts e int64 [KP]).
    Padding rows past k repeat slot 0; dropped / padding rows get expert 0, read nothing
    (k_lim 0) and add nothing (``_gemm2_out``)."""
    j = tl.arange(0, KP)
    j_ok = j < TOP_K
    s = t * TOP_K + tl.where(j_ok, j, 0)
    e = _local_experts(ids_ptr, map_ptr, s, j_ok, num_global, E, HAS_MAP)
    keep = e >= 0
    return s, keep, tl.where(keep, e, 0).to(tl.int64)


@triton.jit
def _gemm2_out(acc, sa_tok, s, keep, e, as_rows, bs_e, bias_ptr, topk_w_ptr, out_row, offs_n, n_ok, wrows,
               stride_bias_e, stride_bsn, stride_bias_n, stride_on, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr,
               HAS_BIAS: tl.constexpr, QA: tl.constexpr, MUL_W: tl.constexpr):
    """One GEMM2 output tile of a token: the slots' epilogue (scales, bias, routing weight),
    kept slots only (a dropped slot's scales may be garbage), then the fixed-order sum over
    the slots (bitwise reproducible), stored at ``out_row`` [BN]."""
    acc = _epilogue(acc, sa_tok, as_rows, bs_e, bias_ptr + e * stride_bias_e, wrows, stride_bsn, stride_bias_n,
                    A_SCALE, B_SCALE, HAS_BIAS, QA)
    if MUL_W:
        acc = acc * tl.load(topk_w_ptr + s).to(tl.float32)[:, None]
    acc = tl.where(keep[:, None], acc, 0.0)
    tl.store(out_row + offs_n * stride_on, tl.sum(acc, axis=0).to(out_row.dtype.element_ty), mask=n_ok)


@triton.jit
def _gemm2_item(pid_n, t, h_ptr, w_ptr, out_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr,
                N_OUT, K, num_global, E,
                stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
                stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                TOP_K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr,
                MUL_W: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr,
                GROUP_K: tl.constexpr, INT_ACC: tl.constexpr, QA: tl.constexpr, QTYPE: tl.constexpr,
                QMAX: tl.constexpr, POW2: tl.constexpr, BITWISE_FP8: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, WAIT: tl.constexpr, A3: tl.constexpr,
                SF: tl.constexpr, W4: tl.constexpr = 0):
    """GEMM2 for token t (int64), N tile pid_n: all k slots at once as R = KP (k rounded up
    to a power of two) weight row groups, then a fixed-order sum over the slots. WAIT: the
    first weight tile is read before h is waited for (``_rows_dot``)."""
    s, keep, e = _token_slots(t, ids_ptr, map_ptr, num_global, E, TOP_K, KP, HAS_MAP)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N_OUT
    wrows = tl.zeros((KP, BLOCK_N), dtype=tl.int32) + tl.where(n_ok, offs_n, 0)[None, :]    # [KP, BN]
    as_rows = a_scale_ptr + s * stride_asm
    bs_e = b_scale_ptr + e * stride_bse
    acc, sa_tok = _rows_dot(h_ptr + s * stride_hm, stride_hk, w_ptr + e[:, None] * stride_we + wrows * stride_wn,
                            stride_wk, K, K * keep.to(tl.int32), as_rows, stride_ask,
                            bs_e[:, None] + (wrows // GROUP_N) * stride_bsn, stride_bsk,
                            A_SCALE, B_SCALE, GROUP_K, INT_ACC, QA, QTYPE, QMAX, POW2, BITWISE_FP8,
                            KP, BLOCK_N, BLOCK_K, PREFETCH, WAIT, A3, SF, W4)
    _gemm2_out(acc, sa_tok, s, keep, e, as_rows, bs_e, bias_ptr, topk_w_ptr, out_ptr + t * stride_om, offs_n, n_ok,
               wrows, stride_bias_e, stride_bsn, stride_bias_n, stride_on, A_SCALE, B_SCALE, HAS_BIAS, QA, MUL_W)


@triton.jit
def _gemm2_tiles(pid, t, h_ptr, w_ptr, out_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr,
                 N_OUT, K, num_global, E,
                 stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
                 stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                 TOP_K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr,
                 MUL_W: tl.constexpr, A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr,
                 GROUP_K: tl.constexpr, INT_ACC: tl.constexpr, QA: tl.constexpr, QTYPE: tl.constexpr,
                 QMAX: tl.constexpr, POW2: tl.constexpr, BITWISE_FP8: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, NT: tl.constexpr, WAIT: tl.constexpr, A3: tl.constexpr, SF: tl.constexpr,
                 W4: tl.constexpr = 0):
    """GEMM2 for token t, N tiles pid * NT ... pid * NT + NT - 1 (``_gemm2_item``'s math per
    tile, the same fixed-order sum over the slots). The tiles' K steps are one stream of
    weight loads: the next step's tile (of this N tile or the next) is in flight while a step
    is summed, so a short K (deepseek-v3 tp8: I = 256, one step a tile) still overlaps loads
    with sums, and each program reads its token's h rows and ids once for NT tiles. WAIT as
    in ``_rows_dot``: the first weight tile is loaded before it."""
    s, keep, e = _token_slots(t, ids_ptr, map_ptr, num_global, E, TOP_K, KP, HAS_MAP)
    k_lim = K * keep.to(tl.int32)
    h_rows = h_ptr + s * stride_hm
    as_rows = a_scale_ptr + s * stride_asm
    bs_e = b_scale_ptr + e * stride_bse
    w_e = w_ptr + e[:, None] * stride_we               # [KP, 1]
    no_rows = tl.zeros((KP, BLOCK_N), dtype=tl.int32)
    ks = tl.cdiv(K, BLOCK_K)
    n_first = pid * (NT * BLOCK_N)
    tiles = tl.minimum(NT, tl.cdiv(N_OUT - n_first, BLOCK_N))     # the last program may hold fewer
    offs = n_first + tl.arange(0, BLOCK_N)
    w_nx = _load_w(w_e + (no_rows + tl.where(offs < N_OUT, offs, 0)[None, :]) * stride_wn, stride_wk, 0, k_lim,
                   BLOCK_K, SF, W4)
    _wait(WAIT)
    if QA == 1:
        sa_tok = _row_scales(h_rows, stride_hk, K, k_lim, QMAX, KP, BLOCK_K)
    else:
        sa_tok = tl.full((KP,), 1.0, dtype=tl.float32)
    if INT_ACC:
        acc = tl.zeros((KP, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((KP, BLOCK_N), dtype=tl.float32)
    for i in range(0, tiles * ks):
        tile = i // ks
        k0 = (i - tile * ks) * BLOCK_K
        w = w_nx
        tile1 = (i + 1) // ks                         # the next step: this tile's, or the next tile's first
        offs1 = n_first + tile1 * BLOCK_N + tl.arange(0, BLOCK_N)
        w_nx = _load_w(w_e + (no_rows + tl.where(offs1 < N_OUT, offs1, 0)[None, :]) * stride_wn, stride_wk,
                       (i + 1 - tile1 * ks) * BLOCK_K, k_lim * (tile1 < tiles).to(tl.int32), BLOCK_K, SF, W4)
        a = _load_a(h_rows, stride_hk, k0, k_lim, BLOCK_K, A3)
        offs = n_first + tile * BLOCK_N + tl.arange(0, BLOCK_N)
        wrows = no_rows + tl.where(offs < N_OUT, offs, 0)[None, :]
        acc = _accumulate(acc, a, w, sa_tok, k0, K, as_rows, stride_ask, bs_e[:, None] + (wrows // GROUP_N) * stride_bsn,
                          stride_bsk, A_SCALE, B_SCALE, GROUP_K, INT_ACC, QA, QTYPE, POW2, BITWISE_FP8, KP, BLOCK_N,
                          BLOCK_K, A3, W4)
        if k0 + BLOCK_K >= K:                          # the tile's last K step: its output
            _gemm2_out(acc.to(tl.float32), sa_tok, s, keep, e, as_rows, bs_e, bias_ptr, topk_w_ptr,
                       out_ptr + t * stride_om, offs, offs < N_OUT, wrows, stride_bias_e, stride_bsn, stride_bias_n,
                       stride_on, A_SCALE, B_SCALE, HAS_BIAS, QA, MUL_W)
            acc = tl.zeros_like(acc)                   # (not acc * 0: a NaN would reach the next tile)


@triton.jit(do_not_specialize=["num_global"])
def _decode_gemm1_kernel(
    x_ptr, w_ptr, h_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, ids_ptr, map_ptr,
    N_OUT, K, num_global, E,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_hm, stride_hn,
    stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    limit, alpha,
    TOP_K: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, HAS_LIMIT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    INT_ACC: tl.constexpr, QA: tl.constexpr, QTYPE: tl.constexpr, QMAX: tl.constexpr, POW2: tl.constexpr,
    BITWISE_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
    PDL: tl.constexpr = False, PDL_WAIT: tl.constexpr = False, W4: tl.constexpr = 0,
):
    """Grid (N tiles, pairs). PDL: let a programmatic dependent (GEMM2, or the
    requantization of h) launch as soon as every program of this grid runs. PDL_WAIT: this
    grid is itself a programmatic dependent of the kernel that wrote x (the quantization of
    x): the first weight tile is loaded before waiting for it."""
    if PDL:
        gdc_launch_dependents()
    _gemm1_item(tl.program_id(0), tl.program_id(1).to(tl.int64), x_ptr, w_ptr, h_ptr, bias_ptr, a_scale_ptr,
                b_scale_ptr, ids_ptr, map_ptr, N_OUT, K, num_global, E,
                stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_hm, stride_hn,
                stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                limit, alpha, TOP_K, GATED, ACT, HAS_LIMIT, HAS_BIAS, HAS_MAP, A_SCALE, B_SCALE, GROUP_N, GROUP_K,
                INT_ACC, QA, QTYPE, QMAX, POW2, BITWISE_FP8, BLOCK_N, BLOCK_K, PREFETCH, 1 if PDL_WAIT else 0, W4)


@triton.jit(do_not_specialize=["num_global"])
def _decode_gemm2_kernel(
    h_ptr, w_ptr, out_ptr, bias_ptr, a_scale_ptr, b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr,
    N_OUT, K, num_global, E,
    stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    TOP_K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MAP: tl.constexpr, MUL_W: tl.constexpr,
    A_SCALE: tl.constexpr, B_SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    INT_ACC: tl.constexpr, QA: tl.constexpr, QTYPE: tl.constexpr, QMAX: tl.constexpr, POW2: tl.constexpr,
    BITWISE_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
    PDL: tl.constexpr = False, NT: tl.constexpr = 1, A3: tl.constexpr = 0, SLOTS_FIRST: tl.constexpr = 0,
    W4: tl.constexpr = 0,
):
    """Grid (N tiles / NT, tokens). PDL: launched as a programmatic dependent of the kernel that
    wrote h; reads ids and the first weight tile, then waits for that kernel. NT > 1: NT
    N tiles a program, their loads one pipeline (``_gemm2_tiles``; PREFETCH is implied)."""
    if NT > 1:
        _gemm2_tiles(tl.program_id(0), tl.program_id(1).to(tl.int64), h_ptr, w_ptr, out_ptr, bias_ptr, a_scale_ptr,
                     b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr, N_OUT, K, num_global, E,
                     stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
                     stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                     TOP_K, KP, HAS_BIAS, HAS_MAP, MUL_W, A_SCALE, B_SCALE, GROUP_N, GROUP_K, INT_ACC, QA, QTYPE,
                     QMAX, POW2, BITWISE_FP8, BLOCK_N, BLOCK_K, NT, 1 if PDL else 0, A3, SLOTS_FIRST, W4)
    else:  # (no early return: triton 3.6 rejects one followed by code of another shape)
        _gemm2_item(tl.program_id(0), tl.program_id(1).to(tl.int64), h_ptr, w_ptr, out_ptr, bias_ptr, a_scale_ptr,
                    b_scale_ptr, topk_w_ptr, ids_ptr, map_ptr, N_OUT, K, num_global, E,
                    stride_hm, stride_hk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
                    stride_bias_e, stride_bias_n, stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
                    TOP_K, KP, HAS_BIAS, HAS_MAP, MUL_W, A_SCALE, B_SCALE, GROUP_N, GROUP_K, INT_ACC, QA, QTYPE, QMAX,
                    POW2, BITWISE_FP8, BLOCK_N, BLOCK_K, PREFETCH, 1 if PDL else 0, A3, SLOTS_FIRST, W4)


# ----------------------------------------------------------------------------------------
def _triton_at_least(major: int, minor: int) -> bool:
    try:
        return tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (major, minor)
    except ValueError:
        return True


# the 8-bit tile rules (decode_config): the smallest BLOCK_K of an 8-bit GEMM2 from two tokens on
# (256 otherwise), and the elements of an 8-bit GEMM1 step of row segments <= 256 wide
BK8_FLOOR = 128
GEMM1_STEP8 = 4096


def decode_config(rows: int, programs_per_tile: int, n_out: int, K: int, esize: int, num_sms: int = 132,
                  group_k: Optional[int] = None, gemm2: bool = False) -> dict:
    """BLOCK_N / BLOCK_K / num_warps / PREFETCH for one decode GEMM.

    ``rows``: weight row groups per program (GEMM1: 2 gated / 1; GEMM2: k rounded up to a
    power of two); ``programs_per_tile``: pairs (GEMM1) or tokens (GEMM2) sharing the N
    tiling; ``gemm2``: the tile is GEMM2's (rows alone cannot say: k = 2 is 2 rows). From the H100 sweep at T=1:
      * a K step moves 16 KB per program (the next step prefetched: 32 KB in flight), with
        BK up to 2 KB of each weight row: qwen3 / deepseek GEMM1 BN 4 x BK 1024 bf16 =
        88-89% of copy bandwidth (BK 512: 85-86%); GEMM2 spreads the 16 KB over its k
        slots, BN 4 x BK 256 x 8 slots = 78-81%, and 8-32 KB tiles are 2-20% slower;
      * BK leaves at most 1/8 of K as a masked tail (qwen3 GEMM2, K = 768: BK 256, 10.3 us;
        BK 512, 12.6 us);
      * BN fills the 16 KB (and at most 8K elements), within [2, 32], and halves (down to
        2) while there are fewer than 3 programs per SM (fewer, longer programs leave SMs
        idle in the last wave; qwen3 GEMM2: BN 4 = 512 programs, 10.3 us; BN 2, 11.1 us);
      * 8 warps for the k-slot tiles of GEMM2, 4 for GEMM1;
      * 8-bit weights (pre-quantized activations, fp8_channel qwen3 / fp8_block deepseek):
        BK at most K / 8 (but >= 128): qwen3 GEMM1 BN 8 x BK 256 11.8 us (71%) where one
        2048-wide step took 17.3; 4 warps for GEMM2 (7.6 vs 9.2 us).
      * 8-bit, T = 1..3 (H100, median of 3): GEMM2 at BK 128 (the floor was 256): qwen3 fp8 T=2 13.5 ->
        11.8 us, T=3 21.2 -> 18.0, int8 T=3 21.0 -> ~18, deepseek fp8_block 10.0 -> 9.8 (T=1),
        16.4 -> 16.1 (T=2). Alone even at qwen3 T=1 (7.9 us), but the layer there lost 1-2 us
        (fp8 18.1 -> 19.5, int8 19.4 -> 21.4: --rule-ab), so at T=1 the floor stays 256 except
        for a K of one 256 step (deepseek: 22.5 -> 21.9). An 8-bit GEMM1 step of 256-wide segments
        at most 4K elements: qwen3 T=2 BN 16 -> 8, 23.3 -> 22.0 us (int8 25.6 -> 23.1), T=3
        32.7 -> 28.7 (int8 33.0 -> 30.5); T=1 already BN 8. deepseek's GEMM1 (BK 1024) keeps
        8K: its T=2 best (BN 8 x BK 512, 24.1 vs 26.0 us) is no rule's neighbour at T=1 / 3.
    With block scales BK is also a multiple or a divisor of ``group_k``.
    The same rule holds under triton 3.9 once the GEMM2 tile has 3.6's layout
    (``gemm2_slots_first``); without it, BK halved had been 1-3% faster there.
    """
    bk = min(2048 // esize, max(16, next_power_of_2(K)))
    if esize == 1:            # 8-bit rows: keep >= ~8 K steps for the prefetch to overlap
        # (BK 128 only with 2+ tokens or a K of one 256 step: at T=1 the PDL prologue's first
        # weight step overlaps GEMM1's tail, and a 128-wide one was slower on qwen3, K = 768)
        floor = BK8_FLOOR if gemm2 and (programs_per_tile >= 2 or K <= 256) else 256
        bk = min(bk, max(floor, next_power_of_2(K) // 8))
    while bk > 16 and (cdiv(K, bk) * bk - K) * 8 > K:
        bk //= 2
    if group_k is not None:
        while bk > 16 and (group_k % bk if bk <= group_k else bk % group_k):
            bk //= 2
    # largest pow2 within 16 KB and 8K elements a step (8-bit rows: 16K fp32 products a step
    # spill; measured 2x slower on fp8 qwen3 / deepseek T=1); an 8-bit GEMM1 step of 256-wide
    # row segments at most 4K elements (qwen3 T = 2, 3: BN 16 -> 8)
    budget = min(16384 // esize, GEMM1_STEP8 if esize == 1 and not gemm2 and bk <= 256 else 8192) // (rows * bk)
    bn = min(32, max(2, next_power_of_2(budget + 1) // 2))
    while bn > 2 and programs_per_tile * cdiv(n_out, bn) < 3 * num_sms:
        bn //= 2
    return dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=8 if rows >= 4 and esize == 2 else 4, PREFETCH=True)


def gemm2_tiles(tiles: int, num_sms: int, esize: int, ksteps: int = 1) -> int:
    """N tiles a GEMM2 program takes (``TILES``, see _gemm2_tiles) when decode_config chose
    the tile; ``tiles``: T x N tiles in all, ``ksteps``: K steps a tile (cdiv(K, BLOCK_K)).
    From the H100 (T=1):
      * 8-bit weights hold ~130 registers a program (3-4 programs an SM): with one short K
        a tile (deepseek-v3 tp8, I = 256: 1792 tiles of one 8 KB step) nothing overlaps a
        program's load. 4 tiles a program: GEMM2 13.0 -> 9.8 us, the layer (fp8_block, a16)
        25.5 -> 22.5 us; 2: 10.5 / 22.9; 8: 12.0 / 28.5;
      * where the tiles are few (qwen3 fp8, 512 tiles of 3 steps) fewer programs are slower
        (7.4 -> 10.5 us with 2): only while at least 3 programs an SM remain;
      * 16-bit weights (64-80 registers, more programs resident): 1 is the fastest (deepseek
        bf16 layer 33.1 vs 33.8-35.1 us);
      * a tile of two K steps or more overlaps its own loads: deepseek fp8_block at BK 128
        (two steps) BN 8 x TILES 1 9.75 us against BN 4 x BK 256 x TILES 4
        9.99 (T=1), 16.1 vs 16.4 (T=2), 22.0 vs 22.9 (T=3).
    """
    nt = 1
    while esize == 1 and ksteps == 1 and nt < 4 and tiles // (2 * nt) >= 3 * num_sms:
        nt *= 2
    return nt


def gemm2_a3(esize: int, slots: int) -> bool:
    """Whether the decode GEMM2 loads its activation rows as [KP, BN, BK] in the weight tile's
    own layout (``A3``, see ``_rows_dot``) by default (never with QA, the in-kernel quantization
    of h; the plan's config says otherwise where it sets ``A3``).
    ``slots``: KP, the GEMM2's slot rows. From the H100 (T=1, layer graph us):
      * triton 3.9 without ``gemm2_slots_first``: the [KP, BK] activation tile went through
        shared memory into the weight tile's slice layout every K step; A3 took that away
        (deepseek-v3 tp8 bf16 37.7 -> 34.6, Mixtral 238.1 -> 230.4);
      * with the slots-first hint (3.6's layout, 3.9's default since): A3 is slower at KP = 8
        (qwen3 27.2 -> 30.0, deepseek 33.3 -> 38.1) and still faster at Mixtral's KP = 2
        (238.7 -> 230.5); under 3.6 it is even at 16-bit (+-1%) and slower at 8-bit.
    So: 16-bit weights, at most 2 slots, triton >= 3.7."""
    return esize >= 2 and slots <= 2 and _triton_at_least(3, 7)


def gemm2_slots_first() -> bool:
    """Whether the decode GEMM2 hints its [KP, BN, BK] weight tile into the layout triton 3.6
    picks by itself (``SLOTS_FIRST``, ``_load_w``) by default: on under triton >= 3.7. Why (H100, T=1, layer graph
    us): triton 3.9
    gives that tile warps [2, 4, 1] / [2, 2, 1] where 3.6 gives [8, 1, 1] / [4, 1, 1], so each
    thread holds four slots' activations (8-bit GEMM2: 151-168 registers against 127-128, a
    program fewer an SM). Hinted, 3.9 compiles 3.6's layout and registers:
      * deepseek-v3 tp8 fp8_block 26.3 -> 22.6 (3.6: 22.5), qwen3 fp8_channel 20.8 -> 18.2
        (18.4), int8_channel 19.1 -> 18.4 (19.4);
      * 16-bit with 3.6's BK: qwen3 28.9 -> 27.2 (27.4), deepseek 33.7 -> 33.4 (33.1)."""
    return _triton_at_least(3, 7)


@functools.lru_cache(maxsize=1024)
def _cached_config(*args) -> tuple:
    """decode_config as a tuple, memoized: the wrappers call it per launch with few distinct
    shapes (~1.3 us a call on the host of an eager decode forward)."""
    return tuple(decode_config(*args).items())


def _check_block_k(bk: int, quant: str, block_shape, quantize_a) -> None:
    if quant == "block":
        gk = block_shape[1]
        if quantize_a is not None:
            assert bk % gk == 0, f"BLOCK_K {bk} must be a multiple of the group {gk} to quantize A in-kernel"
        assert (gk % bk if bk <= gk else bk % gk) == 0, \
            f"BLOCK_K {bk} must divide the scale group {gk} or be a multiple of it"


def _quant_flags(quant, a, b, a_scale, b_scale, block_shape, quantize_a, pow2):
    """(scale pointers and strides, constexprs) for the kernels. ``quantize_a`` None (A is
    used as given) or 'fp8' / 'int8': A is 16-bit and the kernel quantizes it the way
    quantize_activation would for ``quant`` ('channel': per row, 'block': per group)."""
    a_mode, b_mode, gn, gk, sa, sb, sam, sak, sbe, sbn, sbk = _scale_args(quant, a_scale, b_scale, block_shape, a, b)
    qa = 0
    if quantize_a is not None:
        assert a_scale is None and quant in ("channel", "block"), "in-kernel A quantization: per row or group"
        assert quant == "channel" or quantize_a == "fp8", "group quantization is fp8"
        qa = 1 if quant == "channel" else 2
    a_int8 = a.dtype == torch.int8 or quantize_a == "int8"
    int_acc = a_int8 and b.dtype == torch.int8 and 3 not in (a_mode, b_mode)
    return (sa, sb, sam, sak, sbe, sbn, sbk), dict(
        A_SCALE=a_mode, B_SCALE=b_mode, GROUP_N=gn, GROUP_K=gk, INT_ACC=int_acc, QA=qa,
        QTYPE=quantize_a or "fp8", QMAX=127.0 if quantize_a == "int8" else 448.0, POW2=bool(pow2),
        BITWISE_FP8=a.device.type != "cuda")


def w4_mode(w: torch.Tensor, qflags: dict, block_k: int, want: bool = False) -> int:
    """How the decode GEMMs read 8-bit weights against activations used as given (``W4``):
    1 (int8) or 2 (fp8 e4m3) as int32 words of four weights converted by ``_w4_f32``, or 0
    (element loads and Triton's casts). Words where the caller ``want``s them (the plan's
    config key ``W4``: it asks only where they pay, and for fp8 only on sm89+, which has the
    e4m3x2 conversion) and they can run: a CUDA tensor, unit K stride, 16-byte aligned rows
    (K a multiple of 16), K tiles a multiple of 16 and scale groups of 4, activations used as
    given (no in-kernel quantization, no int8 x int8 sums)."""
    if not want or w.device.type != "cuda" or torch.version.hip or qflags["INT_ACC"] or qflags["QA"]:
        return 0
    mode = {torch.int8: 1, torch.float8_e4m3fn: 2}.get(w.dtype, 0)
    K = w.shape[-1]
    aligned = (w.stride(-1) == 1 and K % 16 == 0 and block_k % 16 == 0 and w.data_ptr() % 16 == 0
               and all(st % 16 == 0 for st in w.stride()[:-1]))
    if qflags["B_SCALE"] == 3 or qflags["A_SCALE"] == 3:
        aligned = aligned and qflags["GROUP_K"] % 4 == 0
    return mode if aligned else 0


def _map_args(topk_ids, expert_map, E):
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    if expert_map is None:
        return ids, ids, E, False
    return ids, expert_map, expert_map.numel(), True


def _setup(rows, programs, n_out, K, a, w, topk_ids, expert_map, bias, quant, a_scale, b_scale, block_shape,
           quantize_a, scale_pow2, config, gemm2=False):
    """What both wrappers compute before a launch: (config, the pointer / count / stride
    arguments from the ids to the scale strides, the shared constexprs)."""
    if config is None:
        config = dict(_cached_config(rows, programs, n_out, K, w.element_size(), _num_sms(a.device),
                                     block_shape[1] if quant == "block" else None, gemm2))
    _check_block_k(config["BLOCK_K"], quant, block_shape, quantize_a)
    ids, emap, num_global, has_map = _map_args(topk_ids, expert_map, w.shape[0])
    scales, qflags = _quant_flags(quant, a, w, a_scale, b_scale, block_shape, quantize_a, scale_pow2)
    sa, sb, sam, sak, sbe, sbn, sbk = scales
    # unused pointer arguments point at the weights (fixed), not at the per-call tensors: a
    # repeated launch (launcher.Bound) then changes only the activations, ids and outputs
    if a_scale is None:
        sa = w
    if b_scale is None:
        sb = w
    s_bias = bias.stride()[:2] if bias is not None else (0, 0)
    consts = dict(HAS_BIAS=bias is not None, HAS_MAP=has_map, BLOCK_N=config["BLOCK_N"],
                  BLOCK_K=config["BLOCK_K"], PREFETCH=bool(config.get("PREFETCH", True)), **qflags)
    consts["W4"] = w4_mode(w, qflags, config["BLOCK_K"], bool(config.get("W4")) and a.element_size() >= 2)
    return config, (sa, sb, ids, emap), (num_global, w.shape[0]), (*s_bias, sam, sak, sbe, sbn, sbk), consts


def decode_gemm1(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor, activation: str,
                 out: Optional[torch.Tensor] = None, *, expert_map: Optional[torch.Tensor] = None,
                 bias: Optional[torch.Tensor] = None, swiglu_limit: Optional[float] = None,
                 alpha: float = 1.702, limit: float = 7.0, quant: str = "none",
                 a_scale: Optional[torch.Tensor] = None, b_scale: Optional[torch.Tensor] = None,
                 block_shape: Optional[tuple] = None, config: Optional[dict] = None,
                 quantize_a: Optional[str] = None, scale_pow2: bool = False, pdl: bool = False) -> torch.Tensor:
    """h [n, I] = act(x[s // k] @ w13[e]^T + bias[e]) per pair s (rows of dropped pairs unwritten).

    Same operands and conventions as ``grouped_gemm.gemm1_act`` (halves layout, quantized
    operands and scales), with the routing ids instead of an AlignResult. ``quantize_a``
    'fp8' / 'int8': x is 16-bit and is quantized in the kernel as the W8A8 scheme does
    (quant 'channel': per token; 'block': per 1 x bk group, ``scale_pow2`` scales), with
    the same rounding as kernels/quantize.py: no separate quantization launch. Measured
    slower than the quantization kernels on the H100 (qwen3 fp8_channel T=1 GEMM1: 24 us
    at best vs ~10 us expected; the division is recomputed per weight row of the tile),
    so the backend does not use it; kept, tested bitwise against the separate path, as
    the start of a cheaper version (quantize the row once per program into registers).
    """
    T, k = topk_ids.shape
    N13 = w13.shape[1]
    n_out = N13 // 2 if ACTIVATIONS[activation] <= 3 else N13
    if out is None:
        out = torch.empty(T * k, n_out, dtype=_compute_dtype(x), device=x.device)   # [n, I]
    if T == 0 or n_out == 0:
        return out
    launch(*gemm1_launch(x, w13, topk_ids, activation, out, expert_map=expert_map, bias=bias,
                         swiglu_limit=swiglu_limit, alpha=alpha, limit=limit, quant=quant, a_scale=a_scale,
                         b_scale=b_scale, block_shape=block_shape, config=config, quantize_a=quantize_a,
                         scale_pow2=scale_pow2, pdl=pdl))
    return out


# positions of the per-call tensors in the launch arguments (launcher.Bound slots)
GEMM1_SLOTS = dict(x=0, out=2, a_scale=4, ids=6, map=7)
GEMM2_SLOTS = dict(h=0, out=2, a_scale=4, topk_weights=6, ids=7, map=8)


def gemm1_launch(x, w13, topk_ids, activation, out, *, expert_map=None, bias=None, swiglu_limit=None,
                 alpha=1.702, limit=7.0, quant="none", a_scale=None, b_scale=None, block_shape=None,
                 config=None, quantize_a=None, scale_pow2=False, pdl=False, pdl_wait=False) -> tuple:
    """(kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl) of
    ``decode_gemm1``'s launch (T > 0, out given): for ``launch(*spec)`` or
    ``launcher.bind(*spec, slots=...)`` (GEMM1_SLOTS; ``topk_ids.view(-1)`` is the ids slot,
    and the map slot when ``expert_map`` is None). ``pdl``: let the next kernel, launched
    with ``pdl`` (``gemm2_launch``), start before this one ends (sm90+). ``pdl_wait``: this
    launch is itself a programmatic dependent of the kernel that wrote x (a quantization
    launched with ``pdl``): weights first, then x."""
    assert not (pdl_wait and quantize_a is not None), "PDL: x is read after the wait; quantize_a reads it before"
    T, k = topk_ids.shape
    N13, K = w13.shape[1:]
    act = ACTIVATIONS[activation]
    gated = act <= 3
    n_out = N13 // 2 if gated else N13
    config, (sa, sb, ids, emap), counts, strides, consts = _setup(
        2 if gated else 1, T * k, n_out, K, x, w13, topk_ids, expert_map, bias, quant, a_scale, b_scale,
        block_shape, quantize_a, scale_pow2, config)
    return (_decode_gemm1_kernel, (cdiv(n_out, config["BLOCK_N"]), T * k), (
        x, w13, out, bias if bias is not None else w13, sa, sb, ids, emap,
        n_out, K, *counts,
        *x.stride()[:2], *w13.stride()[:3], *out.stride()[:2], *strides,
        float(swiglu_limit if swiglu_limit is not None else limit), float(alpha),
    ), dict(TOP_K=k, GATED=gated, ACT=act, HAS_LIMIT=swiglu_limit is not None, PDL=pdl, PDL_WAIT=pdl_wait,
            **consts), config.get("num_warps", 4), None, pdl_wait)


def decode_gemm2(h: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 out: Optional[torch.Tensor] = None, *, expert_map: Optional[torch.Tensor] = None,
                 mul_routed_weight: bool = True, bias: Optional[torch.Tensor] = None, quant: str = "none",
                 a_scale: Optional[torch.Tensor] = None, b_scale: Optional[torch.Tensor] = None,
                 block_shape: Optional[tuple] = None, config: Optional[dict] = None,
                 quantize_a: Optional[str] = None, scale_pow2: bool = False, pdl: bool = False) -> torch.Tensor:
    """out [T, H] = sum_j topk_weights[t, j] * (h[t*k+j] @ w2[e]^T + bias[e]) over kept slots.

    The reduction over k happens in the program (fixed order, no workspace); tokens with no
    kept slot get zeros. Operands as ``grouped_gemm.gemm2``; ``quantize_a`` as in
    ``decode_gemm1`` (h is then 16-bit and requantized in the kernel).
    """
    T = topk_ids.shape[0]
    if out is None:
        out = torch.empty(T, w2.shape[1], dtype=_compute_dtype(h), device=h.device)   # [T, H]
    if T == 0:
        return out
    launch(*gemm2_launch(h, w2, topk_ids, topk_weights, out, expert_map=expert_map,
                         mul_routed_weight=mul_routed_weight, bias=bias, quant=quant, a_scale=a_scale,
                         b_scale=b_scale, block_shape=block_shape, config=config, quantize_a=quantize_a,
                         scale_pow2=scale_pow2, pdl=pdl))
    return out


def gemm2_launch(h, w2, topk_ids, topk_weights, out, *, expert_map=None, mul_routed_weight=True, bias=None,
                 quant="none", a_scale=None, b_scale=None, block_shape=None, config=None, quantize_a=None,
                 scale_pow2=False, pdl=False) -> tuple:
    """``decode_gemm2``'s launch as in ``gemm1_launch`` (slots: GEMM2_SLOTS). ``pdl``: a
    programmatic dependent launch (sm90+): the programs start while the kernel that writes h
    (the GEMM1 of ``gemm1_launch(pdl=True)``, or any kernel) still runs, load their ids and
    first weight tile, and wait for it before reading h."""
    assert not (pdl and quantize_a is not None), "PDL: h is read after the wait; quantize_a reads it before"
    T, k = topk_ids.shape
    H, K = w2.shape[1:]
    kp = next_power_of_2(k)
    explicit = config is not None
    config, (sa, sb, ids, emap), counts, strides, consts = _setup(
        kp, T, H, K, h, w2, topk_ids, expert_map, bias, quant, a_scale, b_scale, block_shape, quantize_a,
        scale_pow2, config, gemm2=True)
    nt = (int(config.get("TILES", 1)) if explicit
          else gemm2_tiles(T * cdiv(H, config["BLOCK_N"]), _num_sms(h.device), w2.element_size(),
                           cdiv(K, config["BLOCK_K"])))
    a3 = config.get("A3") if explicit else None
    a3 = config["BLOCK_N"] if (gemm2_a3(w2.element_size(), kp) if a3 is None else a3) and not consts["QA"] else 0
    sf = config.get("SLOTS_FIRST") if explicit else None
    sf = bool(gemm2_slots_first() if sf is None else sf)
    if a3:
        consts["W4"] = 0
    return (_decode_gemm2_kernel, (cdiv(cdiv(H, config["BLOCK_N"]), nt), T), (
        h, w2, out, bias if bias is not None else w2, sa, sb, topk_weights, ids, emap,
        H, K, *counts,
        *h.stride()[:2], *w2.stride()[:3], *out.stride()[:2], *strides,
    ), dict(TOP_K=k, KP=kp, MUL_W=mul_routed_weight, PDL=pdl, NT=nt, A3=a3, SLOTS_FIRST=sf, **consts),
        config.get("num_warps", 4), None, pdl)


def decode_forward(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, activation: str = "silu", *, expert_map=None, w13_bias=None,
                   w2_bias=None, swiglu_limit=None, alpha: float = 1.702, limit: float = 7.0,
                   out: Optional[torch.Tensor] = None, config1: Optional[dict] = None,
                   config2: Optional[dict] = None, pdl: bool = False) -> torch.Tensor:
    """decode_gemm1 -> decode_gemm2 for 16-bit / fp32 weights: out [T, H] in x's dtype.
    ``pdl``: GEMM2 as a programmatic dependent launch of GEMM1 (sm90+, see gemm2_launch).
    Two launches, not one whose GEMM2 items poll per-token counters: that was slower than
    two launches with PDL on the H100, and read h before GEMM1 wrote it on tiny grids."""
    h = decode_gemm1(x, w13, topk_ids, activation, expert_map=expert_map, bias=w13_bias,
                     swiglu_limit=swiglu_limit, alpha=alpha, limit=limit, config=config1, pdl=pdl)
    return decode_gemm2(h, w2, topk_ids, topk_weights, out, expert_map=expert_map, bias=w2_bias,
                        config=config2, pdl=pdl)
