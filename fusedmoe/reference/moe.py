"""The reference MoE forward: plain torch, every scheme, the ground truth. The one place the
per-expert loop of the MoE math is written: the kernel references (reference/kernels.py),
the ``torch_ref`` and ``emulation`` backends, tests and benchmarks all compute through it.

Legend: T tokens, E global experts, E_loc local experts, k top-k, H hidden, I intermediate,
N = 2I (gated) or I, n = T*k slots flattened as s = t*k + j.

For every (token t, slot j) with global expert g = topk_ids[t, j] and local e = map(g):
    h      = act(fq1(x[t]) @ W13[e]^T + b13[e])          [N] -> [I]
    y      = fq2(h) @ W2[e]^T + b2[e]                     [H]
    out[t] = sum_j topk_weights[t, j] * y                 (or x pre-scaled when on-input)
W = the dequantized weights (fp32); fq1 / fq2 = the scheme's activation fake-quantization
(quantize then dequantize, exactly as the scheme's kernels quantize the GEMM inputs: per
tensor over all of GEMM1's input / all of GEMM2's input, per token, or per 1 x 128 group).
Slots whose expert is not local (expert_map -1) contribute nothing. Math in fp32, output
in x's dtype.

- ``reference_moe``: the above for ``ExpertWeights`` of any scheme and a ``MoEConfig``.
- ``moe_ref``: the same over raw 16/32-bit weight tensors in the kernels' conventions
  (gate / up halves; ids out of range dropped), fp32 out: the Triton kernels' tests.
- ``moe_pipeline``: both, once the caller has chosen weights, activation and fake-quants;
  ``per_expert_matmul``: its per-expert loop (also the GEMM references' loop).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Optional, Union

import torch

from ..config import GateUpLayout, MoEConfig
from ..errors import InputError
from ..weights import ExpertWeights
from .activations import activation_from_config, apply_activation
from .quant import dequant_fp8_group, dequantize_weight, fake_quant_activation, quant_fp8_group

__all__ = ["reference_moe", "moe_ref", "moe_pipeline", "per_expert_matmul", "local_ids", "dequantized_weights"]


def local_ids(topk_ids: torch.Tensor, num_experts: int, expert_map: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Local expert of every slot, int64 [n]; -1 where dropped (not local or out of range)."""
    g = topk_ids.reshape(-1).long()                                             # [n]
    if expert_map is not None:
        ok = (g >= 0) & (g < expert_map.numel())
        loc = torch.where(ok, expert_map.long().to(g.device)[g.clamp(0, expert_map.numel() - 1)], -1)
    else:
        loc = g
    return torch.where((loc >= 0) & (loc < num_experts), loc, -1)


