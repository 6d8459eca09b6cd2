"""Expert GEMMs over the batched activation format (the ``triton_batched`` backend).

Legend: E = E_loc local experts, T_max rows per expert (the batched buffer's depth),
H hidden, I intermediate, N = 2I for gated activations (I otherwise), K the reduction dim
(H for GEMM1, I for GEMM2), BM/BN/BK the tile, bn x bk the fp8_block weight block.

  x      [E, T_max, H]   rows t >= counts[e] are padding (garbage, maybe NaN): never read
  counts int32 [E]       valid rows per expert, read on the device (no host sync)
  w13    [E, N, H]       halves layout: gate rows [0, I), up rows [I, 2I)
  w2     [E, H, I]
  GEMM1: h   [E, T_max, I] = act(x[e] @ w13[e]^T + b13[e])   (gate and up tiles in one
         program, two accumulators, activation in the epilogue)
  GEMM2: out [E, T_max, H] = h[e] @ w2[e]^T + b2[e]           (unweighted: finalize applies
         the routing weights and the reduction)
Output rows t >= counts[e] are left unwritten.

Grid: (cdiv(T_max, BM) * cdiv(N_out, BN), E). The tile index is on axis 0 (limit 2**31,
axis 1 stops at 65535); the m-block varies fastest so neighbouring programs share one
weight tile in L2. A program whose m-block starts at or past counts[e] exits at once.

Scales (``scale_mode``), applied in fp32:
  'none'
  'tensor'  a_scale [1] or [E] (per expert), b_scale [E]; after the K loop
  'channel' a_scale [E, T_max, 1] (per token; [1] broadcasts), b_scale [E, N]; after the loop
  'block'   a_scale [E, T_max, ceil(K/bk)], b_scale [E, ceil(N/bn), ceil(K/bk)]; every K
            step adds dot * a_s * b_s, so BLOCK_SIZE_K must divide bk
  BLOCK_SIZE_K >= 32 for fp8 / int8 operands (tl.dot's minimum on the GPU), >= 16 otherwise.
  Per-token / per-group activation scales may also come flattened, [E * T_max, 1 or K/bk].
Operands fp16 / bf16 / fp32 (fp32: IEEE dot, no tf32, to match torch), float8_e4m3fn, int8
(int32 accumulation). Both operands have the same dtype.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import ACTIVATIONS, gated_activation, plain_activation
from .launcher import COMPILE_OPTIONS

__all__ = ["batched_gemm1_act", "batched_gemm2", "default_batched_config"]


@triton.jit
def _batched_gemm_kernel(
    a_ptr, b_ptr, c_ptr, counts_ptr, bias_ptr, a_scale_ptr, b_scale_ptr,
    T_MAX, N, K, UP_OFFSET,
    stride_ae, stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_ce, stride_cm, stride_cn,
    stride_bias_e, stride_bias_n,
    stride_ase, stride_asm, stride_ask,
    stride_bse, stride_bsn, stride_bsk,
    swiglu_limit, alpha, limit,
    ACTIVATION: tl.constexpr, GATED: tl.constexpr, CLAMP: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCALE_MODE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    ACC_INT: tl.constexpr, IEEE_FP32: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    """One [BM, BN] output tile of one expert. GATED: columns n of the output read weight
    rows n (gate) and UP_OFFSET + n (up). SCALE_MODE: "none" | "outer" | "block"."""
    pid = tl.program_id(0)
    e = tl.program_id(1)
    num_pid_m = tl.cdiv(T_MAX, BLOCK_SIZE_M)
    pid_m = pid % num_pid_m
    pid_n = pid // num_pid_m
    count = tl.load(counts_ptr + e)
    if pid_m * BLOCK_SIZE_M >= count:
        return
    e64 = e.to(tl.int64)                                 # E * N * K overflows int32 on big models
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)     # [BM] rows of this expert
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)     # [BN] output columns
    offs_k = tl.arange(0, BLOCK_SIZE_K)                            # [BK]
    m_ok = offs_m < count                                # padding rows are never loaded
    n_ok = offs_n < N

    a_ptrs = a_ptr + e64 * stride_ae + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak   # [BM, BK]
    b_ptrs = b_ptr + e64 * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk   # [BK, BN]
    up_shift = UP_OFFSET * stride_bn
    acc_dtype = tl.int32 if ACC_INT else tl.float32
    if SCALE_MODE == "block":
        acc_dtype = tl.float32                           # per-block rescale happens in fp32
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=acc_dtype)
    acc_up = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=acc_dtype)
    if SCALE_MODE == "block":
        as_ptrs = a_scale_ptr + e64 * stride_ase + offs_m * stride_asm                    # [BM]
        bs_ptrs = b_scale_ptr + e64 * stride_bse + (offs_n // GROUP_N) * stride_bsn        # [BN]
        bs_up_ptrs = b_scale_ptr + e64 * stride_bse + ((offs_n + UP_OFFSET) // GROUP_N) * stride_bsn

    for k0 in range(0, K, BLOCK_SIZE_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)               # [BM, BK]
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)               # [BK, BN]
        if GATED:
            b_up = tl.load(b_ptrs + up_shift, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if SCALE_MODE == "block":
            kb = k0 // GROUP_K
            a_s = tl.load(as_ptrs + kb * stride_ask, mask=m_ok, other=0.0)               # [BM]
            b_s = tl.load(bs_ptrs + kb * stride_bsk, mask=n_ok, other=0.0)               # [BN]
            part = _dot(a, b, ACC_INT, IEEE_FP32)
            acc += part.to(tl.float32) * a_s[:, None] * b_s[None, :]
            if GATED:
                b_s_up = tl.load(bs_up_ptrs + kb * stride_bsk, mask=n_ok, other=0.0)
                part_up = _dot(a, b_up, ACC_INT, IEEE_FP32)
                acc_up += part_up.to(tl.float32) * a_s[:, None] * b_s_up[None, :]
        else:
            acc = _dot_acc(a, b, acc, ACC_INT, IEEE_FP32)
            if GATED:
                acc_up = _dot_acc(a, b_up, acc_up, ACC_INT, IEEE_FP32)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # epilogue: scales -> bias -> activation, in fp32
    acc = acc.to(tl.float32)
    acc_up = acc_up.to(tl.float32)
    if SCALE_MODE == "outer":
        a_s = tl.load(a_scale_ptr + e64 * stride_ase + offs_m * stride_asm, mask=m_ok, other=0.0)   # [BM]
        b_s = tl.load(b_scale_ptr + e64 * stride_bse + offs_n * stride_bsn, mask=n_ok, other=0.0)   # [BN]
        acc = acc * a_s[:, None] * b_s[None, :]
        if GATED:
            b_s_up = tl.load(b_scale_ptr + e64 * stride_bse + (offs_n + UP_OFFSET) * stride_bsn,
                             mask=n_ok, other=0.0)
            acc_up = acc_up * a_s[:, None] * b_s_up[None, :]
    if HAS_BIAS:
        bias_row = bias_ptr + e64 * stride_bias_e
        acc += tl.load(bias_row + offs_n * stride_bias_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(bias_row + (offs_n + UP_OFFSET) * stride_bias_n, mask=n_ok,
                              other=0.0).to(tl.float32)[None, :]
    if GATED:
        out = gated_activation(acc, acc_up, ACTIVATION, CLAMP, swiglu_limit, alpha, limit)
    else:
        out = plain_activation(acc, ACTIVATION)
    c_ptrs = c_ptr + e64 * stride_ce + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _dot(a, b, ACC_INT: tl.constexpr, IEEE_FP32: tl.constexpr):
    if ACC_INT:
        return tl.dot(a, b, out_dtype=tl.int32)
    elif IEEE_FP32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _dot_acc(a, b, acc, ACC_INT: tl.constexpr, IEEE_FP32: tl.constexpr):
    if ACC_INT:
        return tl.dot(a, b, acc, out_dtype=tl.int32)
    elif IEEE_FP32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


# ----------------------------------------------------------------------------- launchers
_MODES = {"none": "none", "tensor": "outer", "channel": "outer", "block": "block"}


def default_batched_config(T_max: int, E: int, N: int, K: int, dtype, block_shape=None) -> dict:
    """Launch config for a batched GEMM with T_max rows per expert, weights [E, N, K] of ``dtype``.

    Small T_max (decode) is weight-bandwidth bound: a short BM wastes no MMA rows and a wide
    BN/BK streams the weights; large T_max gets the 64 x 128 tile. 1-byte operands take twice
    the BK for the same bytes per stage. ``block_shape`` (bn, bk): BK is capped to divide bk.
    """
    one_byte = dtype in (torch.float8_e4m3fn, torch.int8)
    if T_max <= 16:
        bm, bn, warps = 16, 64, 4
    elif T_max <= 32:
        bm, bn, warps = 32, 64, 4
    elif T_max <= 96:
        bm, bn, warps = 64, 64, 4
    else:
        bm, bn, warps = 64, 128, 8
    bk = 128 if one_byte else 64
    stages = 2 if dtype == torch.float32 else (4 if T_max <= 32 else 3)
    if dtype == torch.float32:
        bk = 32                                  # fp32 tiles are 4 B/elt: keep shared memory in check
    if block_shape is not None:
        bk = min(bk, block_shape[1])
        while block_shape[1] % bk:
            bk //= 2
    # tl.dot needs K >= 32 for 1-byte operands on the GPU (16 for 16-bit ones)
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": max(bk, 32 if one_byte else 16),
            "num_warps": warps, "num_stages": stages}


def _scale_strides(t: Optional[torch.Tensor], is_weight: bool, T_max: int):
    """(expert, row/column, k-block) strides of a scale tensor; 0 where it broadcasts."""
    if t is None:
        return 0, 0, 0
    if t.dim() == 1:                       # [1] per tensor, or [E] per expert
        return (t.stride(0) if t.numel() > 1 else 0), 0, 0
    if t.dim() == 2:
        if is_weight:                      # [E, N] per channel
            return t.stride(0), t.stride(1), 0
        # activations flattened to [E * T_max, 1 or K/bk] (what the quantizers return for a
        # [E * T_max, K] view of the batched buffer)
        return T_max * t.stride(0), t.stride(0), (t.stride(1) if t.shape[1] > 1 else 0)
    return t.stride(0), t.stride(1), (t.stride(2) if t.shape[2] > 1 else 0)


def _launch(a, counts, b, c, activation, gated, bias, swiglu_limit, alpha, limit,
            a_scale, b_scale, scale_mode, block_shape, config):
    E, T_max, K = a.shape
    N_out = c.shape[2]
    if E == 0 or T_max == 0 or N_out == 0:
        return c
    mode = _MODES[scale_mode]
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    group_n, group_k = (block_shape if block_shape is not None else (1, 1))
    assert mode != "block" or group_k % bk == 0, "BLOCK_SIZE_K must divide the scale block bk"
    acc_int = a.dtype == torch.int8
    ase, asm, ask = _scale_strides(a_scale, False, T_max)
    bse, bsn, bsk = _scale_strides(b_scale, True, T_max)
    dummy = c
    grid = (triton.cdiv(T_max, bm) * triton.cdiv(N_out, bn), E)
    _batched_gemm_kernel[grid](
        a, b, c, counts, bias if bias is not None else dummy,
        a_scale if a_scale is not None else dummy, b_scale if b_scale is not None else dummy,
        T_max, N_out, K, N_out if gated else 0,
        a.stride(0), a.stride(1), a.stride(2),
        b.stride(0), b.stride(1), b.stride(2),
        c.stride(0), c.stride(1), c.stride(2),
        bias.stride(0) if bias is not None else 0, bias.stride(1) if bias is not None else 0,
        ase, asm, ask, bse, bsn, bsk,
        float(swiglu_limit) if swiglu_limit is not None else 0.0, float(alpha), float(limit),
        ACTIVATION=activation, GATED=gated, CLAMP=swiglu_limit is not None, HAS_BIAS=bias is not None,
        SCALE_MODE=mode, GROUP_N=group_n, GROUP_K=group_k,
        ACC_INT=acc_int, IEEE_FP32=a.dtype == torch.float32,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
        num_warps=config.get("num_warps", 4), num_stages=config.get("num_stages", 3),
        **COMPILE_OPTIONS)
    return c


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    # quantized operands produce the 16-bit compute dtype
    return x.dtype if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.bfloat16


def batched_gemm1_act(x: torch.Tensor, counts: torch.Tensor, w13: torch.Tensor, activation,
                      out: Optional[torch.Tensor] = None, *, bias: Optional[torch.Tensor] = None,
                      swiglu_limit: Optional[float] = None, alpha: float = 1.702, limit: float = 7.0,
                      a_scale: Optional[torch.Tensor] = None, b_scale: Optional[torch.Tensor] = None,
                      scale_mode: str = "none", block_shape=None, config: dict) -> torch.Tensor:
    """h [E, T_max, I] = act(x @ w13^T + bias) per expert over its first counts[e] rows.

    x [E, T_max, H], counts int32 [E], w13 [E, 2I, H] (gated, halves) or [E, I, H] (*_no_mul),
    bias [E, N] or None. ``out`` defaults to x's dtype (bf16 for fp8 / int8 operands).
    """
    act = str(getattr(activation, "value", activation))     # an Activation or its name
    if act not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)} (got {activation!r})")
    gated = not act.endswith("_no_mul")
    E, T_max, _ = x.shape
    N = w13.shape[1]
    I = N // 2 if gated else N
    if out is None:
        out = torch.empty((E, T_max, I), dtype=_out_dtype(x), device=x.device)
    return _launch(x, counts, w13, out, act, gated, bias, swiglu_limit, alpha, limit,
                   a_scale, b_scale, scale_mode, block_shape, config)


def batched_gemm2(h: torch.Tensor, counts: torch.Tensor, w2: torch.Tensor,
                  out: Optional[torch.Tensor] = None, *, bias: Optional[torch.Tensor] = None,
                  a_scale: Optional[torch.Tensor] = None, b_scale: Optional[torch.Tensor] = None,
                  scale_mode: str = "none", block_shape=None, config: dict) -> torch.Tensor:
    """out [E, T_max, H] = h @ w2^T + bias per expert over its first counts[e] rows, unweighted.

    h [E, T_max, I], counts int32 [E], w2 [E, H, I], bias [E, H] or None.
    """
    E, T_max, _ = h.shape
    H = w2.shape[1]
    if out is None:
        out = torch.empty((E, T_max, H), dtype=_out_dtype(h), device=h.device)
    return _launch(h, counts, w2, out, "none", False, bias, None, 1.702, 7.0,
                   a_scale, b_scale, scale_mode, block_shape, config)
