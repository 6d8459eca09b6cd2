"""Plain-torch references of the Triton MoE kernels (fusedmoe.kernels.align / grouped_gemm).

Legend: T tokens, E_loc local experts, E_g global experts, k top-k, H hidden,
I intermediate, N = 2I (gated) or I, n = T*k pairs flattened as s = t*k + j.

- ``align_ref``: the exact (deterministic) output of ``align_block_size``.
- ``gemm1_act_ref``: h [n, I] = act(x[t] @ w13[e]^T + b13[e]) per pair; dropped rows zero.
- ``gemm2_ref``: out [T, H] = sum_j w[t, j] * (h[s] @ w2[e]^T + b2[e]) over kept pairs.
- ``dequant``: what the quantized operands of both GEMMs mean (modes none/tensor/channel/block).
Both GEMMs run the MoE reference's per-expert loop (reference/moe.py ``per_expert_matmul``);
the two chained are ``reference.moe.moe_ref``. All math in fp32; results in fp32.
"""
from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from ..config import GateUpLayout
from .activations import apply_activation
from .moe import local_ids, per_expert_matmul

__all__ = ["align_ref", "dequant", "gemm1_act_ref", "gemm2_ref"]


def align_ref(topk_ids: torch.Tensor, block_m: int, num_experts: int,
              expert_map: Optional[torch.Tensor] = None):
    """(sorted_ids int32 [total], expert_ids int32 [total / BM], total): the meaningful prefix."""
    loc = local_ids(topk_ids, num_experts, expert_map).cpu()                    # [n]
    n = loc.numel()
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        slots = torch.nonzero(loc == e).flatten().tolist()                      # ascending s
        if not slots:
            continue
        padded = -(-len(slots) // block_m) * block_m
        sorted_ids += slots + [n] * (padded - len(slots))
        expert_ids += [e] * (padded // block_m)
    return (torch.tensor(sorted_ids, dtype=torch.int32), torch.tensor(expert_ids, dtype=torch.int32),
            len(sorted_ids))


def dequant(t: torch.Tensor, scale: Optional[torch.Tensor], mode: str, *, expert: Optional[int] = None,
            block: Optional[tuple] = None) -> torch.Tensor:
    """fp32 value of a quantized operand.

    Activations ``t`` [M, K] (expert None): tensor: scale [1]; channel: [M, 1]; block:
    [M, K/bk] (1 x bk groups). Weights ``t`` [out, K] of ``expert``: tensor: scale [E];
    channel: [E, out]; block: [E, out/bn, K/bk]. ``block`` = (bn, bk).
    """
    x = t.float()
    if mode == "none" or scale is None:
        return x
    s = scale.float()
    if expert is None:                                   # activation
        if mode == "tensor":
            return x * s.reshape(-1)[0]
        if mode == "channel":
            return x * s.reshape(-1, 1)
        bk = block[1]
        return x * s.repeat_interleave(bk, dim=1)[:, : x.shape[1]]
    if mode == "tensor":
        return x * s[expert]
    if mode == "channel":
        return x * s[expert][:, None]
    bn, bk = block
    se = s[expert].repeat_interleave(bn, dim=0).repeat_interleave(bk, dim=1)
    return x * se[: x.shape[0], : x.shape[1]]


def gemm1_act_ref(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor, activation: str, *,
                  expert_map: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                  swiglu_limit: Optional[float] = None, alpha: float = 1.702, limit: float = 7.0,
                  quant: str = "none", a_scale=None, b_scale=None, block: Optional[tuple] = None) -> torch.Tensor:
    """h fp32 [n, N_out]: act(x[t] @ w13[e]^T + bias[e]) per kept pair (halves layout); 0 if dropped."""
    k = topk_ids.shape[1]
    loc = local_ids(topk_ids, w13.shape[0], expert_map).to(x.device)            # [n]
    xa = dequant(x, a_scale, quant, block=block)                              # [T, H]
    gated = not str(activation).endswith("_no_mul")
    n_out = w13.shape[1] // 2 if gated else w13.shape[1]
    act = partial(apply_activation, activation=activation, swiglu_limit=swiglu_limit, alpha=alpha, limit=limit,
                  layout=GateUpLayout.HALVES)
    return per_expert_matmul(xa, lambda e: dequant(w13[e], b_scale, quant, expert=e, block=block), loc, n_out,
                             k=k, bias=bias, epilogue=act)


def gemm2_ref(h: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
              expert_map: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
              mul_routed_weight: bool = True, quant: str = "none", a_scale=None, b_scale=None,
              block: Optional[tuple] = None) -> torch.Tensor:
    """out fp32 [T, H] = sum over kept slots of w * (h[s] @ w2[e]^T + bias[e])."""
    T, k = topk_ids.shape
    H = w2.shape[1]
    loc = local_ids(topk_ids, w2.shape[0], expert_map).to(h.device)           # [n]
    ha = dequant(h, a_scale, quant, block=block)                              # [n, I]
    y = per_expert_matmul(ha, lambda e: dequant(w2[e], b_scale, quant, expert=e, block=block), loc, H,
                          bias=bias, row_weight=topk_weights.reshape(-1) if mul_routed_weight else None)
    return y.view(T, k, H).sum(1)
