"""Activation quantization kernels (fp8 e4m3 / int8), bit-exact twins of ``fusedmoe.reference.quant``.

Legend: T rows (tokens; any leading dims of x [..., K] count as T), K the quantized dim,
g a group size along K, G = ceil(K / g), M rows of GEMM1's output h [M, N] (N = 2I gated,
I otherwise), E_loc local experts, T_max rows per expert in the batched format.

| launcher            | returns                                    | scale                        |
|---------------------|--------------------------------------------|------------------------------|
| quant_fp8_tensor    | (fp8 [..., K], fp32 [1])                   | amax(x) / 448, or given      |
| quant_fp8_token     | (fp8 [..., K], fp32 [..., 1])              | amax(row) / 448              |
| quant_fp8_group     | (fp8 [..., K], fp32 [..., G])              | amax(1 x g group) / 448      |
| quant_int8_token    | (int8 [..., K], fp32 [..., 1])             | amax(row) / 127              |
| act_and_quant       | (fp8|int8 [M, I], fp32 [M,1]/[M,G]/[1])    | token / group / static       |

Rules shared with the reference (see its docstring): dynamic scales use max(amax, 1e-12);
an amax over a group holding NaN or +-Inf is NaN, so the whole group dequantizes to NaN;
fp8 values saturate at +-448 with round-to-nearest-even and Inf/NaN become fp8 NaN; int8
codes round half to even, clamp to +-127, NaN -> 0. ``pow2`` rounds a scale up to a power
of two exactly (from the fp32 bits, like the reference's frexp).

No host sync: the dynamic per-tensor scale is an atomic max (on the int32 bits of |x|,
which orders NaN above Inf above every finite value) into a zeroed device scalar, read by
the second launch.

Batched format: pass x [E_loc, T_max, K] and ``counts`` int32 [E_loc]; rows t >= counts[e]
are padding: skipped (their outputs are left unwritten) and left out of per-tensor amax.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import (ACTIVATIONS, _abs_bits, _quantize, _scale_from_amax_bits, gated_activation,
                     gdc_launch_dependents, gdc_wait, plain_activation)
from .launcher import cdiv, launch, next_power_of_2

__all__ = ["FP8_MAX", "INT8_MAX", "quant_fp8_tensor", "quant_fp8_token", "quant_fp8_group",
           "quant_int8_token", "act_and_quant"]

FP8_MAX = 448.0
INT8_MAX = 127.0
_AMAX_FLOOR = 1e-12
_MAX_BLOCK_K = 4096     # elements of one row kept in registers per chunk (16 fp32 / thread at 8 warps)
_PROG_ELEMS = 2048      # input elements a row-quantization program aims to move (_rows_per_program)
_MIN_PROGRAMS = 264     # 2 per SM of a 132-SM H100: more rows per program only above this
_TOKEN_CHUNK_ELEMS = 512  # elements of a chunk tile of per-token rows (``_token_chunk``), 1 warp
# the row / group quantizers divide through the scale's reciprocal by default (``_quantize``'s
# RCP, ``reciprocal=``): bitwise the same codes (tests/test_kernels_quantize.py), fewer
# instructions. H100, IEEE division -> reciprocal: per-token fp8 h [131072, 768] 184 -> 147 us,
# int8 220 -> 176 us, 1 x 128 groups of x [16384, 7168] 161 -> 137 us; the rest within 4%.


@triton.jit
def _row_is_padding(row, counts_ptr, T_MAX, HAS_COUNTS: tl.constexpr):
    if HAS_COUNTS:
        return (row % T_MAX) >= tl.load(counts_ptr + row // T_MAX)
    else:
        return False


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _amax_kernel(x_ptr, amax_bits_ptr, counts_ptr, T, K, T_MAX, stride_xm,
                 HAS_COUNTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Pass 1 of dynamic per-tensor: one atomic max per program of the bits of |x|."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)        # [BM]
    row_ok = rows < T
    if HAS_COUNTS:
        cnt = tl.load(counts_ptr + rows // T_MAX, mask=row_ok, other=0)
        row_ok = row_ok & ((rows % T_MAX) < cnt)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)               # [BK]
        m = row_ok[:, None] & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=m, other=0.0)
        acc = tl.maximum(acc, _abs_bits(x))
    tl.atomic_max(amax_bits_ptr, tl.max(tl.max(acc, axis=1), axis=0))


@triton.jit
def _row_mask(rows, T, counts_ptr, T_MAX, HAS_COUNTS: tl.constexpr):
    """rows [R] -> True where the row exists (< T) and is not batched-format padding."""
    ok = rows < T
    if HAS_COUNTS:
        ok = ok & ((rows % T_MAX) < tl.load(counts_ptr + rows // T_MAX, mask=ok, other=0))
    return ok


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, scale_ptr, amax_bits_ptr, counts_ptr, z_ptr, T, K, T_MAX,
                       stride_xm, stride_qm, stride_zm,
                       MODE: tl.constexpr, QTYPE: tl.constexpr, QMAX: tl.constexpr,
                       BITWISE_FP8: tl.constexpr, HAS_COUNTS: tl.constexpr,
                       BLOCK_K: tl.constexpr, ONE_CHUNK: tl.constexpr, ROWS: tl.constexpr = 1,
                       PDL: tl.constexpr = False, RCP: tl.constexpr = False, ZERO: tl.constexpr = False):
    """ROWS rows per program as a [ROWS, BLOCK_K] tile (how many: ``_rows_per_program``, from
    H100 measurements; mostly 1 for per-token rows). Rows past T and padding rows are
    masked off (no early exit: the other rows of the tile still run). MODE "token": scale_ptr
    [T] is written, one scale per row (tl.max over axis 1); "tensor_static": scale_ptr [1]
    is read; "tensor_dynamic": the scale comes from amax_bits_ptr, program 0 writes it.
    PDL (a programmatic dependent launch in a chain): let the next kernel launch now, wait
    for the previous one before reading x. ZERO: also store zeros into the same columns of
    z [T, K] (row stride stride_zm), the output a later atomic k-sum adds into: its zeroing
    rides on this kernel instead of a launch of its own."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)                                      # [R]
    row_ok = _row_mask(rows, T, counts_ptr, T_MAX, HAS_COUNTS)[:, None]         # [R, 1]
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_xm                     # [R, 1]
    q_rows = q_ptr + rows[:, None].to(tl.int64) * stride_qm
    z_rows = z_ptr + rows[:, None].to(tl.int64) * stride_zm
    cols = tl.arange(0, BLOCK_K)[None, :]                                       # [1, BK]
    if MODE == "tensor_dynamic":
        scale = _scale_from_amax_bits(tl.load(amax_bits_ptr), QMAX, False)
        if pid == 0:
            tl.store(scale_ptr, scale)
    if MODE == "token":
        if ONE_CHUNK:                                   # the rows fit: read them once
            m = row_ok & (cols < K)
            x = tl.load(x_rows + cols, mask=m, other=0.0)
            bits = tl.max(_abs_bits(x), axis=1)
        else:
            acc = tl.zeros((ROWS, BLOCK_K), dtype=tl.int32)
            for k0 in range(0, K, BLOCK_K):
                xk = tl.load(x_rows + k0 + cols, mask=row_ok & (k0 + cols < K), other=0.0)
                acc = tl.maximum(acc, _abs_bits(xk))
            bits = tl.max(acc, axis=1)
        row_scale = _scale_from_amax_bits(bits, QMAX, False)                    # [R]
        tl.store(scale_ptr + rows[:, None], row_scale[:, None], mask=row_ok)
        scale = row_scale[:, None]                                              # [R, 1]
    elif MODE == "tensor_static":
        scale = tl.load(scale_ptr)
    if ONE_CHUNK and MODE == "token":
        tl.store(q_rows + cols, _quantize(x, scale, QTYPE, BITWISE_FP8, RCP), mask=m)
        if ZERO:
            tl.store(z_rows + cols, tl.zeros((ROWS, BLOCK_K), dtype=z_ptr.dtype.element_ty), mask=m)
    else:
        for k0 in range(0, K, BLOCK_K):
            mk = row_ok & (k0 + cols < K)
            xk = tl.load(x_rows + k0 + cols, mask=mk, other=0.0)
            tl.store(q_rows + k0 + cols, _quantize(xk, scale, QTYPE, BITWISE_FP8, RCP), mask=mk)
            if ZERO:
                tl.store(z_rows + k0 + cols, tl.zeros((ROWS, BLOCK_K), dtype=z_ptr.dtype.element_ty), mask=mk)