def per_expert_matmul(a: torch.Tensor, w: Union[torch.Tensor, Callable[[int], torch.Tensor]],
                      slot_expert: torch.Tensor, out_features: int, *, k: int = 1,
                      bias: Optional[torch.Tensor] = None, epilogue: Optional[Callable] = None,
                      row_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32 [n, out_features]: for every slot s whose local expert e = slot_expert[s] >= 0,
    epilogue(a[s // k] @ W_e^T + bias[e]) * row_weight[s]; zero rows for slots of -1.

    ``a`` [n / k, K]; ``w`` [E_loc, out, K] (any float dtype, used in fp32) or a callable
    e -> W_e (dequantizing one expert at a time); ``epilogue`` [m, out] -> [m, out_features]."""
    y = torch.zeros(slot_expert.numel(), out_features, dtype=torch.float32, device=a.device)
    for e in torch.unique(slot_expert[slot_expert >= 0]).tolist():
        sel = (slot_expert == e).nonzero(as_tuple=True)[0]                     # slots of expert e
        we = w(e) if callable(w) else w[e]
        g = a[sel if k == 1 else torch.div(sel, k, rounding_mode="floor")] @ we.float().T   # [m, out]
        if bias is not None:
            g = g + bias[e].float()
        if epilogue is not None:
            g = epilogue(g)
        if row_weight is not None:
            g = g * row_weight[sel].float()[:, None]
        y[sel] = g
    return y


def moe_pipeline(xq: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, slot_expert: torch.Tensor, k: int,
                 act: Callable[[torch.Tensor], torch.Tensor], *, b13: Optional[torch.Tensor] = None,
                 b2: Optional[torch.Tensor] = None, fq2: Optional[Callable] = None,
                 topk_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32 [T, H] = sum over the kept slots of each token of (fq2(act(xq[t] @ w13[e]^T + b13[e]))
    @ w2[e]^T + b2[e]) * topk_weights[t, j].

    xq fp32 [T, H]: GEMM1's input as the caller wants it read (scaled, fake-quantized);
    w13 [E_loc, N, H], w2 [E_loc, H, I]; slot_expert int64 [T*k]: local expert of slot
    s = t*k + j, -1 = the slot contributes nothing; act [m, N] -> [m, I]; fq2: GEMM2's input
    [m, I], all kept slots at once (per-tensor scales see all of it), None = as is;
    topk_weights [T, k] weight the kept slots' outputs (None: unweighted)."""
    T = xq.shape[0]
    H, I = w2.shape[1], w2.shape[2]
    h = per_expert_matmul(xq, w13, slot_expert, I, k=k, bias=b13, epilogue=act)        # [T*k, I]
    valid = slot_expert >= 0
    if fq2 is not None and valid.any():
        hq = torch.zeros_like(h)
        hq[valid] = fq2(h[valid])
    else:
        hq = h
    tw = topk_weights.reshape(-1) if topk_weights is not None else None
    y = per_expert_matmul(hq, w2, slot_expert, H, bias=b2, row_weight=tw)               # [T*k, H]
    return y.view(T, k, H).sum(dim=1)


def dequantized_weights(weights: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 fp32 [E_loc, N, H], w2 fp32 [E_loc, H, I]) of any scheme."""
    s = weights.scheme
    w13 = dequantize_weight(weights.w13, s, scale=weights.w13_scale, zero=weights.w13_zero,
                            global_scale=weights.w13_global_scale)
    w2 = dequantize_weight(weights.w2, s, scale=weights.w2_scale, zero=weights.w2_zero,
                           global_scale=weights.w2_global_scale)
    return w13, w2


def reference_moe(x: torch.Tensor, weights: ExpertWeights, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, config: MoEConfig,
                  expert_map: Optional[torch.Tensor] = None,
                  dequantized: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                  input_prescaled: bool = False, quantize_activations: bool = True,
                  h_group: Optional[int] = None) -> torch.Tensor:
    """out [T, H] in x.dtype. ``expert_map`` defaults to ``config.expert_map()``.

    ``quantize_activations`` False: W8A8 schemes with their activations kept in full
    precision (fq1 / fq2 the identity): what the ``triton`` decode kernels compute by default
    (``TritonExperts.quantizes_activations``; FUSEDMOE_W8A8_DECODE).
    ``h_group`` g: GEMM2's input h quantized to fp8 in 1 x g groups instead of by the scheme's
    rule (the ``triton`` backend's fp8_channel prefill with FUSEDMOE_H_QUANT=epilogue:
    ``TritonExperts.h_group``); only with quantize_activations and an fp8 scheme.
    ``dequantized`` may pass precomputed ``dequantized_weights(weights)`` (the emulation
    backend does, to dequantize once at load). ``input_prescaled``: with
    apply_router_weight_on_input, x was already multiplied by the weights (a prepare step did it).
    """
    T, H = x.shape
    k = topk_ids.shape[1]
    if T == 0:
        return x.new_empty((0, H))
    scheme = weights.scheme
    w13, w2 = dequantized if dequantized is not None else dequantized_weights(weights)
    if expert_map is None:
        expert_map = config.expert_map(x.device)
    ids = topk_ids.long()                                              # [T, k] global ids
    local = expert_map.long()[ids] if expert_map is not None else ids  # [T, k] local ids or -1
    xf = x.float()                                                     # [T, H]
    tw = topk_weights.float()                                          # [T, k]
    on_input = config.routing.apply_router_weight_on_input
    if on_input and not input_prescaled:                               # top-1: scale x first
        xf = xf * tw[:, :1]
    fq = fake_quant_activation if quantize_activations else (lambda a, scheme, static_scale=None: a)
    xq = fq(xf, scheme, static_scale=weights.a13_scale)                # [T, H]
    # GEMM2's input is quantized over all (valid) slots at once, like the kernels do.
    if h_group is not None:
        if not (quantize_activations and scheme.method.value.startswith("fp8")):
            raise InputError("h_group", h_group, "None here", "h_group applies to fp8 schemes with quantized activations")
        fq2 = lambda a: dequant_fp8_group(*quant_fp8_group(a, h_group), h_group)  # noqa: E731
    else:
        fq2 = partial(fq, scheme=scheme, static_scale=weights.a2_scale)
    out = moe_pipeline(xq, w13, w2, local.reshape(-1), k, partial(activation_from_config, cfg=config),
                       b13=weights.w13_bias, b2=weights.w2_bias, fq2=fq2, topk_weights=None if on_input else tw)
    return out.to(x.dtype)


def moe_ref(x, w13, w2, topk_weights, topk_ids, activation: str = "silu", *, expert_map=None,
            w13_bias=None, w2_bias=None, swiglu_limit=None, alpha: float = 1.702, limit: float = 7.0,
            round_h_to: Optional[torch.dtype] = None) -> torch.Tensor:
    """fp32 [T, H] over raw weights w13 [E_loc, N, H], w2 [E_loc, H, I] (16/32-bit) in the
    kernels' conventions: gate / up halves for every gated activation (swigluoai too), slots
    whose id is out of range or not local dropped. ``round_h_to`` rounds the intermediate
    like a kernel storing it in that dtype."""
    act = partial(apply_activation, activation=activation, swiglu_limit=swiglu_limit, alpha=alpha, limit=limit,
                  layout=GateUpLayout.HALVES)
    fq2 = (lambda h: h.to(round_h_to).float()) if round_h_to is not None else None
    return moe_pipeline(x.float(), w13, w2, local_ids(topk_ids, w13.shape[0], expert_map).to(x.device),
                        topk_ids.shape[1], act, b13=w13_bias, b2=w2_bias, fq2=fq2, topk_weights=topk_weights)
