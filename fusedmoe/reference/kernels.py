"""Plain-torch references of the Triton MoE kernels (fusedmoe.kernels.align / grouped_gemm).

Legend: T tokens, E_loc local experts, E_g global experts, k top-k, H hidden,
I intermediate, N = 2I (gated) or I, n = T*k pairs flattened as s = t*k + j.

- ``align_ref``: the exact (deterministic) output of ``align_block_size``.
- ``gemm1_act_ref``: h [n, I] = act(x[t] @ w13[e]^T + b13[e]) per pair; dropped rows zero.
- ``gemm2_ref``: out [T, H] = sum_j w[t, j] * (h[s] @ w2[e]^T + b2[e]) over kept pairs.
- ``moe_ref``: the two chained; ``moe_naive_loop``: the same, one (token, slot) at a time.
- ``dequant``: what the quantized operands of both GEMMs mean (modes none/tensor/channel/block).
All math in fp32 (fp64 for the naive loop); results in fp32.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import GateUpLayout
from .activations import apply_activation

__all__ = ["align_ref", "local_ids", "dequant", "gemm1_act_ref", "gemm2_ref", "moe_ref", "moe_naive_loop"]


def local_ids(topk_ids: torch.Tensor, num_experts: int, expert_map: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Local expert of every pair, int64 [n]; -1 where dropped (not local or out of range)."""
    g = topk_ids.reshape(-1).long()                                             # [n]
    if expert_map is not None:
        ok = (g >= 0) & (g < expert_map.numel())
        loc = torch.where(ok, expert_map.long().to(g.device)[g.clamp(0, expert_map.numel() - 1)], -1)
    else:
        loc = g
    return torch.where((loc >= 0) & (loc < num_experts), loc, -1)


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
    T, k = topk_ids.shape
    E = w13.shape[0]
    loc = local_ids(topk_ids, E, expert_map).to(x.device)                      # [n]
    xa = dequant(x, a_scale, quant, block=block)                              # [T, H]
    gated = not str(activation).endswith("_no_mul")
    n_out = w13.shape[1] // 2 if gated else w13.shape[1]
    h = torch.zeros(T * k, n_out, dtype=torch.float32, device=x.device)        # [n, N_out]
    for e in range(E):
        s = torch.nonzero(loc == e).flatten()
        if s.numel() == 0:
            continue
        g = xa[s // k] @ dequant(w13[e], b_scale, quant, expert=e, block=block).T   # [m, N]
        if bias is not None:
            g = g + bias[e].float()
        h[s] = apply_activation(g, activation, swiglu_limit=swiglu_limit, alpha=alpha, limit=limit,
                                layout=GateUpLayout.HALVES if gated else None)
    return h


def gemm2_ref(h: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
              expert_map: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
              mul_routed_weight: bool = True, quant: str = "none", a_scale=None, b_scale=None,
              block: Optional[tuple] = None) -> torch.Tensor:
    """out fp32 [T, H] = sum over kept slots of w * (h[s] @ w2[e]^T + bias[e])."""
    T, k = topk_ids.shape
    E, H = w2.shape[0], w2.shape[1]
    loc = local_ids(topk_ids, E, expert_map).to(h.device)                     # [n]
    ha = dequant(h, a_scale, quant, block=block)                              # [n, I]
    y = torch.zeros(T * k, H, dtype=torch.float32, device=h.device)            # [n, H]
    for e in range(E):
        s = torch.nonzero(loc == e).flatten()
        if s.numel() == 0:
            continue
        ye = ha[s] @ dequant(w2[e], b_scale, quant, expert=e, block=block).T    # [m, H]
        if bias is not None:
            ye = ye + bias[e].float()
        if mul_routed_weight:
            ye = ye * topk_weights.reshape(-1)[s].float()[:, None]
        y[s] = ye
    return y.view(T, k, H).sum(1)


def moe_ref(x, w13, w2, topk_weights, topk_ids, activation: str = "silu", *, expert_map=None,
            w13_bias=None, w2_bias=None, swiglu_limit=None, alpha: float = 1.702, limit: float = 7.0,
            round_h_to: Optional[torch.dtype] = None) -> torch.Tensor:
    """fp32 [T, H]; ``round_h_to`` rounds the intermediate like a kernel storing it in that dtype."""
    h = gemm1_act_ref(x, w13, topk_ids, activation, expert_map=expert_map, bias=w13_bias,
                      swiglu_limit=swiglu_limit, alpha=alpha, limit=limit)
    if round_h_to is not None:
        h = h.to(round_h_to).float()
    return gemm2_ref(h, w2, topk_ids, topk_weights, expert_map=expert_map, bias=w2_bias)


def moe_naive_loop(x, w13, w2, topk_weights, topk_ids, activation: str = "silu", *, expert_map=None,
                   w13_bias=None, w2_bias=None, swiglu_limit=None, alpha: float = 1.702,
                   limit: float = 7.0) -> torch.Tensor:
    """fp64 [T, H], one (token, slot) at a time: the independent cross-check of ``moe_ref``."""
    T, k = topk_ids.shape
    E = w13.shape[0]
    out = torch.zeros(T, w2.shape[1], dtype=torch.float64)
    gated = not str(activation).endswith("_no_mul")
    for t in range(T):
        for j in range(k):
            g = int(topk_ids[t, j])
            e = int(expert_map[g]) if expert_map is not None else g
            if not 0 <= e < E:
                continue
            a = w13[e].double().cpu() @ x[t].double().cpu()                     # [N]
            if w13_bias is not None:
                a = a + w13_bias[e].double().cpu()
            act = apply_activation(a[None], activation, swiglu_limit=swiglu_limit, alpha=alpha, limit=limit,
                                   layout=GateUpLayout.HALVES if gated else None)[0].double()
            y = w2[e].double().cpu() @ act                                       # [H]
            if w2_bias is not None:
                y = y + w2_bias[e].double().cpu()
            out[t] += float(topk_weights[t, j]) * y
    return out