@triton.jit
def _quant_group_kernel(x_ptr, q_ptr, scale_ptr, counts_ptr, z_ptr, T, K, G, T_MAX,
                        stride_xm, stride_qm, stride_sm, stride_zm,
                        GROUP: tl.constexpr, GROUP_P2: tl.constexpr, GROUPS_PER_PROG: tl.constexpr,
                        POW2: tl.constexpr, BITWISE_FP8: tl.constexpr, HAS_COUNTS: tl.constexpr,
                        ROWS: tl.constexpr = 1, PDL: tl.constexpr = False, RCP: tl.constexpr = False,
                        ZERO: tl.constexpr = False):
    """Program (i, j) quantizes groups [j*GPP, (j+1)*GPP) of rows [i*ROWS, (i+1)*ROWS) as a
    [ROWS, GPP, g] tile (several rows per program for the reason given in
    ``_quant_rows_kernel``); rows past T and padding rows are masked off. PDL and ZERO as
    there."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)                         # [R]
    row_ok = _row_mask(rows, T, counts_ptr, T_MAX, HAS_COUNTS)[:, None]         # [R, 1]
    grp = tl.program_id(1) * GROUPS_PER_PROG + tl.arange(0, GROUPS_PER_PROG)   # [GPP]
    j = tl.arange(0, GROUP_P2)                                                  # [g padded]
    cols = (grp[:, None] * GROUP + j[None, :])[None, :, :]                      # [1, GPP, g]
    m = row_ok[:, :, None] & (j[None, None, :] < GROUP) & (cols < K)            # [R, GPP, g]
    r64 = rows.to(tl.int64)[:, None]                                            # [R, 1]
    x = tl.load(x_ptr + (r64 * stride_xm)[:, :, None] + cols, mask=m, other=0.0)
    scale = _scale_from_amax_bits(tl.max(_abs_bits(x), axis=2), 448.0, POW2)   # [R, GPP]
    tl.store(scale_ptr + r64 * stride_sm + grp[None, :], scale, mask=row_ok & (grp[None, :] < G))
    tl.store(q_ptr + (r64 * stride_qm)[:, :, None] + cols,
             _quantize(x, scale[:, :, None], "fp8", BITWISE_FP8, RCP), mask=m)
    if ZERO:
        tl.store(z_ptr + (r64 * stride_zm)[:, :, None] + cols,
                 tl.zeros((ROWS, GROUPS_PER_PROG, GROUP_P2), dtype=z_ptr.dtype.element_ty), mask=m)


@triton.jit
def _act_quant_kernel(h_ptr, q_ptr, scale_ptr, counts_ptr, I, G, T_MAX,
                      stride_hm, stride_qm, stride_sm,
                      swiglu_limit, alpha, limit,
                      ACTIVATION: tl.constexpr, GATED: tl.constexpr, CLAMP: tl.constexpr,
                      MODE: tl.constexpr, QTYPE: tl.constexpr, QMAX: tl.constexpr, POW2: tl.constexpr,
                      BITWISE_FP8: tl.constexpr, HAS_COUNTS: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """act(h[row]) -> quantized [I]. Program (row, j) covers columns [j*BLOCK_G*GROUP, ...) as
    a [BLOCK_G, GROUP] tile ("token" mode: one program per row, BLOCK_G = 1, GROUP = BLOCK_C).
    Gated h is in halves layout: gate columns [0, I), up columns [I, 2I)."""
    row = tl.program_id(0)
    if _row_is_padding(row, counts_ptr, T_MAX, HAS_COUNTS):
        return
    h_row = h_ptr + row.to(tl.int64) * stride_hm
    q_row = q_ptr + row.to(tl.int64) * stride_qm
    grp = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)                   # [BG]
    j = tl.arange(0, BLOCK_C)                                                   # [BC]
    if MODE == "token":
        # pass 1: amax of the activated row; pass 2 recomputes the activation (cheaper than a
        # round trip through memory, and bitwise identical)
        bits = tl.zeros((BLOCK_C,), dtype=tl.int32)
        for c0 in range(0, I, BLOCK_C):
            m = c0 + j < I
            x = tl.load(h_row + c0 + j, mask=m, other=0.0).to(tl.float32)
            if GATED:
                u = tl.load(h_row + I + c0 + j, mask=m, other=0.0).to(tl.float32)
                a = gated_activation(x, u, ACTIVATION, CLAMP, swiglu_limit, alpha, limit)
            else:
                a = plain_activation(x, ACTIVATION)
            bits = tl.maximum(bits, tl.where(m, _abs_bits(a), 0))
        scale = _scale_from_amax_bits(tl.max(bits, axis=0), QMAX, False)
        tl.store(scale_ptr + row.to(tl.int64) * stride_sm, scale)
        for c0 in range(0, I, BLOCK_C):
            m = c0 + j < I
            x = tl.load(h_row + c0 + j, mask=m, other=0.0).to(tl.float32)
            if GATED:
                u = tl.load(h_row + I + c0 + j, mask=m, other=0.0).to(tl.float32)
                a = gated_activation(x, u, ACTIVATION, CLAMP, swiglu_limit, alpha, limit)
            else:
                a = plain_activation(x, ACTIVATION)
            tl.store(q_row + c0 + j, _quantize(a, scale, QTYPE, BITWISE_FP8), mask=m)
    else:
        cols = grp[:, None] * GROUP + j[None, :]                                # [BG, BC]
        m = (j[None, :] < GROUP) & (cols < I)
        x = tl.load(h_row + cols, mask=m, other=0.0).to(tl.float32)
        if GATED:
            u = tl.load(h_row + I + cols, mask=m, other=0.0).to(tl.float32)
            a = gated_activation(x, u, ACTIVATION, CLAMP, swiglu_limit, alpha, limit)
        else:
            a = plain_activation(x, ACTIVATION)
        if MODE == "group":
            scale = _scale_from_amax_bits(tl.max(tl.where(m, _abs_bits(a), 0), axis=1), QMAX, POW2)  # [BG]
            tl.store(scale_ptr + row.to(tl.int64) * stride_sm + grp, scale, mask=grp < G)
            tl.store(q_row + cols, _quantize(a, scale[:, None], QTYPE, BITWISE_FP8), mask=m)
        else:
            tl.static_assert(MODE == "tensor_static")
            tl.store(q_row + cols, _quantize(a, tl.load(scale_ptr), QTYPE, BITWISE_FP8), mask=m)


# ----------------------------------------------------------------------------- launchers
def _rows(x: torch.Tensor):
    """x [..., K] -> (x2 [T, K] with unit last stride, T_max of the batched format or 0)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, (x.shape[-2] if x.dim() == 3 else 0)


