"""Triton routing kernel: router logits -> (topk_weights, topk_ids) in ONE launch.

Legend: T tokens, E experts, k top-k, G expert groups, Gs = E / G experts per group;
BT tokens per program, BG = next_pow2(G), BGs = next_pow2(Gs), BK = next_pow2(k).

One program routes BT tokens. Their logits are loaded as a [BT, BG, BGs] register tile
(expert e = g * Gs + j; the ungrouped case is G = 1, Gs = E), padded with -inf so that
E need not be a power of two (E = 60, DeepSeek-V2's Gs = 20). Then, all in registers:
  scores   = softmax or sigmoid (fp32)                               [BT, BG, BGs]
  sel      = scores + correction_bias                                [BT, BG, BGs]
  grouped: group score = max(sel) or (with bias) the sum of its top-2;
           keep the TOPK_GROUPS best groups, others -> -inf          [BT, BG]
  top-k:   k rounds of argmax over int64 keys (score bits, then E_PAD-1-e), so each
           round is one max-reduction that takes the LOWEST expert index among equal
           scores (the tie rule of ``fusedmoe.reference.routing``)     [BT, BK]
  weights  = the unbiased scores of the k winners (recomputed from their logits),
           renormalized (optional), then * routed_scaling_factor      [BT, BK]
Iterative argmax beats a sort here: k <= 8 rounds over <= 256 values in registers.

The launcher allocates the outputs only if none are passed, never syncs the host and
never validates (callers do: ``fusedmoe.reference.routing.route`` has the checks), so
it can be captured in a CUDA graph with pre-allocated ``out_weights`` / ``out_ids``.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from .launcher import cdiv, launch, next_power_of_2

__all__ = ["fused_topk"]

_BIG_INDEX = tl.constexpr(1 << 30)     # larger than any expert / group index
_INT64_MIN = tl.constexpr(-(1 << 63))  # a spent top-k key


@triton.jit
def _fused_topk_kernel(
    logits_ptr, bias_ptr, w_ptr, ids_ptr,
    T, stride_lt, stride_le, stride_wt, stride_wk, stride_it, stride_ik,
    scale,
    NUM_GROUPS: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUPS: tl.constexpr, TOP_K: tl.constexpr,
    E_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_GS: tl.constexpr, BLOCK_K: tl.constexpr,
    SIGMOID: tl.constexpr, RENORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr, GROUP_TOP2: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)                 # [BT]
    offs_g = tl.arange(0, BLOCK_G)                                 # [BG]
    offs_j = tl.arange(0, BLOCK_GS)                                # [BGs]
    offs_k = tl.arange(0, BLOCK_K)                                 # [BK]
    t3 = offs_t[:, None, None]                                     # [BT, 1, 1]
    g3 = offs_g[None, :, None]                                     # [1, BG, 1]
    j3 = offs_j[None, None, :]                                     # [1, 1, BGs]
    e3 = g3 * GROUP_SIZE + j3                                      # [1, BG, BGs] expert ids
    valid_e = (g3 < NUM_GROUPS) & (j3 < GROUP_SIZE)                # [1, BG, BGs]
    row_ok = t3 < T                                                # [BT, 1, 1]

    # padded tokens read 0 (keeps them NaN-free; never stored), padded experts -inf
    x = tl.load(logits_ptr + t3.to(tl.int64) * stride_lt + e3 * stride_le,
                mask=row_ok & valid_e, other=0.0).to(tl.float32)   # [BT, BG, BGs]
    x = tl.where(valid_e, x, float("-inf"))
    if SIGMOID:
        s = tl.sigmoid(x)                                          # padded -> 0
    else:
        x_max = tl.max(tl.max(x, axis=2), axis=1)                  # [BT]
        p = tl.exp(x - x_max[:, None, None])                       # [BT, BG, BGs] padded -> 0
        denom = tl.sum(tl.sum(p, axis=2), axis=1)                  # [BT]
        s = p / denom[:, None, None]

    sel = s
    if HAS_BIAS:
        b = tl.load(bias_ptr + e3, mask=valid_e, other=0.0).to(tl.float32)  # [1, BG, BGs]
        sel = s + b
    sel = tl.where(valid_e, sel, float("-inf"))                    # [BT, BG, BGs]

    if GROUPED:
        top1 = tl.max(sel, axis=2)                                 # [BT, BG]
        if GROUP_TOP2:
            # drop one (the lowest-index) maximum, the next max is the second best
            j_first = tl.min(tl.where(sel == top1[:, :, None], j3, _BIG_INDEX), axis=2)  # [BT, BG]
            rest = tl.where(j3 == j_first[:, :, None], float("-inf"), sel)            # [BT, BG, BGs]
            gscore = top1 + tl.max(rest, axis=2)                   # [BT, BG]
        else:
            gscore = top1                                          # [BT, BG]
        gscore = tl.where(offs_g[None, :] < NUM_GROUPS, gscore, float("-inf"))
        keep = tl.zeros([BLOCK_T, BLOCK_G], dtype=tl.int32)        # [BT, BG]
        for _ in tl.static_range(TOPK_GROUPS):
            gm = tl.max(gscore, axis=1)                            # [BT]
            gi = tl.min(tl.where(gscore == gm[:, None], offs_g[None, :], _BIG_INDEX), axis=1)  # [BT]
            ghit = offs_g[None, :] == gi[:, None]                  # [BT, BG]
            keep = tl.where(ghit, 1, keep)
            gscore = tl.where(ghit, float("-inf"), gscore)
        sel = tl.where(keep[:, :, None] != 0, sel, float("-inf"))  # [BT, BG, BGs]

    # One int64 key per expert: the order-preserving bits of sel in the high word, E_PAD-1-e in
    # the low word. The max key is the best score and, among equal scores, the lowest index, so
    # each top-k round is ONE reduction (2.7x faster than max + argmin + weight sum at E=256).
    v = sel + 0.0                                                  # -0.0 -> +0.0 (ties with +0.0)
    bits = v.to(tl.int32, bitcast=True)                            # [BT, BG, BGs]
    bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)             # negative floats: flip order
    key = (bits.to(tl.int64) << 32) | (E_PAD - 1 - e3).to(tl.int64)  # [BT, BG, BGs]
    id_acc = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)          # [BT, BK]
    for i in tl.static_range(TOP_K):
        kmax = tl.max(tl.max(key, axis=2), axis=1)                 # [BT]
        idx = (E_PAD - 1) - (kmax & 0x7FFFFFFF).to(tl.int32)       # [BT]
        key = tl.where(e3 == idx[:, None, None], _INT64_MIN, key)
        id_acc = tl.where(offs_k[None, :] == i, idx[:, None], id_acc)

    # weights: the unbiased scores of the winners, recomputed from their logits (same ops as s)
    t2 = offs_t[:, None].to(tl.int64)                              # [BT, 1]
    out_mask = (offs_t[:, None] < T) & (offs_k[None, :] < TOP_K)   # [BT, BK]
    xk = tl.load(logits_ptr + t2 * stride_lt + id_acc * stride_le, mask=out_mask, other=0.0).to(tl.float32)
    if SIGMOID:
        w_acc = tl.sigmoid(xk)                                     # [BT, BK]
    else:
        w_acc = tl.exp(xk - x_max[:, None]) / denom[:, None]       # [BT, BK]
    w_acc = tl.where(out_mask, w_acc, 0.0)
    if RENORMALIZE:
        w_sum = tl.where(offs_t < T, tl.sum(w_acc, axis=1), 1.0)   # [BT] padded k lanes hold 0
        w_acc = w_acc / w_sum[:, None]
    w_acc = w_acc * scale

    tl.store(w_ptr + t2 * stride_wt + offs_k[None, :] * stride_wk, w_acc, mask=out_mask)
    tl.store(ids_ptr + t2 * stride_it + offs_k[None, :] * stride_ik, id_acc, mask=out_mask)


def _launch_shape(T: int, tile: int) -> tuple[int, int]:
    """(tokens per program, num_warps) for [BT, tile] register tiles (tile = padded E).

    One warp per program: the reductions then stay in registers and warp shuffles, no shared
    memory. ~512 values per program (E <= 128) or one token (E >= 256). H200, bf16 logits,
    T = 32768: E=8 2.9 us, E=60 12 us, E=128 24 us; DeepSeek-V3 T = 16384: 28 us.
    """
    block_t = 1 if tile >= 256 else max(1, min(32, 512 // tile))
    block_t = min(block_t, next_power_of_2(max(T, 1)))
    num_warps = max(1, min(8, block_t * tile // 1024))  # E > 1024: more warps, <= 32 values per thread
    return block_t, num_warps


@functools.lru_cache(maxsize=256, typed=True)
def _launch_params(T, E, top_k, sigmoid, renormalize, has_bias, num_groups, topk_groups, block_t, num_warps):
    """(grid, constexprs, num_warps) of one routing launch, once per shape and routing rule
    (a serving loop repeats a few): ~1.5 us of host time a call. ``typed``: 8 and 8.0 are
    other constexprs. The dict is shared: launch() only reads it."""
    grouped = num_groups is not None and num_groups > 1  # one group keeps every expert
    G = num_groups if grouped else 1
    assert E % G == 0, "validated by the caller"
    Gs = E // G
    BG, BGs = next_power_of_2(G), next_power_of_2(Gs)
    bt, nw = _launch_shape(T, BG * BGs)
    block_t, num_warps = block_t or bt, num_warps or nw
    return (cdiv(T, block_t),), dict(
        NUM_GROUPS=G, GROUP_SIZE=Gs, TOPK_GROUPS=topk_groups if grouped else 0, TOP_K=top_k,
        E_PAD=BG * Gs + BGs, BLOCK_T=block_t, BLOCK_G=BG, BLOCK_GS=BGs, BLOCK_K=next_power_of_2(top_k),
        SIGMOID=bool(sigmoid), RENORMALIZE=bool(renormalize), HAS_BIAS=has_bias,
        GROUPED=grouped, GROUP_TOP2=bool(has_bias and Gs > 1)), num_warps


def fused_topk(logits: torch.Tensor, top_k: int, *, sigmoid: bool, renormalize: bool,
               correction_bias: Optional[torch.Tensor] = None, num_groups: Optional[int] = None,
               topk_groups: Optional[int] = None, routed_scaling_factor: float = 1.0,
               out_weights: Optional[torch.Tensor] = None, out_ids: Optional[torch.Tensor] = None,
               block_t: Optional[int] = None, num_warps: Optional[int] = None,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Route T tokens in one launch; same math and tie rule as ``fusedmoe.reference.routing.route``.

    Args:
      logits: [T, E] fp32/bf16/fp16, any strides.
      top_k: experts per token.
      sigmoid: sigmoid scores (else softmax over E).
      renormalize: divide the k weights by their sum.
      correction_bias: [E] float, contiguous (selection only), or None.
      num_groups, topk_groups: grouped top-k (E % num_groups == 0), or None.
      routed_scaling_factor: multiplies the final weights.
      out_weights: optional pre-allocated fp32 [T, k]; out_ids: optional int32 [T, k].
      block_t, num_warps: launch-config overrides (tokens per program, a power of two; warps).
    Returns:
      (topk_weights fp32 [T, k], topk_ids int32 [T, k]) -- the given outputs when passed.
    Not validated here (callers validate once, on the host).
    """
    T, E = logits.shape
    if out_weights is None:
        out_weights = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    if out_ids is None:
        out_ids = torch.empty(T, top_k, dtype=torch.int32, device=logits.device)
    if T == 0:
        return out_weights, out_ids
    has_bias = correction_bias is not None
    grid, constexprs, num_warps = _launch_params(T, E, top_k, sigmoid, renormalize, has_bias, num_groups,
                                                 topk_groups, block_t, num_warps)
    launch(_fused_topk_kernel, grid,
           (logits, correction_bias if has_bias else logits, out_weights, out_ids,
            T, logits.stride(0), logits.stride(1), out_weights.stride(0), out_weights.stride(1),
            out_ids.stride(0), out_ids.stride(1),
            float(routed_scaling_factor)),
           constexprs, num_warps=num_warps)
    return out_weights, out_ids