def _bitwise_fp8(t: torch.Tensor) -> bool:
    # Triton runs CPU tensors only under TRITON_INTERPRET=1, whose fp8 cast is not RNE
    return t.device.type != "cuda"


def _q_arg(q2: torch.Tensor) -> torch.Tensor:
    return q2.view(torch.uint8) if (q2.dtype == torch.float8_e4m3fn and _bitwise_fp8(q2)) else q2


def _block_k(K: int) -> int:
    return min(next_power_of_2(max(K, 16)), _MAX_BLOCK_K)


def _rows_per_program(T: int, tile: int, elem_size: int, chunks: int = 1, groups: bool = False) -> int:
    """Rows per program of the row quantizers, for T rows, ``tile`` elements (BLOCK_K, or
    GPP * g, ``groups``) per row and program, ``chunks`` programs per row (``elem_size``
    kept for the callers; the rule counts elements).

    Measured on the H100, bf16 input, us
    at ROWS 1 / 2 / 4 / 8: per-token h [131072, 768] (tile 1024) 183 / 202 / 228 / 259 and x
    [16384, 2048] (tile 2048) 43.0 / 40.3 / 46.3 / 59.2; 1 x 128 groups h [131072, 256]
    (tile 256) 90.2 / 56.8 / 43.4 / 39.2 and x [16384, 7168] (tile 2048) 160 / 174 / 184 /
    238. So: up to _PROG_ELEMS (2048) elements per program for group tiles, and per-token
    tiles of 2048+ take 2 rows. Never fewer than _MIN_PROGRAMS programs (T = 1: one)."""
    r = _PROG_ELEMS // tile if groups else (2 if tile >= _PROG_ELEMS else 1)
    r = min(32, r, T * chunks // _MIN_PROGRAMS)
    return 1 << (max(r, 1).bit_length() - 1)


def _token_chunk(K: int) -> int:
    """BLOCK_K for per-token rows read in chunks (an amax pass, then a quantize pass that
    reads the row again from L1 / L2), or 0 for one power-of-two tile per row. A K that is
    not a power of two but a multiple of 256 (up to _MAX_BLOCK_K) is read in chunks of its
    largest power-of-two divisor, so no lane of the tile is masked off: the one tile of
    K = 768 is 1024 wide, a quarter of its lanes idle, in a kernel that is issue-bound.

    H100, h [131072, 768] bf16, us with one 1024 tile a row vs chunks of 256, 2 rows a program, 1 warp
    (the best of rows 1-8 x warps 1-4): fp8 147 -> 110, int8 176 -> 123. Only K = 768 is
    measured; other such K take the same elements per program (_TOKEN_CHUNK_ELEMS)."""
    if K & (K - 1) == 0 or K % 256 or K > _MAX_BLOCK_K:
        return 0
    return K & -K


def _check_rows(rows: int, name: str = "rows_per_program") -> int:
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"{name} must be a power of two >= 1, got {rows}")
    return rows


def _launch_rows(x, q, scale, mode, qtype, counts, amax_bits=None, pdl=False, rows=None, num_warps=None,
                 reciprocal=None, block_k=None, zero=None):
    # (rows / num_warps / block_k given: a sweep's point; None: the rules)
    spec = _rows_spec(x, q, scale, mode, qtype, counts, amax_bits, pdl, rows, num_warps, reciprocal, block_k, zero)
    if spec is not None:
        launch(*spec)


def _zero_arg(zero: Optional[torch.Tensor], x2: torch.Tensor, counts) -> tuple:
    """(z [T, K], its row stride, ZERO) for the quantizers' fused zeroing of ``zero``, a
    tensor shaped as x (standard format only) that a later kernel sums into; (x2, 0, False)
    for none. Clear errors for a tensor the kernel could not zero in place."""
    if zero is None:
        return x2, 0, False
    T, K = x2.shape
    if counts is not None:
        raise ValueError("zero=: only for the standard format (counts is given: batched rows)")
    if zero.device != x2.device or not zero.is_floating_point():
        raise ValueError(f"zero=: a floating tensor on {x2.device} (got {zero.dtype} on {zero.device})")
    if zero.dim() != 2 or tuple(zero.shape) != (T, K) or zero.stride(-1) != 1:
        raise ValueError(f"zero=: a [{T}, {K}] tensor with unit last stride, as x (got shape "
                         f"{tuple(zero.shape)}, strides {zero.stride()})")
    return zero, zero.stride(0), True


def _rows_spec(x, q, scale, mode, qtype, counts, amax_bits=None, pdl=False, rows=None, num_warps=None,
               reciprocal=None, block_k=None, zero=None):
    """``_launch_rows``'s launch as (kernel, grid, args, constexprs, num_warps, num_stages,
    launch_pdl), x2 (the rows of x) at args[0]; None for no rows. ``zero``: see _zero_arg."""
    x2, t_max = _rows(x)
    q2 = q.view(-1, x.shape[-1])
    T, K = x2.shape
    z2, stride_z, zero_on = _zero_arg(zero, x2, counts)
    if T == 0:
        return None
    chunk = _token_chunk(K) if mode == "token" and block_k is None else 0
    if chunk:               # the measured chunked rule (``_token_chunk``)
        block_k = chunk
        rows = rows or max(1, min(_TOKEN_CHUNK_ELEMS // chunk, T // _MIN_PROGRAMS))
        num_warps = num_warps or max(1, min(8, rows * chunk // _TOKEN_CHUNK_ELEMS))
    bk = _block_k(K) if block_k is None else block_k
    rows = _check_rows(rows) if rows is not None else _rows_per_program(T, bk, x2.element_size())
    return (_quant_rows_kernel, (cdiv(T, rows),),
            (x2, _q_arg(q2), scale, amax_bits if amax_bits is not None else scale,
             counts if counts is not None else scale, z2, T, K, max(t_max, 1), x2.stride(0), q2.stride(0),
             stride_z),
            dict(MODE=mode, QTYPE=qtype, QMAX=FP8_MAX if qtype == "fp8" else INT8_MAX,
                 BITWISE_FP8=_bitwise_fp8(x2), HAS_COUNTS=counts is not None,
                 BLOCK_K=bk, ONE_CHUNK=K <= bk, ROWS=rows, PDL=pdl,
                 RCP=True if reciprocal is None else bool(reciprocal), ZERO=zero_on),
            num_warps or (8 if rows * bk >= 2048 else 4), None, pdl)   # 4..32 elements per thread


def quant_fp8_tensor(x: torch.Tensor, scale=None, *, out: Optional[torch.Tensor] = None,
                     out_scale: Optional[torch.Tensor] = None, counts: Optional[torch.Tensor] = None,
                     rows_per_program: Optional[int] = None, zero: Optional[torch.Tensor] = None):
    """x float [..., K] -> (float8_e4m3fn [..., K], fp32 [1]).

    ``scale`` None: dynamic, amax(x) / 448 computed on the device (2 launches + a memset);
    else a static per-tensor scale (fp32 [1] tensor or float), returned as given.
    ``rows_per_program``: rows per program of the quantizing launch (a power of two; None:
    the ``_rows_per_program`` rule); the result does not depend on it. ``zero`` as in
    ``quant_fp8_token`` (filled by the quantizing launch).
    """
    q = out if out is not None else torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if scale is not None:
        s = scale if isinstance(scale, torch.Tensor) else torch.full((1,), float(scale), device=x.device)
        s = s.reshape(1).float()
        _launch_rows(x, q, s, "tensor_static", "fp8", counts, rows=rows_per_program, zero=zero)
        return q, s
    s = out_scale if out_scale is not None else torch.empty(1, dtype=torch.float32, device=x.device)
    amax_bits = torch.zeros(1, dtype=torch.int32, device=x.device)
    x2, t_max = _rows(x)
    T, K = x2.shape
    if T == 0:
        s.fill_(_AMAX_FLOOR / FP8_MAX)
        return q, s
    bk = min(_block_k(K), 1024)
    bm = max(1, min(next_power_of_2(cdiv(T, 256)), 4096 // bk))   # ~256 programs at most
    launch(_amax_kernel, (cdiv(T, bm),),
           (x2, amax_bits, counts if counts is not None else amax_bits, T, K, max(t_max, 1), x2.stride(0)),
           dict(HAS_COUNTS=counts is not None, BLOCK_M=bm, BLOCK_K=bk), num_warps=4)
    _launch_rows(x, q, s, "tensor_dynamic", "fp8", counts, amax_bits, rows=rows_per_program, zero=zero)
    return q, s


def _quant_token(x, dtype, qtype, out, out_scale, counts, pdl=False, rows=None, num_warps=None, reciprocal=None,
                 block_k=None, zero=None):
    q = out if out is not None else torch.empty(x.shape, dtype=dtype, device=x.device)
    s = out_scale if out_scale is not None else torch.empty((*x.shape[:-1], 1), dtype=torch.float32,
                                                            device=x.device)
    _launch_rows(x, q, s, "token", qtype, counts, pdl=pdl, rows=rows, num_warps=num_warps, reciprocal=reciprocal,
                 block_k=block_k and _check_rows(block_k, "block_k"), zero=zero)
    return q, s


def quant_fp8_token(x: torch.Tensor, *, out: Optional[torch.Tensor] = None,
                    out_scale: Optional[torch.Tensor] = None, counts: Optional[torch.Tensor] = None,
                    pdl: bool = False, rows_per_program: Optional[int] = None,
                    reciprocal: Optional[bool] = None, zero: Optional[torch.Tensor] = None):
    """x float [..., K] -> (float8_e4m3fn [..., K], fp32 [..., 1]); scale per row = amax / 448.
    ``pdl`` (sm90+): a programmatic dependent launch that also lets the next kernel launch
    early (the decode chain of the triton backend). ``rows_per_program`` as in
    ``quant_fp8_tensor``; ``reciprocal`` as in ``quant_fp8_group``. ``zero``: a float tensor
    of x's 2-D shape [T, K] that the same launch fills with zeros (the grouped path's atomic
    k-sum output; standard format only)."""
    return _quant_token(x, torch.float8_e4m3fn, "fp8", out, out_scale, counts, pdl, rows_per_program,
                        reciprocal=reciprocal, zero=zero)


def quant_int8_token(x: torch.Tensor, *, out: Optional[torch.Tensor] = None,
                     out_scale: Optional[torch.Tensor] = None, counts: Optional[torch.Tensor] = None,
                     pdl: bool = False, rows_per_program: Optional[int] = None,
                     reciprocal: Optional[bool] = None, zero: Optional[torch.Tensor] = None):
    """x float [..., K] -> (int8 [..., K], fp32 [..., 1]); scale = amax / 127, round half to even.
    ``pdl``, ``rows_per_program``, ``reciprocal`` and ``zero`` as in ``quant_fp8_token``."""
    return _quant_token(x, torch.int8, "int8", out, out_scale, counts, pdl, rows_per_program,
                        reciprocal=reciprocal, zero=zero)


def quant_fp8_group(x: torch.Tensor, group: int = 128, pow2: bool = False, *,
                    out: Optional[torch.Tensor] = None, out_scale: Optional[torch.Tensor] = None,
                    counts: Optional[torch.Tensor] = None, pdl: bool = False,
                    rows_per_program: Optional[int] = None, reciprocal: Optional[bool] = None,
                    zero: Optional[torch.Tensor] = None):
    """x float [..., K] -> (float8_e4m3fn [..., K], fp32 [..., G]), 1 x group blocks; the last
    group may be partial. ``pow2``: scales rounded up to powers of two (UE8M0-style). ``pdl``,
    ``rows_per_program`` and ``zero`` as in ``quant_fp8_token``; ``reciprocal`` None:
    ``reciprocal`` (the division through the scale's reciprocal, ``_quantize``'s RCP; the same
    codes)."""
    K = x.shape[-1]
    G = cdiv(K, group)
    q = out if out is not None else torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = out_scale if out_scale is not None else torch.empty((*x.shape[:-1], G), dtype=torch.float32,
                                                            device=x.device)
    spec = _group_spec(x, q, s, group, pow2, counts, pdl, rows_per_program, reciprocal, zero)
    if spec is not None:
        launch(*spec)
    return q, s


def _group_spec(x, q, s, group, pow2, counts=None, pdl=False, rows_per_program=None, reciprocal=None,
                zero=None):
    """``quant_fp8_group``'s launch into q / s as a spec tuple (x2 at args[0]); None for no rows."""
    K = x.shape[-1]
    G = cdiv(K, group)
    x2, t_max = _rows(x)
    q2, s2 = q.view(-1, K), s.view(-1, G)
    z2, stride_z, zero_on = _zero_arg(zero, x2, counts)
    T = x2.shape[0]
    if T == 0:
        return None
    gp2 = next_power_of_2(group)
    gpp = max(1, min(next_power_of_2(G), 2048 // gp2))      # <= 2K elements of a row per program
    chunks = cdiv(G, gpp)
    rows = (_check_rows(rows_per_program) if rows_per_program is not None
            else _rows_per_program(T, gpp * gp2, x2.element_size(), chunks, groups=True))
    return (_quant_group_kernel, (cdiv(T, rows), chunks),
            (x2, _q_arg(q2), s2, counts if counts is not None else s2, z2, T, K, G, max(t_max, 1),
             x2.stride(0), q2.stride(0), s2.stride(0), stride_z),
            dict(GROUP=group, GROUP_P2=gp2, GROUPS_PER_PROG=gpp, POW2=bool(pow2),
                 BITWISE_FP8=_bitwise_fp8(x2), HAS_COUNTS=counts is not None, ROWS=rows, PDL=pdl,
                 RCP=True if reciprocal is None else bool(reciprocal), ZERO=zero_on),
            8 if rows * gpp * gp2 > 4096 else 4, None, pdl)   # at most 32 per thread


def quant_launch(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, method: str, group: int = 128,
                 pow2: bool = False, pdl: bool = False):
    """The launch spec (kernel, grid, args, constexprs, num_warps, num_stages, launch_pdl) of
    quantizing 2-D x [T, K] (unit last stride, T > 0) into given q / s the way ``method`` does:
    'fp8_channel' / 'int8_channel' per token (s [T, 1]), 'fp8_block' in 1 x ``group`` groups
    (s [T, K / group]); x is args[0], for ``launcher.bind(..., slots=[0])`` (the triton
    backend's decode chain: repeated calls only swap x)."""
    assert x.dim() == 2 and x.stride(-1) == 1 and x.shape[0] > 0, "x: [T > 0, K] with unit last stride"
    if method == "fp8_block":
        return _group_spec(x, q, s, group, pow2, pdl=pdl)
    assert method in ("fp8_channel", "int8_channel"), method
    return _rows_spec(x, q, s, "token", "fp8" if method == "fp8_channel" else "int8", None, pdl=pdl)


def act_and_quant(h: torch.Tensor, activation, mode: str = "token", group: int = 128, *,
                  scale: Optional[torch.Tensor] = None, pow2: bool = False,
                  quant_dtype: torch.dtype = torch.float8_e4m3fn,
                  swiglu_limit: Optional[float] = None, alpha: float = 1.702, limit: float = 7.0,
                  out: Optional[torch.Tensor] = None, out_scale: Optional[torch.Tensor] = None,
                  counts: Optional[torch.Tensor] = None):
    """GEMM1 output h [..., N] (gated: halves layout, N = 2I) -> (q [..., I], scale), fused.

    mode "token": scale fp32 [..., 1] (fp8 or int8); "group": fp32 [..., ceil(I/group)] (fp8,
    ``pow2`` optional); "tensor_static": ``scale`` fp32 [1] given and returned (fp8).
    Same result as ``apply_activation`` (fp32) followed by the reference quantizer.
    """
    act = str(getattr(activation, "value", activation))     # an Activation or its name
    if act not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)} (got {activation!r})")
    gated = not act.endswith("_no_mul")
    N = h.shape[-1]
    I = N // 2 if gated else N
    lead = h.shape[:-1]
    qtype = "int8" if quant_dtype == torch.int8 else "fp8"
    q = out if out is not None else torch.empty((*lead, I), dtype=quant_dtype, device=h.device)
    G = cdiv(I, group) if mode == "group" else 1
    if mode == "tensor_static":
        s = scale.reshape(1).float()
    elif out_scale is not None:
        s = out_scale
    else:
        s = torch.empty((*lead, G), dtype=torch.float32, device=h.device)
    h2, t_max = _rows(h)
    q2 = q.view(-1, I)
    M = h2.shape[0]
    if M == 0:
        return q, s
    if mode == "token":
        bc = min(next_power_of_2(max(I, 16)), 2048)
        grid, block_g, grp = (M, 1), 1, bc
    elif mode == "group":
        bc = next_power_of_2(group)
        block_g = max(1, min(next_power_of_2(G), 2048 // bc))
        grid, grp = (M, cdiv(G, block_g)), group
    else:
        bc = min(next_power_of_2(max(I, 16)), 2048)
        block_g, grp = 1, bc
        grid = (M, cdiv(I, bc))
    s2 = s.view(-1, s.shape[-1]) if mode != "tensor_static" else s
    launch(_act_quant_kernel, grid,
           (h2, _q_arg(q2), s2, counts if counts is not None else s2, I, G, max(t_max, 1),
            h2.stride(0), q2.stride(0), s2.stride(0) if mode != "tensor_static" else 0,
            float(swiglu_limit) if swiglu_limit is not None else 0.0, float(alpha), float(limit)),
           dict(ACTIVATION=act, GATED=gated, CLAMP=swiglu_limit is not None,
                MODE=mode, QTYPE=qtype, QMAX=FP8_MAX if qtype == "fp8" else INT8_MAX, POW2=bool(pow2),
                BITWISE_FP8=_bitwise_fp8(h2), HAS_COUNTS=counts is not None,
                GROUP=grp, BLOCK_G=block_g, BLOCK_C=bc), num_warps=4)
    return q, s
